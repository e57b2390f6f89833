"""Large batches: LARS and LAMB against linearly scaled SGD, at equal epochs.

The claim (You et al.: LARS, "Large Batch Training of Convolutional Networks", 2017; LAMB,
"Large Batch Optimization for Deep Learning: Training BERT in 76 Minutes", ICLR 2020): at
a large batch, plain SGD with the linearly scaled learning rate loses the small-batch
accuracy, while LARS or LAMB with warm-up keeps it. This script checks it on D-PSGD with an
MLP.

Setup: ``--nodes`` (default 4) nodes on a ring, an iid partition, so every node holds
``P = floor(train / nodes)`` examples (digits: 1437 / 4 -> 359). Three per-node batch
sizes: ``--small`` (32), ``--large`` (512, or the largest power of two that fits in a
node's partition: 256 on digits) and the whole partition ``P`` ("largest that fits").
fedcore's ``BatchStream`` silently clips a batch larger than the partition to the
partition, while ``algorithm.lr_scaling`` scales by the *configured* batch size, so the
script never asks for a batch larger than ``P``. Equal epochs: the small batch runs
``--rounds`` rounds, a batch ``B`` runs ``round(rounds * small / B)`` rounds; one epoch
is ``P / B`` rounds.

Methods. Small batch: SGD and heavy-ball momentum (0.9) with tuned learning rates. Each
large batch: SGD and momentum with the linearly scaled rate (``lr_scaling = linear``,
``base_batch_size = small``: ``lr * B / small``) and no warm-up, as the claim states it;
Adam at a tuned, unscaled rate; LARS and LAMB with ``lr_scaling = sqrt`` (LEGW) and
``--warmup`` of the run's rounds of linear warm-up. Every schedule is ``--schedule``
(constant) after the warm-up. The learning rates are the defaults of ``--lr-*`` (picked by
``--sweep`` on digits, one seed; MNIST-1D wants ``--lr-sgd 1 --lr-momentum 0.3
--lr-lamb 0.01``; see docs/results.md).

Writes ``<out>/large-batch-<dataset>.{md,json,png}`` (run folders under
``<out>/runs/large-batch-<dataset>/``); with ``--sweep``, ``large-batch-<dataset>-sweep.md``.

Usage::

    python scripts/large_batch_results.py --dataset digits
    python scripts/large_batch_results.py --dataset digits --sweep --seeds 0
    python scripts/large_batch_results.py --dataset mnist1d --lr-sgd 1 --lr-momentum 0.3 \
        --lr-lamb 0.01
    python scripts/large_batch_results.py --tiny --out /tmp/lb    # CI size
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from _results import finals, mean, plot_curves, run_grid

from fedcore.data import training_examples
from fedcore.metrics import to_json_text

ROOT = Path(__file__).resolve().parents[1]

# Examples per dataset when fedcore.data.training_examples cannot say without loading it.
TRAIN_EXAMPLES = {"digits": 1437, "mnist1d": 8000}

# method key -> (label, optimizer overrides, lr argument, scaling, warm-up)
METHODS: dict[str, tuple[str, list[str], str, str, bool]] = {
    "sgd": ("SGD", ["optimizer.name=sgd"], "lr_sgd", "none", False),
    "momentum": (
        "momentum 0.9",
        ["optimizer.name=momentum", "optimizer.momentum=0.9"],
        "lr_momentum",
        "none",
        False,
    ),
    "sgd-linear": ("SGD, linear lr", ["optimizer.name=sgd"], "lr_sgd", "linear", False),
    "momentum-linear": (
        "momentum 0.9, linear lr",
        ["optimizer.name=momentum", "optimizer.momentum=0.9"],
        "lr_momentum",
        "linear",
        False,
    ),
    "adam": ("Adam", ["optimizer.name=adam"], "lr_adam", "none", False),
    "lars": (
        "LARS + warm-up, sqrt lr",
        ["optimizer.name=lars", "optimizer.momentum=0.9"],
        "lr_lars",
        "sqrt",
        True,
    ),
    "lamb": ("LAMB + warm-up, sqrt lr", ["optimizer.name=lamb"], "lr_lamb", "sqrt", True),
}
SMALL_METHODS = ("sgd", "momentum")
LARGE_METHODS = ("sgd-linear", "momentum-linear", "adam", "lars", "lamb")

# --sweep: candidate learning rates (base rates at the small batch for the scaled methods)
SWEEP: dict[str, list[float]] = {
    "lr_sgd": [0.03, 0.1, 0.3, 1.0],
    "lr_momentum": [0.01, 0.03, 0.1, 0.3],
    "lr_adam": [0.001, 0.003, 0.01, 0.03],
    "lr_lars": [1.0, 3.0, 10.0, 30.0],
    "lr_lamb": [0.003, 0.01, 0.03, 0.1],
}


def partition_size(dataset: str, nodes: int) -> int:
    """Examples on each node of an iid split (the smallest share)."""
    total = training_examples(dataset, test_fraction=0.2) or TRAIN_EXAMPLES[dataset]
    return int(total) // nodes


def batch_sizes(args: argparse.Namespace, per_node: int) -> tuple[int, list[int]]:
    """``(small, [large, whole partition])``: the large batch capped to a power of two that
    fits in a node's partition."""
    large = args.large
    while large > per_node:
        large //= 2
    sizes = [b for b in dict.fromkeys([large, per_node]) if b > args.small]
    return int(args.small), sizes


def rounds_for(batch: int, args: argparse.Namespace) -> int:
    """Rounds at ``batch`` for as many epochs as ``--rounds`` at the small batch."""
    return max(1, round(int(args.rounds) * int(args.small) / batch))


def case(
    key: str, batch: int, args: argparse.Namespace, lr: float | None = None
) -> tuple[str, list[str]]:
    """``(label, --set overrides)`` of one method at one batch size."""
    name, optimizer, lr_arg, scaling, warm = METHODS[key]
    rounds = rounds_for(batch, args)
    base_lr = getattr(args, lr_arg) if lr is None else lr
    overrides = [
        f"data.dataset={args.dataset}",
        "data.partition=iid",
        f"data.batch_size={batch}",
        f"model.name={args.model}",
        f"model.hidden={args.hidden}",
        "algorithm.name=dpsgd",
        f"topology.kind={args.topology}",
        f"topology.nodes={args.nodes}",
        f"run.rounds={rounds}",
        f"run.eval_every={max(1, rounds // args.evals)}",
        f"algorithm.lr={base_lr}",
        f"algorithm.lr_schedule={args.schedule}",
        *optimizer,
    ]
    if scaling != "none":
        overrides += [f"algorithm.lr_scaling={scaling}", f"algorithm.base_batch_size={args.small}"]
    if warm:
        overrides.append(f"algorithm.warmup_rounds={max(1, round(args.warmup * rounds))}")
    label = f"{name} @ {batch}" + (f" lr {lr:g}" if lr is not None else "")
    return label, overrides


def effective(base_lr: float, scaling: str, batch: int, small: int) -> float:
    """The step size after ``lr_scaling`` (as ``fedcore.config.effective_lr``)."""
    k = batch / small
    return base_lr * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[scaling]


def grid(args: argparse.Namespace, per_node: int) -> list[dict[str, Any]]:
    """Every (method, batch) of the comparison, with its label and overrides."""
    small, large = batch_sizes(args, per_node)
    rows = []
    for key, batch in [(k, small) for k in SMALL_METHODS] + [
        (k, b) for b in large for k in LARGE_METHODS
    ]:
        label, overrides = case(key, batch, args)
        rows.append({"key": key, "batch": batch, "label": label, "overrides": overrides})
    return rows


def report(
    cases: list[dict[str, Any]], runs: list[dict[str, Any]], args: argparse.Namespace, per_node: int
) -> tuple[str, list[dict[str, Any]]]:
    """The markdown table (mean +- std over seeds) and its rows."""
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"### {args.dataset}, {args.model} (hidden {args.hidden}), D-PSGD on a {args.nodes}-node "
        f"{args.topology}, iid ({per_node} examples a node), {args.rounds} rounds at batch "
        f"{args.small}, equal epochs, {args.schedule} schedule, warm-up {args.warmup:g} of "
        f"the rounds, seeds {seeds}",
        "",
        "| method | batch | rounds | epochs | lr used | avg-model acc | ± std | "
        "mean node acc | Δ avg vs small-batch SGD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = finals(runs, cases[0]["label"], "avg_model_accuracy")
    base_acc = mean(base) if base else math.nan
    rows = []
    for c in cases:
        name, _, lr_arg, scaling, warm = METHODS[c["key"]]
        rounds = rounds_for(c["batch"], args)
        epochs = rounds * c["batch"] / per_node
        lr = effective(getattr(args, lr_arg), scaling, c["batch"], args.small)
        mine = [r for r in runs if r["method"] == c["label"]]
        failed = [r for r in mine if "failed" in r]
        row: dict[str, Any] = {
            "method": name,
            "key": c["key"],
            "batch": c["batch"],
            "rounds": rounds,
            "epochs": epochs,
            "lr": lr,
            "warmup_rounds": max(1, round(args.warmup * rounds)) if warm else 0,
        }
        if failed:
            row["failed"] = [r["failed"] for r in failed]
            lines.append(
                f"| {name} | {c['batch']} | {rounds} | {epochs:.1f} | {lr:.4g} | diverged in "
                f"{len(failed)} of {len(mine)} seeds | | | |"
            )
            rows.append(row)
            continue
        avg = finals(runs, c["label"], "avg_model_accuracy")
        node = finals(runs, c["label"], "mean_node_accuracy")
        std = (
            math.sqrt(sum((a - mean(avg)) ** 2 for a in avg) / (len(avg) - 1))
            if len(avg) > 1
            else math.nan
        )
        row.update(
            avg_model_accuracy=mean(avg),
            avg_model_accuracy_std=std,
            mean_node_accuracy=mean(node),
            avg_model_accuracy_per_seed=avg,
            delta_avg_points=100 * (mean(avg) - base_acc),
        )
        rows.append(row)
        lines.append(
            f"| {name} | {c['batch']} | {rounds} | {epochs:.1f} | {lr:.4g} | "
            f"{mean(avg):.4f} | {'-' if math.isnan(std) else f'{std:.4f}'} | {mean(node):.4f} | "
            f"{row['delta_avg_points']:+.2f} |"
        )
    return "\n".join(lines) + "\n", rows


def sweep(args: argparse.Namespace, per_node: int) -> int:
    """Each method's candidate rates (``SWEEP``) at the batch it is compared at: the small
    batch for SGD and momentum, the large one (scaled) for the others, plus plain SGD and
    momentum at the large batch with each rate unscaled, as a check of the linear rule."""
    small, large = batch_sizes(args, per_node)
    cases: dict[str, list[str]] = {}
    meta: dict[str, tuple[str, int, float, str]] = {}
    plan = [(k, small) for k in SMALL_METHODS] + [(k, large[0]) for k in LARGE_METHODS]
    plan += [("sgd", large[0]), ("momentum", large[0])]
    for key, batch in plan:
        _, _, lr_arg, scaling, _ = METHODS[key]
        candidates = SWEEP[lr_arg]
        if key in SMALL_METHODS and batch != small:
            candidates = sorted({effective(c, "linear", batch, small) for c in candidates[:2]})
            candidates = [*SWEEP[lr_arg], *candidates]
        for lr in candidates:
            label, overrides = case(key, batch, args, lr)
            cases[label] = overrides
            meta[label] = (METHODS[key][0], batch, effective(lr, scaling, batch, small), scaling)
    runs = run_grid(
        cases, args.seeds, args.out / "runs" / f"large-batch-{args.dataset}-sweep", args.jobs
    )
    lines = [
        f"### lr sweep: {args.dataset}, {args.nodes}-node {args.topology}, {args.rounds} rounds "
        f"at batch {small} (equal epochs), seeds {sorted(args.seeds)}",
        "",
        "| method | batch | base lr | lr used | avg-model acc |",
        "|---|---:|---:|---:|---:|",
    ]
    for label in cases:
        name, batch, used, scaling = meta[label]
        base = label.rsplit(" lr ", 1)[1]
        accs = finals(runs, label, "avg_model_accuracy")
        text = f"{mean(accs):.4f}" if accs else "diverged"
        lines.append(f"| {name} | {batch} | {base} | {used:.4g} | {text} |")
    table = "\n".join(lines) + "\n"
    path = args.out / f"large-batch-{args.dataset}-sweep.md"
    path.write_text(table, encoding="utf-8")
    print(table, flush=True)
    print(f"wrote {path}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="digits", choices=sorted(TRAIN_EXAMPLES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--rounds", type=int, default=0, help="rounds at the small batch (0: 30 epochs)"
    )
    parser.add_argument("--small", type=int, default=32, help="the small per-node batch")
    parser.add_argument("--large", type=int, default=512, help="the large per-node batch")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--topology", default="ring")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--schedule", default="constant", help="algorithm.lr_schedule")
    parser.add_argument(
        "--warmup", type=float, default=0.2, help="LARS/LAMB warm-up, a fraction of the rounds"
    )
    parser.add_argument("--evals", type=int, default=20, help="evaluations per run")
    parser.add_argument("--lr-sgd", type=float, default=0.3)
    parser.add_argument("--lr-momentum", type=float, default=0.03)
    parser.add_argument("--lr-adam", type=float, default=0.03)
    parser.add_argument("--lr-lars", type=float, default=10.0)
    parser.add_argument("--lr-lamb", type=float, default=0.03)
    parser.add_argument("--sweep", action="store_true", help="the lr sweep instead")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="CI size: 10 epochs (112 rounds at batch 32) against 128 and the partition, seed 0",
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args(argv)
    if args.tiny:
        args.seeds, args.rounds, args.small, args.large, args.evals = [0], 112, 32, 128, 4
    args.out.mkdir(parents=True, exist_ok=True)
    per_node = partition_size(args.dataset, args.nodes)
    if args.rounds <= 0:  # 30 epochs at the small batch (digits, 4 nodes: 336 rounds)
        args.rounds = round(30 * per_node / args.small)
    if args.small >= per_node:
        parser.error(f"--small {args.small} must be below a node's {per_node} examples")
    if args.sweep:
        return sweep(args, per_node)
    cases = grid(args, per_node)
    runs = run_grid(
        {c["label"]: c["overrides"] for c in cases},
        args.seeds,
        args.out / "runs" / f"large-batch-{args.dataset}",
        args.jobs,
    )
    table, rows = report(cases, runs, args, per_node)
    stem = args.out / f"large-batch-{args.dataset}"
    stem.with_suffix(".md").write_text(table, encoding="utf-8")
    epoch_of = {c["label"]: c["batch"] / per_node for c in cases}
    for r in runs:  # the x axis: epochs (round + 1 batches of B examples over P)
        for e in r.get("evals", []):
            e["epoch"] = (e["round"] + 1) * epoch_of[r["method"]]
    plot_curves(
        runs,
        stem.with_suffix(".png"),
        x=lambda e: e["epoch"],
        xlabel="epochs (examples seen per node / examples per node)",
        panels=[
            ("avg_model_accuracy", "average-model test accuracy", False),
            ("train_loss", "training loss (log)", True),
        ],
        title=f"{args.dataset}, D-PSGD, {args.nodes}-node {args.topology}, equal epochs",
    )
    stem.with_suffix(".json").write_text(
        to_json_text({"setup": setup(args, per_node), "rows": rows}, indent=1), encoding="utf-8"
    )
    print(table, flush=True)
    print(f"wrote {stem}.md/.png/.json", flush=True)
    return 0


def setup(args: argparse.Namespace, per_node: int) -> dict[str, Any]:
    """The arguments that shaped the grid, for the JSON."""
    keys = ["dataset", "seeds", "rounds", "small", "large", "nodes", "topology", "model"]
    keys += ["hidden", "schedule", "warmup", "lr_sgd", "lr_momentum", "lr_adam", "lr_lars"]
    return {**{k: getattr(args, k) for k in (*keys, "lr_lamb")}, "per_node": per_node}


if __name__ == "__main__":
    sys.exit(main())
