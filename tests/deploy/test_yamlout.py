"""The YAML of the files fedcore writes (:mod:`fedcore.deploy.yamlout`): what it writes
reads back, through PyYAML's safe loader, as exactly the document it was given; multi-line
text is a literal block where one holds it exactly; keys keep their order."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.deploy.yamlout import dumps_yaml, dumps_yaml_all


def load(text: str) -> Any:
    return yaml.safe_load(text)


def test_sequences_are_indented_under_their_key_and_keys_keep_their_order() -> None:
    document = {
        "containers": [
            {"name": "n0", "ports": [{"containerPort": 7000, "name": "grpc"}], "args": ["a"]},
            {"name": "n1", "env": [{"name": "HOME", "value": "/tmp"}]},
        ],
        "matrix": [[1, 2], [], {}, [[True]], {"a": {"b": [{"c": "d"}]}}],
        "after": 1,
    }
    text = dumps_yaml(document)
    assert load(text) == document
    lines = text.splitlines()
    assert lines[:4] == ["containers:", "  - name: n0", "    ports:", "      - containerPort: 7000"]
    assert [line for line in lines if not line.startswith(" ")] == [
        "containers:",
        "matrix:",
        "after: 1",
    ]


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
def test_strings_a_literal_block_would_change_read_back_exactly(text: str) -> None:
    assert load(dumps_yaml({"a": text})) == {"a": text}


def test_values_yaml_11_would_reread_stay_strings() -> None:
    document = {"on": "yes", "1": "0x1F", "null": "~", "k": ["true", "1.5", "", "-"], "x": 1.5}
    out = dumps_yaml(document)
    assert load(out) == document
    for text in ["\U0001f600 astral", "del \x7f", "\\ud83d\\ude00 (backslashes)", "\x00"]:
        assert load(dumps_yaml({"k": text})) == {"k": text}


def test_long_strings_are_not_folded() -> None:
    text = " ".join(["word"] * 200)
    out = dumps_yaml({"k": text})
    assert len(out.splitlines()) == 1 and load(out) == {"k": text}


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


# 100 documents here; the streams below give the same emitter (dumps_yaml is dumps_yaml_all
# of one document) about 100 more of the same strategy.
@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_keys, _documents, max_size=5))
def test_generated_documents_round_trip(document: dict[str, Any]) -> None:
    assert load(dumps_yaml(document)) == document


@settings(max_examples=50, deadline=None)
@given(st.lists(st.dictionaries(_keys, _documents, min_size=1, max_size=3), max_size=4))
def test_generated_streams_round_trip(documents: list[dict[str, Any]]) -> None:
    assert list(yaml.safe_load_all(dumps_yaml_all(documents))) == documents
