"""Byzantine peers on every engine: the vectorized and message engines agree bit for bit,
a real ``fedcore node`` sends the sender attacks itself (launch equals simulate), the
figures are the honest peers', and what cannot run them refuses in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from fedcore.config import load_config
from fedcore.deploy.peer import run_peer
from fedcore.errors import ConfigError
from fedcore.simulation.simulate import simulate

BASE = [
    "topology.kind=ring",
    "topology.nodes=6",
    "run.rounds=4",
    "run.eval_every=4",
    "algorithm.name=dpsgd",
    'adversary.peers=["n1", "n4"]',
]


def _run(tmp_path: Path, name: str, *overrides: str) -> dict[str, Any]:
    config = load_config(None, [*BASE, *overrides])
    out: dict[str, Any] = simulate(config, out_dir=tmp_path / name, show_progress=False)
    return out


@pytest.mark.parametrize(
    ("attack", "more"),
    [
        ("signflip", ()),
        ("gaussian", ("compression.codec=sign",)),
        ("alie", ("faults.drop=0.3",)),
        ("ipm", ()),
        ("dissensus", ()),
        ("inflate", ("algorithm.name=ops", "topology.kind=social", "adversary.scale=1e6")),
        ("withhold", ("algorithm.name=ops", "topology.kind=social", "adversary.scale=0.2")),
        (
            "inflate",
            ("algorithm.name=clipped-push-sum", "topology.kind=social", "adversary.scale=50"),
        ),
        ("alie", ("algorithm.name=fedavg", "topology.kind=star")),
        ("ipm", ("algorithm.name=ops", "topology.kind=social", "adversary.epsilon=2")),
        ("labelflip", ()),
    ],
)
def test_the_engines_agree_bit_for_bit(tmp_path: Path, attack: str, more: tuple[str, ...]) -> None:
    args = (f"adversary.attack={attack}", *more)
    vec = _run(tmp_path, "vec", *args)
    msg = _run(tmp_path, "msg", *args, "simulate.engine=messages")
    assert vec["engine"] == "vectorized" and msg["engine"] == "messages"
    assert vec["params_sha256"] == msg["params_sha256"]
    assert vec["final"] == msg["final"]
    assert set(vec["final"]["node_accuracy"]) == {"n0", "n2", "n3", "n5"}  # honest only
    honest = _run(tmp_path, "honest", *args[1:], "adversary.peers=[]")
    lied = {n for n, h in vec["params_sha256"].items() if h != honest["params_sha256"][n]}
    assert lied  # the attack changed the run


def test_a_real_peer_sends_its_lie_itself(tmp_path: Path) -> None:
    """A sender attack in one peer's process equals the simulated run: the lie is made by
    the Byzantine peer before its codec, not by the receivers."""
    pytest.importorskip("grpc")
    from fedcore.deploy.launch import launch

    config = load_config(None, [*BASE, "adversary.attack=signflip", "simulate.engine=messages"])
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    real = launch(config, out_dir=tmp_path / "launch", peers_per_process=3)
    assert real["params_sha256"] == sim["params_sha256"]


test_a_real_peer_sends_its_lie_itself = pytest.mark.grpc(test_a_real_peer_sends_its_lie_itself)


@pytest.mark.grpc
def test_real_peers_keep_going_and_defend_as_simulated(tmp_path: Path) -> None:
    """An inflating peer among real peers of clipped push-sum: every peer finishes every
    round (liveness), and the run is the simulated one bit for bit (the defence behaves
    as in simulation)."""
    from fedcore.deploy.launch import launch

    config = load_config(
        None,
        [
            *BASE,
            "algorithm.name=clipped-push-sum",
            "topology.kind=social",
            "adversary.attack=inflate",
            "adversary.scale=1000",
            "simulate.engine=messages",
        ],
    )
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    real = launch(config, out_dir=tmp_path / "launch", peers_per_process=3)
    assert real["status"] == sim["status"] == "completed"
    assert real["params_sha256"] == sim["params_sha256"]
    assert real["final"]["mean_node_accuracy"] == sim["final"]["mean_node_accuracy"]


def test_refusals_name_what_cannot_run_liars(tmp_path: Path) -> None:
    config = load_config(None, [*BASE, "adversary.attack=alie"])
    with pytest.raises(ConfigError, match="a real peer does not see"):
        asyncio.run(run_peer(config, "n0", {"n0": "127.0.0.1:1"}, out=tmp_path / "n0"))
    with pytest.raises(ConfigError, match="holds none fixed"):
        load_config(None, [*BASE, "adversary.attack=labelflip", "data.stream=synthetic"])
    with pytest.raises(ConfigError, match="cohort engine"):
        load_config(None, [*BASE, "simulate.engine=cohort", "algorithm.name=fedavg"])
    from fedcore.engines.seed_blocks import config_refusal as batch_refusal
    from fedcore.engines.shard_refusal import config_refusal as rank_refusal

    assert "not sharded" in (rank_refusal(config) or "")
    assert "not batched" in (batch_refusal(config) or "")


def test_omniscient_lies_are_made_of_every_honest_peer(tmp_path: Path) -> None:
    """view = 'omniscient' on the vectorized engine: one lie from every honest peer's
    value, another run than the neighbourhood's; the message engine refuses it."""
    near = _run(tmp_path, "near", "adversary.attack=ipm", "adversary.epsilon=2")
    far = _run(
        tmp_path, "far", "adversary.attack=ipm", "adversary.epsilon=2", "adversary.view=omniscient"
    )
    assert far["engine"] == "vectorized" and far["status"] == "completed"
    assert far["params_sha256"]["n0"] != near["params_sha256"]["n0"]
    with pytest.raises(ConfigError, match="only the vectorized engine"):
        load_config(
            None,
            [
                *BASE,
                "adversary.attack=alie",
                "adversary.view=omniscient",
                "simulate.engine=messages",
            ],
        )
    with pytest.raises(ConfigError, match="has no such form"):
        load_config(None, [*BASE, "adversary.attack=dissensus", "adversary.view=omniscient"])
