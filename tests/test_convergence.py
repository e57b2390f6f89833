"""End-to-end learning on digits: the claims the docs make (marked slow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedcore.config import load_config
from fedcore.simulation.simulate import simulate

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, example: str | None, *overrides: str) -> dict[str, Any]:
    config = load_config(ROOT / "examples" / example if example else None, overrides)
    return simulate(config, out_dir=tmp_path / (example or "default"), show_progress=False)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("default"), None)


def test_default_run_learns(default_run: dict[str, Any]) -> None:
    """OPS on the 16-node directed social graph: >= 0.94 average model, >= 0.92 per node."""
    final = default_run["final"]
    assert default_run["algorithm"] == "ops" and default_run["nodes"] == 16
    assert final["avg_model_accuracy"] >= 0.94
    assert final["mean_node_accuracy"] >= 0.92
    assert default_run["traffic"]["messages_dropped"] == 0
    assert default_run["wall_seconds"] < 120


@pytest.mark.parametrize("example", ["central.toml", "dpsgd.toml", "ops-time-varying.toml"])
def test_references_match_ops_within_two_points(
    tmp_path: Path, default_run: dict[str, Any], example: str
) -> None:
    final = _run(tmp_path, example)["final"]
    ops = default_run["final"]
    assert abs(final["avg_model_accuracy"] - ops["avg_model_accuracy"]) <= 0.02
    assert abs(final["mean_node_accuracy"] - ops["mean_node_accuracy"]) <= 0.02


def test_local_is_far_worse_per_node(tmp_path: Path, default_run: dict[str, Any]) -> None:
    """LOCAL under label skew: each peer alone is poor on the full test set."""
    local = _run(tmp_path, "local.toml")["final"]
    assert local["mean_node_accuracy"] <= default_run["final"]["mean_node_accuracy"] - 0.2
    assert local["consensus_distance"] > 1.0
