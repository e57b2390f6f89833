"""A population on the cohort engine: FedAvg over 1,000,000 clients, 100 a round, against
a run of 100 clients (every one sampled each round), measured in the same run.

    python benchmarks/population.py [--populations 100 1000000] [--cohort 100]
        [--rounds 200] [--threads 1] [--out benchmarks/results/population.json]

The workload is ``examples/population.toml``: an MLP (hidden 64) on MNIST-1D, each client
16 examples of one seeded permutation (``data.partition = "slices"``), 5 local steps of
batch 16, the sample drawn by Floyd's algorithm (``algorithm.sampler = "floyd"``). Each
population runs in a fresh process (so its peak resident memory is its own): the cohort
engine's set-up (data, model, no client) is timed apart from the rounds; the rounds run
without writing records (the same ``run_round`` loop ``fedcore simulate`` drives), then the
global model is evaluated once (after one untimed run that leaves the dataset in its
cache). The 100-client run is also run on the vectorized engine
(every client a row of its stack) as a reference. Ratios: peak RSS over the 100-client
cohort run's, and that run's rounds/s over each row's. The issue's target: memory within
2x and rounds/s within 2x of the 100-client run's.
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


def _settings(population: int, cohort: int, rounds: int) -> list[str]:
    return [
        f"topology.nodes={population}",
        f"algorithm.fraction={cohort / population}",
        f"run.rounds={rounds}",
        f"run.eval_every={rounds}",
    ]


def _peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _case(engine: str, population: int, cohort: int, rounds: int, threads: int) -> dict[str, Any]:
    """One run in this process (a child of :func:`main`): its figures."""
    import torch

    from fedcore.config import load_config

    torch.set_num_threads(threads)
    settings = _settings(population, cohort, rounds)
    config = load_config(REPO / "examples" / "population.toml", settings)
    began = time.perf_counter()
    if engine == "cohort":
        from fedcore.engines.cohort import CohortNetwork

        net: Any = CohortNetwork(config, device=torch.device("cpu"))
    else:
        from fedcore.engines.vectorized import VectorizedNetwork
        from fedcore.setup.prepare import prepare_run

        vconfig = load_config(
            REPO / "examples" / "population.toml", [*settings, "simulate.engine=vectorized"]
        )
        net = VectorizedNetwork(prepare_run(vconfig), device=torch.device("cpu"))
    setup_s = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(rounds):
        net.run_round()
    rounds_s = time.perf_counter() - began
    if engine == "cohort":
        accuracy = net.evaluate()[1]
        held = len(net.store)
        model = net.model()
    else:
        server = net.nodes.index(config.topology.server)
        model = net.model()[server]
        accuracy = net.setup.evaluator.evaluate(
            model.cpu(), net.setup.dataset.x_test, net.setup.dataset.y_test
        )[1]
        held = population
    from fedcore.metrics import params_sha256

    return {
        "engine": engine,
        "population": population,
        "cohort": cohort,
        "rounds": rounds,
        "setup_s": setup_s,
        "rounds_s": rounds_s,
        "rounds_per_s": rounds / rounds_s,
        "peak_rss_mib": _peak_rss_mib(),
        "clients_held": held,
        "accuracy": accuracy,
        "global_sha256": params_sha256(model.cpu()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", type=int, nargs="+", default=[100, 1_000_000])
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/population.json")
    parser.add_argument("--case", nargs=2, metavar=("ENGINE", "POPULATION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:  # a child: one run, its figures as JSON on stdout
        engine, population = args.case[0], int(args.case[1])
        print(json.dumps(_case(engine, population, args.cohort, args.rounds, args.threads)))
        return
    from benchmarks._common import machine_info, write_report

    cases = [("cohort", n) for n in args.populations]
    cases.insert(1, ("vectorized", min(args.populations)))
    # One untimed run first: a dataset generated and cached on first use (MNIST-1D) would
    # otherwise count in the first row's set-up and peak memory.
    warm = [sys.executable, __file__, "--case", "cohort", str(min(args.populations))]
    subprocess.run(
        [*warm, "--cohort", str(args.cohort), "--rounds", "1"], check=True, capture_output=True
    )
    rows = []
    for engine, population in cases:
        command = [sys.executable, __file__, "--case", engine, str(population)]
        command += ["--cohort", str(args.cohort), "--rounds", str(args.rounds)]
        command += ["--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = rows[0]
    for row in rows:
        row["memory_ratio"] = row["peak_rss_mib"] / base["peak_rss_mib"]
        row["speed_ratio"] = base["rounds_per_s"] / row["rounds_per_s"]
    print(
        "| engine | clients | a round | set-up s | rounds/s | peak RSS MiB | clients held "
        "| memory / 100-client | 100-client rounds/s / this |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['population']:,} | {r['cohort']} | {r['setup_s']:.2f} "
            f"| {r['rounds_per_s']:.1f} | {r['peak_rss_mib']:.0f} | {r['clients_held']:,} "
            f"| {r['memory_ratio']:.2f}x | {r['speed_ratio']:.2f}x |"
        )
    report = {
        "machine": machine_info(threads=args.threads),
        "rounds": args.rounds,
        "cohort": args.cohort,
        "rows": rows,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
