"""The fault plan as the one source of fault decisions: its masks, its node-id questions
(rows of the masks), and a node that asks the plan it is given, never its transport."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Collection

import pytest
import torch

from fedcore.config import FaultsConfig, load_config
from fedcore.faults import REASONS, FaultPlan
from fedcore.messages import Message
from fedcore.setup.prepare import prepare_run
from fedcore.transport import InProcessNetwork
from fedcore.transport.base import TransportStats
from fedcore.transport.faults import FaultyTransport


def _plan(seed: int, nodes: list[str]) -> FaultPlan:
    rng = random.Random(seed)
    faults = FaultsConfig(
        seed=rng.randrange(2**32),
        drop=rng.choice([0.0, 0.3]),
        edge_drop={f"{nodes[0]}->{nodes[1]}": 1.0, f"{nodes[1]}->{nodes[2]}": 0.0},
        partitions=[{"nodes": rng.sample(nodes, 2), "start": 2, "end": 5}],  # type: ignore[list-item]
        crashes=[{"node": nodes[3], "at": 4, "back": 7}],  # type: ignore[list-item]
    )
    return FaultPlan(faults, run_seed=seed, nodes=nodes)


@pytest.mark.parametrize("seed", range(4))
def test_reasons_masks_and_node_id_questions_agree(seed: int) -> None:
    nodes = ["q", "b7", "alice", "n10", "z"]
    plan = _plan(seed, nodes)
    pairs = [(s, d) for s in range(5) for d in range(5) if s != d]
    src, dst = torch.tensor([s for s, _ in pairs]), torch.tensor([d for _, d in pairs])
    for round in range(9):
        for phase in (0, 1):
            reasons = plan.loss_reasons(src, dst, round, phase)
            assert reasons.dtype == torch.int8
            named = [plan.lost(nodes[s], nodes[d], round, phase) for s, d in pairs]
            assert [REASONS[c] for c in reasons.tolist()] == named
            assert plan.lost_mask(src, dst, round, phase).tolist() == [r is not None for r in named]
            lost = plan.announced_lost("q", round, phase, nodes[1:])
            assert lost == [s for s in nodes[1:] if plan.lost(s, "q", round, phase)]
    # a plan without nodes answers the node-id questions the same, for any ids it meets
    bare = FaultPlan(plan.faults, run_seed=seed)
    assert [bare.lost(nodes[s], nodes[d], 5, 1) for s, d in pairs] == [
        plan.lost(nodes[s], nodes[d], 5, 1) for s, d in pairs
    ]
    assert bare.lost("q", "somebody-else", 0, 0) == plan.lost("q", "somebody-else", 0, 0)


def test_announce_false_announces_nothing() -> None:
    plan = FaultPlan(FaultsConfig(drop=1.0, announce=False), run_seed=0, nodes=["a", "b"])
    assert plan.lost("a", "b", 0, 0) == "drop" and not plan.announce
    assert plan.announced_lost("b", 0, 0, ["a"]) == []


class _Refuses:
    """A transport that fails on any use: a crashed node must not touch it."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.stats = TransportStats()

    async def send(self, message: Message) -> None:
        raise AssertionError(f"a crashed node sent {message}")

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        raise AssertionError("a crashed node collected")

    async def close(self) -> None:
        """Nothing to close."""


def test_the_node_is_given_the_plan_and_asks_it() -> None:
    config = load_config(
        None,
        ["topology.nodes=4", "topology.kind=ring", 'faults.crashes=[{node="n1", at=0, back=2}]'],
    )
    setup = prepare_run(config)
    assert setup.faults is not None
    node = setup.make_node("n1", InProcessNetwork().endpoint("n1"))
    assert node.faults is setup.faults
    assert isinstance(node.transport, FaultyTransport) and node.transport.plan is setup.faults
    # The plan, not the transport, says the node is down: any transport will do.
    node.transport = _Refuses("n1")
    records = [asyncio.run(node.run_round()) for _ in range(2)]
    assert [(r.round, r.down) for r in records] == [(0, True), (1, True)]
    assert node.batches_read == 0
