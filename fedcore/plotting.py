"""``fedcore plot``: compare runs at a glance.

Four panels from each run's ``metrics.jsonl`` evaluation records: training loss and
test accuracy, each against rounds and against bytes sent per node. One colour per run,
labelled with the run's name; in the accuracy panels the solid line is the average model
and the dashed line the mean of the peers' own models.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError

__all__ = ["load_evals", "plot_runs"]


def load_evals(run_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """The run's name and its evaluation records.

    Raises:
        ConfigError: the folder has no readable ``metrics.jsonl`` with evaluations.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder: it has no metrics.jsonl.")
    evals: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{path}: line {lineno} is not JSON.") from None
            if record.get("kind") == "eval":
                evals.append(record)
    if not evals:
        raise ConfigError(f"{path} has no evaluation records to plot.")
    name = run_dir.name
    summary = run_dir / "summary.json"
    if summary.is_file():
        with contextlib.suppress(json.JSONDecodeError):
            name = json.loads(summary.read_text(encoding="utf-8")).get("name", name)
    return name, evals


def plot_runs(run_dirs: Sequence[Path], out: Path) -> Path:
    """Draw the four comparison panels for ``run_dirs`` into ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_evals(Path(d)) for d in run_dirs]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
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
            (line,) = ax.plot(xs, [r[ykey] for r in evals], marker=".", label=name)
            if ykey == "avg_model_accuracy":
                ax.plot(
                    xs,
                    [r["mean_node_accuracy"] for r in evals],
                    linestyle="--",
                    color=line.get_color(),
                    label=f"{name} (mean node)",
                )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][1].legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
