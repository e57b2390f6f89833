"""Fashion-MNIST and EMNIST from their idx files (MNIST's format), and stand-in files of them.

========================  ===================================================================
``fashion-mnist``         ``ROOT/FashionMNIST/raw/`` (torchvision's ``FashionMNIST(root)``):
                          idx files, plain or ``.gz``
``emnist``                ``ROOT/EMNIST/raw/`` (torchvision's ``EMNIST(root, split=...)``):
                          the ``balanced`` split's idx files (47 classes)
========================  ===================================================================

An idx header that claims more than :data:`MAX_IDX_BYTES` is refused before the values are
read.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.data.files import (
    _at,
    _data_file,
    _finite,
    _images,
    _int_labels,
    _missing,
    _reading,
    _real_folder,
    data_root,
)
from fedcore.data.standin import pixels
from fedcore.data.types import Dataset
from fedcore.errors import DataError

__all__ = ["MAX_IDX_BYTES", "emnist", "fashion_mnist", "read_idx", "standin"]

MAX_IDX_BYTES = 4 * 2**30
"""Largest array an idx file may hold (EMNIST's largest split holds 0.55 GB): a header that
claims more is refused before the values are read (a small ``.gz`` can claim gigabytes)."""

_IDX_TYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}

_CHUNK = 1 << 24
"""Bytes read at a time from a compressed file (what is held grows with what is there,
never with what a header claims)."""


def _read_up_to(f: Any, limit: int) -> bytes:
    """At most ``limit`` bytes of ``f``, read a chunk at a time."""
    parts = []
    left = limit
    while left > 0:
        part = f.read(min(left, _CHUNK))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_idx(path: Path, folder: Path | None = None) -> np.ndarray:
    """The array of an idx file (MNIST's format; ``.gz`` read as it is): a magic number of
    two zero bytes, a type byte and the number of dimensions, then each dimension's size
    as a big-endian uint32, then the values. ``folder`` (default: the file's own) is the
    dataset's folder the file must lie inside.

    Raises:
        DataError: naming the file: not an idx file, cut short or longer than its header
            says, a header claiming more than :data:`MAX_IDX_BYTES`.
    """
    real = _data_file(path, _real_folder(folder if folder is not None else path.parent))
    with _reading(path, "an idx file"):
        opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
        with opener(real, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] or head[1] or head[2] not in _IDX_TYPES:
                raise DataError(f"{_at(path)} is not an idx file (its first bytes are {head!r}).")
            ndim = head[3]
            if not ndim:
                raise DataError(f"{_at(path)}: its idx header gives no dimensions.")
            dims = f.read(4 * ndim)
            if len(dims) != 4 * ndim:
                raise DataError(f"{_at(path)} is cut short inside its idx header.")
            shape = tuple(int(v) for v in np.frombuffer(dims, ">u4"))
            dtype = np.dtype(_IDX_TYPES[head[2]])
            count = int(np.prod(shape, dtype=object)) if shape else 0
            if count * dtype.itemsize > MAX_IDX_BYTES:
                raise DataError(
                    f"{_at(path)}: its header claims {shape} values, more than the "
                    f"{MAX_IDX_BYTES} bytes fedcore reads from one idx file."
                )
            body = _read_up_to(f, count * dtype.itemsize + 1)
    if len(body) != count * dtype.itemsize:
        held = f"{len(body) // dtype.itemsize}" if len(body) < count * dtype.itemsize else "more"
        raise DataError(f"{_at(path)}: the header says {shape} values, but the file holds {held}.")
    return np.frombuffer(body, dtype, count=count).reshape(shape)


def _idx_pair(folder: Path, images: str, labels: str, classes: int) -> tuple[Any, Any] | None:
    found = []
    for stem in (images, labels):
        path = next((p for p in (folder / stem, folder / f"{stem}.gz") if os.path.lexists(p)), None)
        if path is None:
            return None
        found.append(path)
    real = _real_folder(folder)
    x_path, y_path = found
    x, raw_y = read_idx(x_path, real), read_idx(y_path, real)
    if x.ndim != 3 or raw_y.ndim != 1 or len(x) != len(raw_y):
        raise DataError(
            f"{_at(x_path)} holds {x.shape} and {_at(y_path)} {raw_y.shape}; expected "
            "[n, H, W] images and n labels."
        )
    y = _int_labels(raw_y, f"the labels of {_at(y_path)}", classes)
    _finite(x, _at(x_path))
    return x[:, None], y


def _idx_dataset(name: str, folder: Path, stems: tuple[str, str], classes: int) -> Dataset:
    base = folder.parent.parent
    train = _idx_pair(
        folder, f"{stems[0]}-images-idx3-ubyte", f"{stems[0]}-labels-idx1-ubyte", classes
    )
    test = _idx_pair(
        folder, f"{stems[1]}-images-idx3-ubyte", f"{stems[1]}-labels-idx1-ubyte", classes
    )
    if train is None or test is None:
        raise _missing(name, [folder], base)
    if name == "emnist":  # EMNIST's idx images are stored transposed
        train = (train[0].transpose(0, 1, 3, 2), train[1])
        test = (test[0].transpose(0, 1, 3, 2), test[1])
    if train[0].shape[1:] != test[0].shape[1:]:
        raise DataError(
            f"{_at(folder)}: the training images are {train[0].shape[2:]} and the test "
            f"images {test[0].shape[2:]}; both must have one size."
        )
    return _images(name, train, test, classes, _at(folder))


def fashion_mnist(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """Fashion-MNIST: 60,000 training and 10,000 test images of 28x28, 10 classes."""
    folder = data_root(root) / "FashionMNIST" / "raw"
    return _idx_dataset("fashion-mnist", folder, ("train", "t10k"), 10)


def emnist(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """EMNIST's ``balanced`` split: 112,800 training and 18,800 test images of 28x28 (digits
    and letters), 47 classes."""
    folder = data_root(root) / "EMNIST" / "raw"
    return _idx_dataset("emnist", folder, ("emnist-balanced-train", "emnist-balanced-test"), 47)


# -- stand-in files ---------------------------------------------------------------------------


def standin(
    name: str, root: Path, rng: np.random.Generator, *, samples: int, writers: int, compress: bool
) -> Path:
    """Stand-in idx files of ``name`` (``fashion-mnist`` or ``emnist``) under ``root``
    (gzipped with ``compress``, as their downloads are; :func:`fedcore.data.standin.write_standin`);
    ``writers`` is not used."""
    return _write_idx_set(root, rng, samples, name == "emnist", compress)


def _write_idx(path: Path, array: np.ndarray, *, compress: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


def _write_idx_set(
    root: Path, rng: np.random.Generator, samples: int, emnist: bool, compress: bool
) -> Path:
    classes = 47 if emnist else 10
    folder = root / ("EMNIST" if emnist else "FashionMNIST") / "raw"
    folder.mkdir(parents=True, exist_ok=True)
    stems = ("emnist-balanced-train", "emnist-balanced-test") if emnist else ("train", "t10k")
    for stem, n in zip(stems, (samples, max(samples // 4, 1)), strict=True):
        y = rng.integers(0, classes, n)
        _write_idx(
            folder / f"{stem}-images-idx3-ubyte",
            pixels(rng, y, (28, 28), classes),
            compress=compress,
        )
        _write_idx(folder / f"{stem}-labels-idx1-ubyte", y, compress=compress)
    return folder
