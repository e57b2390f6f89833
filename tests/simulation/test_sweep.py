"""Seed sweeps: ``fedcore simulate --seeds`` (``fedcore.simulation.sweep``)."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from fedcore.cli import main
from fedcore.data import Dataset, digits
from fedcore.simulation.seeds import parse_seeds
from fedcore.simulation.sweep_figures import FIGURES, final_figures, mean_std
from tests.clitools import PNG_MAGIC, TINY, cli, one_line_error

REPO = Path(__file__).resolve().parents[2]


def flaky_digits(*, seed: int, test_fraction: float) -> Dataset:
    """The digits, except for seed 1, which fails (a run of a sweep that fails)."""
    if seed == 1:
        raise RuntimeError("no data for seed 1")
    return digits(seed=seed, test_fraction=test_fraction)


def broken_digits(*, seed: int, test_fraction: float) -> Dataset:
    """A dataset that fails for every seed."""
    raise RuntimeError("no data at all")


def interrupted_digits(*, seed: int, test_fraction: float) -> Dataset:
    """The digits, except that seed 1 is where the user presses Ctrl-C."""
    if seed == 1:
        raise KeyboardInterrupt
    return digits(seed=seed, test_fraction=test_fraction)


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


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "sw"
    assert main(["simulate", "-q", "--seeds", "0-2", "--out", str(out), *TINY]) == 0
    return out


# --- the sweep folder -------------------------------------------------------------------


def test_seeds_write_one_folder_per_seed_and_the_sweep_files(sweep_dir: Path) -> None:
    assert sorted(p.name for p in sweep_dir.iterdir()) == [
        "results.csv",
        "seed-0",
        "seed-1",
        "seed-2",
        "sweep.json",
    ]
    sweep = read_json(sweep_dir / "sweep.json")
    assert sweep["status"] == "completed"
    assert sweep["seeds"] == sweep["completed"] == [0, 1, 2]
    assert sweep["failed"] == []
    assert [r["out_dir"] for r in sweep["runs"]] == ["seed-0", "seed-1", "seed-2"]
    for k in range(3):
        config = (sweep_dir / f"seed-{k}" / "config.toml").read_text(encoding="utf-8")
        assert f"seed = {k}\n" in config
        summary = read_json(sweep_dir / f"seed-{k}" / "summary.json")
        assert f"run.seed={k}" in summary["overrides"]


def test_means_and_stds_are_those_of_the_runs(sweep_dir: Path) -> None:
    sweep = read_json(sweep_dir / "sweep.json")
    summaries = [read_json(sweep_dir / f"seed-{k}" / "summary.json") for k in range(3)]
    figures = [final_figures(s) for s in summaries]
    assert set(sweep["stats"]) == set(figures[0])
    for key, stats in sweep["stats"].items():
        values = [f[key] for f in figures]
        assert stats["n"] == 3
        assert stats["mean"] == pytest.approx(statistics.mean(values), rel=1e-12, abs=1e-15)
        assert stats["std"] == pytest.approx(statistics.stdev(values), rel=1e-9, abs=1e-15)
    accuracy = [s["final"]["avg_model_accuracy"] for s in summaries]
    assert sweep["stats"]["avg_model_accuracy"]["mean"] == pytest.approx(sum(accuracy) / 3)
    walls = [s["wall_seconds"] for s in summaries]
    assert sweep["stats"]["wall_seconds"]["mean"] == pytest.approx(sum(walls) / 3)


def test_results_csv_has_a_row_per_seed_then_mean_and_std(sweep_dir: Path) -> None:
    with open(sweep_dir / "results.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["seed"] for r in rows] == ["0", "1", "2", "mean", "std"]
    sweep = read_json(sweep_dir / "sweep.json")
    for key, stats in sweep["stats"].items():
        assert float(rows[3][key]) == pytest.approx(stats["mean"])
        assert float(rows[4][key]) == pytest.approx(stats["std"])
    for k in range(3):
        summary = read_json(sweep_dir / f"seed-{k}" / "summary.json")
        assert float(rows[k]["avg_model_accuracy"]) == summary["final"]["avg_model_accuracy"]
        assert rows[k]["status"] == "completed"


def test_the_table_shows_mean_and_std_and_progress_shows_each_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the default folder, runs/<name>-seeds<spec>-<time>
    status, out, err = cli(capsys, "simulate", "--seeds", "3,5", *TINY)
    assert status == 0, err
    (folder,) = (tmp_path / "runs").iterdir()
    assert "-seeds3_5-" in folder.name
    assert "avg-model accuracy" in out
    assert "±" in out
    assert str(Path("runs") / folder.name) in out
    lines = [line for line in err.splitlines() if line.startswith("sweep: seed")]
    assert len(lines) == 2, err
    assert "[2/2]" in lines[1]


def test_jobs_2_runs_in_workers_and_gives_the_same_runs(
    sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "par"
    status, _, err = cli(
        capsys, "simulate", "-q", "--seeds", "0-1", "--jobs", "2", "--out", str(out), *TINY
    )
    assert status == 0, err
    sweep = read_json(out / "sweep.json")
    assert sweep["jobs"] == 2
    assert sweep["completed"] == [0, 1]
    for k in (0, 1):  # worker processes run exactly what the in-process sweep ran
        mine = read_json(out / f"seed-{k}" / "summary.json")["params_sha256"]
        assert mine == read_json(sweep_dir / f"seed-{k}" / "summary.json")["params_sha256"]


def test_plot_draws_a_sweep_folder_in_bands(
    sweep_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "bands.png"
    status, _, err = cli(capsys, "plot", str(sweep_dir), "--bands", "--out", str(png))
    assert status == 0, err
    assert png.read_bytes().startswith(PNG_MAGIC)


# --- failures ---------------------------------------------------------------------------


def test_a_failed_run_is_recorded_and_the_sweep_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "flaky"
    argv = ["simulate", "--seeds", "0-1", "--out", str(out), *TINY]
    argv += ["--set", "data.dataset=tests.simulation.test_sweep:flaky_digits"]
    status, table, err = cli(capsys, *argv)
    assert status == 0, err
    sweep = read_json(out / "sweep.json")
    assert sweep["status"] == "completed"
    assert (sweep["completed"], sweep["failed"]) == ([0], [1])
    assert "no data for seed 1" in sweep["runs"][1]["reason"]
    assert sweep["stats"]["avg_model_accuracy"] == {
        "mean": sweep["runs"][0]["final"]["avg_model_accuracy"],
        "std": None,  # one run: no sample deviation
        "n": 1,
    }
    assert "seed 1 failed" in table
    assert "seed 1 [2/2]: failed" in err
    # the folder now holds a sweep: refused without --force, replaced with it
    one_line_error(capsys, [*argv, "-q"], "holds another sweep", "--force")
    status, _, err = cli(capsys, *argv, "-q", "--force")
    assert status == 0, err


def test_a_sweep_whose_every_run_fails_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "broken"
    argv = ["simulate", "-q", "--seeds", "0-1", "--out", str(out), *TINY]
    argv += ["--set", "data.dataset=tests.simulation.test_sweep:broken_digits"]
    one_line_error(capsys, argv, "every run of the sweep failed", "seed 0", "no data at all")
    sweep = read_json(out / "sweep.json")
    assert sweep["status"] == "failed"
    assert sweep["failed"] == [0, 1]


def test_ctrl_c_leaves_sweep_json_saying_which_seeds_completed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stopped"
    argv = ["simulate", "-q", "--seeds", "0-2", "--out", str(out), *TINY]
    status, _, err = cli(
        capsys, *argv, "--set", "data.dataset=tests.simulation.test_sweep:interrupted_digits"
    )
    assert status == 130
    assert "Traceback" not in err
    sweep = read_json(out / "sweep.json")
    assert sweep["status"] == "interrupted"
    assert sweep["completed"] == [0]
    assert [r["status"] for r in sweep["runs"]] == ["completed", "interrupted", "interrupted"]


def test_a_stopped_seed_sweep_resumes_with_the_seeds_that_did_not_complete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "stopped"
    argv = ["simulate", "--seeds", "0-2", "--out", str(out), *TINY]
    argv += ["--set", "data.dataset=tests.simulation.test_sweep:interrupted_once_digits"]
    _STOPS[:] = [1]
    status, _, err = cli(capsys, *argv)
    assert status == 130
    assert f"continue with: fedcore simulate --resume {out}" in err
    first = (out / "seed-0" / "summary.json").read_bytes()
    one_line_error(capsys, ["simulate", "--resume", str(out), "--seeds", "0-3"], "drop --seeds")
    status, table, err = cli(capsys, "simulate", "--resume", str(out), "--jobs", "1")
    assert status == 0, err
    assert "[2/2]" in err and "seed 0" not in err  # seed 0 completed before: kept, not rerun
    assert (out / "seed-0" / "summary.json").read_bytes() == first
    sweep = read_json(out / "sweep.json")
    assert sweep["status"] == "completed" and sweep["completed"] == [0, 1, 2]
    assert "avg-model accuracy" in table
    one_line_error(capsys, ["simulate", "--resume", str(out)], "nothing to resume")


def test_resume_refuses_a_grid_folder_with_the_command_that_resumes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "grid"
    folder.mkdir()
    (folder / "sweep.json").write_text('{"kind": "grid"}', encoding="utf-8")
    one_line_error(
        capsys, ["simulate", "--resume", str(folder)], f"fedcore sweep --resume {folder}"
    )


# --- seeds and other input --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("2", [2]),
        ("0-4", [0, 1, 2, 3, 4]),
        ("0,3,7", [0, 3, 7]),
        ("0-2,5", [0, 1, 2, 5]),
        (" 7 - 8 , 1 ", [7, 8, 1]),
        ("4-4", [4]),
    ],
)
def test_parse_seeds_forms(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty item"),
        ("a", "'a' is not a seed"),
        ("1,,2", "empty item"),
        ("-1", "not a seed"),
        ("0-", "not a seed"),
        ("1.5", "not a seed"),
        ("4-2", "runs backwards"),
        ("0,3,0", "seed 0 is listed twice"),
        ("0-4,3", "seed 3 is listed twice"),
        ("0-1000", "more than 1000 seeds"),
        ("0-99999999999", "2**32"),
        ("4294967296", "2**32"),
    ],
)
def test_bad_seeds_are_one_line(
    text: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_error(
        capsys, ["simulate", "-q", "--seeds", text, "--out", str(tmp_path / "s")], needle
    )
    if needle in ("empty item", "not a seed", "'a' is not a seed"):
        assert "0-4" in line  # the accepted forms
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--jobs", "0"], ("--jobs", ">= 1")),
        (["--set", "run.seed=3"], ("--seeds sets run.seed", "run.seed=3")),
        (["--set", "run.rounds=abc"], ("run.rounds",)),
    ],
)
def test_bad_sweep_input_fails_before_any_run(
    extra: list[str], needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s"
    one_line_error(
        capsys, ["simulate", "-q", "--seeds", "0-1", "--out", str(out), *extra], *needles
    )
    assert not out.exists()


def test_mean_std_is_the_sample_deviation() -> None:
    assert mean_std([]) == (None, None)
    assert mean_std([2.5]) == (2.5, None)
    mean, std = mean_std([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert std == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))


def test_final_figures_are_those_the_table_shows() -> None:
    summary = {
        "final": {"avg_model_accuracy": 0.5, "consensus_distance": None, "static_regret": 2.0},
        "traffic": {"bytes_per_node_per_round": 10},
        "wall_seconds": 1.5,
    }
    figures = final_figures(summary)
    assert figures["avg_model_accuracy"] == 0.5
    assert figures["consensus_distance"] is None  # a diverged run's null stays not-a-number
    assert figures["static_regret"] == 2.0
    assert "dynamic_regret" not in figures  # not computed, not shown
    assert figures["bytes_per_node_per_round"] == 10.0
    assert figures["wall_seconds"] == 1.5
    assert set(figures) <= {key for key, _, _ in FIGURES}


def test_a_sweep_is_named_as_a_run_is_whatever_it_writes_beside_its_records() -> None:
    """``run.tensorboard`` and ``run.csv`` do not name a sweep, as they do not name a run."""
    from fedcore.config import load_config
    from fedcore.simulation.sweep import sweep_name

    overrides = ["algorithm.lr=0.1", "run.csv=true", "simulate.engine=messages"]
    name = sweep_name(load_config(None, overrides), overrides, [0, 1])
    assert name.endswith("-algorithm.lr=0.1-seeds0-1")
    assert "csv" not in name and "engine" not in name
