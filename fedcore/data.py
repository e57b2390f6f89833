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
import inspect
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore import registry
from fedcore.config import FOLDER, ORDERS, PARTITIONS
from fedcore.errors import DataError, FedcoreError
from fedcore.ids import error_text
from fedcore.registry import did_you_mean

__all__ = [
    "DATASETS",
    "DIGITS_EXAMPLES",
    "MIN_EXAMPLES",
    "PARTITIONS",
    "BatchStream",
    "Dataset",
    "NoData",
    "check_partition_size",
    "digits",
    "first_non_finite",
    "load_dataset",
    "load_object",
    "mnist1d",
    "natural_owners",
    "own_test_parts",
    "partition",
    "refused_arguments",
    "resolve_factory",
    "training_examples",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataset:
    """A classification dataset with a held-out test split.

    Attributes:
        name: Human-readable name.
        x_train: Features, shape ``(n_train, ...)``: floats, or int64 indices (a character
            model's sequences).
        y_train: Int64 labels in ``[0, num_classes)``, shape ``(n_train,)``.
        x_test: Features of the held-out split.
        y_test: Labels of the held-out split.
        num_classes: Number of classes.
        groups_train: Where the data has writers (LEAF's users): each training example's
            writer, an index into ``writers`` (int64, ``(n_train,)``); ``None`` otherwise.
            The ``natural`` partition keeps each writer on one peer.
        groups_test: Each test example's writer, as ``groups_train``.
        writers: The writers' names (sorted).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    groups_train: np.ndarray | None = None
    groups_test: np.ndarray | None = None
    writers: tuple[str, ...] = ()

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
            bad = first_non_finite(x)
            if bad is not None:
                raise DataError(
                    f"dataset {self.name!r}: example {bad} of the {split} split holds NaN or "
                    "an infinite value; features must be finite (fix or drop it)."
                )
        for split, groups, y in (
            ("train", self.groups_train, self.y_train),
            ("test", self.groups_test, self.y_test),
        ):
            if groups is None:
                continue
            if groups.shape != (len(y),) or (
                len(groups) and (int(groups.min()) < 0 or int(groups.max()) >= len(self.writers))
            ):
                raise DataError(
                    f"dataset {self.name!r}: the {split} split's writers must be one index "
                    f"into its {len(self.writers)} writers per example."
                )
        if (self.groups_train is None) != (self.groups_test is None):
            raise DataError(f"dataset {self.name!r}: writers are given for one split only.")

    @property
    def input_dim(self) -> int:
        """Number of input features per example (flattened)."""
        return int(np.prod(self.x_train.shape[1:]))


_SCAN_ELEMENTS = 1 << 22
"""Values :func:`first_non_finite` tests at a time (its temporary mask stays this small)."""


def first_non_finite(x: np.ndarray | torch.Tensor) -> int | None:
    """The index of the first example (along the first axis) of ``x`` holding NaN or an
    infinity, or None: none does, or ``x`` is not floating point.

    Checked where data are loaded, so a file's NaN is refused as the file's, not met later
    as a peer's message of non-finite values. Scans a chunk of examples at a time, so it
    never holds a mask as large as ``x``.
    """
    if isinstance(x, torch.Tensor):
        floating = x.is_floating_point() or x.is_complex()
        finite: Any = torch.isfinite
    else:
        floating, finite = x.dtype.kind in "fc", np.isfinite
    if not floating or x.ndim == 0 or x.shape[0] == 0:
        return None
    rows = x.reshape(x.shape[0], -1)  # NumPy and torch alike from here
    step = max(1, _SCAN_ELEMENTS // max(1, rows.shape[1]))
    for start in range(0, rows.shape[0], step):
        bad = ~finite(rows[start : start + step]).all(1)
        if bool(bad.any()):
            return start + int(bad.nonzero()[0][0])
    return None


DIGITS_EXAMPLES = 1797
"""Examples in scikit-learn's digits (both splits)."""


def training_examples(name: str, *, test_fraction: float) -> int | None:
    """How many training examples the built-in dataset ``name`` has, without loading it
    (or None where that is not known up front: other datasets, users' factories).

    Lets a run of too many nodes be refused before the dataset's imports and the graph.
    """
    if name == "digits" and 0.0 < test_fraction < 1.0:
        # train_test_split's own rounding: the test split takes ceil(fraction * n) examples
        return DIGITS_EXAMPLES - math.ceil(test_fraction * DIGITS_EXAMPLES)
    return None


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


def mnist1d(*, seed: int = 0, test_fraction: float = 0.2, num_samples: int = 10_000) -> Dataset:
    """MNIST-1D (Greydanus, 2020): 1-D signals of 40 values, 10 classes, generated offline.

    Much harder than digits for small models, so methods separate. Needs the ``mnist1d``
    package (``pip install "fedcore[datasets]"``); the signals are generated by its
    ``make_dataset`` with ``num_samples`` examples, never downloaded. Its generator seeds
    NumPy's global state, which is saved and restored around the call.
    """
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:
        raise DataError(
            "dataset 'mnist1d' needs the mnist1d package: pip install 'fedcore[datasets]'."
        ) from exc
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"data.test_fraction must be in (0, 1), got {test_fraction}.")
    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    args.train_split = 1.0 - test_fraction
    state = np.random.get_state()
    py_state = random.getstate()
    try:
        raw = make_dataset(args)
    finally:
        np.random.set_state(state)
        random.setstate(py_state)
    return Dataset(
        name="mnist1d",
        x_train=torch.tensor(raw["x"], dtype=torch.float32),
        y_train=torch.tensor(raw["y"], dtype=torch.int64),
        x_test=torch.tensor(raw["x_test"], dtype=torch.float32),
        y_test=torch.tensor(raw["y_test"], dtype=torch.int64),
        num_classes=10,
    )


class _Factories(Mapping[str, Callable[..., Dataset]]):
    """The built-in datasets' factories by name, each imported when first asked for (the
    datasets read from files live in :mod:`fedcore.localdata`, which imports this module)."""

    def __getitem__(self, name: str) -> Callable[..., Dataset]:
        if name not in registry.DATASETS:
            raise KeyError(name)
        factory: Callable[..., Dataset] = registry.DATASETS.load(name)
        return factory

    def __iter__(self) -> Iterator[str]:
        return iter(registry.DATASETS.names)

    def __len__(self) -> int:
        return len(registry.DATASETS.names)


DATASETS: Mapping[str, Callable[..., Dataset]] = _Factories()
"""``data.dataset``'s built-in names -> their factories."""


def load_object(path: str, *, what: str) -> object:
    """Import ``"pkg.module:attribute"`` (or a plain ``"module:attribute"``: a module
    file, no package) and return the attribute.

    Raises:
        DataError: naming the path and what went wrong (bad form, import, attribute).
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise DataError(f"{what} {path!r} is neither a built-in name nor 'pkg.module:factory'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        where = ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            where = (
                f" (fedcore looks in the folder it runs from and on PYTHONPATH: run it from "
                f"the folder that holds {missing.replace('.', '/')}.py or "
                f"{missing.replace('.', '/')}/, or put that folder on PYTHONPATH)"
            )
        raise DataError(
            f"cannot import module {module_name!r} for {what} {path!r}: {exc}{where}."
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
        hint = did_you_mean(name, registry)
        raise DataError(
            f"unknown {what} {name!r}"
            + (f"; {hint}" if hint else "")
            + f" (built-in {what}s: {', '.join(sorted(registry))}, or give your own as "
            "'pkg.module:factory')."
        )
    loaded = load_object(name, what=what)
    if not callable(loaded):
        raise DataError(f"{what} {name!r} is not callable.")
    return loaded


def refused_arguments(factory: Callable[..., Any], **kwargs: Any) -> TypeError | None:
    """The TypeError that calling ``factory(**kwargs)`` raises for its signature alone, or
    None (also when the signature cannot be read). Tells a factory called wrongly from
    one that fails inside."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        return exc
    return None


def load_dataset(name: str, *, seed: int, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """Return the built-in dataset ``name`` or call a user factory given by import path.

    The datasets read from files (:mod:`fedcore.localdata`) look in ``root``
    (``data.root``; :func:`fedcore.localdata.data_root` says the default);
    ``"folder:PATH"`` reads ``PATH`` as written.

    Whatever a factory raises becomes a :class:`DataError` naming it and its error,
    chained to the original (whose traceback ``fedcore -v`` shows).

    Raises:
        DataError: unknown name, a factory with the wrong signature, one that fails or
            returns no :class:`Dataset`.
    """
    if name.startswith(FOLDER):
        from fedcore.localdata import folder

        return folder(name[len(FOLDER) :], seed=seed, test_fraction=test_fraction)
    factory = resolve_factory(name, DATASETS, what="dataset")
    if name in registry.DATASETS and "root" in registry.DATASETS.entry(name).keys:
        return factory(seed=seed, test_fraction=test_fraction, root=root)  # type: ignore[no-any-return]
    refused = refused_arguments(factory, seed=seed, test_fraction=test_fraction)
    if refused is not None:
        raise DataError(
            f"dataset {name!r} must accept keyword arguments seed and test_fraction: {refused}."
        )
    try:
        dataset = factory(seed=seed, test_fraction=test_fraction)
    except FedcoreError:
        raise
    except Exception as exc:  # a user's factory can raise anything
        raise DataError(f"dataset factory {name!r} failed: {error_text(exc)}") from exc
    if not isinstance(dataset, Dataset):
        raise DataError(
            f"dataset factory {name!r} returned {type(dataset).__name__}, not fedcore.data.Dataset."
        )
    return dataset


MIN_EXAMPLES = 2
"""Fewest training examples :func:`partition` gives a node by default."""


def check_partition_size(
    n_examples: int,
    n_parts: int,
    scheme: str,
    *,
    shards_per_node: int = 2,
    min_size: int = MIN_EXAMPLES,
) -> None:
    """Refuse, from the sizes alone, a split :func:`partition` could never make.

    Cheap (no data, no graph needed), so a run can be refused before its graph is built.

    Raises:
        DataError: fewer than ``n_parts * min_size`` examples, or (``shards``) fewer than
            ``n_parts * shards_per_node``.
    """
    if n_parts < 1:
        raise DataError(f"cannot partition data across {n_parts} nodes.")
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
) -> list[np.ndarray]:
    """Split example indices ``0..len(labels)-1`` into ``n_parts`` disjoint parts.

    Args:
        labels: Integer class labels.
        n_parts: Number of nodes.
        scheme: ``"iid"``; ``"dirichlet"`` (label skew); ``"shards"`` (pathological: sort
            by label, deal ``shards_per_node`` contiguous shards to each node, so a node
            sees about that many classes); ``"quantity"`` (quantity skew: node sizes in
            Dirichlet(``alpha``) shares of the examples beyond ``min_size`` each, labels
            iid); ``"natural"`` (one node per writer, or per group of writers: see
            :func:`natural_owners`).
        seed: Seed of the split.
        alpha: Dirichlet concentration (``dirichlet``, ``quantity``); must be > 0.
        shards_per_node: Shards per node (``shards`` only).
        min_size: Every part gets at least this many examples.
        groups: Each example's writer (``natural`` only).

    Returns:
        One sorted index array per node; together they cover every example once.

    Raises:
        DataError: on an unknown scheme, bad parameters, or too little data.
    """
    y = np.asarray(labels, dtype=np.int64)
    n = len(y)
    check_partition_size(n, n_parts, scheme, shards_per_node=shards_per_node, min_size=min_size)
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), n_parts)
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
        raise DataError(
            f"the {scheme!r} partition left a node with {smallest} examples (fewer than "
            f"{min_size}); use fewer nodes, fewer shards per node or more data."
        )
    return [np.sort(p) for p in parts]


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


class NoData:
    """The stream of a node that holds no data (the server family's server)."""

    examples = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Never: such a node takes no training step.

        Raises:
            DataError: always.
        """
        raise DataError("this node holds no training data (a server); it takes no step.")


class BatchStream:
    """One node's minibatches: shuffled without replacement, reshuffled every epoch.

    >>> s = BatchStream(torch.zeros(5, 2), torch.arange(5), batch_size=2, seed=0)
    >>> x, y = s.next_batch()
    >>> tuple(x.shape)
    (2, 2)
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        batch_size: int,
        seed: int,
        order: str = "shuffled",
    ) -> None:
        """Hold ``x``/``y`` and a private generator seeded with ``seed``.

        ``order = "sorted"`` walks the examples in label order (ties in a seeded shuffle),
        the same every epoch: a non-iid order over time, for online learning.
        """
        if batch_size < 1:
            raise DataError(f"data.batch_size must be >= 1, got {batch_size}.")
        if len(x) == 0:
            raise DataError("a node was given no training examples.")
        if order not in ORDERS:
            raise DataError(f"data.order must be one of {ORDERS}, got {order!r}.")
        self.x = x
        self.y = y
        self.examples = len(x)
        """How many training examples the node holds (FedAvg's weight)."""
        self.batch_size = min(batch_size, len(x))
        self._gen = torch.Generator().manual_seed(seed)
        self._sorted = order == "sorted"
        self._order = self._new_order()
        self._pos = 0

    def _new_order(self) -> torch.Tensor:
        perm = torch.randperm(len(self.x), generator=self._gen)
        if self._sorted:
            perm = perm[torch.sort(self.y[perm], stable=True).indices]
        return perm

    def __len__(self) -> int:
        """Number of examples this node holds."""
        return len(self.x)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the next ``batch_size`` examples, starting a new epoch when needed."""
        if self._pos + self.batch_size > len(self._order):
            self._order = self._new_order()
            self._pos = 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.x[idx], self.y[idx]
