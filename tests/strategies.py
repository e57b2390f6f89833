"""Hypothesis strategies: random strongly connected digraphs and symmetric graphs."""

from __future__ import annotations

from hypothesis import strategies as st

from fedcore.topology import TrustGraph


@st.composite
def strongly_connected_digraphs(
    draw: st.DrawFn, min_nodes: int = 3, max_nodes: int = 8
) -> TrustGraph:
    """A random digraph made strongly connected by a random Hamiltonian cycle."""
    n = draw(st.integers(min_nodes, max_nodes))
    order = draw(st.permutations(range(n)))
    edges = {(order[i], order[(i + 1) % n]) for i in range(n)}
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n))
    edges |= {(u, v) for u, v in extra if u != v}
    nodes = [f"n{i}" for i in range(n)]
    return TrustGraph.from_edges(
        [(f"n{u}", f"n{v}") for u, v in sorted(edges)], name=f"random-{n}", nodes=nodes
    )


@st.composite
def connected_undirected_graphs(
    draw: st.DrawFn, min_nodes: int = 3, max_nodes: int = 8
) -> TrustGraph:
    """A random connected undirected graph (each edge both ways): a random tree plus extras."""
    n = draw(st.integers(min_nodes, max_nodes))
    parents = [draw(st.integers(0, i - 1)) for i in range(1, n)]
    pairs = {(i + 1, p) for i, p in enumerate(parents)}
    extra = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n))
    pairs |= {(u, v) for u, v in extra if u != v}
    edges = {(f"n{u}", f"n{v}") for u, v in pairs} | {(f"n{v}", f"n{u}") for u, v in pairs}
    return TrustGraph.from_edges(
        sorted(edges), name=f"undirected-{n}", nodes=[f"n{i}" for i in range(n)]
    )
