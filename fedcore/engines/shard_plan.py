"""A sharded rank's plan of each graph of a run: its halo and its rows of the neighbour
table, one plan a graph of a schedule's period (:class:`GraphPlan`), and where the peers go.

A static graph has one plan. A schedule of graphs (a time-varying topology, period ``P``)
has ``P``: round ``t`` runs the plan of ``t % P``, as the one-process engine runs the
graph of ``t % P``. The placement is one for the whole run (a rank's rows never move): it
is computed once from the union of the period's edges (:func:`union_edges`), by every rank
alike. Each graph's plan then says which of the rank's rows that graph's out-edges need on
other ranks (its halo, with its own split sizes per rank), where each slot of the rank's
inboxes reads in the extended stack, the slots' weights, in-degrees and self weights of
that graph. The placement's figures (:func:`placement_figures`) are over one period's
rounds: each round's edges count in every round that uses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore.engines.partition import halo_rows
from fedcore.engines.stacked_graph import StackedGraph

__all__ = [
    "GraphPlan",
    "Halo",
    "placement_figures",
    "plan_graph",
    "plan_halo",
    "union_edges",
]

_Array = np.ndarray[Any, Any]


@dataclass(frozen=True, eq=False)
class Halo:
    """What one rank sends and receives each phase of one graph's rounds (see
    :mod:`fedcore.engines.sharded`).

    Attributes:
        send_rows: Local row indices to send, grouped by destination rank in rank order,
            each group the sorted unique rows some peer of that rank listens to.
        send_counts: Rows per destination rank.
        recv_rows: Global row indices received, grouped by source rank in rank order,
            each group sorted (what the source's ``send_rows`` to this rank are).
        recv_counts: Rows per source rank.
    """

    send_rows: torch.Tensor
    send_counts: list[int]
    recv_rows: torch.Tensor
    recv_counts: list[int]


def plan_halo(src: _Array, dst: _Array, parts: Sequence[_Array], rank: int) -> Halo:
    """The :class:`Halo` of ``rank`` for the edges ``src -> dst`` (global rows) when rank
    ``r`` holds the sorted global rows ``parts[r]``; every rank computes every other's the
    same way."""
    n = sum(int(p.size) for p in parts)
    owner = np.empty(n, dtype=np.int64)
    for r, rows in enumerate(parts):
        owner[rows] = r
    owner_src, owner_dst = owner[src], owner[dst]
    cut = owner_src != owner_dst
    mine = parts[rank]
    send: list[_Array] = []
    recv: list[_Array] = []
    for q in range(len(parts)):
        out = cut & (owner_src == rank) & (owner_dst == q)
        send.append(np.searchsorted(mine, np.unique(src[out])))  # local rows
        into = cut & (owner_src == q) & (owner_dst == rank)
        recv.append(np.unique(src[into]))
    return Halo(
        torch.from_numpy(np.concatenate(send).astype(np.int64)),
        [int(s.size) for s in send],
        torch.from_numpy(np.concatenate(recv).astype(np.int64)),
        [int(r.size) for r in recv],
    )


@dataclass(frozen=True, eq=False)
class GraphPlan:
    """What one graph of the run asks of a rank holding the rows ``mine`` (``B`` of them).

    Attributes:
        graph: The graph (every peer's rows: a rank reads the whole graph).
        halo: Its :class:`Halo`.
        nbr: ``[B, K]`` each inbox slot's row of the extended stack (the rank's rows, then
            the halo's); padding points at the row itself. ``K``: the graph's largest
            in-degree, as one process pads it.
        slot_weight: ``[B, K]`` float64 ``W_ji`` of each slot (padding 0).
        arrived: ``[B, K]`` bool: the slots that are edges (every message arrives).
        self_weight: ``[B]`` float64 ``W_ii``.
        in_degree: ``[B]`` in-neighbours of each row.
    """

    graph: StackedGraph
    halo: Halo
    nbr: torch.Tensor
    slot_weight: torch.Tensor
    arrived: torch.Tensor
    self_weight: torch.Tensor
    in_degree: torch.Tensor


def plan_graph(graph: StackedGraph, shards: Sequence[_Array], rank: int) -> GraphPlan:
    """The :class:`GraphPlan` of ``graph`` for ``rank`` when rank ``r`` holds the sorted
    global rows ``shards[r]``."""
    n = graph.n
    rows = shards[rank]
    mine = torch.from_numpy(rows)
    b = int(rows.size)
    halo = plan_halo(graph.src.numpy(), graph.dst.numpy(), shards, rank)
    # Global row -> row of the extended stack (own rows, then the halo's).
    where = torch.full((n,), -1, dtype=torch.long)
    where[mine] = torch.arange(b)
    where[halo.recv_rows] = b + torch.arange(halo.recv_rows.numel())
    nbr = where[graph.nbr[mine]]
    assert bool((nbr >= 0).all()), "an in-neighbour outside the halo"
    return GraphPlan(
        graph=graph,
        halo=halo,
        nbr=nbr,
        slot_weight=graph.slots(graph.weight)[mine],
        arrived=graph.slots(torch.ones_like(graph.src, dtype=torch.bool))[mine],
        self_weight=graph.self_weight[mine],
        in_degree=torch.bincount(graph.dst, minlength=n)[mine],
    )


def union_edges(graphs: Sequence[StackedGraph]) -> tuple[_Array, _Array]:
    """``(src, dst)``: the edges the placement reads. One graph: its own edges, in its
    order; a schedule: the union of its period's edges, each once, sorted by ``(src,
    dst)`` (the same arrays on every rank)."""
    if len(graphs) == 1:
        return graphs[0].src.numpy(), graphs[0].dst.numpy()
    n = graphs[0].n
    keys = np.unique(np.concatenate([g.src.numpy() * n + g.dst.numpy() for g in graphs]))
    return keys // n, keys % n


def placement_figures(
    graphs: Sequence[StackedGraph], owner: _Array, world: int
) -> tuple[float, float]:
    """``(cut fraction, halo rows)`` of the placement ``owner`` (the rank of each row):
    the share of the edges of one period's rounds whose ends are on different ranks (each
    round's graph's edges, an edge counted in every round that uses it: for a static graph
    the share of its edges), and the rows that cross ranks in one exchange, all ranks
    together (a schedule: their mean over the period's rounds)."""
    edges = cut = rows = 0
    for g in graphs:
        src, dst = g.src.numpy(), g.dst.numpy()
        edges += int(src.size)
        cut += int(np.count_nonzero(owner[src] != owner[dst]))
        rows += halo_rows(src, dst, owner, world)
    return (cut / edges if edges else 0.0), rows / len(graphs)
