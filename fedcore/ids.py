"""Node ids as safe names, bounded text for logs, and paths that stay inside their parent.

A node id names a folder (``nodes/<id>/``, ``<id>.crt``), a DNS name in a TLS
certificate, a docker-compose service and a host name on a compose network, and it travels
on the wire. So an id is a short ASCII name::

    1 to 63 characters from  A-Z a-z 0-9 . _ -   starting with a letter or a digit

That rules out path separators, ``.`` and ``..``, whitespace, control characters and
non-ASCII letters (which certificates cannot carry as DNS names and file systems spell
differently). Every place an id enters (graph files, generators, rosters, certificates,
the command line) checks it with :func:`check_node_id`; the wire needs no check of its
own, because a sender must be a trusted in-neighbour, which is an id of the graph.

Anything a peer did not write itself (a claimed sender id, a stranger's error text) goes
into a log line through :func:`clip`, so that a megabyte of id costs one short line.
"""

from __future__ import annotations

import re
from pathlib import Path

from fedcore.errors import FedcoreError

__all__ = [
    "MAX_ID_LENGTH",
    "NODE_ID_RULE",
    "check_node_id",
    "child_path",
    "clip",
    "error_text",
    "first_line",
    "id_problem",
    "shorten",
    "unsafe_id",
]

MAX_ID_LENGTH = 63
"""Longest node id: one DNS label."""

NODE_ID_RULE = (
    f"1 to {MAX_ID_LENGTH} ASCII letters, digits, '.', '_' or '-', starting with a letter or "
    "a digit"
)
"""The rule, as error messages state it."""

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def clip(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to about ``limit`` characters, saying how much was left out."""
    return shorten(repr(value), limit)


def shorten(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def id_problem(node_id: object) -> str | None:
    """Why ``node_id`` is not a safe node id, or ``None`` when it is one.

    The reason names the first thing wrong (a path separator, whitespace, a non-ASCII
    character ...), so that a message can say what to change.
    """
    if not isinstance(node_id, str):
        return f"node ids are strings, not {type(node_id).__name__}"
    if not node_id:
        return "it is empty"
    if len(node_id) > MAX_ID_LENGTH:
        return f"it has {len(node_id)} characters (at most {MAX_ID_LENGTH})"
    if _ID.fullmatch(node_id) is not None:
        return None
    if node_id in (".", ".."):
        return "it names a folder's own or parent folder"
    for ch in node_id:
        if ch in "/\\":
            return f"it contains the path separator {ch!r}"
        if ch.isspace():
            return f"it contains whitespace ({ch!r})"
        if not ch.isascii():
            return (
                f"it contains the non-ASCII character {ch!r}, which a certificate cannot carry "
                "in a DNS name"
            )
        if not ch.isprintable():
            return f"it contains the control character {ch!r}"
    if not node_id[0].isalnum():
        return f"it starts with {node_id[0]!r}"
    bad = next(ch for ch in node_id if not (ch.isalnum() or ch in "._-"))
    return f"it contains {bad!r}"


def unsafe_id(node_id: object, where: str) -> str | None:
    """The sentence (without its full stop) saying why ``node_id``, found in ``where``, is
    not a safe node id, or ``None`` when it is one."""
    problem = id_problem(node_id)
    if problem is None:
        return None
    return (
        f"{where} has the node id {clip(node_id, 40)}, which is not a safe name: {problem}. "
        f"Node ids are {NODE_ID_RULE} (they name folders, certificates and hosts)"
    )


def check_node_id(node_id: object, where: str, error: type[FedcoreError] = FedcoreError) -> str:
    """Return ``node_id`` if it is a safe node id; raise ``error`` naming ``where`` if not.

    Args:
        node_id: The candidate.
        where: Where it came from, for the message ("graph file 'g.json'", "the roster").
        error: The error class to raise (``TopologyError`` for graphs, ``ConfigError`` ...).
    """
    message = unsafe_id(node_id, where)
    if message is not None:
        raise error(f"{message}.")
    assert isinstance(node_id, str)
    return node_id


def child_path(parent: Path, name: str, error: type[FedcoreError] = FedcoreError) -> Path:
    """``parent / name``, checked to be one entry of ``parent`` (no separator, ``.`` or ``..``).

    The check is on the name, not on the disk: ``name`` must be a single path component, so
    ``parent / name`` is a direct child of ``parent`` whatever exists. A symbolic link that
    the user put inside ``parent`` is followed as usual (it is theirs to make); a name from a
    file or the network cannot climb out.

    Raises:
        error: ``name`` is not a single path component (empty, ``.``, ``..``, a separator, a
            NUL byte, an absolute path).
    """
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or Path(name).is_absolute()
    ):
        raise error(
            f"{clip(name, 40)} cannot name a file or folder inside {str(parent)!r}: it must be "
            "a single name, without '/', '\\', '.' or '..'."
        )
    path = parent / name
    if path.parent != parent or path.name != name:  # e.g. a Windows drive such as "c:"
        raise error(f"{clip(name, 40)} leads outside {str(parent)!r}.")
    return path


def first_line(text: str) -> str:
    """The first line of ``text``, with `` [...]`` when more lines follow (``""`` if empty)."""
    lines = text.strip().splitlines()
    if not lines:
        return ""
    return lines[0] + (" [...]" if len(lines) > 1 else "")


def error_text(exc: BaseException, limit: int = 300) -> str:
    """``"Type: first line of the message"``, cut to about ``limit`` characters.

    For a message that quotes another library's error (a user factory that raised, a torch
    allocation failure with a C++ backtrace): one line, whatever the error says.
    """
    line = first_line(str(exc))
    text = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return shorten(text, limit)
