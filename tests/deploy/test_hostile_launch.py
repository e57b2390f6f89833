"""A hostile client during a real multi-peer ``launch``, plaintext and mutual TLS.

The client is written against the wire protocol alone (it knows the run's fingerprint, as
any certified peer of the deployment does). It claims (plaintext) or holds the certificate
of (mutual TLS) the trusted in-neighbour ``n1`` of ``n0`` and sends every category of
hostile input: malformed messages of every kind, impossible weights, rounds far ahead,
another phase, unsafe and megabyte ids, bytes that are no message, a stalled stream. Every
call must get its status code within a bounded time, no peer may die, and the strict run
must still end bit-identical to ``simulate`` (everything hostile was refused before it was
filed).

The run outlasts the attack by pacing, not by many rounds: every peer's round takes at least
``STEP_S`` of real time (``[time]`` as real sleeps, :mod:`fedcore.node.pace`), so the few
``ROUNDS`` last ``ROUNDS * STEP_S`` seconds whatever the load, while costing little CPU. Two
peers a process (``peers_per_process``): the peers still talk over gRPC between processes, at
half the start-up (a torch import a process).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
import torch

from fedcore.certs import init_certs, load_tls
from fedcore.compression import RawCodec
from fedcore.config import load_config
from fedcore.deploy.launch import launch
from fedcore.messages import Message
from fedcore.proto import peer_pb2 as pb
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate
from fedcore.transport.grpc.channel import open_channel
from fedcore.transport.grpc.serde import header_to_proto, message_to_wire

pytestmark = pytest.mark.grpc

ROUNDS = 30
STEP_S = 0.3
"""Each round lasts at least STEP_S real seconds: the run outlasts the attack (a few seconds)."""
BOUND_S = 8.0
"""Longest any hostile call may take (the stall is cut after chunk_timeout_s = 1)."""


def _attacks(run: str, numel: int, round_now: int) -> dict[str, tuple[list[bytes], str]]:
    x = RawCodec().encode(torch.zeros(numel))
    good = Message(
        run=run, round=round_now + 1, phase=0, sender="n1", receiver="n0",
        tensors={"x": x}, scalars={"omega": 0.5},
    )  # fmt: skip

    def wire(m: Message) -> list[bytes]:
        return list(message_to_wire(m))

    twice = header_to_proto(good)
    twice.tensors.append(twice.tensors[0])
    twice.total_bytes *= 2
    bad = "INVALID_ARGUMENT"
    return {
        "no tensors": (wire(replace(good, tensors={})), bad),
        "x twice": (
            [
                pb.Chunk(header=twice).SerializeToString(),
                *[pb.Chunk(data=x.data).SerializeToString()] * 2,
            ],
            bad,
        ),
        "extra tensor": (wire(replace(good, tensors={"x": x, "y": x})), bad),
        "extra scalar": (wire(replace(good, scalars={"omega": 0.5, "z": 1.0})), bad),
        "empty scalar name": (wire(replace(good, scalars={"omega": 0.5, "": 1.0})), bad),
        "long scalar name": (wire(replace(good, scalars={"omega": 0.5, "s" * 5000: 1.0})), bad),
        "no omega": (wire(replace(good, scalars={})), bad),
        "omega 0": (wire(replace(good, scalars={"omega": 0.0})), bad),
        "omega < 0": (wire(replace(good, scalars={"omega": -1.0})), bad),
        "omega 1e300": (wire(replace(good, scalars={"omega": 1e300})), bad),
        "phase 7": (wire(replace(good, phase=7)), bad),
        "round 2**63": (wire(replace(good, round=2**63)), "FAILED_PRECONDITION"),
        "round +10**6": (wire(replace(good, round=round_now + 10**6)), "FAILED_PRECONDITION"),
        "id ../../esc": (wire(replace(good, sender="../../esc")), "PERMISSION_DENIED"),
        "megabyte id": (wire(replace(good, sender="m" * (1 << 20))), "PERMISSION_DENIED"),
        "random bytes": ([bytes(range(256)) * 3], bad),
    }


async def _attack(
    address: str, tls_dir: Path | None, run: str, numel: int
) -> dict[str, tuple[str, float]]:
    tls = load_tls(tls_dir, "n1") if tls_dir is not None else None
    channel = open_channel(address, tls, "n0")
    results: dict[str, tuple[str, float]] = {}

    async def timed(what: str, call: object, expected: str) -> None:
        began = time.monotonic()
        try:
            await call  # type: ignore[misc]
            code = "OK"
        except grpc.aio.AioRpcError as err:
            code = err.code().name
        results[what] = (code, time.monotonic() - began)
        assert code == expected, (what, code)

    async with channel:
        hello = channel.unary_unary(
            "/fedcore.v1.Peer/Handshake",
            request_serializer=lambda b: b,
            response_deserializer=pb.Welcome.FromString,
        )
        push = channel.stream_unary(
            "/fedcore.v1.Peer/Push",
            request_serializer=lambda b: b,
            response_deserializer=pb.Ack.FromString,
        )
        claim = pb.Hello(node_id="n1", protocol_version=1, run=run)
        welcome = await hello(claim.SerializeToString(), timeout=5)
        assert welcome.node_id == "n0"
        attacks = _attacks(run, numel, 0)
        for what, (chunks, expected) in attacks.items():
            await timed(what, push(iter(chunks), timeout=BOUND_S), expected)
        await timed("Hello bytes", hello(b"\xff" * 64, timeout=BOUND_S), "INVALID_ARGUMENT")

        header = attacks["no omega"][0][0]

        async def stall() -> AsyncIterator[bytes]:
            yield header
            await asyncio.sleep(60)

        await timed("stall", push(stall(), timeout=30), "DEADLINE_EXCEEDED")
    return results


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "mutual-tls"])
def test_hostile_client_during_a_launch(tmp_path: Path, tls: bool) -> None:
    overrides = [
        "algorithm.name=ops",
        "topology.kind=ring",
        "topology.nodes=4",
        f"run.rounds={ROUNDS}",
        f"run.eval_every={ROUNDS}",
        f"time.step_s={STEP_S}",
        "transport.chunk_timeout_s=1",
    ]
    if tls:
        init_certs(["n0", "n1", "n2", "n3"], tmp_path / "certs")
        overrides.append(f"transport.tls.dir={tmp_path / 'certs'}")
    config = load_config(None, [*overrides, "simulate.engine=messages"])
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    setup = prepare_run(config)
    out = tmp_path / "launch"
    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["summary"] = launch(
                config, out_dir=out, show_progress=False, peers_per_process=2
            )
        except Exception as exc:  # surfaced below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    roster_file = out / "roster.json"
    metrics = out / "nodes" / "n0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.05)
    roster = json.loads(roster_file.read_text(encoding="utf-8"))
    certs = tmp_path / "certs" if tls else None
    results = asyncio.run(_attack(roster["n0"], certs, setup.run_id, setup.start.numel()))
    during = metrics.read_text(encoding="utf-8").count("\n")
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert "error" not in result, result.get("error")
    assert during < ROUNDS, "the run ended before the attack did; raise ROUNDS or STEP_S"
    assert all(seconds < BOUND_S for _, seconds in results.values()), results
    summary = result["summary"]
    assert isinstance(summary, dict)
    assert summary["params_sha256"] == sim["params_sha256"]
    info = json.loads((out / "nodes" / "n0" / "node.json").read_text(encoding="utf-8"))
    assert info["rounds"] == ROUNDS
    assert info["stats"]["messages_rejected"] >= len(results)
    log = (out / "procs" / "0.log").read_text(encoding="utf-8")  # n0's process (and n1's)
    assert "n0: done after" in log
    assert "Traceback" not in log
    assert max(len(line) for line in log.splitlines()) < 2000
