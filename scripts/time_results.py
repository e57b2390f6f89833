"""Asynchronous against synchronous training in virtual time (issue 29's claims).

Runs, as seed sweeps on the same data split, each asynchronous method beside its
synchronous counterpart (AD-PSGD / D-PSGD on a ring, asynchronous push-sum / OPS on a
directed exponential graph, FedBuff and FedAsync / FedAvg on a star), under two ``[time]``
settings, and writes ``docs/results/time-<dataset>.{md,json,png}``:

* **homogeneous**: every local step takes ``step_s``, links are instant: (a) each
  asynchronous method should match its synchronous counterpart per gradient step (the
  accuracy after the same number of steps);
* **heavy-tailed**: 10% of the peers 10x slower and every step lognormal: (b) AD-PSGD and
  asynchronous push-sum should reach the target accuracy in less virtual time than D-PSGD
  and OPS, and (c) FedBuff in less than FedAvg.

A "round" of an asynchronous run is one gradient step per worker on average (the event
engine's records), so every method takes the same number of gradient steps. The table
gives, per setting and method, the average model's final accuracy, the virtual seconds of
the whole run, the virtual seconds to the target accuracy, and each asynchronous method's
ratio to its counterpart (above 1: the asynchronous method got there sooner). A method
that never reaches the target, or diverges, is reported as such.

Usage::

    python scripts/time_results.py                       # digits, 16 peers, seeds 0 1
    python scripts/time_results.py --tiny --out /tmp/t   # a CI-sized grid
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from _results import mean, plot_curves, run_grid

from fedcore.algorithms import ALGORITHMS
from fedcore.metrics import to_json_text

ROOT = Path(__file__).resolve().parents[1]

PAIRS: dict[str, tuple[str, list[str], str, list[str]]] = {
    # label: (synchronous name, its overrides, asynchronous name, its overrides)
    "gossip": (
        "D-PSGD",
        ["algorithm.name=dpsgd", "topology.kind=ring", "topology.undirected=true"],
        "AD-PSGD",
        ["algorithm.name=adpsgd", "topology.kind=ring", "topology.undirected=true"],
    ),
    "push-sum": (
        "OPS",
        ["algorithm.name=ops", "topology.kind=exponential"],
        "async push-sum",
        ["algorithm.name=async-push-sum", "topology.kind=exponential"],
    ),
    "server": (
        "FedAvg",
        ["algorithm.name=fedavg", "topology.kind=star"],
        "FedBuff",
        ["algorithm.name=fedbuff", "topology.kind=star"],
    ),
}
EXTRA: dict[str, list[tuple[str, list[str]]]] = {
    "gossip": [
        (
            "D-PSGD, deadline",
            [
                "algorithm.name=dpsgd",
                "topology.kind=ring",
                "topology.undirected=true",
                "transport.mode=deadline",
            ],
        )
    ],
    "server": [("FedAsync", ["algorithm.name=fedasync", "topology.kind=star"])],
}
"""Baselines beside a pair: synchronous D-PSGD that stops waiting at a virtual deadline (of
twice a step), and FedAsync, FedBuff's own baseline."""

SETTINGS: dict[str, list[str]] = {
    "homogeneous": ["time.compute='fixed'"],
    "heavy-tailed": [
        "time.compute='lognormal'",
        "time.sigma=0.5",
        "time.slow_fraction=0.1",
        "time.slow_factor=10.0",
    ],
}


def cases(args: argparse.Namespace) -> dict[str, tuple[str, str, str, list[str]]]:
    """Case label -> (setting, pair, method, overrides)."""
    out: dict[str, tuple[str, str, str, list[str]]] = {}
    for setting, timing in SETTINGS.items():
        for pair, (sync, sync_set, asyn, async_set) in PAIRS.items():
            methods = [(sync, sync_set), (asyn, async_set), *EXTRA.get(pair, [])]
            for method, overrides in methods:
                if _algorithm(overrides) not in ALGORITHMS:
                    continue  # not registered (yet): left out of the grid
                extra = [f"transport.deadline_s={2 * args.step_s}"]
                label = f"{setting}: {method}"
                out[label] = (setting, pair, method, [*overrides, *timing, *extra])
    return out


def _algorithm(overrides: list[str]) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.startswith("algorithm.name="))


def base(args: argparse.Namespace) -> list[str]:
    """What every run shares."""
    return [
        f"data.dataset={args.dataset}",
        "data.partition=iid",
        f"model.name={args.model}",
        f"topology.nodes={args.nodes}",
        f"run.rounds={args.rounds}",
        f"run.eval_every={max(1, args.rounds // 10)}",
        f"run.target_accuracy={args.target}",
        f"algorithm.lr={args.lr}",
        f"time.step_s={args.step_s}",
        f"time.latency_s={args.latency_s}",
    ]


def _ratio(sync: float | None, asyn: float | None) -> float | None:
    if sync is None or asyn is None or asyn <= 0:
        return None
    return sync / asyn


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, spec)
    )


def report(
    runs: list[dict[str, Any]], grid: dict[str, tuple[str, str, str, list[str]]], args: Any
) -> tuple[str, list[dict[str, Any]]]:
    """The markdown tables (one per setting) and the rows."""
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"### {args.dataset}, {args.model}, {args.nodes} peers, {args.rounds} rounds (gradient "
        f"steps a peer), step {args.step_s} s, latency {args.latency_s} s, target "
        f"{args.target}, seeds {seeds}",
        "",
    ]
    rows: list[dict[str, Any]] = []
    for label, (setting, pair, method, _) in grid.items():
        mine = [r for r in runs if r["method"] == label]
        done = [r for r in mine if "summary" in r]
        row: dict[str, Any] = {"case": label, "setting": setting, "pair": pair, "method": method}
        if len(done) < len(mine) or not done:
            row["failed"] = next((r["failed"] for r in mine if "failed" in r), "no run")[:80]
            rows.append(row)
            continue
        hits = [r["summary"].get("time_to_target") for r in done]
        reached = [h["vtime"] for h in hits if h is not None]
        row.update(
            accuracy=mean([r["summary"]["final"]["avg_model_accuracy"] for r in done]),
            virtual_seconds=mean([r["summary"]["time"]["virtual_seconds"] for r in done]),
            to_target=mean(reached) if len(reached) == len(done) else None,
            reached=f"{len(reached)}/{len(done)}",
            engine=done[0]["summary"]["engine"],
        )
        rows.append(row)
    by = {(r["setting"], r["method"]): r for r in rows}
    for setting in SETTINGS:
        lines += [
            f"**{setting}**",
            "",
            "| method | engine | final accuracy | virtual s (run) | virtual s to target | "
            "counterpart / this (to target) |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for pair, (sync, _, asyn, _) in PAIRS.items():
            methods = [sync, asyn, *(m for m, _ in EXTRA.get(pair, []))]
            for method in methods:
                row = by.get((setting, method))
                if row is None:
                    continue  # not in the grid
                if "failed" in row:
                    lines.append(f"| {method} | | failed: {row['failed']} | | | |")
                    continue
                ratio = None
                if method != sync and "failed" not in by.get((setting, sync), {"failed": 1}):
                    ratio = _ratio(by[(setting, sync)].get("to_target"), row.get("to_target"))
                    row["speedup_to_target"] = ratio
                target = row["to_target"]
                reached = _fmt(target, ".1f") if target is not None else "not reached"
                if target is None:
                    reached += f" ({row['reached']})"
                lines.append(
                    f"| {method} | {row['engine']} | {_fmt(row['accuracy'])} | "
                    f"{_fmt(row['virtual_seconds'], '.1f')} | "
                    f"{reached} | "
                    f"{_fmt(ratio, '.2f') + 'x' if ratio is not None else '-'} |"
                )
        lines.append("")
    return "\n".join(lines), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--model", default="logreg")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--latency-s", type=float, default=0.01)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="a CI-sized grid: 8 peers, 30 rounds")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = parser.parse_args()
    if args.tiny:
        args.nodes, args.rounds, args.seeds, args.target = 8, 30, [0], 0.8
    out = Path(args.out)
    grid = cases(args)
    shared = base(args)
    runs = run_grid(
        {label: [*shared, *overrides] for label, (_, _, _, overrides) in grid.items()},
        args.seeds,
        out / "runs" / f"time-{args.dataset}",
        args.jobs,
    )
    text, rows = report(runs, grid, args)
    stem = out / f"time-{args.dataset}"
    out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    stem.with_suffix(".json").write_text(to_json_text(rows, indent=2) + "\n", encoding="utf-8")
    done = [r for r in runs if "summary" in r and r["method"].startswith("heavy-tailed")]
    if done:
        plot_curves(
            done,
            stem.with_suffix(".png"),
            x=lambda e: float(e.get("vtime", math.nan)),
            xlabel="virtual seconds",
            panels=[("avg_model_accuracy", "average model accuracy", False)],
            title=f"heavy-tailed compute: asynchronous against synchronous, {args.dataset}",
        )
    print(text)
    print(f"wrote {stem}.md, .json, .png", file=sys.stderr)


if __name__ == "__main__":
    main()
