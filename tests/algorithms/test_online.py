"""DOG and DOL, the online baselines of the DOG and OPS papers (reference/algorithms.md 1.5-1.7, 2).

DOG is D-PSGD under another name, so its invariants (I-DOG-1..4) run here for both registry
names; DOL is push-sum mixing without de-biasing (the OPS paper's "DOL-asymm"), checked
against OPS (I-OPS-2, I-OPS-3) and against the LOCAL and CENTRAL (COL) reference points.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import (
    DOG,
    DOL,
    DPSGD,
    OPS,
    Algorithm,
    Central,
    Local,
    RoundContext,
    make_algorithm,
)
from fedcore.algorithms.dpsgd import DPSGDRule
from fedcore.algorithms.online import DOGRule, DOLRule
from fedcore.errors import TopologyError
from fedcore.messages import Payload
from fedcore.node import NodeRule
from fedcore.setup.graph import communication_graph
from fedcore.testing import lockstep, make_network
from fedcore.topology import (
    Topology,
    TrustGraph,
    metropolis_hastings,
    parse_spec,
    prepare,
    ring,
    spectral_gap,
)
from fedcore.topology.weights import check_push_sum
from tests.strategies import (
    GradFn,
    connected_undirected_graphs,
    random_grad,
    random_params,
    strongly_connected_digraphs,
)

D = 3
CTA = ["dog", "dpsgd"]
"""Combine-then-adapt registry names: DOG is D-PSGD, so every I-DOG test runs on both."""


def _params(graph: Topology, seed: int, offset: float = 0.0) -> dict[str, torch.Tensor]:
    return {n: p + offset for n, p in random_params(graph, seed, D).items()}


def _grad(seed: int) -> GradFn:
    """Affine gradients with a common Hessian (0.3 I) plus per-node, per-round noise."""
    return random_grad(seed, D, pull=0.3)


def _nonlinear_grad(node: str, t: int, x: torch.Tensor) -> torch.Tensor:
    """A gradient that is not affine, so equal trajectories are not a linearity accident."""
    return torch.tanh(x) + 0.1 * (t + 1) * float(node[1:])


def _drops(seed: int, rate: float) -> Callable[[str, str, int, int], bool]:
    """A seeded message-loss plan for lockstep's ``drop``."""

    def drop(sender: str, receiver: str, t: int, phase: int) -> bool:
        key = zlib.crc32(f"{seed}:{sender}:{receiver}:{t}:{phase}".encode())
        return key % 1000 < rate * 1000

    return drop


def _stack(states: dict[str, object], algorithm: Algorithm, nodes: tuple[str, ...]) -> torch.Tensor:
    return torch.stack([algorithm.model(states[n]) for n in nodes])


def _one_round(
    algorithm: Algorithm,
    graph: Topology,
    states: dict[str, object],
    t: int,
    lr: float,
    grad: GradFn,
) -> dict[str, object]:
    """Round ``t`` of lockstep from ``states`` (lockstep counts rounds from 0 per call)."""
    return lockstep(
        algorithm,
        graph,
        {},
        rounds=1,
        lr=lr,
        grad=lambda n, _t, m: grad(n, t, m),
        states=states,
    )


# --- DOG ------------------------------------------------------------------------------------


@given(connected_undirected_graphs(), st.integers(0, 1000), st.booleans())
@settings(max_examples=20)
def test_dog_equals_dpsgd_step_for_step(graph: TrustGraph, seed: int, lossy: bool) -> None:
    """DOG's iterates are D-PSGD's, bit for bit, with or without lost messages."""
    weighted = metropolis_hastings(graph)
    params = _params(graph, seed)
    drop = _drops(seed, 0.3) if lossy else None
    kwargs: dict[str, Any] = {"rounds": 8, "lr": 0.1, "grad": _nonlinear_grad, "drop": drop}
    dog = lockstep(NodeRule(DOG()), weighted, params, **kwargs)
    dpsgd = lockstep(NodeRule(DPSGD()), weighted, params, **kwargs)
    for n in graph.nodes:
        assert torch.equal(dog[n].x, dpsgd[n].x)


@pytest.mark.parametrize("name", CTA)
@given(graph=connected_undirected_graphs(), seed=st.integers(0, 1000))
@settings(max_examples=15)
def test_mean_dynamics(name: str, graph: TrustGraph, seed: int) -> None:
    """I-DOG-1: doubly stochastic W gives x_bar(t+1) = x_bar(t) - lr * mean_i g_i(x_i(t))."""
    algo = NodeRule(make_algorithm(name))
    weighted = metropolis_hastings(graph)
    lr, grad = 0.05, _grad(seed)
    states: dict[str, object] = {n: algo.init(p) for n, p in _params(graph, seed).items()}
    for t in range(6):
        mean_before = _stack(states, algo, graph.nodes).mean(0)
        mean_grad = torch.stack([grad(n, t, algo.model(states[n])) for n in graph.nodes]).mean(0)
        states = _one_round(algo, weighted, states, t, lr, grad)
        mean_after = _stack(states, algo, graph.nodes).mean(0)
        assert torch.allclose(mean_after, mean_before - lr * mean_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", CTA)
@given(graph=connected_undirected_graphs(), seed=st.integers(0, 1000))
@settings(max_examples=15)
def test_disagreement_contracts_by_rho_and_vanishes(
    name: str, graph: TrustGraph, seed: int
) -> None:
    """I-DOG-2: lr = 0 shrinks ||X - x_bar 1^T|| by at least rho per round, down to 0."""
    algo = NodeRule(make_algorithm(name))
    weighted = metropolis_hastings(graph)
    rho = 1.0 - spectral_gap(weighted)  # max(|lambda_2|, |lambda_n|) of the symmetric W
    assert rho < 1.0
    params = _params(graph, seed)
    mean = torch.stack(list(params.values())).mean(0)

    def disagreement(states: dict[str, object]) -> float:
        return float((_stack(states, algo, graph.nodes) - mean).norm())

    states: dict[str, object] = {n: algo.init(p) for n, p in params.items()}
    start = disagreement(states)
    for _ in range(10):
        before = disagreement(states)
        states = lockstep(algo, weighted, {}, rounds=1, states=states)
        assert disagreement(states) <= rho * before + 1e-12
    # Converges: after enough rounds for rho^T < 1e-9, the disagreement is (nearly) gone.
    more = max(1, math.ceil(math.log(1e-9) / math.log(rho))) if rho > 0 else 1
    states = lockstep(algo, weighted, {}, rounds=more, states=states)
    assert disagreement(states) <= 1e-9 * start + 1e-12


@pytest.mark.parametrize("name", CTA)
def test_uniform_weights_give_cta_mean_and_col_mean(name: str) -> None:
    """I-DOG-3, W = 11^T/n: x_i(t+1) = mean_j x_j(t) - lr g_i(x_i(t)); the mean tracks COL.

    With losses that share one Hessian (here 0.3 I; gradients differ by per-node noise), the
    mean gradient at the nodes' models equals the mean gradient at their mean, so DOG's
    mean follows CENTRAL's (COL's) common model step for step.
    """
    algo = NodeRule(make_algorithm(name))
    graph = parse_spec("social:6")
    uniform = prepare(graph, mixing="complete", algorithm=name)
    lr, grad = 0.2, _grad(11)
    params = _params(graph, 11)
    states: dict[str, object] = {n: algo.init(p) for n, p in params.items()}
    central: dict[str, object] = {n: NodeRule(Central()).init(p) for n, p in params.items()}
    for t in range(6):
        x = {n: algo.model(states[n]) for n in graph.nodes}
        mean = torch.stack(list(x.values())).mean(0)
        states = _one_round(algo, uniform, states, t, lr, grad)
        central = _one_round(NodeRule(Central()), uniform, central, t, lr, grad)
        col = NodeRule(Central()).model(central[graph.nodes[0]])
        for n in graph.nodes:
            expected = mean - lr * grad(n, t, x[n])
            assert torch.allclose(algo.model(states[n]), expected, rtol=0, atol=1e-12)
        assert torch.allclose(_stack(states, algo, graph.nodes).mean(0), col, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", CTA)
def test_identity_weights_give_local(name: str) -> None:
    """I-DOG-3, W = I: independent local online gradient, bit for bit ``local``."""
    algo = NodeRule(make_algorithm(name))
    graph = parse_spec("ring:5")
    isolated = prepare(graph, mixing="none", algorithm=name)
    params = _params(graph, 3)
    kwargs: dict[str, Any] = {"rounds": 7, "lr": 0.3, "grad": _nonlinear_grad}
    ours = lockstep(algo, isolated, params, **kwargs)
    local = lockstep(NodeRule(Local()), isolated, params, **kwargs)
    for n in graph.nodes:
        assert torch.equal(algo.model(ours[n]), NodeRule(Local()).model(local[n]))


def _quadratic_case() -> tuple[TrustGraph, np.ndarray, dict[str, torch.Tensor], GradFn]:
    """f_i(x) = a_i ||x - c_i||^2 / 2 on a 5-ring with Metropolis-Hastings weights (1/3)."""
    graph = metropolis_hastings(parse_spec("ring:5"))
    assert isinstance(graph, TrustGraph)
    w = graph.mixing_matrix()  # w[i, j]: share of node i's value node j receives
    curv = {n: 0.5 + 0.4 * i for i, n in enumerate(graph.nodes)}
    target = {
        n: torch.full((D,), float(3 * i - 4), dtype=torch.float64)
        for i, n in enumerate(graph.nodes)
    }

    def grad(node: str, t: int, x: torch.Tensor) -> torch.Tensor:
        return curv[node] * (x - target[node])

    return graph, w, _params(graph, 5), grad


def _formula(
    graph: TrustGraph,
    w: np.ndarray,
    x0: dict[str, torch.Tensor],
    grad: GradFn,
    lr: float,
    rounds: int,
    cta: bool,
) -> torch.Tensor:
    """Rows are nodes: CTA X <- W^T X - lr G(X); ATC X <- W^T (X - lr G(X))."""
    wt = torch.from_numpy(w.T.copy())
    x = torch.stack([x0[n] for n in graph.nodes])
    for t in range(rounds):
        g = torch.stack([grad(n, t, x[i]) for i, n in enumerate(graph.nodes)])
        x = wt @ x - lr * g if cta else wt @ (x - lr * g)
    return x


@pytest.mark.parametrize("name", CTA)
def test_gradient_at_pre_mix_model(name: str) -> None:
    """I-DOG-4: a quadratic tells combine-then-adapt from adapt-then-combine; DOG is CTA."""
    algo = NodeRule(make_algorithm(name))
    graph, w, params, grad = _quadratic_case()
    lr, rounds = 0.4, 3
    out = lockstep(algo, graph, params, rounds=rounds, lr=lr, grad=grad)
    got = _stack(out, algo, graph.nodes)
    cta = _formula(graph, w, params, grad, lr, rounds, cta=True)
    atc = _formula(graph, w, params, grad, lr, rounds, cta=False)
    assert torch.allclose(got, cta, rtol=0, atol=1e-12)
    assert (got - atc).abs().max() > 1e-2


def test_dol_is_adapt_then_combine() -> None:
    """The same quadratic: DOL on the same (doubly stochastic) W follows the ATC formula."""
    graph, w, params, grad = _quadratic_case()
    lr, rounds = 0.4, 3
    out = lockstep(NodeRule(DOL()), graph, params, rounds=rounds, lr=lr, grad=grad)
    got = _stack(out, NodeRule(DOL()), graph.nodes)
    assert torch.allclose(got, _formula(graph, w, params, grad, lr, rounds, cta=False), atol=1e-12)
    assert (got - _formula(graph, w, params, grad, lr, rounds, cta=True)).abs().max() > 1e-2


def test_dog_refuses_one_way_graph() -> None:
    """DOG needs doubly stochastic weights: a one-way graph is refused, naming push-sum."""
    with pytest.raises(TopologyError, match=r"'dog'.*push-sum"):
        communication_graph(NodeRule(DOG()), parse_spec("social:8"))


# --- DOL ------------------------------------------------------------------------------------


def _perron(graph: Topology) -> np.ndarray:
    """The Perron vector pi of a push-sum W (pi^T W = pi^T, sum pi = 1)."""
    assert isinstance(graph, TrustGraph)
    vals, vecs = np.linalg.eig(graph.mixing_matrix().T)
    pi = np.abs(np.real(vecs[:, np.argmax(np.real(vals))]))
    return np.asarray(pi / pi.sum())


def _chorded_ring() -> TrustGraph:
    """A directed 6-ring plus the one-way chord n0 -> n3."""
    edges = [(f"n{i}", f"n{(i + 1) % 6}") for i in range(6)] + [("n0", "n3")]
    return TrustGraph.from_edges(edges, name="chorded-ring-6", nodes=[f"n{i}" for i in range(6)])


@pytest.mark.parametrize(
    "graph",
    [_chorded_ring(), parse_spec("social:16"), parse_spec("social:8:seed=2")],
    ids=lambda g: g.name,
)
def test_dol_is_biased_where_ops_is_exact(graph: TrustGraph) -> None:
    """I-OPS-2 and I-OPS-3 on one non-doubly-stochastic W, lr = 0.

    OPS's de-biased z reaches the uniform average (1e-8). DOL keeps the average of its
    models exactly (every sender splits all of its model), but each model tends to
    n * pi_i * mean(x_0): scaled by its Perron weight, measurably not the average.
    """
    weighted = prepare(graph, mixing="push-sum", algorithm="dol")
    n = len(graph)
    pi = _perron(weighted)
    assert np.abs(n * pi - 1).max() > 0.1  # W is far from doubly stochastic
    params = _params(graph, 0, offset=2.0)  # mean far from 0, so a scaling shows
    mean = torch.stack(list(params.values())).mean(0)
    dol = lockstep(NodeRule(DOL()), weighted, params, rounds=1500)
    ops = lockstep(NodeRule(OPS()), weighted, params, rounds=1500)
    for n_id in graph.nodes:
        assert (NodeRule(OPS()).model(ops[n_id]) - mean).abs().max() < 1e-8
    x = _stack(dol, NodeRule(DOL()), graph.nodes)
    limit = torch.from_numpy(n * pi)[:, None] * mean
    assert (x - limit).abs().max() < 1e-8
    assert torch.allclose(x.mean(0), mean, rtol=0, atol=1e-12)
    assert (x - mean).abs().max() > 0.1


@given(strongly_connected_digraphs(), st.integers(0, 1000))
@settings(max_examples=20)
def test_dol_is_ops_numerator_without_step(graph: TrustGraph, seed: int) -> None:
    """lr = 0: DOL's model is OPS's numerator x, bit for bit (DOL = OPS minus z = x/omega)."""
    weighted = prepare(graph, mixing="push-sum", algorithm="dol")
    params = _params(graph, seed)
    dol = lockstep(NodeRule(DOL()), weighted, params, rounds=30)
    ops = lockstep(NodeRule(OPS()), weighted, params, rounds=30)
    for n in graph.nodes:
        assert torch.equal(dol[n].x, ops[n].x)


@given(strongly_connected_digraphs(), st.integers(0, 1000), st.randoms(use_true_random=False))
@settings(max_examples=20)
def test_dol_average_takes_the_central_step(
    graph: TrustGraph, seed: int, rnd: random.Random
) -> None:
    """On any push-sum W: mean x(t+1) = mean x(t) - lr * mean_i g_i(x_i(t)); order-free."""
    weighted = prepare(graph, mixing="push-sum", algorithm="dol")
    lr, grad = 0.1, _grad(seed)
    states: dict[str, object] = {
        n: NodeRule(DOL()).init(p) for n, p in _params(graph, seed).items()
    }
    order = list(graph.nodes)
    rnd.shuffle(order)
    for t in range(8):
        mean_before = _stack(states, NodeRule(DOL()), graph.nodes).mean(0)
        mean_grad = torch.stack(
            [grad(n, t, NodeRule(DOL()).model(states[n])) for n in graph.nodes]
        ).mean(0)
        shuffled = lockstep(
            NodeRule(DOL()),
            weighted,
            {},
            rounds=1,
            lr=lr,
            grad=lambda n, _t, m, t=t: grad(n, t, m),
            states=states,
            order=order,
        )
        states = _one_round(NodeRule(DOL()), weighted, states, t, lr, grad)
        for n in graph.nodes:
            assert torch.equal(shuffled[n].x, states[n].x)  # messages are snapshots
        mean_after = _stack(states, NodeRule(DOL()), graph.nodes).mean(0)
        assert torch.allclose(mean_after, mean_before - lr * mean_grad, rtol=0, atol=1e-12)


def _kite() -> TrustGraph:
    """An irregular undirected graph: the path n0-n1-n2-n3-n4 plus the chord n1-n3."""
    pairs = [(0, 1), (1, 2), (2, 3), (3, 4), (1, 3)]
    edges = [(f"n{u}", f"n{v}") for u, v in pairs] + [(f"n{v}", f"n{u}") for u, v in pairs]
    return TrustGraph.from_edges(edges, name="kite-5", nodes=[f"n{i}" for i in range(5)])


@pytest.mark.parametrize(
    "graph",
    [
        prepare(ring(7, directed=True), mixing="push-sum", algorithm="dol"),  # 1/2, 1/2
        prepare(parse_spec("ring:6"), mixing="push-sum", algorithm="dol"),  # 1/3 each
        metropolis_hastings(_kite()),  # irregular undirected graph: DOL-symm
    ],
    ids=lambda g: g.name,
)
def test_dol_equals_ops_on_doubly_stochastic_weights(graph: TrustGraph) -> None:
    """DOL-symm: with doubly stochastic weights OPS's omega stays 1 and DOL is OPS."""
    check_push_sum(graph)
    params = _params(graph, 4)
    kwargs: dict[str, Any] = {"rounds": 10, "lr": 0.2, "grad": _nonlinear_grad}
    dol = lockstep(NodeRule(DOL()), graph, params, **kwargs)
    ops = lockstep(NodeRule(OPS()), graph, params, **kwargs)
    for n in graph.nodes:
        assert torch.allclose(dol[n].x, NodeRule(OPS()).model(ops[n]), rtol=0, atol=1e-12)


def test_dol_identity_is_local_and_complete_is_central() -> None:
    """I-OPS-5 for DOL: W = I is LOCAL (bit for bit); W = 11^T/n is CENTRAL (COL)."""
    graph = parse_spec("social:6")
    params = _params(graph, 6)
    kwargs: dict[str, Any] = {"rounds": 6, "lr": 0.3, "grad": _nonlinear_grad}
    isolated = prepare(graph, mixing="none", algorithm="dol")
    uniform = prepare(graph, mixing="complete", algorithm="dol")
    dol_i = lockstep(NodeRule(DOL()), isolated, params, **kwargs)
    local = lockstep(NodeRule(Local()), isolated, params, **kwargs)
    dol_c = lockstep(NodeRule(DOL()), uniform, params, **kwargs)
    central = lockstep(NodeRule(Central()), uniform, params, **kwargs)
    for n in graph.nodes:
        assert torch.equal(NodeRule(DOL()).model(dol_i[n]), NodeRule(Local()).model(local[n]))
        assert torch.allclose(NodeRule(DOL()).model(dol_c[n]), central[n].x, rtol=0, atol=1e-12)


def test_dol_lost_share_is_lost() -> None:
    """A missing message is simply absent: its share is lost and sum x drops by it."""
    graph = prepare(parse_spec("directed-ring:4"), mixing="push-sum", algorithm="dol")
    params = _params(graph, 7)
    out = lockstep(NodeRule(DOL()), graph, params, rounds=1, drop=lambda s, r, t, p: s == "n0")
    assert torch.equal(
        NodeRule(DOL()).model(out["n1"]), 0.5 * params["n1"]
    )  # only its own kept half
    lost = 0.5 * params["n0"]
    total = sum(params.values())
    kept = sum(NodeRule(DOL()).model(s) for s in out.values())
    assert torch.allclose(kept, total - lost, rtol=0, atol=1e-12)


def test_dol_mix_by_hand() -> None:
    """Own share plus the arrived x-shares; the omega scalar of the message is ignored."""
    ctx = RoundContext(
        node="a",
        round=0,
        lr=0.5,
        self_weight=0.25,
        out_weights={"b": 0.75},
        in_weights={"b": 0.5, "c": 0.5},
    )
    state = NodeRule(DOL()).init(torch.tensor([2.0], dtype=torch.float64))
    stepped, outbox = NodeRule(DOL()).step(state, torch.tensor([2.0], dtype=torch.float64), ctx)
    assert stepped.x.item() == pytest.approx(1.0)  # adapt first: x - lr * g
    assert outbox["b"].tensor("x").item() == pytest.approx(0.75)
    share = Payload({"x": torch.tensor([4.0], dtype=torch.float64)}, {"omega": 123.0})
    new, out = NodeRule(DOL()).mix(stepped, 0, {"b": share}, ctx)
    assert out == {}
    assert new.x.item() == pytest.approx(0.25 * 1.0 + 4.0)


# --- registry and graphs --------------------------------------------------------------------


def test_registry() -> None:
    dog, dol = NodeRule(make_algorithm("dog")), NodeRule(make_algorithm("dol"))
    assert isinstance(dog.rule, DOGRule) and isinstance(dog.rule, DPSGDRule)
    assert isinstance(dol.rule, DOLRule)
    assert (dog.name, dog.mixing, dog.phases) == ("dog", "doubly-stochastic", 1)
    assert (dol.name, dol.mixing, dol.phases) == ("dol", "push-sum", 1)
    assert DPSGD.name == "dpsgd"  # the subclass renames only itself


def test_dol_accepts_one_way_graph() -> None:
    """DOL gets uniform push-sum weights on a one-way graph (not doubly stochastic)."""
    weighted = communication_graph(NodeRule(DOL()), parse_spec("social:16"))
    assert isinstance(weighted, TrustGraph)
    check_push_sum(weighted)
    assert not np.allclose(weighted.mixing_matrix().sum(axis=0), 1.0)


@pytest.mark.parametrize(("name", "spec"), [("dog", "ring:6"), ("dol", "social:6")])
def test_runs_in_a_network(name: str, spec: str) -> None:
    """A short in-process run through the node and transport: finite models, right senders."""
    net = make_network(spec, algorithm=name, settings={"algorithm.lr": 0.1}).run(2)
    assert net.round == 2
    assert all(torch.isfinite(m).all() for m in net.models().values())
    assert all(m.sender in net.graph.in_neighbours(m.receiver) for m in net.messages)
