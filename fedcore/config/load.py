"""Reading a config: a TOML file and ``--set`` overrides into a validated
:class:`~fedcore.config.Config` (:func:`load_config`, :func:`config_from_dict`), with every
local path made absolute (:data:`PATH_KEYS`)."""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from fedcore import registry
from fedcore.config.constants import FOLDER, REMOVED_KEYS
from fedcore.config.experiment import TABLES, Config
from fedcore.config.overrides import parse_override
from fedcore.config.rules import check_name, shown
from fedcore.errors import ConfigError
from fedcore.registry import close_matches, did_you_mean

__all__ = ["PATH_KEYS", "config_from_dict", "load_config"]


_KEEPS_SPACES = frozenset({"topology.file"})
"""String keys whose value may start or end with whitespace (a file's name may)."""

_NAME_OR_COUNT = frozenset({"run.eval_peers"})
"""Keys that take a name or a whole number (``"all"`` or a count): their own rule checks
the type."""


def _coerce(key: str, value: object, default: object) -> object:
    """Check ``value`` against the type of the field's default (int accepted for float)."""
    if key in _NAME_OR_COUNT:
        ok = True
    elif isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok:
            try:
                value = float(value)  # type: ignore[arg-type]
            except OverflowError:
                raise ConfigError(
                    f"{key} = {shown(value)} is too large for a number; give a value below 1e308."
                ) from None
    elif isinstance(default, str):
        ok = isinstance(value, str)
        if isinstance(value, str) and value != value.strip() and key not in _KEEPS_SPACES:
            raise ConfigError(
                f"{key} = {shown(value)} has whitespace around it, which no name or choice "
                f"has; write {shown(value.strip())}."
            )
    else:
        ok = True
    if not ok:
        raise ConfigError(
            f"{key} must be of type {type(default).__name__}, got {shown(value)} "
            f"({type(value).__name__})."
        )
    return value


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Build a validated :class:`Config` from nested tables.

    Raises:
        ConfigError: unknown table or key, wrong type, or invalid value.
    """
    unknown = sorted(set(raw) - set(TABLES))
    if unknown:
        near = close_matches(unknown[0], TABLES)
        raise ConfigError(
            f"unknown config table [{unknown[0]}]"
            + (f"; did you mean {' or '.join(f'[{t}]' for t in near)}?" if near else "")
            + f" (tables: {', '.join(TABLES)})."
        )
    sections: dict[str, Any] = {}
    for name, cls in TABLES.items():
        table = raw.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"[{name}] must be a table, got {table!r}.")
        defaults = cls()
        names = {f.name for f in fields(cls)}
        takes_options = "options" in names
        known = names - {"options"}
        kwargs: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for key, value in table.items():
            removed = REMOVED_KEYS.get(f"{name}.{key}")
            if removed is not None:
                raise ConfigError(f"{name}.{key} was removed: {removed}")
            if key in known:
                kwargs[key] = _coerce(f"{name}.{key}", value, getattr(defaults, key))
            elif takes_options:
                options[key] = value
            else:
                hint = did_you_mean(key, known)
                raise ConfigError(
                    f"unknown key {name}.{key}"
                    + (f"; {hint}" if hint else "")
                    + f" (keys of [{name}]: {', '.join(sorted(known))})."
                )
        if takes_options:
            kwargs["options"] = options
        sections[name] = cls(**kwargs)
    return Config(**sections)


PATH_KEYS: tuple[tuple[str, ...], ...] = (
    ("topology", "file"),
    ("transport", "tls", "dir"),
    ("data", "root"),
    ("time", "compute_trace"),
    ("time", "availability_trace"),
)
"""The keys that hold a local path (as dotted paths split): :func:`load_config` makes them
absolute, and the ``PATH`` of ``data.dataset = "folder:PATH"``. The data, stream and model
keys otherwise name user code by import path, not by file."""


def _absolute_paths(raw: dict[str, Any], base: str) -> None:
    """Make every relative path of ``PATH_KEYS`` in ``raw`` absolute against ``base``.

    A leading ``~`` is the user's home folder. A value that is not a non-empty string is
    left for validation to report; an empty one means "none".
    """

    def absolute(value: str) -> str:
        return os.path.abspath(os.path.join(base, os.path.expanduser(value)))

    for keys in PATH_KEYS:
        table: object = raw
        for name in keys[:-1]:
            table = table.get(name) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            continue
        value = table.get(keys[-1])
        if isinstance(value, str) and value and value == value.strip():
            table[keys[-1]] = absolute(value)
    data = raw.get("data")
    dataset = data.get("dataset") if isinstance(data, dict) else None
    if isinstance(dataset, str) and dataset.startswith(FOLDER):
        path = dataset[len(FOLDER) :]
        if path and path == path.strip():
            data["dataset"] = FOLDER + absolute(path)  # type: ignore[index]


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Read ``path`` (or start from the built-in default), apply overrides, validate.

    Every path of ``PATH_KEYS`` comes back absolute: one written in the file relative to
    the file's folder, one given in ``overrides`` (or in no file) relative to the current
    directory. So the result, and the ``config.toml`` a run writes from it, mean the same
    files wherever they are used from.

    Raises:
        ConfigError: unreadable file, TOML syntax error, or any invalid key or value.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}.") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}.") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {str(path)!r} is not UTF-8 text: {exc.reason}."
            ) from exc
        except ValueError as exc:  # a number tomllib parses but Python will not convert
            raise ConfigError(
                f"config file {str(path)!r} cannot be read: {str(exc).split(';')[0]}."
            ) from exc
    raw = copy.deepcopy(raw)
    if path is not None:
        _absolute_paths(raw, os.path.dirname(os.path.abspath(path)))
    for item in overrides:
        keys, value = parse_override(item)
        section = raw
        for depth, name in enumerate(keys[:-1]):
            section = section.setdefault(name, {})
            if not isinstance(section, dict):
                raise ConfigError(f"[{'.'.join(keys[: depth + 1])}] must be a table.")
        section[keys[-1]] = value
    _absolute_paths(raw, os.getcwd())  # what the file left relative came from --set
    config = config_from_dict(raw)
    # Here, not in AlgorithmConfig: fedcore.testing names a run after an algorithm object.
    check_name("algorithm.name", config.algorithm.name, registry.ALGORITHMS)
    return config
