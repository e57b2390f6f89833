"""YAML for the files fedcore writes (compose files, Swarm stacks, Kubernetes manifests),
through PyYAML's safe dumper.

Two choices on top of ``yaml.safe_dump``: keys keep the order the writers give them (a
service's ``image`` before its ``command``), and a multi-line string is a ``|`` literal
block (a ConfigMap's TOML, a shell script), so that ``kubectl get -o yaml`` readers see the
file as it is; PyYAML falls back to a quoted string where a block could not hold the text
exactly (trailing blanks, tabs, a leading newline). Lines are never folded, and a string
YAML 1.1 would read as something else (``"on"``, ``"1"``) is quoted, as safe_dump does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

__all__ = ["dumps_yaml", "dumps_yaml_all"]


class _Dumper(yaml.SafeDumper):
    """The safe dumper, with block sequences indented under their key (``- item`` two
    spaces in), as Kubernetes' and compose's own examples are."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _string)


def dumps_yaml_all(documents: Iterable[Mapping[str, Any]]) -> str:
    """``documents`` as one YAML stream (``---`` between them)."""
    return yaml.dump_all(
        [dict(d) for d in documents],
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=False,
        width=2**31 - 1,
    )


def dumps_yaml(document: Mapping[str, Any]) -> str:
    """``document`` as YAML."""
    return dumps_yaml_all([document])
