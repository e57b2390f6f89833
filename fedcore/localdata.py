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
build. The CIFAR python batches are pickles: they are read by an unpickler that builds
only NumPy arrays, lists and dicts (:class:`_ArraysOnly`) and refuses everything else.

Images become float32 ``[n, C, H, W]``, each channel standardized with the training
split's mean and standard deviation; Shakespeare's lines become int64 character indices.
A dataset that is absent raises :class:`MissingDataset`: one line with where fedcore
looked and the command that fetches it on a machine with network.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import pickle  # CIFAR's python release, local files only (never sent); via _ArraysOnly
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fedcore.config import DATA_ENV
from fedcore.data import Dataset
from fedcore.errors import DataError

logger = logging.getLogger(__name__)

__all__ = [
    "DATA_ENV",
    "FETCH",
    "LEAF_SEQUENCE",
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
    where = " or ".join(str(p) for p in looked)
    return MissingDataset(
        f"dataset {name!r} is not in {where} (data.root = {root}; fedcore never downloads: "
        f"fetch it on a machine with network with: {FETCH[name].format(root=str(root))})."
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
    std[std == 0] = 1.0
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
) -> Dataset:
    x_train, x_test = _standardized(name, train[0], test[0])
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
    """An unpickler that builds NumPy arrays and plain containers only: the globals a CIFAR
    batch refers to (NumPy's array reconstruction, and ``_codecs.encode`` for bytes pickled
    by protocol 2). Any other global is refused, so a crafted file cannot run code."""

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
            raise DataError(
                f"a CIFAR batch refers to {module}.{name}, which a CIFAR batch never does; "
                "not reading it (it may not be CIFAR's file)."
            )
        if module.startswith("numpy") and module.endswith("multiarray"):
            from numpy._core import multiarray

            return multiarray._reconstruct
        return super().find_class(module, name)


def _cifar_batch(path: Path) -> dict[str, Any]:
    """One batch of the python release, as ``{"data": [n, 3072] uint8, labels...}``."""
    try:
        with path.open("rb") as f:
            raw = _ArraysOnly(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DataError(f"{path} is not a CIFAR batch of the python release: {exc}") from None
    if not isinstance(raw, dict):
        raise DataError(f"{path} is not a CIFAR batch (it holds a {type(raw).__name__}).")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in raw.items()}


def _cifar_python(folder: Path, files: list[str], label_key: str) -> tuple[Any, Any]:
    xs, ys = [], []
    for file in files:
        batch = _cifar_batch(folder / file)
        if "data" not in batch or label_key not in batch:
            raise DataError(f"{folder / file} has no {label_key!r} or 'data' entry.")
        xs.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(batch[label_key], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def _cifar_binary(paths: list[Path], label_bytes: int) -> tuple[Any, Any]:
    """The binary release: per image ``label_bytes`` label bytes (CIFAR-100: coarse, fine;
    the last is used) then 3072 pixel bytes."""
    rows = []
    for path in paths:
        raw = np.fromfile(path, dtype=np.uint8)
        width = label_bytes + 3072
        if raw.size % width:
            raise DataError(f"{path} is not a CIFAR binary batch ({raw.size} bytes).")
        rows.append(raw.reshape(-1, width))
    table = np.concatenate(rows)
    return table[:, label_bytes:].reshape(-1, 3, 32, 32), table[:, label_bytes - 1].astype(np.int64)


def cifar10(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """CIFAR-10: 50,000 training and 10,000 test images of 32x32x3, 10 classes (its own
    test split: ``seed`` and ``test_fraction`` are not used)."""
    base = data_root(root)
    python, binary = base / "cifar-10-batches-py", base / "cifar-10-batches-bin"
    if (python / "test_batch").is_file():
        train = _cifar_python(python, [f"data_batch_{i}" for i in range(1, 6)], "labels")
        test = _cifar_python(python, ["test_batch"], "labels")
    elif (binary / "test_batch.bin").is_file():
        train = _cifar_binary([binary / f"data_batch_{i}.bin" for i in range(1, 6)], 1)
        test = _cifar_binary([binary / "test_batch.bin"], 1)
    else:
        raise _missing("cifar10", [python, binary], base)
    return _images("cifar10", train, test, 10)


def cifar100(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """CIFAR-100: 50,000 training and 10,000 test images of 32x32x3, its 100 fine labels."""
    base = data_root(root)
    python, binary = base / "cifar-100-python", base / "cifar-100-binary"
    if (python / "test").is_file():
        train = _cifar_python(python, ["train"], "fine_labels")
        test = _cifar_python(python, ["test"], "fine_labels")
    elif (binary / "test.bin").is_file():
        train = _cifar_binary([binary / "train.bin"], 2)
        test = _cifar_binary([binary / "test.bin"], 2)
    else:
        raise _missing("cifar100", [python, binary], base)
    return _images("cifar100", train, test, 100)


# -- idx (Fashion-MNIST, EMNIST) --------------------------------------------------------------

_IDX_TYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: Path) -> np.ndarray:
    """The array of an idx file (MNIST's format; ``.gz`` read as it is): a magic number of
    two zero bytes, a type byte and the number of dimensions, then each dimension's size
    as a big-endian uint32, then the values."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] or raw[1] or raw[2] not in _IDX_TYPES:
        raise DataError(f"{path} is not an idx file (its first bytes are {raw[:4]!r}).")
    ndim = raw[3]
    shape = tuple(int(v) for v in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    count = int(np.prod(shape)) if shape else 0
    offset = 4 + 4 * ndim
    if len(raw) - offset != count * dtype.itemsize:
        raise DataError(
            f"{path}: the header says {shape} values, but the file holds "
            f"{(len(raw) - offset) // dtype.itemsize}."
        )
    return np.frombuffer(raw, dtype, count=count, offset=offset).reshape(shape)


def _idx_pair(folder: Path, images: str, labels: str) -> tuple[np.ndarray, np.ndarray] | None:
    found = []
    for stem in (images, labels):
        path = next((p for p in (folder / stem, folder / f"{stem}.gz") if p.is_file()), None)
        if path is None:
            return None
        found.append(read_idx(path))
    x, y = found
    if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
        raise DataError(
            f"{folder}: {images} holds {x.shape} and {labels} {y.shape}; expected [n, H, W] "
            "images and n labels."
        )
    return x[:, None], y


def _idx_dataset(name: str, folder: Path, stems: tuple[str, str], classes: int) -> Dataset:
    base = folder.parent.parent
    train = _idx_pair(folder, f"{stems[0]}-images-idx3-ubyte", f"{stems[0]}-labels-idx1-ubyte")
    test = _idx_pair(folder, f"{stems[1]}-images-idx3-ubyte", f"{stems[1]}-labels-idx1-ubyte")
    if train is None or test is None:
        raise _missing(name, [folder], base)
    if name == "emnist":  # EMNIST's idx images are stored transposed
        train = (train[0].transpose(0, 1, 3, 2), train[1])
        test = (test[0].transpose(0, 1, 3, 2), test[1])
    for y in (train[1], test[1]):
        if y.size and (int(y.min()) < 0 or int(y.max()) >= classes):
            raise DataError(f"{folder}: labels outside [0, {classes}) for {name}.")
    return _images(name, train, test, classes)


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
            return folder
    raise _missing(name, [p / "train" for p in looked], base)


def _leaf_users(folder: Path) -> dict[str, dict[str, list[Any]]]:
    """Every user's ``{"x": [...], "y": [...]}`` in the JSON files of ``folder``."""
    users: dict[str, dict[str, list[Any]]] = {}
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{folder} holds no LEAF .json files.")
    for path in files:
        try:
            with path.open(encoding="utf-8") as f:
                blob = json.load(f)
            part = blob["user_data"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{path} is not a LEAF data file: {exc!r}") from None
        for user, data in part.items():
            have = users.setdefault(str(user), {"x": [], "y": []})
            if len(data["x"]) != len(data["y"]):
                raise DataError(
                    f"{path}: user {user!r} has {len(data['x'])} x and {len(data['y'])} y."
                )
            have["x"].extend(data["x"])
            have["y"].extend(data["y"])
    return users


LEAF_CACHE = ".fedcore-decoded"
"""The folder, beside LEAF's ``train/`` and ``test/``, that keeps their decoded arrays."""

_CACHE_FORMAT = 1
"""Bump when what :func:`_leaf_decoded` returns changes: older cached files are then unused."""


def _leaf_key(folder: Path) -> str:
    """A digest of every JSON file of ``folder``'s ``train/`` and ``test/``: name, size and
    modification time (a changed or added file makes a new key)."""
    listing = [
        (p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
        for split in ("train", "test")
        for p in sorted((folder / split).glob("*.json"))
    ]
    text = json.dumps([_CACHE_FORMAT, listing])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _leaf(name: str, root: str, encode: Any, classes: int) -> Dataset:
    """A LEAF dataset, decoded from its JSON once: the arrays are kept in
    ``LEAF_CACHE/<name>-<key>.npz`` beside the JSON folders (:func:`_leaf_key`; read back
    about 20x faster than the JSON is decoded) where that folder is writable, and decoded
    again where it is not."""
    folder = _leaf_folder(name, root)
    cached = folder / LEAF_CACHE / f"{name}-{_leaf_key(folder)}.npz"
    arrays = _read_cache(cached)
    if arrays is None:
        logger.info("decoding the JSON of %s in %s (once: kept in %s)", name, folder, cached.parent)
        arrays = _leaf_decoded(folder, encode)
        _write_cache(cached, arrays)
    x_tr, y_tr, g_tr = arrays["x_train"], arrays["y_train"], arrays["g_train"]
    x_te, y_te, g_te = arrays["x_test"], arrays["y_test"], arrays["g_test"]
    if x_tr.dtype == np.float32:
        x_train, x_test = _standardized(name, x_tr, x_te)
    else:
        x_train, x_test = torch.from_numpy(x_tr), torch.from_numpy(x_te)
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=torch.from_numpy(y_tr),
        x_test=x_test,
        y_test=torch.from_numpy(y_te),
        num_classes=classes,
        groups_train=g_tr,
        groups_test=g_te,
        writers=tuple(str(w) for w in arrays["writers"]),
    )


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with path.open("rb") as f, np.load(f, allow_pickle=False) as blob:
            return {k: blob[k] for k in blob.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent, cut short
        return None


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` whole or not at all (a temporary file renamed); a folder
    that cannot be written only costs the next run the decoding."""
    try:
        path.parent.mkdir(exist_ok=True)
        for old in path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-*.npz"):
            old.unlink()  # an earlier version of the files
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(f.name, path)
    except OSError as exc:
        logger.info("could not keep the decoded %s in %s (%s)", path.name, path.parent, exc)


def _leaf_decoded(folder: Path, encode: Any) -> dict[str, np.ndarray]:
    """The JSON of ``folder``'s ``train/`` and ``test/`` as arrays: ``x_*``, ``y_*``, each
    example's writer ``g_*`` (an index into ``writers``, the sorted user names)."""
    splits = {split: _leaf_users(folder / split) for split in ("train", "test")}
    writers = sorted(set(splits["train"]) | set(splits["test"]))
    index = {w: i for i, w in enumerate(writers)}
    arrays: dict[str, np.ndarray] = {}
    for split, users in splits.items():
        xs, ys, gs = [], [], []
        for user in sorted(users):
            x, y = encode(users[user], folder / split, user)
            xs.append(x)
            ys.append(y)
            gs.append(np.full(len(y), index[user], dtype=np.int64))
        arrays[f"x_{split}"] = np.concatenate(xs)
        arrays[f"y_{split}"] = np.concatenate(ys)
        arrays[f"g_{split}"] = np.concatenate(gs)
    arrays["writers"] = np.asarray(writers, dtype=str)
    return arrays


def _femnist_user(data: dict[str, list[Any]], where: Path, user: str) -> tuple[Any, Any]:
    x = np.asarray(data["x"], dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != 784:
        raise DataError(f"{where}: user {user!r}'s x is {x.shape}; FEMNIST's are 784 values.")
    return x.reshape(-1, 1, 28, 28), np.asarray(data["y"], dtype=np.int64)


_LETTER = {c: i for i, c in enumerate(SHAKESPEARE_LETTERS)}
_UNKNOWN = _LETTER[" "]


def _letters(text: str) -> list[int]:
    return [_LETTER.get(c, _UNKNOWN) for c in text]


def _shakespeare_user(data: dict[str, list[Any]], where: Path, user: str) -> tuple[Any, Any]:
    lines = data["x"]
    if any(not isinstance(s, str) or len(s) != LEAF_SEQUENCE for s in lines):
        raise DataError(
            f"{where}: user {user!r} has an x that is not a string of {LEAF_SEQUENCE} "
            "characters (LEAF's Shakespeare lines)."
        )
    x = np.asarray([_letters(s) for s in lines], dtype=np.int64).reshape(-1, LEAF_SEQUENCE)
    y = np.asarray([_letters(str(c)[:1] or " ")[0] for c in data["y"]], dtype=np.int64)
    return x, y


def femnist(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """LEAF's FEMNIST: 28x28 handwritten digits and letters (62 classes), one group per
    writer, with the train/test split LEAF's preprocessing made."""
    return _leaf("femnist", root, _femnist_user, 62)


def shakespeare(*, seed: int = 0, test_fraction: float = 0.2, root: str = "") -> Dataset:
    """LEAF's Shakespeare: 80-character lines as int64 indices into
    :data:`SHAKESPEARE_LETTERS`, the next character as the label (80 classes), one group
    per speaking role."""
    return _leaf("shakespeare", root, _shakespeare_user, len(SHAKESPEARE_LETTERS))


# -- folder:PATH -------------------------------------------------------------------------------


def folder(path: str, *, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The dataset at ``path`` (``data.dataset = "folder:PATH"``; see the module docstring for
    the forms). Images are standardized per channel; classes are ``max label + 1`` (an image
    folder's: its class folders, sorted)."""
    where = Path(path).expanduser()
    name = f"folder:{path}"
    if where.suffix == ".npz" and where.is_file():
        return _npz(name, where)
    if not where.is_dir():
        raise DataError(f"data.dataset {name!r}: {where} is neither a .npz file nor a folder.")
    tables = sorted(p for p in where.rglob("*") if p.suffix in (".parquet", ".arrow"))
    if tables:
        return _tables(name, where, tables)
    if (where / "train").is_dir() and (where / "test").is_dir():
        return _image_folders(name, where)
    raise DataError(
        f"data.dataset {name!r}: {where} holds no .parquet or .arrow files and no train/ and "
        "test/ folders of class folders."
    )


def _finish(name: str, train: tuple[Any, Any], test: tuple[Any, Any], classes: int) -> Dataset:
    x_train, x_test = np.asarray(train[0]), np.asarray(test[0])
    if x_train.ndim == 3:  # [n, H, W]: one channel
        x_train, x_test = x_train[:, None], x_test[:, None]
    if x_train.ndim == 4 and x_train.shape[-1] in (1, 3, 4) and x_train.shape[1] not in (1, 3, 4):
        x_train, x_test = x_train.transpose(0, 3, 1, 2), x_test.transpose(0, 3, 1, 2)
    if x_train.ndim == 4:
        return _images(
            name, (x_train, np.asarray(train[1])), (x_test, np.asarray(test[1])), classes
        )
    return Dataset(
        name=name,
        x_train=torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.float32)),
        y_train=torch.from_numpy(np.asarray(train[1], dtype=np.int64)),
        x_test=torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.float32)),
        y_test=torch.from_numpy(np.asarray(test[1], dtype=np.int64)),
        num_classes=classes,
    )


def _classes(*labels: np.ndarray) -> int:
    return int(max(int(y.max()) for y in labels if y.size)) + 1


def _npz(name: str, path: Path) -> Dataset:
    with np.load(path, allow_pickle=False) as blob:
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in blob]
        if missing:
            raise DataError(f"{path} has no {', '.join(missing)} (it has {', '.join(blob)}).")
        x_tr, y_tr, x_te, y_te = (blob[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    return _finish(name, (x_tr, y_tr), (x_te, y_te), _classes(y_tr, y_te))


def _decode_image(value: Any) -> np.ndarray:
    """A Hugging Face image cell (``{"bytes": ..., "path": ...}``) or raw bytes as pixels."""
    from PIL import Image

    data = value.get("bytes") if isinstance(value, dict) else value
    if not isinstance(data, bytes):
        raise DataError("an image cell holds no bytes (a path alone is not read).")
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def _tables(name: str, where: Path, files: list[Path]) -> Dataset:
    try:
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise DataError(
            f"data.dataset {name!r} holds .parquet/.arrow files, which need pyarrow: "
            "pip install 'fedcore[datasets]'."
        ) from None
    splits: dict[str, list[Any]] = {"train": [], "test": []}
    for path in files:
        split = next((s for s in splits if s in path.relative_to(where).as_posix()), None)
        if split is None:
            continue
        if path.suffix == ".parquet":
            splits[split].append(pyarrow.parquet.read_table(path))
        else:
            with path.open("rb") as f:
                try:
                    splits[split].append(pyarrow.ipc.open_stream(f).read_all())
                except pyarrow.ArrowInvalid:
                    f.seek(0)
                    splits[split].append(pyarrow.ipc.open_file(f).read_all())
    if not splits["train"] or not splits["test"]:
        raise DataError(
            f"data.dataset {name!r}: found no {'train' if not splits['train'] else 'test'} "
            "files (a file's name or folder must say train or test)."
        )
    arrays = {}
    for split, tables in splits.items():
        table = pyarrow.concat_tables(tables)
        columns = table.column_names
        label = next((c for c in ("label", "labels", "fine_label") if c in columns), None)
        feature = next((c for c in ("image", "img", "pixels", "x") if c in columns), None)
        if label is None or feature is None:
            raise DataError(
                f"data.dataset {name!r}: its {split} table has columns {columns}; it needs a "
                "label column (label, labels or fine_label) and an image column (image, img, "
                "pixels or x)."
            )
        cells = table.column(feature).to_pylist()
        first = cells[0] if cells else None
        if isinstance(first, (dict, bytes)):
            x = np.stack([_decode_image(c) for c in cells])
        else:
            x = np.asarray(cells, dtype=np.float32)
        arrays[split] = (x, np.asarray(table.column(label).to_pylist(), dtype=np.int64))
    train, test = arrays["train"], arrays["test"]
    return _finish(name, train, test, _classes(train[1], test[1]))


def _image_folders(name: str, where: Path) -> Dataset:
    from PIL import Image

    classes = sorted(p.name for p in (where / "train").iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"data.dataset {name!r}: {where / 'train'} has no class folders.")
    arrays = {}
    for split in ("train", "test"):
        xs, ys = [], []
        for label, cls in enumerate(classes):
            for path in sorted((where / split / cls).glob("*")):
                if path.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp", ".gif"):
                    with Image.open(path) as image:
                        xs.append(np.asarray(image))
                    ys.append(label)
        if not xs:
            raise DataError(f"data.dataset {name!r}: {where / split} holds no images.")
        shapes = {x.shape for x in xs}
        if len(shapes) > 1:
            raise DataError(
                f"data.dataset {name!r}: the images of {where / split} differ in size "
                f"({', '.join(map(str, sorted(shapes)[:3]))}); resize them to one size."
            )
        arrays[split] = (np.stack(xs), np.asarray(ys, dtype=np.int64))
    return _finish(name, arrays["train"], arrays["test"], len(classes))
