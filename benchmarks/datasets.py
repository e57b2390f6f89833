# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Loading the datasets read from files, at their real sizes: what a run's set-up waits for.

    python benchmarks/datasets.py [--names cifar10 fashion-mnist emnist femnist shakespeare]
        [--scale 1.0] [--out benchmarks/results/datasets.json]

For each dataset, stand-in files of its real size (:mod:`fedcore.data.standin`: the real
format, layout and file names; CIFAR-10's 50,000 training images, Fashion-MNIST's 60,000,
EMNIST balanced's 112,800, FEMNIST as LEAF's ``--sf 0.05`` keeps it, about 40,000 images of
180 writers, Shakespeare as ``--sf 0.05``, about 200,000 lines of 250 roles; ``--scale``
multiplies them) are written to a temporary folder, untimed. Then, each in a fresh
process, it times:

* ``load``: ``fedcore.data.load_dataset`` (read, decode, standardize: what ``prepare_run``
  calls), and ``again``: the same a second time (LEAF's JSON is decoded once and kept
  beside it: the second load reads the kept arrays);
* ``floor``: ``numpy.load`` of the same arrays saved as one uncompressed ``.npz`` (reading
  the decoded bytes from the same disk: no format can be read faster);
* the partitions of 100 peers that the dataset allows (natural where it has writers, over
  as many peers as writers when there are fewer).

The ratio load/floor is what the format costs. Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.data import load_dataset, partition
from fedcore.data.cache import LEAF_CACHE
from fedcore.data.standin import write_standin

SIZES = {
    # name: (training examples, writers)
    "cifar10": (50_000, 0),
    "fashion-mnist": (60_000, 0),
    "emnist": (112_800, 0),
    "femnist": (40_000, 180),
    "shakespeare": (200_000, 250),
}


def one(name: str, root: Path) -> dict[str, Any]:
    """Time the load, the floor and the partitions of ``name`` under ``root`` (this
    process: fresh)."""
    began = time.perf_counter()
    dataset = load_dataset(name, seed=0, root=str(root))
    load_s = time.perf_counter() - began
    began = time.perf_counter()
    load_dataset(name, seed=0, root=str(root))
    again_s = time.perf_counter() - began
    floor_file = root / f"{name}.npz"
    np.savez(
        floor_file,
        x_train=dataset.x_train.numpy(),
        y_train=dataset.y_train.numpy(),
        x_test=dataset.x_test.numpy(),
        y_test=dataset.y_test.numpy(),
    )
    os.sync()
    began = time.perf_counter()
    with np.load(floor_file) as blob:
        arrays = [blob[k] for k in ("x_train", "y_train", "x_test", "y_test")]
    floor_s = time.perf_counter() - began
    schemes = ["iid", "dirichlet", "shards", "quantity"]
    if dataset.groups_train is not None:
        schemes.append("natural")
    parts = {}
    for scheme in schemes:
        began = time.perf_counter()
        peers = min(100, len(dataset.writers)) if scheme == "natural" else 100
        partition(dataset.y_train, peers, scheme, seed=0, alpha=0.5, groups=dataset.groups_train)
        parts[scheme] = time.perf_counter() - began
    return {
        "name": name,
        "train": len(dataset.y_train),
        "test": len(dataset.y_test),
        "writers": len(dataset.writers),
        "mib": sum(a.nbytes for a in arrays) / 2**20,
        "files_mib": sum(
            p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and p != floor_file and LEAF_CACHE not in p.parts
        )
        / 2**20,
        "load_s": load_s,
        "again_s": again_s,
        "floor_s": floor_s,
        "partition_s": parts,
    }


def main() -> None:
    """Write each dataset's stand-in files, time each in a fresh process, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/datasets.json"))
    parser.add_argument("--one", nargs=2, metavar=("NAME", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], Path(args.one[1]))))
        return
    info = _common.machine_info(scale=args.scale)
    rows = []
    print(
        "| dataset | train / test | writers | decoded MiB | files MiB | load s | floor s "
        "| load / floor | again s | partitions of 100 peers, s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.names:
        samples, writers = SIZES[name]
        with tempfile.TemporaryDirectory() as tmp:
            began = time.perf_counter()
            write_standin(
                name,
                tmp,
                samples=max(1, int(samples * args.scale)),
                writers=max(1, int(writers * args.scale)),
            )
            written = time.perf_counter() - began
            command = [sys.executable, __file__, "--one", name, tmp]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"| {name} | failed: {tail} |", flush=True)
            rows.append({"name": name, "failed": tail})
            continue
        row = json.loads(lines[-1])
        row["write_s"] = written
        rows.append(row)
        parts = ", ".join(f"{k} {v:.2f}" for k, v in row["partition_s"].items())
        print(
            f"| {name} | {row['train']:,} / {row['test']:,} | {row['writers']:,} "
            f"| {row['mib']:,.0f} | {row['files_mib']:,.0f} | {row['load_s']:.2f} "
            f"| {row['floor_s']:.2f} | {row['load_s'] / row['floor_s']:.1f} "
            f"| {row['again_s']:.2f} | {parts} |",
            flush=True,
        )
    info["loadavg_end"] = list(os.getloadavg())
    _common.write_report(args.out, {"machine": info, "rows": rows})


if __name__ == "__main__":
    main()
