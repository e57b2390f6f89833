"""A small YAML emitter for the files fedcore writes (compose files, Kubernetes manifests).

No YAML library is needed to write them. What it writes, in block style:

- mappings with string keys; a key is bare when YAML 1.1 reads it back as the same string
  (``image``, ``app.kubernetes.io/name``), else double-quoted (``"on"``, ``"1"``, ``"a b"``);
- sequences: ``- item`` lines two spaces in from their key; an item that is a mapping or a
  sequence starts on the dash's line and continues below it (``- name: "x"`` then
  ``  image: "y"``); a mapping's sequence of scalars is written in flow style
  (``[...]``) when it fits in :data:`FLOW_WIDTH` characters;
- strings double-quoted with JSON's escapes (valid in YAML's double-quoted style), so that
  no value is re-read as a number, boolean or null by YAML 1.1 parsers such as
  docker-compose's PyYAML; characters beyond the Basic Multilingual Plane as ``\\UXXXXXXXX``
  and DEL as ``\\u007f`` (YAML forbids both raw surrogate pairs and DEL in a stream);
- multi-line strings (with ``literal_blocks``, the default) as ``|`` literal blocks, when
  every line is plain printable ASCII without trailing blanks (a ConfigMap's TOML, a shell
  script), so that ``kubectl get -o yaml`` readers see the file as it is; the chomping
  indicator (``|``, ``|-``, ``|+``) keeps the exact trailing newlines; anything else stays a
  quoted string;
- ints and booleans as themselves. Floats, None and other types raise :class:`TypeError`
  (write them as strings: Kubernetes quantities such as ``"500m"`` are strings anyway).

:func:`dumps_yaml_all` writes several documents into one stream, separated by ``---``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["FLOW_WIDTH", "dumps_yaml", "dumps_yaml_all", "quote"]

# Keys written bare: words that YAML 1.1 reads back as the same string (not y, no, on, null...).
_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
_YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
FLOW_WIDTH = 100
"""A mapping's list of scalars fits on one line (``key: [a, b]``) up to this width."""

# Escapes json.dumps writes that YAML reads differently, each found from the string's start so
# that an escaped backslash ("\\\\") is never taken for the start of an escape.
_FIXUPS = re.compile(r"\\\\|\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})|\x7f")
# A line of a literal block: printable ASCII, no trailing blank (it could read as indentation).
_LITERAL_LINE = re.compile(r"(?:[\x20-\x7e]*[\x21-\x7e])?")


def _fixup(match: re.Match[str]) -> str:
    text = match.group(0)
    if text == "\x7f":
        return "\\u007f"
    if match.group(1) is None:
        return text  # an escaped backslash: unchanged
    high, low = int(match.group(1), 16), int(match.group(2), 16)
    return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"


def quote(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (JSON's escapes, fixed up where YAML differs)."""
    return _FIXUPS.sub(_fixup, json.dumps(text))


def _key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"YAML mapping keys must be strings here, got {key!r}.")
    plain = _PLAIN_KEY.fullmatch(key) and key.lower() not in _YAML11_WORDS
    return key if plain else quote(key)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote(value)
    raise TypeError(f"cannot write {value!r} as YAML here.")


def _literal_lines(value: object) -> list[str] | None:
    """The lines of ``value`` as a literal block (indicator first), or None to quote it."""
    if not isinstance(value, str) or "\n" not in value:
        return None
    body = value.removesuffix("\n")
    lines = body.split("\n")
    # The first line sets the block's indentation: it must not be empty or start with a blank.
    if not lines[0] or lines[0][0] == " ":
        return None
    if not all(_LITERAL_LINE.fullmatch(line) for line in lines):
        return None
    if value.endswith("\n\n"):
        indicator = "|+"  # keep: the trailing empty lines are content
    elif value.endswith("\n"):
        indicator = "|"  # clip: exactly one final newline
    else:
        indicator = "|-"  # strip: no final newline
    return [indicator, *lines]


class _Writer:
    def __init__(self, *, literal_blocks: bool, nested_sequences: bool) -> None:
        self.literal_blocks = literal_blocks
        self.nested_sequences = nested_sequences
        self.lines: list[str] = []

    def value_line(self, head: str, value: object, indent: int) -> None:
        """``head`` (``key:`` or ``-``) followed by a scalar, possibly a literal block."""
        block = _literal_lines(value) if self.literal_blocks else None
        if block is None:
            self.lines.append(f"{head} {_scalar(value)}")
            return
        self.lines.append(f"{head} {block[0]}")
        pad = " " * (indent + 2)
        self.lines.extend(pad + line if line else "" for line in block[1:])

    def mapping(self, value: Mapping[Any, Any], indent: int) -> None:
        pad = " " * indent
        for key, item in value.items():
            head = f"{pad}{_key(key)}:"
            if isinstance(item, list) and item and not _nested(item):
                flow = f"{head} [{', '.join(_scalar(v) for v in item)}]"
                if len(flow) <= FLOW_WIDTH:
                    self.lines.append(flow)
                    continue
            if isinstance(item, Mapping | list) and item:
                self.lines.append(head)
                self.collection(item, indent + 2)
            elif isinstance(item, Mapping):
                self.lines.append(f"{head} {{}}")
            elif isinstance(item, list):
                self.lines.append(f"{head} []")
            else:
                self.value_line(head, item, indent)

    def sequence(self, value: list[Any], indent: int) -> None:
        pad = " " * indent
        if not self.nested_sequences and _nested(value):
            raise TypeError("nested collections in a YAML sequence are not written here.")
        for item in value:
            if isinstance(item, Mapping | list) and item:
                # The item's first line moves up onto the dash's line: "- key: value".
                start = len(self.lines)
                self.collection(item, indent + 2)
                self.lines[start] = f"{pad}- {self.lines[start][indent + 2 :]}"
            elif isinstance(item, Mapping):
                self.lines.append(f"{pad}- {{}}")
            elif isinstance(item, list):
                self.lines.append(f"{pad}- []")
            else:
                self.value_line(f"{pad}-", item, indent)

    def collection(self, value: object, indent: int) -> None:
        if isinstance(value, Mapping):
            self.mapping(value, indent)
        elif isinstance(value, list):
            self.sequence(value, indent)
        else:
            raise TypeError(f"cannot write {value!r} as a YAML document.")


def _nested(items: list[Any]) -> bool:
    return any(isinstance(item, Mapping | list) for item in items)


def dumps_yaml(
    document: Mapping[str, Any],
    *,
    literal_blocks: bool = True,
    nested_sequences: bool = True,
) -> str:
    """Block-style YAML of ``document`` (see the module docstring for what it writes).

    Args:
        document: Nested mappings and lists of mappings, lists, strings, ints and booleans.
        literal_blocks: Write multi-line strings as ``|`` blocks where that is exact (else
            every string is double-quoted).
        nested_sequences: Allow mappings and lists inside sequences; False refuses them with
            a TypeError (the emitter's former, narrower contract).

    Raises:
        TypeError: a value it does not write (float, None, a non-string key, ...).
    """
    writer = _Writer(literal_blocks=literal_blocks, nested_sequences=nested_sequences)
    writer.collection(document, 0)
    return "\n".join(writer.lines or ["{}"]) + "\n"  # an empty document is {}, not null


def dumps_yaml_all(documents: Iterable[Mapping[str, Any]], *, literal_blocks: bool = True) -> str:
    """Several documents in one YAML stream, each started by ``---`` (``kubectl apply -f``)."""
    return "".join(
        "---\n" + dumps_yaml(document, literal_blocks=literal_blocks) for document in documents
    )
