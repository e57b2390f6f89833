"""A flood of calls from an untrusted client does not stall the trusted peers' rounds.

``fedcore launch`` runs four peers in deadline mode; a separate process floods one of
them with ``Push`` streams (some carrying megabytes after the header) and handshakes from
a sender no peer trusts, for the whole run. Every flood call must be refused, and no
trusted message may miss its deadline: in deadline mode a stall beyond the deadline would
show up as a missing message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedcore.certs import init_certs
from fedcore.config import load_config
from fedcore.deploy.launch import launch

FLOODER = r"""
import asyncio, json, sys, time
import grpc
import torch
from fedcore.compression import RawCodec
from fedcore.messages import Message
from fedcore.proto import peer_pb2 as pb
from fedcore.transport.grpc.serde import message_to_wire
from fedcore.transport.grpc.transport import _PUSH

address, seconds, workers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
certs = sys.argv[4] if len(sys.argv) > 4 else ""  # mutual TLS as a certified stranger

def message(values: int) -> Message:
    tensor = RawCodec().encode(torch.zeros(values))
    return Message(run="x", round=0, phase=0, sender="mallory", receiver="n0",
                   tensors={"x": tensor})

small, big = message(16), message(1 << 18)  # 64 B and 1 MiB of tensor data
codes: dict[str, int] = {}

async def worker(k: int, stop: float) -> None:
    # Retry fast until the peer is up (gRPC's default backoff grows to minutes).
    options = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 200)]
    if certs:
        from fedcore.certs import load_tls
        tls = load_tls(certs, "mallory")
        credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
        options.append(("grpc.ssl_target_name_override", "n0"))
        channel = grpc.aio.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.aio.insecure_channel(address, options=options)
    async with channel:
        push = channel.stream_unary(_PUSH)
        hello = channel.unary_unary("/fedcore.v1.Peer/Handshake",
                                    request_serializer=pb.Hello.SerializeToString)
        i = 0
        while time.monotonic() < stop:
            i += 1
            try:
                if i % 5 == 0:
                    await hello(pb.Hello(node_id="mallory", protocol_version=1, run="x"),
                                timeout=5)
                else:
                    await push(message_to_wire(big if i % 4 == 0 else small), timeout=5)
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            codes[code] = codes.get(code, 0) + 1
            if code == "UNAVAILABLE":
                if codes.get("PERMISSION_DENIED"):
                    return  # the peer was up and has finished its run
                await asyncio.sleep(0.05)

async def main() -> None:
    stop = time.monotonic() + seconds
    await asyncio.gather(*(worker(k, stop) for k in range(workers)))

asyncio.run(main())
print(json.dumps(codes))
"""


@pytest.mark.grpc
@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "mutual-tls"])
def test_a_flood_from_an_untrusted_client_does_not_stall_trusted_rounds(
    tmp_path: Path, tls: bool
) -> None:
    """With TLS the stranger holds a certificate of the deployment's own CA, for a node id
    that is not in the graph: the worst case, since its calls pass the TLS handshake."""
    overrides = [
        "topology.kind=ring", "topology.nodes=4", "algorithm.name=dpsgd",
        "run.rounds=200", "run.eval_every=100",
        "transport.mode=deadline", "transport.deadline_s=1.0",
    ]  # fmt: skip
    extra: list[str] = []
    if tls:
        init_certs(["n0", "n1", "n2", "n3", "mallory"], tmp_path / "certs")
        overrides.append(f"transport.tls.dir={tmp_path / 'certs'}")
        extra = [str(tmp_path / "certs")]
    config = load_config(None, overrides)
    out = tmp_path / "run"
    found: dict[str, object] = {}

    def flood() -> None:
        roster = out / "roster.json"
        while not roster.exists():
            time.sleep(0.02)
        time.sleep(0.05)  # the launcher writes it whole, then starts the peers
        address = json.loads(roster.read_text())["n0"]
        proc = subprocess.run(
            [sys.executable, "-c", FLOODER, address, "60", "8", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        found["stdout"], found["stderr"] = proc.stdout, proc.stderr

    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        summary = launch(config, out_dir=out, show_progress=False)
    finally:
        flooder.join(timeout=150)
    assert found.get("stdout"), found.get("stderr")
    codes = json.loads(str(found["stdout"]).strip().splitlines()[-1])
    refused = codes.get("PERMISSION_DENIED", 0)
    assert codes.get("OK", 0) == 0, codes
    # The flood overlapped the run: n0 refused calls while it ran its rounds.
    n0 = json.loads((out / "nodes" / "n0" / "node.json").read_text())
    assert n0["rounds"] == config.run.rounds
    assert n0["stats"]["messages_rejected"] >= 500, (n0["stats"], codes)
    assert refused >= n0["stats"]["messages_rejected"] // 2, codes
    # ...and no trusted message missed its deadline.
    assert summary["traffic"]["messages_missing"] == 0, summary["missing_rounds"]
    # One log line per kind of refusal every 10 s, not one per call.
    log = (out / "nodes" / "n0" / "node.log").read_text()
    assert 0 < log.count("not a trusted in-neighbour") < 20
    assert summary["final"]["avg_model_accuracy"] > 0.8
