"""The server family against the decentralized methods: FedAvg, DoubleSqueeze, APMSqueeze.

Runs, as seed sweeps on the same data split (``data.partition = dirichlet`` over 16 workers;
a star's server holds no data, so the 16 workers of ``fedavg`` get exactly the parts the 16
peers of ``central``, ``dpsgd`` and ``ops`` get), and writes
``docs/results/federated-<dataset>.{md,json,png}``:

1. **FedAvg** with C = 1 and 0.25 of the workers a round and K = 1 and 5 local steps,
   against CENTRAL (mini-batch SGD on the union), D-PSGD (torus) and OPS (social graph).
2. **DoubleSqueeze** with sign, QSGD-4 and top-1% against uncompressed parameter-server SGD
   (DoubleSqueeze through ``fp32``) and against the same codecs without error compensation
   (``algorithm.error_feedback = false``), if the algorithm is registered.
3. **APMSqueeze** with 1-bit sign against full-precision Adam on the averaged gradient
   (APMSqueeze whose warm-up lasts the whole run), APMSqueeze through ``fp32`` (its
   compressed phase is then momentum SGD preconditioned by the frozen second moment) and
   each worker's own Adam with FedAvg's averaging (C = 1, K = 1), if registered.

Usage::

    python scripts/federated_results.py                        # digits MLP, seeds 0 1
    python scripts/federated_results.py --dataset mnist1d --rounds 600
    python scripts/federated_results.py --tiny --out /tmp/fed  # a CI-sized grid

Every figure is the server's (global) model for the server family and the average model for
the decentralized methods. A diverged case is reported as such, never dropped.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from _results import finals, mean, plot_curves, run_grid

from fedcore.algorithms import ALGORITHMS
from fedcore.metrics import to_json_text

ROOT = Path(__file__).resolve().parents[1]

STAR = ["topology.kind=star"]
SIGN = ["compression.codec=sign"]
QSGD4 = ["compression.codec=qsgd", "compression.bits=4", "compression.scaled=true"]
TOP1 = ["compression.codec=topk", "compression.ratio=0.01"]


def methods(args: argparse.Namespace) -> dict[str, tuple[str, list[str]]]:
    """Label -> (group, overrides) for every case of the grid."""
    out: dict[str, tuple[str, list[str]]] = {
        "CENTRAL": ("fedavg", ["algorithm.name=central", "topology.kind=complete"]),
        "D-PSGD (torus)": ("fedavg", ["algorithm.name=dpsgd", "topology.kind=torus"]),
        "OPS (social)": ("fedavg", ["algorithm.name=ops", "topology.kind=social"]),
    }
    for c in (1.0, 0.25):
        for k in (1, 5):
            out[f"FedAvg C={c:g} K={k}"] = (
                "fedavg",
                ["algorithm.name=fedavg", *STAR, f"algorithm.fraction={c}", f"run.local_steps={k}"],
            )
    if "doublesqueeze" in ALGORITHMS:
        ds = ["algorithm.name=doublesqueeze", *STAR]
        out["PS-SGD fp32 (DoubleSqueeze, identity)"] = ("doublesqueeze", ds)
        for name, codec in (("sign", SIGN), ("QSGD-4", QSGD4), ("top-1%", TOP1)):
            out[f"DoubleSqueeze {name}"] = ("doublesqueeze", [*ds, *codec])
            out[f"two-pass {name}, no EC"] = (
                "doublesqueeze",
                [*ds, *codec, "algorithm.error_feedback=false"],
            )
    if "apmsqueeze" in ALGORITHMS:
        apm = ["algorithm.name=apmsqueeze", *STAR, f"algorithm.lr={args.adam_lr}"]
        apm += [f"algorithm.precondition_rounds={args.precondition}"]
        out["Adam on the averaged gradient"] = (
            "apmsqueeze",
            [*apm[:-1], f"algorithm.precondition_rounds={args.rounds}"],  # all rounds warm-up
        )
        out["local Adam, FedAvg C=1 K=1"] = (
            "apmsqueeze",
            ["algorithm.name=fedavg", *STAR, "optimizer.name=adam", f"algorithm.lr={args.adam_lr}"],
        )
        out["APMSqueeze fp32"] = ("apmsqueeze", apm)
        out["APMSqueeze sign"] = ("apmsqueeze", [*apm, *SIGN])
    return out


def base(dataset: str, args: argparse.Namespace) -> list[str]:
    """What every run shares."""
    return [
        f"data.dataset={dataset}",
        "data.partition=dirichlet",
        f"data.alpha={args.alpha}",
        f"model.name={args.model}",
        f"topology.nodes={args.nodes}",
        f"run.rounds={args.rounds}",
        f"run.eval_every={max(1, args.rounds // 20)}",
        f"algorithm.lr={args.lr}",
    ]


def report(
    dataset: str,
    runs: list[dict[str, Any]],
    cases: dict[str, tuple[str, list[str]]],
    args: argparse.Namespace,
) -> tuple[str, list[dict[str, Any]]]:
    """One markdown table per group (means over seeds) and the rows."""
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"### {dataset}, {args.model}, {args.nodes} workers, Dirichlet {args.alpha}, "
        f"{args.rounds} rounds, lr {args.lr}, seeds {seeds}",
        "",
    ]
    rows: list[dict[str, Any]] = []
    for group in dict.fromkeys(g for g, _ in cases.values()):
        lines += [
            f"**{group}**",
            "",
            "| method | avg-model acc | mean node acc | bytes/node/round | MB/node total |",
            "|---|---:|---:|---:|---:|",
        ]
        for label, (g, _) in cases.items():
            if g != group:
                continue
            mine = [r for r in runs if r["method"] == label]
            failed = [r for r in mine if "failed" in r]
            if failed or not mine:
                why = failed[0]["failed"][:60] if failed else "no run"
                lines.append(f"| {label} | diverged in {len(failed)} of {len(mine)}: {why} | | | |")
                rows.append({"method": label, "group": group, "failed": why})
                continue
            avg = finals(runs, label, "avg_model_accuracy")
            node = finals(runs, label, "mean_node_accuracy")
            traffic = mine[0]["summary"]["traffic"]
            row = {
                "method": label,
                "group": group,
                "avg_model_accuracy": mean(avg),
                "avg_model_accuracy_per_seed": avg,
                "mean_node_accuracy": mean(node),
                "bytes_per_node_per_round": traffic["bytes_per_node_per_round"],
                "mb_per_node": traffic["bytes_sent"] / mine[0]["summary"]["nodes"] / 1e6,
            }
            rows.append(row)
            lines.append(
                f"| {label} | {_f(row['avg_model_accuracy'])} | {_f(row['mean_node_accuracy'])} "
                f"| {row['bytes_per_node_per_round']:.0f} | {row['mb_per_node']:.2f} |"
            )
        lines.append("")
    return "\n".join(lines), rows


def _f(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", nargs="+", default=["digits"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--adam-lr", type=float, default=0.01, help="Adam and APMSqueeze")
    parser.add_argument("--precondition", type=int, default=30, help="APMSqueeze warm-up")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--methods", nargs="*", default=[], help="subset of method labels")
    parser.add_argument("--tiny", action="store_true", help="a CI-sized grid")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args(argv)
    if args.tiny:
        args.seeds, args.rounds, args.nodes = [0], 40, 9
    cases = methods(args)
    unknown = sorted(set(args.methods) - set(cases))
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {list(cases)}")
    if args.tiny and not args.methods:
        args.methods = ["CENTRAL", "FedAvg C=1 K=1", "FedAvg C=0.25 K=5"]
    if args.methods:
        cases = {k: v for k, v in cases.items() if k in args.methods}
    args.out.mkdir(parents=True, exist_ok=True)
    for dataset in args.dataset:
        grid = {label: [*base(dataset, args), *o] for label, (_, o) in cases.items()}
        runs = run_grid(grid, args.seeds, args.out / "runs" / f"federated-{dataset}", args.jobs)
        table, rows = report(dataset, runs, cases, args)
        stem = args.out / f"federated-{dataset}"
        stem.with_suffix(".md").write_text(table, encoding="utf-8")
        stem.with_suffix(".json").write_text(to_json_text(rows, indent=1), encoding="utf-8")
        plot_curves(
            runs,
            stem.with_suffix(".png"),
            x=lambda e: e["round"] + 1,
            xlabel="round",
            panels=[
                ("avg_model_accuracy", "global / average-model test accuracy", False),
                ("mean_node_accuracy", "mean node accuracy", False),
            ],
            title=f"{dataset}, {args.nodes} workers",
        )
        print(table, flush=True)
        print(f"wrote {stem}.md/.png/.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
