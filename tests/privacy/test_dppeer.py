"""Peer-level privacy of what a peer sends (``privacy.mechanism = "dp-peer"``): each step's
gradient clipped to C and noised with the configured spread, the engines bit for bit, and
epsilon as the accountant gives it at sampling rate 1."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.config import load_config
from fedcore.models import Objective
from fedcore.privacy.dpsgd import PeerDP, peer_words
from fedcore.simulation.simulate import simulate

needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="needs the fedcore[dp] extra (opacus)"
)


def _rows() -> tuple[Objective, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(8, 3))
    obj = Objective(net, torch.float32, gradient_mode="batched")
    gen = torch.Generator().manual_seed(1)
    params = obj.initial_params().repeat(64, 1) + 3.0 * torch.randn(64, obj.numel, generator=gen)
    x = torch.randn(64, 5, 8, generator=gen) * 4
    y = torch.randint(0, 3, (64, 5), generator=gen)
    return obj, params, x, y


def test_each_steps_gradient_is_clipped_to_the_norm() -> None:
    """No noise: each row's gradient is the plain one scaled to norm at most C."""
    obj, params, x, y = _rows()
    _, plain = obj.rows.loss_and_grad(params, x, y)
    _, clipped = PeerDP(clip=0.5, noise=0.0, seed=0).loss_and_grad(
        obj.rows, params, x, y, peer_words([f"n{i}" for i in range(64)]), 0, 0
    )
    norms = clipped.double().norm(dim=1)
    assert float(norms.max()) <= 0.5 * (1 + 1e-6) and float(plain.double().norm(dim=1).max()) > 0.5
    cosine = torch.nn.functional.cosine_similarity(clipped.double(), plain.double(), dim=1)
    assert float(cosine.min()) > 1 - 1e-6  # clipped, not turned


def test_the_noise_has_the_configured_spread_and_its_keys() -> None:
    """sigma C of noise on the clipped gradient; another round or peer, other noise."""
    obj, params, x, y = _rows()
    peers = peer_words([f"n{i}" for i in range(64)])
    quiet = PeerDP(clip=1.0, noise=0.0, seed=0).loss_and_grad(obj.rows, params, x, y, peers, 3, 0)
    dp = PeerDP(clip=1.0, noise=2.0, seed=0)
    noisy = dp.loss_and_grad(obj.rows, params, x, y, peers, 3, 0)[1]
    spread = float((noisy - quiet[1]).double().std())
    assert spread == pytest.approx(2.0, rel=0.05)  # 64 x 27 draws
    again = dp.loss_and_grad(obj.rows, params, x, y, peers, 3, 0)[1]
    later = dp.loss_and_grad(obj.rows, params, x, y, peers, 4, 0)[1]
    assert torch.equal(noisy, again) and not torch.equal(noisy, later)
    alone = dp.loss_and_grad(obj.rows, params[5:6], x[5:6], y[5:6], peers[5:6], 3, 0)[1]
    assert torch.equal(alone[0], noisy[5])  # a peer alone draws what it draws among all


def _run(tmp_path: Path, engine: str, *more: str) -> dict[str, Any]:
    config = load_config(
        None,
        [
            "topology.kind=ring",
            "topology.nodes=4",
            "algorithm.name=dpsgd",
            "run.rounds=3",
            "run.local_steps=2",
            "run.eval_every=3",
            f"simulate.engine={engine}",
            *more,
        ],
    )
    out: dict[str, Any] = simulate(config, out_dir=tmp_path / engine, show_progress=False)
    return out


@needs_opacus
def test_engines_agree_bit_for_bit_and_epsilon_is_the_accountants(tmp_path: Path) -> None:
    from fedcore.privacy import Mechanism, epsilon

    private = ("privacy.mechanism=dp-peer", "privacy.accountant=rdp", "privacy.noise=3")
    vec = _run(tmp_path, "vectorized", *private)
    msg = _run(tmp_path, "messages", *private)
    assert vec["params_sha256"] == msg["params_sha256"] and vec["privacy"] == msg["privacy"]
    p = vec["privacy"]
    assert p["mechanism"] == "dp-peer" and p["level"] == "peer" and p["sampling_rate"] == 1.0
    assert p["steps"] == 6 and p["epsilon"] == epsilon([Mechanism(3.0, 1.0, 6)], 1e-5, "rdp")


@needs_opacus
def test_the_docs_command_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/privacy.md's dp-peer command, and the epsilon and accuracy its text quotes."""
    import json
    import shlex

    from fedcore.cli.app import main
    from tests import docs_text

    page = docs_text.page("privacy.md")
    (line,) = [ln for ln in page.splitlines() if "privacy.mechanism=dp-peer " in ln]
    monkeypatch.chdir(tmp_path)
    assert main([*shlex.split(line)[1:], "--out", "run", "-q"]) == 0
    capsys.readouterr()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    p = summary["privacy"]
    assert p["level"] == "peer" and p["steps"] == 100
    assert f"spends epsilon {p['epsilon']:.1f}" in " ".join(page.split())
    assert f"reaches {summary['final']['avg_model_accuracy']:.2f}" in " ".join(page.split())
