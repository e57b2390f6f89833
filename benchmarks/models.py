# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""The models the field publishes on, on both engines: node-rounds per second, peak memory
per peer and the gradient mode each run chose.

    python benchmarks/models.py [--cases resnet20:16 femnist-cnn:100 char-lstm:100]
        [--rounds 1] [--threads 1] [--engines vectorized messages]
        [--out benchmarks/results/models.json]

A case is ``model:peers``. Each runs D-PSGD on a ring of that many peers, on random data
shaped like the model's target (3x32x32 images of 10 classes for ``resnet20`` and ``cnn32``,
1x28x28 images of 62 classes for ``femnist-cnn``, sequences of 80 int64 character indices of
80 classes for ``char-lstm``), split iid with two batches a peer; the batch size is 32 for
the 32x32 models and LEAF's 10 for ``femnist-cnn`` and ``char-lstm`` (``--batch`` sets one
for all). Every (case, engine) runs in a fresh process, so its peak memory is its own:
``VectorizedNetwork(setup).run_round()`` or ``build_network(config, setup=setup).run(R)``
(the code ``fedcore simulate`` runs, with no observer: nothing evaluated or written), with
``--rounds`` rounds timed from the first (a round takes seconds: its allocations are
noise). Peak memory per peer is the process's peak resident memory less what it held before
the set-up (torch and the data), over the peers. A case the vectorized engine refuses (its
stacked state would not fit this machine's memory) shows its one-line reason, and a message
engine case whose models (:data:`_COPIES` copies a peer) would take more than the memory
available now is skipped and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.config import load_config
from fedcore.data import Dataset
from fedcore.errors import FedcoreError

SHAPES: dict[str, tuple[tuple[int, ...], int, bool, int]] = {
    # model: (example shape, classes, int64 characters, batch)
    "resnet20": ((3, 32, 32), 10, False, 32),
    "cnn32": ((3, 32, 32), 10, False, 32),
    "femnist-cnn": ((1, 28, 28), 62, False, 10),
    "char-lstm": ((80,), 80, True, 10),
}


def dataset(model: str, peers: int, batch: int) -> Dataset:
    """Random data shaped like ``model``'s target: two batches a peer, 64 test examples."""
    shape, classes, chars, _ = SHAPES[model]
    gen = torch.Generator().manual_seed(0)
    n = 2 * batch * peers + 64
    if chars:
        x = torch.randint(0, 80, (n, *shape), generator=gen)
    else:
        x = torch.randn(n, *shape, generator=gen)
    y = torch.randint(0, classes, (n,), generator=gen)
    return Dataset(
        name=f"random-{model}",
        x_train=x[64:],
        y_train=y[64:],
        x_test=x[:64],
        y_test=y[:64],
        num_classes=classes,
    )


_COPIES = 6
"""Copies of its model a peer of the message engine holds at its peak (its model, the
gradient step waiting for the mix, the model it sent, which its receivers decode as a view
of the same bytes, and the allocator's slack): ``femnist-cnn`` (26 MiB a copy) measured
105 MiB a peer at 100 peers, about 4 copies (10 before the i28-memory changes)."""


def _rss() -> int:
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm", encoding="utf-8") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _available() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    with open("/proc/meminfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def one(model: str, peers: int, engine: str, rounds: int, batch: int) -> dict[str, Any]:
    """One (case, engine), in this process; what it measured."""
    from fedcore.engines.messages import build_network
    from fedcore.engines.vectorized import VectorizedNetwork
    from fedcore.setup.prepare import prepare_run

    row: dict[str, Any] = {"model": model, "peers": peers, "engine": engine, "batch": batch}
    data = dataset(model, peers, batch)
    config = load_config(
        None,
        [
            f"model.name={model}",
            "algorithm.name=dpsgd",
            "algorithm.lr=0.05",
            "topology.kind=ring",
            f"topology.nodes={peers}",
            "data.partition=iid",
            f"data.batch_size={batch}",
            f"run.rounds={rounds}",
            "run.eval_every=1000000",
        ],
    )
    before = _rss()
    setup = prepare_run(config, dataset=data)
    row["parameters"] = int(setup.start.numel())
    row["gradients"] = setup.evaluator.rows.mode
    row["why"] = setup.evaluator.rows.why
    try:
        if engine == "vectorized":
            net = VectorizedNetwork(setup, device=torch.device("cpu"))
            began = time.perf_counter()
            for _ in range(rounds):
                net.run_round()
            net.check()
        else:
            need = _COPIES * peers * row["parameters"] * setup.start.element_size()
            if need > _available():
                row["skipped"] = (
                    f"the message engine's {peers} models need about {need / 2**30:.1f} GiB "
                    f"({_COPIES} copies a peer), {_available() / 2**30:.1f} GiB available"
                )
                return row
            network = build_network(config, setup=setup)
            began = time.perf_counter()
            network.run(rounds)
    except FedcoreError as exc:
        row["skipped"] = str(exc)
        return row
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row.update(
        seconds=seconds,
        rounds=rounds,
        node_rounds_per_s=peers * rounds / seconds,
        peak_mib_per_peer=(peak - before) / peers / 2**20,
    )
    return row


def main() -> None:
    """Run every case in fresh processes; print a markdown table; write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", nargs="+", default=["resnet20:16", "femnist-cnn:100", "char-lstm:100"]
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=0, help="0: each model's own")
    parser.add_argument("--engines", nargs="+", default=["vectorized", "messages"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/models.json"))
    parser.add_argument("--one", nargs=2, metavar=("CASE", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        model, peers = args.one[0].split(":")
        batch = args.batch or SHAPES[model][3]
        print(json.dumps(one(model, int(peers), args.one[1], args.rounds, batch)))
        return
    info = _common.machine_info(rounds=args.rounds, threads=args.threads)
    rows = []
    print(
        "| model | parameters | peers | batch | engine | gradients | node-rounds/s "
        "| peak MiB a peer |"
    )
    print("|---|---:|---:|---:|---|---|---:|---:|")
    for case in args.cases:
        for engine in args.engines:
            command = [sys.executable, __file__, "--one", case, engine]
            command += ["--rounds", str(args.rounds), "--threads", str(args.threads)]
            command += ["--batch", str(args.batch)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            lines = done.stdout.strip().splitlines()
            if done.returncode != 0 or not lines:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                if done.returncode < 0:  # a signal: SIGKILL is the kernel's out-of-memory killer
                    tail = f"killed by signal {-done.returncode} (9: out of memory)"
                row: dict[str, Any] = {"case": case, "engine": engine, "failed": tail}
                print(f"| {case} | | | | {engine} | | failed: {tail} | |", flush=True)
                rows.append(row)
                continue
            row = json.loads(lines[-1])
            rows.append(row)
            rate = (
                f"{row['node_rounds_per_s']:,.2f}"
                if "node_rounds_per_s" in row
                else f"- ({row['skipped']})"
            )
            peak = f"{row['peak_mib_per_peer']:,.1f}" if "peak_mib_per_peer" in row else "-"
            print(
                f"| {row['model']} | {row['parameters']:,} | {row['peers']:,} | {row['batch']} "
                f"| {engine} | {row['gradients']} | {rate} | {peak} |",
                flush=True,
            )
    info["loadavg_end"] = list(os.getloadavg())
    _common.write_report(args.out, {"machine": info, "rows": rows})


if __name__ == "__main__":
    main()
