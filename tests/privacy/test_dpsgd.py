"""DP-SGD: per-example clipping through the shared gradient path, keyed Gaussian noise of
the configured spread, the engines bit for bit, and epsilon as the accountant gives it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.config import load_config
from fedcore.config.tables.privacy import PrivacyConfig
from fedcore.config.tables.run import RunConfig
from fedcore.errors import ConfigError, DataError
from fedcore.gradients.per_example import clipped_sums
from fedcore.models import Objective
from fedcore.privacy import dpsgd
from fedcore.privacy.dpsgd import DPSGD, peer_words
from fedcore.privacy.plan import plan_privacy

needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="needs the fedcore[dp] extra (opacus)"
)


def _objective(mode: str, d_in: int = 8) -> Objective:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(d_in, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)
    )
    return Objective(net, torch.float32, gradient_mode=mode)


def _batch(obj: Objective, m: int, b: int, d_in: int = 8) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    params = obj.initial_params().repeat(m, 1)
    params += 0.3 * torch.randn(params.shape, generator=gen)
    x = torch.randn(m, b, d_in, generator=gen)
    y = torch.randint(0, 3, (m, b), generator=gen)
    return params, x, y


@pytest.mark.parametrize("mode", ["batched", "vmap"])
def test_each_example_is_clipped_to_the_norm(mode: str) -> None:
    obj = _objective(mode)
    params, x, y = _batch(obj, 2, 4)
    clip = 2.0
    losses, sums, counts = clipped_sums(obj.rows, params, x, y, clip)
    assert counts.tolist() == [4, 4]
    norms = []
    for i in range(2):
        expected = torch.zeros(obj.numel)
        for b in range(4):  # the module's own gradient of one example, clipped by hand
            _, g = obj.module_loss_and_grad(params[i], x[i, b : b + 1], y[i, b : b + 1])
            norms.append(float(g.norm()))
            expected += g * min(1.0, clip / float(g.norm()))
        torch.testing.assert_close(sums[i], expected, rtol=1e-5, atol=1e-6)
        assert float(losses[i]) == pytest.approx(obj.module_loss_and_grad(params[i], x[i], y[i])[0])
    assert min(norms) < clip < max(norms)  # some clipped, some not


def test_a_row_gets_its_own_bits_among_many() -> None:
    obj = _objective("batched")
    params, x, y = _batch(obj, 3, 5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False  # a peer holding 3 examples
    losses, sums, counts = clipped_sums(obj.rows, params, x, y, 0.5, mask)
    assert counts.tolist() == [5, 3, 5]
    for i, b in enumerate(counts.tolist()):
        alone = clipped_sums(obj.rows, params[i : i + 1], x[i : i + 1, :b], y[i : i + 1, :b], 0.5)
        assert torch.equal(alone[1][0], sums[i]) and torch.equal(alone[0][0], losses[i])


def test_module_mode_is_refused() -> None:
    obj = _objective("batched")
    obj.rows.mode = "module"
    params, x, y = _batch(obj, 1, 2)
    with pytest.raises(DataError, match="per-example gradients"):
        clipped_sums(obj.rows, params, x, y, 1.0)


def test_the_noise_has_the_configured_spread_and_its_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    obj = _objective("batched", d_in=64)
    params, x, y = _batch(obj, 4, 8, d_in=64)
    clip, sigma = 0.5, 2.0
    _, sums, _ = clipped_sums(obj.rows, params, x, y, clip)
    peers = peer_words([f"n{i}" for i in range(4)])
    dp = DPSGD(clip, sigma, seed=3)
    _, grad = dp.loss_and_grad(obj.rows, params, x, y, peers, 5, 0)
    noise = (grad * 8 - sums).double()  # the noise alone: (sum + z) / B, times B
    assert noise.numel() > 1500
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.05)
    assert abs(float(noise.mean())) < 0.1 * sigma * clip
    again = dp.loss_and_grad(obj.rows, params, x, y, peers, 5, 0)[1]
    assert torch.equal(again, grad)  # keyed: the same (seed, peer, round, step), the same draw
    for other in (DPSGD(clip, sigma, seed=4), dp):
        moved = other.loss_and_grad(obj.rows, params, x, y, peers, 5, 1 if other is dp else 0)
        assert not torch.equal(moved[1], grad)  # another seed, another step
    alone = dp.loss_and_grad(obj.rows, params[2:3], x[2:3], y[2:3], peers[2:3], 5, 0)[1]
    assert torch.equal(alone[0], grad[2])  # a peer alone draws its own noise
    secret = DPSGD(clip, sigma, seed=3, secret=True)  # privacy.noise_key = "secret"
    assert len({secret.key, DPSGD(clip, sigma, seed=3, secret=True).key, dp.key}) == 3
    assert DPSGD(clip, sigma, seed=3).key == dp.key
    monkeypatch.setattr(dpsgd, "NOISE_BLOCK", 7)  # blocks of rows and of pairs: the same draws
    assert torch.equal(dp.loss_and_grad(obj.rows, params, x, y, peers, 5, 0)[1], grad)


def test_plan_refusals() -> None:
    on = PrivacyConfig(mechanism="dp-sgd")
    run = RunConfig(rounds=10)
    common: dict[str, Any] = {"nodes": ["a", "b"], "examples": [10, 20], "batch_size": 5}
    with pytest.raises(ConfigError, match="synchronous"):
        plan_privacy(on, **common, run=run, asynchronous=True)
    with pytest.raises(ConfigError, match="mode 'module'"):
        plan_privacy(on, **common, run=run, gradient_mode=("module", "BatchNorm"))
    with pytest.raises(ConfigError, match=r"data\.stream"):
        plan_privacy(on, **common, run=run, streamed=True)
    with pytest.raises(ConfigError, match="no peer holds"):
        plan_privacy(on, nodes=["a"], examples=[0], batch_size=5, run=run)
    assert plan_privacy(PrivacyConfig(), **common, run=run) is None
    plan = plan_privacy(on, **common, run=run)
    assert plan is not None and plan.rates == {"a": 0.5, "b": 0.25} and plan.worst == ("a", 0.5)


@needs_opacus
def test_a_target_spent_in_the_first_round_is_refused() -> None:
    hard = PrivacyConfig(mechanism="dp-sgd", noise=0.3, target_epsilon=0.1, accountant="rdp")
    with pytest.raises(ConfigError, match="spent within the first round"):
        plan_privacy(hard, nodes=["a"], examples=[10], batch_size=10, run=RunConfig(rounds=5))


def _run(tmp_path: Path, engine: str, *more: str) -> dict[str, Any]:
    from fedcore.simulation.simulate import simulate

    config = load_config(
        None,
        [
            "topology.kind=ring",
            "topology.nodes=4",
            "algorithm.name=dpsgd",
            "model.name=mlp",
            "model.hidden=8",
            "run.rounds=3",
            "run.eval_every=3",
            "run.local_steps=2",
            f"simulate.engine={engine}",
            *more,
        ],
    )
    return simulate(config, out_dir=tmp_path / engine, show_progress=False)


@needs_opacus
def test_engines_agree_bit_for_bit_and_epsilon_is_the_accountants(tmp_path: Path) -> None:
    from fedcore.privacy import Mechanism, epsilon

    private = ("privacy.mechanism=dp-sgd", "privacy.accountant=rdp", "privacy.noise=1.2")
    runs = {e: _run(tmp_path, e, *private) for e in ("vectorized", "messages")}
    vec, msg = runs["vectorized"], runs["messages"]
    assert vec["engine"] == "vectorized" and msg["engine"] == "messages"
    assert vec["params_sha256"] == msg["params_sha256"]
    plain = _run(tmp_path / "plain", "vectorized")
    assert plain["params_sha256"] != vec["params_sha256"]  # the private path ran
    p = vec["privacy"]
    assert p == msg["privacy"]
    assert p["steps"] == 6 and p["mechanism"] == "dp-sgd" and p["accountant"] == "rdp"
    assert p["epsilon"] == epsilon([Mechanism(1.2, p["sampling_rate"], 6)], 1e-5, "rdp")


@needs_opacus
@pytest.mark.parametrize("mechanism", ["dp-sgd", "dp-fedavg"])
def test_the_docs_commands_stop_at_their_targets(
    mechanism: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json
    import shlex

    from fedcore.cli.app import main
    from tests import docs_text

    lines = [
        ln
        for ln in docs_text.page("privacy.md").splitlines()
        if ln.startswith("fedcore ") and f"privacy.mechanism={mechanism} " in ln
    ]
    assert len(lines) == 1
    argv = shlex.split(lines[0])[1:]
    sets = dict(a.split("=", 1) for a in argv if "=" in a)
    target, rounds = float(sets["privacy.target_epsilon"]), int(sets["run.rounds"])
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", "run"]) == 0
    table = capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    p = summary["privacy"]
    assert p["mechanism"] == mechanism
    assert p["accountant"] == sets.get("privacy.accountant", "prv")
    assert p["stopped_at_target"] and p["planned_rounds"] == rounds
    assert 0 < summary["rounds"] == summary["rounds_completed"] < rounds
    assert p["epsilon"] <= target and summary["status"] == "completed"
    assert f"privacy epsilon       {p['epsilon']:.4g} at delta 1e-05 ({mechanism}" in table
    assert f"stopped at target {target:g}" in table
