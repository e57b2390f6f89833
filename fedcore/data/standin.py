"""Stand-in files for the datasets read from disk: a few hundred generated examples in each
dataset's real format, folder layout and file names, so its loader, partitions and examples
run end to end where the real data cannot be fetched (tests, CI, a first try).

The datasets are those :data:`fedcore.registry.DATASETS` tags ``files``; each one's writer,
``standin``, lives in the module of its loader (:mod:`fedcore.data.cifar`,
:mod:`fedcore.data.idx`, :mod:`fedcore.data.leaf`), which the registry names.

The pixels are noise around a pattern of the label (a model learns them a little); the
Shakespeare lines are random characters of the vocabulary, the label the character that
follows. Nothing here is the real data: a run on it says nothing of a method.

    python -m fedcore.data.standin cifar10 femnist --root /tmp/data
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedcore import registry

__all__ = ["STANDINS", "WRITERS", "main", "pixels", "write_standin"]

STANDINS = registry.DATASETS.tagged("files")
"""The datasets :func:`write_standin` writes: every built-in dataset read from files."""

_WITH_WRITERS = registry.DATASETS.tagged("writers")
"""The stand-ins written with writers (LEAF's)."""

WRITERS = 32
"""Default writers of the LEAF stand-ins: two for each of the 16 peers of the FEMNIST and
Shakespeare examples (``examples/femnist-fedavg.toml``, ``examples/shakespeare-ops.toml``:
a natural partition needs a writer per peer or more)."""


def pixels(
    rng: np.random.Generator, labels: np.ndarray, shape: tuple[int, ...], classes: int
) -> np.ndarray:
    """uint8 images of ``shape``: noise around a per-class pattern (every stand-in's pixels)."""
    patterns = np.random.default_rng(12345).integers(0, 256, size=(classes, *shape))
    noise = rng.normal(0.0, 40.0, size=(len(labels), *shape))
    out: np.ndarray = np.clip(patterns[labels] + noise, 0, 255).astype(np.uint8)
    return out


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
    if name in _WITH_WRITERS and writers < 1:
        raise ValueError(f"--writers must be at least 1, got {writers}.")
    if name in _WITH_WRITERS and samples < 5 * writers:
        raise ValueError(f"{samples} samples are too few for {writers} writers (5 each).")
    base = Path(root).expanduser()
    rng = np.random.default_rng(seed)
    module, _, _ = registry.DATASETS.entry(name).target.partition(":")
    written: Path = importlib.import_module(module).standin(
        name, base, rng, samples=samples, writers=writers, compress=compress
    )
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedcore.data.standin NAME... --root DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m fedcore.data.standin",
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
            print(f"python -m fedcore.data.standin: {exc}", file=sys.stderr)
            return 2
        print(f"{name}: wrote stand-in files in {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
