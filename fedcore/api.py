"""The Python API: :func:`run` and :func:`sweep` return results instead of printing them.

``fedcore.run`` and ``fedcore.sweep`` (names of the package, loaded on first use, so that
``import fedcore`` stays cheap)::

    import fedcore

    result = fedcore.run("examples/dpsgd.toml", algorithm={"lr": 0.1}, run={"rounds": 20})
    result.final["avg_model_accuracy"]      # the final figures
    result.rounds                           # one dict per round (metrics.jsonl)
    result.to_dataframe()                   # the same as a pandas DataFrame (if installed)

    grid = fedcore.sweep("examples/dpsgd.toml", grid={"algorithm.lr": [0.1, 0.3]}, seeds=[0, 1])
    grid.table                              # one dict per cell: the grid keys, mean and std
    grid.best                               # the best cell

Config overrides are keyword arguments, in either form (mixed freely):

- a table as a dict: ``algorithm={"lr": 0.1}`` (``algorithm.lr = 0.1``), a sub-table as
  a nested dict (``transport={"tls": {"dir": "certs"}}``);
- a dotted key: ``**{"algorithm.lr": 0.1}``.

Values are Python values (numbers, strings, booleans, lists) and are checked as ``--set``
checks its values: a bad one raises :class:`~fedcore.errors.ConfigError` before any run.

Both are quiet unless ``progress=True``: nothing on stderr, fedcore's warnings included
(the summary's ``warnings`` lists them; a logging handler of your own that writes to a
file still gets them).
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore.config import (
    Config,
    config_from_dict,
    config_to_dict,
    load_config,
    parse_override,
    toml_value,
)
from fedcore.errors import ConfigError

__all__ = ["RunResult", "SweepResult", "run", "sweep"]

ConfigSource = str | Path | Config | Mapping[str, Any] | None
"""What :func:`run` takes as its config: a TOML file, a loaded :class:`Config`, a dict
of tables (``{"algorithm": {"name": "dpsgd"}}``; keys left out keep their defaults) or
None (the built-in run)."""


def _to_dataframe(rows: list[dict[str, Any]], what: str) -> Any:
    try:
        pandas = importlib.import_module("pandas")  # optional: not a dependency
    except ImportError:
        raise ImportError(
            f"{what}.to_dataframe() needs pandas, which fedcore does not install; "
            "`pip install pandas`, or use the list of dicts as it is."
        ) from None
    return pandas.DataFrame(rows)


@dataclass(frozen=True)
class RunResult:
    """A finished (or stopped) run: its summary, final figures, records and folder."""

    summary: dict[str, Any]
    """``summary.json`` (see "Outputs" in ``docs/sweeps-and-tracking.md``)."""
    out_dir: Path
    """The run folder (``config.toml``, ``metrics.jsonl``, ``summary.json``, ``curves.png``)."""

    @property
    def status(self) -> str:
        """``completed``, ``interrupted`` or ``failed``."""
        return str(self.summary.get("status", "completed"))

    @property
    def final(self) -> dict[str, Any]:
        """The final figures: ``avg_model_accuracy``, ``mean_node_accuracy``,
        ``consensus_distance``, ``average_loss`` ... (None: not a number)."""
        return dict(self.summary.get("final") or {})

    @functools.cached_property
    def records(self) -> list[dict[str, Any]]:
        """Every record of ``metrics.jsonl`` (each with its ``kind``: ``round``,
        ``node``, ``eval``, ``regret``), read on first use."""
        path = self.out_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The per-round records: one dict per round (``round``, ``loss``, bytes and
        messages sent, messages missing ...)."""
        return [r for r in self.records if r.get("kind") == "round"]

    @property
    def evals(self) -> list[dict[str, Any]]:
        """The evaluation records: one dict per evaluation round (accuracies, consensus
        distance)."""
        return [r for r in self.records if r.get("kind") == "eval"]

    def to_dataframe(self, kind: str = "round") -> Any:
        """The records of one ``kind`` (``round``, ``eval``, ``node``, ``regret``) as a
        pandas DataFrame.

        Raises:
            ImportError: pandas is not installed (fedcore does not need it).
        """
        return _to_dataframe([r for r in self.records if r.get("kind") == kind], "RunResult")


@dataclass(frozen=True)
class SweepResult:
    """A finished (or stopped) grid sweep: one row per cell, the best cell, its folder."""

    record: dict[str, Any]
    """The grid's ``sweep.json``: the grid, the seeds, each cell's runs and statistics."""
    out_dir: Path
    """The grid folder (``sweep.json``, ``results.csv``, one sweep folder per cell)."""

    @property
    def table(self) -> list[dict[str, Any]]:
        """One dict per cell, as ``results.csv``'s rows: each grid key's value, then
        ``<figure>_mean`` and ``<figure>_std`` of each final figure, then ``completed``,
        ``failed`` and ``out_dir`` (the cell's folder, inside :attr:`out_dir`)."""
        from fedcore.simulation.grid import table_rows

        return table_rows(list(self.record["grid"]), self.record["cells"])

    @property
    def best(self) -> dict[str, Any] | None:
        """The best cell: ``metric``, ``direction``, ``label``, ``values``, ``mean``,
        ``std``, ``n``, ``out_dir`` (None when no cell has a number for the metric)."""
        best = self.record.get("best")
        return dict(best) if best else None

    def to_dataframe(self) -> Any:
        """:attr:`table` as a pandas DataFrame.

        Raises:
            ImportError: pandas is not installed (fedcore does not need it).
        """
        return _to_dataframe(self.table, "SweepResult")


_BARE = re.compile(r"[A-Za-z0-9_.:/+-]+")


def _value_text(value: Any) -> str:
    """A Python value as ``--set`` text: a plain string as it is where ``--set`` reads
    it back as that string (``fp32``), anything else as TOML."""
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str) and _BARE.fullmatch(value):
        try:
            if parse_override(f"x.y={value}")[1] == value:
                return value
        except ConfigError:
            pass
    return toml_value(value)


def _override_items(overrides: Mapping[str, Any], where: str) -> list[str]:
    """Keyword overrides as ``--set`` items (``table.key=value``).

    Raises:
        ConfigError: a keyword that is neither ``table.key`` nor a table given as a dict.
    """
    items: list[str] = []
    for name, value in overrides.items():
        if "." in name:
            items.append(f"{name}={_value_text(value)}")
        elif isinstance(value, Mapping):
            for key, inner in value.items():
                items.append(f"{name}.{key}={_value_text(inner)}")
        else:
            raise ConfigError(
                f"{where}({name}={value!r}): give a config key as 'table.key' "
                f"(**{{'{name}.KEY': ...}}) or a whole table as a dict ({name}={{'KEY': ...}})."
            )
    for item in items:
        parse_override(item)  # the key's form, with --set's message
    return items


def _config(source: ConfigSource, items: Sequence[str]) -> Config:
    """The config of ``source`` with the ``--set`` ``items`` applied, validated."""
    if source is None or isinstance(source, str | Path):
        return load_config(source, items)
    if isinstance(source, Config):
        raw: dict[str, Any] = copy.deepcopy(config_to_dict(source))
    elif isinstance(source, Mapping):
        raw = copy.deepcopy(dict(source))
    else:
        raise ConfigError(
            f"fedcore.run: the config must be a TOML path, a Config, a dict of tables or "
            f"None, not {type(source).__name__}."
        )
    for item in items:
        keys, value = parse_override(item)
        section = raw
        for name in keys[:-1]:
            section = section.setdefault(name, {})
            if not isinstance(section, dict):
                raise ConfigError(f"[{'.'.join(keys[:-1])}] must be a table.")
        section[keys[-1]] = value
    return config_from_dict(raw)


def run(
    config: ConfigSource = None,
    /,
    *,
    out_dir: str | Path | None = None,
    engine: str | None = None,
    threads: int | str = "auto",
    progress: bool = False,
    force: bool = False,
    **overrides: Any,
) -> RunResult:
    """Run one simulation in this process and return its result.

    Args:
        config: A TOML path, a :class:`~fedcore.config.Config`, a dict of tables, or
            None (the built-in run).
        out_dir: The run folder (default ``runs/<name>-<timestamp>``).
        engine: ``vectorized``, ``messages``, ``auto`` or ``cohort``
            (``simulate.engine``).
        threads: torch threads for the rounds: a number, or ``"auto"`` (by the run's
            shape, as ``fedcore simulate``).
        progress: Print the progress line and fedcore's warnings on stderr (default:
            quiet; ``result.summary["warnings"]`` lists the warnings either way).
        force: Replace the run an existing ``out_dir`` holds.
        **overrides: Config overrides: ``algorithm={"lr": 0.1}`` or ``**{"algorithm.lr":
            0.1}``.

    Returns:
        The :class:`RunResult` (``status`` says whether it completed).

    Raises:
        ConfigError: a bad config or override (before any run).
    """
    from fedcore.simulation.simulate import simulate

    items = _override_items(overrides, "fedcore.run")
    if engine is not None:
        items.append(f"simulate.engine={_value_text(engine)}")
    cfg = _config(config, items)
    summary = simulate(
        cfg,
        out_dir=out_dir,
        show_progress=progress,
        force=force,
        overrides=items,
        threads=threads,
    )
    return RunResult(summary, Path(summary["out_dir"]))


def sweep(
    config: str | Path | None = None,
    /,
    *,
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int] | str = (0,),
    jobs: int = 1,
    out_dir: str | Path | None = None,
    best: str | None = None,
    threads: int | str = "auto",
    progress: bool = False,
    force: bool = False,
    resume: bool = False,
    **overrides: Any,
) -> SweepResult:
    """Run a grid sweep (``fedcore sweep``) and return its per-cell table.

    Args:
        config: A TOML path or None (the built-in run).
        grid: Dotted key -> its values, e.g. ``{"algorithm.lr": [0.1, 0.3]}``.
        seeds: The seeds of every cell (a list, or ``--seeds`` text such as ``"0-2"``).
        jobs: Runs at a time (spawned worker processes when more than 1).
        out_dir: The grid folder (default ``runs/<name>-grid-...-<timestamp>``).
        best: The final figure that picks the best cell (default: accuracy, max).
        threads: torch threads of each run (a number or ``"auto"``).
        progress: A line on stderr per finished run, and each distinct warning of the
            runs once (default: quiet; each run's ``summary.json`` lists its warnings).
        force: Replace the grid an existing ``out_dir`` holds.
        resume: Continue the grid in ``out_dir`` (its completed runs are kept).
        **overrides: Config overrides for every run, as for :func:`run`.

    Raises:
        ConfigError: a bad config, grid value, seed or override (before any run).
        FedcoreError: every run failed.
    """
    from fedcore.simulation.grid import GridAxis, parse_grid, run_grid
    from fedcore.simulation.seeds import parse_seeds

    if config is not None and not isinstance(config, str | Path):
        raise ConfigError("fedcore.sweep: the config must be a TOML path or None.")
    items = _override_items(overrides, "fedcore.sweep")
    if not isinstance(grid, Mapping) or not grid:
        raise ConfigError("fedcore.sweep needs a grid: {'table.key': [value, ...], ...}.")
    texts = []
    for key, values in grid.items():
        if isinstance(values, str) or not isinstance(values, Sequence):
            raise ConfigError(f"fedcore.sweep: grid[{key!r}] must be a list of values.")
        texts.append(f"{key}=" + ",".join(_value_text(v) for v in values))
    axes: list[GridAxis] = parse_grid(texts)
    seed_list = parse_seeds(seeds) if isinstance(seeds, str) else [int(s) for s in seeds]
    result = run_grid(
        config,
        items,
        axes,
        seed_list,
        jobs=jobs,
        out_dir=out_dir,
        force=force,
        resume=resume,
        best=best,
        show_progress=progress,
        threads=threads,
    )
    return SweepResult(result, Path(result["out_dir"]))
