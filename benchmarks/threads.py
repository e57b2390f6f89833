# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""``fedcore simulate --threads auto`` against ``--threads 1``: the whole command, by shape.

For each shape, ``fedcore simulate CONFIG --set ... --quiet`` runs as a child process
(imports, set-up, rounds, evaluation and the results folder: what a user waits for) with
``--threads 1`` and with ``--threads auto``, interleaved (1, auto, auto, 1, ...), ``--repeats``
times each. The table gives the median wall time of each, their ratio (above 1: ``auto`` is
faster), the rounds' own seconds (the summary's ``wall_seconds``), the thread count
``auto`` chose (the summary's ``threads``) and whether both runs gave the same parameters
(``params_sha256``: a run's bits must not depend on its thread count).

Usage::

    python benchmarks/threads.py [--shapes quick fedavg-100 ...] [--repeats 3]
        [--out benchmarks/results/threads.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("fedcore") is None:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

EXAMPLES = ROOT / "examples"

SHAPES: dict[str, list[str]] = {
    "quick": [],
    "fedavg-100": [
        str(EXAMPLES / "fedavg.toml"),
        *("--set", "topology.nodes=100", "--set", "algorithm.fraction=0.1"),
        *("--set", "run.local_steps=5", "--set", "data.dataset=mnist1d"),
        *("--set", "data.partition=iid", "--set", "run.rounds=60"),
    ],
    "fedavg-1000": [
        str(EXAMPLES / "fedavg.toml"),
        *("--set", "topology.nodes=1000", "--set", "algorithm.fraction=0.1"),
        *("--set", "run.local_steps=5", "--set", "data.dataset=mnist1d"),
        *("--set", "data.partition=iid", "--set", "run.rounds=30"),
    ],
    "dog-10k": [str(EXAMPLES / "dog-10k.toml")],
    "mlp-256": [
        str(EXAMPLES / "dpsgd.toml"),
        *("--set", "topology.nodes=256", "--set", "model.name=mlp"),
        *("--set", "data.dataset=mnist1d", "--set", "data.partition=iid"),
        *("--set", "run.rounds=100"),
    ],
    "choco-sign-150k-16": [
        str(EXAMPLES / "choco.toml"),
        *("--set", "model.name=mlp", "--set", "model.hidden=2000", "--set", "run.rounds=30"),
    ],
    "flat1m-16": [
        str(EXAMPLES / "fedavg.toml"),
        *("--set", "topology.nodes=16", "--set", "algorithm.fraction=1.0"),
        *("--set", "model.name=mlp", "--set", "model.hidden=13333"),
        *("--set", "run.rounds=20", "--set", "run.eval_every=20"),
    ],
}
"""Shapes from one small stack to one of 64 MiB."""


def run_once(shape: str, threads: str, folder: Path) -> dict[str, Any]:
    out = folder / f"{shape}-{threads}"
    command = [sys.executable, "-m", "fedcore", "simulate", *SHAPES[shape]]
    command += ["--threads", threads, "--quiet", "--force", "--out", str(out)]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{shape} --threads {threads} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {
        "wall": wall,
        "rounds_wall": summary["wall_seconds"],
        "threads": summary["threads"],
        "engine": summary["engine"],
        "sha": json.dumps(summary.get("params_sha256") or summary.get("params_sha256_all")),
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "threads.json"))
    args = parser.parse_args()
    load_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    print(
        "| shape | engine | auto's threads | 1 thread (s) | auto (s) | 1 / auto | rounds: "
        "1 / auto | same bits |"
    )
    print("|---|---|---:|---:|---:|---:|---:|:---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            runs: dict[str, list[dict[str, Any]]] = {"1": [], "auto": []}
            for k in range(args.repeats):
                for threads in ("1", "auto") if k % 2 == 0 else ("auto", "1"):
                    runs[threads].append(run_once(shape, threads, Path(tmp)))

            def median(
                key: str, threads: str, runs: dict[str, list[dict[str, Any]]] = runs
            ) -> float:
                return statistics.median(r[key] for r in runs[threads])

            row = {
                "shape": shape,
                "engine": runs["auto"][0]["engine"],
                "auto_threads": runs["auto"][0]["threads"],
                "wall_1": median("wall", "1"),
                "wall_auto": median("wall", "auto"),
                "rounds_1": median("rounds_wall", "1"),
                "rounds_auto": median("rounds_wall", "auto"),
                "same_bits": len({r["sha"] for rs in runs.values() for r in rs}) == 1,
                "runs": runs,
            }
            rows.append(row)
            print(
                f"| {shape} | {row['engine']} | {row['auto_threads']} | {row['wall_1']:.2f} | "
                f"{row['wall_auto']:.2f} | {row['wall_1'] / row['wall_auto']:.2f} | "
                f"{row['rounds_1'] / row['rounds_auto']:.2f} | "
                f"{'yes' if row['same_bits'] else 'NO'} |",
                flush=True,
            )
    report = {
        "rows": rows,
        "repeats": args.repeats,
        "machine": _common.machine_info(
            loadavg_start=load_start, loadavg_end=list(os.getloadavg())
        ),
    }
    _common.write_report(Path(args.out), report)


if __name__ == "__main__":
    main()
