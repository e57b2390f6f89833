"""``data.dataset = "folder:PATH"``: a user's dataset files, in one of three forms.

* a ``.npz`` file of ``x_train``, ``y_train``, ``x_test``, ``y_test`` (read without pickle);
* a folder of ``train/`` and ``test/`` image folders, one folder per class
  (:mod:`fedcore.data.images`);
* a Hugging Face ``datasets`` folder of ``.parquet`` or ``.arrow`` files whose names or
  folders say ``train`` and ``test`` (:mod:`fedcore.data.tables`).

Images are standardized per channel; classes are ``max label + 1`` (an image folder's: its
class folders, sorted), at most :data:`~fedcore.data.files.MAX_CLASSES`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.data.files import (
    MAX_CLASSES,
    _at,
    _data_file,
    _features,
    _finish,
    _int_labels,
    _reading,
    _real_folder,
)
from fedcore.data.images import _image_folders
from fedcore.data.tables import _tables
from fedcore.data.types import Dataset
from fedcore.errors import DataError
from fedcore.ids import clip

__all__ = ["folder"]


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
