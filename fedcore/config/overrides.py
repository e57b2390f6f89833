"""``--set KEY=VALUE``: a dotted key and a TOML value (:func:`parse_override`)."""

from __future__ import annotations

import tomllib
from typing import Any

from fedcore.errors import ConfigError

__all__ = ["parse_override"]


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``"a.b=value"`` (or ``"a.b.c=value"`` for a sub-table such as
    ``transport.tls.dir``) into ``(["a", "b"], value)``; value as TOML, else a string."""
    key, sep, text = item.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) not in (2, 3) or not all(path):
        raise ConfigError(
            f"--set {item!r} must look like TABLE.KEY=VALUE, e.g. --set algorithm.lr=0.1."
        )
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    except ValueError as exc:  # a number tomllib parses but Python will not convert
        raise ConfigError(
            f"--set {key.strip()}=... cannot be read: {str(exc).split(';')[0]}."
        ) from None
    return path, value
