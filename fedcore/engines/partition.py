"""Which peers each rank of a sharded run holds (``simulate.partition``), and what that
placement costs: the share of edges it cuts and the rows that cross ranks each round.

Every rank computes the same partition from the same graph on its own (no message): each
method here is deterministic, a function of the edge arrays and the rank count alone.

* ``"blocks"``: contiguous blocks of graph order (:func:`~fedcore.engines.ranks.blocks`).
* ``"graph"``: recursive bisection grown by breadth-first search: the rank range is split
  in two halves, the peers of the part are ordered by a breadth-first search of the
  part's own (undirected) subgraph from a pseudo-peripheral peer (the last one a search
  from the part's first peer reaches), component by component (the large ones searched,
  the small ones kept whole), and the first peers of that order, as many as the left
  ranks' blocks hold, go left; then passes of swaps refine the halves (pairs of peers
  with more neighbours across than at home change sides while that cuts fewer edges). A
  ball grown from the edge of the graph keeps its neighbours with it, so few edges cross.
  The sizes are exactly those of ``"blocks"`` (they differ by at most one peer; every rank
  holds at least one where there are at least as many peers as ranks), and where the
  contiguous blocks cut fewer edges (a graph already laid out well, such as a torus in
  row order) they are kept: ``"graph"`` never cuts more edges than ``"blocks"``. Scipy's
  compiled search and sparse products: ``random-regular`` of a million peers of degree
  4 (seed 0) took 2.0 CPU seconds on 2 ranks (22 % of its edges cut, against 50 % for
  blocks) and 3.9 on 8 ranks (42 %, against 87 %), on the project machine.
* ``"metis"``: METIS's k-way partition (``pymetis``, the optional extra
  ``fedcore[partition]``), seed 0; its sizes differ by METIS's tolerance (a few per cent),
  and a partition that leaves a rank without peers is refused. It cuts fewer edges than
  ``"graph"`` on expanders (the same million peers on 2 ranks: 16 % of the edges, in
  3.2 CPU seconds; on 8 ranks 33 %, in 6.8).
* ``"auto"``: ``"graph"`` up to :data:`AUTO_GRAPH_EDGES` edges, ``"blocks"`` above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedcore.engines.ranks import blocks
from fedcore.engines.shard_refusal import METIS_MISSING, metis_available

__all__ = [
    "AUTO_GRAPH_EDGES",
    "METIS_MISSING",
    "Placement",
    "cut_fraction",
    "halo_rows",
    "metis_available",
    "place",
]

AUTO_GRAPH_EDGES = 10_000_000
"""Up to this many (directed, non-self) edges ``simulate.partition = "auto"`` runs the
``"graph"`` partition (up to about 10 s of every rank's set-up there: 2 to 4 CPU seconds
for 4 million edges, measured as the module docstring says); above, contiguous blocks."""

_Array = np.ndarray[Any, Any]


@dataclass(frozen=True, eq=False)
class Placement:
    """Which global rows each rank holds.

    Attributes:
        method: The method that placed them (``"blocks"``, ``"graph"`` or ``"metis"``;
            ``"blocks"`` where ``"graph"`` kept the contiguous blocks).
        rows: Per rank, its global rows, sorted (int64, at least one each).
        owner: ``[N]``: the rank of each row.
    """

    method: str
    rows: list[_Array]
    owner: _Array


def _from_owner(method: str, owner: _Array, world: int) -> Placement:
    order = np.argsort(owner, kind="stable")  # rows of each rank, sorted within it
    counts = np.bincount(owner, minlength=world)
    rows = np.split(order.astype(np.int64), np.cumsum(counts)[:-1])
    return Placement(method, rows, owner)


def _blocks(n: int, world: int) -> Placement:
    owner = np.empty(n, dtype=np.int64)
    for r, (lo, hi) in enumerate(blocks(n, world)):
        owner[lo:hi] = r
    return _from_owner("blocks", owner, world)


def _undirected(n: int, src: _Array, dst: _Array) -> Any:
    from scipy.sparse import csr_matrix

    ones = np.ones(2 * src.size, dtype=np.int8)
    both = (np.concatenate([src, dst]), np.concatenate([dst, src]))
    return csr_matrix((ones, both), shape=(n, n))


def _search_order(adjacency: Any) -> _Array:
    """The part's peers (local indices): each large component (a sixteenth of the part or
    more) in breadth-first order from a pseudo-peripheral peer, in order of its first
    peer; then the small components, each whole, in order of their first peer."""
    from scipy.sparse.csgraph import breadth_first_order, connected_components

    m = adjacency.shape[0]
    count, labels = connected_components(adjacency, directed=False)
    sizes = np.bincount(labels, minlength=count)
    large = sizes >= max(2, m // 16)  # at most 16 searches of the part
    pieces = []
    for c in np.flatnonzero(large):  # labels run in order of each component's first peer
        first = int(np.argmax(labels == c))
        reach = breadth_first_order(adjacency, first, directed=False)[0]
        pieces.append(breadth_first_order(adjacency, int(reach[-1]), directed=False)[0])
    small = np.flatnonzero(~large[labels])
    pieces.append(small[np.argsort(labels[small], kind="stable")])
    return np.concatenate(pieces).astype(np.int64)


REFINE_PASSES = 8
"""Passes of swaps that refine each bisection of ``"graph"`` (each a few sparse passes
over the part's edges)."""


def _refine(adjacency: Any, side: _Array) -> _Array:
    """``side`` (``True``: the left half) with pairs of peers swapped across while that cuts
    fewer edges: each pass takes the peers that have more neighbours across than on their
    own side, as many from each side (the largest gains first, ties by index), and keeps
    the swap if the cut shrinks (else tries half as many). Sizes do not change."""
    rows = np.repeat(np.arange(adjacency.shape[0]), np.diff(adjacency.indptr))
    cols = adjacency.indices
    weight = adjacency.data.astype(np.int64)
    degree = np.bincount(rows, weights=weight, minlength=adjacency.shape[0]).astype(np.int64)

    def cut(side: _Array) -> int:
        return int(weight[side[rows] != side[cols]].sum())

    now = cut(side)
    for _ in range(REFINE_PASSES):
        on_left = np.asarray(adjacency @ side.astype(np.int64)).ravel()
        across = np.where(side, degree - on_left, on_left)
        gain = across - (degree - across)
        movers = []
        for mask in (side, ~side):
            candidates = np.flatnonzero(mask & (gain > 0))
            movers.append(candidates[np.argsort(-gain[candidates], kind="stable")])
        k = min(movers[0].size, movers[1].size)
        while k:
            trial = side.copy()
            trial[movers[0][:k]] = False
            trial[movers[1][:k]] = True
            after = cut(trial)
            if after < now:
                side, now = trial, after
                break
            k //= 2
        if not k:
            break
    return side


def _graph(n: int, src: _Array, dst: _Array, world: int) -> Placement:
    sizes = [hi - lo for lo, hi in blocks(n, world)]
    owner = np.empty(n, dtype=np.int64)
    adjacency = _undirected(n, src, dst)
    todo: list[tuple[_Array, int, int]] = [(np.arange(n, dtype=np.int64), 0, world)]
    while todo:
        part, first, last = todo.pop()
        if last - first == 1:
            owner[part] = first
            continue
        mid = (first + last) // 2
        left = sum(sizes[first:mid])
        sub = adjacency[part][:, part]
        order = _search_order(sub)
        side = np.zeros(part.size, dtype=np.bool_)
        side[order[:left]] = True
        side = _refine(sub, side)
        todo.append((part[side], first, mid))
        todo.append((part[~side], mid, last))
    grown = _from_owner("graph", owner, world)
    kept = _blocks(n, world)
    if _cut(src, dst, kept.owner) < _cut(src, dst, grown.owner):
        return kept
    return grown


def _metis(n: int, src: _Array, dst: _Array, world: int) -> Placement:
    import pymetis  # the partition extra; checked before any rank starts

    adjacency = _undirected(n, src, dst)
    adjacency.sum_duplicates()
    starts, adjacent = adjacency.indptr.astype(np.int64), adjacency.indices.astype(np.int64)
    options = pymetis.Options(seed=0)
    if hasattr(pymetis, "CSRAdjacency"):  # 2025.2 on; the lists are deprecated there
        graph = pymetis.CSRAdjacency(starts, adjacent)
        _, membership = pymetis.part_graph(world, graph, options=options)
    else:
        _, membership = pymetis.part_graph(world, xadj=starts, adjncy=adjacent, options=options)
    owner = np.asarray(membership, dtype=np.int64)
    empty = np.flatnonzero(np.bincount(owner, minlength=world) == 0)
    if empty.size:
        from fedcore.errors import ConfigError

        raise ConfigError(
            f"METIS left rank {int(empty[0])} of {world} without peers; use "
            "simulate.partition = 'graph' or fewer ranks."
        )
    return _from_owner("metis", owner, world)


def place(method: str, n: int, src: _Array, dst: _Array, world: int) -> Placement:
    """The :class:`Placement` of ``n`` peers with the edges ``src -> dst`` (global rows)
    on ``world`` ranks (``1 <= world <= n``) by ``method`` (see the module docstring).

    Raises:
        ValueError: ``world`` is not from 1 to ``n``, or ``method`` is not one of
            :data:`~fedcore.config.constants.RANK_PARTITIONS`.
    """
    if not 1 <= world <= n:
        raise ValueError(f"{world} ranks for {n} peers: every rank holds at least one peer")
    if method not in ("auto", "blocks", "graph", "metis"):
        raise ValueError(f"unknown partition {method!r}")
    if method == "auto":
        method = "graph" if src.size <= AUTO_GRAPH_EDGES else "blocks"
    if world == 1:  # one rank holds every peer, whatever the method
        return _from_owner(method, np.zeros(n, dtype=np.int64), 1)
    if method == "blocks":
        return _blocks(n, world)
    if method == "metis":
        return _metis(n, src, dst, world)
    return _graph(n, src, dst, world)


def _cut(src: _Array, dst: _Array, owner: _Array) -> int:
    return int(np.count_nonzero(owner[src] != owner[dst]))


def cut_fraction(src: _Array, dst: _Array, owner: _Array) -> float:
    """The share of the edges ``src -> dst`` whose ends are on different ranks (0 for a
    graph without edges)."""
    return _cut(src, dst, owner) / src.size if src.size else 0.0


def halo_rows(src: _Array, dst: _Array, owner: _Array, world: int) -> int:
    """Rows that cross ranks in one exchange: each row with an out-edge into another rank,
    once per such rank (what the halo plans of all ranks send together)."""
    cut = owner[src] != owner[dst]
    return int(np.unique(src[cut] * world + owner[dst[cut]]).size)
