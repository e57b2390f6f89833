"""``run.local_steps``: K optimizer steps on K local minibatches a round, the last one the
algorithm's own step (issue 16, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedcore.config import load_config
from fedcore.engines.messages import build_network
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.metrics import params_sha256
from fedcore.node import Node
from fedcore.setup.prepare import prepare_run
from tests.clitools import TINY, cli
from tests.engines.test_vectorized import BATCHED, _config, assert_same_run
from tests.resume import assert_resumes_exactly
from tests.simulation.test_optimizer_runs import CRASHES


def _params(overrides: list[str], rounds: int) -> dict[str, str]:
    network = build_network(load_config(None, [*overrides, f"run.rounds={rounds}"]))
    network.run(rounds)
    return {nid: params_sha256(node.model()) for nid, node in network.nodes.items()}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_local_training_with_k_steps_is_k_times_the_rounds(optimizer: str) -> None:
    """Without communication, 10 rounds of 3 local steps are 30 rounds of one, bit for bit
    (each step reads the next minibatch; the optimizer state carries across)."""
    base = ["algorithm.name=local", "topology.kind=ring", "topology.nodes=4"]
    base += [f"optimizer.name={optimizer}", "model.name=mlp"]
    assert _params([*base, "run.local_steps=3"], 10) == _params(base, 30)


ONE_STEP = (
    "doublesqueeze",
    "apmsqueeze",
    "dsgt",
    "push-pull",
    "push-diging",
    "exact-diffusion",
    "beer",
)
"""Algorithms whose compressed value (or tracked gradient) is the round's one step: they
refuse local steps."""


@pytest.mark.parametrize("algorithm", [a for a in BATCHED if a not in ONE_STEP])
def test_engines_agree_with_local_steps(algorithm: str) -> None:
    extra = ["run.local_steps=3"]
    if algorithm not in ("choco",):
        extra.append(CRASHES)
    assert_same_run(_config(algorithm, "fp32", False, *extra))


@pytest.mark.parametrize("engine", ["messages", "vectorized"])
@pytest.mark.parametrize("algorithm", ONE_STEP)
def test_one_step_algorithms_refuse_local_steps_on_both_engines(
    algorithm: str, engine: str
) -> None:
    config = _config(algorithm, "fp32", False, "run.local_steps=3")
    setup = prepare_run(config)
    with pytest.raises(AlgorithmError, match=r"run\.local_steps = 1"):
        if engine == "messages":
            build_network(config, setup=setup).run(1)
        else:
            VectorizedNetwork(setup, device=torch.device("cpu")).run_round()


def test_engines_agree_with_local_steps_an_optimizer_and_a_codec() -> None:
    extra = ["run.local_steps=2", "optimizer.name=momentum", "compression.codec=sign"]
    assert_same_run(_config("deepsqueeze", "fp32", False, *extra))
    assert_same_run(_config("ops", "fp32", True, "run.local_steps=4"))


def test_zero_step_size_never_moves_the_models() -> None:
    base = ["algorithm.name=dpsgd", "topology.kind=complete", "topology.nodes=4", "algorithm.lr=0"]
    network = build_network(load_config(None, [*base, "run.local_steps=5"]))
    before = {nid: params_sha256(node.model()) for nid, node in network.nodes.items()}
    network.run(3)
    assert len(set(before.values())) == 1  # one start for everyone
    for node in network.nodes.values():
        assert params_sha256(node.model()) == before[node.id]


def test_local_steps_resume_exactly(tmp_path: Path) -> None:
    config = load_config(None, ["topology.nodes=5", "run.local_steps=3", "optimizer.name=adam"])

    def read_three_a_round(node: Node) -> None:
        assert node.batches_read == 15

    assert_resumes_exactly(config, tmp_path, stop=5, end=8, saved=read_three_a_round)


def test_the_summary_reports_bytes_per_local_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = cli(capsys, "simulate", *TINY, "--set", "run.local_steps=4",
                           "--out", str(tmp_path / "run"))  # fmt: skip
    assert status == 0, err
    traffic = json.loads((tmp_path / "run" / "summary.json").read_text())["traffic"]
    assert traffic["local_steps"] == 4
    per_step = traffic["bytes_per_node_per_local_step"]
    assert per_step == pytest.approx(traffic["bytes_per_node_per_round"] / 4)
    assert "bytes / node / local step" in out


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (["run.local_steps=0"], "run.local_steps"),
        (["run.local_steps=2.5"], "run.local_steps"),
        (
            ["run.local_steps=2", "run.regret=true", "model.name=logreg", "data.stream=synthetic"],
            "run.regret",
        ),
    ],
)
def test_bad_local_steps_are_refused(settings: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, settings)
