# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""The cost of virtual time on the vectorized engine: rounds/s with and without ``[time]``.

Each shape runs ``fedcore simulate CONFIG --set ... --quiet`` as a child process three
ways, interleaved ``--repeats`` times: as configured (no virtual time), with a ``[time]``
table that draws everything there is to draw (lognormal compute times, 10% slow peers,
latency and bandwidth on every link, on/off availability), and with the same table in
deadline mode (the clock then decides which messages are late). The table gives the median
rounds/s of each (from the summary's ``wall_seconds``: the rounds, evaluations included),
the ratio to the run without time (the target: at most 1.5x slower), the whole command's
seconds, and the virtual seconds the timed run reports.

Usage::

    python benchmarks/virtual_time.py [--shapes dog-10k ...] [--repeats 3]
        [--out benchmarks/results/virtual_time.json]
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
    "dog-10k": [str(EXAMPLES / "dog-10k.toml"), "--set", "run.regret=false"],
    "dpsgd-ring-10k": [
        str(EXAMPLES / "dog-10k.toml"),
        *("--set", "run.regret=false", "--set", "algorithm.name=dpsgd"),
        *("--set", "topology.kind=ring", "--set", "topology.undirected=true"),
        *("--set", "run.rounds=400"),
    ],
}
"""Shapes of 10,000 peers on the DOG paper's online stream: its 15-regular graph
(150,000 edges), and D-PSGD on a ring (20,000)."""

TIME = [
    "time.step_s=0.05",
    "time.compute='lognormal'",
    "time.slow_fraction=0.1",
    "time.latency_s=0.02",
    "time.bandwidth_mb_s=10.0",
    "time.on_s=60.0",
    "time.off_s=5.0",
]
"""A [time] table that draws every kind of duration there is."""

WAYS: dict[str, list[str]] = {
    "none": [],
    "time": TIME,
    "time+deadline": [*TIME, "transport.mode=deadline", "transport.deadline_s=0.2"],
}


def run_once(shape: str, way: str, folder: Path) -> dict[str, Any]:
    out = folder / f"{shape}-{way}"
    command = [sys.executable, "-m", "fedcore", "simulate", *SHAPES[shape]]
    for item in WAYS[way]:
        command += ["--set", item]
    command += ["--engine", "vectorized", "--threads", "1", "--quiet", "--force", "--out", str(out)]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{shape} ({way}) failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {
        "wall": wall,
        "rounds_wall": summary["wall_seconds"],
        "rounds": summary["rounds_completed"],
        "virtual_seconds": (summary.get("time") or {}).get("virtual_seconds"),
        "late": summary["traffic"]["messages_late"],
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "virtual_time.json"))
    args = parser.parse_args()
    load_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    print("| shape | way | rounds/s | slower than none | command (s) | virtual s | late messages |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ways = list(WAYS)
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            runs: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
            for k in range(args.repeats):
                for way in ways if k % 2 == 0 else ways[::-1]:
                    runs[way].append(run_once(shape, way, Path(tmp)))
            rate = {
                way: statistics.median(r["rounds"] / r["rounds_wall"] for r in runs[way])
                for way in ways
            }
            for way in ways:
                row = {
                    "shape": shape,
                    "way": way,
                    "rounds_per_s": rate[way],
                    "slowdown": rate["none"] / rate[way],
                    "command_s": statistics.median(r["wall"] for r in runs[way]),
                    "virtual_seconds": runs[way][0]["virtual_seconds"],
                    "late": runs[way][0]["late"],
                    "runs": runs[way],
                }
                rows.append(row)
                virtual = row["virtual_seconds"]
                print(
                    f"| {shape} | {way} | {row['rounds_per_s']:.1f} | {row['slowdown']:.2f}x | "
                    f"{row['command_s']:.1f} | "
                    f"{'-' if virtual is None else f'{virtual:.1f}'} | {row['late']} |",
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
