"""Learning per byte: fp32 D-PSGD, DeepSqueeze, CHOCO and naive compression, side by side.

Runs every (dataset, topology, method) of the grid with ``fedcore.runners.simulate`` and
writes ``docs/results/compression-<dataset>-<topology>.{md,json,png}``: final accuracy of the
average model and mean per node, bytes per node to reach 90% of the fp32 run's final
average-model accuracy, and accuracy against bytes sent.

Usage::

    python scripts/compression_results.py --dataset digits --topology torus ring
    python scripts/compression_results.py --dataset mnist1d --rounds 600
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from fedcore.config import load_config
from fedcore.errors import FedcoreError
from fedcore.runners.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]

METHODS: dict[str, list[str]] = {
    "D-PSGD fp32": ["algorithm.name=dpsgd", "compression.codec=fp32"],
    "DeepSqueeze sign": ["algorithm.name=deepsqueeze", "compression.codec=sign"],
    "DeepSqueeze QSGD-2": [
        "algorithm.name=deepsqueeze",
        "compression.codec=qsgd",
        "compression.bits=2",
    ],
    "DeepSqueeze QSGD-4": [
        "algorithm.name=deepsqueeze",
        "compression.codec=qsgd",
        "compression.bits=4",
    ],
    "DeepSqueeze top-1%": [
        "algorithm.name=deepsqueeze",
        "compression.codec=topk",
        "compression.ratio=0.01",
    ],
    "CHOCO sign": ["algorithm.name=choco", "compression.codec=sign"],
    "CHOCO QSGD-2": ["algorithm.name=choco", "compression.codec=qsgd", "compression.bits=2"],
    "CHOCO QSGD-4": ["algorithm.name=choco", "compression.codec=qsgd", "compression.bits=4"],
    "CHOCO top-1%": ["algorithm.name=choco", "compression.codec=topk", "compression.ratio=0.01"],
    "naive D-PSGD sign": ["algorithm.name=dpsgd", "compression.codec=sign"],
}


def run_grid(dataset: str, topology: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One simulate run per method; returns summary rows with their eval curves."""
    rows = []
    for label, overrides in METHODS.items():
        if args.methods and label not in args.methods:
            continue
        extra = [f"algorithm.eta={args.eta}"] if "deepsqueeze" in overrides[0] else []
        extra += [f"algorithm.gamma={args.gamma}"] if "choco" in overrides[0] else []
        config = load_config(
            None,
            [
                f"data.dataset={dataset}",
                "data.partition=dirichlet",
                f"data.alpha={args.alpha}",
                "model.name=mlp",
                f"model.hidden={args.hidden}",
                f"topology.kind={topology}",
                "topology.nodes=16",
                f"run.rounds={args.rounds}",
                f"run.eval_every={max(1, args.rounds // 20)}",
                f"algorithm.lr={args.lr}",
                *overrides,
                *extra,
            ],
        )
        out = args.out / "runs" / f"{dataset}-{topology}-{label.replace(' ', '_')}"
        try:
            summary = simulate(config, out_dir=out, show_progress=False)
        except FedcoreError as exc:  # a diverged method is a finding: record it
            print(f"{dataset:8s} {topology:6s} {label:20s} FAILED: {exc}", flush=True)
            rows.append({"method": label, "failed": str(exc)})
            continue
        evals = [
            json.loads(line)
            for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            if '"kind":"eval"' in line
        ]
        rows.append({"method": label, "summary": summary, "evals": evals, "out": str(out)})
        final = summary["final"]
        print(
            f"{dataset:8s} {topology:6s} {label:20s} avg {final['avg_model_accuracy']:.4f} "
            f"node {final['mean_node_accuracy']:.4f} "
            f"x{summary['traffic']['compression_ratio_vs_fp32']:.1f}",
            flush=True,
        )
    return rows


def bytes_to_reach(evals: list[dict[str, Any]], target: float) -> float | None:
    for record in evals:
        if record["avg_model_accuracy"] >= target:
            return float(record["bytes_sent_per_node"])
    return None


def report(
    dataset: str, topology: str, rows: list[dict[str, Any]], args: argparse.Namespace
) -> str:
    base = next(r for r in rows if r["method"] == "D-PSGD fp32")["summary"]["final"]
    target = 0.9 * base["avg_model_accuracy"]
    lines = [
        f"### {dataset}, MLP (hidden {args.hidden}), 16-node {topology}, Dirichlet {args.alpha}, "
        f"{args.rounds} rounds, lr {args.lr}, eta {args.eta}, gamma {args.gamma}",
        "",
        "| method | avg-model acc | mean node acc | Δ avg vs fp32 | Δ node vs fp32 "
        "| bytes/node/round | x fewer bytes | MB/node to 90% of fp32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['method']} | diverged: {r['failed'][:60]}... | | | | | | |")
            continue
        f = r["summary"]["final"]
        t = r["summary"]["traffic"]
        reach = bytes_to_reach(r["evals"], target)
        lines.append(
            f"| {r['method']} | {f['avg_model_accuracy']:.4f} | {f['mean_node_accuracy']:.4f} | "
            f"{100 * (f['avg_model_accuracy'] - base['avg_model_accuracy']):+.2f} | "
            f"{100 * (f['mean_node_accuracy'] - base['mean_node_accuracy']):+.2f} | "
            f"{t['bytes_per_node_per_round']:.0f} | {t['compression_ratio_vs_fp32']:.1f} | "
            f"{'never' if reach is None else f'{reach / 1e6:.3f}'} |"
        )
    return "\n".join(lines) + "\n"


def plot(dataset: str, topology: str, rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        if "failed" in r:
            continue
        xs = [e["bytes_sent_per_node"] / 1e6 for e in r["evals"]]
        ax.plot(xs, [e["avg_model_accuracy"] for e in r["evals"]], marker=".", label=r["method"])
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per node (log)")
    ax.set_ylabel("average-model test accuracy")
    ax.set_title(f"{dataset}, 16-node {topology}")
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
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--eta", type=float, default=0.2)
    parser.add_argument("--gamma", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for dataset in args.dataset:
        for topology in args.topology:
            rows = run_grid(dataset, topology, args)
            stem = args.out / f"compression-{dataset}-{topology}"
            (stem.with_suffix(".md")).write_text(
                report(dataset, topology, rows, args), encoding="utf-8"
            )
            plot(dataset, topology, rows, stem.with_suffix(".png"))
            slim = [{k: v for k, v in r.items() if k != "out"} for r in rows]
            (stem.with_suffix(".json")).write_text(json.dumps(slim, indent=1), encoding="utf-8")
            print(f"wrote {stem}.md/.png/.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
