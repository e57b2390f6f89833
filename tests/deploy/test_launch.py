"""Peers as real processes over gRPC: the same numbers as in-process (marked grpc)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedcore.config import load_config
from fedcore.deploy.children import _Children
from fedcore.deploy.launch import free_ports, launch
from fedcore.simulation.simulate import simulate

pytestmark = pytest.mark.grpc

REPO = Path(__file__).resolve().parents[2]

ROUNDS = 12
"""Rounds of each launch compared with simulate: enough for every case's schedule (the last 4
of apmsqueeze's are past its 8 precondition rounds; evaluations at rounds 6 and 12)."""


@pytest.mark.parametrize(
    "overrides",
    [
        # The launcher draws curves.png from the merged records, the same for every case:
        # drawn and checked in the first (tests/conftest.py leaves it out of the others).
        pytest.param(
            ["algorithm.name=ops", "topology.kind=social", "topology.nodes=5"],
            marks=pytest.mark.curves,
        ),
        ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=4"],
        [
            "algorithm.name=dog",
            "topology.kind=ring",
            "topology.nodes=4",
            "data.stream=synthetic",
            "run.regret=true",
        ],
        [
            "algorithm.name=ops",
            "topology.kind=social",
            "topology.nodes=4",
            "model.name=mlp",
            "optimizer.name=lamb",
            "optimizer.weight_decay=0.01",
            "algorithm.lr=0.01",
        ],
        [
            "algorithm.name=fedavg",
            "topology.kind=star",
            "topology.nodes=4",
            "algorithm.fraction=0.5",
            "run.local_steps=2",
            "algorithm.server_optimizer=adam",
            "algorithm.server_lr=0.1",
        ],
        [
            "algorithm.name=doublesqueeze",
            "topology.kind=star",
            "topology.nodes=3",
            "compression.codec=qsgd",
            "compression.bits=4",
            "optimizer.name=momentum",
        ],
        [
            "algorithm.name=apmsqueeze",
            "topology.kind=star",
            "topology.nodes=3",
            "algorithm.precondition_rounds=8",
            "algorithm.lr=0.01",
            "compression.codec=topk",
            "compression.ratio=0.1",
        ],
        [
            "algorithm.name=ops",
            "algorithm.robust=true",
            "topology.kind=one-peer-exponential",
            "topology.nodes=6",
            "compression.codec=bf16",
        ],
        ["algorithm.name=central", "topology.kind=complete", "topology.nodes=4"],
        [
            "algorithm.name=choco",
            "topology.kind=ring",
            "topology.nodes=5",
            "compression.codec=sign",
        ],
        [
            "algorithm.name=rps",
            "topology.kind=complete",
            "topology.nodes=7",
            "compression.codec=fp16",
        ],
        ["algorithm.name=dsgt", "topology.kind=ring", "topology.nodes=4"],
        [
            "algorithm.name=push-pull",
            "topology.kind=social",
            "topology.nodes=5",
            "compression.codec=fp16",
        ],
        [
            "algorithm.name=exact-diffusion",
            "topology.kind=ring",
            "topology.nodes=5",
            "compression.codec=sign",
        ],
        [
            "algorithm.name=beer",
            "topology.kind=ring",
            "topology.nodes=5",
            "compression.codec=topk",
            "compression.ratio=0.3",
        ],
        ["algorithm.name=push-diging", "topology.kind=social", "topology.nodes=5"],
        [
            "algorithm.name=push-pull",
            "algorithm.robust=true",
            "topology.kind=social",
            "topology.nodes=5",
            "compression.codec=bf16",
        ],
    ],
    ids=[
        "ops-directed",
        "dpsgd-undirected",
        "dog-online-regret",
        "ops-lamb",
        "fedavg-sampled",
        "doublesqueeze-qsgd",
        "apmsqueeze-topk",
        "ops-robust-schedule",
        "central",
        "choco-sign",
        "rps-fp16",
        "dsgt",
        "push-pull-fp16",
        "exact-diffusion-sign",
        "beer-topk",
        "push-diging",
        "push-pull-robust-bf16",
    ],
)
def test_launch_matches_simulate_bit_for_bit(
    tmp_path: Path, overrides: list[str], request: pytest.FixtureRequest
) -> None:
    """Transport transparency: identical parameters on every node, strict mode, no faults.

    The first two cases run a process per peer (and two per process); the others host every
    peer in one process (``peers_per_process``, the same run, tested bit for bit in
    tests/deploy/test_peers_per_process.py), which spares the CI a torch import per peer."""
    config = load_config(
        None, [*overrides, f"run.rounds={ROUNDS}", "run.eval_every=6", "simulate.engine=messages"]
    )
    per_process = {"ops-directed": 1, "dpsgd-undirected": 2}.get(request.node.callspec.id, 64)
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    grpc_run = launch(
        config, out_dir=tmp_path / "launch", show_progress=False, peers_per_process=per_process
    )
    assert sim["transport"] == "inproc" and grpc_run["transport"] == "grpc"
    assert grpc_run["params_sha256"] == sim["params_sha256"]
    assert grpc_run["final"]["avg_model_accuracy"] == sim["final"]["avg_model_accuracy"]
    assert grpc_run["traffic"]["messages_sent"] == sim["traffic"]["messages_sent"]
    assert grpc_run["regret"] == sim["regret"]
    merged = (tmp_path / "launch" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    kinds = [json.loads(line)["kind"] for line in merged]
    assert kinds.count("node") == ROUNDS * grpc_run["nodes"] and kinds.count("eval") == 2
    if request.node.get_closest_marker("curves"):
        assert (tmp_path / "launch" / "curves.png").stat().st_size > 0
    # Each peer tells its log where it serves, its rounds and where its results are.
    # (With several peers a process, the log of the process: procs/0.log holds n0's.)
    logs = tmp_path / "launch" / ("nodes/n0/node.log" if per_process == 1 else "procs/0.log")
    log = logs.read_text(encoding="utf-8")
    assert "n0: serving on 127.0.0.1:" in log and "n0: connected; running from round 0" in log
    assert f"round {ROUNDS}/{ROUNDS}" in log
    assert f"n0: done after {ROUNDS} rounds; results: " in log


def _node_cmd(tmp_path: Path, roster: dict[str, str], *extra: str) -> list[str]:
    roster_path = tmp_path / "roster.json"
    roster_path.write_text(json.dumps(roster), encoding="utf-8")
    return [
        sys.executable, "-m", "fedcore", "node", "--id", "n0", "--roster", str(roster_path),
        "--config", str(REPO / "examples" / "dpsgd.toml"), "--out", str(tmp_path / "n0"),
        "--set", "topology.kind=ring", "--set", "topology.nodes=3", *extra,
    ]  # fmt: skip


def test_node_names_unreachable_peers(tmp_path: Path) -> None:
    ports = free_ports(3)
    roster = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    cmd = _node_cmd(tmp_path, roster, "--set", "transport.startup_timeout_s=1")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "could not reach n1 at 127.0.0.1" in done.stderr
    assert "n2 at 127.0.0.1" in done.stderr


def test_node_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    ports = free_ports(3)
    roster = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    cmd = _node_cmd(tmp_path, roster, "--set", "transport.startup_timeout_s=120")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (tmp_path / "n0" / "metrics.jsonl").exists():
            time.sleep(0.2)
        assert (tmp_path / "n0" / "metrics.jsonl").exists(), "peer never started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert b"Traceback" not in err


def test_supervisor_reports_a_dead_child(tmp_path: Path) -> None:
    children = _Children()
    dies = "import sys; print('fedcore: error: peer \\'n1\\': it broke.'); sys.exit(3)"
    peers = {"n0": tmp_path / "n0", "n1": tmp_path / "n1"}
    children.start(0, peers, [sys.executable, "-c", dies], tmp_path / "p0.log", {})
    sleeps = [sys.executable, "-c", "import time; time.sleep(60)"]
    children.start(1, {"n2": tmp_path / "n2"}, sleeps, tmp_path / "p1.log", {})
    try:
        deadline = time.monotonic() + 30
        while not children.exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children.exited() == {0: 3}
        assert children.members[0] == ["n0", "n1"]
        assert children.error_line(0) == "peer 'n1': it broke."
        assert children.error_line(1) is None
    finally:
        children.stop(grace_s=2)
    assert children.procs[1].returncode is not None


def test_peers_finish_their_run_under_hostile_pushes(tmp_path: Path) -> None:
    """Garbage from a stranger during a real gRPC run: refused with codes, run unaffected."""
    import asyncio

    import grpc
    import torch

    from fedcore.compression import RawCodec
    from fedcore.engines.messages import build_network
    from fedcore.messages import Message
    from fedcore.metrics import params_sha256
    from fedcore.proto import peer_pb2_grpc as pb_grpc
    from fedcore.setup.prepare import prepare_run
    from fedcore.transport.grpc import GrpcTransport
    from fedcore.transport.grpc.serde import message_to_chunks

    config = load_config(
        None, ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=3", "run.rounds=15"]
    )
    expected = build_network(config)
    expected.run(15)
    setup = prepare_run(config)
    d = int(setup.start.numel())

    def push(run: str, sender: str, values: torch.Tensor, receiver: str = "n0") -> Message:
        # Round 0 is never ahead of n0's round window, whenever the attack lands (a round
        # further ahead would be refused with FAILED_PRECONDITION before any other check).
        tensor = RawCodec().encode(values)
        return Message(
            run=run, round=0, phase=0, sender=sender, receiver=receiver, tensors={"x": tensor}
        )

    hostile = {
        "untrusted": (push(setup.run_id, "mallory", torch.zeros(d)), "PERMISSION_DENIED"),
        "other-run": (push("other", "n1", torch.zeros(d)), "FAILED_PRECONDITION"),
        "nan": (push(setup.run_id, "n1", torch.full((d,), float("nan"))), "INVALID_ARGUMENT"),
        "shape": (push(setup.run_id, "n1", torch.zeros(d + 1)), "INVALID_ARGUMENT"),
    }

    async def main() -> dict[str, str]:
        transports = {}
        for n in setup.graph.nodes:
            g = setup.graph.at(0)
            transports[n] = GrpcTransport(
                n, listen="127.0.0.1:0", roster={}, run_id=setup.run_id,
                trusted=set(g.in_neighbours(n)),
            )  # fmt: skip
        nodes = {n: setup.make_node(n, t) for n, t in transports.items()}
        for n, t in transports.items():
            t.validator = nodes[n].validate
            await t.start()
        roster = {n: f"127.0.0.1:{t.port}" for n, t in transports.items()}
        for n, t in transports.items():
            t.roster = roster
            await t.connect(setup.graph.at(0).out_neighbours(n), timeout_s=10)

        async def attack() -> None:
            async with grpc.aio.insecure_channel(roster["n0"]) as channel:
                stub = pb_grpc.PeerStub(channel)
                for message, code in hostile.values():
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.Push(message_to_chunks(message), timeout=10)
                    assert err.value.code().name == code

        try:
            await asyncio.gather(attack(), *(node.run(15) for node in nodes.values()))
        finally:
            for t in transports.values():
                await t.close(0.1)
        assert transports["n0"].stats.messages_rejected == len(hostile)
        return {n: params_sha256(node.model()) for n, node in nodes.items()}

    got = asyncio.run(main())
    assert got == {n: params_sha256(node.model()) for n, node in expected.nodes.items()}


def test_fault_plan_gives_the_same_run_over_grpc(tmp_path: Path) -> None:
    """Drops, a partition and a crash-and-return: launch and simulate agree bit for bit.
    (The five peers in one process: the faults are the plan's, not the processes'.)"""
    config = load_config(
        None,
        [
            "algorithm.name=ops",
            "topology.kind=social",
            "topology.nodes=5",
            "run.rounds=20",
            "run.eval_every=10",
            "faults.drop=0.25",
            'faults.partitions=[{nodes=["n0"], start=3, end=6}]',
            'faults.crashes=[{node="n2", at=8, back=12}]',
            "simulate.engine=messages",  # the engine gRPC peers equal bit for bit
        ],
    )
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    grpc_run = launch(config, out_dir=tmp_path / "launch", show_progress=False, peers_per_process=5)
    assert grpc_run["params_sha256"] == sim["params_sha256"]
    assert grpc_run["faults"] == sim["faults"] and grpc_run["faults"]["lost_per_edge"]
    assert grpc_run["traffic"]["messages_dropped"] == sim["traffic"]["messages_dropped"] > 0
    assert grpc_run["faults"]["down_rounds"] == {"n2": [[8, 11]]}


def test_peers_survive_kill_9_of_a_neighbour(tmp_path: Path) -> None:
    """Deadline mode: a peer killed mid-run is noticed; the others finish; the summary says.

    The rounds after the kill wait ``deadline_s`` each: few of them."""
    import os
    import threading

    config = load_config(
        None,
        [
            "algorithm.name=dpsgd",
            "topology.kind=ring",
            "topology.nodes=4",
            "run.rounds=24",
            "run.eval_every=8",
            "transport.mode=deadline",
            "transport.deadline_s=0.3",
        ],
    )
    out = tmp_path / "run"
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["summary"] = launch(config, out_dir=out, show_progress=False)
        except Exception as exc:  # surfaced by the assertions below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    metrics = out / "nodes" / "n1" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not metrics.exists() or metrics.read_text(encoding="utf-8").count("\n") < 8
    ):
        time.sleep(0.05)
    pid = int((out / "nodes" / "n1" / "node.pid").read_text(encoding="utf-8"))
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=240)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    summary = result["summary"]
    assert isinstance(summary, dict)
    exit_info = summary["peer_exits"]["n1"]
    assert exit_info["status"] == -signal.SIGKILL
    last = exit_info["last_round"]
    assert 7 <= last < 23
    assert summary["faults"]["down_rounds"]["n1"] == [[last + 1, 23]]
    # Its ring neighbours noticed it missing to the end (it may have sent the messages of
    # the round it was killed in before its record of that round was written).
    for neighbour in ("n0", "n2"):
        assert summary["faults"]["missing_per_edge"][f"n1->{neighbour}"] >= 22 - last
    for node in ("n0", "n2", "n3"):
        info = json.loads((out / "nodes" / node / "node.json").read_text(encoding="utf-8"))
        assert info["rounds"] == 24
    assert summary["final"]["avg_model_accuracy"] > 0.5


@pytest.mark.curves
def test_resume_of_a_launch_whose_peers_had_finished_writes_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40: the launcher killed after its peers had run every round left no summary;
    ``fedcore launch --resume`` restarted peers with nothing to run, which waited for each
    other until ``could not reach n3``. Now it starts no peer and merges what they wrote,
    as ``fedcore summarize`` does: the summary of the launch that was never stopped.

    The launch itself runs with ``-q``: its warning (a batch larger than a peer's data)
    stays off the terminal and is in the summary (issue 40 too)."""
    from fedcore.cli import main
    from fedcore.deploy import launch as launch_module
    from tests.clitools import assert_one_line_error, cli
    from tests.plainlogging import plain_logging

    argv = ["--set", "algorithm.name=dpsgd", "--set", "topology.kind=ring"]
    argv += ["--set", "topology.nodes=3", "--set", "run.rounds=6", "--set", "run.eval_every=3"]
    argv += ["--set", "run.checkpoint_every=3", "--set", "data.batch_size=100000"]
    out = tmp_path / "run"
    with plain_logging():  # a warning would show on the terminal (captured here)
        status = main(["launch", "-q", *argv, "--peers-per-process", "3", "--out", str(out)])
        printed, err = capsys.readouterr()
    assert status == 0 and err == "" and printed == f"results: {out}\n", err
    whole = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert whole["engine"] == "peers" and whole["transport"] == "grpc"
    assert whole["warnings"] and "data.batch_size = 100000" in whole["warnings"][0]
    merged = (out / "metrics.jsonl").read_text(encoding="utf-8")
    for name in ("summary.json", "metrics.jsonl", "curves.png"):  # the launcher died first
        (out / name).unlink()

    def no_peers(*args: object, **kwargs: object) -> None:
        raise AssertionError("a peer was started again")

    monkeypatch.setattr(launch_module, "_supervise", no_peers)
    # A peer still running (the launcher died, its peers not yet): refused in one line.
    status_file = out / "nodes" / "n2" / "status.json"
    done = status_file.read_text(encoding="utf-8")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "fedcore"])
    try:
        status_file.write_text(json.dumps({"stage": "running", "pid": sleeper.pid}))
        line = assert_one_line_error(*cli(capsys, "launch", "--resume", str(out)), "still")
        assert f"peer n2 of {str(out)!r} is still running (process {sleeper.pid})" in line
    finally:
        sleeper.kill()
        sleeper.wait()
    status_file.write_text(done, encoding="utf-8")
    began = time.monotonic()
    status = main(["launch", "--resume", str(out)])
    _, err = capsys.readouterr()
    assert status == 0, err
    assert time.monotonic() - began < 30
    assert f"every peer of {out} had finished its rounds" in err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "completed" and summary["rounds_completed"] == 6
    assert summary["params_sha256"] == whole["params_sha256"]
    assert summary["final"] == whole["final"] and summary["name"] == whole["name"]
    assert summary["peers_per_process"] == 3 and summary["engine"] == "peers"
    assert (out / "metrics.jsonl").read_text(encoding="utf-8") == merged
    assert all((out / "nodes" / n / "node.json").is_file() for n in ("n0", "n1", "n2"))
    # Peers that checkpointed the last round but never wrote node.json (killed just then)
    # ran every round too: the same.
    (out / "nodes" / "n1" / "node.json").unlink()
    (out / "summary.json").unlink()
    assert main(["launch", "--resume", str(out), "-q"]) == 0
    again = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert again["params_sha256"] == whole["params_sha256"] and again["status"] == "completed"
    assert capsys.readouterr().err == ""
