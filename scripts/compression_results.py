"""Learning per byte: fp32 D-PSGD, DeepSqueeze, CHOCO and naive compression, side by side.

Runs every (dataset, topology, method) of the grid as a seed sweep
(``fedcore.simulation.sweep``, as ``fedcore simulate --seeds`` does: one sweep folder per
method under ``docs/results/runs/<dataset>-<topology>/``) and writes
``docs/results/compression-<dataset>-<topology>.{md,json,png}``: final accuracy of the
average model and mean per node, bytes per node to reach 90% of the fp32 run's final
average-model accuracy, and accuracy against bytes sent.

Usage::

    python scripts/compression_results.py --dataset digits --topology torus ring
    python scripts/compression_results.py --dataset mnist1d --rounds 600

Sign and QSGD keep one scale (norm) per ``--chunk`` values. QSGD runs scaled (contractive,
``compression.scaled``): plain QSGD at 2 and 4 bits diverges under both error-feedback
methods. Means over ``--seeds``; the plot shows the first seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _results import finals, first_reaching, mean, plot_curves, run_grid

from fedcore.metrics import to_json_text

ROOT = Path(__file__).resolve().parents[1]

SIGN = ["compression.codec=sign"]  # sign and qsgd: compression.chunk from --chunk
QSGD2 = ["compression.codec=qsgd", "compression.bits=2", "compression.scaled=true"]
QSGD4 = ["compression.codec=qsgd", "compression.bits=4", "compression.scaled=true"]
TOP1 = ["compression.codec=topk", "compression.ratio=0.01"]
METHODS: dict[str, list[str]] = {
    "D-PSGD fp32": ["algorithm.name=dpsgd", "compression.codec=fp32"],
    "DeepSqueeze sign": ["algorithm.name=deepsqueeze", *SIGN],
    "DeepSqueeze QSGD-2 (scaled)": ["algorithm.name=deepsqueeze", *QSGD2],
    "DeepSqueeze QSGD-4 (scaled)": ["algorithm.name=deepsqueeze", *QSGD4],
    "DeepSqueeze top-1%": ["algorithm.name=deepsqueeze", *TOP1],
    "CHOCO sign": ["algorithm.name=choco", *SIGN],
    "CHOCO QSGD-2 (scaled)": ["algorithm.name=choco", *QSGD2],
    "CHOCO QSGD-4 (scaled)": ["algorithm.name=choco", *QSGD4],
    "CHOCO top-1%": ["algorithm.name=choco", *TOP1],
    "naive D-PSGD sign": ["algorithm.name=dpsgd", *SIGN],
}


def config_overrides(dataset: str, topology: str, label: str, args: Any) -> list[str]:
    """The ``--set`` overrides of one run of the grid (the seed comes separately)."""
    overrides = METHODS[label]
    extra = [f"algorithm.eta={args.eta}"] if "deepsqueeze" in overrides[0] else []
    extra += [f"algorithm.gamma={args.gamma}"] if "choco" in overrides[0] else []
    chunked = "qsgd" in str(overrides) or SIGN[0] in overrides
    extra += [f"compression.chunk={args.chunk}"] if chunked else []
    return [
        f"data.dataset={dataset}",
        "data.partition=dirichlet",
        f"data.alpha={args.alpha}",
        f"model.name={args.model}",
        f"model.hidden={args.hidden}",
        f"topology.kind={topology}",
        "topology.nodes=16",
        f"run.rounds={args.rounds}",
        f"run.eval_every={max(1, args.rounds // 20)}",
        f"algorithm.lr={args.lr}",
        *overrides,
        *extra,
    ]


def report(
    dataset: str, topology: str, runs: list[dict[str, Any]], args: argparse.Namespace
) -> tuple[str, list[dict[str, Any]]]:
    """A markdown table (means over seeds) and its rows."""
    base_avg = mean(finals(runs, "D-PSGD fp32", "avg_model_accuracy"))
    base_node = mean(finals(runs, "D-PSGD fp32", "mean_node_accuracy"))
    target = 0.9 * base_avg
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"### {dataset}, {args.model} (hidden {args.hidden}), 16-node {topology}, "
        f"Dirichlet {args.alpha}, {args.rounds} rounds, lr {args.lr}, eta {args.eta}, "
        f"gamma {args.gamma}, chunk {args.chunk}, seeds {seeds}",
        "",
        "| method | avg-model acc | mean node acc | Δ avg vs fp32 | Δ node vs fp32 "
        "| bytes/node/round | x fewer bytes | MB/node to 90% of fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for label in METHODS:
        mine = [r for r in runs if r["method"] == label]
        if not mine:
            continue
        failed = [r for r in mine if "failed" in r]
        if failed:
            lines.append(
                f"| {label} | diverged in {len(failed)} of {len(mine)} seeds: "
                f"{failed[0]['failed'][:70]}... | | | | | | |"
            )
            rows.append({"method": label, "failed": [r["failed"] for r in failed]})
            continue
        avg = finals(runs, label, "avg_model_accuracy")
        node = finals(runs, label, "mean_node_accuracy")
        traffic = mine[0]["summary"]["traffic"]
        hits = [first_reaching(r["evals"], target) for r in mine]
        reach = [None if h is None else h["bytes_sent_per_node"] for h in hits]
        reached = [b for b in reach if b is not None]
        reach_text = (
            "never"
            if not reached
            else f"{mean(reached) / 1e6:.3f}"
            + ("" if len(reached) == len(reach) else f" ({len(reached)}/{len(reach)} seeds)")
        )
        row = {
            "method": label,
            "avg_model_accuracy": mean(avg),
            "mean_node_accuracy": mean(node),
            "avg_model_accuracy_per_seed": avg,
            "mean_node_accuracy_per_seed": node,
            "delta_avg_points": 100 * (mean(avg) - base_avg),
            "delta_node_points": 100 * (mean(node) - base_node),
            "bytes_per_node_per_round": traffic["bytes_per_node_per_round"],
            "compression_ratio_vs_fp32": traffic["compression_ratio_vs_fp32"],
            "bytes_per_node_to_90pct": reach,
        }
        rows.append(row)
        lines.append(
            f"| {label} | {row['avg_model_accuracy']:.4f} | {row['mean_node_accuracy']:.4f} | "
            f"{row['delta_avg_points']:+.2f} | {row['delta_node_points']:+.2f} | "
            f"{row['bytes_per_node_per_round']:.0f} | {row['compression_ratio_vs_fp32']:.1f} | "
            f"{reach_text} |"
        )
    return "\n".join(lines) + "\n", rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", nargs="+", default=["digits"])
    parser.add_argument("--topology", nargs="+", default=["torus", "ring"])
    parser.add_argument("--methods", nargs="*", default=[], help="subset of method labels")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--eta", type=float, default=0.2, help="DeepSqueeze consensus step")
    parser.add_argument("--gamma", type=float, default=0.8, help="CHOCO consensus step")
    parser.add_argument(
        "--chunk", type=int, default=256, help="values per sign scale and per qsgd norm"
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {list(METHODS)}")
    labels = [m for m in METHODS if not args.methods or m in args.methods or m == "D-PSGD fp32"]
    args.out.mkdir(parents=True, exist_ok=True)
    for dataset in args.dataset:
        for topology in args.topology:
            cases = {label: config_overrides(dataset, topology, label, args) for label in labels}
            runs = run_grid(
                cases, args.seeds, args.out / "runs" / f"{dataset}-{topology}", args.jobs
            )
            stem = args.out / f"compression-{dataset}-{topology}"
            table, rows = report(dataset, topology, runs, args)
            stem.with_suffix(".md").write_text(table, encoding="utf-8")
            plot_curves(
                runs,
                stem.with_suffix(".png"),
                x=lambda e: e["bytes_sent_per_node"] / 1e6,
                xlabel="MB sent per node (log)",
                panels=[("avg_model_accuracy", "average-model test accuracy", False)],
                title=f"{dataset}, 16-node {topology}",
                logx=True,
            )
            stem.with_suffix(".json").write_text(to_json_text(rows, indent=1), encoding="utf-8")
            print(table, flush=True)
            print(f"wrote {stem}.md/.png/.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
