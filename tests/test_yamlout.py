"""The small YAML emitter (:mod:`fedcore.deploy.yamlout`): what it writes reads back, through
PyYAML's safe loader, as exactly the document it was given."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.deploy import compose
from fedcore.deploy.yamlout import FLOW_WIDTH, dumps_yaml, dumps_yaml_all, quote

yaml = pytest.importorskip("yaml")


def load(text: str) -> Any:
    return yaml.safe_load(text)


def test_sequences_of_mappings_are_block_items_with_the_first_key_on_the_dash_line() -> None:
    document = {
        "containers": [
            {"name": "n0", "ports": [{"containerPort": 7000, "name": "grpc"}], "args": ["a"]},
            {"name": "n1", "env": [{"name": "HOME", "value": "/tmp"}]},
        ],
        "matrix": [[1, 2], [], {}, [[True]], {"a": {"b": [{"c": "d"}]}}],
    }
    text = dumps_yaml(document)
    assert load(text) == document
    lines = text.splitlines()
    assert lines[:4] == [
        "containers:",
        '  - name: "n0"',
        "    ports:",
        "      - containerPort: 7000",
    ]
    assert "  - - 1" in lines and "  - []" in lines and "  - {}" in lines


@pytest.mark.parametrize(
    ("text", "indicator"),
    [
        ('[run]\nseed = 1\n\n[topology]\nkind = "ring"\n', "|"),
        ("no final newline\n  indented", "|-"),
        ("trailing\nempty lines\n\n\n", "|+"),
        ("#!/bin/sh\nset -eu\n  kubectl cp a b  # comment: x\n---\n...\n", "|"),
    ],
)
def test_multi_line_strings_are_exact_literal_blocks(text: str, indicator: str) -> None:
    document = {"data": {"config.toml": text}, "items": [text, {"k": text}]}
    out = dumps_yaml(document)
    assert f"  config.toml: {indicator}" in out.splitlines()
    assert load(out) == document
    # Inside a stream of documents too (a block's "---" line is indented, never a separator).
    assert list(yaml.safe_load_all(dumps_yaml_all([document, {"b": 1}]))) == [document, {"b": 1}]


@pytest.mark.parametrize(
    "text",
    [" leading blank\nx", "\nleading newline", "trailing blank \nx", "tab\tx\ny", "é\nx", "a\r\nb"],
)
def test_strings_a_literal_block_would_change_stay_quoted(text: str) -> None:
    out = dumps_yaml({"a": text})
    assert out == f"a: {quote(text)}\n"
    assert load(out) == {"a": text}


def test_quoting_survives_what_json_escapes_and_yaml_reads_differently() -> None:
    for text in ["\U0001f600 astral", "del \x7f", "\\ud83d\\ude00 (backslashes)", "\\\x7f", "\x00"]:
        assert load(dumps_yaml({"k": text})) == {"k": text}
    assert quote("\U0001f600") == '"\\U0001f600"'


def test_keys_are_bare_only_when_yaml_reads_them_back_as_the_same_string() -> None:
    document = {"app.kubernetes.io/name": "x", "on": 1, "Off": 2, "1": 3, "a b": 4, "-x": 5}
    out = dumps_yaml(document)
    assert "app.kubernetes.io/name: " in out and '"on": 1' in out and '"1": 3' in out
    assert load(out) == document


def test_flow_lists_only_up_to_the_width() -> None:
    short = {"k": ["a", "b"]}
    assert dumps_yaml(short) == 'k: ["a", "b"]\n'
    wide = {"k": ["x" * FLOW_WIDTH]}
    assert dumps_yaml(wide).splitlines()[1].startswith("  - ")
    assert load(dumps_yaml(wide)) == wide


def test_it_refuses_what_it_cannot_write() -> None:
    for bad in ({"a": 1.5}, {"a": None}, {1: "a"}, {"a": [object()]}):
        with pytest.raises(TypeError):
            dumps_yaml(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        dumps_yaml({"a": [{"b": 1}]}, nested_sequences=False)


def test_compose_keeps_its_narrower_contract() -> None:
    """compose.dumps_yaml is the emitter as compose files used it: quoted strings only, nothing
    nested in a sequence, so a compose file is byte-for-byte what it was before the move."""
    assert compose.dumps_yaml({"a": "x\ny\n"}) == 'a: "x\\ny\\n"\n'
    with pytest.raises(TypeError):
        compose.dumps_yaml({"a": [{"b": 1}]})


# --- generated documents --------------------------------------------------------------------

_keys = st.text(max_size=12)
_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.text(max_size=30),
    # Multi-line text in the alphabet where literal blocks apply, and around its edges.
    st.lists(st.text(alphabet=" #:-|>ab\t", max_size=8), min_size=2, max_size=5).map("\n".join),
)
_documents = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, _documents, max_size=5))
def test_generated_documents_round_trip(document: dict[str, Any]) -> None:
    assert load(dumps_yaml(document)) == document
    assert load(dumps_yaml(document, literal_blocks=False)) == document


@settings(max_examples=50, deadline=None)
@given(st.lists(st.dictionaries(_keys, _documents, min_size=1, max_size=3), max_size=4))
def test_generated_streams_round_trip(documents: list[dict[str, Any]]) -> None:
    assert list(yaml.safe_load_all(dumps_yaml_all(documents))) == documents
