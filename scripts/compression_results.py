"""Learning per byte: fp32 D-PSGD, DeepSqueeze, CHOCO and naive compression, side by side.

Runs every (dataset, topology, method) of the grid with ``fedcore.runners.simulate`` and
writes ``docs/results/compression-<dataset>-<topology>.{md,json,png}``: final accuracy of the
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
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from fedcore.config import load_config
from fedcore.errors import FedcoreError
from fedcore.runners.simulate import simulate

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


def config_overrides(dataset: str, topology: str, label: str, seed: int, args: Any) -> list[str]:
    """The ``--set`` overrides of one run of the grid."""
    overrides = METHODS[label]
    extra = [f"algorithm.eta={args.eta}"] if "deepsqueeze" in overrides[0] else []
    extra += [f"algorithm.gamma={args.gamma}"] if "choco" in overrides[0] else []
    extra += (
        [f"compression.chunk={args.chunk}"]
        if "qsgd" in str(overrides) or SIGN[0] in overrides
        else []
    )
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
        f"run.seed={seed}",
        f"algorithm.lr={args.lr}",
        *overrides,
        *extra,
    ]


def run_one(job: tuple[str, str, str, int, argparse.Namespace]) -> dict[str, Any]:
    """One simulate run; a diverged method is a finding, recorded as ``failed``."""
    dataset, topology, label, seed, args = job
    torch.set_num_threads(1)
    config = load_config(None, config_overrides(dataset, topology, label, seed, args))
    out = args.out / "runs" / f"{dataset}-{topology}-{label.replace(' ', '_')}-seed{seed}"
    try:
        summary = simulate(config, out_dir=out, show_progress=False)
    except FedcoreError as exc:
        print(f"{dataset:8s} {topology:6s} {label:28s} seed {seed} FAILED: {exc}", flush=True)
        return {"method": label, "seed": seed, "failed": str(exc)}
    evals = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if '"kind":"eval"' in line
    ]
    final = summary["final"]
    print(
        f"{dataset:8s} {topology:6s} {label:28s} seed {seed} "
        f"avg {final['avg_model_accuracy']:.4f} node {final['mean_node_accuracy']:.4f} "
        f"x{summary['traffic']['compression_ratio_vs_fp32']:.1f}",
        flush=True,
    )
    return {"method": label, "seed": seed, "summary": summary, "evals": evals}


def bytes_to_reach(evals: list[dict[str, Any]], target: float) -> float | None:
    """Bytes sent per node when the average model first reached ``target`` accuracy."""
    for record in evals:
        if record["avg_model_accuracy"] >= target:
            return float(record["bytes_sent_per_node"])
    return None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def report(
    dataset: str, topology: str, runs: list[dict[str, Any]], args: argparse.Namespace
) -> tuple[str, list[dict[str, Any]]]:
    """A markdown table (means over seeds) and its rows."""

    def finals(label: str, key: str) -> list[float]:
        return [r["summary"]["final"][key] for r in runs if r["method"] == label and "summary" in r]

    base_avg = _mean(finals("D-PSGD fp32", "avg_model_accuracy"))
    base_node = _mean(finals("D-PSGD fp32", "mean_node_accuracy"))
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
        avg, node = finals(label, "avg_model_accuracy"), finals(label, "mean_node_accuracy")
        traffic = mine[0]["summary"]["traffic"]
        reach = [bytes_to_reach(r["evals"], target) for r in mine]
        reached = [b for b in reach if b is not None]
        reach_text = (
            "never"
            if not reached
            else f"{_mean(reached) / 1e6:.3f}"
            + ("" if len(reached) == len(reach) else f" ({len(reached)}/{len(reach)} seeds)")
        )
        row = {
            "method": label,
            "avg_model_accuracy": _mean(avg),
            "mean_node_accuracy": _mean(node),
            "avg_model_accuracy_per_seed": avg,
            "mean_node_accuracy_per_seed": node,
            "delta_avg_points": 100 * (_mean(avg) - base_avg),
            "delta_node_points": 100 * (_mean(node) - base_node),
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


def plot(dataset: str, topology: str, runs: list[dict[str, Any]], path: Path) -> None:
    """Average-model accuracy against MB sent per node, seed 0 of every method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    first = min(r["seed"] for r in runs)
    for r in runs:
        if "failed" in r or r["seed"] != first:
            continue
        xs = [e["bytes_sent_per_node"] / 1e6 for e in r["evals"]]
        ax.plot(xs, [e["avg_model_accuracy"] for e in r["evals"]], marker=".", label=r["method"])
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per node (log)")
    ax.set_ylabel("average-model test accuracy")
    ax.set_title(f"{dataset}, 16-node {topology} (seed {first})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
            jobs = [(dataset, topology, m, seed, args) for m in labels for seed in args.seeds]
            with ProcessPoolExecutor(max_workers=args.jobs) as pool:
                runs = list(pool.map(run_one, jobs))
            stem = args.out / f"compression-{dataset}-{topology}"
            table, rows = report(dataset, topology, runs, args)
            stem.with_suffix(".md").write_text(table, encoding="utf-8")
            plot(dataset, topology, runs, stem.with_suffix(".png"))
            stem.with_suffix(".json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
            print(table, flush=True)
            print(f"wrote {stem}.md/.png/.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
