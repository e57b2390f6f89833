"""Node optimizers inside every algorithm, on both in-process engines.

What must hold (reference/algorithms.md section 11, issue 15): the default is today's step
bit for bit; an optimizer's direction goes exactly where ``lr * g`` went (so each
algorithm's invariant still holds, with ``u`` for ``lr * g``); the two engines agree with
every optimizer, crashed nodes included; the optimizer state travels in checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.algorithms.optim import OPTIMIZERS, Optimizer
from fedcore.config import load_config
from fedcore.engines.messages import build_network
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.errors import ConfigError
from fedcore.metrics import params_sha256
from fedcore.node import Node
from fedcore.setup import checkpoint
from fedcore.setup.plan import node_optimizer
from fedcore.setup.prepare import prepare_run
from tests.clitools import TINY, assert_one_line_error, cli
from tests.engines.test_vectorized import BATCHED, GRAPHS, _config, assert_same_run
from tests.resume import assert_resumes_exactly

OPTIONS = {
    "sgd": ["optimizer.weight_decay=0.01"],
    "momentum": ["optimizer.momentum=0.9", "optimizer.nesterov=true"],
    "adam": ["algorithm.lr=0.01"],
    "adamw": ["algorithm.lr=0.01", "optimizer.weight_decay=0.01"],
    "lars": ["optimizer.eta=0.02", "optimizer.weight_decay=0.0005"],
    "lamb": ["algorithm.lr=0.01", "optimizer.weight_decay=0.01"],
}
"""Each optimizer with settings that exercise its options (a step size that suits it)."""

CRASHES = "faults.crashes=[{node='n3',at=4,back=8},{node='n5',at=12,back=15}]"


def _with(name: str, *extra: str) -> list[str]:
    return [f"optimizer.name={name}", *OPTIONS[name], "model.name=mlp", *extra]


def test_this_suite_covers_every_optimizer() -> None:
    assert set(OPTIONS) == set(OPTIMIZERS)


def test_plain_sgd_is_todays_step() -> None:
    """No [optimizer] table and ``sgd`` without decay take the algorithms' own step; the
    optimizer path with momentum 0 (``x - 1.0 * (lr * g)``) lands on the same bits."""
    assert node_optimizer(load_config(None, []).optimizer) is None
    assert node_optimizer(load_config(None, ["optimizer.name=sgd"]).optimizer) is None
    base = ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=5", "run.rounds=15"]
    plain = build_network(load_config(None, base))
    plain.run(15)
    heavy = build_network(
        load_config(None, [*base, "optimizer.name=momentum", "optimizer.momentum=0"])
    )
    assert all(node.optimizer is not None for node in heavy.nodes.values())
    heavy.run(15)
    for nid, node in plain.nodes.items():
        assert params_sha256(heavy.nodes[nid].model()) == params_sha256(node.model()), nid


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("algorithm", ["ops", "dpsgd"])
def test_engines_agree_with_every_optimizer(algorithm: str, name: str) -> None:
    """Crashed nodes keep their optimizer state (and step count) in both engines."""
    assert_same_run(_config(algorithm, "fp32", False, *_with(name, CRASHES)))


@pytest.mark.parametrize("name", ["adam", "lamb"])
@pytest.mark.parametrize("algorithm", [a for a in BATCHED if a != "apmsqueeze"])
def test_engines_agree_for_every_algorithm(algorithm: str, name: str) -> None:
    codec = "fp32" if algorithm == "rps" else "sign"
    assert_same_run(_config(algorithm, codec, False, *_with(name)))


def test_apmsqueeze_refuses_a_node_optimizer() -> None:
    """APMSqueeze is itself the optimizer: a node optimizer's direction would replace its
    gradient."""
    with pytest.raises(ConfigError, match=r"itself the optimizer.*'adam'"):
        prepare_run(_config("apmsqueeze", "fp32", False, *_with("adam")))


def _recording(net: VectorizedNetwork) -> list[torch.Tensor]:
    """Make ``net`` record each round's directions ``u`` (``[N, d]``)."""
    assert net.optimizer is not None
    real = net.optimizer.update
    seen: list[torch.Tensor] = []

    def update(grad: torch.Tensor, state: Any, params: torch.Tensor, lr: float) -> Any:
        u, state = real(grad, state, params, lr)
        seen.append(u.clone())
        return u, state

    net.optimizer = Optimizer(net.optimizer.name, net.optimizer.init, update)
    return seen


MEAN_MOVES_BY_U = ["dpsgd", "dog", "central", "deepsqueeze", "choco", "rps"]
"""Algorithms whose network mean moves exactly by the mean step (doubly stochastic mixing,
error compensation, or, for RPS without loss, exact averaging)."""


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("algorithm", MEAN_MOVES_BY_U)
def test_the_mean_moves_by_the_mean_direction(algorithm: str, name: str) -> None:
    codec = "sign" if algorithm in ("deepsqueeze", "choco") else "fp32"
    config = _config(algorithm, codec, False, *_with(name))
    net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    seen = _recording(net)
    for _ in range(8):
        before = net.model().to(torch.float64).mean(dim=0)
        net.run_round()
        moved = net.model().to(torch.float64).mean(dim=0) - before
        step = seen[-1].to(torch.float64).mean(dim=0)
        assert float(step.abs().max()) > 0
        assert float((moved + step).abs().max()) < 1e-5 * max(1.0, float(before.abs().max()))


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_push_sum_mass_with_every_optimizer(name: str) -> None:
    """OPS: the weights keep their total n and ``sum x`` moves exactly by ``-sum u``; DOL
    (push-sum weight 1) likewise; LOCAL steps by exactly ``u``."""
    for algorithm in ("ops", "dol", "local"):
        config = _config(algorithm, "fp32", False, *_with(name))
        net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
        seen = _recording(net)
        for _ in range(6):
            before = net.state.x.to(torch.float64).sum(dim=0)
            net.run_round()
            after = net.state.x.to(torch.float64).sum(dim=0)
            step = seen[-1].to(torch.float64).sum(dim=0)
            assert float((after - before + step).abs().max()) < 1e-4, algorithm
            if algorithm == "ops":
                assert abs(float(net.state.omega.sum()) - net.n) < 1e-9 * net.n


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_zero_step_keeps_the_exact_average(name: str) -> None:
    """With ``lr = 0`` every optimizer's direction is exactly 0, however full its state:
    push-sum still reaches the exact average of different starting models."""
    config = load_config(
        None, ["topology.kind=social", "topology.nodes=8", *_with(name), "algorithm.lr=0"]
    )
    net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(net.n, net.d, generator=gen, dtype=net.dtype)
    net.state = net.form.init(start)
    for _ in range(300):
        net.run_round()
    assert float((net.model() - start.mean(dim=0)).abs().max()) < 1e-4


@pytest.mark.parametrize("name", ["momentum", "adam", "lars", "lamb"])
def test_optimizer_state_resumes_exactly(tmp_path: Path, name: str) -> None:
    """Checkpoint every node at round 7 (its optimizer state with it), restore into a fresh
    network, finish: the same bits as a run that never stopped."""
    config = load_config(None, ["topology.nodes=5", *_with(name)])

    def took_seven_steps(node: Node) -> None:
        assert int(node.opt_state.step.item()) == 7

    assert_resumes_exactly(config, tmp_path, stop=7, end=12, restored=took_seven_steps)
    other = build_network(load_config(None, ["topology.nodes=5"]))
    saved = checkpoint.latest(tmp_path / "n0")
    with pytest.raises(ConfigError, match="another \\[optimizer\\]"):
        checkpoint.restore(other.nodes["n0"], saved)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (["optimizer.name=nadam"], "optimizer.name"),
        (["optimizer.name=sgd", "optimizer.betas=[0.5, 0.9]"], "has no option betas"),
        (["optimizer.name=adam", "optimizer.momentum=0.5"], "has no option momentum"),
        (["optimizer.name=adam", "optimizer.betas=[0.9, 1.0]"], "optimizer.betas"),
        (["optimizer.name=adam", "optimizer.betas=[0.9]"], "optimizer.betas"),
        (["optimizer.name=momentum", "optimizer.momentum=1.5"], "optimizer.momentum"),
        (["optimizer.name=lamb", "optimizer.weight_decay=-1"], "optimizer.weight_decay"),
        (["optimizer.name=lars", "optimizer.eta=nan"], "optimizer.eta"),
        (["optimizer.speed=3"], "unknown key optimizer.speed"),
    ],
)
def test_bad_optimizer_settings_are_refused_before_the_run(settings: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        prepare_run(load_config(None, settings))


def test_every_graph_case_is_known() -> None:
    assert set(MEAN_MOVES_BY_U) <= set(GRAPHS)


def test_the_summary_says_which_optimizer_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*TINY, "--set", "optimizer.name=adamw", "--set", "optimizer.weight_decay=0.1"]
    status, _, err = cli(capsys, "simulate", *args, "--out", str(tmp_path / "run"), "-q")
    assert status == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))
    assert summary["optimizer"] == {
        "name": "adamw",
        "betas": [0.9, 0.999],
        "eps": 1e-08,
        "weight_decay": 0.1,
    }
    bad = [*TINY, "--set", "optimizer.name=sgd", "--set", "optimizer.nesterov=true"]
    status, _, err = cli(capsys, "simulate", *bad, "--out", str(tmp_path / "bad"))
    assert_one_line_error(status, "", err, "optimizer 'sgd' has no option nesterov")
