"""D-PSGD, CENTRAL and LOCAL (the I-DOG invariants run for dpsgd and dog in test_online.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.algorithms import DPSGD, Central, Local, RoundContext, Rows, Slot, make_algorithm
from fedcore.algorithms.dpsgd import DPSGDRule
from fedcore.errors import ConfigError, TopologyError
from fedcore.messages import Payload
from fedcore.node import NodeRule
from fedcore.setup.graph import communication_graph
from fedcore.testing import lockstep
from fedcore.topology import TrustGraph, parse_spec, prepare
from tests.strategies import GradFn, random_grad, random_params

D = 4


def _params(graph: TrustGraph, seed: int) -> dict[str, torch.Tensor]:
    return random_params(graph, seed, D)


def _grad(seed: int) -> GradFn:
    return random_grad(seed, D, pull=0.3)


def test_missing_neighbour_weight_goes_to_self() -> None:
    """A missing neighbour's weight is replaced by the peer's own value: the rule called
    with a hand-built inbox of two rows (one heard both neighbours, one only ``b``)."""
    rule = DPSGDRule()
    state = rule.init(torch.tensor([[4.0], [2.0]]))
    w = torch.tensor([0.25, 0.25], dtype=torch.float64)
    rows = Rows(round=0, lr=0.0, self_weight=torch.tensor([0.5, 0.5], dtype=torch.float64))
    state, send = rule.step(state, torch.zeros(2, 1), rows)
    assert send is not None and torch.equal(send.tensors["x"], state.x)
    inbox = [
        Slot({"x": torch.tensor([[8.0], [8.0]])}, {}, w, torch.tensor([True, True])),
        Slot({"x": torch.tensor([[0.0], [99.0]])}, {}, w, torch.tensor([True, False])),
    ]
    new, _ = rule.mix(state, 0, inbox, rows)
    assert new.x[0].item() == pytest.approx(0.5 * 4.0 + 0.25 * 8.0 + 0.25 * 0.0)
    assert new.x[1].item() == pytest.approx(0.75 * 2.0 + 0.25 * 8.0)


def test_the_peer_form_is_the_rule_on_one_row() -> None:
    """On a peer, a dict inbox missing ``c`` gives what the rule gives a slot not arrived."""
    algo = NodeRule(DPSGD())
    ctx = RoundContext(
        node="a",
        round=0,
        lr=0.0,
        self_weight=0.5,
        out_weights={"b": 0.25, "c": 0.25},
        in_weights={"b": 0.25, "c": 0.25},
    )
    state, outbox = algo.step(algo.init(torch.tensor([4.0])), torch.zeros(1), ctx)
    assert set(outbox) == {"b", "c"} and outbox["b"] is outbox["c"]
    new, _ = algo.mix(state, 0, {"b": Payload({"x": torch.tensor([8.0])})}, ctx)
    assert algo.model(new).item() == pytest.approx(0.75 * 4.0 + 0.25 * 8.0)


def test_dpsgd_refuses_one_way_graph() -> None:
    """A one-way graph given to a doubly-stochastic algorithm names push-sum."""
    with pytest.raises(TopologyError, match="push-sum"):
        communication_graph(NodeRule(DPSGD()), parse_spec("social:16"))


def test_central_gives_every_node_the_exact_mean() -> None:
    graph = parse_spec("social:8")
    params = _params(graph, 7)
    lr = 0.1
    grad = _grad(7)
    expected = torch.stack([params[n] - lr * grad(n, 0, params[n]) for n in graph.nodes]).mean(0)
    out = lockstep(
        NodeRule(Central()),
        communication_graph(NodeRule(Central()), graph),
        params,
        rounds=1,
        lr=lr,
        grad=grad,
    )
    first = out[graph.nodes[0]].x
    assert torch.allclose(first, expected, atol=1e-12)
    assert all(torch.equal(s.x, first) for s in out.values())  # bit-identical


def test_local_is_plain_sgd() -> None:
    graph = parse_spec("ring:4")
    params = _params(graph, 8)
    out = lockstep(
        NodeRule(Local()),
        communication_graph(NodeRule(Local()), graph),
        params,
        rounds=3,
        lr=0.5,
        grad=lambda n, t, x: x,
    )
    for n in graph.nodes:
        assert torch.allclose(out[n].x, params[n] * 0.5**3)


def test_registry_and_options() -> None:
    assert NodeRule(make_algorithm("ops")).name == "ops"
    with pytest.raises(ConfigError, match="known algorithms"):
        make_algorithm("nope")
    with pytest.raises(ConfigError, match="no option"):
        make_algorithm("dpsgd", momentum=0.9)


def test_metropolis_hastings_is_doubly_stochastic() -> None:
    w = prepare(parse_spec("torus:4x4"), mixing="doubly-stochastic", algorithm="dpsgd")
    m = w.mixing_matrix()
    assert np.allclose(m.sum(0), 1) and np.allclose(m.sum(1), 1) and np.allclose(m, m.T)
