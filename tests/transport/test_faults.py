"""Fault injection: a seeded plan, the transport wrapper, and runs that survive it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import FaultsConfig, config_from_dict, config_to_dict, dumps_toml, load_config
from fedcore.errors import ConfigError
from fedcore.simulation.simulate import simulate
from fedcore.transport.faults import FaultPlan

NODES = [f"n{i}" for i in range(6)]


def plan(**faults: object) -> FaultPlan:
    return FaultPlan(FaultsConfig(**faults), run_seed=7, nodes=NODES)  # type: ignore[arg-type]


@given(
    sender=st.sampled_from(NODES),
    receiver=st.sampled_from(NODES),
    round=st.integers(0, 10**6),
    phase=st.integers(0, 3),
)
@settings(max_examples=50)
def test_decisions_are_a_function_of_the_coordinates(
    sender: str, receiver: str, round: int, phase: int
) -> None:
    a, b = plan(drop=0.5, delay_s=2.0), plan(drop=0.5, delay_s=2.0)
    a.lost("n0", "n1", 3, 0)  # other questions asked first change nothing
    assert a.lost(sender, receiver, round, phase) == b.lost(sender, receiver, round, phase)
    assert 0 <= a.delay(sender, receiver, round, phase) == b.delay(sender, receiver, round, phase)
    assert a.delay(sender, receiver, round, phase) <= 2.0


def test_drop_rate_and_seeds() -> None:
    p = plan(drop=0.3)
    coords = [(s, r, t, 0) for s in NODES for r in NODES if s != r for t in range(400)]
    rate = sum(p.lost(*c) == "drop" for c in coords) / len(coords)
    assert abs(rate - 0.3) < 0.015  # 12,000 messages: 5 standard deviations is 0.021
    other = FaultPlan(FaultsConfig(drop=0.3, seed=1), run_seed=7)
    assert [p.lost(*c) for c in coords[:200]] != [other.lost(*c) for c in coords[:200]]


def test_edge_drop_partition_and_crash_windows() -> None:
    p = plan(
        edge_drop={"n0->n1": 1.0, "n1->n0": 0.0},
        drop=1.0,
        partitions=[{"nodes": ["n2", "n3"], "start": 5, "end": 8}],
        crashes=[{"node": "n4", "at": 10, "back": 12}, {"node": "n5", "at": 3}],
    )
    assert p.lost("n0", "n1", 0, 0) == "drop" and p.lost("n1", "n0", 0, 0) is None
    assert p.lost("n2", "n0", 5, 0) == "partition" and p.lost("n2", "n0", 8, 0) == "drop"
    assert p.lost("n2", "n3", 6, 0) == "drop"  # inside the same side: only the global drop
    assert [p.down("n4", t) for t in (9, 10, 11, 12)] == [False, True, True, False]
    assert p.down("n5", 10**6) and p.lost("n0", "n4", 11, 1) == "crash"


@pytest.mark.parametrize(
    ("faults", "match"),
    [
        ({"drop": 1.5}, "faults.drop"),
        ({"edge_drop": {"n0-n1": 0.5}}, "sender->receiver"),
        ({"edge_drop": {"n0->n1": 2}}, "probability"),
        ({"partitions": [{"nodes": ["n0"], "start": 4, "end": 4}]}, "after start"),
        ({"partitions": [{"nodes": [], "start": 1, "end": 4}]}, "non-empty"),
        ({"crashes": [{"node": "n0", "at": 5, "back": 5}]}, "after at"),
        ({"crashes": [{"node": "n0"}]}, "node = ID, at = R"),
        ({"delay_s": -1.0}, "delay_s"),
        ({"partitions": 3}, "list of tables"),
        ({"crashes": True}, "list of tables"),
    ],
)
def test_invalid_fault_plans_name_the_key(faults: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_from_dict({"faults": faults})


def test_unknown_node_in_the_plan() -> None:
    with pytest.raises(ConfigError, match="n9"):
        FaultPlan(FaultsConfig(crashes=[{"node": "n9", "at": 1}]), run_seed=0, nodes=NODES)  # type: ignore[list-item]


def test_faults_round_trip_through_toml() -> None:
    import tomllib

    config = load_config(
        None,
        [
            "faults.drop=0.1",
            'faults.edge_drop={"n0->n1" = 0.5}',
            'faults.partitions=[{nodes=["n1", "n0"], start=3, end=5}]',
            'faults.crashes=[{node="n2", at=4}]',
        ],
    )
    again = config_from_dict(tomllib.loads(dumps_toml(config_to_dict(config))))
    assert again == config and again.faults.active


SMALL = ["run.rounds=30", "run.eval_every=10", "topology.nodes=8"]


def test_strict_run_with_announced_losses_is_fast_and_counts_them(tmp_path: Path) -> None:
    """Strict mode, 30% drops, a partition and a crash-and-return: no wait, all counted."""
    config = load_config(
        None,
        [
            *SMALL,
            "faults.drop=0.3",
            'faults.partitions=[{nodes=["n0", "n1"], start=5, end=10}]',
            'faults.crashes=[{node="n3", at=12, back=20}]',
            "transport.strict_timeout_s=5",
        ],
    )
    summary = simulate(config, out_dir=tmp_path, show_progress=False)
    traffic, faults = summary["traffic"], summary["faults"]
    assert summary["wall_seconds"] < 30  # nobody waited out a timeout
    assert traffic["messages_dropped"] == sum(faults["lost_per_edge"].values()) > 0
    assert faults["down_rounds"] == {"n3": [[12, 19]]}
    assert traffic["messages_missing"] == sum(faults["missing_per_edge"].values())
    # Away from the crashed node, what a sender lost is exactly what its receiver missed.
    # While n3 is down it sends nothing (its receivers miss it) and misses nothing.
    lost, missed = faults["lost_per_edge"], faults["missing_per_edge"]
    for edge in set(lost) | set(missed):
        sender, receiver = edge.split("->")
        gap = 8 if sender == "n3" else -8 if receiver == "n3" else 0
        assert missed.get(edge, 0) - lost.get(edge, 0) == gap, edge
    assert any(a <= 12 and b >= 19 for a, b in summary["missing_rounds"]["n3"])
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    down = [r for r in records if r["kind"] == "node" and r["down"]]
    assert {r["round"] for r in down} == set(range(12, 20)) and all(r["loss"] is None for r in down)


def test_same_plan_same_run_and_no_faults_unchanged(tmp_path: Path) -> None:
    faulty = [*SMALL, "faults.drop=0.2", "faults.seed=3"]
    a = simulate(load_config(None, faulty), out_dir=tmp_path / "a", show_progress=False)
    b = simulate(load_config(None, faulty), out_dir=tmp_path / "b", show_progress=False)
    clean = simulate(load_config(None, SMALL), out_dir=tmp_path / "c", show_progress=False)
    assert a["params_sha256"] == b["params_sha256"] != clean["params_sha256"]
    assert clean["traffic"]["messages_dropped"] == 0 and clean["faults"]["lost_per_edge"] == {}


def test_unannounced_losses_need_deadline_mode(tmp_path: Path) -> None:
    """announce = false: lost messages vanish; deadline mode proceeds without them."""
    base = [*SMALL, "run.rounds=6", "faults.drop=0.3", "faults.announce=false"]
    with pytest.raises(Exception, match="strict mode"):
        simulate(
            load_config(None, [*base, "transport.strict_timeout_s=0.2"]),
            out_dir=tmp_path / "strict",
            show_progress=False,
        )
    summary = simulate(
        load_config(None, [*base, "transport.mode=deadline", "transport.deadline_s=0.2"]),
        out_dir=tmp_path / "deadline",
        show_progress=False,
    )
    assert summary["traffic"]["messages_missing"] >= summary["traffic"]["messages_dropped"] > 0


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.name=choco", "topology.kind=ring", "faults.drop=0.1"], "needs every message"),
        (["algorithm.robust=true", "compression.codec=sign"], "running totals"),
        (['faults.crashes=[{node="n99", at=1}]'], "n99"),
        (["faults.drop=0.1", "faults.announce=false"], "deadline"),
        (["topology.kind=one-peer-exponential", "topology.undirected=true"], "schedule"),
    ],
)
def test_fault_plans_that_cannot_work_are_refused(
    tmp_path: Path, overrides: list[str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        simulate(load_config(None, [*SMALL, *overrides]), out_dir=tmp_path, show_progress=False)
