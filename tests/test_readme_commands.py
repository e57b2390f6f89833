"""The docs' commands for grid sweeps and experiment tracking run as written.

Each command is read from the docs themselves (``docs/sweeps-and-tracking.md``, through
``tests.docs_text``: the README and every page; so an edit there is what is tested) and run
through the CLI's ``main`` in a scratch folder; ``launch --resume`` has its own end-to-end
test (``tests/simulation/test_runs.py``), as it needs a launch stopped mid-run.
"""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest

from fedcore.cli.app import main
from tests import docs_text

ROOT = Path(__file__).resolve().parents[1]
DOCS = docs_text.all_text()


def _command(prefix: str) -> list[str]:
    """The docs' one line that starts with ``prefix``, as argv (without ``fedcore``)."""
    lines = [line.strip().lstrip("$ ") for line in DOCS.splitlines()]
    found = [line for line in lines if line.startswith(prefix)]
    assert len(found) == 1, f"the docs have {len(found)} lines starting {prefix!r}"
    argv = shlex.split(found[0], comments=True)
    assert argv[0] == "fedcore"
    return argv[1:]


def test_the_grid_sweep_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _command("fedcore sweep examples/dpsgd.toml --grid")
    argv[1] = str(ROOT / argv[1])  # the example, from the scratch folder
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "[18/18]" in out.err
    assert "best avg_model_accuracy (max): " in out.out
    (grid,) = (tmp_path / "runs").iterdir()
    rows = list(csv.DictReader((grid / "results.csv").read_text(encoding="utf-8").splitlines()))
    assert [(r["algorithm.lr"], r["compression.codec"]) for r in rows] == [
        (lr, codec) for lr in ("0.1", "0.3", "1") for codec in ("fp32", "sign")
    ]
    assert all(r["completed"] == "3" for r in rows)


def test_the_tracked_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard")
    argv = _command("fedcore simulate --tensorboard --csv --out runs/tracked")
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--quiet"]) == 0
    run = tmp_path / "runs" / "tracked"
    rounds = json.loads((run / "summary.json").read_text(encoding="utf-8"))["rounds"]
    table = (run / "rounds.csv").read_text(encoding="utf-8").splitlines()
    assert len(list(csv.DictReader(table))) == rounds
    assert any((run / "tensorboard").iterdir())
    assert "tensorboard --logdir runs/tracked/tensorboard" in DOCS


def test_the_deploy_command_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fedcore deploy --target compose`` (docs/deployment.md) writes what ``fedcore
    compose`` writes, as the docs say."""
    argv = _command("fedcore deploy examples/")
    assert argv[argv.index("--target") + 1] == "compose"
    argv[1] = str(ROOT / argv[1])
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    out = argv[argv.index("--out") + 1]
    assert f"wrote {out}/docker-compose.yml" in capsys.readouterr().out
    assert main(["compose", argv[1], "--out", "compose"]) == 0

    def tree(folder: str) -> list[str]:
        return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*"))

    written = tree(out)
    assert written == tree("compose")
    for name in written:
        if (Path(out) / name).is_file():
            assert (Path(out) / name).read_bytes() == (Path("compose") / name).read_bytes()
