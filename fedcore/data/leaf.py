"""LEAF's FEMNIST and Shakespeare from their per-user JSON, and stand-in files of them.

========================  ===================================================================
``femnist``               LEAF's per-user JSON: ``train/`` and ``test/`` in ``ROOT/femnist``,
                          ``ROOT/femnist/data`` or ``ROOT`` (LEAF writes them in
                          ``leaf/data/femnist/data/``); 62 classes, one group per writer
``shakespeare``           the same for LEAF's Shakespeare: 80-character lines, the next
                          character as the label, one group per speaking role
========================  ===================================================================

Each file's writers are checked and encoded as it is read; the decoded arrays are kept in
the decode cache (:mod:`fedcore.data.cache`) and read back from it while the JSON is
unchanged. Shakespeare's lines become int64 character indices into
:data:`SHAKESPEARE_LETTERS`.
"""

from __future__ import annotations

import array
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedcore.data.cache import (
    _CACHE_KEYS,
    _cache_folder,
    _leaf_key,
    _LeafFile,
    _pack_names,
    _read_cache,
    _unpack_names,
    _write_cache,
)
from fedcore.data.files import (
    _at,
    _data_file,
    _finite,
    _int_labels,
    _listing,
    _missing,
    _reading,
    _real_folder,
    _standardized,
    data_root,
)
from fedcore.data.standin import pixels
from fedcore.data.types import Dataset, first_non_finite
from fedcore.errors import DataError
from fedcore.ids import clip

logger = logging.getLogger(__name__)

__all__ = ["LEAF_SEQUENCE", "SHAKESPEARE_LETTERS", "femnist", "shakespeare", "standin"]

SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
"""LEAF's Shakespeare vocabulary: a character's index here is its class (80 characters)."""

LEAF_SEQUENCE = 80
"""Characters of one Shakespeare example (LEAF's sequence length)."""

FEMNIST_PIXELS = 784
"""Values of one FEMNIST example (28x28 pixels in [0, 1])."""


def _leaf_folder(name: str, root: str) -> Path:
    base = data_root(root)
    looked = [base / name, base / name / "data", base]  # the dataset's own folder first
    for folder in looked:
        if (folder / "train").is_dir() and (folder / "test").is_dir():
            return _real_folder(folder)
    raise _missing(name, [p / "train" for p in looked], base)


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
    arrays = None if cached is None else _read_cache(cached, partial(_cached_problem, spec=spec))
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


# -- stand-in files ---------------------------------------------------------------------------


def standin(
    name: str, root: Path, rng: np.random.Generator, *, samples: int, writers: int, compress: bool
) -> Path:
    """Stand-in JSON of ``name`` (``femnist`` or ``shakespeare``) under ``root``, of
    ``writers`` writers (:func:`fedcore.data.standin.write_standin`); ``compress`` is not
    used."""
    return _write_leaf(root, rng, samples, writers, name == "shakespeare")


def _write_leaf(
    root: Path, rng: np.random.Generator, samples: int, writers: int, text: bool
) -> Path:
    """LEAF's layout with a per-user sample split (``-t sample``): every writer has training
    and test examples (at least one of each), in files of at most 5 users as LEAF writes
    them."""
    name = "shakespeare" if text else "femnist"
    folder = root / name / "data"
    users = [f"{'ROLE_' if text else 'f'}{i:04d}_{i % 7:02d}" for i in range(writers)]
    sizes = rng.multinomial(samples - 4 * writers, np.full(writers, 1.0 / writers)) + 4
    split: dict[str, dict[str, dict[str, list[object]]]] = {"train": {}, "test": {}}
    for user, size in zip(users, sizes, strict=True):
        if text:
            letters = np.array(list(SHAKESPEARE_LETTERS))
            chars = rng.integers(0, len(letters), (size, LEAF_SEQUENCE + 1))
            x: list[object] = ["".join(letters[row[:-1]]) for row in chars]
            y: list[object] = [str(letters[row[-1]]) for row in chars]
        else:
            labels = rng.integers(0, 62, size)
            scaled = pixels(rng, labels, (784,), 62).astype(np.float64) / 255.0
            x = np.round(scaled, 4).tolist()
            y = labels.tolist()
        cut = min(size - 1, max(1, round(size * 0.9)))  # a training and a test example each
        split["train"][user] = {"x": x[:cut], "y": y[:cut]}
        split["test"][user] = {"x": x[cut:], "y": y[cut:]}
    for part, data in split.items():
        (folder / part).mkdir(parents=True, exist_ok=True)
        for start in range(0, writers, 5):
            chunk = users[start : start + 5]
            blob = {
                "users": chunk,
                "num_samples": [len(data[u]["y"]) for u in chunk],
                "user_data": {u: data[u] for u in chunk},
            }
            stem = "all_data_niid_0_keep_0" if text else "all_data_0_niid_0_keep_0"
            path = folder / part / f"{stem}_{start // 5}_{part}_9.json"
            path.write_text(json.dumps(blob), encoding="utf-8")
    return folder
