"""Low-precision float messages: fp8, customized precision with and without APS, and S2FP8.

Two measurements, written to ``docs/results/low-precision-<dataset>.{md,json,png}``:

1. **Training through each format.** D-PSGD (sends models), DeepSqueeze (sends its
   error-compensated models), CHOCO (sends differences to the public copies) and
   DoubleSqueeze (workers and a server send error-compensated steps: gradients), each
   through ``fp32``, ``fp8`` (e4m3 and e5m2, one scale per tensor), ``float`` with e=4/m=3
   and e=3/m=0 (4 bits a value), each with and without APS, and ``s2fp8``: final accuracy
   of the average model and mean per node, bytes per node and round, as seed sweeps
   (``fedcore.simulation.sweep``, one folder per case under
   ``docs/results/runs/low-precision-<dataset>/``).
2. **What each format flushes to zero.** The model's real gradients (minibatch gradients of
   the same model trained centrally with plain SGD, at several points of training) through
   each codec: the fraction of non-zero values that decode to 0, and the relative error.

Usage::

    python scripts/low_precision_results.py                   # digits MLP, 16-node torus
    python scripts/low_precision_results.py --methods D-PSGD --seeds 0
    python scripts/low_precision_results.py --methods DoubleSqueeze --stem low-precision-ds
    python scripts/low_precision_results.py --tiny --out /tmp/lp   # a CI-sized grid

A diverged case is reported as such, never dropped. Means over ``--seeds``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import torch
from _results import finals, mean, run_grid

from fedcore.compression import make_codec
from fedcore.config import load_config
from fedcore.metrics import to_json_text
from fedcore.setup.prepare import prepare_run

ROOT = Path(__file__).resolve().parents[1]

FLOAT = ["compression.codec=float"]
CODECS: dict[str, list[str]] = {
    "fp32": ["compression.codec=fp32"],
    "fp8 e4m3": ["compression.codec=fp8", "compression.format=e4m3"],
    "fp8 e5m2": ["compression.codec=fp8", "compression.format=e5m2"],
    "float e4m3": [*FLOAT, "compression.exp_bits=4", "compression.man_bits=3"],
    "float e4m3 APS": [
        *FLOAT,
        "compression.exp_bits=4",
        "compression.man_bits=3",
        "compression.scaling=aps",
    ],
    "float e3m0 (4 bits)": [*FLOAT, "compression.exp_bits=3", "compression.man_bits=0"],
    "float e3m0 (4 bits) APS": [
        *FLOAT,
        "compression.exp_bits=3",
        "compression.man_bits=0",
        "compression.scaling=aps",
    ],
    "s2fp8": ["compression.codec=s2fp8"],
}
"""Codec label -> ``[compression]`` overrides."""

METHODS: dict[str, list[str]] = {
    "D-PSGD": ["algorithm.name=dpsgd"],
    "DeepSqueeze": ["algorithm.name=deepsqueeze"],
    "CHOCO": ["algorithm.name=choco"],
    "DoubleSqueeze": ["algorithm.name=doublesqueeze", "topology.kind=star"],
}
"""Method label -> ``[algorithm]`` overrides."""

TINY_CODECS = ["fp32", "fp8 e4m3", "float e3m0 (4 bits)", "float e3m0 (4 bits) APS"]
TINY_METHODS = ["D-PSGD", "CHOCO"]


def _codec_options(overrides: list[str]) -> dict[str, Any]:
    """``make_codec`` keywords of a codec label's overrides."""
    config = load_config(None, overrides)
    c = config.compression
    return {
        "name": c.codec,
        "format": c.format,
        "exp_bits": c.exp_bits,
        "man_bits": c.man_bits,
        "scaling": c.scaling,
    }


def base_overrides(dataset: str, args: argparse.Namespace) -> list[str]:
    """What every run of the grid shares."""
    return [
        f"data.dataset={dataset}",
        "data.partition=dirichlet",
        f"data.alpha={args.alpha}",
        f"model.name={args.model}",
        f"model.hidden={args.hidden}",
        f"topology.kind={args.topology}",
        f"topology.nodes={args.nodes}",
        f"run.rounds={args.rounds}",
        f"run.eval_every={max(1, args.rounds // 20)}",
        f"algorithm.lr={args.lr}",
    ]


def case_overrides(dataset: str, method: str, codec: str, args: argparse.Namespace) -> list[str]:
    """The ``--set`` overrides of one (method, codec) case."""
    extra = []
    if method == "DeepSqueeze":
        extra.append(f"algorithm.eta={args.eta}")
    if method == "CHOCO":
        extra.append(f"algorithm.gamma={args.gamma}")
    return [*base_overrides(dataset, args), *METHODS[method], *extra, *CODECS[codec]]


def real_gradients(dataset: str, args: argparse.Namespace) -> tuple[list[torch.Tensor], Any]:
    """Minibatch gradients of the model at ``--flush-points`` points of a centralized plain
    SGD run on the whole training set, and the run's setup (for the model's layers)."""
    setup = prepare_run(load_config(None, base_overrides(dataset, args)))
    objective = setup.objective()
    x_all, y_all = setup.dataset.x_train, setup.dataset.y_train
    gen = torch.Generator().manual_seed(0)
    params = objective.initial_params().clone()
    points = set(torch.linspace(0, args.flush_steps, args.flush_points).round().long().tolist())
    grads = []
    for step in range(args.flush_steps + 1):
        idx = torch.randint(0, len(y_all), (32,), generator=gen)
        _, grad = objective.loss_and_grad(params, x_all[idx], y_all[idx])
        if step in points:
            grads.append(grad.clone())
        params -= args.lr * grad
    return grads, setup


def flush_table(dataset: str, codecs: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per codec: the fraction of non-zero gradient values flushed to 0, and the error."""
    grads, setup = real_gradients(dataset, args)
    rows = []
    for label in codecs:
        options = _codec_options(CODECS[label])
        codec = make_codec(options.pop("name"), layers=setup.layers, **options)
        flushed, errors, per_layer = [], [], []
        for g in grads:
            decoded = codec.decode(codec.encode(g))
            nonzero = g != 0
            flushed.append(float((nonzero & (decoded == 0)).sum()) / max(1, int(nonzero.sum())))
            errors.append(float((decoded - g).norm() / g.norm()))
            at, layers = 0, []
            for size in setup.layers:
                part, dec = g[at : at + size], decoded[at : at + size]
                nz = part != 0
                layers.append(float((nz & (dec == 0)).sum()) / max(1, int(nz.sum())))
                at += size
            per_layer.append(layers)
        rows.append(
            {
                "codec": label,
                "flushed_fraction": mean(flushed),
                "relative_error": mean(errors),
                "flushed_per_layer": [mean(col) for col in zip(*per_layer, strict=True)],
            }
        )
    return rows


def _fmt(value: float, spec: str) -> str:
    return "n/a" if value is None or not math.isfinite(value) else format(value, spec)


def report(
    dataset: str,
    runs: list[dict[str, Any]],
    flush: list[dict[str, Any]],
    labels: list[tuple[str, str, str]],
    layers: tuple[int, ...],
    args: argparse.Namespace,
) -> tuple[str, dict[str, Any]]:
    """Markdown tables (means over seeds) and their rows."""
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"### {dataset}, {args.model} (hidden {args.hidden}), {args.nodes}-node "
        f"{args.topology}, Dirichlet {args.alpha}, {args.rounds} rounds, lr {args.lr}, "
        f"DeepSqueeze eta {args.eta}, CHOCO gamma {args.gamma}, seeds {seeds}",
        "",
        "| method | codec | avg-model acc | mean node acc | Δ avg vs fp32 (points) "
        "| bytes/node/round | x fewer bytes |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for method, codec, label in labels:
        mine = [r for r in runs if r["method"] == label]
        failed = [r for r in mine if "failed" in r]
        if failed:
            lines.append(
                f"| {method} | {codec} | diverged in {len(failed)} of {len(mine)} seeds: "
                f"{failed[0]['failed'][:60]}... | | | | |"
            )
            rows.append({"method": method, "codec": codec, "failed": [r["failed"] for r in failed]})
            continue
        avg = finals(runs, label, "avg_model_accuracy")
        node = finals(runs, label, "mean_node_accuracy")
        base = finals(runs, f"{method} fp32", "avg_model_accuracy")
        traffic = mine[0]["summary"]["traffic"]
        row = {
            "method": method,
            "codec": codec,
            "avg_model_accuracy": mean(avg),
            "mean_node_accuracy": mean(node),
            "avg_model_accuracy_per_seed": avg,
            "delta_avg_points": 100 * (mean(avg) - mean(base)) if base else math.nan,
            "bytes_per_node_per_round": traffic["bytes_per_node_per_round"],
            "compression_ratio_vs_fp32": traffic["compression_ratio_vs_fp32"],
        }
        rows.append(row)
        lines.append(
            f"| {method} | {codec} | {_fmt(row['avg_model_accuracy'], '.4f')} | "
            f"{_fmt(row['mean_node_accuracy'], '.4f')} | {_fmt(row['delta_avg_points'], '+.2f')} "
            f"| {row['bytes_per_node_per_round']:.0f} | "
            f"{row['compression_ratio_vs_fp32']:.2f} |"
        )
    lines += [
        "",
        f"Values of the model's real gradients flushed to zero ({args.flush_points} minibatch "
        f"gradients along {args.flush_steps} steps of centralized SGD; layers {list(layers)}):",
        "",
        "| codec | flushed to 0 | relative error | flushed per layer |",
        "|---|---:|---:|---|",
    ]
    for row in flush:
        per_layer = ", ".join(f"{100 * v:.1f}%" for v in row["flushed_per_layer"])
        lines.append(
            f"| {row['codec']} | {100 * row['flushed_fraction']:.2f}% | "
            f"{row['relative_error']:.4f} | {per_layer} |"
        )
    return "\n".join(lines) + "\n", {"runs": rows, "flushed": flush, "layers": list(layers)}


def plot(runs: list[dict[str, Any]], labels: list[tuple[str, str, str]], path: Path) -> None:
    """One panel per method: average-model accuracy against MB sent, a line per codec."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(m for m, _, _ in labels))
    fig, axes = plt.subplots(1, len(methods), figsize=(6 * len(methods), 4.5), squeeze=False)
    first = min(r["seed"] for r in runs)
    for ax, method in zip(axes[0], methods, strict=True):
        for i, (_, codec, label) in enumerate(x for x in labels if x[0] == method):
            shown = [r for r in runs if r["method"] == label and r["seed"] == first]
            if not shown or "failed" in shown[0]:
                continue
            evals = shown[0]["evals"]
            ax.plot(
                [e["bytes_sent_per_node"] / 1e6 for e in evals],
                [e["avg_model_accuracy"] for e in evals],
                label=codec,
                color=plt.get_cmap("tab10")(i % 10),
                linestyle="--" if "APS" in codec else "-",
            )
        ax.set_xscale("log")
        ax.set_xlabel("MB sent per node (log)")
        ax.set_ylabel("average-model test accuracy")
        ax.set_title(method)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle(f"low-precision messages (seed {first})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", nargs="+", default=["digits"])
    parser.add_argument("--methods", nargs="*", default=[], help="subset of method labels")
    parser.add_argument("--codecs", nargs="*", default=[], help="subset of codec labels")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--topology", default="torus")
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--eta", type=float, default=0.2, help="DeepSqueeze consensus step")
    parser.add_argument("--gamma", type=float, default=0.8, help="CHOCO consensus step")
    parser.add_argument("--flush-steps", type=int, default=600, help="centralized SGD steps")
    parser.add_argument("--flush-points", type=int, default=7, help="gradients along them")
    parser.add_argument("--tiny", action="store_true", help="a CI-sized grid")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--stem", default="low-precision", help="output name before -<dataset>")
    args = parser.parse_args(argv)
    for given, known, what in ((args.methods, METHODS, "methods"), (args.codecs, CODECS, "codecs")):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"unknown {what} {unknown}; known: {list(known)}")
    if args.tiny:
        args.methods = args.methods or TINY_METHODS
        args.codecs = args.codecs or TINY_CODECS
        args.seeds, args.rounds, args.nodes = [0], 60, 9
        args.flush_steps, args.flush_points = 100, 3
    methods = [m for m in METHODS if not args.methods or m in args.methods]
    codecs = [c for c in CODECS if not args.codecs or c in args.codecs or c == "fp32"]
    labels = [(m, c, f"{m} {c}") for m in methods for c in codecs]
    args.out.mkdir(parents=True, exist_ok=True)
    for dataset in args.dataset:
        cases = {label: case_overrides(dataset, m, c, args) for m, c, label in labels}
        runs = run_grid(
            cases, args.seeds, args.out / "runs" / f"low-precision-{dataset}", args.jobs
        )
        flush = flush_table(dataset, [c for c in codecs if c != "fp32"], args)
        layers = prepare_run(load_config(None, base_overrides(dataset, args))).layers
        table, data = report(dataset, runs, flush, labels, layers, args)
        stem = args.out / f"{args.stem}-{dataset}"
        stem.with_suffix(".md").write_text(table, encoding="utf-8")
        stem.with_suffix(".json").write_text(to_json_text(data, indent=1), encoding="utf-8")
        plot(runs, labels, stem.with_suffix(".png"))
        print(table, flush=True)
        print(f"wrote {stem}.md/.png/.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
