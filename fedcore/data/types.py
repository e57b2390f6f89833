"""The dataset type every loader returns, and the check of its features.

:class:`Dataset` checks its own shapes, labels and writers when built; :func:`first_non_finite`
finds an example holding NaN or an infinity (where data are loaded, so a file's NaN is
refused as the file's). A dataset's errors are :class:`~fedcore.errors.DataError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore.errors import DataError

__all__ = ["DataError", "Dataset", "first_non_finite"]


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
