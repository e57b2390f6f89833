# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""The event engine's speed: events/s of each asynchronous algorithm at 1,000 and 10,000 peers.

Each case builds an :class:`~fedcore.engines.events.EventNetwork` in this process
(logistic regression on a generated 10-class problem of 4 examples a peer, lognormal
compute times with 10% of the peers 10x slower, 10 ms links), runs ``--rounds`` rounds (a
round: one computation a worker on average) and reports events (ended computations) per
second, the events a tick handles together on average (the batching), and the set-up's
seconds. The reference measured in the same run: the vectorized engine's rounds of the
synchronous counterpart (D-PSGD, OPS, FedAvg) on the same data, in node-rounds/s (one
node-round: one gradient step of one peer, as one event is).

Usage::

    python benchmarks/events.py [--peers 1000 10000] [--rounds 5]
        [--out benchmarks/results/events.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("fedcore") is None:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import torch

from fedcore.config import load_config
from fedcore.data import Dataset
from fedcore.engines.events import EventNetwork
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.setup.prepare import prepare_run

CASES = {
    "adpsgd": ("dpsgd", ["topology.kind=random-regular", "topology.degree=4"]),
    "async-push-sum": ("ops", ["topology.kind=exponential"]),
    "fedbuff": ("fedavg", ["topology.kind=star"]),
    "fedasync": ("fedavg", ["topology.kind=star"]),
}
"""Asynchronous algorithm -> (synchronous counterpart, graph)."""

TIME = [
    "time.step_s=0.1",
    "time.compute='lognormal'",
    "time.sigma=0.5",
    "time.slow_fraction=0.1",
    "time.latency_s=0.01",
]


def blobs(*, seed: int, test_fraction: float = 0.0) -> Dataset:
    """10 Gaussian classes in 16 dimensions, 4 training examples a peer of the largest run
    (a fixed test split of 2,000: ``test_fraction`` is not used)."""
    g = torch.Generator().manual_seed(seed)
    n, d = 4 * 10_001 + 2_000, 16
    y = torch.randint(0, 10, (n,), generator=g)
    centers = torch.randn(10, d, generator=g) * 2
    x = centers[y] + torch.randn(n, d, generator=g)
    return Dataset(
        name="blobs",
        x_train=x[2_000:],
        y_train=y[2_000:],
        x_test=x[:2_000],
        y_test=y[:2_000],
        num_classes=10,
    )


def overrides(algorithm: str, graph: list[str], peers: int, rounds: int) -> list[str]:
    return [
        f"algorithm.name={algorithm}",
        *graph,
        f"topology.nodes={peers}",
        "data.dataset=events:blobs",
        "data.batch_size=4",
        "data.partition=iid",
        "model.name=logreg",
        f"run.rounds={rounds}",
        *TIME,
    ]


def measure(algorithm: str, peers: int, rounds: int) -> dict[str, Any]:
    sync, graph = CASES[algorithm]
    began = time.perf_counter()
    net = EventNetwork(prepare_run(load_config(None, overrides(algorithm, graph, peers, rounds))))
    setup_s = time.perf_counter() - began
    began = time.perf_counter()
    events = ticks = 0
    for _ in range(rounds):
        before = net.ticks
        events += net.run_round().events
        ticks += net.ticks - before
    seconds = time.perf_counter() - began
    ref = prepare_run(load_config(None, overrides(sync, graph, peers, rounds)))
    vec = VectorizedNetwork(ref, device=torch.device("cpu"))
    began = time.perf_counter()
    for _ in range(rounds):
        vec.run_round()
    ref_seconds = time.perf_counter() - began
    node_rounds = rounds * (peers - (1 if sync == "fedavg" else 0))
    return {
        "algorithm": algorithm,
        "peers": peers,
        "events": events,
        "events_per_s": events / seconds,
        "events_per_tick": events / max(ticks, 1),
        "setup_s": setup_s,
        "reference": sync,
        "reference_node_rounds_per_s": node_rounds / ref_seconds,
        "ratio": (events / seconds) / (node_rounds / ref_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", nargs="+", type=int, default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--algorithms", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "events.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(
        "| algorithm | peers | events/s | events a tick | set-up (s) | reference | "
        "its node-rounds/s | events/s / reference |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for peers in args.peers:
        for algorithm in args.algorithms:
            row = measure(algorithm, peers, args.rounds)
            rows.append(row)
            print(
                f"| {algorithm} | {peers:,} | {row['events_per_s']:,.0f} | "
                f"{row['events_per_tick']:.1f} | {row['setup_s']:.1f} | {row['reference']} | "
                f"{row['reference_node_rounds_per_s']:,.0f} | {row['ratio']:.2f} |",
                flush=True,
            )
    _common.write_report(
        Path(args.out), {"rows": rows, "rounds": args.rounds, "machine": _common.machine_info()}
    )


if __name__ == "__main__":
    main()
