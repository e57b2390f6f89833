"""Datasets, partitions across peers, and per-peer minibatch streams.

Everything here is seeded explicitly, so a run's data split replays exactly. The names
callers use are importable from ``fedcore.data`` itself; each lives in one module:

========================  ===================================================================
:mod:`.types`             :class:`Dataset` (checks its shapes, labels and writers when built),
                          :func:`first_non_finite`
:mod:`.builtin`           the datasets that need no files: :func:`digits` (scikit-learn's 8x8
                          digits, standardized with the training split's statistics),
                          :func:`mnist1d`
:mod:`.loading`           :func:`load_dataset`: a built-in name, ``"folder:PATH"`` or a user's
                          ``"pkg.module:factory"`` (called as ``factory(seed=...,
                          test_fraction=...)``, returning a :class:`Dataset`)
:mod:`.partitions`        :func:`partition`: ``iid``, ``dirichlet``, ``shards``, ``quantity``,
                          ``natural``
:mod:`.batches`           :class:`StackedBatches` (every peer's minibatches, reshuffled every
                          epoch, as index tensors), :class:`BatchStream` (one peer's: its
                          one-row case), :class:`NoData`
:mod:`.files`             what the datasets read from files share: ``data.root``, fetch
                          commands, the checks every (hostile) file passes
:mod:`.cifar`             ``cifar10``, ``cifar100`` (and their stand-in files)
:mod:`.idx`               ``fashion-mnist``, ``emnist``: idx files (and their stand-in files)
:mod:`.leaf`              ``femnist``, ``shakespeare``: LEAF's JSON (and their stand-in files)
:mod:`.cache`             the decode cache of LEAF's JSON
:mod:`.folder`            ``folder:PATH``: a ``.npz``, :mod:`.images` folders, or Hugging Face
                          :mod:`.tables` (``.parquet``, ``.arrow``)
:mod:`.standin`           stand-in files of every dataset read from files
                          (``python -m fedcore.data.standin NAME... --root DIR``)
========================  ===================================================================

The built-in names and the module of each dataset are listed in
:data:`fedcore.registry.DATASETS`.
"""

from __future__ import annotations

from fedcore.data.batches import BatchStream, NoData, StackedBatches
from fedcore.data.builtin import DIGITS_EXAMPLES, digits, mnist1d, training_examples
from fedcore.data.loading import (
    DATASETS,
    load_dataset,
    load_object,
    refused_arguments,
    resolve_factory,
)
from fedcore.data.partitions import (
    MIN_EXAMPLES,
    PARTITIONS,
    check_partition_size,
    natural_owners,
    own_test_parts,
    partition,
)
from fedcore.data.types import DataError, Dataset, first_non_finite

__all__ = [
    "DATASETS",
    "DIGITS_EXAMPLES",
    "MIN_EXAMPLES",
    "PARTITIONS",
    "BatchStream",
    "DataError",
    "Dataset",
    "NoData",
    "StackedBatches",
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
