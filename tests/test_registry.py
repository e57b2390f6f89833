"""The one list per family of names (:mod:`fedcore.registry`): every entry loads, and the
README documents every name (its algorithms table row for row)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedcore import registry

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
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
    words = set(re.findall(r"[a-z0-9-]+", README))  # the config reference lists them bare
    missing = [name for name in family.names if f"`{name}`" not in README and name not in words]
    assert not missing, f"README does not mention the {family.what}s {missing}"


def test_the_readme_algorithm_table_is_the_registry() -> None:
    section = README[README.index("## Algorithms") :]
    section = section[: section.index("\n## ", 1)]
    rows = re.findall(r"^\| `([a-z0-9]+)` \|", section, flags=re.M)
    assert sorted(rows) == sorted(registry.ALGORITHMS.names)


def test_a_family_refuses_a_name_listed_twice() -> None:
    entry = registry.Entry("x", "fedcore.models:logreg")
    with pytest.raises(ValueError, match="listed twice"):
        registry.Family("model", (entry, entry))
