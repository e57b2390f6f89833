"""Hypothesis strategies (random strongly connected digraphs, symmetric graphs) and helpers."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
from hypothesis import strategies as st

from fedcore.topology import Topology, TrustGraph

GradFn = Callable[[str, int, torch.Tensor], torch.Tensor]


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


def random_params(graph: Topology, seed: int, dim: int) -> dict[str, torch.Tensor]:
    """Seeded float64 starting points, one per node."""
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(dim, generator=gen, dtype=torch.float64) for n in graph.nodes}


def random_grad(seed: int, dim: int, pull: float) -> GradFn:
    """A gradient oracle: seeded noise per (node, round) plus ``pull * model``.

    Seeds come from CRC-32 of the key, so they do not change with Python's hash seed.
    """

    def grad(node: str, t: int, model: torch.Tensor) -> torch.Tensor:
        key = zlib.crc32(f"{seed}:{node}:{t}".encode())
        gen = torch.Generator().manual_seed(key)
        return torch.randn(dim, generator=gen, dtype=torch.float64) + pull * model

    return grad
