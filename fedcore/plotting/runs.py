"""What ``fedcore plot`` reads of a finished run: its records, its ``config.toml``, and the
runs a sweep or grid folder stands for."""

from __future__ import annotations

import contextlib
import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from fedcore.ids import child_path, clip

SWEEP_FILE = "sweep.json"  # as fedcore.simulation.sweep writes it (not imported: no torch here)


def load_evals(run_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """The run's name and its evaluation records (see :func:`load_records`)."""
    name, evals, _ = load_records(run_dir)
    return name, evals


def load_records(run_dir: Path) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's name, its evaluation records and its regret records (maybe none).

    Raises:
        ConfigError: no such folder, or it has no readable ``metrics.jsonl`` with
            evaluations.
    """
    run = load_run(run_dir)
    return run.name, run.evals, run.regret


@dataclass
class RunRecords:
    """What ``fedcore plot`` reads of one run folder."""

    path: Path
    name: str
    """``summary.json``'s name (the folder's name without one)."""
    evals: list[dict[str, Any]]
    regret: list[dict[str, Any]]
    rounds: list[dict[str, Any]]
    """The ``"kind": "round"`` records, one a round, in round order (none in old runs)."""
    summary: dict[str, Any]
    """``summary.json`` (empty without one)."""


_NODE_LINE = '{"node"'
"""How a ``"kind": "node"`` record's line starts (``RoundRecord.to_json``): skipped unread,
there may be a million a round."""


def load_run(run_dir: Path) -> RunRecords:
    """A run folder's records: evaluations, regret, rounds, and its summary.

    Raises:
        ConfigError: no such folder, or it has no readable ``metrics.jsonl`` with
            evaluations.
    """
    path = run_dir / "metrics.jsonl"
    if not run_dir.exists():
        raise ConfigError(
            f"{str(run_dir)!r} does not exist; give a run folder (one holding metrics.jsonl) "
            "or a sweep folder."
        )
    if not run_dir.is_dir():
        raise ConfigError(
            f"{str(run_dir)!r} is a file, not a run folder; give the folder that holds its "
            "metrics.jsonl."
        )
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder: it has no metrics.jsonl.")
    evals: list[dict[str, Any]] = []
    regret: list[dict[str, Any]] = []
    rounds: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.startswith(_NODE_LINE):
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{path}: line {lineno} is not JSON.") from None
            kind = record.get("kind")
            if kind == "eval":
                evals.append(record)
            elif kind == "regret":
                regret.append(record)
            elif kind == "round" and isinstance(record.get("round"), int):
                rounds[record["round"]] = record  # a round written twice: the last one
    if not evals:
        raise ConfigError(f"{path} has no evaluation records to plot.")
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, UnicodeError, json.JSONDecodeError):
        loaded = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            summary = loaded
    name = summary.get("name")
    return RunRecords(
        run_dir,
        name if isinstance(name, str) and name else run_dir.name,
        evals,
        regret,
        [rounds[t] for t in sorted(rounds)],
        summary,
    )


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


def _optional_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``config.toml``, or None where it has no readable one."""
    try:
        return load_run_config(run_dir, "")
    except ConfigError:
        return None
