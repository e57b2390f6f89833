"""``scripts/personal_results.py`` (issue 44's claim (e)) end to end at a tiny size, in this
process: its table says what the runs' ``summary.json`` say."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_personal_results_tiny(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # its _results helper
    spec = importlib.util.spec_from_file_location(
        "personal_results", ROOT / "scripts" / "personal_results.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["personal_results.py", "--tiny", "--jobs", "1", "--steps", "0", "10"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path)])
    script.main()
    shown = capsys.readouterr().out
    rows = json.loads((tmp_path / "personal.json").read_text(encoding="utf-8"))
    assert [r["steps"] for r in rows] == [0, 0, 10]
    shared, none, tuned = rows
    # 0 steps: the shared model; the table's rows are the runs' own figures
    assert (none["mean_accuracy"], none["worst_accuracy"]) == (
        shared["mean_accuracy"],
        shared["worst_accuracy"],
    )
    run = tmp_path / "runs" / "personal"
    summaries = [json.loads(p.read_text(encoding="utf-8")) for p in run.rglob("summary.json")]
    blocks = {s["personal"]["steps"]: s["personal"] for s in summaries}
    assert tuned["mean_accuracy"] == blocks[10]["personal_mean_accuracy"]
    assert tuned["worst_accuracy"] == blocks[10]["personal_worst_accuracy"]
    assert shared["mean_accuracy"] == blocks[10]["shared_mean_accuracy"]
    # 4 peers, 3 rounds: the personal models are well ahead (measured 0.955 against 0.844)
    assert tuned["mean_accuracy"] > shared["mean_accuracy"] + 0.05
    assert f"| {rows[2]['model']} | {tuned['mean_accuracy']:.4f} |" in shown
    assert (tmp_path / "personal.md").read_text(encoding="utf-8").strip() in shown
