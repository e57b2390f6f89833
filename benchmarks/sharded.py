# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""``fedcore simulate --ranks R``: scaling efficiency of the sharded engine, by topology.

For each topology (a ring, a torus, the exponential graph and a random-regular graph of
degree 4, all undirected, ``--peers`` peers) and each rank count (``--ranks``, default 1
and 2), ``fedcore simulate --ranks R --threads 1`` runs as a child process (one thread a
rank): D-PSGD on logistic regression, ``--rounds`` rounds, one evaluation at the end, the
data an ``.npz`` of two generated examples a peer (a ``data.dataset = "folder:PATH"``
file written once, so that any peer count has data). Three figures, each labelled:

* **whole**: the wall seconds of the whole command (interpreters, every rank's set-up:
  data, graph, weights, partition, tables; the rounds; the results folder);
* **rounds**: rank 0's ``wall_seconds`` (the round loop, its one evaluation and the final
  gather), set-up excluded;
* **CPU**: the CPU seconds of the whole command, the launcher and every rank together
  (what a busy machine changes least: with perfect scaling R ranks take the CPU of one,
  and what each rank repeats, such as its interpreter and set-up, adds to it).

Node-rounds/s is ``peers x rounds`` over each; the scaling efficiency at R ranks is
node-rounds/s at R / (R x node-rounds/s at 1 rank), 1 for perfect scaling. The table also
gives rank 0's ``partition`` (``--partitions``, default ``auto``), ``cut_fraction`` and
``halo_bytes_per_round`` (the bytes that crossed ranks in a round), and whether every run of
a topology ended with the same parameters (``params_sha256``, or ``params_sha256_all``
above 100,000 peers).

Usage::

    python benchmarks/sharded.py [--peers 20000] [--rounds 20] [--ranks 1 2]
        [--topologies ring torus exponential random-regular] [--partitions auto]
        [--out benchmarks/results/sharded.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
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
import numpy as np

TOPOLOGIES: dict[str, list[str]] = {
    "ring": ["topology.kind=ring"],
    "torus": ["topology.kind=torus"],
    "exponential": ["topology.kind=exponential"],
    "random-regular": ["topology.kind=random-regular", "topology.degree=4"],
}
"""The graphs, each made undirected (``topology.undirected = true``) for D-PSGD."""

FEATURES = 10


def write_data(path: Path, peers: int) -> None:
    """Two examples a peer of a linearly separable two-class problem, and 100 to test (the
    one evaluation of every model stays small beside the rounds)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(FEATURES)

    def draw(m: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        x = rng.standard_normal((m, FEATURES)).astype(np.float32)
        return x, (x @ w > 0).astype(np.int64)

    x_train, y_train = draw(2 * peers)
    x_test, y_test = draw(100)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def workload(peers: int, rounds: int, data: Path) -> list[str]:
    """The ``--set`` settings of the measured run beside its graph's kind: D-PSGD on
    logistic regression over ``peers`` peers of an undirected graph, ``rounds`` rounds, one
    evaluation at the end, the data of :func:`write_data` at ``data``."""
    return [
        "topology.undirected=true",
        f"topology.nodes={peers}",
        "algorithm.name=dpsgd",
        "algorithm.lr=0.1",
        "model.name=logreg",
        f"data.dataset=folder:{data}",
        "data.partition=iid",
        "data.batch_size=2",
        "data.test_fraction=0.2",
        f"run.rounds={rounds}",
        f"run.eval_every={rounds}",
        "run.regret=false",
        "simulate.node_records=none",
    ]


def run_once(
    topology: str, ranks: int, partition: str, args: argparse.Namespace, data: Path, folder: Path
) -> dict[str, Any]:
    out = folder / f"{topology}-{ranks}-{partition}"
    shape = []
    if topology == "torus":  # the squarest rows x cols of the peers
        rows = max(r for r in range(1, int(args.peers**0.5) + 1) if args.peers % r == 0)
        shape = [f"topology.rows={rows}", f"topology.cols={args.peers // rows}"]
    settings = [
        *TOPOLOGIES[topology],
        *shape,
        *workload(args.peers, args.rounds, data),
        f"simulate.partition={partition}",
    ]
    command = [sys.executable, "-m", "fedcore", "simulate", "--ranks", str(ranks)]
    command += ["--threads", "1", "--quiet", "--force", "--out", str(out)]
    for setting in settings:
        command += ["--set", setting]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    whole = time.perf_counter() - began
    now = resource.getrusage(resource.RUSAGE_CHILDREN)  # the ranks, waited for by the launcher
    cpu = now.ru_utime - used.ru_utime + now.ru_stime - used.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"{topology} --ranks {ranks} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    node_rounds = args.peers * args.rounds
    return {
        "topology": topology,
        "ranks": ranks,
        "partition": summary["partition"],
        "asked": partition,
        "cut_fraction": summary["cut_fraction"],
        "halo_bytes_per_round": summary["halo_bytes_per_round"],
        "whole_s": whole,
        "cpu_s": cpu,
        "rounds_s": summary["wall_seconds"],
        "rate_whole": node_rounds / whole,
        "rate_rounds": node_rounds / summary["wall_seconds"],
        "sha": json.dumps(summary.get("params_sha256") or summary.get("params_sha256_all")),
        "loadavg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--topologies", nargs="+", choices=list(TOPOLOGIES), default=list(TOPOLOGIES)
    )
    parser.add_argument(
        "--partitions", nargs="+", choices=["auto", "blocks", "graph", "metis"], default=["auto"]
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sharded.json"))
    args = parser.parse_args()
    if args.peers < max(args.ranks) or args.rounds < 1 or min(args.ranks) < 1:
        parser.error("--peers must be at least the largest --ranks, --rounds and --ranks >= 1")
    load_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    print(
        f"{args.peers:,} peers, {args.rounds} rounds, one thread a rank. whole: the whole "
        "command; rounds: rank 0's round loop (set-up excluded)."
    )
    print(
        "| topology | R | partition | cut fraction | halo bytes / round | whole (s) | CPU (s) | "
        "rounds (s) | node-rounds/s, rounds | efficiency, whole | efficiency, rounds | "
        "same bits |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.npz"
        write_data(data, args.peers)
        for topology in args.topologies:
            base: dict[str, Any] | None = None
            shas: set[str] = set()
            for ranks in args.ranks:
                for partition in args.partitions if ranks > 1 else args.partitions[:1]:
                    row = run_once(topology, ranks, partition, args, data, Path(tmp))
                    base = row if base is None and ranks == 1 else base
                    shas.add(row["sha"])
                    if base is not None:
                        row["efficiency_whole"] = row["rate_whole"] / (ranks * base["rate_whole"])
                        row["efficiency_rounds"] = row["rate_rounds"] / (
                            ranks * base["rate_rounds"]
                        )
                    row["same_bits"] = len(shas) == 1
                    rows.append(row)
                    print(
                        f"| {topology} | {ranks} | {row['partition']} | "
                        f"{row['cut_fraction']:.4f} | {row['halo_bytes_per_round']:,} | "
                        f"{row['whole_s']:.2f} | {row['cpu_s']:.2f} | {row['rounds_s']:.2f} | "
                        f"{row['rate_rounds']:,.0f} | "
                        f"{row.get('efficiency_whole', float('nan')):.2f} | "
                        f"{row.get('efficiency_rounds', float('nan')):.2f} | "
                        f"{'yes' if row['same_bits'] else 'NO'} |",
                        flush=True,
                    )
    report = {
        "rows": rows,
        "peers": args.peers,
        "rounds": args.rounds,
        "machine": _common.machine_info(
            loadavg_start=load_start, loadavg_end=list(os.getloadavg())
        ),
    }
    _common.write_report(Path(args.out), report)


if __name__ == "__main__":
    main()
