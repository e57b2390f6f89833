"""Several peers in one process (``launch --peers-per-process``, ``node --id a,b``): the
same run as one process a peer (marked grpc)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fedcore import cli
from fedcore.config import load_config
from fedcore.deploy.launch import free_ports, launch
from fedcore.deploy.peer import run_peer
from fedcore.engines.messages import build_network
from fedcore.metrics import params_sha256
from fedcore.progress import StatusLine, read_stage
from fedcore.simulation.simulate import simulate

pytestmark = pytest.mark.grpc

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "FEDCORE_MALLOC_TUNING": "0"}


def _records(path: Path) -> list[dict[str, Any]]:
    """A run's merged records without their timings, in one order."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for r in records:
        r.pop("wall_s", None)
    return sorted(records, key=lambda r: (r["round"], r["kind"], r.get("node", "")))


def test_launch_with_peers_per_process_matches_simulate(tmp_path: Path) -> None:
    """5 peers, 4 a process (uneven groups, the last a peer alone): bit for bit simulate's
    run, each peer its own folder, one log a process, and start-up lines before the rounds."""
    config = load_config(
        None,
        [
            "algorithm.name=ops",
            "topology.kind=social",
            "topology.nodes=5",
            "run.rounds=6",
            "run.eval_every=3",
            "simulate.engine=messages",
        ],
    )
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    said = io.StringIO()
    out = tmp_path / "launch"
    grpc_run = launch(config, out_dir=out, progress_stream=said, peers_per_process=4)
    assert grpc_run["params_sha256"] == sim["params_sha256"]
    assert grpc_run["peers_per_process"] == 4 and "peers_per_process" not in sim
    assert grpc_run["final"] == sim["final"]
    assert _records(out / "metrics.jsonl") == _records(tmp_path / "sim" / "metrics.jsonl")
    procs = json.loads((out / "procs.json").read_text(encoding="utf-8"))
    assert [p["peers"] for p in procs] == [["n0", "n1", "n2", "n3"], ["n4"]]
    log = (out / "procs" / "1.log").read_text(encoding="utf-8")
    assert "n4: serving on 127.0.0.1:" in log and "n4: done after 6 rounds" in log
    for n in sim["params_sha256"]:
        assert json.loads((out / "nodes" / n / "node.json").read_text())["rounds"] == 6
        assert read_stage(out / "nodes" / n) == "done"
    pids = {(out / "nodes" / n / "node.pid").read_text() for n in ("n0", "n1", "n2", "n3")}
    assert len(pids) == 1  # one process
    text = said.getvalue()
    assert "launch: 0/5 peers up; starting 5 (n0, n1, n2, n3, n4)" in text
    assert "launch: 5/5 peers up" in text
    assert text.index("launch: 5/5 peers up") < text.index("round 6/6")


def test_node_hosts_two_peers_that_talk_to_a_third(tmp_path: Path) -> None:
    """``fedcore node --id n0,n1 --out DIR``: two peers in one process, folders DIR/n0 and
    DIR/n1, with n2 served elsewhere (here: this test's own event loop)."""
    overrides = ["topology.kind=ring", "topology.nodes=3", "run.rounds=5", "run.eval_every=5"]
    config = load_config(REPO / "examples" / "dpsgd.toml", overrides)
    roster = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    roster_path = tmp_path / "roster.json"
    roster_path.write_text(json.dumps(roster), encoding="utf-8")
    argv = [sys.executable, "-m", "fedcore", "node", "--id", "n0,n1", "--roster", str(roster_path)]
    argv += ["--config", str(REPO / "examples" / "dpsgd.toml"), "--out", str(tmp_path / "peers")]
    for item in overrides:
        argv += ["--set", item]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO)
    try:
        third = asyncio.run(run_peer(config, "n2", roster, out=tmp_path / "n2"))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "n0: connected" in err and "n1: done after 5 rounds" in err
    assert "n0,n1 (2 peers) [" in err and "round 5/5" in err  # one progress line for both
    expected = build_network(config)
    expected.run(5)
    digests = {n: params_sha256(node.model()) for n, node in expected.nodes.items()}
    assert third["params_sha256"] == digests["n2"]
    for n in ("n0", "n1"):
        info = json.loads((tmp_path / "peers" / n / "node.json").read_text(encoding="utf-8"))
        assert info["params_sha256"] == digests[n]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["node", "--id", "n0,n1,n0"], "--id names 'n0' more than once"),
        (["node", "--id", "n0,"], "has an empty id"),
        (["node", "--id", "n0,n7"], "node 'n7' is not in the graph"),
        (["node", "--id", "n0,n1", "--listen", "0.0.0.0:7000"], "one HOST:PORT per id"),
        (["launch", "--peers-per-process", "0"], "--peers-per-process must be at least 1"),
    ],
    ids=["duplicate", "empty", "unknown", "listen", "k-below-1"],
)
def test_bad_peer_groups_are_refused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    monkeypatch.setenv("FEDCORE_MALLOC_TUNING", "0")
    monkeypatch.chdir(tmp_path)
    roster = {f"n{i}": f"127.0.0.1:{7000 + i}" for i in range(3)}
    (tmp_path / "roster.json").write_text(json.dumps(roster), encoding="utf-8")
    common = ["--set", "topology.kind=ring", "--set", "topology.nodes=3", "--out", "out"]
    if argv[0] == "node":
        common += ["--config", str(REPO / "examples" / "dpsgd.toml"), "--roster", "roster.json"]
    handler = signal.getsignal(signal.SIGTERM)  # launch sets its own
    try:
        status = cli.main([*argv, *common])
    finally:
        signal.signal(signal.SIGTERM, handler)
    err = capsys.readouterr().err
    assert status == 2, err
    assert says in err and "Traceback" not in err


def test_a_failing_peer_stops_the_others_of_its_process(tmp_path: Path) -> None:
    """n1 cannot reach its out-neighbour n2 (strict mode): the process names n1, stops n0
    and exits non-zero."""
    roster = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(4))}
    roster_path = tmp_path / "roster.json"
    roster_path.write_text(json.dumps(roster), encoding="utf-8")
    argv = [sys.executable, "-m", "fedcore", "node", "--id", "n0,n1", "-q"]
    argv += ["--roster", str(roster_path), "--out", str(tmp_path / "{id}-out")]
    argv += ["--config", str(REPO / "examples" / "ops.toml")]
    for item in (
        "topology.kind=directed-ring",
        "topology.nodes=4",
        "transport.startup_timeout_s=1",
    ):
        argv += ["--set", item]
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, cwd=REPO, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "fedcore: error: peer 'n1': " in done.stderr and "n2 at 127.0.0.1" in done.stderr
    assert "Traceback" not in done.stderr
    assert read_stage(tmp_path / "n1-out") == "failed"
    assert read_stage(tmp_path / "n0-out") == "stopped"


def test_a_dead_process_takes_all_its_peers_out_of_a_deadline_run(tmp_path: Path) -> None:
    """Deadline mode, 2 peers a process: kill -9 of one process; the summary names both of
    its peers in ``peer_exits`` and ``down_rounds``; the other two finish."""
    config = load_config(
        None,
        [
            "algorithm.name=dpsgd",
            "topology.kind=ring",
            "topology.nodes=4",
            "run.rounds=20",
            "run.eval_every=10",
            "transport.mode=deadline",
            "transport.deadline_s=0.1",
        ],
    )
    out = tmp_path / "run"
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = launch(
                config, out_dir=out, show_progress=False, peers_per_process=2
            )
        except Exception as exc:  # surfaced by the assertions below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    metrics = out / "nodes" / "n3" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not metrics.exists() or metrics.read_text(encoding="utf-8").count("\n") < 4
    ):
        time.sleep(0.05)
    pid = int((out / "nodes" / "n2" / "node.pid").read_text(encoding="utf-8"))
    assert pid == int((out / "nodes" / "n3" / "node.pid").read_text(encoding="utf-8"))
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    summary = result["summary"]
    assert set(summary["peer_exits"]) == {"n2", "n3"}
    for n in ("n2", "n3"):
        assert summary["peer_exits"][n]["status"] == -signal.SIGKILL
        last = summary["peer_exits"][n]["last_round"]
        assert summary["faults"]["down_rounds"][n] == [[last + 1, 19]]
    for n in ("n0", "n1"):
        info = json.loads((out / "nodes" / n / "node.json").read_text(encoding="utf-8"))
        assert info["rounds"] == 20


def test_the_start_up_line_redraws_on_a_terminal_and_is_sparse_elsewhere() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    line = StatusLine(tty)
    line.show("launch: 0/2 peers up")
    line.show("launch: 1/2 peers up")
    line.finish("launch: 2/2 peers up")
    drawn = tty.getvalue()
    assert drawn.count("\r") == 3 and drawn.endswith("\n") and drawn.count("\n") == 1
    log = io.StringIO()
    line = StatusLine(log, every_s=60)
    for k in range(5):
        line.show(f"launch: {k}/5 peers up")
    line.finish("launch: 5/5 peers up")
    assert log.getvalue().splitlines()[0].startswith("launch: 0/5 peers up  ")
    assert log.getvalue().splitlines()[1].startswith("launch: 5/5 peers up  ")
    assert log.getvalue().count("\n") == 2
