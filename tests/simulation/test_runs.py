"""Runs that can be told apart, say how they ended, and continue where they stopped.

Issue 14 items 2 (names) and 4 (status, ``fedcore simulate --resume``): an interrupted
run writes ``status = "interrupted"`` and, resumed from its checkpoint, ends with the
parameters, records and figures of the run that was never stopped.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedcore.setup import checkpoint
from fedcore.simulation.results import run_name
from tests.clitools import assert_one_line_error, cli

SMALL = ["--set", "run.rounds=120", "--set", "run.eval_every=40"]
SMALL += ["--set", "run.checkpoint_every=20"]
RING3 = ["--set", "topology.kind=ring", "--set", "topology.nodes=3"]
RING3 += ["--set", "algorithm.name=dpsgd", "--set", "run.rounds=100000"]


def _summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text(encoding="utf-8"))


def _records(folder: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` without wall times (the only figures a resumed run may change)."""
    out = []
    for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        record.pop("wall_s", None)
        out.append(record)
    return out


def _interrupt_after_checkpoints(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Send this process SIGINT, as Ctrl-C does, right after the ``count``-th checkpoint."""
    real = checkpoint.write
    written = []

    def write(folder: Path, round: int, content: dict[str, Any]) -> Path:
        path = real(folder, round, content)
        written.append(round)
        if len(written) == count:
            signal.raise_signal(signal.SIGINT)
        return path

    monkeypatch.setattr(checkpoint, "write", write)


def test_default_name_says_what_set_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--set", "run.rounds=4", "--set", "algorithm.lr=0.2", "-q"]
    status, out, _ = cli(capsys, "simulate", *args, "--engine", "messages")
    assert status == 0
    folder = Path(out.split("results: ", 1)[1].strip())
    summary = _summary(folder)
    # How a run is simulated (--engine) does not name it; what it runs does.
    assert summary["name"] == "ops-social-16-run.rounds=4-algorithm.lr=0.2"
    assert folder.name.startswith("ops-social-16-run.rounds=4-algorithm.lr=0.2-")
    assert summary["overrides"] == ["run.rounds=4", "algorithm.lr=0.2", "simulate.engine=messages"]
    status, out, _ = cli(capsys, "simulate", *args, "--name", "lr 0.2")
    folder = Path(out.split("results: ", 1)[1].strip())
    assert _summary(folder)["name"] == "lr 0.2"
    assert folder.name.startswith("lr_0.2-")


def test_run_name_keeps_the_files_name_and_adds_overrides() -> None:
    from fedcore.config import load_config
    from fedcore.setup.prepare import prepare_run

    config = load_config(None, ["run.name=online-ops", "run.rounds=2"])
    setup = prepare_run(config)
    assert run_name(config, setup, ["run.rounds=2"]) == "online-ops-run.rounds=2"
    assert run_name(config, setup, ["run.name=online-ops", "run.rounds=2"]) == "online-ops"
    assert run_name(config, setup, ["simulate.device=cpu"]) == "online-ops"


TIMED = [
    *("--set", "time.step_s=0.1", "--set", "time.compute='pareto'"),
    *("--set", "time.latency_s=0.02", "--set", "time.on_s=5", "--set", "time.off_s=1"),
    *("--set", "transport.mode=deadline", "--set", "transport.deadline_s=0.1"),
    *("--set", "algorithm.name=dpsgd", "--set", "topology.undirected=true"),
]
"""Virtual time with stragglers, availability and late messages (D-PSGD: plain OPS loses
the mass of every late share and diverges)."""


@pytest.mark.parametrize(
    ("engine", "optimizer", "timed"),
    [
        ("vectorized", "sgd", False),
        ("messages", "sgd", False),
        ("vectorized", "adam", False),
        ("messages", "lars", False),
        ("vectorized", "sgd", True),
        ("messages", "sgd", True),
    ],
)
def test_interrupted_run_resumes_bit_identical(
    engine: str,
    optimizer: str,
    timed: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped by SIGINT after its 2nd checkpoint and resumed, a run ends as the run that
    never stopped did: parameters, figures and every record (the optimizer's state too)."""
    args = [*SMALL, "--engine", engine, "-q", "--set", f"optimizer.name={optimizer}"]
    args += TIMED if timed else []
    assert cli(capsys, "simulate", *args, "--out", str(tmp_path / "whole"))[0] == 0
    _interrupt_after_checkpoints(monkeypatch, 2)
    stopped = tmp_path / "stopped"
    status, _, err = cli(capsys, "simulate", *args, "--out", str(stopped))
    assert status == 130
    assert f"fedcore simulate --resume {stopped}" in err and "Traceback" not in err
    summary = _summary(stopped)
    assert summary["status"] == "interrupted"
    assert 40 <= summary["rounds_completed"] < 120
    assert summary["final"]["avg_model_accuracy"] > 0  # the evaluation of round 40
    monkeypatch.undo()
    status, _, err = cli(capsys, "simulate", "--resume", str(stopped), "-q")
    assert status == 0, err
    whole, resumed = _summary(tmp_path / "whole"), _summary(stopped)
    assert resumed["status"] == "completed" and resumed["rounds_completed"] == 120
    assert resumed["params_sha256"] == whole["params_sha256"]
    assert resumed["final"] == whole["final"]
    assert resumed["traffic"] == whole["traffic"]
    assert resumed.get("time") == whole.get("time")
    assert ("time" in resumed) == timed and (resumed["traffic"]["messages_late"] > 0) == timed
    assert _records(stopped) == _records(tmp_path / "whole")
    # A completed run is not resumed again.
    assert_one_line_error(*cli(capsys, "simulate", "--resume", str(stopped)), "completed")


def test_a_run_without_checkpoints_says_how_to_make_it_resumable(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from fedcore.engines import vectorized

    real = vectorized.Flusher.add

    def add(self: vectorized.Flusher, figures: Any) -> None:
        real(self, figures)
        if figures.round == 50:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(vectorized.Flusher, "add", add)
    out = tmp_path / "run"
    args = ["--set", "run.rounds=80", "--set", "run.eval_every=20", "--out", str(out), "-q"]
    status, _, err = cli(capsys, "simulate", *args)
    assert status == 130 and "set run.checkpoint_every" in err
    assert _summary(out)["status"] == "interrupted"
    assert _summary(out)["rounds_completed"] == 51
    monkeypatch.undo()
    # --resume starts it again from round 0, in the same folder.
    status, _, err = cli(capsys, "simulate", "--resume", str(out), "-q")
    assert status == 0, err
    assert "starting again from round 0" in caplog.text
    assert _summary(out)["status"] == "completed"
    assert sum(r.get("kind") == "eval" for r in _records(out)) == 4


def test_a_failed_run_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedcore.engines import vectorized
    from fedcore.errors import AlgorithmError

    real = vectorized.VectorizedNetwork.run_round

    def run_round(self: vectorized.VectorizedNetwork) -> Any:
        if self.round == 30:
            raise AlgorithmError("node n3 diverged at round 30")
        return real(self)

    monkeypatch.setattr(vectorized.VectorizedNetwork, "run_round", run_round)
    out = tmp_path / "run"
    status, _, err = cli(capsys, "simulate", "--set", "run.rounds=60", "--out", str(out), "-q")
    assert status == 1 and "diverged" in err and "Traceback" not in err
    summary = _summary(out)
    assert summary["status"] == "failed" and summary["rounds_completed"] == 30
    assert "diverged" in summary["error"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--set", "run.rounds=3"], "drop --set"),
        (["--engine", "messages"], "drop --engine"),
        (["--force"], "drop --force"),
        (["--jobs", "2"], "drop --jobs"),
    ],
)
def test_resume_takes_no_other_run_settings(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_one_line_error(*cli(capsys, "simulate", "--resume", str(tmp_path), *argv), needle)


def test_jobs_without_seeds_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(*cli(capsys, "simulate", "--jobs", "2"), "give --seeds")


def test_ctrl_c_in_a_flush_counts_no_round_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped half-way through reading back a batch of rounds: the partial summary counts
    each round once (the rest of the batch is left out, not replayed)."""
    from fedcore.simulation.observer import RunObserver

    real = RunObserver.end_round
    stops = []

    def end_round(self: RunObserver, t: int, *args: Any, **kwargs: Any) -> float:
        if t == 30 and not stops:
            stops.append(t)
            raise KeyboardInterrupt
        return real(self, t, *args, **kwargs)

    monkeypatch.setattr(RunObserver, "end_round", end_round)
    out = tmp_path / "run"
    args = ["--set", "run.rounds=60", "--set", "run.eval_every=20", "--out", str(out), "-q"]
    assert cli(capsys, "simulate", *args)[0] == 130
    rounds = [r["round"] for r in _records(out) if r.get("kind") == "round"]
    assert rounds == sorted(set(rounds)) and rounds[-1] < 60
    summary = _summary(out)
    assert summary["rounds_completed"] == rounds[-1] + 1
    per_round = summary["traffic"]["messages_sent"] / summary["rounds_completed"]
    whole = tmp_path / "whole"
    monkeypatch.undo()
    assert cli(capsys, "simulate", *args[:4], "--out", str(whole), "-q")[0] == 0
    assert per_round == _summary(whole)["traffic"]["messages_sent"] / 60


def test_ctrl_c_while_writing_the_results_leaves_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    results = importlib.import_module("fedcore.simulation.results")

    def regret(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "add_regret", regret)
    out = tmp_path / "run"
    status, _, err = cli(capsys, "simulate", "--set", "run.rounds=20", "--out", str(out), "-q")
    assert status == 130 and "while writing the results" in err
    assert _summary(out)["status"] == "interrupted"
    monkeypatch.undo()
    assert cli(capsys, "simulate", "--resume", str(out), "-q")[0] == 0
    assert _summary(out)["status"] == "completed"


def test_resume_needs_a_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(
        *cli(capsys, "simulate", "--resume", str(tmp_path / "nothing")), "no config.toml"
    )


def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def _stop_when(args: list[str], ready: Callable[[], bool], stop: Callable[[int], None]) -> str:
    """Run ``fedcore *args`` as a process; once ``ready()``, call ``stop(pid)``; return
    ``"exit <status>"`` and a newline, then its stderr."""
    argv = [sys.executable, "-m", "fedcore", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_for(ready, 120)
        stop(proc.pid)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return f"exit {proc.returncode}\n{err}"


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


def test_ctrl_c_to_the_process(tmp_path: Path) -> None:
    """A real SIGINT to a ``fedcore simulate`` process, after its first checkpoint."""
    out = tmp_path / "run"
    args = ["simulate", "-q", "--out", str(out)]
    args += ["--set", "run.rounds=100000", "--set", "run.checkpoint_every=10"]
    err = _stop_when(
        args,
        lambda: any((out / "checkpoints").glob("round-*.ckpt")),
        lambda pid: os.kill(pid, signal.SIGINT),
    )
    assert err.startswith("exit 130\n"), err
    assert "Traceback" not in err and "--resume" in err
    summary = _summary(out)
    assert summary["status"] == "interrupted" and summary["rounds_completed"] >= 10


@pytest.mark.grpc
def test_a_stopped_launch_and_its_summarize_cover_the_rounds_that_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C to ``fedcore launch``: the summary says ``interrupted`` and how far the peers
    got, and ``fedcore summarize`` of the folder reports those rounds, not the config's."""
    out = tmp_path / "run"
    args = ["launch", "-q", "--out", str(out), *RING3, "--set", "run.eval_every=20"]
    # Every peer has recorded 45 rounds (one record a round each) before the stop: one peer
    # alone may be a round ahead of a neighbour that sent its messages but had not yet
    # recorded the round, and the summary counts the rounds every peer completed.
    err = _stop_when(
        args,
        lambda: min(_lines(out / "nodes" / p / "metrics.jsonl") for p in ("n0", "n1", "n2")) >= 45,
        lambda pid: os.kill(pid, signal.SIGINT),
    )
    assert err.startswith("exit 130\n"), err
    assert "Traceback" not in err and "the results so far are in" in err
    stopped = _summary(out)
    assert stopped["status"] == "interrupted"
    assert 45 <= stopped["rounds_completed"] < 100000
    # Peers stopped together are not taken for crashed ones.
    assert stopped["faults"]["down_rounds"] == {} and stopped["peer_exits"] == {}
    evals = [r for r in _records(out) if r.get("kind") == "eval"]
    assert evals and evals[-1]["round"] < stopped["rounds_completed"]
    status, printed, _ = cli(capsys, "summarize", str(out))
    assert status == 0
    again = _summary(out)
    assert again["status"] == "interrupted"
    assert again["rounds_completed"] == stopped["rounds_completed"]
    assert f"interrupted after round {again['rounds_completed']}" in printed


@pytest.mark.grpc
def test_a_launch_whose_peer_dies_says_failed(tmp_path: Path) -> None:
    """Strict mode: a peer killed (SIGKILL) stops the run; the summary says ``failed``."""
    out = tmp_path / "run"
    peer = out / "nodes" / "n1"
    err = _stop_when(
        ["launch", "-q", "--out", str(out), *RING3],
        lambda: (
            min(_lines(out / "nodes" / p / "metrics.jsonl") for p in ("n0", "n1", "n2")) >= 20
        ),  # every peer, as above
        lambda _: os.kill(int((peer / "node.pid").read_text(encoding="utf-8")), signal.SIGKILL),
    )
    assert err.startswith("exit 1\n"), err
    assert "peer 'n1' exited" in err and "Traceback" not in err
    summary = _summary(out)
    assert summary["status"] == "failed" and "n1" in summary["error"]
    assert 20 <= summary["rounds_completed"] < 100000


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead; it waits for its parent (here: init) to reap it.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.grpc
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's"
)
def test_peers_end_when_their_launcher_is_killed(tmp_path: Path) -> None:
    """``kill -9`` of ``fedcore launch`` (no chance to stop its children): its peers end
    too, within seconds, instead of running on with no one to collect them."""
    out = tmp_path / "run"
    pids: list[int] = []

    def ready() -> bool:
        if min(_lines(out / "nodes" / p / "metrics.jsonl") for p in ("n0", "n1", "n2")) < 5:
            return False
        pids[:] = [int((out / "nodes" / p / "node.pid").read_text()) for p in ("n0", "n1", "n2")]
        return True

    err = _stop_when(
        ["launch", "-q", "--out", str(out), *RING3, "--peers-per-process", "2"],
        ready,
        lambda pid: os.kill(pid, signal.SIGKILL),
    )
    try:
        assert err.startswith("exit -9"), err
        assert len(set(pids)) == 2  # two processes: n0 and n1 share one
        _wait_for(lambda: not any(_alive(p) for p in pids), 30)
    finally:  # where they did not end: not left running after the test
        for pid in set(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


LAUNCH = ["--set", "topology.kind=ring", "--set", "topology.nodes=3"]
LAUNCH += ["--set", "algorithm.name=dpsgd", "--set", "run.rounds=400"]
LAUNCH += ["--set", "run.eval_every=100", "--set", "run.checkpoint_every=20"]
# 10 ms of delay a message (the fault plan's, the same in both runs: it changes no number)
# keeps the run going for seconds, so that the stop comes in the middle of it.
LAUNCH += ["--set", "faults.delay_s=0.01", "--peers-per-process", "3"]


@pytest.mark.grpc
def test_a_stopped_launch_resumes_to_the_uninterrupted_launchs_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27 item 4: Ctrl-C to ``fedcore launch`` names ``fedcore launch --resume``,
    which restarts every peer from its checkpoint and ends with the parameters, figures and
    records of the launch that was never stopped."""
    out = tmp_path / "stopped"
    err = _stop_when(
        ["launch", "-q", "--out", str(out), *LAUNCH],
        lambda: min(_lines(out / "nodes" / p / "metrics.jsonl") for p in ("n0", "n1", "n2")) >= 45,
        lambda pid: os.kill(pid, signal.SIGINT),
    )
    assert err.startswith("exit 130\n"), err
    assert f"continue with: fedcore launch --resume {out}" in err and "Traceback" not in err
    stopped = _summary(out)
    assert stopped["status"] == "interrupted" and 45 <= stopped["rounds_completed"] < 400
    line = assert_one_line_error(*cli(capsys, "simulate", "--resume", str(out)), "launch` run")
    assert "resume it with `fedcore launch --resume`" in line
    status, _, err = cli(capsys, "launch", "--resume", str(out), "-q")
    assert status == 0, err
    assert cli(capsys, "launch", "-q", "--out", str(tmp_path / "whole"), *LAUNCH)[0] == 0
    whole, resumed = _summary(tmp_path / "whole"), _summary(out)
    assert resumed["status"] == "completed" and resumed["rounds_completed"] == 400
    assert resumed["params_sha256"] == whole["params_sha256"]
    assert resumed["final"] == whole["final"]
    assert resumed["traffic"] == whole["traffic"]
    assert resumed["name"] == whole["name"]
    evals = [r for r in _records(out) if r.get("kind") == "eval"]
    assert evals == [r for r in _records(tmp_path / "whole") if r.get("kind") == "eval"]
    # A completed launch is not resumed again.
    assert_one_line_error(*cli(capsys, "launch", "--resume", str(out)), "completed")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--set", "run.rounds=5"], "drop --set"),
        (["examples/ops.toml"], "drop CONFIG"),
        (["--out", "x"], "drop --out"),
        (["--name", "x"], "drop --name"),
        (["--force"], "drop --force"),
    ],
)
def test_launch_resume_takes_no_other_run_settings(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_one_line_error(*cli(capsys, "launch", "--resume", str(tmp_path), *argv), needle)


def test_launch_resume_needs_a_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(
        *cli(capsys, "launch", "--resume", str(tmp_path / "nothing")), "no config.toml"
    )
    out = tmp_path / "sim"
    argv = ["simulate", "-q", "--out", str(out), "--set", "run.rounds=3"]
    assert cli(capsys, *argv, "--set", "topology.nodes=3")[0] == 0
    (out / "summary.json").unlink()  # as if stopped before its summary: still not a launch
    line = assert_one_line_error(*cli(capsys, "launch", "--resume", str(out)), "not a")
    assert "`fedcore launch` run" in line
    assert cli(capsys, *argv, "--set", "topology.nodes=3", "--force")[0] == 0
    line = assert_one_line_error(*cli(capsys, "launch", "--resume", str(out)), "not a")
    assert "fedcore simulate --resume" in line


def test_debug_lines_are_fedcores_not_every_librarys(tmp_path: Path) -> None:
    """``-vv`` shows fedcore's debug lines (evaluations, checkpoints), not matplotlib's."""
    argv = [sys.executable, "-m", "fedcore", "-vv", "simulate", "-q", "--out", str(tmp_path)]
    argv += ["--set", "run.rounds=4", "--set", "run.eval_every=2"]
    argv += ["--set", "run.checkpoint_every=2"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "DEBUG fedcore.simulation" in done.stderr and "evaluated" in done.stderr
    assert "matplotlib" not in done.stderr and "font" not in done.stderr.lower()
