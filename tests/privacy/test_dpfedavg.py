"""DP-FedAvg: the server clips each worker's difference, adds keyed noise once and divides
by the cohort size; the engines agree bit for bit; epsilon counts users."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.algorithms.inbox import Gathered
from fedcore.algorithms.rule import Rows
from fedcore.algorithms.server import FedAvgRule, FedAvgState
from fedcore.config import load_config
from fedcore.errors import ConfigError
from fedcore.privacy.dpfedavg import private_fedavg

needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="needs the fedcore[dp] extra (opacus)"
)

NODES = ("n0", "n1", "n2", "n3", "server")


def _server_step(clip: float, noise: float, d: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's new model from two of four workers (fraction 0.5: m = 2), and the
    workers' differences."""
    rule = private_fedavg(FedAvgRule(fraction=0.5), clip, noise, seed=0)
    x = torch.zeros(1, d)
    deltas = torch.zeros(2, d)
    deltas[0, 0] = 3.0  # norm 3: clipped to `clip`
    deltas[1, 1] = 0.5  # norm 0.5: kept
    inbox = Gathered(
        {"x": x + deltas},
        {"samples": torch.tensor([10.0, 30.0])},
        torch.zeros(2, dtype=torch.long),
        1,
    )
    rows = Rows(round=0, lr=1.0, self_weight=torch.ones(1), ids=("server",), nodes=NODES)
    state, _ = rule.mix(FedAvgState(x), 0, inbox, rows)
    return state.x[0], deltas


def test_the_server_clips_each_difference_and_divides_by_the_cohort() -> None:
    new, _ = _server_step(clip=1.0, noise=0.0)
    # (clip(3 e0) + 0.5 e1) / m, unweighted by the example counts
    torch.testing.assert_close(new, torch.tensor([0.5, 0.25, 0.0, 0.0]))
    noisy, _ = _server_step(clip=1.0, noise=2.0, d=4000)
    plain, _ = _server_step(clip=1.0, noise=0.0, d=4000)
    z = (noisy - plain) * 2  # times m: the noise of the sum, sigma C = 2
    assert float(z.std()) == pytest.approx(2.0, rel=0.06)
    assert torch.equal(_server_step(clip=1.0, noise=2.0, d=4000)[0], noisy)  # keyed


def test_dp_fedavg_needs_fedavg() -> None:
    from fedcore.config.tables.privacy import PrivacyConfig
    from fedcore.config.tables.run import RunConfig
    from fedcore.privacy.plan import plan_privacy

    with pytest.raises(ConfigError, match=r"algorithm\.name = 'fedavg'"):
        plan_privacy(
            PrivacyConfig(mechanism="dp-fedavg"),
            nodes=["a"],
            examples=[5],
            batch_size=5,
            run=RunConfig(),
        )


def _run(tmp_path: Path, engine: str) -> dict[str, Any]:
    from fedcore.simulation.simulate import simulate

    config = load_config(
        None,
        [
            "algorithm.name=fedavg",
            "topology.kind=star",
            "topology.nodes=6",
            "algorithm.fraction=0.5",
            "model.name=mlp",
            "model.hidden=8",
            "run.rounds=4",
            "run.eval_every=4",
            "privacy.mechanism=dp-fedavg",
            "privacy.accountant=rdp",
            f"simulate.engine={engine}",
        ],
    )
    return simulate(config, out_dir=tmp_path / engine, show_progress=False)


@needs_opacus
def test_engines_agree_and_epsilon_counts_users(tmp_path: Path) -> None:
    from fedcore.privacy import Mechanism, epsilon

    vec, msg = _run(tmp_path, "vectorized"), _run(tmp_path, "messages")
    assert vec["engine"] == "vectorized" and msg["engine"] == "messages"
    assert vec["params_sha256"] == msg["params_sha256"]
    p = vec["privacy"]
    assert p == msg["privacy"]
    assert (p["cohort"], p["population"], p["steps"], p["sampling_rate"]) == (3, 6, 4, 0.5)
    assert p["epsilon"] == epsilon([Mechanism(1.0, 0.5, 4)], 1e-5, "rdp")


@needs_opacus
@pytest.mark.parametrize(
    "extra,match",
    [
        ("algorithm.aggregator=median", "algorithm.aggregator = 'median' would not run"),
        ('adversary.peers=["n0"]', r"with an \[adversary\] is not built"),
    ],
)
def test_what_dp_fedavg_cannot_compose_with_is_refused(extra: str, match: str) -> None:
    from fedcore.setup.prepare import prepare_run

    config = load_config(
        None,
        [
            "algorithm.name=fedavg",
            "topology.kind=star",
            "topology.nodes=4",
            "privacy.mechanism=dp-fedavg",
            extra,
        ],
    )
    with pytest.raises(ConfigError, match=match):
        prepare_run(config)
