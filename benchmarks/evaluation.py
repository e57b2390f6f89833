# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""One evaluation of every peer's model at scale: one process, a sample, and ranks.

The shape is ``examples/dog-1m.toml``'s: logistic regression on 10 features, 2 classes,
a test set of 4,000 examples, ``--peers`` peers (default 100,000 and 1,000,000). Three
ways, each the CPU and wall seconds of one evaluation alone (set-up excluded):

* **one process, all**: :func:`fedcore.engines.vectorized.evaluate_stacked` of every
  peer's model (one thread);
* **one process, sample**: the same with ``run.eval_peers = --sample`` (the average model
  and the consensus distance still every peer's);
* **R ranks** (``--ranks``, default 2; one thread a rank): each rank's
  :meth:`fedcore.engines.sharded.ShardedNetwork.evaluate` on its block of peers (a ring,
  contiguous blocks), started together after a barrier; the wall time is the slowest
  rank's, the CPU time the ranks' total. The data is an ``.npz`` of the same shape
  (sharded runs take no online stream).

The models are the start model plus seeded noise (one process) or the start model (ranks:
the cost of an evaluation does not depend on the values).

Usage::

    python benchmarks/evaluation.py [--peers 100000 1000000] [--sample 1000] [--ranks 2]
        [--out benchmarks/results/evaluation.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import multiprocessing
import os
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
import numpy as np
import torch

FEATURES = 10
TEST = 4000


def one_process(peers: int, sample: int) -> list[dict[str, Any]]:
    """Evaluate every peer once, then a sample of ``sample`` of them."""
    from fedcore.config import load_config
    from fedcore.engines.vectorized import VectorizedNetwork, evaluate_stacked
    from fedcore.setup.prepare import prepare_run

    torch.set_num_threads(1)
    config = load_config(ROOT / "examples" / "dog-1m.toml", [f"topology.nodes={peers}"])
    setup = prepare_run(config, hosts_all=True, simulated=True)
    net = VectorizedNetwork(setup, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    params = setup.start + 0.1 * torch.randn(peers, setup.start.numel(), generator=generator)
    rows = []
    for way, count in (("one process, all", "all"), (f"one process, {sample} sampled", sample)):
        run = dataclasses.replace(config.run, eval_peers=count)
        net.setup = dataclasses.replace(setup, config=dataclasses.replace(config, run=run))
        cpu, wall = time.process_time(), time.perf_counter()
        record = evaluate_stacked(net, params)
        rows.append(
            {
                "peers": peers,
                "way": way,
                "cpu_s": time.process_time() - cpu,
                "wall_s": time.perf_counter() - wall,
                "avg_model_accuracy": record["avg_model_accuracy"],
                "mean_node_accuracy": record["mean_node_accuracy"],
            }
        )
    return rows


def write_data(path: Path, peers: int) -> None:
    """Two training examples a peer, :data:`TEST` to test, :data:`FEATURES` features."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(FEATURES)
    x = rng.standard_normal((2 * peers + TEST, FEATURES)).astype(np.float32)
    y = (x @ w > 0).astype(np.int64)
    train, test = slice(0, 2 * peers), slice(2 * peers, None)
    np.savez(path, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])


def _rank(settings: list[str], rank: int, world: int, port: int, queue: Any) -> None:
    import torch.distributed as dist

    from fedcore.config import load_config
    from fedcore.engines.ranks import Ranks, join, leave
    from fedcore.engines.sharded import ShardedNetwork
    from fedcore.setup.prepare import prepare_run

    torch.set_num_threads(1)
    config = load_config(None, settings)
    setup = prepare_run(config, hosts_all=True, simulated=True)
    ranks = Ranks(rank, world, 0, "127.0.0.1", port)
    join(ranks, 600)
    try:
        net = ShardedNetwork(setup, ranks)
        dist.barrier()
        cpu, wall = time.process_time(), time.perf_counter()
        record = net.evaluate()
        queue.put((rank, time.process_time() - cpu, time.perf_counter() - wall, record))
    finally:
        leave()


def ranks_run(peers: int, world: int, folder: Path) -> dict[str, Any]:
    """One evaluation on ``world`` ranks (a ring on contiguous blocks)."""
    from fedcore.simulation.ranks import free_port

    data = folder / f"data-{peers}.npz"
    if not data.exists():
        write_data(data, peers)
    settings = [
        "topology.kind=ring",
        "topology.undirected=true",
        f"topology.nodes={peers}",
        "algorithm.name=dpsgd",
        "model.name=logreg",
        f"data.dataset=folder:{data}",
        "data.partition=iid",
        "data.batch_size=2",
        "data.test_fraction=0.2",
        "simulate.partition=blocks",
        "simulate.node_records=none",
        "transport.strict_timeout_s=600",
    ]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_rank, args=(settings, r, world, port, queue)) for r in range(world)
    ]
    for p in processes:
        p.start()
    got = [queue.get(timeout=1800) for _ in processes]
    for p in processes:
        p.join(timeout=60)
    record = next(r for _, _, _, r in got if r is not None)
    return {
        "peers": peers,
        "way": f"{world} ranks, all",
        "cpu_s": sum(c for _, c, _, _ in got),
        "wall_s": max(w for _, _, w, _ in got),
        "per_rank_cpu_s": [c for _, c, _, _ in sorted(got, key=lambda g: g[0])],
        "avg_model_accuracy": record["avg_model_accuracy"],
        "mean_node_accuracy": record["mean_node_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--sample", type=int, default=1000)
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "evaluation.json"))
    args = parser.parse_args()
    if min(args.peers) < max([args.sample, *args.ranks]):
        parser.error("--peers must be at least --sample and the largest --ranks")
    load_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    print("| peers | way | CPU (s) | wall (s) | CPU a rank (s) | load |")
    print("|---:|---|---:|---:|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for peers in args.peers:
            found = one_process(peers, args.sample)
            found += [ranks_run(peers, world, Path(tmp)) for world in args.ranks]
            for row in found:
                rows.append(row)
                row["loadavg"] = os.getloadavg()[0]
                each = ", ".join(f"{c:.2f}" for c in row.get("per_rank_cpu_s", []))
                print(
                    f"| {peers:,} | {row['way']} | {row['cpu_s']:.2f} | {row['wall_s']:.2f} | "
                    f"{each or '-'} | {row['loadavg']:.1f} |",
                    flush=True,
                )
    report = {
        "rows": rows,
        "machine": _common.machine_info(
            loadavg_start=load_start, loadavg_end=list(os.getloadavg())
        ),
    }
    _common.write_report(Path(args.out), report)


if __name__ == "__main__":
    main()
