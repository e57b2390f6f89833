"""``fedcore plot``: compare runs at a glance.

Four panels from each run's ``metrics.jsonl`` evaluation records: training loss and
test accuracy, each against rounds and against bytes sent per node. One colour per run,
labelled with the run's name; in the accuracy panels the solid line is the average model
and the dashed line the mean of the peers' own models. Runs with regret records
(``run.regret``) add two panels against rounds: the average static regret ``R_t / (n t)``
and the average dynamic regret (where the stream has a comparator).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError

__all__ = ["load_evals", "load_records", "plot_runs"]


def load_evals(run_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """The run's name and its evaluation records (see :func:`load_records`)."""
    name, evals, _ = load_records(run_dir)
    return name, evals


def load_records(run_dir: Path) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's name, its evaluation records and its regret records (maybe none).

    Raises:
        ConfigError: the folder has no readable ``metrics.jsonl`` with evaluations.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder: it has no metrics.jsonl.")
    evals: list[dict[str, Any]] = []
    regret: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{path}: line {lineno} is not JSON.") from None
            if record.get("kind") == "eval":
                evals.append(record)
            elif record.get("kind") == "regret":
                regret.append(record)
    if not evals:
        raise ConfigError(f"{path} has no evaluation records to plot.")
    name = run_dir.name
    summary = run_dir / "summary.json"
    if summary.is_file():
        with contextlib.suppress(json.JSONDecodeError):
            name = json.loads(summary.read_text(encoding="utf-8")).get("name", name)
    return name, evals, regret


def _value(value: Any) -> float:
    """A figure as written (``null``: not a number, a diverged run) as a float to plot."""
    return math.nan if value is None else float(value)


def plot_runs(run_dirs: Sequence[Path], out: Path) -> Path:
    """Draw the four comparison panels for ``run_dirs`` into ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = [load_records(Path(d)) for d in run_dirs]
    runs = [(name, evals) for name, evals, _ in loaded]
    with_regret = any(regret for _, _, regret in loaded)
    fig, axes = plt.subplots(3 if with_regret else 2, 2, figsize=(11, 11 if with_regret else 7.5))
    panels = [
        (axes[0][0], "round", "train_loss", "training loss", "round"),
        (axes[0][1], "round", "avg_model_accuracy", "test accuracy", "round"),
        (axes[1][0], "bytes_sent_per_node", "train_loss", "training loss", "MB sent per node"),
        (
            axes[1][1],
            "bytes_sent_per_node",
            "avg_model_accuracy",
            "test accuracy",
            "MB sent per node",
        ),
    ]
    for ax, xkey, ykey, ylabel, xlabel in panels:
        for name, evals in runs:
            xs = [r[xkey] + 1 if xkey == "round" else r[xkey] / 1e6 for r in evals]
            (line,) = ax.plot(xs, [_value(r[ykey]) for r in evals], marker=".", label=name)
            if ykey == "avg_model_accuracy":
                ax.plot(
                    xs,
                    [_value(r["mean_node_accuracy"]) for r in evals],
                    linestyle="--",
                    color=line.get_color(),
                    label=f"{name} (mean node)",
                )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][1].legend(loc="lower right", fontsize="small")
    if with_regret:
        for ax, key, label in (
            (axes[2][0], "average_static_regret", "average static regret R_t / (n t)"),
            (axes[2][1], "average_dynamic_regret", "average dynamic regret"),
        ):
            for name, _, regret in loaded:
                points = [(r["round"] + 1, r[key]) for r in regret if r.get(key) is not None]
                if points:
                    ax.plot(*zip(*points, strict=True), marker=".", label=name)
            ax.set_xlabel("round")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[2][0].legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
