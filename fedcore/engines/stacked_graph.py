"""A round's weighted graph as tensors, for engines that hold every peer as a row of one
stack (:class:`StackedGraph`, built by :func:`stack_graph`), and the numbering of the edges
of a run's graphs (:class:`EdgeUnion`).

The vectorized engine (:mod:`fedcore.engines.vectorized`), the event engine and a
simulation's virtual clock read a graph this way: its edge lists grouped by receiver, each
receiver's senders in sorted-id order (the order a per-node inbox is processed in), and a
padded in-neighbour table. Built in numpy passes over the graph's edge arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedcore.topology import TrustGraph

__all__ = ["EdgeUnion", "StackedGraph", "stack_graph"]


@dataclass(frozen=True, eq=False)
class StackedGraph:
    """One weighted communication graph as tensors (node ``i`` is ``nodes[i]``).

    Attributes:
        n: Number of nodes.
        src, dst: The non-self edges ``src[e] -> dst[e]``, grouped by receiver, senders of
            each receiver in sorted-id order (the order a node's inbox is processed in).
        weight: ``W[src, dst]`` per edge (float64).
        self_weight: ``W[i, i]`` per node (float64).
        nbr: ``[N, K]`` padded in-neighbour table (``K`` the largest in-degree): slot ``k``
            of row ``i`` is the ``k``-th in-neighbour of ``i`` in sorted order; padding
            points at the node itself.
        slot_edge: ``[N, K]`` edge index of each slot (padding: ``E``, one past the end,
            so a per-edge mask extended by one ``False`` reads padding as absent).
        out_order: For each sender, its out-edges in node order of the receiver (the order
            a per-node ``out_weights`` mapping iterates), as edge indices grouped by sender.
        edge_id: Index of each edge in the run's union of edges over all rounds (robust
            push-sum keeps one running total per edge of the union).
    """

    n: int
    src: torch.Tensor
    dst: torch.Tensor
    weight: torch.Tensor
    self_weight: torch.Tensor
    nbr: torch.Tensor
    slot_edge: torch.Tensor
    out_order: torch.Tensor
    edge_id: torch.Tensor
    cache: dict[str, Any] = field(default_factory=dict)
    """What a batched algorithm derives once per graph (units of shared payloads)."""

    @property
    def edges(self) -> int:
        """Number of non-self edges."""
        return int(self.src.numel())

    def slots(self, per_edge: torch.Tensor) -> torch.Tensor:
        """A per-edge tensor ``[E, ...]`` laid out on the neighbour table, ``[N, K, ...]``;
        padding reads 0 (or ``False``)."""
        pad = per_edge.new_zeros((1, *per_edge.shape[1:]))
        return torch.cat([per_edge, pad])[self.slot_edge]


@dataclass(frozen=True, eq=False)
class EdgeUnion:
    """The union of the edges of a run's graphs (all rounds), each numbered in order of
    first appearance (graph by graph, each graph's edges in its edge order).

    Attributes:
        n: Number of nodes.
        keys: The union's edges as sorted keys ``src * n + dst``.
        ids: The number of each key.
    """

    n: int
    keys: np.ndarray[Any, np.dtype[np.int64]]
    ids: np.ndarray[Any, np.dtype[np.int64]]

    @classmethod
    def of(cls, graphs: Sequence[TrustGraph]) -> EdgeUnion:
        """The union of ``graphs`` (all over the same nodes)."""
        n = len(graphs[0].nodes)
        if len(graphs) == 1:  # a graph's keys are sorted and distinct already
            src, dst, _ = graphs[0].index_edges()
            return cls(n, src * n + dst, np.arange(src.size, dtype=np.int64))
        keys = np.concatenate(
            [s * n + d for s, d, _ in (g.index_edges() for g in graphs)]
            or [np.zeros(0, dtype=np.int64)]
        )
        unique, first = np.unique(keys, return_index=True)
        ids = np.empty(unique.size, dtype=np.int64)
        ids[np.argsort(first, kind="stable")] = np.arange(unique.size)
        return cls(n, unique, ids)

    def __len__(self) -> int:
        return int(self.keys.size)

    def id_of(
        self, src: np.ndarray[Any, np.dtype[np.int64]], dst: np.ndarray[Any, np.dtype[np.int64]]
    ) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The number of each edge ``src[e] -> dst[e]`` (every one in the union)."""
        keys = src * self.n + dst
        order = np.argsort(keys, kind="stable")  # sorted probes walk the table in order
        found = np.empty(keys.size, dtype=np.int64)
        found[order] = self.ids[np.searchsorted(self.keys, keys[order])]
        return found


def stack_graph(
    graph: TrustGraph,
    *,
    union: EdgeUnion | None = None,
    device: torch.device,
) -> StackedGraph:
    """The tensors of ``graph`` on ``device``; ``union`` numbers every edge of the run's
    graphs (all rounds; default: this graph's own, see :attr:`StackedGraph.edge_id`).

    Built in numpy passes over the graph's edge arrays: no Python work per edge."""
    nodes = graph.nodes
    n = len(nodes)
    self_weight = graph.self_weights()  # raises on a graph without weights
    by_src, by_dst, by_weight = graph.index_edges()
    assert by_weight is not None
    rank = graph.name_ranks()  # each node's place in sorted-id order
    # Edges grouped by receiver, each receiver's senders in sorted-id order.
    perm = np.argsort(by_dst * n + rank[by_src], kind="stable")
    src, dst, weight = by_src[perm], by_dst[perm], by_weight[perm]
    e = int(src.size)
    indegree = np.bincount(dst, minlength=n)
    k = int(indegree.max()) if n else 0
    start = np.zeros(n, dtype=np.int64)
    np.cumsum(indegree[:-1], out=start[1:])
    slot = np.arange(e, dtype=np.int64) - start[dst]
    # Built on the host with numpy (torch.from_numpy is always a CPU tensor), then moved.
    nbr = np.repeat(np.arange(n, dtype=np.int64)[:, None], k, axis=1)
    slot_edge = np.full((n, k), e, dtype=np.int64)
    nbr[dst, slot] = src
    slot_edge[dst, slot] = np.arange(e, dtype=np.int64)
    # A sender's out-edges in receiver node order: the graph's own edge order.
    out_order = np.empty(e, dtype=np.int64)
    out_order[perm] = np.arange(e, dtype=np.int64)
    # The graph's own union numbers its edges in their own order: edge e is edge perm[e].
    edge_id = perm if union is None else union.id_of(src, dst)

    def put(values: Any, dtype: Any = np.int64) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=dtype).reshape(-1)).to(device)

    stacked = StackedGraph(
        n=n,
        src=put(src),
        dst=put(dst),
        weight=put(weight, np.float64),
        self_weight=put(self_weight, np.float64),
        nbr=torch.from_numpy(nbr).to(device),
        slot_edge=torch.from_numpy(slot_edge).to(device),
        out_order=put(out_order),
        edge_id=put(edge_id),
    )
    stacked.cache["rank"] = rank.tolist()
    return stacked
