"""Tests of the graph generators, build/parse_spec, and the TrustGraph and Schedule classes."""

from __future__ import annotations

import math
import statistics

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.errors import TopologyError
from fedcore.topology import (
    KINDS,
    Schedule,
    TrustGraph,
    build,
    complete,
    erdos_renyi,
    exponential,
    one_peer_exponential,
    parse_spec,
    ring,
    social,
    torus,
)


def out_degrees(g: TrustGraph) -> set[int]:
    return {len(g.out_neighbours(u)) for u in g.nodes}


def in_degrees(g: TrustGraph) -> set[int]:
    return {len(g.in_neighbours(v)) for v in g.nodes}


@pytest.mark.parametrize("n", [2, 3, 8, 17])
def test_ring_is_symmetric_cycle(n: int) -> None:
    g = ring(n)
    assert g.nodes == tuple(f"n{i}" for i in range(n))
    assert g.name == f"ring-{n}"
    expected = 2 if n > 2 else 1
    assert len(g.edges()) == n * expected
    assert out_degrees(g) == in_degrees(g) == {expected}
    assert g.is_symmetric()
    assert g.is_strongly_connected()


def test_directed_ring_is_one_way() -> None:
    g = ring(8, directed=True)
    assert g.name == "directed-ring-8"
    assert len(g.edges()) == 8
    assert out_degrees(g) == in_degrees(g) == {1}
    assert g.out_neighbours("n7") == ("n0",)
    assert not g.is_symmetric()
    assert g.is_strongly_connected()


@pytest.mark.parametrize("n", [2, 5, 10, 16])
def test_exponential_neighbours_at_powers_of_two(n: int) -> None:
    g = exponential(n)
    offsets = [2**k for k in range(n) if 2**k < n]
    assert len(offsets) == math.ceil(math.log2(n))
    for i, u in enumerate(g.nodes):
        expected = {f"n{(i + d) % n}" for d in offsets}
        assert set(g.out_neighbours(u)) == expected
    assert len(g.edges()) == n * len(offsets)
    assert g.is_strongly_connected()


def test_exponential_16_is_one_way() -> None:
    g = exponential(16)
    assert g.out_neighbours("n0") == ("n1", "n2", "n4", "n8")
    assert not g.is_symmetric()


def test_torus_4x4_has_degree_4() -> None:
    g = torus(4, 4)
    assert len(g) == 16
    assert len(g.edges()) == 64
    assert out_degrees(g) == in_degrees(g) == {4}
    assert g.is_symmetric()
    # node r*cols + c: n5 is row 1, column 1
    assert set(g.out_neighbours("n5")) == {"n1", "n9", "n4", "n6"}
    assert set(g.out_neighbours("n0")) == {"n4", "n12", "n1", "n3"}


@pytest.mark.parametrize(("rows", "cols", "degree"), [(2, 5, 3), (5, 2, 3), (2, 2, 2), (3, 3, 4)])
def test_narrow_torus_has_no_duplicates_or_self_loops(rows: int, cols: int, degree: int) -> None:
    g = torus(rows, cols)
    assert len(g) == rows * cols
    assert out_degrees(g) == {degree}
    assert len(g.edges()) == rows * cols * degree
    assert len(set(g.edges())) == len(g.edges())
    assert nx.number_of_selfloops(g.digraph) == 0
    assert g.is_symmetric()


def test_complete() -> None:
    g = complete(5)
    assert len(g.edges()) == 20
    assert out_degrees(g) == {4}
    assert g.is_symmetric()


def test_erdos_renyi_is_seeded_and_unforced() -> None:
    a = erdos_renyi(20, 0.2, seed=1)
    assert a == erdos_renyi(20, 0.2, seed=1)
    assert a.edges() != erdos_renyi(20, 0.2, seed=2).edges()
    assert erdos_renyi(6, 0.0, seed=0).edges() == ()
    assert set(erdos_renyi(6, 1.0, seed=0).edges()) == set(complete(6).edges())
    assert not erdos_renyi(30, 0.02, seed=0).is_strongly_connected()
    with pytest.raises(TopologyError, match="probability p"):
        erdos_renyi(5, 1.5, seed=0)


@pytest.mark.parametrize("n", [2, 3, 8, 32, 100])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_social_is_strongly_connected_and_clean(n: int, seed: int) -> None:
    g = social(n, seed=seed)
    assert g.nodes == tuple(f"n{i}" for i in range(n))
    assert g.is_strongly_connected()
    assert nx.number_of_selfloops(g.digraph) == 0
    if n >= 8:
        assert not g.is_symmetric()


def test_social_is_deterministic_per_seed() -> None:
    assert social(32, seed=0) == social(32, seed=0)
    assert social(32, seed=0).edges() != social(32, seed=1).edges()
    assert social(32, seed=0).name == "social-32"
    assert social(32, seed=3).name == "social-32-seed3"


def test_social_out_degree_is_heavy_tailed() -> None:
    """A few popular peers are trusted by many: max out-degree far above the median."""
    g = social(64, seed=0)
    outs = [len(g.out_neighbours(v)) for v in g.nodes]
    assert max(outs) >= 4 * statistics.median(outs)
    assert max(outs) >= 10


def test_social_every_peer_listens_to_someone() -> None:
    g = social(64, seed=0)
    assert min(len(g.in_neighbours(v)) for v in g.nodes) >= 1
    assert sum(len(g.in_neighbours(v)) >= 2 for v in g.nodes) >= 60


@pytest.mark.parametrize("n", [2, 5, 8, 16])
def test_one_peer_exponential(n: int) -> None:
    s = one_peer_exponential(n)
    k = math.ceil(math.log2(n))
    assert isinstance(s, Schedule)
    assert s.period == k
    for t in range(2 * k):
        g = s.at(t)
        assert g is s.graphs[t % k]
        assert out_degrees(g) == {1}
        for i, u in enumerate(g.nodes):
            assert g.out_neighbours(u) == (f"n{(i + 2 ** (t % k)) % n}",)
    assert s.is_strongly_connected()
    assert set(s.union().edges()) == set(exponential(n).edges())


def test_build_every_kind() -> None:
    for kind in KINDS:
        period = {"period": 3} if kind.startswith("epidemic-") else {}  # no default
        t = build(kind, nodes=16, seed=0, **period)
        server = ("server",) if kind == "star" else ()  # 16 workers and the server
        assert t.nodes == (*(f"n{i}" for i in range(16)), *server)
    assert build("torus", nodes=12, rows=3, cols=4) == torus(3, 4)
    assert build("torus", nodes=12, rows=3) == torus(3, 4)
    assert build("erdos-renyi", nodes=10, seed=4, p=0.5) == erdos_renyi(10, 0.5, seed=4)
    assert build("erdos-renyi", nodes=10) == erdos_renyi(10, 0.3, seed=0)
    assert build("social", nodes=20, seed=2) == social(20, seed=2)
    assert build("directed-ring", nodes=5) == ring(5, directed=True)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"kind": "hypercube", "nodes": 8}, "one-peer-exponential"),
        ({"kind": "ring", "nodes": 8, "p": 0.1}, "Unknown parameter"),
        ({"kind": "torus", "nodes": 12}, "perfect square"),
        ({"kind": "torus", "nodes": 12, "rows": 5}, "multiple of 5"),
        ({"kind": "torus", "nodes": 12, "rows": 3, "cols": 3}, "not 12"),
        ({"kind": "torus", "nodes": 12, "rows": "3", "cols": 4}, "integer"),
        ({"kind": "erdos-renyi", "nodes": 8, "p": "x"}, "number"),
        ({"kind": "ring", "nodes": 1}, "at least 2"),
        ({"kind": "ring", "nodes": True}, "at least 2"),
        ({"kind": "social", "nodes": 8, "seed": -1}, "seed"),
    ],
)
def test_build_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(TopologyError, match=needle):
        build(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("ring:8", ring(8)),
        ("directed-ring:8", ring(8, directed=True)),
        ("exponential:16", exponential(16)),
        ("torus:4x4", torus(4, 4)),
        ("torus:16", torus(4, 4)),
        ("torus:2x3", torus(2, 3)),
        ("complete:5", complete(5)),
        ("social:32", social(32, seed=0)),
        ("social:32:seed=3", social(32, seed=3)),
        ("erdos-renyi:20:p=0.2,seed=1", erdos_renyi(20, 0.2, seed=1)),
        (" ring:4 ", ring(4)),
    ],
)
def test_parse_spec(spec: str, expected: TrustGraph) -> None:
    assert parse_spec(spec) == expected


def test_parse_spec_schedule() -> None:
    assert parse_spec("one-peer-exponential:16") == one_peer_exponential(16)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "ring",
        "ring:",
        "ring:x",
        "ring:8:seed",
        "ring:8:seed=a",
        "cube:8",
        "torus:4xa",
        "a:b:c:d",
    ],
)
def test_parse_spec_errors_show_grammar(spec: str) -> None:
    with pytest.raises(TopologyError, match=r"KIND:NODES\[:KEY=VALUE"):
        parse_spec(spec)


def test_parse_spec_passes_build_errors() -> None:
    with pytest.raises(TopologyError, match="Unknown parameter"):
        parse_spec("ring:8:q=1")


def test_trust_graph_is_immutable_copy() -> None:
    source = nx.DiGraph()
    source.add_edges_from([("a", "b"), ("b", "a")])
    g = TrustGraph(source, name="pair")
    source.add_edge("b", "c")
    assert g.nodes == ("a", "b")
    copy = g.digraph
    copy.add_edge("a", "z")
    assert g.digraph.number_of_nodes() == 2
    with pytest.raises(AttributeError):
        g.name = "other"  # type: ignore[misc]


def test_trust_graph_interface() -> None:
    g = exponential(8)
    assert g.period == 1
    assert g.at(5) is g
    assert g.union() is g
    assert len(g) == 8
    assert g.index("n3") == 3
    assert g.in_neighbours("n0") == ("n4", "n6", "n7")
    assert g.out_neighbours("n0") == ("n1", "n2", "n4")
    assert g.degree_range() == (3, 3, 3, 3)
    assert not g.has_weights()
    assert g.strongly_connected_components() == [list(g.nodes)]
    with pytest.raises(TopologyError, match="no mixing weights"):
        g.weight("n0", "n1")
    with pytest.raises(TopologyError, match="'zz' is not in graph"):
        g.out_neighbours("zz")


def test_trust_graph_rejects_bad_input() -> None:
    with pytest.raises(TopologyError, match="node id 0"):
        TrustGraph(nx.cycle_graph(3), name="ints")
    with pytest.raises(TopologyError, match="whitespace"):
        TrustGraph.from_edges([("a b", "c")], name="space", nodes=["a b", "c"])
    with pytest.raises(TopologyError, match="does not match"):
        TrustGraph(nx.DiGraph([("a", "b")]), name="x", nodes=["a"])
    with pytest.raises(TopologyError, match="multigraph"):
        TrustGraph(nx.MultiDiGraph([("a", "b")]), name="multi")
    with pytest.raises(TopologyError, match="no nodes"):
        TrustGraph(nx.DiGraph(), name="empty")


def test_undirected_networkx_graph_means_both_directions() -> None:
    g = TrustGraph(nx.Graph([("a", "b"), ("b", "c")]), name="path")
    assert set(g.edges()) == {("a", "b"), ("b", "a"), ("b", "c"), ("c", "b")}
    assert g.is_symmetric()


def test_with_weights_checks_keys() -> None:
    g = ring(3, directed=True)
    weights = {("n0", "n1"): 0.5, ("n1", "n2"): 0.5, ("n2", "n0"): 0.5}
    weights |= {(u, u): 0.5 for u in g.nodes}
    w = g.with_weights(weights)
    assert w.has_weights()
    assert w.weight("n0", "n1") == 0.5
    assert w.weight("n1", "n0") == 0.0
    assert w.self_weight("n2") == 0.5
    assert w.out_weights("n0") == {"n1": 0.5}
    assert w.in_weights("n0") == {"n2": 0.5}
    assert not g.has_weights()
    with pytest.raises(TopologyError, match="no such edge"):
        g.with_weights({**weights, ("n1", "n0"): 0.1})
    with pytest.raises(TopologyError, match="No weight was given"):
        g.with_weights({("n0", "n1"): 1.0})
    with pytest.raises(TopologyError, match="non-negative"):
        g.with_weights({**weights, ("n0", "n1"): -0.5})
    with pytest.raises(TopologyError, match="finite"):
        g.with_weights({**weights, ("n0", "n1"): math.nan})


def test_schedule_checks_node_lists() -> None:
    with pytest.raises(TopologyError, match="no graphs"):
        Schedule([], name="empty")
    with pytest.raises(TopologyError, match="same nodes"):
        Schedule([ring(3), ring(4)], name="mixed")
    s = Schedule([ring(4, directed=True)], name="one")
    assert s.period == 1
    assert s.at(7) == ring(4, directed=True)
    assert s.index("n2") == 2


def test_star_is_the_server_and_its_workers_both_ways() -> None:
    g = build("star", nodes=3, server="ps")
    assert g.nodes == ("n0", "n1", "n2", "ps")
    assert set(g.edges()) == {(w, "ps") for w in ("n0", "n1", "n2")} | {
        ("ps", w) for w in ("n0", "n1", "n2")
    }
    assert parse_spec("star:2:server=hub").nodes == ("n0", "n1", "hub")
    with pytest.raises(TopologyError, match="worker's name"):
        build("star", nodes=3, server="n2")
    with pytest.raises(TopologyError, match="not a safe name"):
        build("star", nodes=3, server="a/b")


@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40),
        )
    ),
    st.integers(1, 64),
)
@settings(max_examples=300, deadline=None)
def test_the_quick_reachability_check_agrees_with_the_components(
    graph: tuple[int, list[tuple[int, int]]], levels: int
) -> None:
    """Strong connectivity by two breadth-first searches (no scipy import) says what
    scipy's components say, or leaves the answer to them (a search past ``levels``)."""
    from fedcore.topology.graph import TrustGraph

    n, pairs = graph
    nodes = [f"p{i}" for i in range(n)]
    t = TrustGraph.from_edges(
        sorted({(nodes[u], nodes[v]) for u, v in pairs}), name="g", nodes=nodes
    )
    quick = t._reaches_all(levels=levels)
    if quick is not None:
        assert quick == (t._components()[0] == 1)
    assert t.is_strongly_connected() == (t._components()[0] == 1)
