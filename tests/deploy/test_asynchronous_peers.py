"""Asynchronous algorithms as real peers (:mod:`fedcore.node.asynchronous`): no lockstep
over gRPC, a slow peer nobody waits for, and what a peer refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fedcore.compression import RawCodec
from fedcore.config import load_config
from fedcore.deploy.launch import launch
from fedcore.errors import ProtocolError
from fedcore.messages import Message
from fedcore.setup.prepare import prepare_run
from fedcore.transport import InProcessNetwork


def _busy(folder: Path, node: str) -> tuple[int, float]:
    """A peer's records and the wall seconds its rounds after the first took (the first
    may wait for a partner still connecting: start-up skew, not the slow peer)."""
    lines = (folder / "nodes" / node / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return len(records), sum(r["wall_s"] for r in records[1:])


@pytest.mark.grpc
@pytest.mark.parametrize(
    ("algorithm", "graph"),
    [
        ("adpsgd", ["topology.kind=ring", "topology.undirected=true", "topology.nodes=4"]),
        ("async-push-sum", ["topology.kind=exponential", "topology.nodes=4"]),
        ("fedbuff", ["topology.kind=star", "topology.nodes=4", "algorithm.buffer=2"]),
    ],
)
def test_no_peer_waits_for_a_slow_one(algorithm: str, graph: list[str], tmp_path: Path) -> None:
    """n1 computes 15x slower (``[time]`` as real sleeps); the others run their rounds at
    their own pace and finish long before it, and the run completes. (Two peers a process:
    n0 and the slow n1 in one, whose sleeps are awaited, n2 and n3 in the other; every
    message still goes over gRPC, at half the start-up of a process a peer. fedbuff keeps a
    process a peer: with several a process its launch's summary has no final evaluation.)"""
    config = load_config(
        None,
        [
            f"algorithm.name={algorithm}",
            *graph,
            "run.rounds=8",
            "run.eval_every=4",
            "time.step_s=0.04",
            "time.speeds={n1=15.0}",
        ],
    )
    per_process = 1 if algorithm == "fedbuff" else 2
    summary = launch(
        config, out_dir=tmp_path / "run", show_progress=False, peers_per_process=per_process
    )
    assert summary["status"] == "completed"
    assert summary["final"]["avg_model_accuracy"] > 0.3
    slow_records, slow = _busy(tmp_path / "run", "n1")
    fast_records, fast = _busy(tmp_path / "run", "n0")
    assert slow_records == fast_records == 8
    assert slow > 7 * 0.6 * 0.9  # its own slow computations
    assert fast < slow / 3, (fast, slow)  # n0 never waited for n1


def _peer(algorithm: str, graph: str) -> object:
    setup = prepare_run(
        load_config(
            None, [f"algorithm.name={algorithm}", f"topology.kind={graph}", "time.step_s=0.1"]
        )
    )
    node = "n0"
    return setup.make_async_peer(node, InProcessNetwork().endpoint(node))


def test_an_asynchronous_peer_refuses_malformed_messages() -> None:
    peer = _peer("async-push-sum", "exponential")
    d = peer.d  # type: ignore[attr-defined]

    def message(tensor: torch.Tensor, codec: object = None, **scalars: float) -> Message:
        encoded = (codec or RawCodec()).encode(tensor)  # type: ignore[attr-defined]
        return Message(
            run="r",
            round=0,
            phase=0,
            sender="n1",
            receiver="n0",
            tensors={"x": encoded},
            scalars=scalars,
        )

    peer.validate(message(torch.ones(d + 1, dtype=torch.float64)))  # type: ignore[attr-defined]
    for bad in (
        torch.ones(d, dtype=torch.float64),  # no weight
        torch.ones(d + 1, dtype=torch.float32),  # not a float64 sum
        torch.full((d + 1,), math.nan, dtype=torch.float64),
        -torch.ones(d + 1, dtype=torch.float64),  # a negative weight
    ):
        with pytest.raises(ProtocolError):
            peer.validate(message(bad))  # type: ignore[attr-defined]
    worker = _peer("fedbuff", "star")
    model = torch.ones(worker.d)  # type: ignore[attr-defined]
    codec = worker.codec  # type: ignore[attr-defined]
    worker.validate(message(model, codec, version=1.0))  # type: ignore[attr-defined]
    for scalars in ({}, {"version": -1.0}, {"version": 0.5}):
        with pytest.raises(ProtocolError, match="version"):
            worker.validate(message(model, codec, **scalars))  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match="decoded"):  # a raw float64 sum, not a model
        worker.validate(message(torch.ones(5, dtype=torch.float64), version=1.0))  # type: ignore[attr-defined]
