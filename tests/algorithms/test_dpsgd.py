"""D-PSGD, CENTRAL and LOCAL invariants (reference/algorithms.md I-DOG-1, I-DOG-2, I-DOG-4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import DPSGD, Central, DPSGDState, Local, RoundContext, make_algorithm
from fedcore.errors import ConfigError, TopologyError
from fedcore.messages import Payload
from fedcore.runners.network import communication_graph
from fedcore.testing import lockstep
from fedcore.topology import TrustGraph, metropolis_hastings, parse_spec, prepare, spectral_gap
from tests.strategies import GradFn, connected_undirected_graphs, random_grad, random_params

D = 4


def _params(graph: TrustGraph, seed: int) -> dict[str, torch.Tensor]:
    return random_params(graph, seed, D)


def _grad(seed: int) -> GradFn:
    return random_grad(seed, D, pull=0.3)


@given(connected_undirected_graphs(), st.integers(0, 1000))
@settings(max_examples=30)
def test_mean_dynamics(graph: TrustGraph, seed: int) -> None:
    """I-DOG-1: x_bar(t+1) = x_bar(t) - lr * mean_i g_i(x_i(t)), exactly."""
    weighted = metropolis_hastings(graph)
    lr = 0.05
    grad = _grad(seed)
    states = {n: DPSGD().init(p) for n, p in _params(graph, seed).items()}
    for t in range(6):
        mean_before = torch.stack([s.x for s in states.values()]).mean(0)
        mean_grad = torch.stack([grad(n, t, s.x) for n, s in states.items()]).mean(0)
        states = lockstep(
            DPSGD(),
            weighted,
            {},
            rounds=1,
            lr=lr,
            grad=lambda n, _t, m, t=t: grad(n, t, m),
            states=states,
        )
        mean_after = torch.stack([s.x for s in states.values()]).mean(0)
        assert torch.allclose(mean_after, mean_before - lr * mean_grad, atol=1e-12)


@given(connected_undirected_graphs(), st.integers(0, 1000))
@settings(max_examples=30)
def test_consensus_contracts_by_rho(graph: TrustGraph, seed: int) -> None:
    """I-DOG-2: with zero step, ||X - x_bar|| shrinks by at most rho = 1 - gap per round."""
    weighted = metropolis_hastings(graph)
    rho = 1.0 - spectral_gap(weighted)
    params = _params(graph, seed)
    mean = torch.stack(list(params.values())).mean(0)

    def disagreement(states: dict[str, DPSGDState]) -> float:
        return float(torch.stack([s.x - mean for s in states.values()]).norm())

    states = {n: DPSGD().init(p) for n, p in params.items()}
    for _ in range(10):
        before = disagreement(states)
        states = lockstep(DPSGD(), weighted, {}, rounds=1, states=states)
        assert disagreement(states) <= rho * before + 1e-12


def test_gradient_at_pre_mix_model() -> None:
    """I-DOG-4: combine-then-adapt; a quadratic tells it apart from adapt-then-combine."""
    graph = metropolis_hastings(parse_spec("ring:3"))  # weights 1/3 everywhere
    assert isinstance(graph, TrustGraph)
    targets = {"n0": 1.0, "n1": -2.0, "n2": 5.0}
    params = {"n0": torch.tensor([0.0]), "n1": torch.tensor([3.0]), "n2": torch.tensor([9.0])}
    params = {k: v.double() for k, v in params.items()}
    lr = 0.5

    def grad(node: str, t: int, x: torch.Tensor) -> torch.Tensor:
        return x - targets[node]  # f_i(x) = (x - c_i)^2 / 2

    out = lockstep(DPSGD(), graph, params, rounds=1, lr=lr, grad=grad)
    mean = sum(float(p) for p in params.values()) / 3
    for n, p in params.items():
        cta = mean - lr * (float(p) - targets[n])
        atc = sum(float(q) - lr * (float(q) - targets[m]) for m, q in params.items()) / 3
        assert out[n].x.item() == pytest.approx(cta, abs=1e-12)
        assert cta != pytest.approx(atc)


def test_missing_neighbour_weight_goes_to_self() -> None:
    """Deadline mode: a missing neighbour's weight is replaced by the node's own value."""
    algo = DPSGD()
    ctx = RoundContext(
        node="a",
        round=0,
        lr=0.0,
        self_weight=0.5,
        out_weights={"b": 0.25, "c": 0.25},
        in_weights={"b": 0.25, "c": 0.25},
    )
    state = DPSGDState(torch.tensor([4.0]), None)
    new, _ = algo.mix(state, 0, {"b": Payload({"x": torch.tensor([8.0])})}, ctx)
    assert new.x.item() == pytest.approx(0.75 * 4.0 + 0.25 * 8.0)


def test_dpsgd_refuses_one_way_graph() -> None:
    """A one-way graph given to a doubly-stochastic algorithm names push-sum."""
    with pytest.raises(TopologyError, match="push-sum"):
        communication_graph(DPSGD(), parse_spec("social:16"))


def test_central_gives_every_node_the_exact_mean() -> None:
    graph = parse_spec("social:8")
    params = _params(graph, 7)
    lr = 0.1
    grad = _grad(7)
    expected = torch.stack([params[n] - lr * grad(n, 0, params[n]) for n in graph.nodes]).mean(0)
    out = lockstep(
        Central(), communication_graph(Central(), graph), params, rounds=1, lr=lr, grad=grad
    )
    first = out[graph.nodes[0]].x
    assert torch.allclose(first, expected, atol=1e-12)
    assert all(torch.equal(s.x, first) for s in out.values())  # bit-identical


def test_local_is_plain_sgd() -> None:
    graph = parse_spec("ring:4")
    params = _params(graph, 8)
    out = lockstep(
        Local(),
        communication_graph(Local(), graph),
        params,
        rounds=3,
        lr=0.5,
        grad=lambda n, t, x: x,
    )
    for n in graph.nodes:
        assert torch.allclose(out[n].x, params[n] * 0.5**3)


def test_registry_and_options() -> None:
    assert make_algorithm("ops").name == "ops"
    with pytest.raises(ConfigError, match="known algorithms"):
        make_algorithm("nope")
    with pytest.raises(ConfigError, match="no option"):
        make_algorithm("dpsgd", momentum=0.9)


def test_metropolis_hastings_is_doubly_stochastic() -> None:
    w = prepare(parse_spec("torus:4x4"), mixing="doubly-stochastic", algorithm="dpsgd")
    m = w.mixing_matrix()
    assert np.allclose(m.sum(0), 1) and np.allclose(m.sum(1), 1) and np.allclose(m, m.T)
