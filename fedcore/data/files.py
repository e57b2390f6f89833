"""What every dataset read from files shares: where the files are (:func:`data_root`), the
fetch command of each (:data:`FETCH`), and the checks every file passes before it is used.

Nothing in :mod:`fedcore.data` downloads anything. Each dataset is read from ``data.root``
(:func:`data_root`: the config's value, else ``$FEDCORE_DATA``, else
``~/.cache/fedcore/data``), in the layout its own tools write. A dataset that is absent
raises :class:`MissingDataset`: one line with where fedcore looked and the command that
fetches it on a machine with network.

Every file is hostile until checked. A file is read only when it is a regular file whose
real path lies inside the folder the dataset is read from (a link out of that folder is
refused: :func:`_data_file`); non-finite features and labels out of range are refused where
they are read. Whatever is wrong, from a file's bytes to one label, is one
:class:`~fedcore.errors.DataError` naming the file (:func:`_reading`), raised while the run
is set up, before any peer starts.

Images become float32 ``[n, C, H, W]``, each channel standardized with the training split's
mean and standard deviation (:func:`_standardized`). The helpers named with an underscore
are this package's own: the format modules (:mod:`~fedcore.data.cifar`,
:mod:`~fedcore.data.idx`, :mod:`~fedcore.data.leaf`, :mod:`~fedcore.data.folder`) share them.
"""

from __future__ import annotations

import array
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedcore.config import DATA_ENV
from fedcore.data.types import Dataset, first_non_finite
from fedcore.errors import DataError, FedcoreError
from fedcore.ids import clip, error_text

__all__ = ["DATA_ENV", "FETCH", "MAX_CLASSES", "MissingDataset", "data_root"]

MAX_CLASSES = 100_000
"""Most classes of a ``folder:`` dataset (its largest label plus one, the width of the
model's output layer): a larger label is refused as out of range."""

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
