"""Tests of mixing weights, prepare(), spectral_gap() and describe()."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.errors import TopologyError
from fedcore.topology import (
    Schedule,
    TrustGraph,
    complete,
    describe,
    erdos_renyi,
    exponential,
    metropolis_hastings,
    one_peer_exponential,
    prepare,
    ring,
    social,
    spectral_gap,
    torus,
    uniform_push_sum,
)


@st.composite
def strongly_connected_digraphs(draw: st.DrawFn) -> TrustGraph:
    """A random digraph on 2-12 nodes: a shuffled Hamiltonian cycle plus random extra edges."""
    n = draw(st.integers(min_value=2, max_value=12))
    nodes = [f"n{i}" for i in range(n)]
    order = draw(st.permutations(nodes))
    edges = {(order[i], order[(i + 1) % n]) for i in range(n)}
    pairs = [(u, v) for u in nodes for v in nodes if u != v]
    extra = draw(st.lists(st.sampled_from(pairs), max_size=3 * n))
    return TrustGraph.from_edges(sorted(edges | set(extra)), name="random", nodes=nodes)


@st.composite
def connected_undirected_graphs(draw: st.DrawFn) -> TrustGraph:
    """A random connected undirected graph on 2-12 nodes: a random tree plus extra edges."""
    n = draw(st.integers(min_value=2, max_value=12))
    nodes = [f"n{i}" for i in range(n)]
    pairs = {(nodes[i], nodes[draw(st.integers(0, i - 1))]) for i in range(1, n)}
    all_pairs = [(u, v) for i, u in enumerate(nodes) for v in nodes[i + 1 :]]
    pairs |= set(draw(st.lists(st.sampled_from(all_pairs), max_size=2 * n)))
    edges = pairs | {(v, u) for u, v in pairs}
    return TrustGraph.from_edges(sorted(edges), name="random-undirected", nodes=nodes)


def as_graph(t: object) -> TrustGraph:
    assert isinstance(t, TrustGraph)
    return t


@settings(max_examples=60, deadline=None)
@given(strongly_connected_digraphs())
def test_push_sum_weights_sum_to_one_per_sender(g: TrustGraph) -> None:
    w = as_graph(uniform_push_sum(g))
    assert w.edges() == g.edges()
    matrix = w.mixing_matrix()
    assert matrix.dtype == np.float64
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, atol=1e-12)
    for u in w.nodes:
        assert w.self_weight(u) > 0
        assert math.isclose(w.self_weight(u) + sum(w.out_weights(u).values()), 1.0)
    # mixing preserves the total mass: x_new = W.T @ x
    x = np.arange(len(w), dtype=np.float64)
    assert math.isclose(float((matrix.T @ x).sum()), float(x.sum()))
    prepared = as_graph(prepare(g, mixing="push-sum", algorithm="ops"))
    assert prepared == w
    assert prepare(w, mixing="push-sum", algorithm="ops") is w


@settings(max_examples=60, deadline=None)
@given(connected_undirected_graphs())
def test_metropolis_hastings_is_symmetric_and_doubly_stochastic(g: TrustGraph) -> None:
    w = as_graph(metropolis_hastings(g))
    matrix = w.mixing_matrix()
    np.testing.assert_allclose(matrix, matrix.T, atol=1e-15)
    np.testing.assert_allclose(matrix.sum(axis=0), 1.0, atol=1e-12)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, atol=1e-12)
    assert (matrix >= 0).all()
    assert all(w.self_weight(u) > 0 for u in w.nodes)
    assert prepare(g, mixing="doubly-stochastic", algorithm="dpsgd") == w
    assert 0.0 < spectral_gap(g) <= 1.0


def test_metropolis_hastings_values() -> None:
    w = as_graph(metropolis_hastings(ring(8)))
    assert w.weight("n0", "n1") == pytest.approx(1 / 3)
    assert w.self_weight("n0") == pytest.approx(1 / 3)
    star = TrustGraph(nx.star_graph(["hub", "a", "b", "c"]), name="star")
    ws = as_graph(metropolis_hastings(star))
    assert ws.weight("hub", "a") == pytest.approx(1 / 4)
    assert ws.self_weight("hub") == pytest.approx(1 / 4)
    assert ws.self_weight("a") == pytest.approx(3 / 4)


def test_metropolis_hastings_refuses_one_way_graphs() -> None:
    with pytest.raises(TopologyError, match="push-sum") as info:
        metropolis_hastings(ring(5, directed=True))
    assert "n0 -> n1 has no n1 -> n0" in str(info.value)


def test_doubly_stochastic_prepare_names_the_one_way_edge() -> None:
    with pytest.raises(TopologyError) as info:
        prepare(social(16, seed=0), mixing="doubly-stochastic", algorithm="dpsgd")
    message = str(info.value)
    assert "algorithm 'dpsgd' needs an undirected (symmetric) trust graph" in message
    assert "graph 'social-16' is one-way: " in message
    assert "Use a push-sum algorithm such as 'ops' on one-way graphs." in message


def test_not_strongly_connected_error_names_components() -> None:
    edges = [("n0", "n1"), ("n1", "n0"), ("n1", "n2"), ("n3", "n4"), ("n4", "n3"), ("n2", "n3")]
    g = TrustGraph.from_edges(edges, name="x", nodes=[f"n{i}" for i in range(5)])
    assert g.strongly_connected_components() == [["n0", "n1"], ["n2"], ["n3", "n4"]]
    for mixing in ("push-sum", "doubly-stochastic"):
        sym = (
            g if mixing == "push-sum" else TrustGraph(nx.Graph([("a", "b"), ("c", "d")]), name="x")
        )
        with pytest.raises(TopologyError, match="graph 'x' is not strongly connected") as info:
            prepare(sym, mixing=mixing, algorithm="alg")
        assert "every peer's model must be able to reach every other peer" in str(info.value)
    with pytest.raises(TopologyError) as info:
        prepare(g, mixing="push-sum", algorithm="ops")
    assert "3 strongly connected components: [n0, n1], [n2], [n3, n4];" in str(info.value)


def test_long_component_listings_are_truncated() -> None:
    with pytest.raises(TopologyError) as info:
        prepare(erdos_renyi(50, 0.0, seed=0), mixing="push-sum", algorithm="ops")
    message = str(info.value)
    assert "50 strongly connected components" in message
    assert "(+40 more components)" in message
    assert len(message) < 600


def test_schedule_weights_and_connectivity() -> None:
    s = one_peer_exponential(8)
    prepared = prepare(s, mixing="push-sum", algorithm="ops")
    assert isinstance(prepared, Schedule)
    assert prepared.period == 3
    for g in prepared.graphs:
        assert all(g.self_weight(u) == 0.5 for u in g.nodes)
        assert all(list(g.out_weights(u).values()) == [0.5] for u in g.nodes)
    with pytest.raises(TopologyError, match="one-way"):
        prepare(s, mixing="doubly-stochastic", algorithm="dpsgd")
    half = TrustGraph.from_edges([("n0", "n1")], name="half", nodes=["n0", "n1", "n2"])
    other = TrustGraph.from_edges([("n1", "n0")], name="half", nodes=["n0", "n1", "n2"])
    broken = Schedule([half, other], name="broken")
    with pytest.raises(TopologyError, match="union of the rounds of one period"):
        prepare(broken, mixing="push-sum", algorithm="ops")


def test_prepare_checks_given_push_sum_weights() -> None:
    g = ring(3, directed=True)
    good = dict.fromkeys(g.edges(), 0.5) | {(u, u): 0.5 for u in g.nodes}
    assert prepare(g.with_weights(good), mixing="push-sum", algorithm="ops").has_weights()
    with pytest.raises(TopologyError, match=r"sum to 0\.9"):
        prepare(g.with_weights({**good, ("n1", "n1"): 0.4}), mixing="push-sum", algorithm="ops")
    no_self = {**good, ("n0", "n1"): 1.0, ("n0", "n0"): 0.0}
    with pytest.raises(TopologyError, match="positive self weight"):
        prepare(g.with_weights(no_self), mixing="push-sum", algorithm="ops")


def test_prepare_checks_given_doubly_stochastic_weights() -> None:
    g = ring(4)
    lazy = dict.fromkeys(g.edges(), 0.25) | {(u, u): 0.5 for u in g.nodes}
    assert prepare(g.with_weights(lazy), mixing="doubly-stochastic", algorithm="dpsgd")
    bad = {**lazy, ("n0", "n1"): 0.5, ("n0", "n0"): 0.25}  # rows sum to 1, n0 receives 0.75
    with pytest.raises(TopologyError, match=r"node n0 receives, self included, sum to 0\.75"):
        prepare(g.with_weights(bad), mixing="doubly-stochastic", algorithm="dpsgd")


def test_prepare_none_complete_and_unknown_mixing() -> None:
    g = erdos_renyi(5, 0.0, seed=0)
    isolated = prepare(g, mixing="none", algorithm="local")
    assert isolated.nodes == g.nodes and isolated.edges() == ()
    assert all(isolated.self_weight(u) == 1.0 for u in g.nodes)
    full = prepare(g, mixing="complete", algorithm="central")
    assert isinstance(full, TrustGraph)
    assert len(full.edges()) == 20
    assert full.mixing_matrix() == pytest.approx(0.2)
    with pytest.raises(TopologyError, match="unknown mixing 'gossip'"):
        prepare(g, mixing="gossip", algorithm="x")


@pytest.mark.parametrize("n", [3, 5, 8, 13])
def test_spectral_gap_of_ring_matches_closed_form(n: int) -> None:
    moduli = sorted(abs(1 / 3 + 2 / 3 * math.cos(2 * math.pi * k / n)) for k in range(n))
    expected = 1 - moduli[-2]
    assert spectral_gap(ring(n)) == pytest.approx(expected, abs=1e-12)
    assert spectral_gap(metropolis_hastings(ring(n))) == pytest.approx(expected, abs=1e-12)


def test_spectral_gap_known_values() -> None:
    assert spectral_gap(metropolis_hastings(complete(6))) == pytest.approx(1.0, abs=1e-12)
    assert spectral_gap(ring(8, directed=True)) == pytest.approx(1 - math.cos(math.pi / 8))
    assert spectral_gap(one_peer_exponential(16)) == 1.0
    assert spectral_gap(exponential(16)) == pytest.approx(0.4)
    assert spectral_gap(erdos_renyi(6, 0.0, seed=0)) == 0.0
    assert 0.0 < spectral_gap(one_peer_exponential(10)) < 1.0


def test_describe_graph_and_schedule() -> None:
    text = describe(torus(4, 4))
    assert "name: torus-4x4" in text
    assert "directed: no" in text
    assert "nodes: 16 (n0, n1" in text
    assert "edges: 64 directed (32 undirected pairs)" in text
    assert "strongly connected: yes" in text
    assert "in-degree: 4..4, out-degree: 4..4" in text
    assert "spectral gap: 0.400000" in text
    assert "weights: none" in text
    text = describe(one_peer_exponential(16))
    assert "repeating every 4 rounds" in text
    assert "directed: yes" in text
    assert "spectral gap: 1.000000 per round" in text
    text = describe(erdos_renyi(30, 0.0, seed=0))
    assert "strongly connected: no, 30 components" in text
    assert "(+22 more)" in text
    assert "valid as push-sum and doubly stochastic" in describe(metropolis_hastings(ring(5)))
    assert "not computed" in describe(ring(30), gap_max_nodes=10)
