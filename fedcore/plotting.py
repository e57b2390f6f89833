"""``fedcore plot``: compare runs at a glance.

Four panels from each run's ``metrics.jsonl`` evaluation records: training loss and
test accuracy, each against rounds and against bytes sent per node. One colour per run,
labelled with the run's name (or, with ``label``, the value of a key of its
``config.toml``); in the accuracy panels the solid line is the average model and the
dashed line the mean of the peers' own models. Runs with regret records (``run.regret``)
add two panels against rounds: the average static regret ``R_t / (n t)`` and the average
dynamic regret (where the stream has a comparator).

A sweep folder (one holding ``sweep.json``, see :mod:`fedcore.simulation.sweep`) stands for
its completed runs. With ``bands``, runs whose ``config.toml`` differ only in ``run.seed``
(and ``run.name``) become one curve: their mean, in a band of +- one (sample) standard
deviation, at the rounds every run of the group evaluated. A grid folder (its ``sweep.json``
of kind ``grid``, see :mod:`fedcore.simulation.grid`) stands for its cells' runs, labelled
by the grid's keys.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from fedcore.ids import child_path, clip

__all__ = [
    "LEGEND_OUTSIDE",
    "config_value",
    "expand_runs",
    "grid_keys",
    "load_evals",
    "load_records",
    "load_run_config",
    "plot_runs",
    "seed_groups",
    "strip_seed",
]

LEGEND_OUTSIDE = 6
"""From this many curves on (or with labels of over 40 characters), the legend goes below
the panels, off the curves."""

SWEEP_FILE = "sweep.json"  # as fedcore.simulation.sweep writes it (not imported: no torch here)

_SEED_KEYS = ("seed", "name")
"""The ``[run]`` keys in which the runs of one ``bands`` group may differ."""

_SEED_PART = re.compile(r"(?:^|[-_ ,]+)(?:run\.)?seed[-=_]?\d+(?=$|[-_ ,])", re.IGNORECASE)


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


def expand_runs(paths: Sequence[Path]) -> list[Path]:
    """``paths`` with every sweep folder (one holding ``sweep.json``) replaced by the
    folders of its completed runs, in seed order.

    Raises:
        ConfigError: an unreadable ``sweep.json``, or a sweep with no completed run.
    """
    out: list[Path] = []
    for path in paths:
        sweep = path / SWEEP_FILE
        if not sweep.is_file():
            out.append(path)
            continue
        try:
            record = json.loads(sweep.read_text(encoding="utf-8"))
            if record.get("kind") == "grid":  # a grid: the sweep folders of its cells
                cells = [c for c in record["cells"] if c.get("completed")]
                found = [child_path(path, str(c["out_dir"]), ConfigError) for c in cells]
            else:
                runs = [r for r in record["runs"] if r.get("status") == "completed"]
                found = [child_path(path, str(r["out_dir"]), ConfigError) for r in runs]
        except (OSError, UnicodeError, ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(f"{sweep} is not a readable sweep file.") from None
        if found and record.get("kind") == "grid":
            out.extend(expand_runs(found))
            continue
        if not found:
            raise ConfigError(f"sweep folder {str(path)!r} has no completed run to plot.")
        out.extend(found)
    return out


def grid_keys(paths: Sequence[Path]) -> list[str]:
    """The grid keys of the grid folders among ``paths`` (``sweep.json`` of kind
    ``grid``), in order, each once; none for runs and seed sweeps."""
    keys: list[str] = []
    for path in paths:
        with contextlib.suppress(OSError, UnicodeError, ValueError, AttributeError):
            record = json.loads((path / SWEEP_FILE).read_text(encoding="utf-8"))
            if record.get("kind") == "grid":
                keys += [str(k) for k in record.get("grid", {}) if str(k) not in keys]
    return keys


def load_run_config(run_dir: Path, why: str) -> dict[str, Any]:
    """The run's ``config.toml`` as a dict.

    Raises:
        ConfigError: no readable ``config.toml`` (``why`` says what needed it).
    """
    path = run_dir / "config.toml"
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{why}: run {str(run_dir)!r} has no config.toml.") from None
    except (OSError, UnicodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{why}: cannot read {path}: {exc}.") from None


def config_value(config: Mapping[str, Any], key: str, run_dir: Path) -> Any:
    """The value of dotted ``key`` (``algorithm.name``) in a run's config.

    Raises:
        ConfigError: the config has no such key.
    """
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise ConfigError(
                f"--label {clip(key, 60)}: run {str(run_dir)!r} has no such key in its "
                "config.toml; give a dotted key such as algorithm.name or compression.codec."
            )
        value = value[part]
    return value


def _label_text(key: str, value: Any) -> str:
    """A config value as a legend label: strings as they are, others as ``key=value``."""
    if isinstance(value, str):
        return value
    shown = json.dumps(value) if isinstance(value, bool | list | dict) else str(value)
    return f"{key}={shown}"


def seed_groups(configs: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Indices of ``configs`` grouped by config, ``run.seed`` and ``run.name`` left out;
    groups in order of their first run, runs in their given order."""
    groups: dict[str, list[int]] = {}
    for i, config in enumerate(configs):
        reduced = dict(config)
        run = reduced.get("run")
        if isinstance(run, Mapping):
            reduced["run"] = {k: v for k, v in run.items() if k not in _SEED_KEYS}
        key = json.dumps(reduced, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def strip_seed(name: str) -> str:
    """``name`` without its seed part: ``ops-ring-run.seed=3`` -> ``ops-ring``."""
    return _SEED_PART.sub("", name).strip("-_ ,")


def _group_name(names: Sequence[str], dirs: Sequence[Path]) -> str:
    """The common name of a group of runs, without the seed part."""
    stripped = {strip_seed(n) for n in names}
    if len(stripped) == 1 and (only := stripped.pop()):
        return only
    prefix = strip_seed(_common_prefix(names)).rstrip("-_=.")
    if prefix:
        return prefix
    parents = {d.parent.name for d in dirs}
    return parents.pop() if len(parents) == 1 else names[0]


def _common_prefix(names: Sequence[str]) -> str:
    first, last = min(names), max(names)
    k = 0
    while k < min(len(first), len(last)) and first[k] == last[k]:
        k += 1
    return first[:k]


def _value(value: Any) -> float:
    """A figure as written (``null``: not a number, a diverged run) as a float to plot."""
    return math.nan if value is None else float(value)


_EVAL_KEYS = ("train_loss", "avg_model_accuracy", "mean_node_accuracy", "bytes_sent_per_node")
_REGRET_KEYS = ("average_static_regret", "average_dynamic_regret")


@dataclass
class _Curve:
    """One line (or mean with band) of every panel."""

    label: str
    rounds: list[float]
    series: dict[str, list[float]]
    spread: dict[str, list[float]] | None = None
    regret: dict[str, tuple[list[float], list[float], list[float] | None]] = field(
        default_factory=dict
    )


def _run_curve(label: str, evals: list[dict[str, Any]], regret: list[dict[str, Any]]) -> _Curve:
    curve = _Curve(
        label,
        [r["round"] + 1 for r in evals],
        {k: [_value(r.get(k)) for r in evals] for k in _EVAL_KEYS},
    )
    for key in _REGRET_KEYS:
        points = [(r["round"] + 1, float(r[key])) for r in regret if r.get(key) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            curve.regret[key] = (list(xs), list(ys), None)
    return curve


def _mean_curve(
    label: str, runs: Sequence[tuple[list[dict[str, Any]], list[dict[str, Any]]]]
) -> _Curve:
    """Mean and sample standard deviation over runs, at the rounds all of them reached."""
    import numpy as np

    by_round = [{r["round"]: r for r in evals} for evals, _ in runs]
    common = sorted(set.intersection(*(set(b) for b in by_round)))
    if not common:
        raise ConfigError(
            f"--bands: the runs of {label!r} share no evaluation round; give runs that "
            "evaluated the same rounds (the same run.rounds and run.eval_every)."
        )
    series: dict[str, list[float]] = {}
    spread: dict[str, list[float]] = {}
    for key in _EVAL_KEYS:
        table = np.array([[_value(b[t].get(key)) for t in common] for b in by_round])
        series[key] = table.mean(axis=0).tolist()
        spread[key] = table.std(axis=0, ddof=1).tolist()
    curve = _Curve(label, [t + 1 for t in common], series, spread)
    for key in _REGRET_KEYS:
        per_run = [
            {r["round"]: float(r[key]) for r in regret if r.get(key) is not None}
            for _, regret in runs
        ]
        rounds = sorted(set.intersection(*(set(p) for p in per_run)))
        if rounds:
            table = np.array([[p[t] for t in rounds] for p in per_run])
            curve.regret[key] = (
                [t + 1 for t in rounds],
                table.mean(axis=0).tolist(),
                table.std(axis=0, ddof=1).tolist(),
            )
    return curve


def _curves(run_dirs: Sequence[Path], label: str | None, bands: bool) -> tuple[list[_Curve], bool]:
    """The curves to draw, and whether any run has regret records."""
    loaded = [load_records(d) for d in run_dirs]
    with_regret = any(regret for _, _, regret in loaded)
    why = f"fedcore plot --label {clip(label, 60)}" if label else "fedcore plot --bands"
    configs = [load_run_config(d, why) for d in run_dirs] if label or bands else []

    def labelled(i: int) -> str:
        if label is None:
            return loaded[i][0]
        keys = [k.strip() for k in label.split(",")]  # several keys: "k1=v1, v2"
        return ", ".join(_label_text(k, config_value(configs[i], k, run_dirs[i])) for k in keys)

    if not bands:
        curves = [_run_curve(labelled(i), evals, reg) for i, (_, evals, reg) in enumerate(loaded)]
        return curves, with_regret
    curves = []
    for group in seed_groups(configs):
        if label is not None:
            text = ", ".join(dict.fromkeys(labelled(i) for i in group))
        else:
            text = _group_name([loaded[i][0] for i in group], [run_dirs[i] for i in group])
        if len(group) == 1:
            _, evals, reg = loaded[group[0]]
            curves.append(_run_curve(text, evals, reg))
        else:
            text += f" (mean ± std, {len(group)} seeds)"
            curves.append(_mean_curve(text, [(loaded[i][1], loaded[i][2]) for i in group]))
    return curves, with_regret


def _draw(
    ax: Any,
    xs: Sequence[float],
    ys: Sequence[float],
    spread: Sequence[float] | None,
    *,
    positive_x: bool,
    **style: Any,
) -> Any:
    """One line (and its band) on ``ax``; points at x <= 0 left out on a log axis."""
    keep = [i for i, x in enumerate(xs) if x > 0 or not positive_x]
    x = [xs[i] for i in keep]
    y = [ys[i] for i in keep]
    (line,) = ax.plot(x, y, marker="." if len(x) < 60 else None, **style)
    if spread is not None and x:
        low = [y[j] - spread[i] for j, i in enumerate(keep)]
        high = [y[j] + spread[i] for j, i in enumerate(keep)]
        alpha = 0.1 if style.get("linestyle") == "--" else 0.2
        ax.fill_between(x, low, high, color=line.get_color(), alpha=alpha, linewidth=0)
    return line


def plot_runs(
    run_dirs: Sequence[Path],
    out: Path,
    *,
    label: str | None = None,
    title: str | None = None,
    log_bytes: bool = False,
    bands: bool = False,
) -> Path:
    """Draw the comparison panels for ``run_dirs`` into ``out`` (PNG, PDF or SVG).

    Args:
        run_dirs: Run folders, or sweep folders (their completed runs).
        out: The picture to write (its format by its suffix).
        label: A dotted config key (``algorithm.name``), or several joined by commas:
            label each curve by their values in the run's ``config.toml`` instead of the
            run's name. Grid folders without ``label``: by the grid's keys (and
            ``run.seed`` without ``bands``).
        title: The figure's title.
        log_bytes: A log scale on the bytes-sent axes (points at 0 bytes left out).
        bands: One curve per group of runs that differ only in ``run.seed``: the mean
            over seeds in a band of +- one standard deviation.

    Raises:
        ConfigError: a folder that is not a run, a run without ``config.toml`` or
            without ``label``, runs of a band that share no evaluation round.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if label is None and (keys := grid_keys([Path(d) for d in run_dirs])):
        label = ",".join(keys if bands else [*keys, "run.seed"])  # a grid's runs by cell
    curves, with_regret = _curves(expand_runs([Path(d) for d in run_dirs]), label, bands)
    # Many curves, or long names, would hide the curves: the legend goes below instead.
    outside = len(curves) >= LEGEND_OUTSIDE or max(len(c.label) for c in curves) > 40
    fig, axes = plt.subplots(3 if with_regret else 2, 2, figsize=(11, 11 if with_regret else 7.5))
    mb = "MB sent per node" + (" (log)" if log_bytes else "")
    panels = [
        (axes[0][0], False, "train_loss", "training loss", "round"),
        (axes[0][1], False, "avg_model_accuracy", "test accuracy", "round"),
        (axes[1][0], True, "train_loss", "training loss", mb),
        (axes[1][1], True, "avg_model_accuracy", "test accuracy", mb),
    ]
    handles: list[Any] = []
    for ax, by_bytes, ykey, ylabel, xlabel in panels:
        positive = by_bytes and log_bytes
        for c in curves:
            xs = [b / 1e6 for b in c.series["bytes_sent_per_node"]] if by_bytes else c.rounds
            sd = c.spread
            line = _draw(
                ax,
                xs,
                c.series[ykey],
                sd[ykey] if sd else None,
                positive_x=positive,
                label=c.label,
            )
            if ax is axes[0][0]:
                handles.append(line)
            if ykey == "avg_model_accuracy":
                _draw(
                    ax,
                    xs,
                    c.series["mean_node_accuracy"],
                    sd["mean_node_accuracy"] if sd else None,
                    positive_x=positive,
                    linestyle="--",
                    color=line.get_color(),
                    label=f"{c.label} (mean node)",
                )
        if positive and any(ln.get_xdata().size for ln in ax.get_lines()):
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    dashed = Line2D([], [], color="grey", linestyle="--", label="dashed: mean node accuracy")
    if not outside:
        axes[0][1].legend(handles=[*handles, dashed], loc="lower right", fontsize="small")
    if with_regret:
        for ax, key, ylabel in (
            (axes[2][0], "average_static_regret", "average static regret R_t / (n t)"),
            (axes[2][1], "average_dynamic_regret", "average dynamic regret"),
        ):
            for c, handle in zip(curves, handles, strict=True):
                if key in c.regret:
                    rx, ry, rsd = c.regret[key]
                    color = handle.get_color()
                    _draw(ax, rx, ry, rsd, positive_x=False, label=c.label, color=color)
            ax.set_xlabel("round")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        if not outside:
            axes[2][0].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if outside:
        fig.legend(
            handles=[*handles, dashed],
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=1 if max(len(c.label) for c in curves) > 40 else min(3, len(handles) + 1),
            fontsize="small",
            frameon=False,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out
