"""CIFAR-10 and CIFAR-100 from their files, and stand-in files of them.

========================  ===================================================================
``cifar10``               ``ROOT/cifar-10-batches-py/`` (torchvision's ``CIFAR10(root)``; the
                          batches of the python release), or ``ROOT/cifar-10-batches-bin/``
``cifar100``              ``ROOT/cifar-100-python/`` (torchvision's ``CIFAR100(root)``), fine
                          labels, or ``ROOT/cifar-100-binary/``
========================  ===================================================================

The format is read here rather than through torchvision: it is a few lines, and torchvision
would tie the install to one torch build. The python release's batches are pickles: they are
read by an unpickler that allows only the types a CIFAR batch holds (dicts, str, bytes,
lists, ints and NumPy arrays: :class:`_ArraysOnly`) and refuses everything else, so a
crafted batch cannot run code. :func:`standin` writes stand-in batches (``pickle.dump``);
this is the only module of fedcore that touches pickle.
"""

from __future__ import annotations

import os
import pickle  # CIFAR's python release, local files only (never sent); via _ArraysOnly
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fedcore.data.files import (
    FETCH,
    _at,
    _data_file,
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
from fedcore.ids import clip

__all__ = ["cifar10", "cifar100", "standin"]


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


# -- stand-in files ---------------------------------------------------------------------------


def standin(
    name: str, root: Path, rng: np.random.Generator, *, samples: int, writers: int, compress: bool
) -> Path:
    """Stand-in files of ``name`` (``cifar10`` or ``cifar100``) under ``root``: the python
    release's batches of generated pixels (:func:`fedcore.data.standin.write_standin`);
    ``writers`` and ``compress`` are not used."""
    return _write_cifar(root, rng, samples, name == "cifar100")


def _write_pickle(path: Path, blob: dict[str, object]) -> None:
    with path.open("wb") as f:
        pickle.dump(blob, f, protocol=2)


def _write_cifar(root: Path, rng: np.random.Generator, samples: int, hundred: bool) -> Path:
    classes = 100 if hundred else 10
    test_n = max(samples // 4, 1)
    y_train = rng.integers(0, classes, samples)
    y_test = rng.integers(0, classes, test_n)
    x_train = pixels(rng, y_train, (3072,), classes)
    x_test = pixels(rng, y_test, (3072,), classes)
    if hundred:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True, exist_ok=True)
        for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
            _write_pickle(
                folder / name,
                {
                    "filenames": [f"standin_{i}.png" for i in range(len(y))],
                    "batch_label": f"{name} batch (stand-in)",
                    "fine_labels": y.tolist(),
                    "coarse_labels": (y // 5).tolist(),
                    "data": x,
                },
            )
        _write_pickle(folder / "meta", {"fine_label_names": [f"class{i}" for i in range(100)]})
        return folder
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    batches = np.array_split(np.arange(samples), 5)
    for i, rows in enumerate(batches, start=1):
        _write_pickle(
            folder / f"data_batch_{i}",
            {
                "batch_label": f"training batch {i} of 5 (stand-in)",
                "labels": y_train[rows].tolist(),
                "data": x_train[rows],
                "filenames": [f"standin_{j}.png" for j in rows],
            },
        )
    _write_pickle(
        folder / "test_batch",
        {
            "batch_label": "testing batch 1 of 1 (stand-in)",
            "labels": y_test.tolist(),
            "data": x_test,
            "filenames": [f"standin_{j}.png" for j in range(test_n)],
        },
    )
    _write_pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    return folder
