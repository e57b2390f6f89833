"""The vectorized engine's memory estimate (fedcore.engines.vectorized.memory_need): the
state copies and a batch's activations, measured from the model; a run it would not fit
goes to the message engine under ``auto``, and is refused in one line when asked for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedcore.config import load_config
from fedcore.engines import vectorized
from fedcore.engines.vectorized import (
    ACTIVATION_COPIES,
    PEER_OVERHEAD,
    STATE_COPIES,
    VectorizedNetwork,
    memory_need,
    saved_bytes_per_example,
)
from fedcore.errors import ConfigError
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import choose_engine
from tests.clitools import TINY, cli


def test_the_estimate_counts_the_state_and_the_activations_of_a_batch() -> None:
    setup = prepare_run(load_config(None, ["model.name=mlp", "topology.nodes=8"]))
    saved = saved_bytes_per_example(setup)
    # an MLP of 64 hidden units on digits keeps, per example, its input, the hidden
    # pre-activation and output (ReLU), and the logits: at least those float32 values
    assert saved >= 4 * (64 + 64 + 10)
    row = setup.start.numel() * 4
    batch = setup.config.data.batch_size
    n = len(setup.graph.nodes)
    expected = n * (STATE_COPIES * row + PEER_OVERHEAD) + n * ACTIVATION_COPIES * batch * saved
    assert memory_need(setup) == expected
    bigger = prepare_run(
        load_config(None, ["model.name=mlp", "topology.nodes=8", "data.batch_size=64"])
    )
    assert memory_need(bigger) > memory_need(setup)


def test_measuring_leaves_the_evaluator_as_it_was() -> None:
    """BatchNorm's running statistics are the evaluator's: the measure runs on a copy."""
    config = load_config(
        None,
        [
            "model.name=resnet20",
            "model.norm=batch",
            "topology.nodes=2",
            "data.partition=iid",
            "data.dataset=tests.engines.test_published_models:images32",
        ],
    )
    setup = prepare_run(config)
    before = {k: v.clone() for k, v in setup.evaluator.module.state_dict().items()}
    saved_bytes_per_example(setup)
    after = setup.evaluator.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_run_that_would_not_fit_runs_on_the_message_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = prepare_run(load_config(None, ["topology.nodes=8"]))
    need = memory_need(setup)
    monkeypatch.setattr(vectorized, "physical_memory", lambda: need - 1)
    engine, why = choose_engine(setup, "auto")
    assert engine == "messages" and why is not None
    assert "8 stacked peers of a 650-parameter model need about" in why and "\n" not in why
    with pytest.raises(ConfigError, match="cannot run this config: 8 stacked peers"):
        VectorizedNetwork(setup, device=torch.device("cpu"))
    monkeypatch.setattr(vectorized, "physical_memory", lambda: 1 << 10)  # the CLI's tiny run
    status, out, err = cli(capsys, "simulate", *TINY, "--out", str(tmp_path / "run"))
    assert status == 0, err
    assert "messages" in out
    status, out, err = cli(
        capsys, "simulate", *TINY, "--engine", "vectorized", "--out", str(tmp_path / "v")
    )
    assert status == 2 and "stacked peers" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(vectorized, "physical_memory", lambda: need)
    assert choose_engine(setup, "auto") == ("vectorized", None)
