"""Learning over unreliable networks: RPS under message loss, and OPS vs robust OPS.

Two grids, each run as seed sweeps (``fedcore.simulation.sweep``, as ``fedcore simulate
--seeds`` does: one sweep folder per case under ``docs/results/runs/{rps,ops}/``; the same
fault plans run over gRPC with ``fedcore launch``), written to ``docs/results/``:

* ``faults-rps.{md,json,png}``: RPS on digits with the MLP, 16 workers on the complete
  graph, drop rate p in {0, 0.05, 0.1, 0.2, 0.3}: final accuracy and rounds to 90% of the
  p = 0 accuracy.
* ``faults-ops.{md,json,png}``: OPS, robust OPS (running sums) and both with the step
  scaled by omega, on the directed social-16 graph with the default model (logistic
  regression), p in {0, 0.1, 0.3}: accuracy and consensus distance over rounds.

Means over ``--seeds``; plots show the first seed.

Usage::

    python scripts/faults_results.py [--grids rps ops] [--seeds 0 1 2] [--rounds 300]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _results import finals, first_reaching, mean, plot_curves, run_grid

from fedcore.metrics import to_json_text

ROOT = Path(__file__).resolve().parents[1]

COMMON = ["data.dataset=digits", "data.partition=dirichlet", "data.alpha=0.3", "topology.nodes=16"]
MLP = ["model.name=mlp", "model.hidden=64"]  # RPS; OPS runs the default model (logreg)
RPS_DROPS = (0.0, 0.05, 0.1, 0.2, 0.3)
OPS_DROPS = (0.0, 0.1, 0.3)
OPS_VARIANTS = {
    "OPS": [],
    "robust OPS": ["algorithm.robust=true"],
    "OPS, step x omega": ["algorithm.step_scale=omega"],
    "robust OPS, step x omega": ["algorithm.robust=true", "algorithm.step_scale=omega"],
}


def rps_cases(args: argparse.Namespace) -> dict[str, list[str]]:
    return {
        f"RPS p={p}": [
            *COMMON,
            *MLP,
            "algorithm.name=rps",
            f"algorithm.lr={args.rps_lr}",
            "topology.kind=complete",
            f"run.rounds={args.rounds}",
            "run.eval_every=10",
            f"faults.drop={p}",
        ]
        for p in RPS_DROPS
    }


def ops_cases(args: argparse.Namespace) -> dict[str, list[str]]:
    return {
        f"{name}, p={p}": [
            *COMMON,
            "algorithm.name=ops",
            f"algorithm.lr={args.ops_lr}",
            "topology.kind=social",
            f"run.rounds={args.rounds}",
            "run.eval_every=10",
            f"faults.drop={p}",
            *extra,
        ]
        for name, extra in OPS_VARIANTS.items()
        for p in OPS_DROPS
    }


def _fmt(values: list[float]) -> str:
    if not values:
        return "diverged"
    spread = f" ({min(values):.4f}-{max(values):.4f})" if len(values) > 1 else ""
    return f"{mean(values):.4f}{spread}"


def report(title: str, runs: list[dict[str, Any]], baseline: dict[str, str]) -> tuple[str, list]:
    """Table of final accuracies (mean, min-max over seeds), rounds to 90% of the baseline."""
    labels = list(dict.fromkeys(r["method"] for r in runs))
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"### {title}, seeds {seeds}",
        "",
        "| method | avg-model acc | mean node acc | Δ avg vs p=0 | Δ node vs p=0 "
        "| consensus distance | rounds to 90% of p=0 | messages lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for label in labels:
        mine = [r for r in runs if r["method"] == label and "summary" in r]
        base = baseline[label]
        base_avg = mean(finals(runs, base, "avg_model_accuracy") or [float("nan")])
        base_node = mean(finals(runs, base, "mean_node_accuracy") or [float("nan")])
        avg = finals(runs, label, "avg_model_accuracy")
        node = finals(runs, label, "mean_node_accuracy")
        failed = sum(1 for r in runs if r["method"] == label and "failed" in r)
        hits = [first_reaching(r["evals"], 0.9 * base_avg) for r in mine]
        reach = [h["round"] + 1 if h else None for h in hits]  # rounds done
        got = [x for x in reach if x is not None]
        reach_text = "never" if not got else f"{mean(got):.0f}"
        if got and len(got) < len(reach):
            reach_text += f" ({len(got)}/{len(reach)} seeds)"
        consensus = [r["summary"]["final"]["consensus_distance"] for r in mine]
        lost = [r["summary"]["traffic"]["messages_dropped"] for r in mine]
        row = {
            "method": label,
            "avg_model_accuracy": avg,
            "mean_node_accuracy": node,
            "failed_seeds": failed,
            "consensus_distance": consensus,
            "rounds_to_90pct_of_p0": reach,
            "messages_lost": lost,
        }
        rows.append(row)
        delta_avg = f"{100 * (mean(avg) - base_avg):+.2f}" if avg else ""
        delta_node = f"{100 * (mean(node) - base_node):+.2f}" if node else ""
        lines.append(
            f"| {label}{f' ({failed} seeds diverged)' if failed else ''} | {_fmt(avg)} | "
            f"{_fmt(node)} | {delta_avg} | {delta_node} | "
            f"{f'{mean(consensus):.3g}' if consensus else ''} | {reach_text} | "
            f"{f'{mean(lost):.0f}' if lost else ''} |"
        )
    return "\n".join(lines) + "\n", rows


def write(stem: Path, table: str, rows: list, runs: list[dict[str, Any]], title: str) -> None:
    stem.with_suffix(".md").write_text(table, encoding="utf-8")
    stem.with_suffix(".json").write_text(to_json_text(rows, indent=1), encoding="utf-8")
    plot_curves(
        runs,
        stem.with_suffix(".png"),
        x=lambda e: e["round"] + 1,
        xlabel="round",
        panels=[
            ("avg_model_accuracy", "average-model test accuracy", False),
            ("mean_node_accuracy", "mean node test accuracy", False),
            ("consensus_distance", "consensus distance (log)", True),
        ],
        title=title,
    )
    print(table, flush=True)
    print(f"wrote {stem}.md/.png/.json", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grids", nargs="+", choices=("rps", "ops"), default=["rps", "ops"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--rps-lr", type=float, default=0.3)
    parser.add_argument("--ops-lr", type=float, default=0.5)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if "rps" in args.grids:
        runs = run_grid(rps_cases(args), args.seeds, args.out / "runs" / "rps", args.jobs)
        title = (
            f"RPS, digits MLP, 16 workers (complete graph), Dirichlet 0.3, {args.rounds} "
            f"rounds, lr {args.rps_lr}"
        )
        table, rows = report(title, runs, {f"RPS p={p}": "RPS p=0.0" for p in RPS_DROPS})
        write(args.out / "faults-rps", table, rows, runs, title)
    if "ops" in args.grids:
        runs = run_grid(ops_cases(args), args.seeds, args.out / "runs" / "ops", args.jobs)
        title = (
            f"OPS under drops, digits logreg, directed social-16, Dirichlet 0.3, {args.rounds} "
            f"rounds, lr {args.ops_lr}"
        )
        baseline = {f"{n}, p={p}": f"{n}, p=0.0" for n in OPS_VARIANTS for p in OPS_DROPS}
        table, rows = report(title, runs, baseline)
        write(args.out / "faults-ops", table, rows, runs, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
