# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Seeds as a batch: ``fedcore simulate --seeds 0-7 --batch-seeds`` against ``--jobs 2``.

Each mode is the whole command, a child process (``python -m fedcore simulate -q --seeds
SEEDS ...`` with the checkout's fedcore first on ``PYTHONPATH``), timed from start to exit:
interpreters, imports, every seed's set-up, the rounds, every seed's folder (records,
summary, ``curves.png``) and the sweep's files. The config is the README's default (the
built-in run: OPS on the 16-peer social graph, digits, 300 rounds) unless ``--set`` items
are given. Modes (``--modes``): ``jobs2`` (``--jobs 2``: two worker processes), ``jobs1``
(one process, seed after seed), ``batch`` (``--batch-seeds``) and ``batch-threads2``
(``--batch-seeds --threads 2``). The modes run interleaved, ``--repeats`` times each; the
table gives the fastest and the median of each, and the speed-up of each mode's median
over ``jobs2``'s; "round loops" is the seconds spent in round loops (rounds, records,
evaluations: each run's ``wall_seconds``, summed over a plain sweep's runs; a batch's once,
as every seed's is the batch's), the rest being start-up, set-up and each seed's summary and
picture; "CPU" is the user and system seconds of the command and every process it started
(a measure the other jobs on a shared machine move less than the wall time). "same bits"
compares every seed's ``params_sha256`` across every run of
every mode: a batch ends each seed where its separate run ends.

Usage::

    python benchmarks/seed_batch.py [--seeds 0-7] [--modes jobs2 jobs1 batch batch-threads2]
        [--repeats 2] [--set KEY=VALUE ...] [--out benchmarks/results/seed_batch.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
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

from fedcore.simulation.seeds import parse_seeds

MODES: dict[str, list[str]] = {
    "jobs2": ["--jobs", "2"],
    "jobs1": [],
    "batch": ["--batch-seeds"],
    "batch-threads2": ["--batch-seeds", "--threads", "2"],
}
"""Each mode's flags after ``fedcore simulate -q --seeds SEEDS``."""


def run_mode(mode: str, seeds: str, overrides: list[str], out: Path) -> tuple[float, float]:
    """Run one mode's whole command into ``out``; its wall seconds, and the CPU seconds
    (user and system) of it and every process it started."""
    argv = [sys.executable, "-m", "fedcore", "simulate", "-q", "--seeds", seeds]
    argv += [*MODES[mode], "--out", str(out)]
    for item in overrides:
        argv += ["--set", item]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return wall, cpu


def summaries(out: Path, seeds: list[int]) -> list[dict[str, Any]]:
    """Every seed's ``summary.json`` in the sweep folder ``out``."""
    return [
        json.loads((out / f"seed-{k}" / "summary.json").read_text(encoding="utf-8")) for k in seeds
    ]


def loop_seconds(mode: str, runs: list[dict[str, Any]]) -> float:
    """The seconds the sweep spent in round loops (with their records and evaluations):
    the sum of the runs' ``wall_seconds``, or a batch's one (every seed's is the batch's)."""
    walls = [float(r["wall_seconds"]) for r in runs]
    return max(walls) if mode.startswith("batch") else sum(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-7")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/seed_batch.json")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    walls: dict[str, list[float]] = {mode: [] for mode in args.modes}
    loops: dict[str, list[float]] = {mode: [] for mode in args.modes}
    cpus: dict[str, list[float]] = {mode: [] for mode in args.modes}
    seen: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="seed-batch-") as tmp:
        for r in range(args.repeats):
            for mode in args.modes:
                out = Path(tmp) / f"{mode}-{r}"
                wall, cpu = run_mode(mode, args.seeds, args.overrides, out)
                walls[mode].append(wall)
                cpus[mode].append(cpu)
                runs = summaries(out, seeds)
                seen.append([run["params_sha256"] for run in runs])
                loops[mode].append(loop_seconds(mode, runs))
                print(
                    f"{mode} #{r + 1}: {wall:.2f} s, CPU {cpu:.2f} s, "
                    f"round loops {loops[mode][-1]:.2f} s",
                    flush=True,
                )
    same = all(d == seen[0] for d in seen)
    base = statistics.median(walls["jobs2"]) if "jobs2" in walls else None
    rows = []
    for mode in args.modes:
        median = statistics.median(walls[mode])
        rows.append(
            {
                "mode": mode,
                "flags": " ".join(MODES[mode]) or "(none)",
                "walls": walls[mode],
                "fastest": min(walls[mode]),
                "median": median,
                "speedup_vs_jobs2": None if base is None else base / median,
                "cpu": cpus[mode],
                "cpu_median": statistics.median(cpus[mode]),
                "round_loops": loops[mode],
                "round_loops_median": statistics.median(loops[mode]),
            }
        )
    print()
    print(
        "| mode | flags | fastest (s) | median (s) | speed-up over --jobs 2 (median) "
        "| CPU (s, median) | round loops, all seeds (s, median) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        speed = "-" if row["speedup_vs_jobs2"] is None else f"{row['speedup_vs_jobs2']:.2f}x"
        print(
            f"| {row['mode']} | `{row['flags']}` | {row['fastest']:.2f} | {row['median']:.2f} "
            f"| {speed} | {row['cpu_median']:.2f} | {row['round_loops_median']:.2f} |"
        )
    print(f"\nsame bits (every seed's params_sha256, every run): {'yes' if same else 'NO'}")
    report = {
        "machine": _common.machine_info(loadavg_end=list(os.getloadavg())),
        "seeds": seeds,
        "overrides": args.overrides,
        "repeats": args.repeats,
        "rows": rows,
        "same_bits": same,
    }
    _common.write_report(args.out, report)


if __name__ == "__main__":
    main()
