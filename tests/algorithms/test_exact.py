"""Exact Diffusion: the peers' mean moves exactly as centralized gradient descent (the sum of
``x - psi`` stays 0), a heterogeneous quadratic's optimum is reached with a constant step
where D-PSGD stops at a bias, a lost share goes to the receiver itself, and local steps are
refused."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import make_algorithm
from fedcore.algorithms.rule import Rows, Slot
from fedcore.errors import AlgorithmError
from fedcore.testing import lockstep
from fedcore.topology import parse_spec
from tests.algorithms.test_tracking import D, _quadratic, _renamed, _targets
from tests.strategies import connected_undirected_graphs, random_grad, random_params

LR = 0.1


@settings(max_examples=25, deadline=None)
@given(connected_undirected_graphs(), st.integers(0, 50))
def test_the_mean_moves_as_centralized_gradient_descent(graph: Any, seed: int) -> None:
    graph = _renamed(graph, seed)
    grad = random_grad(seed, D, pull=0.5)
    params = random_params(graph, seed, D)
    mean = torch.stack(list(params.values())).mean(0)
    steps: dict[str, torch.Tensor] = {}

    def taken(node: str, t: int, model: torch.Tensor) -> torch.Tensor:
        steps[node] = grad(node, t, model)
        return steps[node]

    def check(t: int, states: dict[str, Any]) -> None:
        nonlocal mean
        mean = mean - LR * torch.stack([steps[n] for n in states]).mean(0)
        x = torch.stack([s.x.view(-1) for s in states.values()])
        psi = torch.stack([s.psi.view(-1) for s in states.values()])
        torch.testing.assert_close(x.mean(0), mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(
            (x - psi).sum(0), torch.zeros(D, dtype=x.dtype), atol=1e-9, rtol=0
        )

    rule = make_algorithm("exact-diffusion")
    lockstep(rule, graph, params, rounds=6, lr=LR, grad=taken, on_round=check)


def test_exact_diffusion_reaches_the_optimum_of_the_sum_and_dpsgd_does_not() -> None:
    assert _quadratic("exact-diffusion", parse_spec("ring:8"), 120) < 1e-6
    assert _quadratic("dpsgd", parse_spec("ring:8"), 120) > 0.1  # its bias floor


def test_a_missing_share_goes_to_the_receiver_itself() -> None:
    """``x <- Wbar phi``, ``Wbar = (I + W)/2``: half of each arrived ``W_ji``, the rest
    (and a missing share) to the peer itself."""
    rule = make_algorithm("exact-diffusion")
    rows = Rows(round=0, lr=0.5, self_weight=torch.tensor([0.5, 0.5], dtype=torch.float64))
    state = rule.init(torch.full((2, 1), 4.0, dtype=torch.float64))
    state, send = rule.step(state, torch.full((2, 1), 2.0, dtype=torch.float64), rows)
    assert send is not None and send.tensors["phi"].view(-1).tolist() == [3.0, 3.0]
    inbox = [
        Slot(
            {"phi": torch.full((2, 1), 7.0, dtype=torch.float64)},
            {},
            torch.tensor([0.5, 0.5], dtype=torch.float64),
            torch.tensor([True, False]),
        )
    ]
    new, _ = rule.mix(state, 0, inbox, rows)
    assert new.x.view(-1).tolist() == [0.75 * 3.0 + 0.25 * 7.0, 3.0]
    assert new.psi.view(-1).tolist() == [3.0, 3.0]


def test_local_steps_are_refused() -> None:
    rule = make_algorithm("exact-diffusion")
    rows = Rows(round=0, lr=0.1, self_weight=torch.ones(1, dtype=torch.float64))
    with pytest.raises(AlgorithmError, match=r"run\.local_steps = 1"):
        rule.local_step(rule.init(torch.zeros(1, 2)), torch.zeros(1, 2), rows)


def test_lost_messages_leave_a_consensus_off_the_optimum() -> None:
    """A lost share goes to the receiver itself: the peers still agree, but the sum of
    ``x - psi`` has moved, and so has the point they agree on."""
    graph = parse_spec("ring:8")
    b, optimum = _targets(graph)

    def drop(sender: str, receiver: str, t: int, phase: int) -> bool:
        return zlib.crc32(f"{sender}>{receiver}@{t}".encode()) % 5 == 0  # a fifth of them

    params = {v: torch.zeros(D, dtype=torch.float64) for v in graph.nodes}
    out = lockstep(
        make_algorithm("exact-diffusion"),
        graph,
        params,
        rounds=300,
        lr=0.2,
        grad=lambda node, t, x: x - b[node],
        drop=drop,
    )
    x = torch.stack([out[v].x.view(-1) for v in graph.nodes])
    assert float((x - x.mean(0)).abs().max()) < 1e-9  # consensus
    assert float((x.mean(0) - optimum).abs().max()) > 1e-3  # off the optimum
