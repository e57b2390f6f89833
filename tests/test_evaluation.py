"""Batched evaluation (fedcore.evaluation) against one model at a time, and the incremental
regret (RegretTracker) against the curve computed after the run (regret_curve).

Tolerances: an accuracy is a count of predictions, compared exactly: the chunked path
computes the same float logits as the module (one matrix product per layer, the same
sums), so every prediction is the same. The consensus distance is compared at a relative
1e-12: its mean is summed chunk by chunk rather than in one reduction (float64 rounding
of a different order). The suffered losses are the same additions in the same order,
compared exactly; the dynamic comparator's at a relative 1e-12 (a round with a node down
may list its samples in another order). The static regret is compared at 1e-8 of
the suffered total: both sides solve the hindsight problem to a tolerance (L-BFGS to a
gradient of 1e-8 or 500 evaluations after the run; Newton to a decrement of 1e-12 of the
minimum during it), so they agree to the looser of the two.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.config import load_config
from fedcore.evaluation import hits, stacked_figures
from fedcore.metrics import consensus_distance, evaluate_models, minimize
from fedcore.models import Objective, build_model
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.regret import _binary_newton, regret_curve
from fedcore.simulation.simulate import simulate

_results = importlib.import_module("fedcore.simulation.results")


def _objective(model: str, features: int, classes: int, mode: str | None = None) -> Objective:
    options = {"hidden": 7} if model in ("mlp", "cnn1d") else {}
    module = build_model(model, input_dim=features, num_classes=classes, seed=3, **options)
    return Objective(module, gradient_mode=mode)


@pytest.mark.parametrize(
    ("model", "features", "classes", "mode"),
    [
        ("logreg", 10, 2, None),
        ("logreg", 12, 5, None),
        ("mlp", 9, 3, None),
        ("mlp", 6, 2, None),
        ("cnn1d", 16, 3, "vmap"),
    ],
)
@pytest.mark.parametrize("chunk_bytes", [1, 3000, 1 << 20])
def test_stacked_figures_equal_one_model_at_a_time(
    model: str, features: int, classes: int, mode: str | None, chunk_bytes: int
) -> None:
    """37 models (no chunk size divides it), one diverged (NaN) and one all zeros (every
    logit tied: argmax says class 0), on 50 test examples."""
    objective = _objective(model, features, classes, mode)
    assert objective.rows.mode == (mode or "batched")
    gen = torch.Generator().manual_seed(1)
    params = torch.randn(37, objective.numel, generator=gen) * 0.7
    params[5] = math.nan
    params[11] = 0.0
    x = torch.randn(50, features, generator=gen)
    y = torch.randint(0, classes, (50,), generator=gen)
    accuracy, distance = stacked_figures(objective.rows, params, x, y, chunk_bytes=chunk_bytes)
    expected = [objective.evaluate(p, x, y)[1] for p in params]
    assert accuracy.tolist() == expected
    finite = params[torch.arange(37) != 5]
    _, finite_distance = stacked_figures(objective.rows, finite, x, y, chunk_bytes=chunk_bytes)
    assert math.isclose(finite_distance, consensus_distance(list(finite)), rel_tol=1e-12)
    assert math.isnan(distance) and math.isnan(consensus_distance(list(params)))


def test_hits_reads_argmax_off_one_comparison() -> None:
    """Two classes: ties, infinities and NaNs predicted as argmax predicts them."""
    values = torch.tensor([0.0, 1.0, -1.0, math.inf, -math.inf, math.nan])
    pairs = torch.cartesian_prod(values, values)  # [36, 2]: every pair of logits
    logits = pairs.unsqueeze(0).repeat(2, 1, 1)
    y = torch.randint(0, 2, (36,), generator=torch.Generator().manual_seed(0))
    expected = (logits.argmax(dim=-1) == y).sum(dim=1)
    assert hits(logits, y).tolist() == expected.tolist()


def test_evaluate_models_equals_the_module_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message engine's evaluation, batched, against its module-by-module form (also
    with a server, whose model is the average model and not a node's)."""
    objective = _objective("logreg", 8, 3)
    gen = torch.Generator().manual_seed(2)
    models = {f"n{i}": torch.randn(objective.numel, generator=gen) for i in range(13)}
    x = torch.randn(40, 8, generator=gen)
    y = torch.randint(0, 3, (40,), generator=gen)
    for server in (None, "n4"):
        batched = evaluate_models(objective, models, x, y, server=server)
        monkeypatch.setattr(objective.rows, "mode", "module")
        one_by_one = evaluate_models(objective, models, x, y, server=server)
        monkeypatch.undo()
        distance = batched.pop("consensus_distance")
        assert math.isclose(distance, one_by_one.pop("consensus_distance"), rel_tol=1e-12)
        assert batched == one_by_one


def _run_with_losses(
    overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Path | None
) -> tuple[dict[str, Any], dict[str, list[float | None]], list[int]]:
    """Run; return the summary, every node's losses and the evaluation rounds, as the
    end of the run saw them."""
    seen: dict[str, Any] = {}
    original = _results.add_regret

    def add_regret(setup: Any, observer: Any, out: Path) -> Any:
        seen["losses"] = {n: list(row) for n, row in observer.losses.items()}
        seen["evals"] = [e["round"] for e in observer.evals]
        return original(setup, observer, out)

    monkeypatch.setattr(_results, "add_regret", add_regret)
    summary = simulate(load_config(config, overrides), out_dir=tmp_path, show_progress=False)
    return summary, seen["losses"], seen["evals"]


@pytest.mark.parametrize("engine", ["vectorized", "messages"])
@pytest.mark.parametrize(
    "case",
    ["stream", "stream-crashes", "dataset"],
)
def test_incremental_regret_equals_the_curve_after_the_run(
    engine: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DOG on the synthetic stream (Newton, dynamic regret; with a crashed node: rounds
    with a node down), and D-PSGD on digits (ten classes: L-BFGS, no comparator); 30
    rounds evaluated every 7 (the last evaluation is not on the period)."""
    overrides = [
        "topology.kind=ring",
        "topology.nodes=6",
        "run.rounds=30",
        "run.eval_every=7",
        "run.regret=true",
        "model.name=logreg",
        f"simulate.engine={engine}",
    ]
    config = None
    if case == "dataset":
        overrides += ["algorithm.name=dpsgd", "run.rounds=12", "run.eval_every=5"]
    else:
        overrides += ["algorithm.name=dog", "data.stream=synthetic", "data.batch_size=3"]
    if case == "stream-crashes":
        config = tmp_path / "crashes.toml"
        config.write_text(
            '[faults]\ncrashes = [{ node = "n1", at = 3, back = 9 }, { node = "n4", at = 20 }]\n',
            encoding="utf-8",
        )
    summary, losses, evals = _run_with_losses(overrides, tmp_path / "run", monkeypatch, config)
    assert summary["engine"] == engine
    setup = prepare_run(load_config(config, overrides))
    after = regret_curve(setup, losses, evals)
    during = summary["regret"]
    assert [r["round"] for r in during] == evals == [r["round"] for r in after]
    if case == "stream-crashes":
        assert None in losses["n1"] and None in losses["n4"]
    for new, old in zip(during, after, strict=True):
        assert new["suffered"] == old["suffered"]
        assert new["average_loss"] == old["average_loss"]
        if case == "dataset":
            assert new["dynamic_regret"] is None and old["dynamic_regret"] is None
        else:
            assert math.isclose(new["dynamic_regret"], old["dynamic_regret"], rel_tol=1e-12)
        assert abs(new["static_regret"] - old["static_regret"]) <= 1e-8 * old["suffered"]


@pytest.mark.parametrize("separable", [False, True])
def test_binary_newton_finds_the_hindsight_minimum(separable: bool) -> None:
    """Newton on the logit difference reaches L-BFGS's minimum of the same loss (or, on
    separable data, whose infimum 0 is never reached, a value no worse, finite)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3000, 4, generator=gen, dtype=torch.float64)
    truth = torch.tensor([2.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    noise = 0.0 if separable else 1.5 * torch.randn(3000, generator=gen, dtype=torch.float64)
    y = ((x @ truth + 0.3 + noise) > 0).to(torch.int64)
    w = torch.full((3000,), 0.5, dtype=torch.float64)
    v, minimum = _binary_newton(x, y, w, torch.zeros(5, dtype=torch.float64))

    def loss(params: torch.Tensor) -> tuple[float, torch.Tensor]:
        p = params.clone().requires_grad_(True)
        m = x @ p[:4] + p[4]
        total = (w * (torch.logaddexp(m, torch.zeros_like(m)) - y * m)).sum()
        (grad,) = torch.autograd.grad(total, p)
        return float(total.detach()), grad

    _, lbfgs, _ = minimize(loss, torch.zeros(5), max_iter=500)
    assert math.isfinite(minimum) and minimum >= 0
    assert math.isclose(minimum, loss(v)[0], rel_tol=1e-12)
    if separable:
        assert minimum <= lbfgs + 1e-9
    else:
        assert abs(minimum - lbfgs) <= 1e-9 * 3000
        assert float(loss(v)[1].abs().max()) < 1e-6


def test_kept_rounds_are_the_same_draws_and_copies() -> None:
    """SyntheticDrift.keep_rounds: a kept round comes back equal (not drawn again, not
    shared with the first caller), within its byte budget, the oldest dropped first."""
    from fedcore.streams import SyntheticDrift

    def source() -> SyntheticDrift:
        return SyntheticDrift(nodes=50, rounds=10, batch_size=2, seed=3, drift=4.0)

    kept, fresh = source(), source()
    per_round = 50 * 2 * 10 * 4 + 50 * 2 * 8  # float32 x, int64 y
    kept.keep_rounds(2 * per_round)
    first = [kept.batches(t) for t in range(3)]
    first[2][0].zero_()  # the caller's tensors are its own
    assert list(kept._kept) == [(1, 2, 0), (2, 2, 0)]
    for t in range(3):
        x, y = kept.batches(t)
        fx, fy = fresh.batches(t)
        assert torch.equal(x, fx) and torch.equal(y, fy)
    kept.keep_rounds(0)
    assert not kept._kept


@pytest.mark.parametrize("engine", ["vectorized", "messages"])
def test_a_resumed_run_has_the_regret_of_the_run_that_never_stopped(
    engine: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped after a checkpoint that falls between evaluations and resumed, the run's
    tracker (which a checkpoint does not hold) catches up from the observer's losses and
    ends with the same regret records, bit for bit."""
    from tests.clitools import cli
    from tests.simulation.test_runs import _interrupt_after_checkpoints, _records, _summary

    args = ["--set", "data.stream=synthetic", "--set", "algorithm.name=dog"]
    args += ["--set", "topology.kind=ring", "--set", "topology.nodes=5"]
    args += ["--set", "run.regret=true", "--set", "model.name=logreg"]
    args += ["--set", "run.rounds=40", "--set", "run.eval_every=9"]
    args += ["--set", "run.checkpoint_every=12", "--engine", engine, "-q"]
    assert cli(capsys, "simulate", *args, "--out", str(tmp_path / "whole"))[0] == 0
    _interrupt_after_checkpoints(monkeypatch, 2)
    stopped = tmp_path / "stopped"
    assert cli(capsys, "simulate", *args, "--out", str(stopped))[0] == 130
    monkeypatch.undo()
    assert cli(capsys, "simulate", "--resume", str(stopped), "-q")[0] == 0
    whole, resumed = _summary(tmp_path / "whole"), _summary(stopped)
    assert [r["round"] for r in whole["regret"]] == [8, 17, 26, 35, 39]
    assert resumed["regret"] == whole["regret"]
    assert _records(stopped) == _records(tmp_path / "whole")


@pytest.mark.parametrize("model", ["cnn1d", "mlp"])
def test_a_large_test_set_is_evaluated_in_passes(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deep model on many test examples runs in passes of EVAL_INPUT_BYTES of inputs (not
    ResNet-20 on 10,000 images at once): the same predictions, the loss to float rounding."""
    evaluation = importlib.import_module("fedcore.evaluation")
    objective = _objective(model, 40, 10, "vmap" if model == "cnn1d" else None)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, 40, generator=gen), torch.randint(0, 10, (300,), generator=gen)
    params = torch.stack([objective.initial_params() + 0.1 * i for i in range(5)])
    whole_loss, whole_acc = objective.evaluate(params[2], x, y)
    whole_rows = stacked_figures(objective.rows, params, x, y)[0]
    monkeypatch.setattr(evaluation, "EVAL_INPUT_BYTES", 40 * 4 * 37)  # 37 examples a pass
    calls: list[int] = []
    forward = objective.module.forward

    def counted(inputs: torch.Tensor) -> torch.Tensor:
        calls.append(len(inputs))
        return forward(inputs)

    monkeypatch.setattr(objective.module, "forward", counted)
    loss, acc = objective.evaluate(params[2], x, y)
    assert max(calls) == 37 and sum(calls) == 300
    assert acc == whole_acc and math.isclose(loss, whole_loss, rel_tol=1e-6)
    calls.clear()
    rows = stacked_figures(objective.rows, params, x, y)[0]
    assert torch.equal(rows, whole_rows)
    if model == "cnn1d":  # vmap: the rows' passes go through the module's forward too
        assert calls and max(calls) <= 37
