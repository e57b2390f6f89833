"""The cost of each Byzantine defence on the vectorized engine, as a ratio to its undefended
rule's round, measured in the same run.

    python benchmarks/defences.py [--peers 1000] [--rounds 10] [--repeats 3] [--threads 1]
        [--cases ...] [--out benchmarks/results/defences.json]

Each case is a round of the vectorized engine at ``--peers`` peers (MNIST-1D generated with
at least 10,000 examples, the default logistic regression, iid parts, one local step,
nothing evaluated), built through the code
``fedcore simulate`` uses; the builds are not timed. Pairs:

* gossip on a random-regular graph of degree 8: ``dpsgd`` against ``clippedgossip``
  (self-centered clipping, adaptive radius), ``trimmed-gossip`` (trim 1) and
  ``median-gossip``, and ``dpsgd private`` (DP-SGD on every peer: ``[privacy]``);
* push-sum on the social digraph: ``ops`` against ``clipped-push-sum``;
* the server family (a star, every worker every round): ``fedavg`` with the mean against
  each robust aggregator (``f`` = 1).

The repeats interleave the cases; the table gives each one's median seconds a round and its
ratio to its baseline's median. Issue 43's target: self-centered clipping at most 1.5x
D-PSGD's round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common

from fedcore.config import load_config
from fedcore.data import mnist1d
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.setup.prepare import prepare_run

GOSSIP = ["topology.kind=random-regular", "topology.degree=8"]
PUSH_SUM = ["topology.kind=social"]
STAR = ["topology.kind=star", "algorithm.fraction=1.0"]

CASES: dict[str, tuple[str, list[str]]] = {
    # case -> (its baseline, its overrides)
    "dpsgd": ("dpsgd", [*GOSSIP, "algorithm.name=dpsgd"]),
    "clippedgossip": ("dpsgd", [*GOSSIP, "algorithm.name=clippedgossip"]),
    "trimmed-gossip": ("dpsgd", [*GOSSIP, "algorithm.name=trimmed-gossip", "algorithm.trim=1"]),
    "median-gossip": ("dpsgd", [*GOSSIP, "algorithm.name=median-gossip"]),
    # DP-SGD on every peer (per-example clipping, the keyed noise): a privacy cost, not a
    # defence, measured the same way (issue 43's target: at most 3x).
    "dpsgd private": ("dpsgd", [*GOSSIP, "algorithm.name=dpsgd", "privacy.mechanism=dp-sgd"]),
    "ops": ("ops", [*PUSH_SUM, "algorithm.name=ops"]),
    "clipped-push-sum": ("ops", [*PUSH_SUM, "algorithm.name=clipped-push-sum"]),
    "fedavg mean": ("fedavg mean", [*STAR, "algorithm.name=fedavg"]),
    **{
        f"fedavg {agg}": (
            "fedavg mean",
            [*STAR, "algorithm.name=fedavg", f"algorithm.aggregator={agg}", "algorithm.f=1", *more],
        )
        for agg, more in (
            ("krum", []),
            ("trimmed-mean", []),
            ("median", []),
            ("geomed", []),
            ("centered-clipping", ["algorithm.tau=1.0"]),
        )
    },
}


def build(overrides: list[str], peers: int) -> VectorizedNetwork:
    config = load_config(
        None,
        [
            *overrides,
            f"topology.nodes={peers}",
            "data.dataset=mnist1d",
            "data.partition=iid",
            "run.eval_every=1000000",
            "run.rounds=1000000",
        ],
    )
    data = mnist1d(seed=config.run.seed, num_samples=max(10_000, 6 * peers))
    return VectorizedNetwork(prepare_run(config, dataset=data), device=torch.device("cpu"))


def time_rounds(net: VectorizedNetwork, rounds: int) -> float:
    """Seconds a round, over ``rounds`` rounds."""
    began = time.perf_counter()
    for _ in range(rounds):
        net.run_round()
    return (time.perf_counter() - began) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/defences.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wanted = list(dict.fromkeys(c for name in args.cases for c in (CASES[name][0], name)))
    nets = {name: build(CASES[name][1], args.peers) for name in wanted}
    for net in nets.values():
        net.run_round()  # untimed: first-round allocations
    times: dict[str, list[float]] = {name: [] for name in wanted}
    for _ in range(args.repeats):
        for name, net in nets.items():
            times[name].append(time_rounds(net, args.rounds))
    rows: list[dict[str, Any]] = []
    print(
        f"{args.peers} peers, {args.rounds} rounds x {args.repeats} repeats, "
        f"{args.threads} thread(s)"
    )
    print("| case | baseline | s / round (median) | ratio to baseline |")
    print("|---|---|---:|---:|")
    for name in wanted:
        base = CASES[name][0]
        median = statistics.median(times[name])
        ratio = median / statistics.median(times[base])
        rows.append({"case": name, "baseline": base, "seconds": times[name], "ratio": ratio})
        print(f"| {name} | {base} | {median:.4f} | {ratio:.2f}x |")
    report = {
        "machine": _common.machine_info(threads=args.threads),
        "peers": args.peers,
        "rounds": args.rounds,
        "rows": rows,
    }
    _common.write_report(args.out, report)


if __name__ == "__main__":
    main()
