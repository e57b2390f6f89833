"""Datasets, partitions across peers, and per-node minibatch streams.

Everything here is seeded explicitly, so a run's data split replays exactly.

* :func:`digits` is scikit-learn's 8x8 digits, which ships inside the package (no
  download), standardized with the training split's statistics.
* :func:`load_dataset` resolves a built-in name or a user's ``"pkg.module:factory"``.
  A user factory is called as ``factory(seed=..., test_fraction=...)`` and returns a
  :class:`Dataset`.
* :func:`partition` splits training indices across nodes: ``iid``, ``dirichlet``
  (label skew with concentration ``alpha``: small alpha, few labels per node) or
  ``shards`` (sort by label, deal ``shards_per_node`` contiguous shards to each node).
* :class:`BatchStream` yields one node's minibatches, reshuffling every epoch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore.config import PARTITIONS
from fedcore.errors import DataError

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "BatchStream",
    "Dataset",
    "digits",
    "load_dataset",
    "load_object",
    "partition",
    "resolve_factory",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataset:
    """A classification dataset with a held-out test split.

    Attributes:
        name: Human-readable name.
        x_train: Float features, shape ``(n_train, ...)``.
        y_train: Int64 labels in ``[0, num_classes)``, shape ``(n_train,)``.
        x_test: Float features of the held-out split.
        y_test: Labels of the held-out split.
        num_classes: Number of classes.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        """Check shapes and label ranges once, so models fail with a clear message."""
        for split, x, y in (
            ("train", self.x_train, self.y_train),
            ("test", self.x_test, self.y_test),
        ):
            if x.shape[0] != y.shape[0] or x.shape[0] == 0:
                raise DataError(
                    f"dataset {self.name!r}: the {split} split has {x.shape[0]} inputs and "
                    f"{y.shape[0]} labels; both must be equal and non-zero."
                )
            if y.dtype != torch.int64 or int(y.min()) < 0 or int(y.max()) >= self.num_classes:
                raise DataError(
                    f"dataset {self.name!r}: {split} labels must be int64 in "
                    f"[0, {self.num_classes})."
                )

    @property
    def input_dim(self) -> int:
        """Number of input features per example (flattened)."""
        return int(np.prod(self.x_train.shape[1:]))


def digits(*, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's handwritten digits: 1797 8x8 images, 10 classes.

    The split is stratified and seeded; features are standardized with the training
    split's mean and standard deviation.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"data.test_fraction must be in (0, 1), got {test_fraction}.")
    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    try:
        x_tr, x_te, y_tr, y_te = train_test_split(
            x, y, test_size=test_fraction, random_state=seed, stratify=y
        )
    except ValueError as exc:  # a split too small to hold every class
        raise DataError(
            f"data.test_fraction = {test_fraction} cannot split digits with every class on "
            f"both sides: {exc}"
        ) from exc
    mean = x_tr.mean(axis=0)
    std = x_tr.std(axis=0)
    std[std == 0] = 1.0
    return Dataset(
        name="digits",
        x_train=torch.tensor((x_tr - mean) / std, dtype=torch.float32),
        y_train=torch.tensor(y_tr),
        x_test=torch.tensor((x_te - mean) / std, dtype=torch.float32),
        y_test=torch.tensor(y_te),
        num_classes=10,
    )


DATASETS: dict[str, Callable[..., Dataset]] = {"digits": digits}


def load_object(path: str, *, what: str) -> object:
    """Import ``"pkg.module:attribute"`` and return the attribute.

    Raises:
        DataError: naming the path and what went wrong (bad form, import, attribute).
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise DataError(f"{what} {path!r} is neither a built-in name nor 'pkg.module:factory'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DataError(
            f"cannot import module {module_name!r} for {what} {path!r}: {exc}."
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise DataError(
            f"module {module_name!r} has no attribute {attr!r} ({what} {path!r})."
        ) from None


def resolve_factory(
    name: str, registry: Mapping[str, Callable[..., Any]], *, what: str
) -> Callable[..., Any]:
    """The factory registered as ``name``, or the callable at import path ``name``.

    Raises:
        DataError: an unknown built-in name (listing the known ones) or a bad import path.
    """
    factory = registry.get(name)
    if factory is not None:
        return factory
    if ":" not in name:
        raise DataError(
            f"unknown {what} {name!r}; built-in {what}s: {', '.join(sorted(registry))}, "
            "or give your own as 'pkg.module:factory'."
        )
    loaded = load_object(name, what=what)
    if not callable(loaded):
        raise DataError(f"{what} {name!r} is not callable.")
    return loaded


def load_dataset(name: str, *, seed: int, test_fraction: float = 0.2) -> Dataset:
    """Return the built-in dataset ``name`` or call a user factory given by import path."""
    factory = resolve_factory(name, DATASETS, what="dataset")
    try:
        dataset = factory(seed=seed, test_fraction=test_fraction)
    except TypeError as exc:
        raise DataError(
            f"dataset {name!r} must accept keyword arguments seed and test_fraction: {exc}."
        ) from exc
    if not isinstance(dataset, Dataset):
        raise DataError(
            f"dataset factory {name!r} returned {type(dataset).__name__}, not fedcore.data.Dataset."
        )
    return dataset


def partition(
    labels: np.ndarray | torch.Tensor,
    n_parts: int,
    scheme: str,
    *,
    seed: int,
    alpha: float = 0.5,
    shards_per_node: int = 2,
    min_size: int = 2,
) -> list[np.ndarray]:
    """Split example indices ``0..len(labels)-1`` into ``n_parts`` disjoint parts.

    Args:
        labels: Integer class labels.
        n_parts: Number of nodes.
        scheme: ``"iid"``, ``"dirichlet"`` or ``"shards"``.
        seed: Seed of the split.
        alpha: Dirichlet concentration (``dirichlet`` only); must be > 0.
        shards_per_node: Shards per node (``shards`` only).
        min_size: Every part gets at least this many examples.

    Returns:
        One sorted index array per node; together they cover every example once.

    Raises:
        DataError: on an unknown scheme, bad parameters, or too little data.
    """
    y = np.asarray(labels, dtype=np.int64)
    n = len(y)
    if n_parts < 1:
        raise DataError(f"cannot partition data across {n_parts} nodes.")
    if n < n_parts * min_size:
        raise DataError(
            f"{n} training examples are too few for {n_parts} nodes with at least "
            f"{min_size} each; use fewer nodes or more data."
        )
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), n_parts)
    elif scheme == "dirichlet":
        if not alpha > 0:
            raise DataError(f"data.alpha must be > 0 for a Dirichlet partition, got {alpha}.")
        parts = _dirichlet(y, n_parts, alpha, rng, min_size)
    elif scheme == "shards":
        if shards_per_node < 1 or n < n_parts * shards_per_node:
            raise DataError(
                f"data.shards_per_node={shards_per_node} does not fit {n} examples on "
                f"{n_parts} nodes."
            )
        order = np.argsort(y, kind="stable")
        shards = np.array_split(order, n_parts * shards_per_node)
        deal = rng.permutation(len(shards))
        parts = [
            np.concatenate(
                [shards[s] for s in deal[i * shards_per_node : (i + 1) * shards_per_node]]
            )
            for i in range(n_parts)
        ]
    else:
        raise DataError(f"unknown partition {scheme!r}; use one of {', '.join(PARTITIONS)}.")
    smallest = min(len(p) for p in parts)
    if smallest < min_size:
        raise DataError(
            f"the {scheme!r} partition left a node with {smallest} examples (fewer than "
            f"{min_size}); use fewer nodes, fewer shards per node or more data."
        )
    return [np.sort(p) for p in parts]


def _dirichlet(
    y: np.ndarray, n_parts: int, alpha: float, rng: np.random.Generator, min_size: int
) -> list[np.ndarray]:
    """Label-skewed split: each class is divided across nodes by Dirichlet(alpha) shares."""
    classes = np.unique(y)
    for _ in range(1000):
        buckets: list[list[int]] = [[] for _ in range(n_parts)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(n_parts, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
            for node, chunk in enumerate(np.split(idx, cuts)):
                buckets[node].extend(chunk.tolist())
        if min(len(b) for b in buckets) >= min_size:
            return [np.asarray(b, dtype=np.int64) for b in buckets]
    raise DataError(
        f"a Dirichlet(alpha={alpha}) split left some of {n_parts} nodes with fewer than "
        f"{min_size} examples in 1000 tries; raise data.alpha or use fewer nodes."
    )


class BatchStream:
    """One node's minibatches: shuffled without replacement, reshuffled every epoch.

    >>> s = BatchStream(torch.zeros(5, 2), torch.arange(5), batch_size=2, seed=0)
    >>> x, y = s.next_batch()
    >>> tuple(x.shape)
    (2, 2)
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, batch_size: int, seed: int) -> None:
        """Hold ``x``/``y`` and a private generator seeded with ``seed``."""
        if batch_size < 1:
            raise DataError(f"data.batch_size must be >= 1, got {batch_size}.")
        if len(x) == 0:
            raise DataError("a node was given no training examples.")
        self.x = x
        self.y = y
        self.batch_size = min(batch_size, len(x))
        self._gen = torch.Generator().manual_seed(seed)
        self._order = torch.randperm(len(x), generator=self._gen)
        self._pos = 0

    def __len__(self) -> int:
        """Number of examples this node holds."""
        return len(self.x)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the next ``batch_size`` examples, starting a new epoch when needed."""
        if self._pos + self.batch_size > len(self._order):
            self._order = torch.randperm(len(self.x), generator=self._gen)
            self._pos = 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.x[idx], self.y[idx]
