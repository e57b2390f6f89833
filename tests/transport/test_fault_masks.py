"""The tensor questions of a fault plan give exactly the scalar decisions, edge for edge."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import FaultsConfig
from fedcore.transport.faults import FaultPlan


def _random_plan(rng: random.Random, nodes: list[str], edges: list[tuple[int, int]]) -> FaultPlan:
    """Drops, per-edge drops (0 and 1 included), partitions and crashes with and without
    ``back``, all at random."""
    faults: dict[str, Any] = {"seed": rng.randrange(2**64), "drop": rng.choice([0.0, 0.05, 0.3])}
    chosen = rng.sample(edges, k=min(len(edges), rng.randrange(4)))
    faults["edge_drop"] = {
        f"{nodes[s]}->{nodes[d]}": rng.choice([0.0, 0.5, 1.0, rng.random()]) for s, d in chosen
    }
    faults["partitions"] = [
        {
            "nodes": rng.sample(nodes, k=rng.randrange(1, len(nodes))),
            "start": (start := rng.randrange(6)),
            "end": start + rng.randrange(1, 4),
        }
        for _ in range(rng.randrange(3))
    ]
    crashes = []
    for node in rng.sample(nodes, k=rng.randrange(min(3, len(nodes)))):
        crash: dict[str, Any] = {"node": node, "at": rng.randrange(6)}
        if rng.random() < 0.5:
            crash["back"] = crash["at"] + rng.randrange(1, 4)
        crashes.append(crash)
    faults["crashes"] = crashes
    return FaultPlan(FaultsConfig(**faults), run_seed=rng.randrange(2**32), nodes=nodes)


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 12), density=st.floats(0.1, 1.0))
@settings(max_examples=60)
def test_lost_mask_is_the_scalar_lost(seed: int, n: int, density: float) -> None:
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in rng.sample(range(100), n)]  # not sorted: the given order counts
    edges = [(s, d) for s in range(n) for d in range(n) if s != d and rng.random() < density]
    edges = edges or [(0, 1)]
    plan = _random_plan(rng, nodes, edges)
    src = torch.tensor([s for s, _ in edges])
    dst = torch.tensor([d for _, d in edges])
    probabilities = plan.edge_probabilities(src, dst)
    for round in range(9):
        down = plan.down_mask(round)
        assert down.tolist() == [plan.down(node, round) for node in nodes]
        for phase in (0, 1):
            expected = [plan.lost(nodes[s], nodes[d], round, phase) is not None for s, d in edges]
            assert plan.lost_mask(src, dst, round, phase).tolist() == expected
            got = plan.lost_mask(src, dst, round, phase, probabilities=probabilities)
            assert got.tolist() == expected


def test_edge_probabilities_and_uniforms() -> None:
    nodes = ["a", "b", "c"]
    faults = FaultsConfig(drop=0.2, edge_drop={"a->b": 0.9, "c->a": 0.0})
    plan = FaultPlan(faults, run_seed=3, nodes=nodes)
    src, dst = torch.tensor([0, 1, 2, 2, 0]), torch.tensor([1, 0, 0, 1, 2])
    assert plan.edge_probabilities(src, dst).tolist() == [0.9, 0.2, 0.0, 0.2, 0.2]
    u = plan.uniform_edges("delay", src, dst, 11, 1)
    assert u.dtype == torch.float64
    assert u.tolist() == [
        plan.uniform("delay", nodes[s], nodes[d], 11, 1)
        for s, d in zip(src.tolist(), dst.tolist(), strict=True)
    ]
    # int32 indices are taken as they are; no edges, no decisions
    assert plan.lost_mask(src.int(), dst.int(), 4, 0).tolist() == [
        plan.lost(nodes[s], nodes[d], 4, 0) is not None
        for s, d in zip(src.tolist(), dst.tolist(), strict=True)
    ]
    empty = torch.zeros(0, dtype=torch.int64)
    assert plan.lost_mask(empty, empty, 0, 0).shape == (0,)


def test_kept_probabilities_follow_the_edges() -> None:
    """Without ``probabilities`` the plan keeps them per (src, dst) pair of tensors; an
    in-place change of the indices is seen."""
    nodes = ["a", "b", "c"]
    plan = FaultPlan(FaultsConfig(edge_drop={"a->b": 1.0}), run_seed=0, nodes=nodes)
    src, dst = torch.tensor([0, 0]), torch.tensor([1, 2])
    for _ in range(2):
        assert plan.lost_mask(src, dst, 0, 0).tolist() == [True, False]
    dst[1] = 1  # now both edges are a -> b
    assert plan.lost_mask(src, dst, 0, 0).tolist() == [True, True]
    assert plan.lost_mask(torch.tensor([1]), torch.tensor([0]), 0, 0).tolist() == [False]


def test_the_hash_is_a_function_of_the_coordinates() -> None:
    """Directions differ, rounds and phases differ, seeds differ; the same plan agrees."""
    nodes = ["a", "b"]
    plan = FaultPlan(FaultsConfig(drop=0.5), run_seed=1, nodes=nodes)
    again = FaultPlan(FaultsConfig(drop=0.5), run_seed=1, nodes=list(reversed(nodes)))
    other = FaultPlan(FaultsConfig(drop=0.5, seed=1), run_seed=1)
    coords = [(s, r, t, p) for s, r in (("a", "b"), ("b", "a")) for t in range(50) for p in (0, 1)]
    values = [plan.uniform("drop", *c) for c in coords]
    assert values == [again.uniform("drop", *c) for c in coords]
    assert len(set(values)) == len(values)
    assert values != [other.uniform("drop", *c) for c in coords]


def test_tensor_questions_need_the_nodes() -> None:
    plan = FaultPlan(FaultsConfig(drop=0.5), run_seed=1)
    assert plan.nodes == ()
    with pytest.raises(ValueError, match="nodes"):
        plan.down_mask(0)
    with pytest.raises(ValueError, match="nodes"):
        plan.lost_mask(torch.tensor([0]), torch.tensor([1]), 0, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_masks_on_cuda_are_the_cpu_masks() -> None:
    rng = random.Random(5)
    nodes = [f"n{i}" for i in range(200)]
    edges = [(rng.randrange(200), rng.randrange(200)) for _ in range(5000)]
    edges = [(s, d) for s, d in edges if s != d]
    plan = _random_plan(rng, nodes, edges)
    src = torch.tensor([s for s, _ in edges])
    dst = torch.tensor([d for _, d in edges])
    for round in range(8):
        cpu = plan.lost_mask(src, dst, round, 0)
        cuda = plan.lost_mask(src.cuda(), dst.cuda(), round, 0)
        assert cuda.device.type == "cuda" and torch.equal(cpu, cuda.cpu())
        assert torch.equal(plan.down_mask(round), plan.down_mask(round, "cuda").cpu())
