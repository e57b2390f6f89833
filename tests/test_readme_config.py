"""The docs' example config block shows the built-in defaults, so it cannot drift.

The block is the ```toml fence under the "Config" heading (``docs/config.md``, found through
``tests.docs_text``, wherever the page with that heading is). Every key it sets,
and every commented-out ``# key = value`` line in it (keys that only some generators or
codecs read), must equal the built-in default run's value (``load_config(None)``), and every
key of the default run must appear in the block, set or named in a comment.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from fedcore.config import config_to_dict, load_config
from tests import docs_text

# Keys of the default run that the block leaves to another section of the docs.
DOCUMENTED_ELSEWHERE = {("transport", "tls")}  # docs/deployment.md: "mutual TLS"

_TABLE = re.compile(r"^\[([a-z_.]+)\]")
_COMMENTED = re.compile(r"^#\s*([a-z_]+\s*=.*)$")


def _block() -> str:
    section = docs_text.section("Config")
    found = re.search(r"^```toml\n(.*?)^```", section, re.S | re.M)
    assert found, "the docs' Config page has no ```toml block"
    return found.group(1)


def _plain(value: Any) -> Any:
    """TOML's reading of a value: tuples as lists, nested the same."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _commented() -> list[tuple[str, str, Any]]:
    """``(table, key, value)`` of each ``# key = value`` line that is a TOML assignment."""
    table, found = "", []
    for line in _block().splitlines():
        head = _TABLE.match(line)
        if head:
            table = head.group(1)
            continue
        match = _COMMENTED.match(line.strip())
        if not match:
            continue
        try:
            parsed = tomllib.loads(match.group(1))
        except tomllib.TOMLDecodeError:
            continue  # prose, not an assignment
        found += [(table, key, value) for key, value in parsed.items()]
    return found


@pytest.fixture(scope="module")
def defaults() -> dict[str, dict[str, Any]]:
    return _plain(config_to_dict(load_config(None)))  # type: ignore[no-any-return]


def test_every_key_shown_is_the_default(defaults: dict[str, dict[str, Any]]) -> None:
    shown = tomllib.loads(_block())
    assert set(shown) == set(defaults), "the block's tables are not the config's tables"
    wrong = [
        f"{table}.{key} = {value!r} (default {defaults[table].get(key, '<no such key>')!r})"
        for table, keys in shown.items()
        for key, value in keys.items()
        if key not in defaults[table]
        or defaults[table][key] != value
        or type(defaults[table][key]) is not type(value)
    ]
    assert not wrong, "the config block differs from the built-in defaults: " + "; ".join(wrong)


def test_every_commented_key_is_the_default(defaults: dict[str, dict[str, Any]]) -> None:
    commented = _commented()
    assert commented, "no '# key = value' lines found: has the block's layout changed?"
    wrong = [
        f"{table}.{key} = {value!r} (default {defaults.get(table, {}).get(key, '<none>')!r})"
        for table, key, value in commented
        if defaults.get(table, {}).get(key, object()) != value
    ]
    assert not wrong, "the config block's comments differ from the defaults: " + "; ".join(wrong)


def test_every_default_key_is_in_the_block(defaults: dict[str, dict[str, Any]]) -> None:
    block = _block()
    sections = re.split(r"^\[([a-z_.]+)\].*$", block, flags=re.M)
    text_of = dict(zip(sections[1::2], sections[2::2], strict=True))
    missing = [
        f"{table}.{key}"
        for table, keys in defaults.items()
        for key in keys
        if (table, key) not in DOCUMENTED_ELSEWHERE
        and not re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", text_of.get(table, ""))
    ]
    assert not missing, (
        "keys of the built-in config that the docs' config block does not show (add "
        "them to the ```toml block of docs/config.md, with their default): " + ", ".join(missing)
    )
