"""Exact under heterogeneity: what gradient tracking buys, against the rules that stop at a
bias.

Grids, written to ``docs/results/``:

* ``tracking-bias.{md,json,png}`` (claim a): a least-squares problem whose 16 peers each
  hold rows drawn around a far-apart point of their own (strongly heterogeneous), solved
  with a constant step by the rules' own updates (:func:`fedcore.testing.lockstep`, every
  gradient exact, so only the bias is left). The largest distance of any peer's model from
  the minimiser of the sum (solved in closed form) after each round: D-PSGD and push-sum
  SGD (``ops``) settle at a floor that grows with the step, while the tracking rules go to
  the optimum, on an undirected ring and on fedcore's one-way ``social`` digraph.
* ``tracking-speedup.{md,json,png}`` (claim b): Push-Pull on a one-way exponential graph
  of 4 to 32 peers (MNIST-1D, Dirichlet alpha = 1 parts, an MLP, the same batch on every
  peer): the first round at which the average model reaches the target accuracy. More
  peers average more samples a round, so the rounds to the target shrink (``fedcore
  simulate --seeds`` runs, one sweep folder per case under
  ``docs/results/runs/tracking-speedup/``).
* ``tracking-compressed.{md,json,png}`` (claim c): BEER against CHOCO-SGD at the same bytes
  (CHOCO runs twice BEER's rounds: BEER sends two compressed tensors a round), with 1-bit
  sign and top-k, on claim (a)'s least squares and on digits split by Dirichlet 0.1.
* ``tracking-epidemic.{md,json,png}`` (claim d): epidemic learning (``epidemic-oracle``
  with D-PSGD, ``epidemic-local`` with push-sum) against static graphs in which every peer
  sends to as many peers a round, digits split by Dirichlet 0.1: the mean and worst peer.

Claim (e), a personal model per peer, is ``scripts/personal_results.py``.

Usage::

    python scripts/tracking_results.py [--grids bias speedup compressed epidemic]
        [--seeds 0 1 2] [--rounds N] [--targets ...] [--jobs 2] [--tiny] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _results import first_reaching, mean, plot_curves, run_grid

from fedcore.algorithms import make_algorithm
from fedcore.compression import make_codec
from fedcore.metrics import to_json_text
from fedcore.testing import lockstep
from fedcore.topology import Topology, parse_spec

ROOT = Path(__file__).resolve().parents[1]

# Claim (a): the graphs and, on each, the rules that stop at a bias and those that track.
BIAS_GRAPHS: dict[str, tuple[str, ...]] = {
    "ring:16": ("dpsgd", "dsgt", "exact-diffusion"),
    "social:16": ("ops", "push-pull", "push-diging"),
}
FEATURES, ROWS = 10, 20  # each peer's least-squares block: ROWS x FEATURES


def least_squares(
    graph: Topology, seed: int
) -> tuple[Callable[[str, int, torch.Tensor], torch.Tensor], torch.Tensor]:
    """Each peer's gradient of ``||A_i x - b_i||^2 / (2 ROWS)``, ``b_i`` made around a
    point of its own (three times a standard normal), and the minimiser of the sum."""
    gen = torch.Generator().manual_seed(seed)
    blocks: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for node in graph.nodes:
        a = torch.randn(ROWS, FEATURES, generator=gen, dtype=torch.float64)
        own = 3 * torch.randn(FEATURES, generator=gen, dtype=torch.float64)
        noise = 0.1 * torch.randn(ROWS, generator=gen, dtype=torch.float64)
        blocks[node] = (a, a @ own + noise)
    hessian = sum(a.T @ a for a, _ in blocks.values())
    optimum = torch.linalg.solve(hessian, sum(a.T @ b for a, b in blocks.values()))

    def grad(node: str, t: int, x: torch.Tensor) -> torch.Tensor:
        a, b = blocks[node]
        return a.T @ (a @ x - b) / ROWS

    return grad, optimum


def bias_run(
    spec: str,
    algorithm: str,
    lr: float,
    rounds: int,
    seed: int,
    codec: tuple[str, dict[str, Any]] | None = None,
    **options: Any,
) -> list[float]:
    """The largest distance of any peer from the optimum of the sum after each round (every
    peer compressing with ``codec``, a name and its options, if given)."""
    graph = parse_spec(spec)
    grad, optimum = least_squares(graph, seed)
    rule = make_algorithm(algorithm, **options)
    codecs = (
        {v: make_codec(codec[0], seed=i, **codec[1]) for i, v in enumerate(graph.nodes)}
        if codec is not None
        else None
    )
    curve: list[float] = []

    def record(t: int, states: dict[str, Any]) -> None:
        curve.append(max(float((rule.model(s) - optimum).norm()) for s in states.values()))

    zeros = {v: torch.zeros(FEATURES, dtype=torch.float64) for v in graph.nodes}
    lockstep(rule, graph, zeros, rounds=rounds, lr=lr, grad=grad, on_round=record, codecs=codecs)
    return curve


def bias(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Claim (a): each graph's rules at two constant steps, every seed."""
    rounds = args.rounds or (150 if args.tiny else 2000)
    rows: list[dict[str, Any]] = []
    lines = [
        f"| graph | rule | step | distance to the optimum after {rounds} rounds | rounds to 1e-6 |",
        "|---|---|---:|---:|---:|",
    ]
    curves: list[dict[str, Any]] = []
    for spec, rules in BIAS_GRAPHS.items():
        if args.tiny:
            spec = spec.replace(":16", ":8")
        for algorithm in rules:
            for lr in (0.05, 0.02):
                runs = [bias_run(spec, algorithm, lr, rounds, seed) for seed in args.seeds]
                reached = [next((t + 1 for t, d in enumerate(c) if d < 1e-6), None) for c in runs]
                final = [c[-1] for c in runs]
                row = {
                    "graph": spec,
                    "rule": algorithm,
                    "lr": lr,
                    "distance": final,
                    "rounds_to_1e-6": reached,
                    "seeds": args.seeds,
                }
                rows.append(row)
                hit = [r for r in reached if r is not None]
                shown = f"{mean(hit):.0f}" if len(hit) == len(reached) else "never"
                lines.append(f"| {spec} | {algorithm} | {lr:g} | {mean(final):.2e} | {shown} |")
                label = f"{spec} {algorithm} lr {lr:g}"
                evals = [{"round": t, "distance": d} for t, d in enumerate(runs[0])]
                curves.append({"method": label, "seed": args.seeds[0], "evals": evals})
    _write(args.out / "tracking-bias", rows, lines)
    plot_curves(
        curves,
        args.out / "tracking-bias.png",
        x=lambda e: e["round"],
        xlabel="round",
        panels=[("distance", "largest distance to the optimum of the sum", True)],
        title="Gradient tracking against the bias of D-PSGD and push-sum SGD",
    )
    return rows


SPEEDUP = [
    "data.dataset=mnist1d",
    "data.partition=dirichlet",
    "data.alpha=1.0",
    "data.batch_size=4",
    "model.name=mlp",
    "topology.kind=exponential",
    "topology.undirected=false",
    "algorithm.name=push-pull",
    "algorithm.lr=0.3",
    "simulate.engine=vectorized",
]


def speedup(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Claim (b): Push-Pull's rounds to the target accuracy against the number of peers."""
    peers = (4, 16) if args.tiny else (4, 8, 16, 32)
    rounds = args.rounds or (60 if args.tiny else 600)
    targets = args.targets or ([0.2] if args.tiny else [0.4, 0.45, 0.5])
    grid = {
        f"push-pull, {n} peers": [
            *SPEEDUP,
            f"topology.nodes={n}",
            f"run.rounds={rounds}",
            f"run.eval_every={5 if args.tiny else 10}",
        ]
        for n in peers
    }
    records = run_grid(grid, args.seeds, args.out / "runs" / "tracking-speedup", args.jobs)
    rows: list[dict[str, Any]] = []
    heads = " | ".join(f"rounds to {target:g} (each seed; mean)" for target in targets)
    lines = [f"| peers | {heads} | final accuracy |", "|---:|" + "---|" * len(targets) + "---:|"]
    for n, label in zip(peers, grid, strict=True):
        runs = [r for r in records if r["method"] == label and "summary" in r]
        final = [r["summary"]["final"]["avg_model_accuracy"] for r in runs]
        row: dict[str, Any] = {"peers": n, "final": final, "seeds": args.seeds}
        cells = []
        for target in targets:
            hits = [first_reaching(r["evals"], target) for r in runs]
            reached = [h["round"] if h is not None else None for h in hits]  # as summary.json
            row[f"rounds_to_{target:g}"] = reached
            shown = ", ".join("never" if r is None else str(r) for r in reached)
            hit = [r for r in reached if r is not None]
            cells.append(f"{shown}; {mean(hit):.0f}" if len(hit) == len(reached) else shown)
        rows.append(row)
        lines.append(f"| {n} | {' | '.join(cells)} | {mean(final):.4f} |")
    _write(args.out / "tracking-speedup", rows, lines)
    plot_curves(
        records,
        args.out / "tracking-speedup.png",
        x=lambda e: e["round"],
        xlabel="round",
        panels=[("avg_model_accuracy", "average-model accuracy", False)],
        title="Push-Pull on more peers (MNIST-1D, one-way exponential graph)",
    )
    return rows


CODECS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # codec -> its name, its options on digits (64 x 10 weights) and on the least squares
    # (10 unknowns: top-k keeps 3 of them; one of ten diverges for both rules at lr 0.05)
    "sign": ("sign", {}, {}),
    "topk": ("topk", {"ratio": 0.1}, {"ratio": 0.3}),
}
COMPRESSED = [
    "data.dataset=digits",
    "data.partition=dirichlet",
    "data.alpha=0.1",
    "topology.kind=ring",
    "topology.nodes=16",
    "algorithm.lr=0.5",
    "algorithm.gamma=0.5",
    "simulate.engine=vectorized",
]


def compressed(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Claim (c): BEER against CHOCO-SGD at the same bytes. BEER sends two compressed
    tensors a round (the model's and the tracker's differences), CHOCO one, so CHOCO runs
    twice BEER's rounds. Two problems: the least squares of claim (a) on a ring of 16
    (every gradient exact: what is left is each rule's floor), and digits split by
    Dirichlet alpha = 0.1 (16 peers on a ring, logistic regression)."""
    rounds = args.rounds or (40 if args.tiny else 100)  # BEER's; CHOCO runs twice as many
    square = 150 if args.tiny else 1000
    spec = "ring:8" if args.tiny else "ring:16"
    grid: dict[str, list[str]] = {}
    for codec, (name, options, _) in CODECS.items():
        chosen = [
            f"compression.codec={name}",
            *(f"compression.{k}={v}" for k, v in options.items()),
        ]
        for rule, factor in (("beer", 1), ("choco", 2)):
            grid[f"{rule}, {codec}"] = [
                *COMPRESSED,
                *chosen,
                f"algorithm.name={rule}",
                f"run.rounds={factor * rounds}",
                f"run.eval_every={factor * max(1, rounds // 4)}",
            ]
    records = run_grid(grid, args.seeds, args.out / "runs" / "tracking-compressed", args.jobs)
    rows: list[dict[str, Any]] = []
    lines = [
        f"| codec | rule | rounds | bytes a peer | least squares at equal bytes ({square} BEER "
        "rounds): distance to the optimum | avg-model accuracy | mean peer | worst peer |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label in grid:
        rule, codec = label.split(", ")
        factor = 1 if rule == "beer" else 2
        runs = [r for r in records if r["method"] == label and "summary" in r]
        final = {
            key: [r["summary"]["final"][key] for r in runs]
            for key in ("avg_model_accuracy", "mean_node_accuracy", "min_node_accuracy")
        }
        sent = [r["evals"][-1]["bytes_sent_per_node"] for r in runs]
        squares = (CODECS[codec][0], CODECS[codec][2])
        distance = [
            bias_run(spec, rule, 0.05, factor * square, seed, squares, gamma=0.5)[-1]
            for seed in args.seeds
        ]
        rows.append(
            {"codec": codec, "rule": rule, "rounds": factor * rounds, "bytes_per_peer": sent}
            | {"least_squares_distance": distance, **final, "seeds": args.seeds}
        )
        lines.append(
            f"| {codec} | {rule} | {factor * rounds} | {mean(sent):,.0f} | {mean(distance):.2e} | "
            + " | ".join(f"{mean(v):.4f}" for v in final.values())
            + " |"
        )
    _write(args.out / "tracking-compressed", rows, lines)
    plot_curves(
        records,
        args.out / "tracking-compressed.png",
        x=lambda e: e["bytes_sent_per_node"],
        xlabel="bytes sent a peer",
        panels=[
            ("avg_model_accuracy", "average-model accuracy", False),
            ("mean_node_accuracy", "mean peer accuracy", False),
        ],
        title="BEER against CHOCO-SGD at equal bytes (digits, Dirichlet 0.1)",
    )
    return rows


EPIDEMIC = [
    "data.dataset=digits",
    "data.partition=dirichlet",
    "data.alpha=0.1",
    "topology.nodes=16",
    "simulate.engine=vectorized",
]
# label -> the graph and the rule: each epidemic schedule beside a static graph in which
# every peer sends to as many peers a round (the same bytes).
EPIDEMIC_CASES: dict[str, list[str]] = {
    "dpsgd, epidemic-oracle s=2": ["topology.kind=epidemic-oracle", "topology.degree=2"],
    "dpsgd, ring (static, 2 a round)": ["topology.kind=ring"],
    "dpsgd, epidemic-oracle s=4": ["topology.kind=epidemic-oracle", "topology.degree=4"],
    "dpsgd, random-regular d=4 (static)": ["topology.kind=random-regular", "topology.degree=4"],
    "ops, epidemic-local s=2": ["topology.kind=epidemic-local", "topology.degree=2"],
    "ops, ring (static, 2 a round)": ["topology.kind=ring"],
}


def epidemic(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Claim (d): epidemic learning against a static graph of the same degree, at equal
    bytes: every peer sends to ``s`` peers a round either way, drawn afresh each round
    (``epidemic-oracle``: an ``s``-regular graph; ``epidemic-local``: each peer's own
    draw, with push-sum) or fixed. Digits split by Dirichlet alpha = 0.1, 16 peers."""
    rounds = args.rounds or (20 if args.tiny else 60)
    every = max(1, rounds // 6)
    grid = {
        label: [
            *EPIDEMIC,
            *graph,
            f"algorithm.name={label.split(',')[0]}",
            f"run.rounds={rounds}",
            f"run.eval_every={every}",
        ]
        for label, graph in EPIDEMIC_CASES.items()
    }
    records = run_grid(grid, args.seeds, args.out / "runs" / "tracking-epidemic", args.jobs)
    early = every * 2
    rows: list[dict[str, Any]] = []
    lines = [
        f"| case | bytes a peer a round | mean peer, round {early} | worst peer, round {early} "
        f"| mean peer, round {rounds} | worst peer, round {rounds} | consensus distance |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label in grid:
        runs = [r for r in records if r["method"] == label and "summary" in r]
        at = [next(e for e in r["evals"] if e["round"] + 1 >= early) for r in runs]
        last = [r["evals"][-1] for r in runs]
        row = {
            "case": label,
            "bytes_per_round": [e["bytes_sent_per_node"] / (e["round"] + 1) for e in last],
            "early_mean": [e["mean_node_accuracy"] for e in at],
            "early_worst": [e["min_node_accuracy"] for e in at],
            "mean": [e["mean_node_accuracy"] for e in last],
            "worst": [e["min_node_accuracy"] for e in last],
            "consensus_distance": [e["consensus_distance"] for e in last],
            "seeds": args.seeds,
        }
        rows.append(row)
        figures = [row[k] for k in ("early_mean", "early_worst", "mean", "worst")]
        lines.append(
            f"| {label} | {mean(row['bytes_per_round']):,.0f} | "
            + " | ".join(f"{mean(v):.4f}" for v in figures)
            + f" | {mean(row['consensus_distance']):.3f} |"
        )
    _write(args.out / "tracking-epidemic", rows, lines)
    plot_curves(
        records,
        args.out / "tracking-epidemic.png",
        x=lambda e: e["round"] + 1,
        xlabel="round",
        panels=[
            ("mean_node_accuracy", "mean peer accuracy", False),
            ("min_node_accuracy", "worst peer accuracy", False),
        ],
        title="Epidemic learning against static graphs of the same degree (digits, Dirichlet 0.1)",
    )
    return rows


GRIDS: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]]] = {
    "bias": bias,
    "speedup": speedup,
    "compressed": compressed,
    "epidemic": epidemic,
}


def _write(stem: Path, rows: list[dict[str, Any]], lines: list[str]) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(to_json_text(rows, indent=2) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"## {stem.name}\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grids", nargs="+", choices=list(GRIDS), default=list(GRIDS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=0, help="0: each grid's default")
    parser.add_argument("--targets", nargs="+", type=float, help="the speed-up's accuracies")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="CI size: few rounds, seed 0")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    if args.tiny:
        args.seeds = [0]
    torch.set_num_threads(1)
    for name in args.grids:
        GRIDS[name](args)


if __name__ == "__main__":
    sys.exit(main())
