"""Step-size schedules, warm-up and batch-size scaling (issue 15, item 2)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from fedcore.config import load_config
from fedcore.errors import ConfigError
from fedcore.node import lr_at
from fedcore.simulation.simulate import simulate


def test_warm_up_rises_linearly_to_the_base_rate() -> None:
    assert [lr_at(1.0, "constant", t, warmup=4) for t in range(6)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
        1.0,
    ]


def test_cosine_and_poly_decay_over_the_rounds_after_warm_up() -> None:
    rounds, warmup = 14, 4  # 10 rounds of decay: s = 0 .. 9
    assert lr_at(2.0, "cosine", 4, rounds=rounds, warmup=warmup) == 2.0
    assert math.isclose(lr_at(2.0, "cosine", 9, rounds=rounds, warmup=warmup), 1.0)
    assert math.isclose(lr_at(2.0, "poly", 9, rounds=rounds, warmup=warmup, power=2.0), 0.5)
    late = [lr_at(2.0, "cosine", t, rounds=rounds, warmup=warmup) for t in range(4, 14)]
    assert all(a > b for a, b in itertools.pairwise(late)) and late[-1] > 0
    assert lr_at(2.0, "sqrt", 7, warmup=4) == 2.0 / 2.0  # sqrt restarts after warm-up


def test_a_decay_needs_rounds_beyond_the_warm_up() -> None:
    with pytest.raises(ConfigError, match="beyond the warm-up"):
        lr_at(1.0, "cosine", 5, rounds=5, warmup=5)


@pytest.mark.parametrize(
    ("scaling", "lr", "warmup"), [("none", 0.1, 8), ("linear", 0.4, 2), ("sqrt", 0.2, 8)]
)
def test_batch_size_scaling_is_recorded_as_used(
    scaling: str, lr: float, warmup: int, tmp_path: Path
) -> None:
    config = load_config(
        None,
        [
            "run.rounds=12",
            "data.batch_size=128",
            "algorithm.lr=0.1",
            "algorithm.warmup_rounds=8",
            f"algorithm.lr_scaling={scaling}",
            "algorithm.base_batch_size=32",
        ],
    )
    summary = simulate(config, out_dir=tmp_path, show_progress=False)
    step = summary["step_size"]
    assert math.isclose(step["lr"], lr) and step["warmup_rounds"] == warmup
    assert step["lr_scaling"] == scaling
    rates = [
        json.loads(line)["lr"]
        for line in (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        if '"kind":"node"' in line and '"node":"n0"' in line
    ]
    assert math.isclose(rates[warmup - 1], lr) and math.isclose(rates[0], lr / warmup)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algorithm.lr_scaling=sqrt"], "base_batch_size"),
        (["algorithm.lr_schedule=step"], "lr_schedule"),
        (["algorithm.lr_power=0"], "lr_power"),
        (["algorithm.warmup_rounds=-1"], "warmup_rounds"),
    ],
)
def test_bad_schedules_are_refused(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(None, overrides)


def test_both_engines_take_the_same_steps(tmp_path: Path) -> None:
    base = ["run.rounds=30", "algorithm.lr_schedule=cosine", "algorithm.warmup_rounds=5"]
    digests = []
    for engine in ("messages", "vectorized"):
        config = load_config(None, [*base, f"simulate.engine={engine}"])
        summary = simulate(config, out_dir=tmp_path / engine, show_progress=False)
        assert summary["engine"] == engine
        digests.append(summary["params_sha256"])
    assert digests[0] == digests[1]


def test_a_batch_larger_than_a_nodes_data_warns_and_names_lr_scaling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Batches are clipped to a node's data, with one warning (issue 27: it was an info
    line, hidden by default); under lr_scaling (which scales by the configured batch size)
    the warning says so too."""
    from fedcore.setup.prepare import prepare_run

    big = ["data.batch_size=512", "topology.nodes=4"]
    with caplog.at_level("INFO", logger="fedcore"):
        prepare_run(load_config(None, big))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "larger than the" in warned[0]
    assert "lr_scaling" not in warned[0]
    caplog.clear()
    scaled = [*big, "algorithm.lr_scaling=linear", "algorithm.base_batch_size=32"]
    prepare_run(load_config(None, scaled))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned and "lr_scaling still scales by data.batch_size" in warned[0]
