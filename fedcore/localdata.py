"""The datasets the field publishes on, read from the files where a user has put them.

Nothing here downloads anything. Each dataset is read from ``data.root``
(:func:`data_root`: the config's value, else ``$FEDCORE_DATA``, else
``~/.cache/fedcore/data``), in the layout its own tools write:

========================  ===================================================================
``cifar10``               ``ROOT/cifar-10-batches-py/`` (torchvision's ``CIFAR10(root)``; the
                          batches of the python release), or ``ROOT/cifar-10-batches-bin/``
``cifar100``              ``ROOT/cifar-100-python/`` (torchvision's ``CIFAR100(root)``), fine
                          labels
``fashion-mnist``         ``ROOT/FashionMNIST/raw/`` (torchvision's ``FashionMNIST(root)``):
                          idx files, plain or ``.gz``
``emnist``                ``ROOT/EMNIST/raw/`` (torchvision's ``EMNIST(root, split=...)``):
                          the ``balanced`` split's idx files (47 classes)
``femnist``               LEAF's per-user JSON: ``train/`` and ``test/`` in ``ROOT/femnist``,
                          ``ROOT/femnist/data`` or ``ROOT`` (LEAF writes them in
                          ``leaf/data/femnist/data/``); 62 classes, one group per writer
``shakespeare``           the same for LEAF's Shakespeare: 80-character lines, the next
                          character as the label, one group per speaking role
``folder:PATH``           a ``.npz`` file (``x_train``, ``y_train``, ``x_test``, ``y_test``),
                          a folder of ``train/`` and ``test/`` image folders (one folder per
                          class), or a Hugging Face ``datasets`` folder of ``.parquet`` or
                          ``.arrow`` files whose names or folders say ``train`` and ``test``
========================  ===================================================================

The formats are read here rather than through torchvision: they are a few lines each (idx
headers, the CIFAR batches, JSON), and torchvision would tie the install to one torch
build. The CIFAR python batches are pickles: they are read by an unpickler that allows only
the types a CIFAR batch holds (dicts, str, bytes, lists, ints and NumPy arrays:
:class:`_ArraysOnly`) and refuses everything else, so a crafted batch cannot run code.

Every file is hostile until checked. A file is read only when it is a regular file whose
real path lies inside the folder the dataset is read from (a link out of that folder is
refused); an image whose header claims more than :data:`MAX_IMAGE_PIXELS` pixels is refused
before it is decoded; non-finite features and labels out of range are refused where they
are read. Whatever is wrong, from a file's bytes to one label, is one :class:`DataError`
naming the file, raised while the run is set up, before any peer starts. The LEAF decode
cache (:data:`LEAF_CACHE`) is used only where it is a real folder inside the dataset's, and
removes only the files it wrote.

Images become float32 ``[n, C, H, W]``, each channel standardized with the training
split's mean and standard deviation; Shakespeare's lines become int64 character indices.
A dataset that is absent raises :class:`MissingDataset`: one line with where fedcore
looked and the command that fetches it on a machine with network.
"""

from __future__ import annotations

import array
import gzip
import hashlib
import io
import json
import logging
import os
import pickle  # CIFAR's python release, local files only (never sent); via _ArraysOnly
import re
import stat
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fedcore.config import DATA_ENV
from fedcore.data import Dataset, first_non_finite
from fedcore.errors import DataError, FedcoreError
from fedcore.ids import clip, error_text

logger = logging.getLogger(__name__)

__all__ = [
    "DATA_ENV",
    "FETCH",
    "LEAF_CACHE",
    "LEAF_SEQUENCE",
    "MAX_CLASSES",
    "MAX_IDX_BYTES",
    "MAX_IMAGE_PIXELS",
    "SHAKESPEARE_LETTERS",
    "MissingDataset",
    "cifar10",
    "cifar100",
    "data_root",
    "emnist",
    "fashion_mnist",
    "femnist",
    "folder",
    "read_idx",
    "shakespeare",
]

SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
"""LEAF's Shakespeare vocabulary: a character's index here is its class (80 characters)."""

LEAF_SEQUENCE = 80
"""Characters of one Shakespeare example (LEAF's sequence length)."""

FEMNIST_PIXELS = 784
"""Values of one FEMNIST example (28x28 pixels in [0, 1])."""

MAX_IMAGE_PIXELS = 4096 * 4096
"""Most pixels of one image fedcore decodes (an image of a folder of images, or a table's
image cell). A few hundred bytes of PNG can claim 30000x30000 pixels, gigabytes once
decoded: an image whose header claims more than this is refused before it is decoded."""

MAX_CLASSES = 100_000
"""Most classes of a ``folder:`` dataset (its largest label plus one, the width of the
model's output layer): a larger label is refused as out of range."""

MAX_IDX_BYTES = 4 * 2**30
"""Largest array an idx file may hold (EMNIST's largest split holds 0.55 GB): a header that
claims more is refused before the values are read (a small ``.gz`` can claim gigabytes)."""

FETCH = {
    "cifar10": 'python -c "import torchvision; torchvision.datasets.CIFAR10({root!r}, '
    'download=True)"',
    "cifar100": 'python -c "import torchvision; torchvision.datasets.CIFAR100({root!r}, '
    'download=True)"',
    "fashion-mnist": 'python -c "import torchvision; torchvision.datasets.FashionMNIST('
    '{root!r}, download=True)"',
    "emnist": 'python -c "import torchvision; torchvision.datasets.EMNIST({root!r}, '
    "split='balanced', download=True)\"",
    "femnist": "git clone https://github.com/TalwalkarLab/leaf && (cd leaf/data/femnist && "
    "./preprocess.sh -s niid --sf 0.05 -k 0 -t sample) && mkdir -p {root}/femnist && "
    "cp -r leaf/data/femnist/data/train leaf/data/femnist/data/test {root}/femnist/",
    "shakespeare": "git clone https://github.com/TalwalkarLab/leaf && "
    "(cd leaf/data/shakespeare && ./preprocess.sh -s niid --sf 0.2 -k 0 -t sample) && "
    "mkdir -p {root}/shakespeare && cp -r leaf/data/shakespeare/data/train "
    "leaf/data/shakespeare/data/test {root}/shakespeare/",
}
"""Per dataset, the command that puts its files under ``{root}`` on a machine with network
(torchvision's downloader, or LEAF's preprocessing; ``--sf`` is the fraction of LEAF's
data to keep: raise it for the whole dataset)."""


class MissingDataset(DataError):
    """A dataset's files are not where fedcore looked (one line: where, and the fetch
    command)."""


def data_root(root: str = "") -> Path:
    """Where the datasets' files are: ``root``, else ``$FEDCORE_DATA``, else
    ``~/.cache/fedcore/data`` (``~`` expanded in each)."""
    chosen = root or os.environ.get(DATA_ENV, "") or "~/.cache/fedcore/data"
    return Path(chosen).expanduser()


def _missing(name: str, looked: Iterable[Path], root: Path) -> MissingDataset:
    where = " or ".join(_at(p) for p in looked)
    return MissingDataset(
        f"dataset {name!r} is not in {where} (data.root = {_at(root)}; fedcore never "
        f"downloads: fetch it on a machine with network with: "
        f"{FETCH[name].format(root=str(root))})."
    )


# -- hostile files ----------------------------------------------------------------------------


def _at(path: Path | str) -> str:
    """``path`` as a message shows it: as written, or quoted where it holds a character
    that would break the message's line."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def _real_folder(path: Path) -> Path:
    """The real path of the folder a dataset is read from (links resolved): what its files
    must lie inside."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise DataError(f"cannot read the folder {_at(path)}: {error_text(exc, 200)}.") from None


def _data_file(path: Path, folder: Path) -> Path:
    """The real path of ``path``, checked to be a regular file inside ``folder`` (a
    :func:`_real_folder`): a link out of the dataset's folder, a device (``/dev/zero``
    reads forever), a pipe or a missing file is refused by name.

    Raises:
        DataError: naming ``path`` and what it is.
    """
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        if path.is_symlink():
            raise DataError(f"{_at(path)} is a link to a file that does not exist.") from None
        raise DataError(f"{_at(path)} is missing.") from None
    except (OSError, RuntimeError) as exc:  # a loop of links, a folder that cannot be read
        raise DataError(f"cannot read {_at(path)}: {error_text(exc, 200)}.") from None
    if not real.is_relative_to(folder):
        raise DataError(
            f"{_at(path)} is a link to {_at(real)}, outside the dataset's folder "
            f"{_at(folder)}; fedcore reads no file outside it: copy the file in."
        )
    try:
        mode = real.stat().st_mode
    except OSError as exc:
        raise DataError(f"cannot read {_at(path)}: {exc.strerror or exc}.") from None
    if not stat.S_ISREG(mode):
        raise DataError(
            f"{_at(path)} is not a regular file (a folder, device or pipe); a dataset's files "
            "are plain files."
        )
    return real


@contextmanager
def _reading(path: Path, what: str) -> Iterator[None]:
    """Turn whatever reading ``path`` as ``what`` raises (a truncated file, bytes of another
    format, an allocation the file claims) into one :class:`DataError` naming the file.

    Wraps only the reading libraries' calls (pickle, json, NumPy, Pillow, pyarrow, gzip):
    a file's bytes can make them raise anything.
    """
    try:
        yield
    except FedcoreError:
        raise
    except MemoryError:
        raise DataError(
            f"{_at(path)}: reading it as {what} ran out of memory (it claims more data than "
            "fits); check the file."
        ) from None
    except RecursionError:
        raise DataError(f"{_at(path)} is not {what}: it is nested too deeply.") from None
    except OSError as exc:
        if exc.errno is not None:  # the file could not be read, whatever it holds
            raise DataError(f"cannot read {_at(path)}: {exc.strerror or exc}.") from None
        raise DataError(f"{_at(path)} is not {what}: {_reason(exc)}.") from None
    except Exception as exc:  # a hostile file can make a parser raise anything
        raise DataError(f"{_at(path)} is not {what}: {_reason(exc)}.") from None


def _reason(exc: BaseException) -> str:
    """A reading library's error as part of one line (no trailing full stop)."""
    return error_text(exc, 200).rstrip(".")


def _listing(folder: Path, pattern: str = "*") -> list[Path]:
    """The sorted entries of ``folder`` matching ``pattern`` (an unreadable folder refused by
    name)."""
    try:
        return sorted(folder.glob(pattern))
    except OSError as exc:
        raise DataError(f"cannot read the folder {_at(folder)}: {exc.strerror or exc}.") from None


def _int_labels(values: object, what: str, classes: int) -> np.ndarray:
    """``values`` (an array or a list a file holds) as int64 labels, checked: one integer
    per example, each in ``[0, classes)``. A list is converted by :mod:`array`, which
    refuses anything but ints without building a string array as wide as its longest
    string.

    Raises:
        DataError: naming ``what`` (the file and its entry) and the first bad label.
    """
    if isinstance(values, np.ndarray):
        y = values
        if y.dtype.kind == "f":
            if y.size and not bool(np.all(np.isfinite(y) & (y == np.round(y)))):
                raise DataError(f"{what} hold a label that is not a whole number.")
        elif y.dtype.kind not in "iu":
            raise DataError(f"{what} are {y.dtype} values, not integer labels.")
    elif type(values) in (list, tuple):
        items: Any = values
        try:
            y = np.frombuffer(array.array("q", items), dtype=np.int64)
        except (TypeError, OverflowError):
            bad = next((v for v in items if type(v) is not int or not -(2**63) <= v < 2**63), None)
            raise DataError(
                f"{what} hold {clip(bad, 40)}, which is not an integer label."
            ) from None
    else:
        raise DataError(f"{what} are a {type(values).__name__}, not a list of labels.")
    if y.ndim != 1:
        raise DataError(f"{what} have shape {y.shape}; expected one label per example.")
    if y.size:
        low, high = y.min(), y.max()
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            where = int(np.flatnonzero(y == bad)[0])
            raise DataError(
                f"{what} hold the label {bad} (example {where}), outside [0, {classes})."
            )
    return y.astype(np.int64)


def _finite(x: np.ndarray, what: str) -> None:
    """Refuse NaN and infinite values in ``x`` (examples along its first axis)."""
    bad = first_non_finite(x)
    if bad is not None:
        raise DataError(
            f"example {bad} of {what} holds NaN or an infinite value (or one too large for "
            "float32); fedcore refuses non-finite features: fix or drop it."
        )


def _standardized(name: str, x_train: np.ndarray, x_test: np.ndarray) -> tuple[Any, Any]:
    """``[n, C, H, W]`` float32 images, each channel standardized with the training split's
    mean and standard deviation (of uint8 pixels: from each channel's histogram, exactly
    and in one pass)."""
    if not len(x_train):
        raise DataError(f"dataset {name!r} has no training examples.")
    channels = x_train.shape[1]
    if x_train.dtype == np.uint8:
        values = np.arange(256, dtype=np.float64)
        mean = np.empty(channels)
        std = np.empty(channels)
        for c in range(channels):
            counts = np.bincount(x_train[:, c].ravel(), minlength=256).astype(np.float64)
            total = counts.sum()
            mean[c] = (counts @ values) / total
            std[c] = np.sqrt((counts @ (values - mean[c]) ** 2) / total)
    else:
        mean = x_train.mean(axis=(0, 2, 3), dtype=np.float64)
        std = x_train.std(axis=(0, 2, 3), dtype=np.float64)
    std[~(std > 0) | ~np.isfinite(std)] = 1.0
    mean[~np.isfinite(mean)] = 0.0
    shape = (1, channels, 1, 1)
    shift = mean.astype(np.float32).reshape(shape)
    scale = (1.0 / std).astype(np.float32).reshape(shape)
    out = []
    for x in (x_train, x_test):
        y = x.astype(np.float32)
        y -= shift
        y *= scale
        out.append(torch.from_numpy(y))
    return out[0], out[1]


def _images(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    num_classes: int,
    where: str,
) -> Dataset:
    x_train, x_test = _standardized(name, train[0], test[0])
    for split, x in (("training", x_train), ("test", x_test)):
        _finite(x.numpy(), f"the {split} images of {where}")
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=torch.from_numpy(train[1].astype(np.int64)),
        x_test=x_test,
        y_test=torch.from_numpy(test[1].astype(np.int64)),
        num_classes=num_classes,
    )


# -- CIFAR ------------------------------------------------------------------------------------


class _ArraysOnly(pickle.Unpickler):
    """The unpickler of CIFAR's python batches (local files only: nothing pickled is ever
    sent). It allows only the types a CIFAR batch holds: dicts, str, bytes, lists, ints and
    NumPy arrays, whose pickles refer to NumPy's array reconstruction and, for bytes pickled
    by protocol 2, ``_codecs.encode``. Any other global is refused, so a crafted file cannot
    run code; :func:`_not_plain` then checks what was built (no array of Python objects,
    no container but the batch's dict and its lists of scalars)."""

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(
                f"it refers to {clip(f'{module}.{name}', 80)}, which a CIFAR batch never does "
                "(not reading it: it may not be CIFAR's file)"
            )
        if module.startswith("numpy") and module.endswith("multiarray"):
            from numpy._core import multiarray

            return multiarray._reconstruct
        return super().find_class(module, name)


_SCALARS = (int, float, str, bytes)
"""The types of a CIFAR batch's values besides arrays, and of its lists' items."""


def _not_plain(raw: object) -> str | None:
    """What in an unpickled CIFAR batch is none of the types a batch holds (a dict of str or
    bytes keys to arrays of numbers, lists of scalars and scalars), or None. Lists of lists
    are refused, so the walk is as long as the file (a pickle can refer to one list many
    times)."""
    if type(raw) is not dict:
        return f"a {type(raw).__name__}, not a dict"
    for key, value in raw.items():
        if type(key) not in (str, bytes):
            return f"a key of type {type(key).__name__}"
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                return f"an array of Python objects under {clip(key, 40)}"
        elif type(value) in (list, tuple):
            bad = next((v for v in value if type(v) not in _SCALARS), None)
            if bad is not None:
                return f"a {type(bad).__name__} in the list under {clip(key, 40)}"
        elif type(value) not in _SCALARS:
            return f"a {type(value).__name__} under {clip(key, 40)}"
    return None


def _cifar_batch(path: Path, folder: Path) -> dict[str, Any]:
    """One batch of the python release, as ``{"data": [n, 3072] uint8, labels...}``."""
    real = _data_file(path, folder)
    with _reading(path, "a CIFAR batch of the python release"), real.open("rb") as f:
        raw = _ArraysOnly(f, encoding="latin1").load()
    problem = _not_plain(raw)
    if problem is not None:
        raise DataError(f"{_at(path)} is not a CIFAR batch: it holds {problem}.")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in raw.items()}


def _cifar_pixels(data: object, path: Path) -> np.ndarray:
    """A batch's ``data`` as ``[n, 3, 32, 32]`` uint8, checked: ``[n, 3072]`` integers in
    ``[0, 255]``."""
    if (
        not isinstance(data, np.ndarray)
        or data.dtype.kind not in "iu"
        or data.ndim != 2
        or data.shape[1] != 3072
    ):
        held = (
            f"a {data.dtype} array of shape {data.shape}"
            if isinstance(data, np.ndarray)
            else f"a {type(data).__name__}"
        )
        raise DataError(
            f"the 'data' of {_at(path)} is {held}; a CIFAR batch holds [n, 3072] uint8 pixels."
        )
    if data.dtype != np.uint8 and data.size and (data.min() < 0 or data.max() > 255):
        raise DataError(f"the 'data' of {_at(path)} holds values outside the pixels' 0 to 255.")
    return data.astype(np.uint8, copy=False).reshape(-1, 3, 32, 32)


def _cifar_files(name: str, folder: Path, files: list[str], base: Path) -> Path:
    """``folder``'s real path, once every one of ``files`` is there (a release found by its
    test batch, with a training batch missing, is refused by name)."""
    absent = [f for f in files if not os.path.lexists(folder / f)]
    if absent:
        raise DataError(
            f"{_at(folder)} lacks {', '.join(absent)} of {name}'s files; fetch it again on a "
            f"machine with network with: {FETCH[name].format(root=str(base))}."
        )
    return _real_folder(folder)


def _cifar_python(
    folder: Path, files: list[str], label_key: str, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for file in files:
        path = folder / file
        batch = _cifar_batch(path, folder)
        if "data" not in batch or label_key not in batch:
            held = ", ".join(clip(k, 30) for k in list(batch)[:6])
            raise DataError(f"{_at(path)} has no {label_key!r} or 'data' entry (it has {held}).")
        x = _cifar_pixels(batch["data"], path)
        y = _int_labels(batch[label_key], f"the {label_key!r} of {_at(path)}", classes)
        if len(x) != len(y):
            raise DataError(f"{_at(path)} holds {len(x)} images and {len(y)} labels.")
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _cifar_binary(
    folder: Path, files: list[str], label_bytes: int, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """The binary release: per image ``label_bytes`` label bytes (CIFAR-100: coarse, fine;
    the last is used) then 3072 pixel bytes."""
    rows = []
    width = label_bytes + 3072
    for file in files:
        path = folder / file
        real = _data_file(path, folder)
        with _reading(path, "a CIFAR binary batch"):
            raw = np.frombuffer(real.read_bytes(), dtype=np.uint8)
        if not raw.size or raw.size % width:
            raise DataError(
                f"{_at(path)} is not a CIFAR binary batch ({raw.size} bytes, not a multiple "
                f"of {width})."
            )
        table = raw.reshape(-1, width)
        _int_labels(table[:, label_bytes - 1], f"the labels of {_at(path)}", classes)
        rows.append(table)
    table = np.concatenate(rows)
    return table[:, label_bytes:].reshape(-1, 3, 32, 32), table[:, label_bytes - 1].astype(np.int64)


_Release = tuple[Path, list[str], list[str]]
"""A CIFAR release: its folder, training files and test files."""


def _cifar(name: str, base: Path, python: _Release, binary: _Release) -> Dataset:
    """CIFAR's python release where its test batch is, else its binary release."""
    classes = 100 if name == "cifar100" else 10
    if os.path.lexists(python[0] / python[2][0]):
        folder, train_files, test_files = python
        real = _cifar_files(name, folder, train_files + test_files, base)
        key = "fine_labels" if classes == 100 else "labels"
        train = _cifar_python(real, train_files, key, classes)
        test = _cifar_python(real, test_files, key, classes)
    elif os.path.lexists(binary[0] / binary[2][0]):
        folder, train_files, test_files = binary
        real = _cifar_files(name, folder, train_files + test_files, base)
        label_bytes = 2 if classes == 100 else 1
        train = _cifar_binary(real, train_files, label_bytes, classes)
        test = _cifar_binary(real, test_files, label_bytes, classes)
    else:
        raise _missing(name, [python[0], binary[0]], base)
    return _images(name, train, test, classes, _at(folder))


def cifar10(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """CIFAR-10: 50,000 training and 10,000 test images of 32x32x3, 10 classes (its own
    test split: ``seed`` and ``test_fraction`` are not used)."""
    base = data_root(root)
    batches = [f"data_batch_{i}" for i in range(1, 6)]
    return _cifar(
        "cifar10",
        base,
        (base / "cifar-10-batches-py", batches, ["test_batch"]),
        (base / "cifar-10-batches-bin", [f"{b}.bin" for b in batches], ["test_batch.bin"]),
    )


def cifar100(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """CIFAR-100: 50,000 training and 10,000 test images of 32x32x3, its 100 fine labels."""
    base = data_root(root)
    return _cifar(
        "cifar100",
        base,
        (base / "cifar-100-python", ["train"], ["test"]),
        (base / "cifar-100-binary", ["train.bin"], ["test.bin"]),
    )


# -- idx (Fashion-MNIST, EMNIST) --------------------------------------------------------------

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


# -- LEAF (FEMNIST, Shakespeare) --------------------------------------------------------------


def _leaf_folder(name: str, root: str) -> Path:
    base = data_root(root)
    looked = [base / name, base / name / "data", base]  # the dataset's own folder first
    for folder in looked:
        if (folder / "train").is_dir() and (folder / "test").is_dir():
            return _real_folder(folder)
    raise _missing(name, [p / "train" for p in looked], base)


_LeafFile = tuple[Path, Path]
"""A LEAF JSON file: its path as found, and its real path (checked)."""


def _leaf_files(folder: Path) -> dict[str, list[_LeafFile]]:
    """The JSON files of ``folder``'s ``train/`` and ``test/``, each checked to be a file
    inside ``folder``."""
    out: dict[str, list[_LeafFile]] = {}
    for split in ("train", "test"):
        paths = _listing(folder / split, "*.json")
        if not paths:
            raise DataError(f"{_at(folder / split)} holds no LEAF .json files.")
        out[split] = [(p, _data_file(p, folder)) for p in paths]
    return out


def _json_kind(value: object) -> str:
    """The JSON name of ``value``'s type, with its article."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return kinds.get(type(value), "a number" if isinstance(value, int | float) else "null")


def _leaf_file(path: Path, real: Path) -> dict[str, dict[str, list[Any]]]:
    """The ``user_data`` of one LEAF JSON file, checked: an object of writers, each with
    lists ``x`` and ``y`` of one length."""

    def refuse_constant(name: str) -> Any:
        raise DataError(
            f"{_at(path)} holds {name}; fedcore refuses non-finite values: fix or drop it."
        )

    with _reading(path, "a LEAF data file (JSON)"), real.open(encoding="utf-8") as f:
        blob = json.load(f, parse_constant=refuse_constant)
    if type(blob) is not dict or "user_data" not in blob:
        raise DataError(
            f"{_at(path)} is not a LEAF data file: it is {_json_kind(blob)} without 'user_data'."
            if type(blob) is not dict
            else f"{_at(path)} is not a LEAF data file: it has no 'user_data'."
        )
    part = blob["user_data"]
    if type(part) is not dict:
        raise DataError(
            f"{_at(path)}: its 'user_data' is {_json_kind(part)}, not an object of writers "
            '(LEAF writes {"user_data": {writer: {"x": [...], "y": [...]}}}).'
        )
    for user, data in part.items():
        if type(data) is not dict:
            raise DataError(
                f"{_at(path)}: writer {clip(user, 60)} is {_json_kind(data)}, not an object "
                "of 'x' and 'y' lists."
            )
        for key in ("x", "y"):
            if key not in data:
                raise DataError(f"{_at(path)}: writer {clip(user, 60)} has no {key!r}.")
            if type(data[key]) is not list:
                raise DataError(
                    f"{_at(path)}: the {key!r} of writer {clip(user, 60)} is "
                    f"{_json_kind(data[key])}, not a list."
                )
        if len(data["x"]) != len(data["y"]):
            raise DataError(
                f"{_at(path)}: writer {clip(user, 60)} has {len(data['x'])} x and "
                f"{len(data['y'])} y."
            )
    return part


_Encoder = Callable[[dict[str, list[Any]], Path, str], tuple[np.ndarray, np.ndarray]]
"""Turns one writer's ``{"x": [...], "y": [...]}`` of a file into checked arrays."""


def _femnist_user(data: dict[str, list[Any]], path: Path, user: str) -> tuple[Any, Any]:
    """One writer's examples: rows of 784 numbers, converted by :mod:`array`, which refuses
    anything but numbers (a string, a list, null) at C speed."""
    pixels = array.array("f")
    for i, row in enumerate(data["x"]):
        if type(row) is not list or len(row) != FEMNIST_PIXELS:
            size = f"{len(row)} values" if type(row) is list else _json_kind(row)
            raise DataError(
                f"{_at(path)}: example {i} of writer {clip(user, 60)} is {size}; FEMNIST's "
                f"are rows of {FEMNIST_PIXELS} numbers."
            )
        try:
            pixels.extend(row)
        except TypeError:
            bad = next((v for v in row if type(v) not in (int, float)), None)
            raise DataError(
                f"{_at(path)}: example {i} of writer {clip(user, 60)} holds "
                f"{clip(bad, 40)}, which is not a number."
            ) from None
    x = np.frombuffer(pixels, dtype=np.float32).reshape(-1, 1, 28, 28)
    _finite(x, f"writer {clip(user, 60)} in {_at(path)}")
    y = _int_labels(data["y"], f"the labels of writer {clip(user, 60)} in {_at(path)}", 62)
    return x, y


_LETTER = {c: i for i, c in enumerate(SHAKESPEARE_LETTERS)}
_UNKNOWN = _LETTER[" "]


def _letters(text: str) -> list[int]:
    return [_LETTER.get(c, _UNKNOWN) for c in text]


def _shakespeare_user(data: dict[str, list[Any]], path: Path, user: str) -> tuple[Any, Any]:
    """One writer's lines of 80 characters and next characters (a character outside the
    vocabulary reads as a space)."""
    lines, chars = data["x"], data["y"]
    for i, line in enumerate(lines):
        if type(line) is not str or len(line) != LEAF_SEQUENCE:
            raise DataError(
                f"{_at(path)}: example {i} of writer {clip(user, 60)} is "
                f"{clip(line, 40)}, not a string of {LEAF_SEQUENCE} characters (LEAF's "
                "Shakespeare lines)."
            )
    for i, char in enumerate(chars):
        if type(char) is not str or len(char) != 1:
            raise DataError(
                f"{_at(path)}: label {i} of writer {clip(user, 60)} is {clip(char, 40)}, "
                "not one character (LEAF's Shakespeare labels are the next character)."
            )
    x = np.asarray([_letters(s) for s in lines], dtype=np.int64).reshape(-1, LEAF_SEQUENCE)
    y = np.asarray(_letters("".join(chars)), dtype=np.int64)
    return x, y


LEAF_CACHE = ".fedcore-decoded"
"""The folder, beside LEAF's ``train/`` and ``test/``, that keeps their decoded arrays."""

_CACHE_FORMAT = 2
"""Bump when what :func:`_leaf_decoded` returns changes: older cached files are then unused
(and removed: :func:`_write_cache`). 2: the writers as the bytes of a JSON list."""

_CACHE_KEYS = frozenset({"x_train", "y_train", "g_train", "x_test", "y_test", "g_test", "writers"})
"""The arrays of a decoded file (format 1 held the same names)."""


def _leaf_key(files: dict[str, list[_LeafFile]], folder: Path) -> str:
    """A digest of every JSON file of ``folder``'s ``train/`` and ``test/``: name, size and
    modification time (a changed or added file makes a new key)."""
    listing = []
    for split in ("train", "test"):
        for path, real in files[split]:
            try:
                info = real.stat()
            except OSError as exc:
                raise DataError(f"cannot read {_at(path)}: {exc.strerror or exc}.") from None
            listing.append((f"{split}/{path.name}", info.st_size, info.st_mtime_ns))
    text = json.dumps([_CACHE_FORMAT, listing])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _pack_names(names: list[str]) -> np.ndarray:
    """``names`` as the bytes of their JSON list: as large as the names are (a fixed-width
    string array would be as wide as the longest name for every name: one writer id of 10
    MB, and every writer takes 40 MB)."""
    return np.frombuffer(json.dumps(names).encode("ascii"), dtype=np.uint8)


def _unpack_names(packed: np.ndarray) -> list[str] | None:
    """The names :func:`_pack_names` packed, or None where ``packed`` is not such a list."""
    if packed.dtype != np.uint8 or packed.ndim != 1:
        return None
    try:
        names = json.loads(packed.tobytes().decode("ascii"))
    except (ValueError, RecursionError):
        return None
    if type(names) is not list or any(type(n) is not str for n in names):
        return None
    return names


@dataclass(frozen=True, slots=True)
class _Leaf:
    """What one LEAF dataset is: its name, writer encoder, classes, and one example's shape
    and dtype (what a decoded file must hold to be used)."""

    name: str
    encode: _Encoder
    classes: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]


def _cached_problem(arrays: dict[str, np.ndarray], spec: _Leaf) -> str | None:
    """Why the decoded arrays of a cached file cannot be used (it is hostile as the JSON
    is), or None."""
    if set(arrays) != _CACHE_KEYS:
        return "other arrays"
    writers = _unpack_names(arrays["writers"])
    if writers is None:
        return "no list of writers"
    for split in ("train", "test"):
        x, y, g = arrays[f"x_{split}"], arrays[f"y_{split}"], arrays[f"g_{split}"]
        if x.dtype != spec.dtype or x.shape[1:] != spec.shape or not len(x):
            return f"x_{split} of another shape"
        if y.dtype != np.int64 or y.shape != (len(x),):
            return f"y_{split} of another shape"
        if g.dtype != np.int64 or g.shape != (len(x),):
            return f"g_{split} of another shape"
        if y.min() < 0 or y.max() >= spec.classes or g.min() < 0 or g.max() >= len(writers):
            return f"labels or writers of {split} out of range"
        if x.dtype.kind == "f" and first_non_finite(x) is not None:
            return f"non-finite x_{split}"
        if x.dtype.kind == "i" and (x.min() < 0 or x.max() >= len(SHAKESPEARE_LETTERS)):
            return f"characters of x_{split} out of range"
    return None


def _leaf(spec: _Leaf, root: str) -> Dataset:
    """A LEAF dataset, decoded from its JSON once: the arrays are kept in
    ``LEAF_CACHE/<name>-<key>.npz`` beside the JSON folders (:func:`_leaf_key`; read back
    about 20x faster than the JSON is decoded) where that is a folder of the dataset's own
    and writable, and decoded again where it is not."""
    folder = _leaf_folder(spec.name, root)
    files = _leaf_files(folder)
    cache = _cache_folder(folder)
    cached = None if cache is None else cache / f"{spec.name}-{_leaf_key(files, folder)}.npz"
    arrays = None if cached is None else _read_cache(cached, spec)
    if arrays is None:
        logger.info("decoding the JSON of %s in %s", spec.name, folder)
        arrays = _leaf_decoded(folder, files, spec.encode)
        if cached is not None:
            _write_cache(cached, spec.name, arrays)
    writers = _unpack_names(arrays["writers"])
    assert writers is not None  # packed here, or checked by _read_cache
    x_tr, y_tr, g_tr = arrays["x_train"], arrays["y_train"], arrays["g_train"]
    x_te, y_te, g_te = arrays["x_test"], arrays["y_test"], arrays["g_test"]
    if x_tr.dtype == np.float32:
        x_train, x_test = _standardized(spec.name, x_tr, x_te)
    else:
        x_train, x_test = torch.from_numpy(x_tr), torch.from_numpy(x_te)
    return Dataset(
        name=spec.name,
        x_train=x_train,
        y_train=torch.from_numpy(y_tr),
        x_test=x_test,
        y_test=torch.from_numpy(y_te),
        num_classes=spec.classes,
        groups_train=g_tr,
        groups_test=g_te,
        writers=tuple(writers),
    )


def _cache_folder(folder: Path) -> Path | None:
    """``folder``'s :data:`LEAF_CACHE`, or None where it is a link or not a folder: the
    cache never follows a link out of the dataset's folder (nor into it)."""
    cache = folder / LEAF_CACHE
    try:
        info = os.lstat(cache)
    except FileNotFoundError:
        return cache  # made when first written
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):  # a link (lstat does not follow it), a file
        logger.warning(
            "%s is not a folder of the dataset's own (a link or a file): fedcore neither "
            "reads nor writes decoded files there, and decodes the JSON each time",
            _at(cache),
        )
        return None
    return cache


def _regular(path: Path) -> bool:
    """Whether ``path`` itself (not followed if a link) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_cache(path: Path, spec: _Leaf) -> dict[str, np.ndarray] | None:
    """The arrays of a decoded file, or None: absent, cut short, a link, or holding what
    :func:`_cached_problem` refuses (the JSON is then decoded again)."""
    if not _regular(path):
        return None
    try:
        with path.open("rb") as f, np.load(f, allow_pickle=False) as blob:
            arrays = {k: blob[k] for k in blob.files}
    except Exception:  # absent, cut short, not an npz: decode again
        return None
    problem = _cached_problem(arrays, spec)
    if problem is not None:
        logger.info("not using %s (%s); decoding the JSON again", _at(path), problem)
        return None
    return arrays


def _ours(path: Path) -> bool:
    """Whether ``path`` is a decoded file fedcore wrote: a regular file (not a link) that
    is a zip of exactly the arrays of :data:`_CACHE_KEYS`."""
    if not _regular(path):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return {n.removesuffix(".npy") for n in z.namelist()} == _CACHE_KEYS
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _write_cache(path: Path, name: str, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` whole or not at all (a temporary file renamed), and
    remove the decoded files of earlier versions of the JSON: only files :func:`_ours`
    recognizes (nor is another file at ``path`` replaced), in a cache folder that is no
    link. A folder that cannot be written only costs the next run the decoding."""
    cache = path.parent
    temp: str | None = None
    try:
        cache.mkdir(exist_ok=True)
        if not stat.S_ISDIR(os.lstat(cache).st_mode):
            return  # made a link meanwhile
        if os.path.lexists(path) and not _ours(path):  # a link, a folder, another's file
            logger.info("not replacing %s, which fedcore did not write", _at(path))
            return
        earlier = re.compile(rf"{re.escape(name)}-[0-9a-f]{{20}}\.npz")
        for old in cache.iterdir():
            if old != path and earlier.fullmatch(old.name) and _ours(old):
                old.unlink()
        with tempfile.NamedTemporaryFile(
            dir=cache, prefix=f".{name}-", suffix=".tmp", delete=False
        ) as f:
            temp = f.name
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(temp, path)
        temp = None
    except OSError as exc:
        logger.info("could not keep the decoded %s in %s (%s)", path.name, _at(cache), exc)
    finally:
        if temp is not None:  # written by this call: never anyone else's file
            with suppress(OSError):
                os.unlink(temp)


def _leaf_decoded(
    folder: Path, files: dict[str, list[_LeafFile]], encode: _Encoder
) -> dict[str, np.ndarray]:
    """The JSON of ``folder``'s ``train/`` and ``test/`` as arrays: ``x_*``, ``y_*``, each
    example's writer ``g_*`` (an index into ``writers``, the sorted user names, packed by
    :func:`_pack_names`). Each file's writers are encoded (and checked) as it is read, so
    what is held is the arrays, not every file's JSON at once."""
    splits: dict[str, dict[str, list[tuple[np.ndarray, np.ndarray]]]] = {}
    for split in ("train", "test"):
        users: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for path, real in files[split]:
            for user, data in _leaf_file(path, real).items():
                users.setdefault(user, []).append(encode(data, path, user))
        splits[split] = users
    writers = sorted(set(splits["train"]) | set(splits["test"]))
    index = {w: i for i, w in enumerate(writers)}
    arrays: dict[str, np.ndarray] = {}
    for split, users in splits.items():
        xs, ys, gs = [], [], []
        for user in sorted(users):
            for x, y in users[user]:
                xs.append(x)
                ys.append(y)
                gs.append(np.full(len(y), index[user], dtype=np.int64))
        if not sum(len(y) for y in ys):
            raise DataError(f"the LEAF files of {_at(folder / split)} hold no examples.")
        arrays[f"x_{split}"] = np.concatenate(xs)
        arrays[f"y_{split}"] = np.concatenate(ys)
        arrays[f"g_{split}"] = np.concatenate(gs)
    arrays["writers"] = _pack_names(writers)
    return arrays


_FEMNIST = _Leaf("femnist", _femnist_user, 62, (1, 28, 28), np.dtype(np.float32))
_SHAKESPEARE = _Leaf(
    "shakespeare",
    _shakespeare_user,
    len(SHAKESPEARE_LETTERS),
    (LEAF_SEQUENCE,),
    np.dtype(np.int64),
)


def femnist(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """LEAF's FEMNIST: 28x28 handwritten digits and letters (62 classes), one group per
    writer, with the train/test split LEAF's preprocessing made."""
    return _leaf(_FEMNIST, root)


def shakespeare(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """LEAF's Shakespeare: 80-character lines as int64 indices into
    :data:`SHAKESPEARE_LETTERS`, the next character as the label (80 classes), one group
    per speaking role."""
    return _leaf(_SHAKESPEARE, root)


# -- folder:PATH -------------------------------------------------------------------------------


def folder(path: str, *, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The dataset at ``path`` (``data.dataset = "folder:PATH"``; see the module docstring for
    the forms). Images are standardized per channel; classes are ``max label + 1`` (an image
    folder's: its class folders, sorted). A ``.npz`` file must lie in the folder it is
    named in (not be a link out of it); the files of a folder, inside that folder."""
    where = Path(path).expanduser()
    name = f"folder:{path}"
    if where.suffix == ".npz" and os.path.lexists(where) and not where.is_dir():
        return _npz(name, where)
    if not where.is_dir():
        raise DataError(f"data.dataset {name!r}: {_at(where)} is neither a .npz file nor a folder.")
    real = _real_folder(where)
    try:
        tables = sorted(p for p in real.rglob("*") if p.suffix in (".parquet", ".arrow"))
    except OSError as exc:
        raise DataError(f"cannot read the folder {_at(where)}: {exc.strerror or exc}.") from None
    if tables:
        return _tables(name, real, tables)
    if (where / "train").is_dir() and (where / "test").is_dir():
        return _image_folders(name, real)
    raise DataError(
        f"data.dataset {name!r}: {_at(where)} holds no .parquet or .arrow files and no "
        "train/ and test/ folders of class folders."
    )


def _features(x: np.ndarray, what: str) -> np.ndarray:
    """``x`` checked as a file's features: numbers (no strings, no Python objects), one
    example or more along its first axis, every value finite."""
    if x.dtype.kind not in "biuf":
        raise DataError(f"{what} are {x.dtype} values, not numbers.")
    if x.ndim < 2 or 0 in x.shape[1:]:
        raise DataError(
            f"{what} have shape {x.shape}; expected one row of features (or one image) per example."
        )
    _finite(x, what)
    return x


def _finish(
    name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], where: str
) -> Dataset:
    """The dataset of checked features and labels: images (``[n, H, W]``, ``[n, H, W, C]``
    or ``[n, C, H, W]``) standardized per channel, other features as float32."""
    x_train, x_test = train[0], test[0]
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(
            f"{where}: a training example has shape {x_train.shape[1:]} and a test example "
            f"{x_test.shape[1:]}; both splits must have one shape."
        )
    for split, x, y in (("training", x_train, train[1]), ("test", x_test, test[1])):
        if len(x) != len(y) or not len(x):
            raise DataError(
                f"{where}: the {split} split has {len(x)} examples and {len(y)} labels; both "
                "must be equal and non-zero."
            )
    classes = int(max(int(y.max()) for y in (train[1], test[1]))) + 1
    if x_train.ndim == 3:  # [n, H, W]: one channel
        x_train, x_test = x_train[:, None], x_test[:, None]
    if x_train.ndim == 4 and x_train.shape[-1] in (1, 3, 4) and x_train.shape[1] not in (1, 3, 4):
        x_train, x_test = x_train.transpose(0, 3, 1, 2), x_test.transpose(0, 3, 1, 2)
    if x_train.ndim == 4:
        return _images(name, (x_train, train[1]), (x_test, test[1]), classes, where)
    out = []
    for split, x in (("training", x_train), ("test", x_test)):
        as_float = np.ascontiguousarray(x, dtype=np.float32)
        _finite(as_float, f"the {split} features of {where}")
        out.append(torch.from_numpy(as_float))
    return Dataset(
        name=name,
        x_train=out[0],
        y_train=torch.from_numpy(train[1]),
        x_test=out[1],
        y_test=torch.from_numpy(test[1]),
        num_classes=classes,
    )


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
"""The first bytes of a zip file (a ``.npz`` is one), with entries or empty."""


def _npz(name: str, path: Path) -> Dataset:
    """A ``.npz`` of ``x_train``, ``y_train``, ``x_test``, ``y_test``: read without pickle,
    every array checked (numbers, labels in range, finite)."""
    real = _data_file(path, _real_folder(path.parent))
    what = "a .npz file of arrays (NumPy's savez)"
    with _reading(path, what), real.open("rb") as f:
        head = f.read(4)
        if head not in _ZIP_MAGIC:
            raise DataError(f"{_at(path)} is not {what}: its first bytes are {head!r}.")
        f.seek(0)
        with np.load(f, allow_pickle=False) as blob:
            keys = ("x_train", "y_train", "x_test", "y_test")
            missing = [k for k in keys if k not in blob.files]
            if missing:
                held = ", ".join(clip(k, 30) for k in blob.files[:8]) or "nothing"
                raise DataError(f"{_at(path)} has no {', '.join(missing)} (it has {held}).")
            loaded = {k: _npz_array(blob, k, path) for k in keys}
    x_tr = _features(loaded["x_train"], f"the x_train of {_at(path)}")
    x_te = _features(loaded["x_test"], f"the x_test of {_at(path)}")
    y_tr = _int_labels(loaded["y_train"], f"the y_train of {_at(path)}", MAX_CLASSES)
    y_te = _int_labels(loaded["y_test"], f"the y_test of {_at(path)}", MAX_CLASSES)
    return _finish(name, (x_tr, y_tr), (x_te, y_te), _at(path))


def _npz_array(blob: Any, key: str, path: Path) -> np.ndarray:
    """One array of a ``.npz``; one of Python objects (which only pickle can read) refused by
    name."""
    try:
        value: np.ndarray = blob[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise DataError(
                f"the {key} of {_at(path)} is an array of Python objects, which fedcore does "
                "not read (it would take pickle); save it as numbers."
            ) from None
        raise
    return value


# -- images (folders of image files, table cells) --------------------------------------------


def _decode_image(source: Path | bytes, where: str) -> np.ndarray:
    """The pixels of an image file or of an image's bytes: its header's size checked against
    :data:`MAX_IMAGE_PIXELS` before any pixel is decoded.

    Raises:
        DataError: naming ``where``: not an image, cut short, or too many pixels.
    """
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
            with opened as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise DataError(
                        f"{where} is an image of {width}x{height} pixels; fedcore decodes "
                        f"images of at most {MAX_IMAGE_PIXELS} pixels (a decompression "
                        "bomb, or an image to make smaller)."
                    )
                return np.asarray(image)
    except FedcoreError:
        raise
    except Image.DecompressionBombError:
        raise DataError(
            f"{where} claims an image of more pixels than Pillow decodes (a decompression "
            f"bomb?); fedcore decodes images of at most {MAX_IMAGE_PIXELS} pixels."
        ) from None
    except MemoryError:
        raise DataError(f"{where}: decoding the image ran out of memory.") from None
    except OSError as exc:
        if exc.errno is not None:
            raise DataError(f"cannot read {where}: {exc.strerror or exc}.") from None
        raise DataError(f"{where} is not an image fedcore can read: {_reason(exc)}.") from None
    except Exception as exc:  # a hostile image can make Pillow raise anything
        raise DataError(f"{where} is not an image fedcore can read: {_reason(exc)}.") from None


def _stacked(xs: list[np.ndarray], wheres: list[str], folder: str) -> np.ndarray:
    """Images of one size stacked (the first of another size refused by name)."""
    first = xs[0].shape, xs[0].dtype
    for x, where in zip(xs, wheres, strict=True):
        if (x.shape, x.dtype) != first:
            raise DataError(
                f"the images of {folder} differ: {where} is {x.shape} {x.dtype}, "
                f"{wheres[0]} {first[0]} {first[1]}; make them one size and mode."
            )
    return np.stack(xs)


def _image_folders(name: str, where: Path) -> Dataset:
    """``train/`` and ``test/`` folders of class folders of image files."""
    classes = [p.name for p in _listing(where / "train") if p.is_dir()]
    if not classes:
        raise DataError(f"data.dataset {name!r}: {_at(where / 'train')} has no class folders.")
    arrays = {}
    for split in ("train", "test"):
        xs, ys, wheres = [], [], []
        for label, cls in enumerate(classes):
            for path in _listing(where / split / cls):
                if path.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp", ".gif"):
                    real = _data_file(path, where)
                    xs.append(_decode_image(real, _at(path)))
                    ys.append(label)
                    wheres.append(_at(path))
        if not xs:
            raise DataError(f"data.dataset {name!r}: {_at(where / split)} holds no images.")
        arrays[split] = (
            _stacked(xs, wheres, _at(where / split)),
            np.asarray(ys, dtype=np.int64),
        )
    return _finish(name, arrays["train"], arrays["test"], _at(where))


# -- Hugging Face tables ----------------------------------------------------------------------


def _tables(name: str, where: Path, files: list[Path]) -> Dataset:
    """The ``.parquet`` or ``.arrow`` files of ``where``, each read and checked on its own
    (errors name the file), then joined per split."""
    try:
        import pyarrow  # noqa: F401 - only to say what is missing
    except ImportError:
        raise DataError(
            f"data.dataset {name!r} holds .parquet/.arrow files, which need pyarrow: "
            "pip install 'fedcore[datasets]'."
        ) from None
    splits: dict[str, list[tuple[np.ndarray, np.ndarray, str]]] = {"train": [], "test": []}
    empty: dict[str, list[str]] = {"train": [], "test": []}
    for path in files:
        split = next((s for s in splits if s in path.relative_to(where).as_posix()), None)
        if split is None:
            continue
        real = _data_file(path, where)
        part = _table_arrays(_read_table(path, real), _at(path))
        if part is None:
            empty[split].append(_at(path))
        else:
            splits[split].append(part)
    for split, parts in splits.items():
        if not parts:
            held = f" ({', '.join(empty[split][:3])} hold no rows)" if empty[split] else ""
            raise DataError(
                f"data.dataset {name!r}: found no {split} examples{held}; a file's name or "
                "folder must say train or test."
            )
    first = splits["train"][0]
    for x, _, where_x in splits["train"] + splits["test"]:
        if x.shape[1:] != first[0].shape[1:]:
            raise DataError(
                f"{where_x} holds examples of shape {x.shape[1:]}, {first[2]} of "
                f"{first[0].shape[1:]}; the files of a dataset must have one shape."
            )
    arrays = {
        split: (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        for split, parts in splits.items()
    }
    return _finish(name, arrays["train"], arrays["test"], _at(where))


def _read_table(path: Path, real: Path) -> Any:
    """A ``.parquet`` file, or an ``.arrow`` file of Arrow's stream or file format."""
    import pyarrow.ipc
    import pyarrow.parquet

    with _reading(path, "a table (.parquet or .arrow)"):
        if path.suffix == ".parquet":
            return pyarrow.parquet.read_table(real)
        with real.open("rb") as f:
            try:
                return pyarrow.ipc.open_stream(f).read_all()
            except pyarrow.ArrowInvalid:
                f.seek(0)
                return pyarrow.ipc.open_file(f).read_all()


def _numeric_type(kind: Any) -> bool:
    """Whether an Arrow type is numbers, or lists (of lists ...) of numbers."""
    import pyarrow as pa

    while (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ):
        kind = kind.value_type
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


def _table_arrays(table: Any, where: str) -> tuple[np.ndarray, np.ndarray, str] | None:
    """One table's features and labels, checked (None for a table of no rows)."""
    import pyarrow as pa

    columns = table.column_names
    label = next((c for c in ("label", "labels", "fine_label") if c in columns), None)
    feature = next((c for c in ("image", "img", "pixels", "x") if c in columns), None)
    if label is None or feature is None:
        shown = ", ".join(clip(c, 30) for c in columns[:8])
        raise DataError(
            f"{where} has columns {shown}; a dataset table needs a label column (label, "
            "labels or fine_label) and an image column (image, img, pixels or x)."
        )
    if not table.num_rows:
        return None
    label_type = table.schema.field(label).type
    if not pa.types.is_integer(label_type):
        raise DataError(
            f"the {label!r} column of {where} holds {label_type}, not integer class labels."
        )
    labels = table.column(label)
    if labels.null_count:
        raise DataError(f"the {label!r} column of {where} has empty cells.")
    y = _int_labels(np.asarray(labels.to_numpy()), f"the {label!r} column of {where}", MAX_CLASSES)
    kind = table.schema.field(feature).type
    cells = table.column(feature)
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0)
    ):
        images = []
        for i, cell in enumerate(cells.to_pylist()):
            data = cell.get("bytes") if isinstance(cell, dict) else cell
            if not isinstance(data, bytes):
                raise DataError(
                    f"row {i} of {where} holds no image bytes (a path alone is not read)."
                )
            images.append(_decode_image(data, f"the image of row {i} of {where}"))
        x = _stacked(images, [f"row {i}" for i in range(len(images))], where)
    elif _numeric_type(kind):
        if cells.null_count:
            raise DataError(f"the {feature!r} column of {where} has empty cells.")
        try:
            x = np.asarray(cells.to_pylist(), dtype=np.float32)
        except (ValueError, TypeError):
            raise DataError(
                f"the {feature!r} column of {where} holds rows of different lengths (or empty "
                "values); every example must have one shape."
            ) from None
    else:
        raise DataError(f"the {feature!r} column of {where} holds {kind}, not images or numbers.")
    return _features(x, f"the {feature!r} column of {where}"), y, where
