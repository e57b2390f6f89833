"""Fault decisions frozen: the exact losses and crashes of one nontrivial plan.

Recorded from the code before the fault plan became a transport wrapper plus a mask provider;
any later change to how faults are decided or applied must keep these exactly. The plan: a
drop probability, per-edge drops (0.9 and 0), a partition window and two crashes (one comes
back), on node ids that are neither sorted nor ``n<i>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedcore.config import FaultsConfig, load_config
from fedcore.simulation.simulate import simulate
from fedcore.transport.faults import FaultPlan

NODES = ["zeta", "a1", "n07", "Bob", "x-9"]
EDGES = [
    (0, 1),
    (1, 0),
    (1, 2),
    (2, 1),
    (2, 3),
    (3, 2),
    (3, 4),
    (4, 3),
    (4, 0),
    (0, 4),
    (0, 2),
    (3, 1),
]
FAULTS = FaultsConfig(
    drop=0.3,
    edge_drop={"a1->n07": 0.9, "x-9->zeta": 0.0},
    partitions=[{"nodes": ["zeta", "Bob"], "start": 3, "end": 7}],  # type: ignore[list-item]
    crashes=[{"node": "n07", "at": 9, "back": 13}, {"node": "x-9", "at": 16}],  # type: ignore[list-item]
    seed=11,
)

# Per round: the crashed nodes, then per phase the lost edges (index into EDGES) with the
# reason's first letter (crash, partition, drop).
DECISIONS = [
    ("", "2d 4d 5d 6d", "0d 2d 3d 10d 11d"),
    ("", "0d 1d 2d 7d 9d", "2d 6d 7d 11d"),
    ("", "2d 4d", "1d 2d"),
    ("", "0p 1p 2d 4p 5p 6p 7p 8p 9p 10p 11p", "0p 1p 2d 4p 5p 6p 7p 8p 9p 10p 11p"),
    ("", "0p 1p 2d 4p 5p 6p 7p 8p 9p 10p 11p", "0p 1p 2d 3d 4p 5p 6p 7p 8p 9p 10p 11p"),
    ("", "0p 1p 2d 3d 4p 5p 6p 7p 8p 9p 10p 11p", "0p 1p 2d 4p 5p 6p 7p 8p 9p 10p 11p"),
    ("", "0p 1p 2d 4p 5p 6p 7p 8p 9p 10p 11p", "0p 1p 2d 3d 4p 5p 6p 7p 8p 9p 10p 11p"),
    ("", "2d 3d 5d 7d 9d 10d", "2d 5d"),
    ("", "0d 2d 4d 5d", "2d 3d 5d 10d 11d"),
    ("n07", "1d 2c 3c 4c 5c 9d 10c 11d", "1d 2c 3c 4c 5c 7d 10c"),
    ("n07", "2c 3c 4c 5c 10c", "2c 3c 4c 5c 9d 10c 11d"),
    ("n07", "2c 3c 4c 5c 6d 10c", "2c 3c 4c 5c 10c"),
    ("n07", "2c 3c 4c 5c 9d 10c", "2c 3c 4c 5c 6d 10c 11d"),
    ("", "2d 4d 6d 7d 9d", "0d 1d 6d 7d"),
    ("", "2d 6d", "0d 2d 3d 4d 10d"),
    ("", "1d 2d 3d 10d 11d", "0d 1d 2d 4d 5d 9d"),
    ("x-9", "2d 6c 7c 8c 9c", "2d 4d 5d 6c 7c 8c 9c 10d"),
    ("x-9", "0d 2d 4d 5d 6c 7c 8c 9c 10d", "0d 2d 4d 5d 6c 7c 8c 9c"),
    ("x-9", "3d 6c 7c 8c 9c 10d", "3d 6c 7c 8c 9c"),
    ("x-9", "2d 4d 6c 7c 8c 9c", "0d 2d 5d 6c 7c 8c 9c 11d"),
]

# Per round, per node (in name order) that lost or missed a message or was down: the
# receivers it lost messages to | the senders it did not get (announced), or "down".
RUN = [
    "n0:n3|n5; n3:|n0; n5:n0|",
    "n0:n1 n3|n3; n1:n4 n5|n0; n2:|n5; n3:n0|n0; n4:n5|n1; n5:n2|n1 n4",
    "n0:|n3; n1:|n4; n2:n4|n5; n3:n0|; n4:n1|n2; n5:n2|",
    "n0:|n5; n1:n4 n5|n4; n4:n1|n1; n5:n0|n1",
    "n0:n1|n1; n1:n0 n2 n5|n0 n2; n2:n1 n4|n1; n4:n5|n2; n5:|n1 n4",
    "n0:n1|n1; n1:n0 n2 n5|n0 n2 n4; n2:n1 n4|n1; n4:n1 n5|n2; n5:|n1 n4",
    "n0:n1|n1 n5; n1:n0 n2 n5|n0 n2; n2:down; n4:n5|n2; n5:n0 n2|n1 n4",
    "n0:n1|n1; n1:n0 n2 n5|n0 n2; n2:down; n4:n5|n2; n5:n2|n1 n4",
    "n1:n2|n2; n2:down; n4:|n2; n5:n2|",
    "n1:n2|n2 n4; n2:down; n4:n1|n2; n5:n2|",
    "n0:|n1; n1:n0 n2|n2; n2:down; n4:|n2; n5:n2|",
    "n0:n1|n5; n1:n2 n5|n0 n2; n2:n1|n1 n5; n4:n5|; n5:n0 n2|n1 n4",
    "n0:n3|n5; n3:|n0; n5:n0|",
    "n2:n4|; n4:|n2",
    "n0:n1|n3; n1:n5|n0; n2:|n5; n3:n0|; n5:n2|n1",
    "n0:|n5; n1:n4 n5|; n2:|n5; n4:n5|n1; n5:down",
    "n0:|n5; n1:n2 n5|n2 n4; n2:n1|n1 n5; n4:n1 n5|; n5:down",
    "n0:|n1 n5; n1:n0 n5|n2; n2:n1|n5; n4:n5|; n5:down",
    "n0:|n5; n1:n4 n5|n4; n2:|n5; n4:n1 n5|n1; n5:down",
    "n0:n3|n3 n5; n1:n4 n5|; n2:|n5; n3:n0|n0; n4:n5|n1; n5:down",
]

RUN_SETTINGS = [
    "run.rounds=20",
    "run.eval_every=10",
    "topology.nodes=6",
    "topology.kind=erdos-renyi",
    "topology.p=0.5",
    "topology.seed=3",
    "faults.drop=0.25",
    "faults.partitions=[{nodes=['n1','n4'],start=4,end=8}]",
    "faults.crashes=[{node='n2',at=6,back=11},{node='n5',at=15}]",
    "faults.seed=2",
]


def test_the_plan_decides_as_recorded() -> None:
    plan = FaultPlan(FAULTS, run_seed=5, nodes=NODES)
    src = torch.tensor([s for s, _ in EDGES])
    dst = torch.tensor([d for _, d in EDGES])
    for t, (down, *phases) in enumerate(DECISIONS):
        assert [n for n in NODES if plan.down(n, t)] == down.split(), t
        assert plan.down_mask(t).tolist() == [n in down.split() for n in NODES], t
        for phase, cells in enumerate(phases):
            want = {int(c[:-1]): c[-1] for c in cells.split()}
            got = {}
            for e, (s, d) in enumerate(EDGES):
                why = plan.lost(NODES[s], NODES[d], t, phase)
                if why is not None:
                    got[e] = why[0]
            assert got == want, (t, phase)
            mask = plan.lost_mask(src, dst, t, phase).tolist()
            assert mask == [e in want for e in range(len(EDGES))], (t, phase)


@pytest.mark.parametrize("engine", ["messages", "vectorized"])
def test_a_run_loses_as_recorded(tmp_path: Path, engine: str) -> None:
    """Every node's lost and missed messages and down rounds, on both engines."""
    config = load_config(None, [*RUN_SETTINGS, f"simulate.engine={engine}"])
    summary = simulate(config, out_dir=tmp_path, show_progress=False)
    assert summary["engine"] == engine
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    rows: list[list[str]] = [[] for _ in range(20)]
    for r in sorted(
        (r for r in records if r["kind"] == "node"), key=lambda r: (r["round"], r["node"])
    ):
        cell = "down" if r["down"] else " ".join(r["dropped_out"]) + "|" + " ".join(r["dropped_in"])
        assert r["down"] or r["messages_dropped"] == len(r["dropped_out"])
        if cell != "|":
            rows[r["round"]].append(f"{r['node']}:{cell}")
    assert ["; ".join(row) for row in rows] == RUN
    assert summary["faults"]["down_rounds"] == {"n2": [[6, 10]], "n5": [[15, 19]]}
    assert summary["traffic"]["messages_dropped"] == summary["traffic"]["messages_missing"] == 88
