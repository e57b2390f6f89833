"""Experiment tracking and runs that blow up (issue 27, items 3 and 8).

``run.tensorboard`` / ``--tensorboard`` writes TensorBoard event files, ``run.csv`` /
``--csv`` a ``rounds.csv``, on both engines, for ``fedcore launch`` and through a resume,
and both say what ``metrics.jsonl`` says (read back with TensorBoard's own reader and the
csv module). A run whose loss grows by orders of magnitude says so (``summary.json``
``diverging``, one warning line); a batch size larger than a peer's data says so once.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import math
import signal
from pathlib import Path
from typing import Any

import pytest

from fedcore.setup import checkpoint
from tests.clitools import cli, one_line_error

TINY = ["--set", "run.rounds=12", "--set", "run.eval_every=5"]
TINY += ["--set", "topology.nodes=4", "--set", "data.batch_size=16"]
ROUND_KEYS = (
    "train_loss",
    "nodes_up",
    "messages_sent",
    "bytes_sent",
    "messages_missing",
    "messages_dropped",
)


def _records(folder: Path, kind: str) -> list[dict[str, Any]]:
    lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def _summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text(encoding="utf-8"))


def _events(folder: Path) -> Any:
    """The run's TensorBoard events, through TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    accumulator.Reload()
    return accumulator


def _close(a: float, b: float) -> bool:
    """TensorBoard keeps scalars as float32."""
    return a == pytest.approx(b, rel=1e-6, abs=1e-30) or (math.isnan(a) and math.isnan(b))


def assert_tracking_matches_metrics(folder: Path) -> None:
    """``rounds.csv`` and the event files hold exactly ``metrics.jsonl``'s rounds and
    evaluations (one value a round and key, none twice) and the config as text."""
    rounds = _records(folder, "round")
    evals = _records(folder, "eval")
    with open(folder / "rounds.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["round"]) for r in rows] == [r["round"] for r in rounds]
    for row, record in zip(rows, rounds, strict=True):
        for key in ROUND_KEYS:
            want = record[key]
            assert (row[key] == "") if want is None else float(row[key]) == want, (key, row)
    events = _events(folder)
    tags = set(events.Tags()["scalars"])
    for key in ROUND_KEYS:
        scalars = events.Scalars(f"round/{key}")
        assert [s.step for s in scalars] == [r["round"] for r in rounds], key
        for s, record in zip(scalars, rounds, strict=True):
            assert _close(s.value, math.nan if record[key] is None else record[key]), key
    for key in ("avg_model_accuracy", "mean_node_accuracy", "consensus_distance"):
        scalars = events.Scalars(f"eval/{key}")
        assert [s.step for s in scalars] == [e["round"] for e in evals], key
        assert all(_close(s.value, e[key]) for s, e in zip(scalars, evals, strict=True)), key
    assert "eval/bytes_sent_per_node" in tags
    texts = events.Tensors("config/text_summary")
    assert len(texts) == 1
    text = texts[0].tensor_proto.string_val[0].decode()
    assert (folder / "config.toml").read_text(encoding="utf-8").strip() in text


@pytest.mark.parametrize("engine", ["vectorized", "messages"])
def test_tensorboard_and_csv_say_what_metrics_jsonl_says(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27 item 3: ``--tensorboard --csv`` (unknown options before) on both engines."""
    out = tmp_path / "run"
    argv = ["simulate", *TINY, "--engine", engine, "--out", str(out), "-q"]
    status, _, err = cli(capsys, *argv, "--tensorboard", "--csv")
    assert status == 0, err
    assert_tracking_matches_metrics(out)
    # The same run with run.tensorboard / run.csv in the config: the same name and run.
    again = tmp_path / "again"
    sets = ["--set", "run.tensorboard=true", "--set", "run.csv=true"]
    status, _, err = cli(capsys, *argv[:-3], *sets, "--out", str(again), "-q")
    assert status == 0, err
    first, second = _summary(out), _summary(again)
    assert first["name"] == second["name"] and first["run_id"] == second["run_id"]
    assert first["params_sha256"] == second["params_sha256"]
    assert_tracking_matches_metrics(again)


def _interrupt_at_checkpoint(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Ctrl-C in place of the ``count``-th checkpoint: the rounds since the one before are
    tracked, and run again on resume."""
    real = checkpoint.write
    calls = []

    def write(folder: Path, round: int, content: dict[str, Any]) -> Path:
        calls.append(round)
        if len(calls) == count:
            signal.raise_signal(signal.SIGINT)
        return real(folder, round, content)

    monkeypatch.setattr(checkpoint, "write", write)


@pytest.mark.parametrize("engine", ["vectorized", "messages"])
def test_a_resumed_run_tracks_each_round_once(
    engine: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped at round 30, its checkpoint not written (the last is round 20's; rounds 20
    to 29 were tracked already) and resumed: rounds.csv and the events hold each round
    once, as the whole run's do."""
    args = ["--set", "run.rounds=60", "--set", "run.eval_every=15"]
    args += ["--set", "run.checkpoint_every=10", "--engine", engine, "--tensorboard", "--csv"]
    assert cli(capsys, "simulate", *args, "-q", "--out", str(tmp_path / "whole"))[0] == 0
    _interrupt_at_checkpoint(monkeypatch, 3)
    stopped = tmp_path / "stopped"
    status, _, _ = cli(capsys, "simulate", *args, "-q", "--out", str(stopped))
    assert status == 130
    with open(stopped / "rounds.csv", encoding="utf-8") as fh:
        tracked = len(list(csv.reader(fh))) - 1  # rounds 0-29 at least: past round 20
    assert tracked >= 30 and len(_events(stopped).Scalars("round/train_loss")) == tracked
    monkeypatch.undo()
    status, _, err = cli(capsys, "simulate", "--resume", str(stopped), "-q")
    assert status == 0, err
    assert_tracking_matches_metrics(stopped)
    whole = (tmp_path / "whole" / "rounds.csv").read_text(encoding="utf-8")
    assert (stopped / "rounds.csv").read_text(encoding="utf-8") == whole
    steps = [s.step for s in _events(stopped).Scalars("round/train_loss")]
    assert steps == list(range(60))


def test_tensorboard_without_the_package_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "tensorboard" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for argv in (
        ["simulate", "--tensorboard", "--out", str(tmp_path / "a")],
        ["simulate", "--set", "run.tensorboard=true", "--out", str(tmp_path / "b")],
        ["launch", "--tensorboard", "--out", str(tmp_path / "c")],
    ):
        one_line_error(capsys, argv, "run.tensorboard", "pip install 'fedcore[tensorboard]'")
    assert not list(tmp_path.iterdir())  # refused at load, before any run folder


@pytest.mark.parametrize("engine", ["vectorized", "messages"])
def test_a_run_that_blows_up_says_so(
    engine: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 27 item 8: ``--set algorithm.lr=1e6`` ran to a loss of 5e4 with nothing said.
    Now: ``diverging`` true and one warning line; an ordinary run says false."""
    blown = tmp_path / "blown"
    with caplog.at_level(logging.WARNING, logger="fedcore"):
        status, _, err = cli(
            capsys,
            "simulate",
            *TINY,
            "--set",
            "algorithm.lr=1e6",
            "--engine",
            engine,
            "--out",
            str(blown),
        )
    assert status == 0, err
    summary = _summary(blown)
    assert summary["diverging"] is True
    said = [r.getMessage() for r in caplog.records if "diverging" in r.getMessage()]
    assert len(said) == 1 and "times the first round's" in said[0], said
    rounds = _records(blown, "round")
    losses = [r["train_loss"] for r in rounds]
    assert sum(losses) / len(losses) > 100 * losses[0]  # the rule, by hand (every node up)
    caplog.clear()
    calm = tmp_path / "calm"
    with caplog.at_level(logging.WARNING, logger="fedcore"):
        argv = ["simulate", *TINY, "--engine", engine, "--out", str(calm), "-q"]
        assert cli(capsys, *argv)[0] == 0
    assert _summary(calm)["diverging"] is False
    assert not [r for r in caplog.records if "diverging" in r.getMessage()]


def test_a_loss_that_is_not_finite_is_diverging() -> None:
    from fedcore.simulation.observer import RunObserver

    observer = RunObserver.__new__(RunObserver)
    observer.first_loss, observer.recent_losses = 2.3, [1.0, math.nan]
    observer.loss_sum, observer.loss_count = 40.0, 20
    assert observer.diverging()[0] is True
    observer.recent_losses = [2.0, 1.0]
    assert observer.diverging() == (False, "")
    observer.recent_losses = [229.0, 232.0]  # 100.2 times 2.3
    assert observer.diverging()[0] is True
    # Blown up on its way (a mean of 240 over 100 rounds), its last rounds small again.
    observer.recent_losses, observer.loss_sum, observer.loss_count = [1.0, 0.0], 24000.0, 100
    assert observer.diverging()[0] is True
    assert "average training loss" in observer.diverging()[1]


def test_a_batch_larger_than_a_peers_data_says_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27 item 8: ``data.batch_size`` above the smallest peer's examples was capped
    without a word (an info line, hidden by default)."""
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="fedcore"):
        argv = [*TINY, "--set", "data.batch_size=100000", "--out", str(out), "-q"]
        assert cli(capsys, "simulate", *argv)[0] == 0
    said = [r.getMessage() for r in caplog.records if "data.batch_size" in r.getMessage()]
    assert len(said) == 1, said
    assert "100000" in said[0] and "smallest peer" in said[0] and "used" in said[0]


@pytest.mark.grpc
def test_launch_tracks_its_merged_rounds_and_says_it_diverged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``fedcore launch --tensorboard --csv`` of a run that blows up: the merged records'
    tracking, ``diverging`` true, and the table names the gRPC peers, not ``messages``."""
    out = tmp_path / "launch"
    argv = ["launch", *TINY, "--set", "algorithm.lr=1e6", "--peers-per-process", "4"]
    with caplog.at_level(logging.WARNING, logger="fedcore"):
        status, table, err = cli(capsys, *argv, "--tensorboard", "--csv", "--out", str(out))
    assert status == 0, err
    assert_tracking_matches_metrics(out)
    assert _summary(out)["diverging"] is True
    assert sum("diverging" in r.getMessage() for r in caplog.records) == 1
    assert "  engine                grpc peers (1 process)" in table.splitlines()
