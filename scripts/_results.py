"""What the results scripts share: a grid of cases run over seeds, and plots.

Imported by the scripts beside it (``python scripts/<name>.py`` puts this folder first on
``sys.path``); not part of the fedcore package. The runs go through
:func:`fedcore.simulation.sweep.run_cases`, the code behind ``fedcore simulate --seeds``: one
sweep folder per case (``sweep.json``, ``results.csv``, ``seed-<k>/``), every run of the
grid in one pool of worker processes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcore.plotting import load_evals
from fedcore.simulation.sweep import run_cases


def _numbers(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with its ``null`` figures (strict JSON for NaN: a diverged run) as NaN."""
    return {k: math.nan if v is None else v for k, v in record.items()}


def run_grid(
    cases: Mapping[str, Sequence[str]],
    seeds: Sequence[int],
    out: Path,
    workers: int,
    config: Path | None = None,
) -> list[dict[str, Any]]:
    """Every case (label -> ``--set`` overrides of ``config``) once per seed, ``workers``
    runs at a time on one thread each, into ``out/<case>/seed-<k>/``.

    Returns one record per run, case by case and seed by seed: ``method``, ``seed`` and
    either ``summary`` and ``evals`` (its evaluation records) or ``failed`` (why: a
    diverged method is a finding, not an error).
    """
    results = run_cases(
        config, list(cases.items()), seeds, out_dir=out, jobs=workers, force=True, threads=1
    )
    records: list[dict[str, Any]] = []
    for case in results:
        for run in case["runs"]:
            record: dict[str, Any] = {"method": case["label"], "seed": run["seed"]}
            if run["status"] != "completed":
                records.append({**record, "failed": run.get("reason") or run["status"]})
                continue
            folder = Path(case["out_dir"]) / run["out_dir"]
            summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
            summary["final"] = _numbers(summary["final"])
            summary["regret"] = [_numbers(r) for r in summary.get("regret", [])]
            evals = [_numbers(e) for e in load_evals(folder)[1]]
            records.append({**record, "summary": summary, "evals": evals})
    return records


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
