"""Peers that lie: what each algorithm keeps of the honest peers' accuracy under attack.

Grids, each run as seed sweeps (``fedcore.simulation.sweep``, as ``fedcore simulate --seeds``
does; one sweep folder per case under ``docs/results/runs/byzantine-<grid>/``), written to
``docs/results/``:

* ``byzantine-push-sum.{md,json,png}``: directed push-sum on the social digraph (16 peers,
  one-way trust), plain ``ops`` against ``clipped-push-sum``, with no attack and under
  ``signflip``, ``alie``, ``ipm``, ``inflate`` and ``withhold`` by ``--liars`` Byzantine
  peers (chosen by keyed hashes of the seed): the honest peers' mean accuracy, worst peer
  and average model. A run that stops (a lie drove an honest peer's push-sum weight out of
  range, which a real peer refuses) is reported as failed with the round it reached.

* ``byzantine-gossip.{md,json,png}``: gossip on an undirected torus of 16 (in-degree 4),
  plain D-PSGD against self-centered clipping (``clippedgossip``), the coordinate-wise
  trimmed mean and median of the in-neighbours, with no attack and under ``alie``, ``ipm``
  and ``dissensus`` by ``--liars`` Byzantine peers; and the same four with no attack on the
  non-IID dumbbell (``topologies/dumbbell-16.json``: two cliques of 8 and one bridge,
  ``data.partition = "sorted"``, so each clique holds half the classes).
* ``byzantine-star.{md,json,png}``: FedAvg's server (``topology.kind = "star"``, 10 workers,
  all of them every round) with each aggregator, under ByzFL's protocol shape: ``f`` in 1-4
  Byzantine workers, the worst case over sign flipping (the negated mean honest update,
  ``ipm`` with epsilon 1), IPM (epsilon 0.1) and ALIE (``z_max``); the server model's
  accuracy, per ``f``.

The figures are the honest peers' alone (``[adversary]`` leaves the liars out). Means over
``--seeds``; plots show the first seed.

Usage::

    python scripts/byzantine_results.py [--grids gossip push-sum star] [--seeds 0 1 2] \\
        [--rounds 200] [--tiny]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _results import finals, mean, plot_curves, run_grid

from fedcore.metrics import to_json_text

ROOT = Path(__file__).resolve().parents[1]

DATA = ["data.dataset=digits", "data.partition=dirichlet", "data.alpha=1.0"]
ATTACKS: dict[str, list[str]] = {
    "no attack": ["adversary.peers=[]"],
    "signflip": ["adversary.attack=signflip", "adversary.scale=4"],
    "alie": ["adversary.attack=alie"],
    "ipm": ["adversary.attack=ipm", "adversary.epsilon=2"],
    "inflate": ["adversary.attack=inflate", "adversary.scale=50"],
    "withhold": ["adversary.attack=withhold", "adversary.scale=0.01"],
}
PUSH_SUM = ("ops", "clipped-push-sum")


TINY_ATTACKS = ("no attack", "inflate", "withhold")
"""``--tiny``: the weight attacks, which push-sum's clipping must stop at any size."""


def push_sum_cases(args: argparse.Namespace) -> dict[str, list[str]]:
    liars = [f"adversary.fraction={args.liars / 16}"]
    attacks = {k: v for k, v in ATTACKS.items() if not args.tiny or k in TINY_ATTACKS}
    return {
        f"{algorithm}, {attack}": [
            *DATA,
            f"algorithm.name={algorithm}",
            f"algorithm.lr={args.lr}",
            "topology.kind=social",
            "topology.nodes=16",
            f"run.rounds={args.rounds}",
            f"run.eval_every={max(1, args.rounds // 20)}",
            *([] if attack == "no attack" else liars),
            *extra,
        ]
        for algorithm in PUSH_SUM
        for attack, extra in attacks.items()
    }


GOSSIP: dict[str, list[str]] = {
    "dpsgd": ["algorithm.name=dpsgd"],
    "clippedgossip": ["algorithm.name=clippedgossip"],
    "trimmed-gossip": ["algorithm.name=trimmed-gossip", "algorithm.trim=1"],
    "median-gossip": ["algorithm.name=median-gossip"],
}
GOSSIP_ATTACKS: dict[str, list[str]] = {
    "alie": ["adversary.attack=alie"],
    "ipm": ["adversary.attack=ipm", "adversary.epsilon=2"],
    "dissensus": ["adversary.attack=dissensus"],
}
DUMBBELL = ROOT / "topologies" / "dumbbell-16.json"


def gossip_cases(args: argparse.Namespace) -> dict[str, list[str]]:
    rounds = [f"run.rounds={args.rounds}", f"run.eval_every={max(1, args.rounds // 20)}"]
    torus = [*DATA, "topology.kind=torus", "topology.nodes=16", f"algorithm.lr={args.lr}"]
    dumbbell = [
        "data.dataset=digits",
        "data.partition=sorted",
        f"topology.file={DUMBBELL}",
        f"algorithm.lr={args.lr}",
    ]
    liars = [f"adversary.fraction={args.liars / 16}"]
    attacks = {k: v for k, v in GOSSIP_ATTACKS.items() if not args.tiny or k == "dissensus"}
    cases: dict[str, list[str]] = {}
    for name, rule in GOSSIP.items():
        cases[f"torus, {name}, no attack"] = [*torus, *rule, *rounds]
        for attack, lie in attacks.items():
            cases[f"torus, {name}, {attack}"] = [*torus, *rule, *rounds, *liars, *lie]
        # A fixed radius at the bridge (the authors' dumbbell runs fix it): the adaptive
        # one clips the farthest neighbour, and across the bridge that is an honest one.
        radius = ["algorithm.tau=1.0"] if name == "clippedgossip" else []
        cases[f"dumbbell, {name}, no attack"] = [*dumbbell, *rule, *radius, *rounds]
    return cases


AGGREGATORS: dict[str, list[str]] = {
    "mean": [],
    "krum": ["algorithm.aggregator=krum"],
    "trimmed-mean": ["algorithm.aggregator=trimmed-mean"],
    "median": ["algorithm.aggregator=median"],
    "geomed": ["algorithm.aggregator=geomed"],
    "centered-clipping": ["algorithm.aggregator=centered-clipping", "algorithm.tau=1.0"],
}
STAR_ATTACKS: dict[str, list[str]] = {
    "sign flip": ["adversary.attack=ipm", "adversary.epsilon=1"],
    "ipm": ["adversary.attack=ipm", "adversary.epsilon=0.1"],
    "alie": ["adversary.attack=alie"],
}


def star_cases(args: argparse.Namespace) -> dict[str, list[str]]:
    base = [
        *DATA,
        "algorithm.name=fedavg",
        "algorithm.fraction=1.0",
        f"algorithm.lr={args.star_lr}",
        "topology.kind=star",
        "topology.nodes=10",
        f"run.rounds={args.rounds}",
        f"run.eval_every={max(1, args.rounds // 20)}",
    ]
    aggregators = {k: v for k, v in AGGREGATORS.items() if not args.tiny or k in TINY_STAR}
    fs = (2,) if args.tiny else (1, 2, 3, 4)
    attacks = {k: v for k, v in STAR_ATTACKS.items() if not args.tiny or k == "sign flip"}
    cases: dict[str, list[str]] = {}
    for name, extra in aggregators.items():
        cases[f"{name}, no attack"] = [*base, *extra]
        for f in fs:
            rule_f = [] if name == "mean" else [f"algorithm.f={f}"]
            for attack, lie in attacks.items():
                cases[f"{name}, f={f}, {attack}"] = [
                    *base,
                    *extra,
                    *rule_f,
                    f"adversary.fraction={f / 10}",
                    *lie,
                ]
    return cases


TINY_STAR = ("mean", "median", "krum")
"""``--tiny``: the average and two rules that must survive two sign-flipping workers."""


def star_report(title: str, runs: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """A row per aggregator: the server model's accuracy with no attack, and for each
    ``f`` the worst case over the attacks (mean over seeds; which attack was worst)."""
    labels = list(dict.fromkeys(r["method"] for r in runs))
    names = list(dict.fromkeys(label.split(", ")[0] for label in labels))
    fs = sorted({int(label.split("f=")[1].split(",")[0]) for label in labels if "f=" in label})
    seeds = sorted({r["seed"] for r in runs})
    head = " | ".join(f"f = {f}: worst (attack)" for f in fs)
    lines = [
        f"### {title}, seeds {seeds}",
        "",
        f"| aggregator | no attack | {head} |",
        "|---|---:|" + "---:|" * len(fs),
    ]
    rows = []
    for name in names:
        clean = finals(runs, f"{name}, no attack", "avg_model_accuracy")
        row: dict[str, Any] = {"aggregator": name, "no_attack": clean, "worst": {}}
        cells = [_fmt(clean)]
        for f in fs:
            options = [label for label in labels if label.startswith(f"{name}, f={f},")]
            scored = []
            for label in options:
                accs = finals(runs, label, "avg_model_accuracy")
                failed = [r["failed"] for r in runs if r["method"] == label and "failed" in r]
                if failed and not accs:
                    scored.append((-1.0, label, failed[0]))
                else:
                    scored.append((mean(accs), label, ""))
            worst = min(scored)
            attack = worst[1].split(", ")[-1]
            if worst[0] < 0:
                cells.append(f"refused: {worst[2][:60]}")
                row["worst"][f] = {"refused": worst[2]}
            else:
                cells.append(f"{worst[0]:.3f} ({attack})")
                row["worst"][f] = {"accuracy": worst[0], "attack": attack}
        rows.append(row)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", rows


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    spread = f" ({min(values):.3f}-{max(values):.3f})" if len(values) > 1 else ""
    return f"{mean(values):.3f}{spread}"


def report(title: str, runs: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """A row per case: the honest peers' mean and worst accuracy and the average model's
    (mean, min-max over seeds), and the seeds that failed with why."""
    labels = list(dict.fromkeys(r["method"] for r in runs))
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"### {title}, seeds {seeds}",
        "",
        "| algorithm, attack | honest mean acc | honest worst acc | honest avg-model acc "
        "| failed seeds |",
        "|---|---:|---:|---:|---|",
    ]
    rows = []
    for label in labels:
        node = finals(runs, label, "mean_node_accuracy")
        worst = finals(runs, label, "min_node_accuracy")
        avg = finals(runs, label, "avg_model_accuracy")
        failed = [r["failed"] for r in runs if r["method"] == label and "failed" in r]
        rows.append(
            {
                "case": label,
                "mean_node_accuracy": node,
                "min_node_accuracy": worst,
                "avg_model_accuracy": avg,
                "failed": failed,
            }
        )
        why = f"{len(failed)}: {failed[0][:90]}" if failed else ""
        lines.append(f"| {label} | {_fmt(node)} | {_fmt(worst)} | {_fmt(avg)} | {why} |")
    return "\n".join(lines) + "\n", rows


def write(
    stem: Path,
    table: str,
    rows: list,
    runs: list[dict[str, Any]],
    title: str,
    server: bool = False,
) -> None:
    stem.with_suffix(".md").write_text(table, encoding="utf-8")
    stem.with_suffix(".json").write_text(to_json_text(rows, indent=1), encoding="utf-8")
    panels = (
        [("avg_model_accuracy", "server model's accuracy", False)]
        if server
        else [
            ("mean_node_accuracy", "honest peers' mean accuracy", False),
            ("min_node_accuracy", "worst honest peer's accuracy", False),
        ]
    )
    shown = [r for r in runs if not server or "f=2" in r["method"] or "no attack" in r["method"]]
    plot_curves(
        shown,
        stem.with_suffix(".png"),
        x=lambda e: e["round"] + 1,
        xlabel="round",
        panels=panels,
        title=title,
    )
    print(table, flush=True)
    print(f"wrote {stem}.md/.png/.json", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--grids",
        nargs="+",
        choices=("gossip", "push-sum", "star"),
        default=["gossip", "push-sum", "star"],
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--liars", type=int, default=2, help="Byzantine peers of the 16")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--star-lr", type=float, default=0.3)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--tiny", action="store_true", help="CI size: 1 seed, 40 rounds")
    args = parser.parse_args(argv)
    if args.tiny:
        args.seeds, args.rounds = [0], 40
    args.out.mkdir(parents=True, exist_ok=True)
    if "gossip" in args.grids:
        out = args.out / "runs" / "byzantine-gossip"
        runs = run_grid(gossip_cases(args), args.seeds, out, args.jobs)
        title = (
            f"Gossip under attack: digits logreg, torus of 16 ({args.liars} Byzantine, "
            f"Dirichlet 1.0) and the non-IID dumbbell, {args.rounds} rounds, lr {args.lr}"
        )
        table, rows = report(title, runs)
        write(args.out / "byzantine-gossip", table, rows, runs, title)
    if "push-sum" in args.grids:
        runs = run_grid(
            push_sum_cases(args), args.seeds, args.out / "runs" / "byzantine-push-sum", args.jobs
        )
        title = (
            f"Directed push-sum under attack: digits logreg, social digraph of 16, "
            f"{args.liars} Byzantine, Dirichlet 1.0, {args.rounds} rounds, lr {args.lr}"
        )
        table, rows = report(title, runs)
        write(args.out / "byzantine-push-sum", table, rows, runs, title)
    if "star" in args.grids:
        out = args.out / "runs" / "byzantine-star"
        runs = run_grid(star_cases(args), args.seeds, out, args.jobs)
        title = (
            f"FedAvg's server under attack: digits logreg, 10 workers (all each round), "
            f"Dirichlet 1.0, {args.rounds} rounds, lr {args.star_lr}"
        )
        table, rows = star_report(title, runs)
        write(args.out / "byzantine-star", table, rows, runs, title, server=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
