"""Real peers slowed on purpose: ``[time]`` as real sleeps and slow links under ``fedcore
launch`` (:mod:`fedcore.node.pace`, :mod:`fedcore.transport.paced`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fedcore.config import TimeConfig, load_config
from fedcore.deploy.launch import launch
from fedcore.messages import Message
from fedcore.node.pace import Pace
from fedcore.simulation.simulate import simulate
from fedcore.timing import TimeModel
from fedcore.transport.paced import PacedTransport


def test_a_pace_sleeps_what_the_draws_say() -> None:
    model = TimeModel(TimeConfig(step_s=0.05, speeds={"b": 3.0}), run_seed=0, nodes=["a", "b"])
    pace = Pace(model, "b", steps=2)

    async def round_() -> float:
        began = time.monotonic()
        await pace.available()
        await pace.computed(0.1)  # 0.3 s drawn, 0.1 s spent computing already
        return time.monotonic() - began

    took = asyncio.run(round_())
    assert 0.19 <= took < 0.6
    assert pace.slept == pytest.approx(0.2)
    assert pace.taken == 2


def test_a_paced_transport_takes_the_links_time() -> None:
    model = TimeModel(TimeConfig(latency_s=0.5, bandwidth_mb_s=2.0), run_seed=0, nodes=["a", "b"])

    class Inner:
        node_id = "a"
        stats = None

    paced = PacedTransport(Inner(), model)  # type: ignore[arg-type]
    message = Message(run="r", round=0, phase=0, sender="a", receiver="b", tensors={}, nbytes=2**20)
    assert paced.seconds(message) == pytest.approx(1.0)


@pytest.mark.grpc
def test_a_slow_peer_slows_a_synchronous_launch_as_simulated(tmp_path: Path) -> None:
    """Three peers on a ring, n1 4x slower: every round waits for it over gRPC as in the
    simulation, and the parameters are the simulation's. (The three in one process,
    ``peers_per_process``: still over gRPC, at a third of the start-up.)"""
    config = load_config(
        None,
        [
            "algorithm.name=dpsgd",
            "topology.kind=ring",
            "topology.nodes=3",
            "topology.undirected=true",
            "run.rounds=4",
            "run.eval_every=4",
            "time.step_s=0.1",
            "time.speeds={n1=4.0}",
            "simulate.engine=messages",
        ],
    )
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    assert sim["time"]["virtual_seconds"] == pytest.approx(4 * 0.4)
    began = time.monotonic()
    grpc_run = launch(config, out_dir=tmp_path / "launch", show_progress=False, peers_per_process=3)
    assert grpc_run["params_sha256"] == sim["params_sha256"]
    assert "time" not in grpc_run  # real peers keep no virtual clock
    # Each of the 4 rounds waits for n1's 0.4 s (the launch's own start-up comes on top).
    assert time.monotonic() - began > 1.6
    assert grpc_run["wall_seconds"] > 1.6
