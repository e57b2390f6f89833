"""Grid sweeps: the cross product of config values, each cell run once per seed.

``fedcore sweep CONFIG --grid algorithm.lr=0.1,0.3,1 --grid compression.codec=fp32,sign
--seeds 0-2 [--jobs N] [--best METRIC]`` runs every cell (one value of each grid key) once
per seed, all runs through one pool of workers (:func:`fedcore.simulation.sweep.run_cases`),
and writes::

    <grid>/                                 --out, or runs/<name>-grid-<keys>-seeds<spec>-<time>
        sweep.json                          "kind": "grid": the grid, the seeds, per cell its
                                            values, status and mean/std/n of each figure; the
                                            best cell
        results.csv                         one row per cell: the grid keys, then
                                            <figure>_mean and <figure>_std of each final figure
        algorithm.lr=0.1_compression.codec=fp32/
            sweep.json  results.csv         the cell: an ordinary seed sweep folder
            seed-0/  seed-1/  seed-2/       one run folder per seed

The files are rewritten as each run ends; Ctrl-C leaves them saying which runs completed,
and ``fedcore sweep --resume <grid>`` runs what did not complete. This module imports no
torch until :func:`run_grid` runs: a bad grid is one line before any heavy import.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fedcore.config import Config, load_config, parse_override
from fedcore.errors import ConfigError, FedcoreError, TopologyError
from fedcore.ids import child_path, clip, shorten
from fedcore.metrics import to_json_text, write_text_atomic

__all__ = [
    "GRID_KIND",
    "MAX_CELLS",
    "GridAxis",
    "best_cell",
    "best_direction",
    "best_line",
    "cell_cases",
    "grid_name",
    "grid_table",
    "parse_grid",
    "read_grid",
    "run_grid",
    "split_values",
    "table_rows",
    "validate_grid",
]

GRID_KIND = "grid"
"""``sweep.json``'s ``kind`` in a grid folder (a seed sweep's is ``sweep``)."""

MAX_CELLS = 1000
"""Most cells one grid holds."""

_SWEEP_FILE = "sweep.json"  # fedcore.simulation.sweep's names (not imported: torch)
_RESULTS_CSV = "results.csv"
_FIGURE_KEYS = (
    "avg_model_accuracy",
    "mean_node_accuracy",
    "min_node_accuracy",
    "consensus_distance",
    "average_loss",
    "static_regret",
    "average_static_regret",
    "dynamic_regret",
    "average_dynamic_regret",
    "bytes_per_node_per_round",
    "wall_seconds",
)
_DEFAULT_BEST = ("avg_model_accuracy", "average_static_regret", "average_loss")
_GRID_FORM = "give --grid TABLE.KEY=V1,V2,..., e.g. --grid algorithm.lr=0.1,0.3,1"
_CLOSE = {"[": "]", "{": "}"}


@dataclass(frozen=True, slots=True)
class GridAxis:
    """One grid key and its values, each as ``--set`` would take it (TOML text)."""

    key: str
    values: tuple[str, ...]


def split_values(text: str) -> list[str]:
    """``0.1,0.3,1`` -> ``["0.1", "0.3", "1"]``; commas inside ``[...]``, ``{...}`` or
    quotes belong to their value (``[1,2],[3]`` is two lists)."""
    parts: list[str] = []
    depth: list[str] = []
    quote = ""
    current = ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in _CLOSE:
            depth.append(_CLOSE[char])
        elif depth and char == depth[-1]:
            depth.pop()
        elif char == "," and not depth:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    parts.append(current.strip())
    return parts


def parse_grid(items: Sequence[str]) -> list[GridAxis]:
    """The axes of ``--grid KEY=V1,V2`` items.

    Raises:
        ConfigError: an item without ``=`` or values, a key given twice (or as
            ``run.seed``: that is ``--seeds``), a value listed twice, more than
            :data:`MAX_CELLS` cells.
    """
    axes: list[GridAxis] = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        where = f"--grid {clip(item, 60)}"
        if not sep or not key:
            raise ConfigError(f"{where} has no '='; {_GRID_FORM}.")
        parse_override(f"{key}=0")  # the key's form, with --set's message
        if key == "run.seed":
            raise ConfigError(f"{where}: give seeds with --seeds (e.g. --seeds 0-4), not --grid.")
        if any(axis.key == key for axis in axes):
            raise ConfigError(f"{where}: {key} is gridded twice; give each key one --grid.")
        values = split_values(text)
        if any(not v for v in values):
            raise ConfigError(f"{where}: an empty value; {_GRID_FORM}.")
        seen: set[str] = set()
        for value in values:
            shown = json.dumps(parse_override(f"{key}={value}")[1], sort_keys=True)
            if shown in seen:
                raise ConfigError(f"{where}: {clip(value, 30)} is listed twice; list it once.")
            seen.add(shown)
        axes.append(GridAxis(key, tuple(values)))
    if not axes:
        raise ConfigError(f"a grid sweep needs at least one --grid; {_GRID_FORM}.")
    if math.prod(len(a.values) for a in axes) > MAX_CELLS:
        raise ConfigError(f"the grid has more than {MAX_CELLS} cells; grid fewer values.")
    return axes


def cell_cases(axes: Sequence[GridAxis]) -> list[tuple[str, list[str]]]:
    """Every cell of the cross product as ``(label, --set items)``, the first key
    slowest: ``("algorithm.lr=0.1, compression.codec=sign", [...])``."""
    cases: list[tuple[str, list[str]]] = []
    for values in itertools.product(*(a.values for a in axes)):
        items = [f"{a.key}={v}" for a, v in zip(axes, values, strict=True)]
        cases.append((", ".join(items), items))
    return cases


def best_direction(metric: str) -> str:
    """``max`` for an accuracy, ``min`` for everything else (losses, regret, distance,
    bytes, time)."""
    return "max" if "accuracy" in metric else "min"


def validate_grid(
    config: str | None,
    overrides: Sequence[str],
    axes: Sequence[GridAxis],
    seeds: Sequence[int],
    best: str | None,
) -> Config:
    """Check every value, cell and seed before any run, as ``--set`` and a run's plan
    would (:func:`~fedcore.setup.plan.plan_run`: the algorithm, the graph, its weights;
    no data or model); return the base config.

    Raises:
        ConfigError: a bad config, override, grid key or value (the message ``--set``
            gives, after ``--grid KEY=VALUE:``), a grid key also given by ``--set``, an
            unknown ``best`` metric.
    """
    if best is not None and best not in _FIGURE_KEYS:
        raise ConfigError(
            f"--best {clip(best, 40)} is not a final figure; give one of {', '.join(_FIGURE_KEYS)}."
        )
    from fedcore.setup.plan import plan_run

    base = load_config(config, overrides)
    if any(parse_override(item)[0] == ["run", "seed"] for item in overrides):
        raise ConfigError("--seeds sets run.seed of each run; drop run.seed from --set.")
    given = {item.partition("=")[0].strip() for item in overrides}
    for axis in axes:
        if axis.key in given:
            raise ConfigError(
                f"--grid {axis.key}=... and --set {axis.key}=... both set {axis.key}; give it once."
            )
        for value in axis.values:  # one value at a time: the message names it
            try:
                plan_run(load_config(config, [*overrides, f"{axis.key}={value}"]))
            except (ConfigError, TopologyError) as exc:
                where = shorten(f"{axis.key}={value}", 60)
                raise type(exc)(f"--grid {where}: {exc}") from None
    for label, items in cell_cases(axes):  # values that cannot go together
        try:
            if len(axes) > 1:
                plan_run(load_config(config, [*overrides, *items]))
            for seed in seeds:
                load_config(config, [*overrides, *items, f"run.seed={seed}"])
        except (ConfigError, TopologyError) as exc:
            raise type(exc)(f"--grid cell {label}: {exc}") from None
    return base


def grid_name(
    config: Config, overrides: Sequence[str], axes: Sequence[GridAxis], seeds: Sequence[int]
) -> str:
    """``<name>-grid-<keys>-seeds<spec>`` (see :func:`~fedcore.simulation.sweep.sweep_name`)."""
    from fedcore.simulation.sweep import sweep_name

    name = sweep_name(config, overrides, seeds)
    stem, _, spec = name.rpartition("-seeds")
    keys = "-".join(a.key for a in axes)
    suffix = f"-grid-{keys}-seeds{spec}"
    return stem[: max(10, 100 - len(suffix))] + suffix


# --- the grid's files -------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _cells(
    folder: Path, axes: Sequence[GridAxis], seeds: Sequence[int], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Each cell as its folder's ``sweep.json`` says now (``pending`` before it has one)."""
    cells: list[dict[str, Any]] = []
    for (label, items), name in zip(cell_cases(axes), names, strict=True):
        record = _read_json(folder / name / _SWEEP_FILE) or {}
        values = {a.key: parse_override(item)[1] for a, item in zip(axes, items, strict=True)}
        cells.append(
            {
                "label": label,
                "values": values,
                "overrides": items,
                "out_dir": name,
                "status": record.get("status", "pending"),
                "completed": list(record.get("completed", [])),
                "failed": list(record.get("failed", [])),
                "stats": dict(record.get("stats", {})),
            }
        )
    return cells


def best_cell(cells: Sequence[Mapping[str, Any]], metric: str) -> dict[str, Any] | None:
    """The cell with the best mean of ``metric`` (see :func:`best_direction`), first on
    a tie; None if no cell has a number for it."""
    direction = best_direction(metric)
    scored = [
        (c["stats"][metric]["mean"], i)
        for i, c in enumerate(cells)
        if c["stats"].get(metric, {}).get("mean") is not None
    ]
    if not scored:
        return None
    sign = -1.0 if direction == "max" else 1.0
    _, index = min(scored, key=lambda s: (sign * s[0], s[1]))
    cell = cells[index]
    stats = cell["stats"][metric]
    return {
        "metric": metric,
        "direction": direction,
        "label": cell["label"],
        "values": cell["values"],
        "mean": stats["mean"],
        "std": stats["std"],
        "n": stats["n"],
        "out_dir": cell["out_dir"],
    }


def _best_metric(cells: Sequence[Mapping[str, Any]], best: str | None) -> str:
    """``best``, or the first of accuracy, static regret and loss that some cell has."""
    if best is not None:
        return best
    for metric in _DEFAULT_BEST:
        if any(c["stats"].get(metric, {}).get("mean") is not None for c in cells):
            return metric
    return _DEFAULT_BEST[0]


def table_rows(keys: Sequence[str], cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell (``results.csv``'s rows): each grid key's value, then
    ``<figure>_mean`` and ``<figure>_std`` of each final figure some cell has, then
    ``completed``, ``failed`` (run counts) and ``out_dir`` (the cell's folder)."""
    figures = [k for k in _FIGURE_KEYS if any(k in c["stats"] for c in cells)]
    rows: list[dict[str, Any]] = []
    for cell in cells:
        row: dict[str, Any] = {k: cell["values"][k] for k in keys}
        for figure in figures:
            stats = cell["stats"].get(figure, {})
            row[f"{figure}_mean"] = stats.get("mean")
            row[f"{figure}_std"] = stats.get("std")
        row.update(
            completed=len(cell["completed"]), failed=len(cell["failed"]), out_dir=cell["out_dir"]
        )
        rows.append(row)
    return rows


def _csv_text(keys: Sequence[str], cells: Sequence[Mapping[str, Any]]) -> str:
    """results.csv: :func:`table_rows` under a header (strings as they are, other grid
    values as JSON, figures as floats, a missing one empty)."""
    rows = table_rows(keys, cells)
    columns = list(rows[0]) if rows else list(keys)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)

    def shown(column: str, value: Any) -> str:
        if column in keys:
            return value if isinstance(value, str) else json.dumps(value)
        if column in ("completed", "failed", "out_dir"):
            return str(value)
        return "" if value is None else repr(float(value))

    for row in rows:
        writer.writerow([shown(c, row[c]) for c in columns])
    return buffer.getvalue()


def _write_grid(
    folder: Path,
    head: Mapping[str, Any],
    axes: Sequence[GridAxis],
    names: Sequence[str],
    status: str,
    began: float,
) -> dict[str, Any]:
    """Rewrite the grid's sweep.json and results.csv from its cells' files."""
    cells = _cells(folder, axes, head["seeds"], names)
    metric = _best_metric(cells, head.get("best_metric"))
    record = {
        **head,
        "status": status,
        "cells": cells,
        "best": best_cell(cells, metric),
        "wall_seconds": time.perf_counter() - began,
    }
    write_text_atomic(folder / _SWEEP_FILE, to_json_text(record, indent=2) + "\n")
    write_text_atomic(folder / _RESULTS_CSV, _csv_text([a.key for a in axes], cells))
    return {**record, "out_dir": str(folder)}


def read_grid(folder: str | Path) -> dict[str, Any]:
    """A grid folder's ``sweep.json`` (to resume it).

    Raises:
        ConfigError: the folder holds no grid sweep.
    """
    path = Path(folder) / _SWEEP_FILE
    record = _read_json(path)
    if record is None or record.get("kind") != GRID_KIND or "grid" not in record:
        raise ConfigError(f"{str(folder)!r} holds no grid sweep to resume (no grid {path.name}).")
    return record


def run_grid(
    config: str | Path | None,
    overrides: Sequence[str],
    axes: Sequence[GridAxis],
    seeds: Sequence[int],
    *,
    jobs: int = 1,
    out_dir: str | Path | None = None,
    force: bool = False,
    resume: bool = False,
    best: str | None = None,
    show_progress: bool = True,
    threads: int | str = 1,
    progress_stream: TextIO | None = None,
) -> dict[str, Any]:
    """Run every cell of the grid once per seed; write the grid folder.

    Args:
        config: The experiment TOML (None: the built-in run).
        overrides: ``--set`` items for every run.
        axes: The grid (:func:`parse_grid`).
        seeds: The seeds of every cell.
        jobs: Runs at a time (worker processes when more than 1).
        out_dir: The grid folder (default ``runs/<name>-grid-...-<timestamp>``).
        force: Replace the grid an existing ``out_dir`` holds.
        resume: Continue the grid in ``out_dir``: its completed runs are kept, every
            other run runs (from its checkpoints where it has some).
        best: The final figure that picks the best cell (default: avg_model_accuracy,
            else the static regret, else the average loss; max for an accuracy, else min).
        show_progress: One line on ``progress_stream`` (default stderr) per run that ends.
        threads: torch threads of each run (a number or ``"auto"``).
        progress_stream: Where the progress lines go.

    Returns:
        The grid's ``sweep.json`` content, plus ``out_dir``.

    Raises:
        ConfigError: an invalid config, grid, seeds or folder (before any run).
        FedcoreError: every run of every cell failed.
        KeyboardInterrupt: Ctrl-C; the files say which runs completed.
    """
    from fedcore.simulation.results import open_run_dir
    from fedcore.simulation.sweep import _slug, run_cases

    # The config by its absolute path: --resume reads it from sweep.json, maybe elsewhere.
    path = None if config is None else os.path.abspath(config)
    seeds = list(seeds)
    base = validate_grid(path, overrides, axes, seeds, best)
    if resume:
        if out_dir is None:
            raise ConfigError("resuming a grid needs its folder.")
        folder = Path(out_dir)
    else:
        folder = open_run_dir(out_dir, grid_name(base, overrides, axes, seeds), force=force)
        existing = _read_json(folder / _SWEEP_FILE)
        if existing is not None and not force:
            raise ConfigError(
                f"sweep folder {str(folder)!r} holds another sweep ({_SWEEP_FILE}); give "
                "another --out, --force to replace it, or --resume to continue it."
            )
    cases = cell_cases(axes)
    names: list[str] = []
    for label, _ in cases:
        name = _slug(label)
        k = 1
        while (name if k == 1 else f"{name}-{k}") in names:
            k += 1
        names.append(name if k == 1 else f"{name}-{k}")
        child_path(folder, names[-1], ConfigError)
    head: dict[str, Any] = {
        "kind": GRID_KIND,
        "name": folder.name,
        "config": path,
        "overrides": list(overrides),
        "grid": {a.key: list(a.values) for a in axes},
        "seeds": seeds,
        "jobs": jobs,
        "best_metric": best,
    }
    began = time.perf_counter()

    def update(status: str = "running") -> dict[str, Any]:
        return _write_grid(folder, head, axes, names, status, began)

    def rewrite() -> None:
        update()

    status = "failed"
    try:
        run_cases(
            path,
            [(label, [*overrides, *items]) for label, items in cases],
            seeds,
            out_dir=folder,
            jobs=jobs,
            force=force,
            show_progress=show_progress,
            threads=threads,
            progress_stream=progress_stream if progress_stream is not None else sys.stderr,
            resume=resume,
            on_update=rewrite,
        )
        status = "completed"
    except KeyboardInterrupt:
        status = "interrupted"
        update(status)
        raise KeyboardInterrupt(
            f"the grid so far is in {folder} ({_SWEEP_FILE} says which runs completed; "
            f"fedcore sweep --resume {folder} runs the rest)"
        ) from None
    finally:
        if status == "failed":
            update(status)
    cells = _cells(folder, axes, seeds, names)
    if not any(c["completed"] for c in cells):
        update("failed")
        raise FedcoreError(f"every run of the grid failed (see {folder / _SWEEP_FILE}).")
    return update(status)


# --- the console table ------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "-" if value is None else format(value, ".4g")


def grid_table(result: Mapping[str, Any]) -> str:
    """The console table: per cell, the best metric's mean ± std; the best cell; where."""
    cells = result["cells"]
    best = result.get("best")
    metric = best["metric"] if best else _best_metric(cells, result.get("best_metric"))
    header = ["cell", f"{metric} (mean ± std)", "runs"]
    rows = []
    for cell in cells:
        stats = cell["stats"].get(metric, {})
        runs = f"{len(cell['completed'])}/{len(result['seeds'])}"
        if cell["failed"]:
            runs += f" ({len(cell['failed'])} failed)"
        rows.append([cell["label"], f"{_fmt(stats.get('mean'))} ± {_fmt(stats.get('std'))}", runs])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = [
        ("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
        for r in [header, *rows]
    ]
    lines.append(best_line(result))
    lines.append(f"results: {result['out_dir']} ({_SWEEP_FILE}, {_RESULTS_CSV}, one folder a cell)")
    return "\n".join(lines)


def best_line(result: Mapping[str, Any]) -> str:
    """``best avg_model_accuracy (max): <cell>: mean ± std over n runs``."""
    best = result.get("best")
    if not best:
        return "best: no cell has a number for the metric"
    return (
        f"best {best['metric']} ({best['direction']}): {best['label']}: "
        f"{_fmt(best['mean'])} ± {_fmt(best['std'])} over {best['n']} runs"
    )
