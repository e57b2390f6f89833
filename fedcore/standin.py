"""Stand-in files for the datasets read from disk (:mod:`fedcore.localdata`): a few hundred
generated examples in each dataset's real format, folder layout and file names, so its
loader, partitions and examples run end to end where the real data cannot be fetched
(tests, CI, a first try).

The pixels are noise around a pattern of the label (a model learns them a little); the
Shakespeare lines are random characters of the vocabulary, the label the character that
follows. Nothing here is the real data: a run on it says nothing of a method.

    python -m fedcore.standin cifar10 femnist --root /tmp/data
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle  # CIFAR's python release format, local stand-in files only; never sent
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedcore.localdata import LEAF_SEQUENCE, SHAKESPEARE_LETTERS

__all__ = ["STANDINS", "WRITERS", "main", "write_standin"]

STANDINS = ("cifar10", "cifar100", "fashion-mnist", "emnist", "femnist", "shakespeare")
"""The datasets :func:`write_standin` writes."""

WRITERS = 32
"""Default writers of the LEAF stand-ins: two for each of the 16 peers of the FEMNIST and
Shakespeare examples (``examples/femnist-fedavg.toml``, ``examples/shakespeare-ops.toml``:
a natural partition needs a writer per peer or more)."""


def _pixels(
    rng: np.random.Generator, labels: np.ndarray, shape: tuple[int, ...], classes: int
) -> np.ndarray:
    """uint8 images of ``shape``: noise around a per-class pattern."""
    patterns = np.random.default_rng(12345).integers(0, 256, size=(classes, *shape))
    noise = rng.normal(0.0, 40.0, size=(len(labels), *shape))
    out: np.ndarray = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
    return out


def _pickle(path: Path, blob: dict[str, object]) -> None:
    with path.open("wb") as f:
        pickle.dump(blob, f, protocol=2)


def _cifar(root: Path, rng: np.random.Generator, samples: int, hundred: bool) -> Path:
    classes = 100 if hundred else 10
    test_n = max(samples // 4, 1)
    y_train = rng.integers(0, classes, samples)
    y_test = rng.integers(0, classes, test_n)
    x_train = _pixels(rng, y_train, (3072,), classes)
    x_test = _pixels(rng, y_test, (3072,), classes)
    if hundred:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True, exist_ok=True)
        for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
            _pickle(
                folder / name,
                {
                    "filenames": [f"standin_{i}.png" for i in range(len(y))],
                    "batch_label": f"{name} batch (stand-in)",
                    "fine_labels": y.tolist(),
                    "coarse_labels": (y // 5).tolist(),
                    "data": x,
                },
            )
        _pickle(folder / "meta", {"fine_label_names": [f"class{i}" for i in range(100)]})
        return folder
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    batches = np.array_split(np.arange(samples), 5)
    for i, rows in enumerate(batches, start=1):
        _pickle(
            folder / f"data_batch_{i}",
            {
                "batch_label": f"training batch {i} of 5 (stand-in)",
                "labels": y_train[rows].tolist(),
                "data": x_train[rows],
                "filenames": [f"standin_{j}.png" for j in rows],
            },
        )
    _pickle(
        folder / "test_batch",
        {
            "batch_label": "testing batch 1 of 1 (stand-in)",
            "labels": y_test.tolist(),
            "data": x_test,
            "filenames": [f"standin_{j}.png" for j in range(test_n)],
        },
    )
    _pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    return folder


def _idx(path: Path, array: np.ndarray, *, compress: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


def _idx_set(
    root: Path, rng: np.random.Generator, samples: int, emnist: bool, compress: bool
) -> Path:
    classes = 47 if emnist else 10
    folder = root / ("EMNIST" if emnist else "FashionMNIST") / "raw"
    folder.mkdir(parents=True, exist_ok=True)
    stems = ("emnist-balanced-train", "emnist-balanced-test") if emnist else ("train", "t10k")
    for stem, n in zip(stems, (samples, max(samples // 4, 1)), strict=True):
        y = rng.integers(0, classes, n)
        _idx(
            folder / f"{stem}-images-idx3-ubyte",
            _pixels(rng, y, (28, 28), classes),
            compress=compress,
        )
        _idx(folder / f"{stem}-labels-idx1-ubyte", y, compress=compress)
    return folder


def _leaf(root: Path, rng: np.random.Generator, samples: int, writers: int, text: bool) -> Path:
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
            pixels = _pixels(rng, labels, (784,), 62).astype(np.float64) / 255.0
            x = np.round(pixels, 4).tolist()
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


def write_standin(
    name: str,
    root: str | Path,
    *,
    samples: int = 300,
    writers: int | None = None,
    seed: int = 0,
    compress: bool = False,
) -> Path:
    """Write stand-in files of dataset ``name`` under ``root`` (the folder ``data.root``
    names) and return the folder written.

    Args:
        name: One of :data:`STANDINS`.
        root: The data root.
        samples: Training examples (the test split gets a quarter as many; LEAF's a tenth
            of each writer's, at least one).
        writers: Writers (LEAF datasets); default :data:`WRITERS` (fits the examples' 16
            peers), or ``samples // 5`` where the samples are too few for that many.
        seed: Seed of the generated values.
        compress: Write the idx files gzipped, as their downloads are.

    Raises:
        ValueError: an unknown name, or too few samples for the writers.
    """
    if name not in STANDINS:
        raise ValueError(f"no stand-in for {name!r}; there are: {', '.join(STANDINS)}")
    if writers is None:
        writers = max(1, min(WRITERS, samples // 5))
    if name in ("femnist", "shakespeare") and writers < 1:
        raise ValueError(f"--writers must be at least 1, got {writers}.")
    if name in ("femnist", "shakespeare") and samples < 5 * writers:
        raise ValueError(f"{samples} samples are too few for {writers} writers (5 each).")
    base = Path(root).expanduser()
    rng = np.random.default_rng(seed)
    if name in ("cifar10", "cifar100"):
        return _cifar(base, rng, samples, name == "cifar100")
    if name in ("fashion-mnist", "emnist"):
        return _idx_set(base, rng, samples, name == "emnist", compress)
    return _leaf(base, rng, samples, writers, name == "shakespeare")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedcore.standin NAME... --root DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m fedcore.standin",
        description="Write stand-in files (generated, not the real data) of the datasets "
        "fedcore reads from disk, in their real formats and layouts.",
    )
    parser.add_argument(
        "names",
        nargs="+",
        choices=STANDINS,
        metavar="NAME",
        help=f"the datasets to write: {', '.join(STANDINS)}",
    )
    parser.add_argument("--root", required=True, help="the folder data.root will name")
    parser.add_argument("--samples", type=int, default=300, help="training examples (300)")
    parser.add_argument(
        "--writers",
        type=int,
        default=None,
        help=f"writers of femnist and shakespeare (default {WRITERS}: two for each of the "
        "examples' 16 peers; SAMPLES/5 when fewer)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in args.names:
        try:
            where = write_standin(
                name, args.root, samples=args.samples, writers=args.writers, seed=args.seed
            )
        except ValueError as exc:
            print(f"python -m fedcore.standin: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: wrote stand-in files in {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
