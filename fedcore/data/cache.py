"""Two caches of arrays that are slow to make: the decode cache of LEAF's JSON (the decoded
arrays of a dataset's ``train/`` and ``test/``, kept in :data:`LEAF_CACHE` beside them and read
back about 20x faster than the JSON is decoded), and the cache of the built-in datasets that
are made, not read (:func:`generated`: digits' split needs scikit-learn, whose import takes
about a second of every peer's start; MNIST-1D takes 5 s to generate), kept in the user's
cache folder (:func:`user_cache`).

A cached file is as hostile as the JSON: it is read only where it is a regular file in a
cache folder of the dataset's own (no link), and only when the dataset's check accepts every
array it holds. Writing replaces a file whole or not at all, and removes only the files
fedcore wrote (:func:`_ours`). A folder that cannot be written only costs the next run the
decoding.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import zipfile
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import numpy as np

from fedcore.data.files import _at
from fedcore.errors import DataError

logger = logging.getLogger(__name__)

__all__ = ["CACHE_ENV", "LEAF_CACHE", "generated", "user_cache"]

LEAF_CACHE = ".fedcore-decoded"
"""The folder, beside LEAF's ``train/`` and ``test/``, that keeps their decoded arrays."""

_CACHE_FORMAT = 2
"""Bump when what :func:`fedcore.data.leaf._leaf_decoded` returns changes: older cached files
are then unused (and removed: :func:`_write_cache`). 2: the writers as the bytes of a JSON
list."""

_CACHE_KEYS = frozenset({"x_train", "y_train", "g_train", "x_test", "y_test", "g_test", "writers"})
"""The arrays of a decoded file (format 1 held the same names)."""


_LeafFile = tuple[Path, Path]
"""A LEAF JSON file: its path as found, and its real path (checked)."""


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


def _cache_folder(folder: Path) -> Path | None:
    """``folder``'s :data:`LEAF_CACHE`, or None where it is a link or not a folder: the
    cache never follows a link out of the dataset's folder (nor into it)."""
    cache = folder / LEAF_CACHE
    kind = _folder_kind(cache)
    if kind == "absent":
        return cache  # made when first written
    if kind == "unreadable":
        return None
    if kind == "other":  # a link (lstat does not follow it), a file
        logger.warning(
            "%s is not a folder of the dataset's own (a link or a file): fedcore neither "
            "reads nor writes decoded files there, and decodes the JSON each time",
            _at(cache),
        )
        return None
    return cache


def _folder_kind(path: Path) -> str:
    """``"folder"`` (a real one, not a link), ``"absent"``, ``"other"`` (a link, a file) or
    ``"unreadable"``: what a cache may use as its folder (the first two)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "unreadable"
    return "folder" if stat.S_ISDIR(info.st_mode) else "other"


def _regular(path: Path) -> bool:
    """Whether ``path`` itself (not followed if a link) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_cache(
    path: Path, problem_of: Callable[[dict[str, np.ndarray]], str | None]
) -> dict[str, np.ndarray] | None:
    """The arrays of a decoded file, or None: absent, cut short, a link, or holding what
    ``problem_of`` refuses (the dataset's check of what it reads back: LEAF's
    :func:`fedcore.data.leaf._cached_problem`; the JSON is then decoded again)."""
    if not _regular(path):
        return None
    try:
        with path.open("rb") as f, np.load(f, allow_pickle=False) as blob:
            arrays = {k: blob[k] for k in blob.files}
    except Exception:  # absent, cut short, not an npz: decode again
        return None
    problem = problem_of(arrays)
    if problem is not None:
        logger.info("not using %s (%s); making its arrays again", _at(path), problem)
        return None
    return arrays


def _ours(path: Path, keys: frozenset[str] = _CACHE_KEYS) -> bool:
    """Whether ``path`` is a file fedcore wrote: a regular file (not a link) that is a zip
    of exactly the arrays ``keys`` (default: a decoded LEAF file's, :data:`_CACHE_KEYS`)."""
    if not _regular(path):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            return {n.removesuffix(".npy") for n in z.namelist()} == keys
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _write_cache(
    path: Path,
    name: str,
    arrays: dict[str, np.ndarray],
    *,
    keys: frozenset[str] = _CACHE_KEYS,
    replace_earlier: bool = True,
) -> None:
    """Write ``arrays`` to ``path`` whole or not at all (a temporary file renamed), and,
    where ``replace_earlier``, remove the decoded files of earlier versions of the JSON:
    only files :func:`_ours` recognizes (nor is another file at ``path`` replaced), in a
    cache folder that is no link. A folder that cannot be written only costs the next run
    the decoding."""
    cache = path.parent
    temp: str | None = None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(cache).st_mode):
            return  # made a link meanwhile
        if os.path.lexists(path) and not _ours(path, keys):  # a link, a folder, another's
            logger.info("not replacing %s, which fedcore did not write", _at(path))
            return
        earlier = re.compile(rf"{re.escape(name)}-[0-9a-f]{{20}}\.npz")
        for old in cache.iterdir() if replace_earlier else ():
            if old != path and earlier.fullmatch(old.name) and _ours(old, keys):
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


CACHE_ENV = "FEDCORE_CACHE_DIR"
"""The environment variable that names the folder of :func:`generated`'s files; set and
empty, it turns that cache off."""

_GENERATED_FORMAT = 1
"""Bump when what a built-in dataset's maker returns changes (its key changes with it)."""

_GENERATED_KEYS = frozenset({"x_train", "y_train", "x_test", "y_test"})


def user_cache() -> Path | None:
    """The folder of :func:`generated`'s files: ``$FEDCORE_CACHE_DIR`` (empty: no cache),
    else ``$XDG_CACHE_HOME/fedcore``, else ``~/.cache/fedcore``; None where it is a link
    or not a folder, or no home is known."""
    given = os.environ.get(CACHE_ENV)
    if given is not None:
        if not given.strip():
            return None
        folder = Path(given)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or ""
        try:
            folder = (Path(base) if base.strip() else Path.home() / ".cache") / "fedcore"
        except RuntimeError:  # no home directory
            return None
    return folder if _folder_kind(folder) in ("absent", "folder") else None


def _generated_problem(
    arrays: dict[str, np.ndarray], *, features: int, train: int | None, classes: int
) -> str | None:
    """What is wrong with a cached built-in dataset's arrays, or None (the dataset is then
    made again)."""
    if set(arrays) != _GENERATED_KEYS:
        return "not the arrays of a built-in dataset"
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != features or not x.shape[0]:
            return f"x_{split} is not a float32 table of {features} features"
        if y.dtype != np.int64 or y.shape != (x.shape[0],):
            return f"y_{split} is not one int64 label per example"
        if y.size and (int(y.min()) < 0 or int(y.max()) >= classes):
            return f"y_{split} holds a label outside [0, {classes})"
        if not np.isfinite(x).all():
            return f"x_{split} holds a value that is not finite"
    if train is not None and arrays["x_train"].shape[0] != train:
        return f"not {train} training examples"
    return None


def generated(
    name: str,
    key: list[object],
    make: Callable[[], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    *,
    features: int,
    classes: int,
    train: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``make()``'s ``(x_train, y_train, x_test, y_test)`` (float32 tables of ``features``
    columns, int64 labels below ``classes``), kept in :func:`user_cache` under ``name`` and
    a digest of ``key`` (everything the arrays depend on: the dataset's arguments and the
    version of the package that makes them). A file is read back only where it is a
    regular file holding exactly such arrays (``train`` of them, where given); anything
    else is made again, and a folder that cannot be written costs only the making."""
    folder = user_cache()
    text = json.dumps([_GENERATED_FORMAT, name, key], sort_keys=True, default=str)
    path = (
        None
        if folder is None
        else folder / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.npz"
    )
    if path is not None:

        def problem_of(arrays: dict[str, np.ndarray]) -> str | None:
            return _generated_problem(arrays, features=features, train=train, classes=classes)

        arrays = _read_cache(path, problem_of)
        if arrays is not None:
            return arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"]
    made = make()
    if path is not None:
        names = ("x_train", "y_train", "x_test", "y_test")
        arrays = dict(zip(names, made, strict=True))
        if _generated_problem(arrays, features=features, train=train, classes=classes) is None:
            _write_cache(path, name, arrays, keys=_GENERATED_KEYS, replace_earlier=False)
    return made
