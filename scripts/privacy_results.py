"""Differential privacy: accuracy against epsilon for DP-SGD and DP-FedAvg (issue 43's claim
(d): it rises with epsilon toward the non-private run's).

For each mechanism, one non-private run and one run per epsilon of ``--epsilons`` (at
delta 1e-5), each with ``privacy.noise`` set to the noise multiplier that spends exactly
that epsilon over the run (:func:`fedcore.privacy.noise_for`, with the RDP accountant the
runs report with), the rounds and everything else the same:

* ``dp-sgd``: D-PSGD on a torus of 16 peers, digits split iid, logistic regression, batches
  of 16 (each peer's sampling rate about 0.14), clip 1, ``--rounds`` (150) rounds;
* ``dp-fedavg``: FedAvg on a star of 100 workers, a fifth of them a round (q = 0.2), two
  local steps, logistic regression, clip 0.5 on each worker's update, ``--rounds`` (100).

Written to ``docs/results/privacy.{md,json}``: per case the target epsilon, the noise, the
epsilon the run's summary reports, and the average model's accuracy (means over
``--seeds``). The runs go through :func:`fedcore.simulation.sweep.run_cases`, as ``fedcore
simulate --seeds`` does (one sweep folder per case under ``docs/results/runs/privacy/``).

Usage::

    python scripts/privacy_results.py [--mechanisms dp-sgd dp-fedavg] [--seeds 0 1]
        [--epsilons 0.5 1 2 4 8] [--jobs 2] [--tiny] [--out docs/results]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _results import finals, mean, run_grid

from fedcore.config import load_config
from fedcore.metrics import to_json_text
from fedcore.privacy import noise_for
from fedcore.setup.prepare import prepare_run

ROOT = Path(__file__).resolve().parents[1]
DELTA = 1e-5

SETTINGS: dict[str, tuple[list[str], list[str], int]] = {
    # mechanism -> (the run's overrides, the private ones, default rounds)
    "dp-sgd": (
        [
            "data.dataset=digits",
            "data.partition=iid",
            "data.batch_size=16",
            "topology.kind=torus",
            "topology.nodes=16",
            "algorithm.name=dpsgd",
            "algorithm.lr=0.5",
            "model.name=logreg",
        ],
        ["privacy.mechanism=dp-sgd", "privacy.clip=1.0"],
        150,
    ),
    "dp-fedavg": (
        [
            "data.dataset=digits",
            "data.partition=iid",
            "topology.kind=star",
            "topology.nodes=100",
            "algorithm.name=fedavg",
            "algorithm.fraction=0.2",
            "algorithm.lr=0.5",
            "run.local_steps=2",
            "model.name=logreg",
        ],
        ["privacy.mechanism=dp-fedavg", "privacy.clip=0.5"],
        100,
    ),
}


def cases(
    mechanism: str, args: argparse.Namespace
) -> tuple[dict[str, list[str]], dict[str, float]]:
    """The grid of ``mechanism``: label -> overrides, and each private label's noise."""
    base, private, rounds = SETTINGS[mechanism]
    rounds = args.rounds or rounds
    if args.tiny:
        base = [o.replace("topology.nodes=100", "topology.nodes=20") for o in base]
    run = [*base, f"run.rounds={rounds}", f"run.eval_every={rounds}"]
    private = [*private, "privacy.accountant=rdp", f"privacy.delta={DELTA}"]
    setup = prepare_run(load_config(None, [*run, *private]))
    assert setup.privacy is not None
    rate = setup.privacy.worst[1]  # the most exposed peer's (DP-FedAvg: cohort / workers)
    steps = rounds * setup.privacy.steps_per_round
    grid: dict[str, list[str]] = {f"{mechanism}, non-private": run}
    noise: dict[str, float] = {}
    for eps in args.epsilons:
        label = f"{mechanism}, epsilon {eps:g}"
        noise[label] = noise_for(eps, rate, steps, DELTA, "rdp")
        grid[label] = [*run, *private, f"privacy.noise={noise[label]}"]
    return grid, noise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mechanisms", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[0.5, 1, 2, 4, 8])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--rounds", type=int, default=0, help="0: each mechanism's default")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="20 rounds, epsilons 1 and 8, seed 0")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    if args.tiny:
        args.rounds, args.epsilons, args.seeds = 20, [1.0, 8.0], [0]
    rows: list[dict[str, Any]] = []
    lines = [
        "| case | noise multiplier | epsilon (run's summary) | avg-model accuracy |",
        "|---|---:|---:|---:|",
    ]
    for mechanism in args.mechanisms:
        grid, noise = cases(mechanism, args)
        records = run_grid(grid, args.seeds, args.out / "runs" / "privacy" / mechanism, args.jobs)
        for label in grid:
            runs = [r for r in records if r["method"] == label and "summary" in r]
            accuracy = finals(records, label, "avg_model_accuracy")
            eps = [r["summary"]["privacy"]["epsilon"] for r in runs if "privacy" in r["summary"]]
            row = {
                "case": label,
                "noise": noise.get(label),
                "epsilon": mean(eps) if eps else None,
                "avg_model_accuracy": accuracy,
                "seeds": args.seeds,
            }
            rows.append(row)
            shown_noise = f"{row['noise']:.3f}" if row["noise"] is not None else "-"
            shown_eps = f"{row['epsilon']:.3f}" if row["epsilon"] is not None else "-"
            lines.append(f"| {label} | {shown_noise} | {shown_eps} | {mean(accuracy):.4f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "privacy.json").write_text(to_json_text(rows, indent=2) + "\n", encoding="utf-8")
    (args.out / "privacy.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
