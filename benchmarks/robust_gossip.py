# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""The robust gossip rules' round on the vectorized engine, as a ratio to D-PSGD's.

Each case is ``--peers`` N peers (default 1,000) on a random 8-regular graph (undirected,
Metropolis-Hastings weights), the MNIST-1D MLP split iid, one SGD step a round, nothing
lost: ``dpsgd`` (the undefended round), then ``clippedgossip`` with the adaptive and a
fixed radius, ``trimmed-gossip`` (trim 1, with and without buckets of 2) and
``median-gossip``. Each network is built once (not timed) and run one untimed round; then,
``--repeats`` times with the cases interleaved (their order rotating), ``--rounds`` rounds
are timed; the table gives each case's median seconds a round and its ratio to the median
of ``dpsgd``'s, measured in the same run. One torch thread by default (``--threads``), as
the simulator runs.

Usage::

    python benchmarks/robust_gossip.py [--peers 1000] [--degree 8] [--rounds 5]
        [--repeats 5] [--threads 1] [--out benchmarks/results/robust_gossip.json]
    python benchmarks/robust_gossip.py --tiny --out /tmp/robust.json   # a smoke test
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

# Runnable as `python benchmarks/robust_gossip.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.config import load_config
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.setup.prepare import prepare_run

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "robust_gossip.json"

CASES: list[tuple[str, list[str]]] = [
    ("dpsgd", ["algorithm.name=dpsgd"]),
    ("clippedgossip (adaptive)", ["algorithm.name=clippedgossip"]),
    ("clippedgossip (tau = 1)", ["algorithm.name=clippedgossip", "algorithm.tau=1.0"]),
    ("trimmed-gossip (trim 1)", ["algorithm.name=trimmed-gossip"]),
    ("trimmed-gossip (bucket 2)", ["algorithm.name=trimmed-gossip", "algorithm.bucket=2"]),
    ("median-gossip", ["algorithm.name=median-gossip"]),
]
"""(label, settings): the undefended round first, the reference of every ratio."""


def network(settings: list[str], peers: int, degree: int) -> VectorizedNetwork:
    """A built vectorized network of one case, one round run (untimed)."""
    config = load_config(
        None,
        [
            *settings,
            "topology.kind=random-regular",
            f"topology.degree={degree}",
            f"topology.nodes={peers}",
            "data.dataset=mnist1d",
            "data.partition=iid",
            "data.batch_size=8",
            "model.name=mlp",
            "run.eval_every=1000000",
        ],
    )
    net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    net.run_round()
    return net


def timed(net: VectorizedNetwork, rounds: int) -> float:
    """Seconds a round over the next ``rounds`` rounds."""
    began = time.perf_counter()
    for _ in range(rounds):
        net.run_round()
    return (time.perf_counter() - began) / rounds


def main() -> None:
    """Run the cases, print a markdown table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--degree", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="16 peers, 1 round, 1 repeat")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.tiny:
        args.peers, args.rounds, args.repeats = 16, 1, 1
    torch.set_num_threads(args.threads)
    nets = {label: network(settings, args.peers, args.degree) for label, settings in CASES}
    samples: dict[str, list[float]] = {label: [] for label in nets}
    labels = list(nets)
    for repeat in range(args.repeats):
        turn = repeat % len(labels)
        for label in labels[turn:] + labels[:turn]:
            samples[label].append(timed(nets[label], args.rounds))
    base = statistics.median(samples["dpsgd"])
    rows: list[dict[str, Any]] = []
    print(f"| rule | seconds a round ({args.peers:,} peers, degree {args.degree}) | x dpsgd |")
    print("|---|---:|---:|")
    for label in labels:
        median = statistics.median(samples[label])
        rows.append(
            {"rule": label, "seconds": median, "ratio": median / base, "samples": samples[label]}
        )
        print(f"| {label} | {median:.4f} | {median / base:.2f} |", flush=True)
    info = _common.machine_info(
        peers=args.peers, degree=args.degree, rounds=args.rounds, repeats=args.repeats
    )
    _common.write_report(args.out, {"machine": info, "rows": rows})


if __name__ == "__main__":
    main()
