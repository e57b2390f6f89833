"""The final figures of a seed sweep's runs: what a sweep collects of each run's summary,
their mean ± std (the sample standard deviation), and ``results.csv``."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

FIGURES: tuple[tuple[str, str, str], ...] = (
    ("avg_model_accuracy", "avg-model accuracy", ".4f"),
    ("mean_node_accuracy", "mean node accuracy", ".4f"),
    ("min_node_accuracy", "min node accuracy", ".4f"),
    ("consensus_distance", "consensus distance", ".4g"),
    ("average_loss", "average loss", ".4f"),
    ("static_regret", "static regret", ".4g"),
    ("average_static_regret", "average static regret", ".4g"),
    ("dynamic_regret", "dynamic regret", ".4g"),
    ("average_dynamic_regret", "average dynamic regret", ".4g"),
    ("bytes_per_node_per_round", "bytes / node / round", ".0f"),
    ("wall_seconds", "wall time (s)", ".3g"),
)
"""The final figures a sweep collects: ``(key, table label, format)``. The regret ones
appear where the runs computed them (``run.regret``)."""

_ALWAYS = {
    "avg_model_accuracy",
    "mean_node_accuracy",
    "min_node_accuracy",
    "consensus_distance",
    "average_loss",
    "bytes_per_node_per_round",
    "wall_seconds",
}


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (not written, null, NaN, not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def final_figures(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The :data:`FIGURES` of one run's summary (None: not a number, a diverged run).

    The regret figures are present only where the run computed them.
    """
    final = summary.get("final") or {}
    out: dict[str, float | None] = {}
    for key, _, _ in FIGURES:
        if key == "bytes_per_node_per_round":
            out[key] = _number((summary.get("traffic") or {}).get(key))
        elif key == "wall_seconds":
            out[key] = _number(summary.get(key))
        elif key in final or key in _ALWAYS:
            out[key] = _number(final.get(key))
    return out


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (``ddof = 1``) of ``values``; None where
    undefined (no values; one value for the deviation)."""
    n = len(values)
    if n == 0:
        return None, None
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def _csv_text(record: Mapping[str, Any]) -> str:
    """results.csv: a header, one row per seed, then the mean and std rows."""
    keys = list(record["stats"]) or [k for k, _, _ in FIGURES if k in _ALWAYS]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["seed", "status", *keys, "out_dir"])

    def cell(value: Any) -> str:
        return "" if value is None else repr(float(value))

    for run in record["runs"]:
        final = run.get("final") or {}
        writer.writerow(
            [run["seed"], run["status"], *(cell(final.get(k)) for k in keys), run["out_dir"]]
        )
    for row in ("mean", "std"):
        stats = record["stats"]
        writer.writerow([row, "", *(cell(stats.get(k, {}).get(row)) for k in keys), ""])
    return buffer.getvalue()
