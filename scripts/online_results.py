"""Online learning, measured by regret: the OPS paper's and the DOG paper's claims.

* ``--experiment ops`` (``examples/online-ops.toml``): a one-way social trust graph of 64
  peers with non-iid synthetic streams; OPS (push-sum de-biased), DOL (the same graph
  without de-biasing), COL (``central``) and LOCAL. Average static regret over rounds.
* ``--experiment dog`` (``examples/online-dog.toml``): DOG against COL and LOCAL as the
  stochastic component sigma grows and as the adversarial component G grows (communication
  should help the first, not the second), then DOG across topologies of different spectral
  gap (ring, torus, exponential made undirected, complete), with rho = 1 - gap beside the
  regret.

Writes ``docs/results/online-<experiment>.{md,json,png}``; means over ``--seeds``, each
case a seed sweep (``fedcore.simulation.sweep``) in ``docs/results/runs/<part>/<case>/``.

Usage::

    python scripts/online_results.py --experiment ops dog [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from _results import finals, mean, plot_curves, run_grid

from fedcore.config import TopologyConfig
from fedcore.metrics import to_json_text
from fedcore.setup.graph import build_topology
from fedcore.topology import prepare, spectral_gap

ROOT = Path(__file__).resolve().parents[1]
OPS_CONFIG = ROOT / "examples" / "online-ops.toml"
DOG_CONFIG = ROOT / "examples" / "online-dog.toml"


def _regret(runs: list[dict[str, Any]], label: str, key: str) -> float | None:
    values = [
        r["summary"]["final"].get(key) for r in runs if r["method"] == label and "summary" in r
    ]
    values = [v for v in values if v is not None]
    return mean(values) if values else None


def _fmt(value: float | None, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def table(
    runs: list[dict[str, Any]], labels: list[str], extra: dict[str, str] | None = None
) -> str:
    """Final average loss, average static and dynamic regret and accuracy, per case."""
    head = (
        "| case | average loss | avg static regret | avg dynamic regret "
        "| avg-model acc | mean node acc |"
    )
    if extra:
        head += " rho |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for label in labels:
        row = (
            f"| {label} | {_fmt(_regret(runs, label, 'average_loss'))} "
            f"| {_fmt(_regret(runs, label, 'average_static_regret'))} "
            f"| {_fmt(_regret(runs, label, 'average_dynamic_regret'))} "
            f"| {_fmt(mean(finals(runs, label, 'avg_model_accuracy') or [float('nan')]))} "
            f"| {_fmt(mean(finals(runs, label, 'mean_node_accuracy') or [float('nan')]))} |"
        )
        if extra:
            row += f" {extra.get(label, '')} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def regret_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs with their regret records as the curves to plot."""
    return [{**r, "evals": r["summary"]["regret"]} if "summary" in r else r for r in runs]


def ops_experiment(args: argparse.Namespace) -> str:
    cases = {
        "OPS (push-sum)": ["algorithm.name=ops"],
        "DOL (no de-biasing)": ["algorithm.name=dol"],
        "COL (central)": ["algorithm.name=central"],
        "LOCAL": ["algorithm.name=local"],
    }
    runs = run_grid(cases, args.seeds, args.out / "runs" / "ops", args.jobs, OPS_CONFIG)
    title = "online logreg, directed social-64, synthetic non-iid streams (G 2, sigma 1, M 0)"
    plot_curves(
        regret_runs(runs),
        args.out / "online-ops.png",
        x=lambda e: e["round"] + 1,
        xlabel="round",
        panels=[("average_static_regret", "average static regret R_t / (n t)", False)],
        title=title,
    )
    text = f"### {title}, seeds {args.seeds}\n\n" + table(runs, list(cases))
    _dump(args.out / "online-ops", text, runs)
    return text


def dog_experiment(args: argparse.Namespace) -> str:
    methods = {
        "DOG": ["algorithm.name=dog"],
        "COL": ["algorithm.name=central"],
        "LOCAL": ["algorithm.name=local"],
    }
    parts = []
    for knob, values, name in (
        ("data.noise", (0.5, 1.0, 2.0, 4.0), "sigma"),
        ("data.adversarial", (0.5, 1.0, 2.0, 4.0), "G"),
    ):
        cases = {
            f"{m}, {name}={v}": [*o, f"{knob}={v}"] for v in values for m, o in methods.items()
        }
        runs = run_grid(cases, args.seeds, args.out / "runs" / f"dog-{name}", args.jobs, DOG_CONFIG)
        parts.append(
            f"### DOG, COL and LOCAL as {name} grows (ring-16, M 4), seeds {args.seeds}\n\n"
        )
        parts.append(table(runs, list(cases)) + "\n")
        gaps = []
        for v in values:
            local = _regret(runs, f"LOCAL, {name}={v}", "average_static_regret")
            dog = _regret(runs, f"DOG, {name}={v}", "average_static_regret")
            if local is not None and dog is not None:
                gaps.append(f"{name}={v}: {local - dog:+.4f}")
        parts.append(f"LOCAL minus DOG, average static regret: {'; '.join(gaps)}\n\n")
        (args.out / "online-dog.md").write_text("".join(parts), encoding="utf-8")  # so far
    cases = {}
    rhos = {}
    for kind in ("ring", "torus", "exponential", "complete"):
        label = f"DOG, {kind}-16"
        cases[label] = ["algorithm.name=dog", f"topology.kind={kind}", "topology.undirected=true"]
        graph = prepare(
            build_topology(TopologyConfig(kind=kind, nodes=16, undirected=True)),
            mixing="doubly-stochastic",
            algorithm="dog",
        )
        rhos[label] = f"{1 - spectral_gap(graph):.3f}"
    runs = run_grid(cases, args.seeds, args.out / "runs" / "dog-topo", args.jobs, DOG_CONFIG)
    parts.append(f"### DOG across topologies (sigma 1, G 1, M 4), seeds {args.seeds}\n\n")
    parts.append(table(runs, list(cases), rhos))
    plot_curves(
        regret_runs(runs),
        args.out / "online-dog.png",
        x=lambda e: e["round"] + 1,
        xlabel="round",
        panels=[
            ("average_static_regret", "average static regret", False),
            ("average_dynamic_regret", "average dynamic regret", False),
        ],
        title="DOG across topologies, ring-16 synthetic stream (G 1, sigma 1, M 4)",
    )
    text = "".join(parts)
    _dump(args.out / "online-dog", text, runs)
    return text


def _dump(stem: Path, text: str, runs: list[dict[str, Any]]) -> None:
    stem.with_suffix(".md").write_text(text, encoding="utf-8")
    slim = [
        {"method": r["method"], "seed": r["seed"], "final": r["summary"]["final"]}
        if "summary" in r
        else r
        for r in runs
    ]
    stem.with_suffix(".json").write_text(to_json_text(slim, indent=1), encoding="utf-8")
    print(text, flush=True)
    print(f"wrote {stem}.md/.png/.json", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", nargs="+", choices=("ops", "dog"), default=["ops", "dog"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (1 thread each)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if "ops" in args.experiment:
        ops_experiment(args)
    if "dog" in args.experiment:
        dog_experiment(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
