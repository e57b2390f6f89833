"""The models the field publishes on (``resnet20``, ``femnist-cnn``, ``char-lstm``,
``cnn32``) on both engines: each runs rounds on the vectorized and the message engine, and
the two agree as :mod:`fedcore.gradients` promises: bit for bit where the gradients are one
module per row (``char-lstm``, ``resnet20`` with BatchNorm), to rounding where
``torch.func.vmap`` maps the rows (a grouped convolution's rounding depends on the rows);
:func:`test_both_engines_run_and_agree` says what bound that rounding gives and why those
models are compared in float64.

The data is random, shaped like each model's target (CIFAR's 3x32x32, FEMNIST's 1x28x28 and
62 classes, Shakespeare's 80-character int64 sequences), from the dataset factories below,
named by import path as a user's are.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from fedcore.config import Config, load_config
from fedcore.data import Dataset
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.setup.prepare import prepare_run
from tests.engines.test_vectorized import run_both

HERE = "tests.engines.test_published_models"


def _split(name: str, x: torch.Tensor, y: torch.Tensor, classes: int, fraction: float) -> Dataset:
    cut = int(len(y) * (1 - fraction))
    return Dataset(
        name=name,
        x_train=x[:cut],
        y_train=y[:cut],
        x_test=x[cut:],
        y_test=y[cut:],
        num_classes=classes,
    )


def images32(*, seed: int, test_fraction: float) -> Dataset:
    """60 random 3x32x32 images of 10 classes (CIFAR-10's shape)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(60, 3, 32, 32, generator=gen)
    return _split("images32", x, torch.randint(0, 10, (60,), generator=gen), 10, test_fraction)


def femnist_like(*, seed: int, test_fraction: float) -> Dataset:
    """60 random 1x28x28 images of 62 classes (FEMNIST's shape)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(60, 1, 28, 28, generator=gen)
    return _split("femnist-like", x, torch.randint(0, 62, (60,), generator=gen), 62, test_fraction)


def characters(*, seed: int, test_fraction: float) -> Dataset:
    """60 random sequences of 80 character indices (int64), the next character of each the
    label (Shakespeare's shape)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 80, (60, 80), generator=gen)
    return _split("characters", x, torch.randint(0, 80, (60,), generator=gen), 80, test_fraction)


CASES = {
    # model settings, dataset, the gradient mode the run must choose
    "resnet20": (["model.name=resnet20"], "images32", "vmap"),
    "resnet20-none": (["model.name=resnet20", "model.norm=none"], "images32", "vmap"),
    "resnet20-batch": (["model.name=resnet20", "model.norm=batch"], "images32", "module"),
    "femnist-cnn": (["model.name=femnist-cnn"], "femnist_like", "vmap"),
    "char-lstm": (["model.name=char-lstm"], "characters", "module"),
    "cnn32": (["model.name=cnn32"], "images32", "vmap"),
}


def config(case: str, dtype: str = "float32") -> Config:
    settings, dataset, _ = CASES[case]
    return load_config(
        None,
        [
            "run.rounds=2",
            "run.eval_every=2",
            "topology.kind=ring",
            "topology.nodes=3",
            "algorithm.name=dpsgd",
            "algorithm.lr=0.05",
            "data.partition=iid",
            "data.batch_size=4",
            f"data.dataset={HERE}:{dataset}",
            f"model.dtype={dtype}",
            *settings,
        ],
    )


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))


ROUNDING = 1e-9
"""How far apart (of the largest parameter update) the engines' float64 parameters may end
in vmap mode: the bound :func:`test_both_engines_run_and_agree` derives."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_engines_run_and_agree(case: str) -> None:
    """Two rounds of D-PSGD on 3 peers, then the final parameters of the two engines:
    identical in module mode (float32, as run); in vmap mode, run in float64, every entry
    within :data:`ROUNDING` of the update's largest entry (final minus start, the same
    start on both).

    The bound, and why float64. The message engine computes a peer's gradient as one vmap
    row, the vectorized engine as one of 3, and vmap runs a convolution of ``M`` rows as
    one grouped convolution, which adds the same terms in another order (each row's first
    convolution comes out 1e-7 of its norm apart in float32, at every
    ``ATEN_CPU_CAPABILITY``). A kernel guarantees only its rounding: two orders of a sum
    of ``K`` terms differ by at most ``2 K u`` of the terms' absolute sum (``u`` the unit
    roundoff; Higham, *Accuracy and Stability of Numerical Algorithms*, section 3.1).
    That bounds the smooth part of the difference, not a ReLU's gate: an input within that
    rounding of zero (or a max-pool window's two largest within it of each other) passes
    its gradient on one engine and not on the other, moving every parameter upstream of it
    by that activation's whole share of the gradient, which no rounding bounds. In float32
    (``u = 6e-8``; a run here feeds about 5e6 inputs to ReLUs) that happens in many runs:
    ``resnet20`` met such a gate in 5 of 16 run seeds at ``ATEN_CPU_CAPABILITY=default``
    (seed 0, this test's, among them: 1.7% of the entries more than 1e-6 of the largest
    apart) and in 1 of 8 at AVX-512; ``resnet20-none``, seed 1, moved 13% of its entries
    and 2.5e-3 of the update's norm. So no float32 bound on the parameters follows from
    the kernels. In float64 (``u = 1.1e-16``) an input falls within the rounding (1e-15)
    of zero with chance about ``5e6 * 1e-15`` a run, and the rounding bound applies: the
    longest sum has ``K = 8192`` terms (GroupNorm's statistics over 8 channels of 32x32),
    so one sum is within ``2 K u = 1.8e-12`` of its scale, and to first order the errors
    of the sums a run chains add up: at most 40 layers, each a sum forward and two
    backward, twice, about 240 sums, ``4.3e-10`` of the update's scale. :data:`ROUNDING`
    (1e-9) leaves a factor 2 over that. Measured: 3e-16 to 6e-15 of the update's largest
    entry, every model, kernel level and seed tried; a wrong row, step or mixing weight is
    1e-3 or more. The evaluation's argmax can differ only where two logits lie within
    1e-15, so the accuracies are equal."""
    mode = CASES[case][2]
    cfg = config(case, "float64" if mode == "vmap" else "float32")
    setup = prepare_run(cfg)
    start = setup.start.clone()
    # The float32 run's choice (cfg is that very config in module mode).
    as_run = setup if mode == "module" else prepare_run(config(case))
    assert setup.evaluator.rows.mode == as_run.evaluator.rows.mode == mode
    (slow, a), (fast, b) = run_both(cfg, setup)  # setup: the message engine's
    update = a - start.expand_as(a)
    assert bool(a.isfinite().all()) and float(update.abs().max()) > 0
    if mode == "module":
        assert torch.equal(a, b)
    else:
        assert a.dtype == torch.float64
        apart = float((a - b).abs().max() / update.abs().max())
        assert apart <= ROUNDING, apart
    assert slow.totals == fast.totals
    assert len(slow.evals) == len(fast.evals) == 1
    for e_slow, e_fast in zip(slow.evals, fast.evals, strict=True):
        assert e_slow["avg_model_accuracy"] == e_fast["avg_model_accuracy"]


def test_the_fallback_to_one_module_per_node_is_said_once_a_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """char-lstm: vmap has no batching rule for the LSTM kernel, so each node's gradient is
    its own module's; the vectorized engine says so in one warning a run (not a round), so
    that every run's summary lists it (a sweep prints each distinct warning once)."""
    setup = prepare_run(config("char-lstm"))
    assert "no batching rule" in setup.evaluator.rows.why
    with caplog.at_level(logging.DEBUG):
        for _ in range(2):
            net = VectorizedNetwork(setup, device=torch.device("cpu"))
            net.run_round()
    notes = [r for r in caplog.records if "one module per node" in r.getMessage()]
    assert len(notes) == 2 and notes[0].levelno == logging.WARNING  # two networks
    assert "aten::mkldnn_rnn_layer" in notes[0].getMessage()
    assert "\n" not in notes[0].getMessage()
    assert not [r for r in caplog.records if "performance drop" in r.getMessage()]


def test_fedcore_simulate_runs_char_lstm_and_says_how(tmp_path: Path) -> None:
    """A whole ``fedcore simulate`` run on int64 character data: the summary names the
    engine and the gradient mode it ran."""
    from fedcore.simulation.simulate import simulate

    summary = simulate(config("char-lstm"), out_dir=tmp_path, show_progress=False)
    assert summary["engine"] == "vectorized" and summary["gradients"] == "module"
    assert 0.0 <= summary["final"]["avg_model_accuracy"] <= 1.0
