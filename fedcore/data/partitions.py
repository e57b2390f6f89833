"""Training examples split across peers: ``iid``, ``dirichlet`` (label skew with
concentration ``alpha``: small alpha, few labels per node), ``shards`` (sort by label, deal
``shards_per_node`` contiguous shards to each node), ``sorted`` (one contiguous run of the
label-sorted examples a node, in node order), ``quantity`` (quantity skew) and
``natural`` (whole writers per node, for data with writers) and ``slices`` (node ``i``'s
examples found by index: :func:`slice_part`, for populations of millions).

Every split is a pure function of its inputs and seed, so a run's split replays exactly.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import torch

from fedcore.config import PARTITIONS
from fedcore.errors import DataError
from fedcore.registry import did_you_mean

__all__ = [
    "MIN_EXAMPLES",
    "PARTITIONS",
    "check_partition_size",
    "natural_owners",
    "own_test_parts",
    "partition",
    "slice_order",
    "slice_part",
    "slice_size",
]


MIN_EXAMPLES = 2
"""Fewest training examples :func:`partition` gives a node by default."""


def slice_size(n_examples: int, n_parts: int, examples_per_node: int = 0) -> int:
    """The examples each node holds in a ``slices`` partition: ``examples_per_node``, or
    (0) ``n_examples // n_parts``.

    Raises:
        DataError: fewer than :data:`MIN_EXAMPLES`, or more than ``n_examples``.
    """
    k = examples_per_node or n_examples // max(n_parts, 1)
    if examples_per_node > n_examples:
        raise DataError(
            f"data.examples_per_node = {examples_per_node} is more than the "
            f"{n_examples} training examples; use at most {n_examples}."
        )
    if k < MIN_EXAMPLES:
        raise DataError(
            f"{n_examples} training examples over {n_parts} nodes leave {k} a node (fewer "
            f"than {MIN_EXAMPLES}); set data.examples_per_node (nodes then share examples)."
        )
    return k


def slice_order(n_examples: int, seed: int) -> np.ndarray:
    """The one seeded permutation of the training examples that ``slices`` cuts."""
    return np.random.default_rng(seed).permutation(n_examples)


def slice_part(order: np.ndarray, i: int, k: int) -> np.ndarray:
    """Node ``i``'s examples in a ``slices`` partition, sorted: the ``k`` entries of
    ``order`` (:func:`slice_order`) from entry ``i * k`` on, wrapping around. A pure
    function of ``(seed, i)``: a population's client finds its examples by index, with no
    part held for any other."""
    n = len(order)
    start = (i * k) % n
    at = (start + np.arange(k, dtype=np.int64)) % n
    return np.sort(order[at])


def check_partition_size(
    n_examples: int,
    n_parts: int,
    scheme: str,
    *,
    shards_per_node: int = 2,
    min_size: int = MIN_EXAMPLES,
    examples_per_node: int = 0,
) -> None:
    """Refuse, from the sizes alone, a split :func:`partition` could never make.

    Cheap (no data, no graph needed), so a run can be refused before its graph is built.

    Raises:
        DataError: fewer than ``n_parts * min_size`` examples, or (``shards``) fewer than
            ``n_parts * shards_per_node``.
    """
    if n_parts < 1:
        raise DataError(f"cannot partition data across {n_parts} nodes.")
    if scheme == "slices":  # nodes share examples where they outnumber them
        slice_size(n_examples, n_parts, examples_per_node)
        return
    if n_examples < n_parts * min_size:
        most = n_examples // min_size
        fix = f"use at most {most} nodes, or more data" if most else "use more data"
        raise DataError(
            f"{n_examples} training examples are too few for {n_parts} nodes with at least "
            f"{min_size} each; {fix}."
        )
    if scheme == "shards" and (shards_per_node < 1 or n_examples < n_parts * shards_per_node):
        raise DataError(
            f"data.shards_per_node={shards_per_node} does not fit {n_examples} examples on "
            f"{n_parts} nodes."
        )


def partition(
    labels: np.ndarray | torch.Tensor,
    n_parts: int,
    scheme: str,
    *,
    seed: int,
    alpha: float = 0.5,
    shards_per_node: int = 2,
    min_size: int = MIN_EXAMPLES,
    groups: np.ndarray | None = None,
    examples_per_node: int = 0,
) -> list[np.ndarray]:
    """Split example indices ``0..len(labels)-1`` into ``n_parts`` disjoint parts.

    Args:
        labels: Integer class labels.
        n_parts: Number of nodes.
        scheme: ``"iid"``; ``"dirichlet"`` (label skew); ``"shards"`` (pathological: sort
            by label, deal ``shards_per_node`` contiguous shards to each node, so a node
            sees about that many classes); ``"sorted"`` (the label-sorted examples cut into
            ``n_parts`` contiguous runs, node ``i`` the ``i``-th: neighbouring nodes share
            labels, so a graph's regions hold different classes, as a dumbbell's two
            cliques); ``"quantity"`` (quantity skew: node sizes in
            Dirichlet(``alpha``) shares of the examples beyond ``min_size`` each, labels
            iid); ``"natural"`` (one node per writer, or per group of writers: see
            :func:`natural_owners`).
        seed: Seed of the split.
        alpha: Dirichlet concentration (``dirichlet``, ``quantity``); must be > 0.
        shards_per_node: Shards per node (``shards`` only).
        min_size: Every part gets at least this many examples.
        groups: Each example's writer (``natural`` only).
        examples_per_node: Examples a node (``slices`` only; 0: ``len(labels) //
            n_parts``).

    Returns:
        One sorted index array per node; together they cover every example once (but
        ``slices``: :func:`slice_part`, which may share examples or leave some out).

    Raises:
        DataError: on an unknown scheme, bad parameters, or too little data.
    """
    y = np.asarray(labels, dtype=np.int64)
    n = len(y)
    check_partition_size(
        n,
        n_parts,
        scheme,
        shards_per_node=shards_per_node,
        min_size=min_size,
        examples_per_node=examples_per_node,
    )
    if scheme == "slices":
        k = slice_size(n, n_parts, examples_per_node)
        order = slice_order(n, seed)
        return [slice_part(order, i, k) for i in range(n_parts)]
    rng = np.random.default_rng(seed)
    if scheme == "iid":  # np.array_split's pieces, each sorted, made in one pass
        size, extra = divmod(n, n_parts)
        sizes = np.full(n_parts, size, dtype=np.int64)
        sizes[:extra] += 1
        if size < min_size:
            raise DataError(_too_small(scheme, size, min_size))
        return _each_sorted(rng.permutation(n), sizes)
    elif scheme == "dirichlet":
        if not alpha > 0:
            raise DataError(f"data.alpha must be > 0 for a Dirichlet partition, got {alpha}.")
        parts = _dirichlet(y, n_parts, alpha, rng, min_size)
    elif scheme == "shards":
        order = np.argsort(y, kind="stable")
        shards = np.array_split(order, n_parts * shards_per_node)
        deal = rng.permutation(len(shards))
        parts = [
            np.concatenate(
                [shards[s] for s in deal[i * shards_per_node : (i + 1) * shards_per_node]]
            )
            for i in range(n_parts)
        ]
    elif scheme == "sorted":  # contiguous runs of the label-sorted examples, in node order
        parts = np.array_split(np.argsort(y, kind="stable"), n_parts)
    elif scheme == "quantity":
        if not alpha > 0:
            raise DataError(f"data.alpha must be > 0 for a quantity partition, got {alpha}.")
        shares = rng.dirichlet(np.full(n_parts, alpha))
        extra = n - n_parts * min_size
        exact = shares * extra
        sizes = min_size + np.floor(exact).astype(np.int64)
        short = n - int(sizes.sum())  # the largest remainders take one more each
        sizes[np.argsort(-(exact - np.floor(exact)), kind="stable")[:short]] += 1
        parts = np.split(rng.permutation(n), np.cumsum(sizes)[:-1])
    elif scheme == "natural":
        if groups is None:
            raise DataError(
                "data.partition = 'natural' needs a dataset with writers (femnist, "
                "shakespeare); use iid, dirichlet, shards or quantity for this one."
            )
        owners = natural_owners(groups, n_parts, seed=seed)
        node = owners[np.asarray(groups, dtype=np.int64)]
        order = np.argsort(node, kind="stable")
        parts = np.split(order, np.searchsorted(node[order], np.arange(1, n_parts)))
    else:
        hint = did_you_mean(scheme, PARTITIONS)
        raise DataError(
            f"unknown partition {scheme!r}"
            + (f"; {hint}" if hint else "")
            + f" (use one of {', '.join(PARTITIONS)})."
        )
    smallest = min(len(p) for p in parts)
    if smallest < min_size:
        raise DataError(_too_small(scheme, smallest, min_size))
    return [np.sort(p) for p in parts]


def _too_small(scheme: str, smallest: int, min_size: int) -> str:
    return (
        f"the {scheme!r} partition left a node with {smallest} examples (fewer than "
        f"{min_size}); use fewer nodes, fewer shards per node or more data."
    )


def _each_sorted(flat: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """The consecutive pieces of ``flat`` (indices, ``>= 0``) of ``sizes``, each sorted:
    the values ``np.sort`` gives each piece, sorted all at once (a piece's number times
    the span of the values, added to each value, keeps the pieces apart), no Python pass
    per piece but the slicing."""
    ends = np.cumsum(sizes)
    span = int(flat.max()) + 1 if flat.size else 1
    if sizes.size * span >= 2**62:  # the keys would overflow: piece by piece
        return [np.sort(p) for p in np.split(flat, ends[:-1])]
    offset = np.repeat(np.arange(sizes.size, dtype=np.int64) * span, sizes)
    keyed = np.sort(flat.astype(np.int64) + offset)
    keyed -= offset
    bounds = [0, *ends.tolist()]
    return [keyed[a:b] for a, b in pairwise(bounds)]


def natural_owners(groups: np.ndarray, n_parts: int, *, seed: int) -> np.ndarray:
    """The node of each writer (``-1`` for writers with no example in ``groups``): the
    writers that have examples, in a seeded random order, dealt round-robin to the nodes (so
    with more writers than nodes each node holds about ``writers / nodes`` whole writers).

    Raises:
        DataError: fewer writers than nodes.
    """
    g = np.asarray(groups, dtype=np.int64)
    present = np.unique(g)
    if len(present) < n_parts:
        raise DataError(
            f"a natural partition gives each node whole writers, but the data has "
            f"{len(present)} writers for {n_parts} nodes; use at most {len(present)} nodes."
        )
    owners = np.full(int(present.max()) + 1 if len(present) else 0, -1, dtype=np.int64)
    dealt = np.random.default_rng(seed).permutation(present)
    owners[dealt] = np.arange(len(dealt)) % n_parts
    return owners


def own_test_parts(
    train_groups: np.ndarray, test_groups: np.ndarray, n_parts: int, *, seed: int
) -> list[np.ndarray] | None:
    """Each node's own test examples under a ``natural`` partition: those of the writers it
    holds (:func:`natural_owners` of the training split, so the same writers on both
    splits). ``None`` when some test writer has no training example (LEAF's split by user,
    ``-t user``: no node owns it) or some node has no test example: the run then evaluates
    every node on the whole test split."""
    owners = natural_owners(train_groups, n_parts, seed=seed)
    g = np.asarray(test_groups, dtype=np.int64)
    if len(g) and (int(g.max()) >= len(owners) or bool((owners[g] < 0).any())):
        return None
    node = owners[g]
    parts = [np.flatnonzero(node == i) for i in range(n_parts)]
    return parts if all(len(p) for p in parts) else None


_HOPELESS = 50
"""Nodes short of examples in a first Dirichlet try that end the search (see _dirichlet)."""


def _dirichlet(
    y: np.ndarray, n_parts: int, alpha: float, rng: np.random.Generator, min_size: int
) -> list[np.ndarray]:
    """Label-skewed split: each class is divided across nodes by Dirichlet(alpha) shares.

    A try that leaves a node below ``min_size`` is found from the cut points alone (array
    work), and the index lists are assembled only for the try that is kept. A first try
    that leaves ``_HOPELESS`` or more nodes short ends the search at once: each node falls
    short about independently, so a try that leaves none is then a chance below ``e**-25``
    (tens of thousands of nodes would otherwise spend a minute on 1000 tries).
    """
    classes = np.unique(y)
    members = [np.flatnonzero(y == c) for c in classes]
    for attempt in range(1000):
        drawn: list[tuple[np.ndarray, np.ndarray]] = []
        sizes = np.zeros(n_parts, dtype=np.int64)
        for indices in members:
            idx = rng.permutation(indices)
            shares = rng.dirichlet(np.full(n_parts, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
            sizes += np.diff(cuts, prepend=0, append=len(idx))
            drawn.append((idx, cuts))
        if sizes.min() >= min_size:
            buckets: list[list[int]] = [[] for _ in range(n_parts)]
            for idx, cuts in drawn:
                for node, chunk in enumerate(np.split(idx, cuts)):
                    buckets[node].extend(chunk.tolist())
            return [np.asarray(b, dtype=np.int64) for b in buckets]
        short = int((sizes < min_size).sum())
        if attempt == 0 and short >= _HOPELESS:
            raise DataError(
                f"a Dirichlet(alpha={alpha}) split of {len(y)} examples left {short} of "
                f"{n_parts} nodes with fewer than {min_size} examples, so no try would leave "
                "none; raise data.alpha or use fewer nodes."
            )
    raise DataError(
        f"a Dirichlet(alpha={alpha}) split left some of {n_parts} nodes with fewer than "
        f"{min_size} examples in 1000 tries; raise data.alpha or use fewer nodes."
    )
