"""The one list per family of names (:mod:`fedcore.registry`): every entry loads, and the
docs (the README and ``docs/``) document every name (the algorithms table of
``docs/algorithms.md`` and the models table of ``docs/datasets-and-models.md`` row for
row)."""

from __future__ import annotations

import re

import pytest

from fedcore import registry
from tests import docs_text

DOCS = docs_text.all_text()
FAMILIES = [
    registry.ALGORITHMS,
    registry.CODECS,
    registry.OPTIMIZERS,
    registry.TOPOLOGY_KINDS,
    registry.DATASETS,
    registry.MODELS,
]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.what)
def test_every_entry_loads_a_factory(family: registry.Family) -> None:
    for name in family.names:
        assert callable(family.load(name)), name


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.what)
def test_the_readme_names_every_entry(family: registry.Family) -> None:
    words = set(re.findall(r"[a-z0-9-]+", DOCS))  # the config reference lists them bare
    missing = [name for name in family.names if f"`{name}`" not in DOCS and name not in words]
    assert not missing, f"the docs do not mention the {family.what}s {missing}"


def test_the_readme_algorithm_table_is_the_registry() -> None:
    section = docs_text.section("Algorithms").split("\n## ", 1)[0]  # the page's first table
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M)
    assert sorted(rows) == sorted(registry.ALGORITHMS.names)


def test_a_family_refuses_a_name_listed_twice() -> None:
    entry = registry.Entry("x", "fedcore.models:logreg")
    with pytest.raises(ValueError, match="listed twice"):
        registry.Family("model", (entry, entry))


def test_the_readme_model_table_is_the_registry() -> None:
    """The docs' models table: a row for every built-in model, each parameter count the
    one the model has on the input and classes its row names."""
    from fedcore.models import parameter_count

    section = docs_text.section("Models")
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|.*?\| ([^|]+) \| ([^|]+) \| [^|]+ \|$", section, re.M)
    assert sorted(name for name, _, _ in rows) == sorted(registry.MODELS.names)
    for name, shape, count in rows:
        dims, classes = shape.rsplit(",", 1)
        found = re.search(r"\((?:\w+: )?(\d+)\)", dims)
        sizes = [int(found.group(1))] if found else [int(v) for v in re.findall(r"\d+", dims)]
        input_dim = 1
        for v in sizes if found else sizes[:3]:
            input_dim *= v
        if name == "char-lstm":
            input_dim = sizes[0]
        counts = [int(v.replace(",", "")) for v in re.findall(r"\d[\d,]*\d|\d", count)]
        width = {"mlp": 64, "cnn1d": 32}.get(name, 0)
        options = {"hidden": width} if width else {}
        expected = parameter_count(name, input_dim=input_dim, num_classes=int(classes), **options)
        assert counts[0] == expected, (name, counts, expected)
        if name == "resnet20":
            none = parameter_count(name, input_dim=input_dim, num_classes=10, norm="none")
            batch = parameter_count(name, input_dim=input_dim, num_classes=10, norm="batch")
            assert counts[1] == none and batch == expected
