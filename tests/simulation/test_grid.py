"""Grid sweeps: ``fedcore sweep --grid`` (``fedcore.simulation.grid``)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from fedcore.cli import main
from fedcore.data import Dataset, digits
from fedcore.plotting import expand_runs, grid_keys
from fedcore.plotting.curves import _curves
from fedcore.simulation.grid import best_cell, split_values
from fedcore.simulation.sweep_figures import final_figures
from tests.clitools import PNG_MAGIC, TINY, cli, one_line_error

REPO = Path(__file__).resolve().parents[2]
GRID = ["--grid", "algorithm.lr=0.1,0.5", "--grid", "compression.codec=fp32,sign"]
CELLS = [
    ("0.1", "fp32"),
    ("0.1", "sign"),
    ("0.5", "fp32"),
    ("0.5", "sign"),
]
SEEDS = (0, 1)

_STOPS = [1]  # how many more times interrupted_once_digits stops the sweep


def interrupted_once_digits(*, seed: int, test_fraction: float) -> Dataset:
    """The digits; the first time seed 1 asks for them, the user presses Ctrl-C."""
    if seed == 1 and _STOPS:
        _STOPS.pop()
        raise KeyboardInterrupt
    return digits(seed=seed, test_fraction=test_fraction)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO))


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def cell_dir(grid: Path, lr: str, codec: str) -> Path:
    return grid / f"algorithm.lr={lr}_compression.codec={codec}"


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A 2 x 2 grid, two seeds each: the folder, stdout and stderr."""
    out = tmp_path_factory.mktemp("grid") / "g"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(["sweep", *GRID, "--seeds", "0-1", "--out", str(out), *TINY])
    assert status == 0, stderr.getvalue()
    return out, stdout.getvalue(), stderr.getvalue()


def test_a_grid_runs_the_cross_product_and_says_which_is_best(
    grid_run: tuple[Path, str, str],
) -> None:
    out, table, progress = grid_run
    # one folder per cell and seed, each an ordinary run
    for lr, codec in CELLS:
        for seed in SEEDS:
            summary = read_json(cell_dir(out, lr, codec) / f"seed-{seed}" / "summary.json")
            assert summary["status"] == "completed"
            assert summary["nodes"] == 4
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(
        cell_dir(out, lr, codec).name for lr, codec in CELLS
    )
    # one progress line per finished run
    lines = [line for line in progress.splitlines() if "seed" in line]
    assert len(lines) == len(CELLS) * len(SEEDS)
    assert lines[0].startswith("algorithm.lr=0.1, compression.codec=fp32: seed 0 [1/8]")
    # results.csv: a row per cell, the grid keys, then mean and std of each final figure
    with open(out / "results.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["algorithm.lr"], r["compression.codec"]) for r in rows] == CELLS
    header = list(rows[0])
    assert header[:4] == [
        "algorithm.lr",
        "compression.codec",
        "avg_model_accuracy_mean",
        "avg_model_accuracy_std",
    ]
    for row, (lr, codec) in zip(rows, CELLS, strict=True):
        runs = [
            final_figures(read_json(cell_dir(out, lr, codec) / f"seed-{s}" / "summary.json"))
            for s in SEEDS
        ]
        for key in ("avg_model_accuracy", "average_loss", "consensus_distance", "wall_seconds"):
            values = [r[key] for r in runs]
            assert float(row[f"{key}_mean"]) == pytest.approx(statistics.mean(values))
            assert float(row[f"{key}_std"]) == pytest.approx(statistics.stdev(values))
        assert row["completed"] == "2"
    # the best cell: the highest mean accuracy, in sweep.json and on the console
    record = read_json(out / "sweep.json")
    assert record["kind"] == "grid"
    assert record["status"] == "completed"
    means = [float(r["avg_model_accuracy_mean"]) for r in rows]
    best = means.index(max(means))
    assert record["best"]["label"] == record["cells"][best]["label"]
    assert record["best"]["direction"] == "max"
    assert f"best avg_model_accuracy (max): {record['cells'][best]['label']}:" in table


def test_best_is_the_lowest_loss_and_the_highest_accuracy() -> None:
    cells = [
        {"label": "a", "values": {}, "out_dir": "a", "stats": {"average_loss": {"mean": 0.5}}},
        {"label": "b", "values": {}, "out_dir": "b", "stats": {"average_loss": {"mean": 0.2}}},
        {"label": "c", "values": {}, "out_dir": "c", "stats": {}},
    ]
    for cell, acc in zip(cells, (0.9, 0.7, None), strict=True):
        cell["stats"]["avg_model_accuracy"] = {"mean": acc, "std": None, "n": 1}
        cell["stats"].setdefault("average_loss", {"mean": None})
        cell["stats"]["average_loss"].update(std=None, n=1)
    assert best_cell(cells, "average_loss")["label"] == "b"  # type: ignore[index]
    assert best_cell(cells, "avg_model_accuracy")["label"] == "a"  # type: ignore[index]
    assert best_cell(cells, "static_regret") is None


def test_plot_labels_a_grid_by_its_keys(grid_run: tuple[Path, str, str], tmp_path: Path) -> None:
    out = grid_run[0]
    assert grid_keys([out]) == ["algorithm.lr", "compression.codec"]
    runs = expand_runs([out])
    assert len(runs) == len(CELLS) * len(SEEDS)
    curves, _, _ = _curves(runs, "algorithm.lr,compression.codec", bands=True)
    assert [c.label for c in curves] == [
        f"algorithm.lr={lr}, {codec} (mean ± std, 2 seeds)" for lr, codec in CELLS
    ]
    png = tmp_path / "grid.png"
    assert main(["plot", str(out), "--bands", "--out", str(png), "-q"]) == 0
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_ctrl_c_then_resume_runs_only_what_did_not_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stopped"
    argv = ["sweep", "--grid", "algorithm.lr=0.1,0.5", "--seeds", "0-1", "--out", str(out)]
    argv += [*TINY, "--set", "data.dataset=tests.simulation.test_grid:interrupted_once_digits"]
    _STOPS[:] = [1]
    status, _, err = cli(capsys, *argv)
    assert status == 130
    assert "Traceback" not in err
    assert f"fedcore sweep --resume {out}" in err
    record = read_json(out / "sweep.json")
    assert record["status"] == "interrupted"
    assert [c["completed"] for c in record["cells"]] == [[0], []]
    first = out / "algorithm.lr=0.1" / "seed-0" / "summary.json"
    before = first.read_bytes()
    # a second grid in the same folder is refused; --resume with other options too
    one_line_error(capsys, argv, "holds another sweep", "--resume")
    one_line_error(capsys, ["sweep", "--resume", str(out), "--seeds", "0-3"], "drop --seeds")
    status, table, err = cli(capsys, "sweep", "--resume", str(out))
    assert status == 0, err
    assert "[3/3]" in err and "[4/" not in err  # the completed run did not run again
    assert first.read_bytes() == before
    record = read_json(out / "sweep.json")
    assert record["status"] == "completed"
    assert [c["completed"] for c in record["cells"]] == [[0, 1], [0, 1]]
    assert "best avg_model_accuracy (max)" in table
    with open(out / "results.csv", encoding="utf-8") as fh:
        assert [r["completed"] for r in csv.DictReader(fh)] == ["2", "2"]


def _set_error(capsys: pytest.CaptureFixture[str], item: str) -> str:
    """The message ``fedcore simulate --set item`` gives."""
    status, _, err = cli(capsys, "simulate", "-q", "--set", item, "--out", "/nonexistent/x")
    assert status == 2
    return err.strip().removeprefix("fedcore: error: ")


@pytest.mark.parametrize(
    "grid",
    [
        "algorithm.lr=0.1,abc",
        "compression.codec=fp32,nope",
        "algorithm.foo=2",
        "topology.kind=ring,nowhere",
    ],
)
def test_a_bad_grid_value_fails_before_any_run_as_set_does(
    grid: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, _, values = grid.partition("=")
    bad = f"{key}={values.split(',')[-1]}"
    message = _set_error(capsys, bad)
    out = tmp_path / "g"
    line = one_line_error(capsys, ["sweep", "--grid", grid, "--out", str(out)], message)
    assert line.startswith(f"fedcore: error: --grid {bad}: ")
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        ([], ("at least one --grid",)),
        (["--grid", "algorithm.lr"], ("no '='",)),
        (["--grid", "algorithm.lr=0.1,,1"], ("an empty value",)),
        (["--grid", "algorithm.lr=0.1,0.10"], ("listed twice",)),
        (["--grid", "run.seed=1,2"], ("--seeds",)),
        (["--grid", "algorithm.lr=1,2", "--grid", "algorithm.lr=3"], ("gridded twice",)),
        (["--grid", "algorithm.lr=1,2", "--set", "algorithm.lr=3"], ("give it once",)),
        (["--grid", "algorithm.lr=1,2", "--best", "nope"], ("--best 'nope'",)),
        (["--grid", "algorithm.lr=1,2", "--seeds", "3-1"], ("runs backwards",)),
        (["--grid", "algorithm.lr=1,2", "--jobs", "0"], ("--jobs",)),
    ],
)
def test_bad_grid_input_is_one_line(
    argv: list[str], needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "g"
    one_line_error(capsys, ["sweep", *argv, "--out", str(out)], *needles)
    assert not out.exists()


def test_split_values_keeps_lists_and_quoted_commas_whole() -> None:
    assert split_values("0.1, 0.3,1") == ["0.1", "0.3", "1"]
    assert split_values('[1,2],[3],"a,b"') == ["[1,2]", "[3]", '"a,b"']
    assert split_values("{ a = 1, b = 2 },x") == ["{ a = 1, b = 2 }", "x"]


def test_a_resumed_run_continues_from_its_checkpoint_and_ends_as_if_never_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedcore.simulation import sweep_workers
    from fedcore.simulation.observer import RunObserver

    real_end, real_resume = RunObserver.end_round, sweep_workers.resume
    stops: list[int] = []

    def end_round(self: RunObserver, t: int, *args: Any, **kwargs: Any) -> float:
        if t == 5 and not stops:  # Ctrl-C in round 5 of the first run
            stops.append(t)
            raise KeyboardInterrupt
        return real_end(self, t, *args, **kwargs)

    resumed: list[str] = []

    def spy(run_dir: str, **kwargs: Any) -> dict[str, Any]:
        resumed.append(Path(run_dir).parent.name)
        return real_resume(run_dir, **kwargs)

    monkeypatch.setattr(RunObserver, "end_round", end_round)
    monkeypatch.setattr(sweep_workers, "resume", spy)
    argv = ["sweep", "--grid", "algorithm.lr=0.1,0.5", "--set", "run.checkpoint_every=2"]
    argv += [*TINY, "--set", "run.rounds=8"]
    out = tmp_path / "stopped"
    assert cli(capsys, *argv, "--out", str(out), "-q")[0] == 130
    assert read_json(out / "algorithm.lr=0.1" / "seed-0" / "summary.json")["status"] == (
        "interrupted"
    )
    status, _, err = cli(capsys, "sweep", "--resume", str(out), "-q")
    assert status == 0, err
    assert resumed == ["algorithm.lr=0.1"]  # from its checkpoint; the other cell ran fresh
    whole = tmp_path / "whole"
    assert cli(capsys, *argv, "--out", str(whole), "-q")[0] == 0
    for cell in ("algorithm.lr=0.1", "algorithm.lr=0.5"):
        a = read_json(out / cell / "seed-0" / "summary.json")
        b = read_json(whole / cell / "seed-0" / "summary.json")
        assert a["status"] == "completed"
        assert a["params_sha256"] == b["params_sha256"]
        assert a["final"] == b["final"]


def test_a_failed_cell_is_recorded_and_the_grid_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = "tests.simulation.test_sweep:broken_digits"
    out = tmp_path / "g"
    argv = ["sweep", "--grid", f"data.dataset=digits,{broken}", *TINY]
    status, table, err = cli(capsys, *argv, "--out", str(out))
    assert status == 0, err
    assert "seed 0 [2/2]: failed: " in err and "no data at all" in err
    record = read_json(out / "sweep.json")
    assert [(c["completed"], c["failed"]) for c in record["cells"]] == [([0], []), ([], [0])]
    assert record["best"]["values"] == {"data.dataset": "digits"}
    assert "0/1 (1 failed)" in table
    # every run failing is an error (exit 1: not the input's fault), and the files say so
    status, _, err = cli(
        capsys, "sweep", "--grid", f"data.dataset={broken}", *TINY, "--out", str(tmp_path / "b")
    )
    assert status == 1 and "every run of the grid failed" in err
    assert read_json(tmp_path / "b" / "sweep.json")["status"] == "failed"
