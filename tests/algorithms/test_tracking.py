"""Gradient tracking (DSGT, Push-Pull): the trackers' sum is the sum of the latest gradients
after every round, a quadratic's optimum is reached with a constant step where D-PSGD stops
at a bias, and Push-Pull's weights are row- and column-stochastic from each peer's own
neighbours."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import make_algorithm
from fedcore.algorithms.rule import Rows, Slot
from fedcore.errors import AlgorithmError
from fedcore.testing import lockstep
from fedcore.topology import Topology, TrustGraph, parse_spec
from tests.strategies import (
    connected_undirected_graphs,
    random_grad,
    random_params,
    strongly_connected_digraphs,
)

D = 3


def _renamed(graph: TrustGraph, seed: int) -> TrustGraph:
    """``graph`` with odd ids (not n0, n1 ...), in a shuffled order."""
    names = {v: f"peer-{(7 * i + seed) % 97}x" for i, v in enumerate(graph.nodes)}
    edges = [(names[u], names[v]) for u, v in graph.edges()]
    return TrustGraph.from_edges(edges, name="odd", nodes=sorted(names.values()))


@settings(max_examples=25, deadline=None)
@given(st.data(), st.sampled_from(["dsgt", "push-pull"]), st.integers(0, 50))
def test_the_trackers_sum_is_the_sum_of_the_latest_gradients(
    data: Any, algorithm: str, seed: int
) -> None:
    shapes = connected_undirected_graphs() if algorithm == "dsgt" else strongly_connected_digraphs()
    graph = _renamed(data.draw(shapes), seed)
    grad = random_grad(seed, D, pull=0.5)
    latest: dict[str, torch.Tensor] = {}

    def tracked(node: str, t: int, model: torch.Tensor) -> torch.Tensor:
        latest[node] = grad(node, t, model)
        return latest[node]

    def check(t: int, states: dict[str, Any]) -> None:
        total_y = sum(s.ybar.view(-1) for s in states.values())  # after the mix: C y, its sum
        total_g = sum(latest[n] for n in states)
        torch.testing.assert_close(total_y, total_g, rtol=1e-9, atol=1e-9)

    rule = make_algorithm(algorithm)
    params = random_params(graph, seed, D)
    lockstep(rule, graph, params, rounds=6, lr=0.1, grad=tracked, on_round=check)


def _quadratic(algorithm: str, graph: Topology, rounds: int) -> float:
    """The largest distance of any peer's model from the minimiser of sum_i ||x - b_i||^2/2,
    peers' b_i far apart (strongly heterogeneous), a constant step."""
    gen = torch.Generator().manual_seed(0)
    b = {
        v: torch.randn(D, generator=gen, dtype=torch.float64) * (1 + i)
        for i, v in enumerate(graph.nodes)
    }
    optimum = torch.stack(list(b.values())).mean(0)
    params = {v: torch.zeros(D, dtype=torch.float64) for v in graph.nodes}
    out = lockstep(
        make_algorithm(algorithm),
        graph,
        params,
        rounds=rounds,
        lr=0.2,
        grad=lambda node, t, x: x - b[node],
    )
    return max(float((out[v].x - optimum).abs().max()) for v in graph.nodes)


def test_tracking_reaches_the_optimum_of_the_sum_and_dpsgd_does_not() -> None:
    assert _quadratic("dsgt", parse_spec("ring:8"), 300) < 1e-6
    assert _quadratic("push-pull", parse_spec("social:8"), 300) < 1e-6
    assert _quadratic("dpsgd", parse_spec("ring:8"), 300) > 0.1  # its bias floor


def test_push_pull_weights_are_each_peers_own() -> None:
    """R: 1/(in-degree + 1) over what a peer hears and itself (rows sum to 1); C: the
    sender's push-sum shares 1/(out-degree + 1) (columns sum to 1), so the mix of a
    constant model is that constant, and the trackers' total is kept."""
    rule = make_algorithm("push-pull")
    w = torch.tensor([1 / 3, 1 / 3], dtype=torch.float64)  # two senders of out-degree 2
    rows = Rows(
        round=0,
        lr=0.5,
        self_weight=torch.tensor([0.5, 0.25], dtype=torch.float64),
        in_degree=torch.tensor([2, 2]),
    )
    state = rule.init(torch.full((2, 1), 3.0, dtype=torch.float64))
    state, _ = rule.step(state, torch.zeros(2, 1, dtype=torch.float64), rows)
    inbox = [
        Slot(
            {
                "v": torch.full((2, 1), 3.0, dtype=torch.float64),
                "y": torch.ones(2, 1, dtype=torch.float64),
            },
            {},
            w,
            torch.tensor([True, True]),
        ),
        Slot(
            {
                "v": torch.full((2, 1), 3.0, dtype=torch.float64),
                "y": torch.ones(2, 1, dtype=torch.float64),
            },
            {},
            w,
            torch.tensor([True, False]),
        ),
    ]
    new, _ = rule.mix(state, 0, inbox, rows)
    assert new.x.tolist() == [[3.0], [3.0]]  # R's rows are stochastic, a missing share to self
    assert new.ybar.view(-1).tolist() == pytest.approx([2 / 3, 1 / 3])  # C's shares, one lost


def test_local_steps_are_refused() -> None:
    rule = make_algorithm("dsgt")
    rows = Rows(round=0, lr=0.1, self_weight=torch.ones(1, dtype=torch.float64))
    with pytest.raises(AlgorithmError, match=r"run\.local_steps = 1"):
        rule.local_step(rule.init(torch.zeros(1, 2)), torch.zeros(1, 2), rows)
