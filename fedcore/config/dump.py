"""Writing a config: nested tables of plain TOML values (:func:`config_to_dict`) and their
TOML text (:func:`dumps_toml`), as a run saves its ``config.toml``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from fedcore.config.experiment import TABLES, Config
from fedcore.errors import ConfigError

__all__ = ["config_to_dict", "dumps_toml", "toml_value"]


def config_to_dict(config: Config) -> dict[str, dict[str, Any]]:
    """Nested tables of ``config``, options flattened into their table."""
    out: dict[str, dict[str, Any]] = {}
    for name in TABLES:
        table = asdict(getattr(config, name))
        if name == "faults":  # plain TOML values, sets sorted (fingerprints must not vary)
            table["edge_drop"] = dict(sorted(table["edge_drop"].items()))
            for part in table["partitions"]:
                part["nodes"] = sorted(part["nodes"])
            table["partitions"] = list(table["partitions"])
            table["crashes"] = list(table["crashes"])
        if name == "time":
            for key in ("speeds", "edge_latency_s", "edge_bandwidth_mb_s"):
                table[key] = dict(sorted(table[key].items()))
        options = table.pop("options", None)
        if options:
            table.update(options)
        out[name] = table
    return out


def toml_value(value: Any) -> str:
    """``value`` (a bool, number, string, list or table of them) as TOML text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise ConfigError(f"cannot write {value!r} as a TOML value.")


def dumps_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """Write nested tables of scalars as TOML (enough for configs)."""
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in table.items())
        lines.append("")
    return "\n".join(lines)
