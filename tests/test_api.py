"""The Python API: ``fedcore.run`` and ``fedcore.sweep`` (``fedcore/api.py``), and the
docs' example of it (docs/sweeps-and-tracking.md), run as written."""

from __future__ import annotations

import builtins
import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import fedcore
from fedcore.api import RunResult, SweepResult
from fedcore.errors import ConfigError
from tests import docs_text

REPO = Path(__file__).resolve().parents[1]
TINY: dict[str, Any] = {
    "run": {"rounds": 3, "eval_every": 2},
    "topology": {"nodes": 4},
    "data.batch_size": 16,
}


def test_import_fedcore_imports_no_torch() -> None:
    code = "import sys, fedcore; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    ).stdout
    assert out.strip() == "[]"


def test_run_returns_the_summary_figures_records_and_folder(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = fedcore.run(
        None, out_dir=out, engine="messages", threads=1, compression={"codec": "sign"}, **TINY
    )
    assert isinstance(result, RunResult)
    assert result.out_dir == out
    on_disk = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert result.summary["run_id"] == on_disk["run_id"]
    assert result.status == "completed"
    assert result.summary["engine"] == "messages"
    assert result.summary["nodes"] == 4
    assert result.summary["traffic"]["codec"] == "sign"
    assert result.final == on_disk["final"]
    assert 0.0 <= result.final["avg_model_accuracy"] <= 1.0
    assert [r["round"] for r in result.rounds] == [0, 1, 2]
    assert all(set(r) >= {"train_loss", "bytes_sent"} for r in result.rounds)
    assert [r["round"] for r in result.evals] == [1, 2]
    assert {r["kind"] for r in result.records} >= {"round", "node", "eval"}
    # the same keys as dotted keyword arguments give the same run
    again = fedcore.run(
        None,
        out_dir=tmp_path / "again",
        engine="messages",
        threads=1,
        **{"compression.codec": "sign", "run.rounds": 3, "run.eval_every": 2},
        **{"topology.nodes": 4, "data.batch_size": 16},
    )
    assert again.summary["params_sha256"] == result.summary["params_sha256"]


def test_to_dataframe_without_pandas_says_so_and_the_lists_remain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = fedcore.run(None, out_dir=tmp_path / "r", threads=1, **TINY)
    real_import = builtins.__import__

    def no_pandas(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "pandas":
            raise ImportError("No module named 'pandas'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pandas", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match="needs pandas"):
        result.to_dataframe()
    assert isinstance(result.rounds, list) and isinstance(result.rounds[0], dict)
    # with pandas (a stand-in here): a DataFrame of the records of the kind asked for
    monkeypatch.setattr(builtins, "__import__", real_import)
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda rows: ("DataFrame", rows)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pandas", fake)
    assert result.to_dataframe() == ("DataFrame", result.rounds)
    assert result.to_dataframe("eval") == ("DataFrame", result.evals)


def test_run_takes_a_config_object_or_tables(tmp_path: Path) -> None:
    from fedcore.config import load_config

    config = load_config(None, ["algorithm.name=dpsgd", "topology.kind=ring"])
    result = fedcore.run(config, out_dir=tmp_path / "c", threads=1, **TINY)
    assert result.summary["algorithm"] == "dpsgd"
    tables = {"algorithm": {"name": "dpsgd"}, "topology": {"kind": "ring"}}
    same = fedcore.run(tables, out_dir=tmp_path / "t", threads=1, **TINY)
    assert same.summary["params_sha256"] == result.summary["params_sha256"]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"algorithm": {"lr": "abc"}}, "algorithm.lr must be of type float"),
        ({"lr": 0.1}, "give a config key as 'table.key'"),
        ({"nosuch.key": 1}, "nosuch"),
    ],
)
def test_bad_overrides_raise_before_any_run(
    kwargs: dict[str, Any], needle: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        fedcore.run(None, out_dir=tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match=re.escape(needle)):
        fedcore.sweep(None, grid={"algorithm.lr": [0.1]}, out_dir=tmp_path / "y", **kwargs)
    assert not (tmp_path / "y").exists()


def test_sweep_returns_the_per_cell_table(tmp_path: Path) -> None:
    grid = fedcore.sweep(
        None,
        grid={"algorithm.lr": [0.1, 0.5]},
        seeds="0-1",
        out_dir=tmp_path / "g",
        threads=1,
        **TINY,
    )
    assert isinstance(grid, SweepResult)
    assert grid.out_dir == tmp_path / "g"
    assert [row["algorithm.lr"] for row in grid.table] == [0.1, 0.5]
    with open(grid.out_dir / "results.csv", encoding="utf-8") as fh:
        header = fh.readline().strip().split(",")
    assert list(grid.table[0]) == header
    for row in grid.table:
        runs = [
            json.loads((grid.out_dir / row["out_dir"] / f"seed-{s}" / "summary.json").read_text())
            for s in (0, 1)
        ]
        accs = [r["final"]["avg_model_accuracy"] for r in runs]
        assert row["avg_model_accuracy_mean"] == pytest.approx(sum(accs) / 2)
        assert runs[0]["nodes"] == 4
    best = max(grid.table, key=lambda r: r["avg_model_accuracy_mean"])
    assert grid.best is not None
    assert grid.best["values"] == {"algorithm.lr": best["algorithm.lr"]}


def test_the_api_is_quiet_and_its_summary_keeps_the_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40: a warning printed on stderr from the API, quiet by default. Now it is in
    the summary's ``warnings``, and on stderr only with ``progress=True``."""
    from tests.plainlogging import plain_logging

    big = {**TINY, "data.batch_size": 100000}
    said = "data.batch_size = 100000 is larger than the"
    with plain_logging():  # as in a script: a warning would reach logging's last resort
        quiet = fedcore.run(None, out_dir=tmp_path / "q", threads=1, **big)
        _, err = capsys.readouterr()
        assert err == ""
        fedcore.sweep(None, grid={"algorithm.lr": [0.1, 0.2]}, out_dir=tmp_path / "g", **big)
        _, err = capsys.readouterr()
        assert err == ""
        fedcore.run(None, out_dir=tmp_path / "p", threads=1, progress=True, **big)
        _, err = capsys.readouterr()
    assert err.count(said) == 1
    (warning,) = quiet.summary["warnings"]
    assert warning.startswith(said)


# --- the docs' example (docs/sweeps-and-tracking.md) -------------------------------------


def _readme_example() -> str:
    section = docs_text.section("Python API")
    found = re.search(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert found, "the docs' Python API section has no ```python block"
    return found.group(1)


def test_the_readme_python_api_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    monkeypatch.chdir(tmp_path)  # its runs/ folder goes here
    namespace: dict[str, Any] = {}
    exec(compile(_readme_example(), "docs/sweeps-and-tracking.md (Python API)", "exec"), namespace)
    result, grid = namespace["result"], namespace["grid"]
    assert result.status == "completed"
    assert result.out_dir.parent.resolve() == (tmp_path / "runs").resolve()
    assert result.summary["overrides"][:1] == ["algorithm.lr=0.1"]
    assert len(grid.table) == 4
    assert all(row["completed"] == 2 for row in grid.table)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in printed] == [
        ["0.1", "fp32"],
        ["0.1", "sign"],
        ["0.5", "fp32"],
        ["0.5", "sign"],
    ]
    shown = re.search(r"grid\.best\[\"label\"\]\s+# '([^']*)'", _readme_example())
    assert shown and grid.best["label"] == shown.group(1)  # the docs' comment is true
