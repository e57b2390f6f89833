"""The cost of gradient tracking on the vectorized engine: node-rounds a second of each
tracking rule against D-PSGD's, measured in the same run.

    python benchmarks/tracking.py [--peers 1000 10000] [--rounds 5] [--repeats 3]
        [--threads 1] [--cases ...] [--out benchmarks/results/tracking.json]

Every case runs on the same undirected random-regular graph of degree 8 (a digraph with
both directions, which the directed rules take as it is): MNIST-1D generated with at least
10,000 examples, the default logistic regression, iid parts, nothing evaluated, built
through the code ``fedcore simulate`` uses (the builds are not timed). ``ops`` (push-sum
SGD, the directed rules' undefended base) is shown beside them. A tracking rule mixes two
tensors a round where D-PSGD mixes one; issue 44's target is at most 2x D-PSGD's round.

The repeats interleave the cases; the table gives each one's median node-rounds a second
and its cost as a ratio to D-PSGD's median round at the same number of peers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common
from defences import build, time_rounds  # the same build and clock as the defences' table

GRAPH = ["topology.kind=random-regular", "topology.degree=8"]
BASELINE = "dpsgd"
CASES = ["dpsgd", "dsgt", "exact-diffusion", "beer", "ops", "push-pull", "push-diging"]


def measure(peers: int, cases: list[str], rounds: int, repeats: int) -> dict[str, list[float]]:
    """Each case's seconds a round, ``repeats`` times, the cases interleaved."""
    nets = {name: build([*GRAPH, f"algorithm.name={name}"], peers) for name in cases}
    for net in nets.values():
        net.run_round()  # untimed: first-round allocations
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, net in nets.items():
            times[name].append(time_rounds(net, rounds))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tracking.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = list(dict.fromkeys([BASELINE, *args.cases]))
    rows: list[dict[str, Any]] = []
    print(f"{args.rounds} rounds x {args.repeats} repeats, {args.threads} thread(s)")
    print("| peers | rule | node-rounds / s (median) | cost / D-PSGD's round |")
    print("|---:|---|---:|---:|")
    for peers in args.peers:
        times = measure(peers, cases, args.rounds, args.repeats)
        base = statistics.median(times[BASELINE])
        for name in cases:
            median = statistics.median(times[name])
            rate = peers / median
            ratio = median / base
            rows.append(
                {
                    "peers": peers,
                    "rule": name,
                    "seconds": times[name],
                    "node_rounds_per_s": rate,
                    "ratio": ratio,
                }
            )
            print(f"| {peers} | {name} | {rate:,.0f} | {ratio:.2f}x |", flush=True)
    report = {
        "machine": _common.machine_info(threads=args.threads),
        "rounds": args.rounds,
        "graph": GRAPH,
        "rows": rows,
    }
    _common.write_report(args.out, report)


if __name__ == "__main__":
    main()
