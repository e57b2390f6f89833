"""One GPU against this machine's CPU cores, on the shapes the field runs at: node-rounds
per second of the same rounds on ``--device`` and on the CPU, measured in the same run.

    python benchmarks/gpu.py [--device cuda] [--cases dog-10k dog-100k population
        resnet20-16] [--rounds 20] [--cpu-rounds 5] [--out benchmarks/results/gpu.json]

Prepared for a machine with a GPU (the device is lent to some sessions only); ``--device
cpu --rounds 2 --cpu-rounds 1`` runs it here as a smoke check. Cases:

* ``dog-10k``: ``examples/dog-10k.toml`` (DOG, 10,000 peers of a random 15-regular
  graph, online logistic regression on the synthetic stream), the vectorized engine.
* ``dog-100k``: the same at 100,000 peers.
* ``population``: ``examples/population.toml`` (FedAvg over 1,000,000 clients, 100 a
  round, an MLP on MNIST-1D) on the cohort engine.
* ``resnet20-16``: D-PSGD on a ring of 16 peers of ResNet-20 (group norm), random
  3x32x32 images of 10 classes, batch 32 (``benchmarks/models.py``'s data).

Each (case, device) runs in a fresh process: its set-up (data, graph, the stacked state on
the device) is timed apart from its rounds; one untimed round first (CUDA's kernels load
and its allocator warms up), then ``--rounds`` rounds (``--cpu-rounds`` on the CPU, whose
rounds of the large cases take seconds), synchronized before the clock stops. The table
gives rounds/s, node-rounds/s, and the device's speed over the CPU's. Bits: a GPU's own
kernels (cuBLAS, atomics in index_add) do not promise the CPU's bits, so the digest of
each run is printed, not compared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CASES = ("dog-10k", "dog-100k", "population", "resnet20-16")


def _network(case: str, device: Any) -> tuple[Any, int]:
    """The case's network on ``device`` and its number of peers (clients: the cohort)."""
    from fedcore.config import load_config

    examples = REPO / "examples"
    if case in ("dog-10k", "dog-100k"):
        from fedcore.engines.vectorized import VectorizedNetwork
        from fedcore.setup.prepare import prepare_run

        nodes = 10_000 if case == "dog-10k" else 100_000
        config = load_config(examples / "dog-10k.toml", [f"topology.nodes={nodes}"])
        return VectorizedNetwork(prepare_run(config), device=device), nodes
    if case == "population":
        from fedcore.engines.cohort import CohortNetwork

        config = load_config(examples / "population.toml", [])
        net = CohortNetwork(config, device=device)
        return net, round(config.topology.nodes * config.algorithm.options["fraction"])
    if case == "resnet20-16":
        from benchmarks.models import dataset
        from fedcore.engines.vectorized import VectorizedNetwork
        from fedcore.setup.prepare import prepare_run

        settings = [
            "model.name=resnet20",
            "algorithm.name=dpsgd",
            "algorithm.lr=0.05",
            "topology.kind=ring",
            "topology.nodes=16",
            "data.partition=iid",
            "data.batch_size=32",
            "run.eval_every=1000000",
        ]
        setup = prepare_run(load_config(None, settings), dataset=dataset("resnet20", 16, 32))
        return VectorizedNetwork(setup, device=device), 16
    raise SystemExit(f"gpu.py: no case {case!r} (cases: {', '.join(CASES)})")


def _case(case: str, device_name: str, rounds: int) -> dict[str, Any]:
    """One (case, device) in this process (a child of :func:`main`): its figures."""
    import torch

    from fedcore.metrics import params_sha256

    device = torch.device(device_name)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    began = time.perf_counter()
    net, peers = _network(case, device)
    sync()
    setup_s = time.perf_counter() - began
    net.run_round()  # untimed: kernels load, the allocator warms up
    sync()
    began = time.perf_counter()
    for _ in range(rounds):
        net.run_round()
    sync()
    rounds_s = time.perf_counter() - began
    model = net.model()
    return {
        "case": case,
        "device": device_name,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "peers": peers,
        "rounds": rounds,
        "setup_s": setup_s,
        "rounds_per_s": rounds / rounds_s,
        "node_rounds_per_s": peers * rounds / rounds_s,
        "params_sha256": params_sha256(model.cpu()),
        "peak_gpu_mib": torch.cuda.max_memory_allocated(device) / 2**20
        if device.type == "cuda"
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--cpu-rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's own)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/gpu.json")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one (case, device): its figures as JSON on stdout
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        case, device = args.child
        rounds = args.cpu_rounds if device == "cpu" else args.rounds
        print(json.dumps(_case(case, device, rounds)))
        return
    from benchmarks._common import machine_info, write_report

    devices = [args.device] if args.device == "cpu" else [args.device, "cpu"]
    rows: list[dict[str, Any]] = []
    print(
        f"{'case':<12} {'device':<6} {'setup s':>8} {'rounds/s':>9} {'node-rounds/s':>14} "
        f"{'vs cpu':>7}",
        flush=True,
    )
    for case in args.cases:
        by_device: dict[str, dict[str, Any]] = {}
        for device in devices:
            command = [sys.executable, __file__, "--child", case, device]
            command += ["--rounds", str(args.rounds), "--cpu-rounds", str(args.cpu_rounds)]
            command += ["--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or ["no output"])[-1]
                row: dict[str, Any] = {"case": case, "device": device, "error": why}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            by_device[device] = row
            rows.append(row)
        cpu = by_device.get("cpu", {})
        for device, row in by_device.items():
            if "error" in row:
                print(f"{case:<12} {device:<6} error: {row['error']}", flush=True)
                continue
            ratio = ""
            if device != "cpu" and "node_rounds_per_s" in cpu:
                row["speedup_vs_cpu"] = row["node_rounds_per_s"] / cpu["node_rounds_per_s"]
                ratio = f"{row['speedup_vs_cpu']:.1f}x"
            print(
                f"{case:<12} {device:<6} {row['setup_s']:>8.1f} {row['rounds_per_s']:>9.2f} "
                f"{row['node_rounds_per_s']:>14,.0f} {ratio:>7}",
                flush=True,
            )
    write_report(args.out, {"machine": machine_info(device=args.device), "rows": rows})


if __name__ == "__main__":
    main()
