"""Roster files: which ``HOST:PORT`` each peer of a deployment listens on (``fedcore node
--roster``, ``fedcore compose --roster``). Reading one needs neither torch nor gRPC."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from fedcore.ids import check_node_id, clip

__all__ = ["load_roster"]


def load_roster(path: str | Path) -> dict[str, str]:
    """Read a roster file (JSON object or TOML ``[peers]`` table) into id -> ``HOST:PORT``.

    Raises:
        ConfigError: unreadable file, bad syntax, a node id that is not a safe name
            (:mod:`fedcore.ids`), or an entry that is not ``HOST:PORT``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read roster {str(p)!r}: {exc.strerror}.") from exc
    try:
        raw: Any = tomllib.loads(text).get("peers") if p.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"roster {str(p)!r} is not valid {p.suffix[1:] or 'JSON'}: {exc}."
        ) from exc
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            f"roster {str(p)!r} must map node ids to 'HOST:PORT' (a JSON object, or a TOML "
            "[peers] table)."
        )
    roster: dict[str, str] = {}
    for node, address in raw.items():
        check_node_id(node, f"roster {str(p)!r}", ConfigError)
        host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        good_port = port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536
        if not sep or not host or not good_port:
            raise ConfigError(
                f"roster {str(p)!r}: {node!r} -> {clip(address)} is not 'HOST:PORT' "
                "(a port from 1 to 65535)."
            )
        roster[node] = address
    return roster
