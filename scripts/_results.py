"""What the results scripts share: one simulate run per job, in parallel, and plots.

Imported by the scripts beside it (``python scripts/<name>.py`` puts this folder first on
``sys.path``); not part of the fedcore package.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from fedcore.config import load_config
from fedcore.errors import FedcoreError
from fedcore.runners.simulate import simulate

Job = tuple[str, int, list[str], Path] | tuple[str, int, list[str], Path, Path]
"""(label, seed, --set overrides, run folder[, config file the overrides apply to])."""


def run_job(job: Job) -> dict[str, Any]:
    """One simulate run on one thread; a diverged method is a finding, recorded as failed."""
    label, seed, overrides, out = job[:4]
    base = job[4] if len(job) > 4 else None
    torch.set_num_threads(1)
    config = load_config(base, [*overrides, f"run.seed={seed}"])
    try:
        summary = simulate(config, out_dir=out, show_progress=False)
    except FedcoreError as exc:
        print(f"{label:34s} seed {seed} FAILED: {exc}", flush=True)
        return {"method": label, "seed": seed, "failed": str(exc)}
    evals = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if '"kind":"eval"' in line
    ]
    final = summary["final"]
    print(
        f"{label:34s} seed {seed} avg {final['avg_model_accuracy']:.4f} "
        f"node {final['mean_node_accuracy']:.4f} ({summary['wall_seconds']:.0f} s)",
        flush=True,
    )
    return {"method": label, "seed": seed, "summary": summary, "evals": evals}


def run_all(jobs: Sequence[Job], workers: int) -> list[dict[str, Any]]:
    """Every job, ``workers`` at a time, results in job order."""
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_job, jobs))


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean."""
    return sum(values) / len(values)


def finals(runs: Sequence[dict[str, Any]], label: str, key: str) -> list[float]:
    """``final[key]`` of every successful run of ``label``."""
    return [r["summary"]["final"][key] for r in runs if r["method"] == label and "summary" in r]


def first_reaching(evals: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation record whose average-model accuracy reaches ``target``."""
    return next((e for e in evals if e["avg_model_accuracy"] >= target), None)


def plot_curves(
    runs: Sequence[dict[str, Any]],
    path: Path,
    *,
    x: Callable[[dict[str, Any]], float],
    xlabel: str,
    panels: Sequence[tuple[str, str, bool]],
    title: str,
    logx: bool = False,
) -> None:
    """One panel per ``(eval key, y label, log y)``; one line per method (its first seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    first = min(r["seed"] for r in runs)
    for ax, (key, ylabel, logy) in zip(axes[0], panels, strict=True):
        shown = [r for r in runs if "failed" not in r and r["seed"] == first]
        for i, r in enumerate(shown):
            ax.plot(
                [x(e) for e in r["evals"]],
                [e[key] for e in r["evals"]],
                label=r["method"],
                color=plt.get_cmap("tab20")(i % 20),
                linestyle=("-", "--")[i // 20 % 2],
            )
        if logy:
            ax.set_yscale("log")
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle(f"{title} (seed {first})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
