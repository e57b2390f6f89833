"""Virtual time on both engines: the same times, late messages and parameters by
construction, today's parameters when time is trivial, and a lateness pattern built by
hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedcore.algorithms import ALGORITHMS
from fedcore.config import load_config
from fedcore.engines.batched import has_batched_form
from fedcore.errors import ConfigError
from fedcore.simulation.simulate import simulate

SYNCHRONOUS = sorted(name for name, factory in ALGORITHMS.items() if has_batched_form(factory()))

HOLDS = tuple(name for name in SYNCHRONOUS if ALGORITHMS[name]().holds_in_deadline_mode)
"""Push-sum rules, whose silent peers hold their pushes in deadline mode."""

GRAPHS = {
    "ops": ["topology.kind=exponential"],
    "clipped-push-sum": ["topology.kind=exponential"],
    "dol": ["topology.kind=social"],
    "push-pull": ["topology.kind=social"],
    "push-diging": ["topology.kind=social"],
    "exact-diffusion": ["topology.kind=erdos-renyi", "topology.p=0.5", "topology.undirected=true"],
    "local": ["topology.kind=ring"],
    "central": ["topology.kind=complete"],
    "rps": ["topology.kind=complete"],
    "choco": ["topology.kind=ring", "algorithm.gamma=0.3"],
    "beer": ["topology.kind=ring", "algorithm.gamma=0.3"],
    "fedavg": ["topology.kind=star", "algorithm.fraction=0.5", "run.local_steps=2"],
    "doublesqueeze": ["topology.kind=star"],
    "apmsqueeze": ["topology.kind=star", "algorithm.precondition_rounds=3", "algorithm.lr=0.01"],
}
"""A graph each algorithm runs on (the gossip family: a symmetric ring by default)."""

TIMED = [
    "time.step_s=0.2",
    "time.compute='lognormal'",
    "time.slow_fraction=0.3",
    "time.latency_s=0.01",
    "time.bandwidth_mb_s=0.5",
    "time.on_s=4.0",
    "time.off_s=1.0",
]


TRAFFIC = (
    "messages_sent",
    "bytes_sent",
    "fp32_bytes_sent",
    "messages_received",
    "bytes_received",
    "messages_missing",
    "messages_late",
    "messages_rejected",
    "messages_dropped",
    "missing",
    "dropped_in",
    "dropped_out",
    "unreachable",
)
"""Every traffic field of a node record: the same on both engines, late messages included."""


def _overrides(algorithm: str, *extra: str) -> list[str]:
    graph = GRAPHS.get(algorithm, ["topology.kind=ring", "topology.undirected=true"])
    return [
        f"algorithm.name={algorithm}",
        "topology.nodes=6",
        "run.rounds=6",
        "run.eval_every=3",
        "data.batch_size=16",
        *graph,
        *extra,
    ]


def _run(folder: Path, overrides: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = load_config(None, overrides)
    summary = simulate(config, out_dir=folder, show_progress=False)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


def _nodes(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["node"], r["round"]): r for r in records if r["kind"] == "node"}


@pytest.mark.parametrize("algorithm", SYNCHRONOUS)
def test_both_engines_keep_the_same_clock(algorithm: str, tmp_path: Path) -> None:
    extra = [*TIMED, "transport.mode=deadline", "transport.deadline_s=0.15"]
    if algorithm not in ("choco", "beer"):  # they need every message
        extra.append("faults.drop=0.1")
    if algorithm in HOLDS:  # a silent peer's hold: only the message engine models it
        with pytest.raises(ConfigError, match="holds a silent peer's pushes"):
            load_and_run = _overrides(algorithm, *extra, "simulate.engine=vectorized")
            _run(tmp_path / "refused", load_and_run)
        extra = [e for e in extra if not e.startswith("transport.")]  # strict mode
    runs = [
        _run(tmp_path / engine, _overrides(algorithm, *extra, f"simulate.engine={engine}"))
        for engine in ("vectorized", "messages")
    ]
    (vec, vec_records), (msg, msg_records) = runs
    assert vec["engine"] == "vectorized" and msg["engine"] == "messages"
    assert vec["params_sha256"] == msg["params_sha256"]
    assert vec["time"] == msg["time"]
    assert vec["traffic"] == msg["traffic"]
    a, b = _nodes(vec_records), _nodes(msg_records)
    assert a.keys() == b.keys()
    for key, record in a.items():
        for field in ("vtime", "compute_s", "down", *TRAFFIC):
            assert record.get(field) == b[key].get(field), (key, field)
    assert vec["time"]["virtual_seconds"] > 0
    assert 0 <= vec["time"]["min_utilisation"] <= vec["time"]["mean_utilisation"] <= 1
    assert vec["time"]["mean_utilisation"] > 0  # a server computes nothing: min 0


@pytest.mark.parametrize("algorithm", SYNCHRONOUS)
def test_trivial_time_gives_todays_parameters(algorithm: str, tmp_path: Path) -> None:
    """Zero latency, unlimited bandwidth, equal compute times, everyone available: the
    parameters of a run without [time], strict or deadline mode; each round takes exactly
    its local steps."""
    today, _ = _run(tmp_path / "plain", _overrides(algorithm))
    assert "time" not in today
    steps = 2 if algorithm == "fedavg" else 1
    for mode in ("strict", "deadline"):
        timed, records = _run(
            tmp_path / mode, _overrides(algorithm, "time.step_s=0.5", f"transport.mode={mode}")
        )
        assert timed["params_sha256"] == today["params_sha256"], mode
        assert timed["traffic"]["messages_late"] == 0
        rounds = [r for r in records if r["kind"] == "round"]
        assert [r["vtime"] for r in rounds] == [0.5 * steps * (t + 1) for t in range(6)]


def test_a_virtual_deadline_reproduces_a_lateness_pattern_built_by_hand(tmp_path: Path) -> None:
    """A ring n0-n1-n2-n3-n0; steps of 1 s, n2's of 2 s; no latency; deadline 0.5 s.

    Round t: n2 is ready at 2(t+1), too late for n1 and n3, whose deadline passes 0.5 s
    after they are ready; they wait it out, 1.5 s a round. n0 hears n1 and n3 just at its
    deadline from round 1 on (a message at the deadline is in time). So every round n2's
    two messages are late, and nothing else is."""
    extra = [
        "topology.kind=ring",
        "topology.nodes=4",
        "topology.undirected=true",
        "time.step_s=1.0",
        "time.speeds={n2=2.0}",
        "transport.mode=deadline",
        "transport.deadline_s=0.5",
        "run.rounds=4",
        "run.eval_every=4",
    ]
    clocks = {
        "n0": [1.0, 2.5, 4.0, 5.5],
        "n1": [1.5, 3.0, 4.5, 6.0],
        "n2": [2.0, 4.0, 6.0, 8.0],
        "n3": [1.5, 3.0, 4.5, 6.0],
    }
    late = {"n1": ["n2"], "n3": ["n2"]}
    for engine in ("vectorized", "messages"):
        overrides = ["algorithm.name=dpsgd", "data.batch_size=16", *extra]
        summary, records = _run(tmp_path / engine, [*overrides, f"simulate.engine={engine}"])
        assert summary["engine"] == engine
        nodes = _nodes(records)
        for node, times in clocks.items():
            assert [nodes[(node, t)]["vtime"] for t in range(4)] == times, (engine, node)
            for t in range(4):
                record = nodes[(node, t)]
                assert record["missing"] == late.get(node, []), (engine, node, t)
                assert record["messages_late"] == len(late.get(node, []))
                assert record["dropped_in"] == []
        assert summary["traffic"]["messages_late"] == 8
        assert summary["traffic"]["messages_missing"] == 8
        # Late messages were sent: every message of the ring counts on the wire.
        assert summary["traffic"]["messages_sent"] == 4 * 2 * 4
        assert summary["time"]["virtual_seconds"] == 8.0
        assert summary["time"]["utilisation"]["n2"] == 1.0
        assert summary["time"]["utilisation"]["n1"] == pytest.approx(4 / 8)


def test_late_messages_count_alike_in_every_node_record_on_both_engines(tmp_path: Path) -> None:
    """Late messages (a slow peer, a tight deadline) and lost ones: every traffic field of
    every node record is the same on both engines, and a late message counts as sent and
    late, never as received (as a real peer's mailbox counts one after its deadline)."""
    overrides = [
        "algorithm.name=dpsgd",
        "data.batch_size=16",
        "topology.kind=ring",
        "topology.nodes=5",
        "topology.undirected=true",
        "time.step_s=1.0",
        "time.speeds={n2=2.0}",
        "time.latency_s=0.1",
        "time.bandwidth_mb_s=0.5",
        "transport.mode=deadline",
        "transport.deadline_s=0.5",
        "faults.drop=0.1",
        "run.rounds=5",
        "run.eval_every=5",
    ]
    runs = {
        engine: _run(tmp_path / engine, [*overrides, f"simulate.engine={engine}"])
        for engine in ("vectorized", "messages")
    }
    (vec, vec_records), (msg, msg_records) = runs["vectorized"], runs["messages"]
    assert vec["engine"] == "vectorized" and msg["engine"] == "messages"
    assert vec["traffic"] == msg["traffic"]
    a, b = _nodes(vec_records), _nodes(msg_records)
    assert a.keys() == b.keys() and len(a) == 5 * 5
    for key, record in a.items():
        for field in TRAFFIC:
            assert record[field] == b[key][field], (key, field, record[field], b[key][field])
    late = sum(r["messages_late"] for r in a.values())
    dropped = sum(r["messages_dropped"] for r in a.values())
    assert late > 0 and dropped > 0  # both kinds happened: the comparison is not vacuous
    assert late == vec["traffic"]["messages_late"]
    # Every message sent was received or late (the fault plan's losses were never sent).
    sent = sum(r["messages_sent"] for r in a.values())
    received = sum(r["messages_received"] for r in a.values())
    assert sent == vec["traffic"]["messages_sent"] == received + late
    size = {r["bytes_sent"] // r["messages_sent"] for r in a.values() if r["messages_sent"]}
    assert len(size) == 1  # one message size: bytes follow the counts
    assert sum(r["bytes_received"] for r in a.values()) == received * size.pop()


def test_time_to_target_and_the_results_of_a_timed_run(tmp_path: Path) -> None:
    overrides = _overrides(
        "dpsgd", "time.step_s=0.25", "run.target_accuracy=0.2", "run.rounds=4", "run.eval_every=2"
    )
    summary, records = _run(tmp_path / "run", overrides)
    hit = summary["time_to_target"]
    assert hit == {"round": 1, "vtime": 0.5, "accuracy": hit["accuracy"]}
    assert hit["accuracy"] >= 0.2
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["vtime"] for e in evals] == [0.5, 1.0]
    assert summary["target_accuracy"] == 0.2
    missed, _ = _run(tmp_path / "missed", [*overrides[:-2], "run.target_accuracy=1.0"])
    assert missed["time_to_target"] is None


def test_deadline_mode_with_silent_losses_runs_on_the_vectorized_engine(tmp_path: Path) -> None:
    overrides = _overrides(
        "dpsgd",
        "transport.mode=deadline",
        "transport.deadline_s=2.0",
        "faults.drop=0.3",
        "faults.announce=false",
        "time.step_s=1.0",
        "simulate.engine=vectorized",
    )
    summary, records = _run(tmp_path / "run", overrides)
    assert summary["engine"] == "vectorized"
    # A receiver missing a silently lost message waits out the deadline: 3 s a round.
    nodes = _nodes(records)
    for (node, t), record in nodes.items():
        if record["missing"]:
            assert record["vtime"] - (nodes[(node, t - 1)]["vtime"] if t else 0.0) >= 3.0
    messages, _ = _run(tmp_path / "messages", [*overrides[:-1], "simulate.engine=messages"])
    assert messages["params_sha256"] == summary["params_sha256"]


def test_a_holding_push_sum_peer_is_not_waited_for(tmp_path: Path) -> None:
    """OPS in deadline mode: n0, cut off for 12 rounds, holds its pushes (it heard no share
    for 8 rounds) until a share reaches it again; with a virtual clock its out-neighbours
    learn that it sent them nothing instead of waiting for the message (which would be
    transport.strict_timeout_s a round)."""
    overrides = [
        "algorithm.name=ops",
        "topology.kind=exponential",
        "topology.nodes=6",
        "run.rounds=20",
        "run.eval_every=20",
        "data.batch_size=16",
        "transport.mode=deadline",
        "transport.strict_timeout_s=30",
        "time.step_s=0.1",
        "faults.partitions=[{nodes=['n0'], start=2, end=14}]",
    ]
    summary, records = _run(tmp_path / "run", overrides)
    assert summary["engine"] == "messages" and summary["status"] == "completed"
    assert summary["wall_seconds"] < 20
    nodes = _nodes(records)
    # Round 14: the partition is over, but n0 still holds: its receivers miss its share,
    # which no fault plan lost (so it is not in dropped_in).
    held = [v for (v, t), r in nodes.items() if t == 14 and "n0" in r["missing"]]
    assert held and all("n0" not in nodes[(v, 14)]["dropped_in"] for v in held)
