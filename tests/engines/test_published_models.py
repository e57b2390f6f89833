"""The models the field publishes on (``resnet20``, ``femnist-cnn``, ``char-lstm``,
``cnn32``) on both engines: each runs rounds on the vectorized and the message engine, and
the two agree as :mod:`fedcore.gradients` promises: bit for bit where the gradients are one
module per row (``char-lstm``, ``resnet20`` with BatchNorm), to float32 rounding where
``torch.func.vmap`` maps the rows (a grouped convolution's rounding depends on the rows).

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


def config(case: str) -> Config:
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
            *settings,
        ],
    )


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_engines_run_and_agree(case: str) -> None:
    """Two rounds of D-PSGD on 3 peers, then the final parameters of the two engines:
    identical in module mode, within float32 rounding in vmap mode."""
    cfg = config(case)
    mode = CASES[case][2]
    assert prepare_run(cfg).evaluator.rows.mode == mode
    (slow, a), (fast, b) = run_both(cfg)
    assert bool(a.isfinite().all()) and not torch.equal(a, prepare_run(cfg).start.expand_as(a))
    if mode == "module":
        assert torch.equal(a, b)
    else:
        # Float32 rounding (about 1e-7 of the model's norm), which a max-pool can amplify in
        # a few entries: a window whose two largest inputs are equal (exact ties occur in
        # ReLU'd maps) routes its gradient by the last bit of each engine's convolution, so
        # the engines may send it to different inputs (cnn32 here: 2 tied windows in a
        # peer's batch, its conv2 gradient 7e-4 apart in a few entries, 4e-5 of the norm).
        relative = float((a - b).norm() / a.norm())
        assert relative <= 1e-4, relative
        apart = (a - b).abs() > 1e-6 * float(a.abs().max())
        assert float(apart.double().mean()) <= 0.01
    assert slow.totals == fast.totals
    for e_slow, e_fast in zip(slow.evals, fast.evals, strict=True):
        assert abs(e_slow["avg_model_accuracy"] - e_fast["avg_model_accuracy"]) <= 1 / 12 + 1e-9


def test_the_fallback_to_one_module_per_node_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """char-lstm: vmap has no batching rule for the LSTM kernel, so each node's gradient is
    its own module's; the vectorized engine says so in one warning, once a process."""
    from fedcore.engines import vectorized

    vectorized._SAID.clear()
    setup = prepare_run(config("char-lstm"))
    assert "no batching rule" in setup.evaluator.rows.why
    with caplog.at_level(logging.DEBUG):
        for _ in range(2):
            net = VectorizedNetwork(setup, device=torch.device("cpu"))
            net.run_round()
    notes = [r for r in caplog.records if "one module per node" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.WARNING
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
