"""The server family on both engines: node-rounds per second at 1,000 and 10,000 workers.

    python benchmarks/server_family.py [--workers 1000 10000] [--algorithms fedavg ...]
        [--rounds 5] [--messages-up-to 1000] [--threads 1]
        [--out benchmarks/results/server_family.json]

Each case is a star of N workers and a server, logreg on MNIST-1D split iid (generated with
6 examples a worker, at least 10,000). FedAvg runs as federated simulators run it: a fraction
0.1 of the workers sampled each round, 5 local steps; DoubleSqueeze and APMSqueeze (2 warm-up
rounds) take every worker every round, one step, with the 1-bit ``sign`` codec. Both engines
run the same config through the code ``fedcore simulate`` uses (no observer: nothing
evaluated or written); the builds are not timed. The message engine is the reference
measured in the same run: the table's ratio is vectorized over messages (node-rounds/s).
An algorithm that is not a rule yet (the vectorized engine cannot run it) shows "-". A case
runs each engine once for ``--rounds`` rounds after one untimed round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedcore.config import load_config
from fedcore.data import mnist1d
from fedcore.engines.messages import build_network
from fedcore.engines.vectorized import VectorizedNetwork, unsupported
from fedcore.setup.prepare import prepare_run

WORKLOAD = {
    # FedAvg as federated simulators run it: a tenth of the workers, 5 local steps each.
    "fedavg": ["algorithm.fraction=0.1", "run.local_steps=5"],
    # The squeeze family: every worker every round, one step (what they compress).
    "doublesqueeze": ["compression.codec=sign"],
    "apmsqueeze": ["compression.codec=sign", "algorithm.precondition_rounds=2"],
}


def _config(algorithm: str, workers: int) -> Any:
    return load_config(
        None,
        [
            f"algorithm.name={algorithm}",
            "topology.kind=star",
            f"topology.nodes={workers}",
            *WORKLOAD.get(algorithm, []),
            "data.dataset=mnist1d",
            "data.partition=iid",
            "run.eval_every=1000000",
        ],
    )


def _time(run: Any, rounds: int) -> float:
    run(1)  # untimed: first-round allocations
    began = time.perf_counter()
    run(1 + rounds)
    return time.perf_counter() - began


def case(algorithm: str, workers: int, rounds: int, messages: bool) -> dict[str, Any]:
    """Node-rounds/s of one algorithm at ``workers`` on both engines."""
    config = _config(algorithm, workers)
    data = mnist1d(seed=config.run.seed, num_samples=max(10_000, 6 * workers))
    row: dict[str, Any] = {"algorithm": algorithm, "workers": workers, "rounds": rounds}
    nodes = workers + 1
    setup = prepare_run(config, dataset=data)
    why = unsupported(setup)
    if why is None:
        net = VectorizedNetwork(setup, device=torch.device("cpu"))

        def vectorized(upto: int) -> None:
            while net.round < upto:
                net.run_round()

        row["vectorized_s"] = _time(vectorized, rounds)
        row["vectorized_node_rounds_per_s"] = nodes * rounds / row["vectorized_s"]
    else:
        row["vectorized_unsupported"] = why
    if messages:
        network = build_network(config, setup=prepare_run(config, dataset=data))
        row["messages_s"] = _time(network.run, rounds)
        row["messages_node_rounds_per_s"] = nodes * rounds / row["messages_s"]
    if "vectorized_s" in row and "messages_s" in row:
        row["ratio"] = row["messages_s"] / row["vectorized_s"]
    return row


def main() -> None:
    """Run the grid, print a markdown table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument(
        "--algorithms", nargs="+", default=["fedavg", "doublesqueeze", "apmsqueeze"]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages-up-to", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/server_family.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print("| algorithm | workers | vectorized node-rounds/s | messages node-rounds/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    for algorithm in args.algorithms:
        for workers in args.workers:
            row = case(algorithm, workers, args.rounds, workers <= args.messages_up_to)
            rows.append(row)

            def fmt(key: str, row: dict[str, Any] = row) -> str:
                return f"{row[key]:,.0f}" if key in row else "-"

            ratio = f"{row['ratio']:.1f}x" if "ratio" in row else "-"
            print(
                f"| {algorithm} | {workers:,} | {fmt('vectorized_node_rounds_per_s')} "
                f"| {fmt('messages_node_rounds_per_s')} | {ratio} |",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"threads": args.threads, "rows": rows}, indent=2) + "\n", encoding="utf-8"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
