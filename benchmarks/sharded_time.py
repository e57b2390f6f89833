# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""The cost of virtual time on a sharded run: a round with and without ``[time]``, by ranks.

Every rank of ``fedcore simulate --ranks R`` advances the run's virtual clock over the whole
graph (``fedcore/engines/shard_time.py``): ``O(edges)`` a round on every rank, whatever R,
beside the rows' own work, which shrinks with R. For each rank count (``--ranks``, default 1
and 2) and each way (no virtual time; a ``[time]`` table that draws compute times, slow
peers, latency and bandwidth; drops alone, a fault plan's cost; the table in deadline mode
with drops), the command runs as a child process, one thread a rank: D-PSGD on logistic
regression on a random-regular graph of degree 4 (undirected), ``--peers`` peers,
``--rounds`` rounds, one evaluation at the end (the data of ``benchmarks/sharded.py``).
The table gives rank 0's seconds a round (``wall_seconds`` over the rounds: set-up
excluded), the ratio to the run without virtual time on as many ranks, the late messages
and whether every rank count ended with the same parameters. Then, in the benchmark's own
process (one rank of one: no collective), the median CPU milliseconds of a round of each
way and of its clock's share alone (``ShardTime.advance``): the work every rank adds a
round, whatever R.

Usage::

    python benchmarks/sharded_time.py [--peers 100000] [--rounds 20] [--ranks 1 2]
        [--out benchmarks/results/sharded_time.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
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
from sharded import workload, write_data

TIME = [
    "time.step_s=0.05",
    "time.compute=lognormal",
    "time.slow_fraction=0.1",
    "time.latency_s=0.02",
    "time.bandwidth_mb_s=10.0",
]
"""A ``[time]`` table that draws compute times and slow peers, links of one latency and
bandwidth."""

WAYS: dict[str, list[str]] = {
    "none": [],
    "time": TIME,
    "drops": ["faults.drop=0.05"],
    "time+deadline+drops": [
        *TIME,
        "transport.mode=deadline",
        "transport.deadline_s=0.1",
        "faults.drop=0.05",
    ],
}


def settings_of(way: str, args: argparse.Namespace, data: Path) -> list[str]:
    """The run's ``--set`` settings, one way."""
    return [
        "topology.kind=random-regular",
        "topology.degree=4",
        *workload(args.peers, args.rounds, data),
        *WAYS[way],
    ]


def clock_cost(way: str, args: argparse.Namespace, data: Path) -> dict[str, float]:
    """In this process, one rank of one (no collective): the CPU milliseconds (one thread:
    what other jobs on the machine do not change) of a whole round
    (:meth:`ShardedNetwork.run_round`) and of its clock's share
    (:meth:`~fedcore.engines.shard_time.ShardTime.advance`, timed alone on a second clock
    of the same run), each the median over ``--rounds`` rounds."""
    import statistics

    import torch

    from fedcore.config import load_config
    from fedcore.engines.clock import virtual_clock
    from fedcore.engines.ranks import Ranks
    from fedcore.engines.sharded import ShardedNetwork
    from fedcore.setup.prepare import prepare_run

    torch.set_num_threads(1)
    setup = prepare_run(load_config(None, settings_of(way, args, data)), simulated=True)
    setup.clock = virtual_clock(setup)
    net = ShardedNetwork(setup, Ranks(0, 1))
    rounds, clock = [], []
    for _ in range(args.rounds):
        began = time.process_time()  # CPU seconds: one thread, whatever else runs
        net.run_round()
        rounds.append(time.process_time() - began)
    if net.time is not None:  # the same rounds again, on a clock of its own
        setup.clock = virtual_clock(setup)
        alone = ShardedNetwork(setup, Ranks(0, 1)).time
        assert alone is not None
        for t in range(args.rounds):
            up = torch.ones(net.n, dtype=torch.bool)
            if setup.faults is not None:
                up = ~setup.faults.down_mask(t)
            began = time.process_time()
            alone.advance(t, up)
            clock.append(time.process_time() - began)
    return {
        "round_ms": 1000 * statistics.median(rounds),
        "clock_ms": 1000 * statistics.median(clock) if clock else 0.0,
    }


def run_once(way: str, ranks: int, args: argparse.Namespace, data: Path, folder: Path) -> Any:
    out = folder / f"{way}-{ranks}"
    settings = settings_of(way, args, data)
    command = [sys.executable, "-m", "fedcore", "simulate", "--ranks", str(ranks)]
    command += ["--threads", "1", "--quiet", "--force", "--out", str(out)]
    for setting in settings:
        command += ["--set", setting]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    whole = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{way} --ranks {ranks} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {
        "way": way,
        "ranks": ranks,
        "whole_s": whole,
        "rounds_s": summary["wall_seconds"],
        "round_ms": 1000 * summary["wall_seconds"] / args.rounds,
        "late": summary["traffic"]["messages_late"],
        "virtual_seconds": (summary.get("time") or {}).get("virtual_seconds"),
        "sha": json.dumps(summary.get("params_sha256") or summary.get("params_sha256_all")),
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sharded_time.json"))
    args = parser.parse_args()
    if args.peers < max(args.ranks) or args.rounds < 1 or min(args.ranks) < 1:
        parser.error("--peers must be at least the largest --ranks, --rounds and --ranks >= 1")
    load_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    print(
        f"{args.peers:,} peers (random-regular, degree 4), {args.rounds} rounds, one thread a rank."
    )
    print("| way | R | ms a round (rank 0) | x without time | whole (s) | late | same bits |")
    print("|---|---:|---:|---:|---:|---:|:---:|")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.npz"
        write_data(data, args.peers)
        base: dict[int, float] = {}
        shas: dict[str, set[str]] = {}
        for ranks in args.ranks:
            for way in WAYS:
                row = run_once(way, ranks, args, data, Path(tmp))
                if way == "none":
                    base[ranks] = row["round_ms"]
                row["ratio"] = row["round_ms"] / base[ranks]
                shas.setdefault(way, set()).add(row["sha"])
                row["same_bits"] = len(shas[way]) == 1
                rows.append(row)
                print(
                    f"| {way} | {ranks} | {row['round_ms']:.0f} | {row['ratio']:.2f} | "
                    f"{row['whole_s']:.1f} | {row['late']:,} | "
                    f"{'yes' if row['same_bits'] else 'NO'} |",
                    flush=True,
                )
        print()
        print("One rank in this process (R = 1, no collective), median over the rounds:")
        print("| way | CPU ms a round | of which the clock | x the round without time |")
        print("|---|---:|---:|---:|")
        alone: dict[str, dict[str, float]] = {}
        for way in WAYS:
            alone[way] = cost = clock_cost(way, args, data)
            ratio = cost["round_ms"] / alone["none"]["round_ms"]
            print(f"| {way} | {cost['round_ms']:.0f} | {cost['clock_ms']:.0f} | {ratio:.2f} |")
    report = {
        "rows": rows,
        "in_process": alone,
        "peers": args.peers,
        "rounds": args.rounds,
        "machine": _common.machine_info(
            loadavg_start=load_start, loadavg_end=list(os.getloadavg())
        ),
    }
    _common.write_report(Path(args.out), report)


if __name__ == "__main__":
    main()
