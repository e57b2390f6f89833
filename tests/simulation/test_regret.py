"""Regret: the math on closed forms, and a finished run's curve against a direct count."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import load_config
from fedcore.errors import ConfigError, DataError
from fedcore.metrics import dynamic_regret, minimize, static_regret
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate
from fedcore.streams import SyntheticDrift


@given(
    seed=st.integers(0, 10**6),
    rounds=st.integers(1, 40),
    dim=st.integers(1, 5),
)
@settings(max_examples=25, deadline=None)
def test_quadratic_regret_has_its_closed_form(seed: int, rounds: int, dim: int) -> None:
    """f_t(x) = 0.5 ||x - c_t||^2: the best fixed x is mean(c); its total loss is
    0.5 sum_t ||c_t - mean(c)||^2; a learner that plays x_t suffers 0.5 sum ||x_t - c_t||^2."""
    gen = torch.Generator().manual_seed(seed)
    c = torch.randn(rounds, dim, generator=gen, dtype=torch.float64)
    played = torch.randn(rounds, dim, generator=gen, dtype=torch.float64)

    def total(x: torch.Tensor) -> tuple[float, torch.Tensor]:
        return float(0.5 * ((x - c) ** 2).sum()), (rounds * x - c.sum(0))

    best, minimum, grad_norm = minimize(total, torch.zeros(dim))
    torch.testing.assert_close(best, c.mean(0), rtol=0, atol=1e-8)
    assert grad_norm < 1e-7
    closed = 0.5 * float(((c - c.mean(0)) ** 2).sum())
    assert math.isclose(minimum, closed, rel_tol=1e-10, abs_tol=1e-12)
    suffered = 0.5 * float(((played - c) ** 2).sum())
    assert math.isclose(static_regret(suffered, minimum), suffered - closed, rel_tol=1e-12)
    # Dynamic regret against x*_t = c_t (loss 0 each round) is the whole suffered loss;
    # against any comparator it is suffered minus the comparator's losses.
    assert dynamic_regret(suffered, 0.0) == suffered
    shifted = c + 0.5
    comparator_loss = 0.5 * float(((shifted - c) ** 2).sum())
    assert math.isclose(comparator_loss, 0.125 * rounds * dim)
    assert dynamic_regret(suffered, comparator_loss) == suffered - comparator_loss


def test_synthetic_stream_is_seeded_and_drifts_by_m() -> None:
    source = SyntheticDrift(nodes=3, rounds=50, batch_size=8, seed=1, drift=6.0)
    again = SyntheticDrift(nodes=3, rounds=50, batch_size=8, seed=1, drift=6.0)
    a, b = source.stream(2), again.stream(2)
    for _ in range(5):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    path = sum(
        float(torch.linalg.vector_norm(source.comparator(t + 1) - source.comparator(t)))
        for t in range(49)
    )
    assert abs(path - 6.0) < 6.0 * 1e-3
    still = SyntheticDrift(nodes=3, rounds=50, batch_size=8, seed=1, drift=0.0)
    assert torch.equal(still.comparator(0), still.comparator(49))
    # sigma = 0: every example of a node-round is the adversarial point G v_{i,t}
    x, _ = SyntheticDrift(nodes=2, rounds=5, batch_size=4, seed=0, noise=0.0).stream(1).next_batch()
    assert torch.allclose(x, x[0].expand_as(x)) and math.isclose(
        float(x[0].norm()), 1.0, rel_tol=1e-6
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"features": 1}, "features"),
        ({"noise": -1.0}, "noise"),
        ({"noise": 0.0, "adversarial": 0.0}, "both 0"),
    ],
)
def test_synthetic_stream_rejects_bad_knobs(options: dict[str, float], match: str) -> None:
    with pytest.raises(DataError, match=match):
        SyntheticDrift(nodes=2, rounds=5, batch_size=4, seed=0, **options)  # type: ignore[arg-type]


def test_run_regret_matches_a_direct_count(tmp_path: Path) -> None:
    """LOCAL with lr 0: each node plays its initial model every round, so the suffered
    losses, the hindsight minimum and the comparator's losses can be counted directly."""
    overrides = [
        "data.stream=synthetic",
        "algorithm.name=local",
        "algorithm.lr=0",
        "topology.nodes=4",
        "run.rounds=20",
        "run.eval_every=10",
        "run.regret=true",
        "data.batch_size=8",
    ]
    summary = simulate(load_config(None, overrides), out_dir=tmp_path, show_progress=False)
    setup = prepare_run(load_config(None, overrides))
    objective, source = setup.objective(), setup.source
    assert isinstance(source, SyntheticDrift)
    w0 = setup.start
    suffered = comparator = 0.0
    for t in range(20):
        for i in range(4):
            x, y = source.batch(i, t)
            suffered += objective.loss_and_grad(w0, x, y)[0]
            w = torch.zeros(2, source.features)
            w[1] = source.comparator(t)
            comparator += objective.loss_and_grad(torch.cat([w.reshape(-1), torch.zeros(2)]), x, y)[
                0
            ]
    final = summary["final"]
    assert math.isclose(summary["regret"][-1]["suffered"], suffered, rel_tol=1e-5)
    assert math.isclose(final["dynamic_regret"], suffered - comparator, rel_tol=1e-4, abs_tol=1e-4)
    # Every node played the fixed w0, and the best fixed model does at least as well.
    assert 0 <= final["static_regret"] <= suffered
    assert final["average_static_regret"] == pytest.approx(final["static_regret"] / 80)
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    regret_lines = [json.loads(line) for line in lines if '"kind":"regret"' in line]
    assert [r["round"] for r in regret_lines] == [9, 19]


def test_regret_of_a_nonconvex_model_is_refused_not_skipped() -> None:
    overrides = ["model.name=mlp", "run.rounds=4", "topology.nodes=4", "run.regret=true"]
    with pytest.raises(ConfigError, match="needs a model whose loss is convex"):
        load_config(None, overrides)
