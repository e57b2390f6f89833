"""Trust graphs: immutable directed graphs of string node ids with optional mixing weights.

A :class:`TrustGraph` is an immutable view of a ``networkx.DiGraph`` whose nodes are string ids.
An edge ``u -> v`` means *v trusts u*: u sends its messages to v, and v accepts them. Mixing
weights, when present, live on the edge attribute ``weight``; a self-loop ``(u, u)`` carries u's
self weight, and ``weight(u, v)`` is the share of u's value that v receives.

A TrustGraph also has ``period`` (1), ``at(round)`` and ``union()`` (both itself), the interface
of the time-varying :class:`~fedcore.topology.schedule.Schedule`, so round-running code can take
either one.

Graphs are immutable so that a graph handed to many nodes, runners and fingerprints cannot change
under any of them: the constructor copies its input, and :attr:`TrustGraph.digraph` returns a copy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeAlias

import networkx as nx
import numpy as np
import numpy.typing as npt

from fedcore.errors import TopologyError
from fedcore.ids import clip, unsafe_id

__all__ = ["NodeId", "TrustGraph", "format_components", "format_nodes"]

NodeId: TypeAlias = str
"""A node id: a safe name such as ``"n0"`` or ``"alice"`` (see :mod:`fedcore.ids`)."""

_Edge: TypeAlias = tuple[str, str]


def format_nodes(nodes: Sequence[str], limit: int = 8) -> str:
    """Join node ids for a message, keeping long listings short.

    Args:
        nodes: The ids to list, in the order to show them.
        limit: How many ids to show before summarising the rest as ``... (+N more)``.

    Returns:
        Text such as ``"n0, n1, n2"`` or ``"n0, n1, ... (+30 more)"``.
    """
    shown = ", ".join(nodes[:limit])
    if len(nodes) > limit:
        return f"{shown}, ... (+{len(nodes) - limit} more)"
    return shown


def format_components(components: Sequence[Sequence[str]], limit: int = 10) -> str:
    """Format strongly connected components as ``[n0, n1], [n2], ...`` for error messages."""
    parts = [f"[{format_nodes(c)}]" for c in components[:limit]]
    if len(components) > limit:
        parts.append(f"... (+{len(components) - limit} more components)")
    return ", ".join(parts)


def _check_node_id(node: object, graph_name: str) -> str:
    message = unsafe_id(node, f"Graph {clip(graph_name, 60)}")
    if message is not None:
        raise TopologyError(
            f"{message}. Relabel the nodes, for example with "
            "networkx.relabel_nodes(graph, lambda i: f'n{i}')."
        )
    assert isinstance(node, str)
    return node


def _check_case_collisions(order: Sequence[str], graph_name: str) -> None:
    """Refuse ids that differ only in case: they name one folder on case-insensitive file
    systems and one DNS name in certificates (which compare without case)."""
    seen: dict[str, str] = {}
    for node in order:
        other = seen.setdefault(node.lower(), node)
        if other != node:
            raise TopologyError(
                f"Graph {clip(graph_name, 60)} has the node ids {other!r} and {node!r}, which "
                "differ only in case: they would share a folder on case-insensitive file "
                "systems and a DNS name in certificates. Rename one of them."
            )


def _check_weight(value: object, u: str, v: str, graph_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TopologyError(
            f"Graph '{graph_name}' has weight {value!r} on edge {u} -> {v}, but weights must be "
            "numbers. Give a number between 0 and 1."
        )
    weight = float(value)
    if not math.isfinite(weight) or weight < 0.0:
        raise TopologyError(
            f"Graph '{graph_name}' has weight {weight!r} on edge {u} -> {v}, but weights must be "
            "finite and non-negative. Give a number between 0 and 1."
        )
    return weight


class TrustGraph:
    """An immutable directed trust graph with optional mixing weights.

    Attributes are read-only. ``nodes`` keeps a stable order (generator order or file order),
    which is the row and column order of :meth:`mixing_matrix` and the order of every
    neighbour listing. Only the structure and the ``weight`` attribute are kept: other node,
    edge and graph attributes of the input are dropped.

    Args:
        graph: The trust graph. An undirected ``networkx.Graph`` is taken as both directions of
            each edge; multigraphs are refused.
        name: A short name used in messages and fingerprints, such as ``"ring-8"``.
        nodes: The node order; defaults to the graph's insertion order. Must list exactly the
            graph's nodes.

    Raises:
        TopologyError: If the graph, its node ids, the node order or a weight is invalid.
    """

    __slots__ = ("_data", "_graph", "_in", "_index", "_name", "_nodes", "_out", "_scc", "_weighted")

    _name: str
    _nodes: tuple[str, ...]

    def __init__(self, graph: nx.Graph, *, name: str, nodes: Sequence[str] | None = None) -> None:
        if not isinstance(name, str) or not name.strip():
            raise TopologyError(f"A trust graph needs a non-empty name, not {name!r}.")
        if not isinstance(graph, nx.Graph) or graph.is_multigraph():
            raise TopologyError(
                f"Graph '{name}' must be a networkx DiGraph (or Graph), not "
                f"{type(graph).__name__}. Convert multigraphs with networkx.DiGraph(graph)."
            )
        if not graph.is_directed():
            graph = graph.to_directed()
        order = tuple(graph.nodes) if nodes is None else tuple(nodes)
        for node in order if nodes is None else (*order, *graph.nodes):
            _check_node_id(node, name)
        if len(set(order)) != len(order):
            dups = sorted({n for n in order if order.count(n) > 1})
            raise TopologyError(f"Graph '{name}' lists the nodes {format_nodes(dups)} twice.")
        _check_case_collisions(order, name)
        if set(order) != set(graph.nodes):
            missing = [str(n) for n in graph.nodes if n not in set(order)]
            extra = [n for n in order if not graph.has_node(n)]
            raise TopologyError(
                f"The node order given for graph '{name}' does not match its nodes: "
                f"missing {format_nodes(missing) or 'none'}, "
                f"unknown {format_nodes(extra) or 'none'}. "
                "List every node of the graph exactly once."
            )
        if not order:
            raise TopologyError(f"Graph '{name}' has no nodes; a trust graph needs at least one.")
        index = {node: i for i, node in enumerate(order)}
        raw: list[tuple[str, str, float | None]] = []
        for u, v, attrs in graph.edges(data=True):
            value = attrs.get("weight")
            raw.append((u, v, None if value is None else _check_weight(value, u, v, name)))
        raw.sort(key=lambda e: (index[e[0]], index[e[1]]))
        self._name = name
        self._nodes = order
        self._index = index
        self._data: dict[_Edge, float | None] = {(u, v): w for u, v, w in raw}
        out: dict[str, list[str]] = {n: [] for n in order}
        inn: dict[str, list[str]] = {n: [] for n in order}
        for u, v, _ in raw:
            if u != v:
                out[u].append(v)
                inn[v].append(u)
        self._out = {n: tuple(vs) for n, vs in out.items()}
        self._in = {n: tuple(sorted(us, key=index.__getitem__)) for n, us in inn.items()}
        self._weighted = bool(raw) and all(w is not None for _, _, w in raw)
        copy = nx.DiGraph(name=name)
        copy.add_nodes_from(order)
        for u, v, w in raw:
            if w is None:
                copy.add_edge(u, v)
            else:
                copy.add_edge(u, v, weight=w)
        self._graph = copy
        self._scc: list[list[str]] | None = None

    @classmethod
    def from_edges(
        cls, edges: Iterable[tuple[str, str]], *, name: str, nodes: Sequence[str]
    ) -> TrustGraph:
        """Build an unweighted graph from ``(u, v)`` pairs over the given node order."""
        graph = nx.DiGraph()
        graph.add_nodes_from(nodes)
        graph.add_edges_from(edges)
        return cls(graph, name=name, nodes=nodes)

    @property
    def name(self) -> str:
        """The graph's name, used in messages, files and fingerprints."""
        return self._name

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node ids in their stable order."""
        return self._nodes

    @property
    def digraph(self) -> nx.DiGraph:
        """A fresh ``networkx.DiGraph`` copy; changing it never changes this graph."""
        return self._graph.copy()

    @property
    def period(self) -> int:
        """A static graph repeats every round: the period is 1 (as for a Schedule)."""
        return 1

    def at(self, round: int) -> TrustGraph:
        """The graph used in ``round``: always this graph."""
        return self

    def union(self) -> TrustGraph:
        """The union of the graphs of one period: this graph."""
        return self

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        weights = ", weighted" if self._weighted else ""
        return f"TrustGraph({self._name!r}, {len(self)} nodes, {len(self.edges())} edges{weights})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrustGraph):
            return NotImplemented
        return (
            self._name == other._name and self._nodes == other._nodes and self._data == other._data
        )

    def __hash__(self) -> int:
        return hash((self._name, self._nodes, frozenset(self._data)))

    def _require(self, node: str) -> None:
        if node not in self._index:
            raise TopologyError(
                f"Node {clip(node, 40)} is not in graph '{self._name}', whose nodes are "
                f"{format_nodes(self._nodes)}. Use one of its node ids."
            )

    def _require_weights(self) -> None:
        if not self._weighted:
            raise TopologyError(
                f"Graph '{self._name}' has no mixing weights on every edge. Add them with "
                "fedcore.topology.prepare, uniform_push_sum or metropolis_hastings first."
            )

    def index(self, node: str) -> int:
        """The position of ``node`` in :attr:`nodes` (its row in :meth:`mixing_matrix`)."""
        self._require(node)
        return self._index[node]

    def in_neighbours(self, v: str) -> tuple[str, ...]:
        """The nodes v listens to (edges ``u -> v``, u != v), in node order."""
        self._require(v)
        return self._in[v]

    def out_neighbours(self, u: str) -> tuple[str, ...]:
        """The nodes u sends to (edges ``u -> v``, v != u), in node order."""
        self._require(u)
        return self._out[u]

    def hops_from(self, u: str) -> dict[str, int]:
        """Node -> the number of edges on a shortest path from ``u`` to it (``u``: 0; nodes
        ``u`` cannot reach are absent)."""
        self._require(u)
        hops: dict[str, int] = nx.single_source_shortest_path_length(self._graph, u)
        return hops

    def edges(self) -> tuple[tuple[str, str], ...]:
        """All edges ``(u, v)`` with u != v, sorted by node order of u, then v."""
        return tuple(e for e in self._data if e[0] != e[1])

    def weighted_edges(self) -> tuple[tuple[str, str, float | None], ...]:
        """Every edge, self-loops included, as ``(u, v, weight or None)`` in node order."""
        return tuple((u, v, w) for (u, v), w in self._data.items())

    def has_weights(self) -> bool:
        """Whether every edge, self-loops included, carries a ``weight`` (and there is one)."""
        return self._weighted

    def weight(self, u: str, v: str) -> float:
        """The share of u's value that v receives; 0.0 when there is no edge ``u -> v``."""
        self._require(u)
        self._require(v)
        self._require_weights()
        return self._data.get((u, v)) or 0.0

    def out_weights(self, u: str) -> dict[str, float]:
        """Weights of u's non-self out-edges, keyed by receiver in node order."""
        self._require_weights()
        return {v: self._data[(u, v)] or 0.0 for v in self.out_neighbours(u)}

    def in_weights(self, v: str) -> dict[str, float]:
        """Weights of v's non-self in-edges, keyed by sender in node order."""
        self._require_weights()
        return {u: self._data[(u, v)] or 0.0 for u in self.in_neighbours(v)}

    def self_weight(self, u: str) -> float:
        """The share of its own value u keeps; 0.0 when u has no self-loop."""
        return self.weight(u, u)

    def is_symmetric(self) -> bool:
        """Whether every edge ``u -> v`` has its reverse ``v -> u`` (weights ignored)."""
        return self.first_one_way_edge() is None

    def first_one_way_edge(self) -> tuple[str, str] | None:
        """The first edge ``u -> v`` (in node order) without ``v -> u``, or None."""
        for u, v in self._data:
            if (v, u) not in self._data:
                return (u, v)
        return None

    def strongly_connected_components(self) -> list[list[str]]:
        """Strongly connected components, each in node order, ordered by their first node."""
        if self._scc is None:
            comps = [
                sorted(c, key=self._index.__getitem__)
                for c in nx.strongly_connected_components(self._graph)
            ]
            comps.sort(key=lambda c: self._index[c[0]])
            self._scc = comps
        return [list(c) for c in self._scc]

    def is_strongly_connected(self) -> bool:
        """Whether every node can reach every other node along directed edges."""
        return len(self.strongly_connected_components()) == 1

    def mixing_matrix(self) -> npt.NDArray[np.float64]:
        """The weights as a dense matrix with ``W[i, j] = weight(nodes[i], nodes[j])``.

        Rows are senders, so one mixing step is ``x_new = W.T @ x`` for a vector ``x`` indexed
        by node. Push-sum weights make every row sum to 1; gossip weights make rows and columns
        sum to 1.
        """
        self._require_weights()
        matrix = nx.to_numpy_array(
            self._graph, nodelist=list(self._nodes), weight="weight", dtype=np.float64
        )
        return np.asarray(matrix, dtype=np.float64)

    def with_weights(self, weights: Mapping[tuple[str, str], float]) -> TrustGraph:
        """A copy of this graph carrying the given mixing weights.

        Args:
            weights: A weight for every non-self edge ``(u, v)``; entries ``(u, u)`` become
                self-loops carrying self weights (a node without one keeps none of its value).
                Existing weights and self-loops are replaced.

        Raises:
            TopologyError: If an edge has no weight, a key is not an edge, or a weight is
                negative or not finite.
        """
        graph = nx.DiGraph()
        graph.add_nodes_from(self._nodes)
        for (u, v), w in weights.items():
            self._require(u)
            self._require(v)
            if u != v and (u, v) not in self._data:
                raise TopologyError(
                    f"A weight was given for {u} -> {v}, but graph '{self._name}' has no such "
                    "edge. Give weights only for existing edges and self-loops."
                )
            graph.add_edge(u, v, weight=_check_weight(w, u, v, self._name))
        for u, v in self.edges():
            if (u, v) not in weights:
                raise TopologyError(
                    f"No weight was given for edge {u} -> {v} of graph '{self._name}'. "
                    "Give a weight for every edge."
                )
        return TrustGraph(graph, name=self._name, nodes=self._nodes)

    def without_weights(self) -> TrustGraph:
        """A copy of this graph with its non-self edges only and no weights."""
        return TrustGraph.from_edges(self.edges(), name=self._name, nodes=self._nodes)

    def degree_range(self) -> tuple[int, int, int, int]:
        """``(min in, max in, min out, max out)`` degree over all nodes, self-loops excluded."""
        ins = [len(self._in[n]) for n in self._nodes]
        outs = [len(self._out[n]) for n in self._nodes]
        return (min(ins), max(ins), min(outs), max(outs))
