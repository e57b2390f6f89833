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

Inside, a graph is a few arrays (the edges as sender and receiver indices sorted by sender,
then receiver; their weights), so generators, mixing weights, fingerprints and the vectorized
engine's tables handle a graph of millions of edges in numpy passes
(:meth:`TrustGraph.index_edges`). The per-node views (neighbour tuples, the weight mapping,
the networkx copy) are built from the arrays the first time they are asked for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

from fedcore.errors import TopologyError
from fedcore.ids import clip
from fedcore.topology.validation import (
    _check_name,
    _check_node_id,
    _check_order,
    _check_weight,
    _edge_arrays,
    _node_order,
    format_nodes,
)

if TYPE_CHECKING:  # networkx and scipy are imported where used: `fedcore topology show` and
    # a config error answer without them (about 0.3 s of imports)
    import networkx as nx

NodeId: TypeAlias = str
"""A node id: a safe name such as ``"n0"`` or ``"alice"`` (see :mod:`fedcore.ids`)."""

_Edge: TypeAlias = tuple[str, str]
_Ints: TypeAlias = npt.NDArray[np.int64]
_Floats: TypeAlias = npt.NDArray[np.float64]


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

    __slots__ = (
        "_data",
        "_dst",
        "_graph",
        "_in",
        "_index",
        "_name",
        "_nodes",
        "_out",
        "_rank",
        "_scc",
        "_src",
        "_w",
        "_weighted",
    )

    _name: str
    _nodes: tuple[str, ...]
    _src: _Ints
    _dst: _Ints
    _w: _Floats  # NaN: an edge without a weight
    _weighted: bool

    def __init__(self, graph: nx.Graph, *, name: str, nodes: Sequence[str] | None = None) -> None:
        import networkx as nx

        _check_name(name)
        if not isinstance(graph, nx.Graph) or graph.is_multigraph():
            raise TopologyError(
                f"Graph '{name}' must be a networkx DiGraph (or Graph), not "
                f"{type(graph).__name__}. Convert multigraphs with networkx.DiGraph(graph)."
            )
        if not graph.is_directed():
            graph = graph.to_directed()
        order = _node_order(graph, nodes, name)
        index = {node: i for i, node in enumerate(order)}
        count = graph.number_of_edges()
        src = np.empty(count, dtype=np.int64)
        dst = np.empty(count, dtype=np.int64)
        w = np.empty(count, dtype=np.float64)
        for e, (u, v, attrs) in enumerate(graph.edges(data=True)):
            value = attrs.get("weight")
            src[e], dst[e] = index[u], index[v]
            w[e] = math.nan if value is None else _check_weight(value, u, v, name)
        self._set(name, order, src, dst, w, index=index)

    def _set(
        self,
        name: str,
        order: tuple[str, ...],
        src: _Ints,
        dst: _Ints,
        w: _Floats,
        *,
        index: dict[str, int] | None = None,
        rank: _Ints | None = None,
    ) -> None:
        """Store unique edges (sorted here by sender, then receiver index) and weights;
        ``index`` and ``rank``: those of a graph over the same nodes, if known."""
        n = len(order)
        key = src * n + dst
        if key.size and not bool(np.all(key[1:] > key[:-1])):
            perm = np.argsort(key, kind="stable")
            src, dst, w = src[perm], dst[perm], w[perm]
        for a in (src, dst, w):
            a.setflags(write=False)
        self._name = name
        self._nodes = order
        self._src, self._dst, self._w = src, dst, w
        self._weighted = bool(w.size) and not bool(np.isnan(w).any())
        self._index = index
        self._rank = rank
        self._data: dict[_Edge, float | None] | None = None
        self._out: dict[str, tuple[str, ...]] | None = None
        self._in: dict[str, tuple[str, ...]] | None = None
        self._graph: nx.DiGraph | None = None
        self._scc: list[list[str]] | None = None

    @classmethod
    def from_index_edges(
        cls,
        src: npt.ArrayLike,
        dst: npt.ArrayLike,
        *,
        name: str,
        nodes: Sequence[str],
        weight: npt.ArrayLike | None = None,
        trusted_ids: bool = False,
    ) -> TrustGraph:
        """Build a graph from edge arrays: ``nodes[src[e]] -> nodes[dst[e]]``.

        The array form of :meth:`from_edges` (and of :meth:`with_weights` with ``weight``):
        no per-edge Python, so a generator makes millions of edges in numpy passes. Repeated
        edges count once (the last one's weight).

        Args:
            src, dst: Sender and receiver indices into ``nodes``.
            name: The graph's name.
            nodes: The node order.
            weight: A weight per edge (NaN: none), or None for an unweighted graph.
            trusted_ids: The ids are known to be safe and distinct (a generator's
                ``n0 .. n{N-1}``): skip checking them one by one.

        Raises:
            TopologyError: a bad name, node id or weight, or an index out of range.
        """
        _check_name(name)
        order = tuple(nodes)
        if not trusted_ids:
            for node in order:
                _check_node_id(node, name)
            _check_order(order, name)
        elif not order:
            raise TopologyError(f"Graph '{name}' has no nodes; a trust graph needs at least one.")
        n = len(order)
        s, d, w = _edge_arrays(src, dst, weight, order, name)
        key = s * n + d
        perm = np.argsort(key, kind="stable")
        key = key[perm]
        last = np.ones(key.size, dtype=bool)  # keep the last of repeated edges
        last[:-1] = key[1:] != key[:-1]
        keep = perm[last]
        graph = cls.__new__(cls)
        graph._set(name, order, s[keep], d[keep], w[keep])
        return graph

    @classmethod
    def from_edges(
        cls, edges: Iterable[tuple[str, str]], *, name: str, nodes: Sequence[str]
    ) -> TrustGraph:
        """Build an unweighted graph from ``(u, v)`` pairs over the given node order."""
        order = tuple(nodes)
        index = {node: i for i, node in enumerate(order)}
        pairs = list(edges)
        if len(index) == len(order) and all(u in index and v in index for u, v in pairs):
            src = np.fromiter((index[u] for u, _ in pairs), dtype=np.int64, count=len(pairs))
            dst = np.fromiter((index[v] for _, v in pairs), dtype=np.int64, count=len(pairs))
            return cls.from_index_edges(src, dst, name=name, nodes=order)
        import networkx as nx

        graph = nx.DiGraph()  # the constructor names what is wrong
        graph.add_nodes_from(order)
        graph.add_edges_from(pairs)
        return cls(graph, name=name, nodes=order)

    # -- lazily built per-node views -------------------------------------------------

    def _idx(self) -> dict[str, int]:
        if self._index is None:
            self._index = {node: i for i, node in enumerate(self._nodes)}
        return self._index

    def _edge_data(self) -> dict[_Edge, float | None]:
        if self._data is None:
            names = self._nodes
            ws: list[float | None] = [None if math.isnan(x) else x for x in self._w.tolist()]
            self._data = {
                (names[u], names[v]): w
                for u, v, w in zip(self._src.tolist(), self._dst.tolist(), ws, strict=True)
            }
        return self._data

    def _neighbours(self, inward: bool) -> dict[str, tuple[str, ...]]:
        cached = self._in if inward else self._out
        if cached is not None:
            return cached
        names = self._nodes
        n = len(names)
        other = self._src if inward else self._dst
        mine = self._dst if inward else self._src
        real = other != mine
        mine, other = mine[real], other[real]
        if inward:  # by receiver, then sender index
            perm = np.lexsort((other, mine))
            mine, other = mine[perm], other[perm]
        bounds = np.searchsorted(mine, np.arange(n + 1)).tolist()
        listed = [names[i] for i in other.tolist()]
        table = {names[i]: tuple(listed[bounds[i] : bounds[i + 1]]) for i in range(n)}
        if inward:
            self._in = table
        else:
            self._out = table
        return table

    # -- the array form --------------------------------------------------------------

    def index_edges(self) -> tuple[_Ints, _Ints, _Floats | None]:
        """The non-self edges as arrays ``(src, dst, weight)``, sorted by sender, then
        receiver index (the order of :meth:`edges`); ``weight`` is None without weights.
        The arrays are read-only."""
        real = self._src != self._dst
        w = self._w[real] if self._weighted else None
        return self._src[real], self._dst[real], w

    def self_weights(self) -> _Floats:
        """``W[i, i]`` per node index (0.0 where a node has no self-loop).

        Raises:
            TopologyError: If the graph has no weights.
        """
        self._require_weights()
        out = np.zeros(len(self._nodes), dtype=np.float64)
        loop = self._src == self._dst
        out[self._src[loop]] = self._w[loop]
        return out

    def with_weight_arrays(self, edge_weights: _Floats, self_weights: _Floats) -> TrustGraph:
        """A copy of this graph with ``edge_weights`` on its non-self edges (in
        :meth:`index_edges` order) and a self-loop on every node carrying ``self_weights``
        (the array form of :meth:`with_weights`)."""
        src, dst, _ = self.index_edges()
        loops = np.arange(len(self._nodes), dtype=np.int64)
        graph = TrustGraph.__new__(TrustGraph)
        w = np.concatenate(
            [np.asarray(edge_weights, np.float64), np.asarray(self_weights, np.float64)]
        )
        if w.size != src.size + loops.size:
            raise TopologyError(f"Graph '{self._name}': weights of the wrong length.")
        bad = ~(np.isfinite(w) & (w >= 0.0))
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            pairs = np.concatenate([src, loops]), np.concatenate([dst, loops])
            _check_weight(
                float(w[e]), self._nodes[pairs[0][e]], self._nodes[pairs[1][e]], self._name
            )
        graph._set(
            self._name,
            self._nodes,
            np.concatenate([src, loops]),
            np.concatenate([dst, loops]),
            w,
            index=self._index,
            rank=self._rank,
        )
        return graph

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
        return self._nx().copy()

    def _nx(self) -> nx.DiGraph:
        if self._graph is None:
            import networkx as nx

            copy = nx.DiGraph(name=self._name)
            copy.add_nodes_from(self._nodes)
            for (u, v), w in self._edge_data().items():
                if w is None:
                    copy.add_edge(u, v)
                else:
                    copy.add_edge(u, v, weight=w)
            self._graph = copy
        return self._graph

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
        edges = int(np.count_nonzero(self._src != self._dst))
        return f"TrustGraph({self._name!r}, {len(self)} nodes, {edges} edges{weights})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrustGraph):
            return NotImplemented
        return (
            self._name == other._name
            and self._nodes == other._nodes
            and np.array_equal(self._src, other._src)
            and np.array_equal(self._dst, other._dst)
            and np.array_equal(self._w, other._w, equal_nan=True)
        )

    def __hash__(self) -> int:
        return hash((self._name, self._nodes, self._src.tobytes(), self._dst.tobytes()))

    def _require(self, node: str) -> None:
        if node not in self._idx():
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
        return self._idx()[node]

    def in_neighbours(self, v: str) -> tuple[str, ...]:
        """The nodes v listens to (edges ``u -> v``, u != v), in node order."""
        self._require(v)
        return self._neighbours(True)[v]

    def out_neighbours(self, u: str) -> tuple[str, ...]:
        """The nodes u sends to (edges ``u -> v``, v != u), in node order."""
        self._require(u)
        return self._neighbours(False)[u]

    def hops_from(self, u: str) -> dict[str, int]:
        """Node -> the number of edges on a shortest path from ``u`` to it (``u``: 0; nodes
        ``u`` cannot reach are absent)."""
        import networkx as nx

        self._require(u)
        hops: dict[str, int] = nx.single_source_shortest_path_length(self._nx(), u)
        return hops

    def edges(self) -> tuple[tuple[str, str], ...]:
        """All edges ``(u, v)`` with u != v, sorted by node order of u, then v."""
        src, dst, _ = self.index_edges()
        names = self._nodes
        return tuple(
            zip(
                map(names.__getitem__, src.tolist()),
                map(names.__getitem__, dst.tolist()),
                strict=True,
            )
        )

    def weighted_edges(self) -> tuple[tuple[str, str, float | None], ...]:
        """Every edge, self-loops included, as ``(u, v, weight or None)`` in node order."""
        return tuple((u, v, w) for (u, v), w in self._edge_data().items())

    def has_weights(self) -> bool:
        """Whether every edge, self-loops included, carries a ``weight`` (and there is one)."""
        return self._weighted

    def weight(self, u: str, v: str) -> float:
        """The share of u's value that v receives; 0.0 when there is no edge ``u -> v``."""
        self._require(u)
        self._require(v)
        self._require_weights()
        return self._edge_data().get((u, v)) or 0.0

    def out_weights(self, u: str) -> dict[str, float]:
        """Weights of u's non-self out-edges, keyed by receiver in node order."""
        self._require_weights()
        data = self._edge_data()
        return {v: data[(u, v)] or 0.0 for v in self.out_neighbours(u)}

    def in_weights(self, v: str) -> dict[str, float]:
        """Weights of v's non-self in-edges, keyed by sender in node order."""
        self._require_weights()
        data = self._edge_data()
        return {u: data[(u, v)] or 0.0 for u in self.in_neighbours(v)}

    def self_weight(self, u: str) -> float:
        """The share of its own value u keeps; 0.0 when u has no self-loop."""
        return self.weight(u, u)

    def is_symmetric(self) -> bool:
        """Whether every edge ``u -> v`` has its reverse ``v -> u`` (weights ignored)."""
        return self.first_one_way_edge() is None

    def first_one_way_edge(self) -> tuple[str, str] | None:
        """The first edge ``u -> v`` (in node order) without ``v -> u``, or None."""
        n = len(self._nodes)
        key = self._src * n + self._dst  # sorted: edges are by sender, then receiver
        back = self._dst * n + self._src
        if np.array_equal(np.sort(back), key):  # the reverses are the edges themselves
            return None
        one_way = ~_members(back, key)
        e = int(np.argmax(one_way))
        return (self._nodes[self._src[e]], self._nodes[self._dst[e]])

    def name_ranks(self) -> _Ints:
        """Each node's place in the sorted order of the ids (the order in which a node
        processes its inbox), by node index; read-only."""
        if self._rank is None:
            n = len(self._nodes)
            rank = np.empty(n, dtype=np.int64)
            rank[np.argsort(np.array(self._nodes), kind="stable")] = np.arange(n)
            rank.setflags(write=False)
            self._rank = rank
        return self._rank

    def _components(self) -> tuple[int, _Ints]:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import connected_components

        n = len(self._nodes)
        ones = np.ones(self._src.size, dtype=np.int8)
        matrix = csr_matrix((ones, (self._src, self._dst)), shape=(n, n))
        count, labels = connected_components(matrix, directed=True, connection="strong")
        return int(count), np.asarray(labels, dtype=np.int64)

    def strongly_connected_components(self) -> list[list[str]]:
        """Strongly connected components, each in node order, ordered by their first node."""
        if self._scc is None:
            count, labels = self._components()
            order = np.argsort(labels, kind="stable")  # by component, members in node order
            bounds = np.searchsorted(labels[order], np.arange(count + 1))
            names = self._nodes
            comps = [
                [names[i] for i in order[bounds[c] : bounds[c + 1]].tolist()] for c in range(count)
            ]
            comps.sort(key=lambda c: self._idx()[c[0]])
            self._scc = comps
        return [list(c) for c in self._scc]

    def is_strongly_connected(self) -> bool:
        """Whether every node can reach every other node along directed edges."""
        if self._scc is not None:
            return len(self._scc) == 1
        quick = self._reaches_all()
        if quick is not None:
            return quick
        return self._components()[0] == 1

    def _reaches_all(self, levels: int = 64, most_edges: int = 200_000) -> bool | None:
        """Whether the first node reaches every node and every node reaches it (strongly
        connected), by breadth-first search in both directions; None where the graph has
        more than ``most_edges`` edges or a search takes more than ``levels`` steps (then
        scipy's components answer). Spares a peer of a small graph scipy's import (about
        0.4 s of its start)."""
        n = len(self._nodes)
        if self._src.size > most_edges:
            return None
        for src, dst in ((self._src, self._dst), (self._dst, self._src)):
            seen = np.zeros(n, dtype=np.bool_)
            seen[0] = True
            frontier = np.zeros(1, dtype=self._src.dtype)
            for _ in range(levels):
                reached = dst[np.isin(src, frontier)]
                reached = reached[~seen[reached]]
                if not reached.size:
                    break
                seen[reached] = True
                frontier = np.unique(reached)
            else:
                return None
            if not seen.all():
                return False
        return True

    def mixing_matrix(self) -> npt.NDArray[np.float64]:
        """The weights as a dense matrix with ``W[i, j] = weight(nodes[i], nodes[j])``.

        Rows are senders, so one mixing step is ``x_new = W.T @ x`` for a vector ``x`` indexed
        by node. Push-sum weights make every row sum to 1; gossip weights make rows and columns
        sum to 1.
        """
        self._require_weights()
        n = len(self._nodes)
        matrix = np.zeros((n, n), dtype=np.float64)
        matrix[self._src, self._dst] = self._w
        return matrix

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
        index = self._idx()
        data = self._edge_data()
        src = np.empty(len(weights), dtype=np.int64)
        dst = np.empty(len(weights), dtype=np.int64)
        w = np.empty(len(weights), dtype=np.float64)
        for e, ((u, v), value) in enumerate(weights.items()):
            self._require(u)
            self._require(v)
            if u != v and (u, v) not in data:
                raise TopologyError(
                    f"A weight was given for {u} -> {v}, but graph '{self._name}' has no such "
                    "edge. Give weights only for existing edges and self-loops."
                )
            src[e], dst[e] = index[u], index[v]
            w[e] = _check_weight(value, u, v, self._name)
        for u, v in self.edges():
            if (u, v) not in weights:
                raise TopologyError(
                    f"No weight was given for edge {u} -> {v} of graph '{self._name}'. "
                    "Give a weight for every edge."
                )
        graph = TrustGraph.__new__(TrustGraph)
        graph._set(self._name, self._nodes, src, dst, w, index=self._index, rank=self._rank)
        return graph

    def without_weights(self) -> TrustGraph:
        """A copy of this graph with its non-self edges only and no weights."""
        src, dst, _ = self.index_edges()
        graph = TrustGraph.__new__(TrustGraph)
        graph._set(
            self._name,
            self._nodes,
            src,
            dst,
            np.full(src.size, math.nan),
            index=self._index,
            rank=self._rank,
        )
        return graph

    def degree_range(self) -> tuple[int, int, int, int]:
        """``(min in, max in, min out, max out)`` degree over all nodes, self-loops excluded."""
        src, dst, _ = self.index_edges()
        n = len(self._nodes)
        ins = np.bincount(dst, minlength=n)
        outs = np.bincount(src, minlength=n)
        return (int(ins.min()), int(ins.max()), int(outs.min()), int(outs.max()))


def _members(keys: _Ints, sorted_keys: _Ints) -> npt.NDArray[np.bool_]:
    """Which of ``keys`` are in ``sorted_keys`` (ascending); the queries are sorted first,
    so the search walks the table in order (random probes of a large table are slow)."""
    out = np.zeros(keys.size, dtype=bool)
    if not sorted_keys.size or not keys.size:
        return out
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    at = np.minimum(np.searchsorted(sorted_keys, ranked), sorted_keys.size - 1)
    out[order] = sorted_keys[at] == ranked
    return out
