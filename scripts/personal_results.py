"""Personal models against the shared one under label skew (issue 44's claim (e)): the mean
and the worst peer's accuracy, each peer on its own test set.

D-PSGD on a 4x4 torus of 16 peers, digits under a Dirichlet alpha = 0.1 split, logistic
regression, ``--rounds`` (100) rounds at lr 0.5, ``[personal]`` fine-tuning each peer's final
model for each of ``--steps`` (10) SGD steps at the run's lr on its own training part. The
training is the same whatever the steps (``[personal]`` reads the final models only), so
the shared model's figures are those of every case; each personal row is one ``steps``.
Each peer's test set is the test split weighted by its class mix (a Dirichlet split has no
per-peer test examples of its own; :mod:`fedcore.simulation.personal`).

Written to ``<out>/personal.{md,json}``: per row the mean over ``--seeds`` (0 1 2) of the
mean peer's and of the worst peer's accuracy, and each seed's figures in the JSON. The
runs go through :func:`fedcore.simulation.sweep.run_cases`, as ``fedcore simulate --seeds``
does (one sweep folder per case under ``<out>/runs/personal/``).
:func:`personal_table` is the same for a caller that wants the rows and the table.

Usage::

    python scripts/personal_results.py [--seeds 0 1 2] [--steps 10] [--rounds 100]
        [--nodes 16] [--jobs 2] [--tiny] [--out docs/results]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _results import mean, run_grid

from fedcore.metrics import to_json_text

ROOT = Path(__file__).resolve().parents[1]

FIGURES = ("mean", "worst")


def overrides(nodes: int, rounds: int, steps: int) -> list[str]:
    """The run of one case: ``steps`` fine-tuning steps after ``rounds`` of D-PSGD."""
    return [
        "data.dataset=digits",
        "data.partition=dirichlet",
        "data.alpha=0.1",
        "topology.kind=torus",
        f"topology.nodes={nodes}",
        "algorithm.name=dpsgd",
        "algorithm.lr=0.5",
        "model.name=logreg",
        f"run.rounds={rounds}",
        f"run.eval_every={rounds}",
        "personal.mode=finetune",
        f"personal.steps={steps}",
    ]


def personal_table(
    out: Path,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    steps: Sequence[int] = (10,),
    rounds: int = 100,
    nodes: int = 16,
    jobs: int = 1,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Run the grid into ``out/runs/personal/``; return the rows (the shared model's first,
    then one per ``steps``) and the Markdown table's lines."""
    grid = {f"{k} steps": overrides(nodes, rounds, k) for k in steps}
    records = run_grid(grid, seeds, out / "runs" / "personal", jobs)
    failed = [f"{r['method']}, seed {r['seed']}: {r['failed']}" for r in records if "failed" in r]
    if failed:
        raise RuntimeError("runs failed: " + "; ".join(failed))
    blocks = {(r["method"], r["seed"]): r["summary"]["personal"] for r in records}
    first = f"{steps[0]} steps"
    rows: list[dict[str, Any]] = []
    for label, which, case in [
        ("shared (each peer's final model)", "shared", first),
        *(
            (f"personal ({k} SGD step{'s' * (k != 1)} on its own part)", "personal", f"{k} steps")
            for k in steps
        ),
    ]:
        per_seed = {
            s: {f: blocks[case, s][f"{which}_{f}_accuracy"] for f in FIGURES} for s in seeds
        }
        rows.append(
            {
                "model": label,
                "steps": 0 if which == "shared" else int(case.split()[0]),
                **{f"{f}_accuracy": mean([v[f] for v in per_seed.values()]) for f in FIGURES},
                "seeds": {str(s): v for s, v in per_seed.items()},
            }
        )
    lines = [
        f"D-PSGD, {nodes} peers on a torus, digits with Dirichlet alpha = 0.1, logistic "
        f"regression, {rounds} rounds; each peer on its own test set (the test split by its "
        f"class mix); means over seeds {', '.join(map(str, seeds))}.",
        "",
        "| model | mean peer accuracy | worst peer accuracy |",
        "|---|---:|---:|",
        *(f"| {r['model']} | {r['mean_accuracy']:.4f} | {r['worst_accuracy']:.4f} |" for r in rows),
    ]
    return rows, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", nargs="+", type=int, default=[10])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="4 peers, 3 rounds, seed 0")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args()
    if args.tiny:
        args.nodes, args.rounds, args.seeds = 4, 3, [0]
    rows, lines = personal_table(
        args.out,
        seeds=args.seeds,
        steps=args.steps,
        rounds=args.rounds,
        nodes=args.nodes,
        jobs=args.jobs,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "personal.json").write_text(to_json_text(rows, indent=2) + "\n", encoding="utf-8")
    (args.out / "personal.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
