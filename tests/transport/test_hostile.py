"""A real peer's servicer against one hostile client: every category gets its status code
in bounded time, is counted, logs one short line, and the peer keeps serving.

Categories: bytes that are no Hello; a message for a round far ahead (FAILED_PRECONDITION,
and it changes nothing); a tensor listed twice; extra fields; a stream that stalls after
its header, or trickles; more concurrent streams than a sender may hold; megabyte ids.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest
import torch

from fedcore.compression import RawCodec
from fedcore.config import load_config
from fedcore.errors import MessageRefusedError
from fedcore.messages import Message
from fedcore.proto import peer_pb2 as pb
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.transport.grpc import GrpcTransport
from fedcore.transport.grpc.serde import header_to_proto, message_to_wire

pytestmark = pytest.mark.grpc

PUSH = "/fedcore.v1.Peer/Push"
HANDSHAKE = "/fedcore.v1.Peer/Handshake"


def _setup() -> RunSetup:
    config = load_config(
        None,
        ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=3", "run.rounds=2"],
    )
    return prepare_run(config)


def _message(setup: RunSetup, round: int = 0, **scalars: float) -> Message:
    x = torch.zeros(setup.start.numel())
    return Message(
        run=setup.run_id,
        round=round,
        phase=0,
        sender="n0",
        receiver="n1",
        tensors={"x": RawCodec().encode(x)},
        scalars=scalars,
    )


Client = Callable[[grpc.aio.Channel, GrpcTransport], Awaitable[None]]


def _serve(setup: RunSetup, client: Client, **options: object) -> GrpcTransport:
    async def main() -> GrpcTransport:
        server = GrpcTransport(
            "n1",
            listen="127.0.0.1:0",
            roster={},
            run_id=setup.run_id,
            trusted={"n0", "n2"},
            **options,  # type: ignore[arg-type]
        )
        node = setup.make_node("n1", server)
        server.validator = node.validate
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                await client(channel, server)
                # Still serving: a good message goes through.
                push = _push(channel)
                await push(iter(list(message_to_wire(_message(setup)))), timeout=10)
        finally:
            await server.close(0.1)
        return server

    return asyncio.run(main())


def _push(channel: grpc.aio.Channel) -> grpc.aio.StreamUnaryMultiCallable:
    return channel.stream_unary(
        PUSH, request_serializer=lambda b: b, response_deserializer=pb.Ack.FromString
    )


async def _code(call: Awaitable[object]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_bytes_that_are_no_hello_get_invalid_argument_and_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    setup = _setup()
    codes: list[grpc.StatusCode] = []

    async def client(channel: grpc.aio.Channel, server: GrpcTransport) -> None:
        hello = channel.unary_unary(
            HANDSHAKE, request_serializer=lambda b: b, response_deserializer=pb.Welcome.FromString
        )
        for garbage in (b"\xff\xff\xff", bytes(range(256)) * 40, b"\x0a\x05ab"):
            codes.append(await _code(hello(garbage, timeout=5)))
        huge = pb.Hello(node_id="m" * (1 << 20), run=setup.run_id, protocol_version=1)
        codes.append(await _code(hello(huge.SerializeToString(), timeout=5)))
        health = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        codes.append(await _code(health(b"\xff\xff\xff", timeout=5)))
        codes.append(await _code(health(b"", timeout=5)))  # a valid, empty request

    with caplog.at_level(logging.WARNING):
        server = _serve(setup, client)
    assert codes[:3] == [grpc.StatusCode.INVALID_ARGUMENT] * 3
    assert codes[3] == grpc.StatusCode.PERMISSION_DENIED
    assert codes[4:] == [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK]
    assert server.stats.messages_rejected == 5
    lines = [r.getMessage() for r in caplog.records]
    assert lines and all(len(line) < 1000 for line in lines)
    assert not any(r.exc_info for r in caplog.records)  # no tracebacks


def test_rounds_far_ahead_are_refused_and_change_nothing() -> None:
    setup = _setup()
    codes: dict[int, grpc.StatusCode] = {}

    async def client(channel: grpc.aio.Channel, server: GrpcTransport) -> None:
        push = _push(channel)
        for r in (2**63, 2**64 - 1, 10**6, 40):
            wire = list(message_to_wire(_message(setup, round=r)))
            codes[r] = await _code(push(iter(wire), timeout=5))
        # The sender is still waited for in round 0 (nothing of it was filed ahead) ...
        assert server.mailbox._outstanding((0, 0), frozenset({"n0"})) == {"n0"}
        wire = list(message_to_wire(_message(setup, round=2)))
        codes[2] = await _code(push(iter(wire), timeout=5))
        # ... and in strict mode even a message within the window does not mute it.
        assert server.mailbox._outstanding((0, 0), frozenset({"n0"})) == {"n0"}

    _serve(setup, client, skip_ahead=False)
    assert codes == {
        2**63: grpc.StatusCode.FAILED_PRECONDITION,
        2**64 - 1: grpc.StatusCode.FAILED_PRECONDITION,
        10**6: grpc.StatusCode.FAILED_PRECONDITION,
        40: grpc.StatusCode.FAILED_PRECONDITION,  # strict ring: a neighbour leads by 1
        2: grpc.StatusCode.OK,
    }


def test_a_tensor_listed_twice_or_an_extra_scalar_is_invalid() -> None:
    setup = _setup()
    codes: list[grpc.StatusCode] = []

    async def client(channel: grpc.aio.Channel, server: GrpcTransport) -> None:
        push = _push(channel)
        message = _message(setup)
        header = header_to_proto(message)
        header.tensors.append(header.tensors[0])
        header.total_bytes *= 2
        data = message.tensors["x"].data
        twice = [pb.Chunk(header=header).SerializeToString()]
        twice += [pb.Chunk(data=data).SerializeToString()] * 2
        codes.append(await _code(push(iter(twice), timeout=5)))
        extra = list(message_to_wire(_message(setup, omega=1.0)))
        codes.append(await _code(push(iter(extra), timeout=5)))

    _serve(setup, client)
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 2


def test_a_stalled_or_trickling_stream_is_cut_in_bounded_time() -> None:
    setup = _setup()
    results: list[tuple[grpc.StatusCode, float]] = []
    message = _message(setup)
    wire = list(message_to_wire(message))

    async def stall() -> AsyncIterator[bytes]:
        yield wire[0]
        await asyncio.sleep(30)

    async def silent() -> AsyncIterator[bytes]:
        await asyncio.sleep(30)
        yield wire[0]

    async def trickle() -> AsyncIterator[bytes]:
        yield wire[0]
        for i in range(len(message.tensors["x"].data)):
            await asyncio.sleep(0.2)
            yield pb.Chunk(data=message.tensors["x"].data[i : i + 1]).SerializeToString()

    async def client(channel: grpc.aio.Channel, server: GrpcTransport) -> None:
        push = _push(channel)
        for stream in (stall, silent, trickle):
            began = time.monotonic()
            code = await _code(push(stream(), timeout=30))
            results.append((code, time.monotonic() - began))

    # 2,600 bytes at 1,000 B/s at least: 0.5 + 2.6 s in all.
    _serve(setup, client, chunk_timeout_s=0.5, min_rate_bytes_s=1000.0)
    assert [code for code, _ in results] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 3
    assert results[0][1] < 3 and results[1][1] < 3
    assert 2.5 < results[2][1] < 6


def test_a_sender_holds_at_most_max_streams_open() -> None:
    setup = _setup()
    codes: list[grpc.StatusCode] = []
    wire = list(message_to_wire(_message(setup)))

    async def stall() -> AsyncIterator[bytes]:
        yield wire[0]
        await asyncio.sleep(30)

    async def client(channel: grpc.aio.Channel, server: GrpcTransport) -> None:
        push = _push(channel)
        held = [asyncio.ensure_future(_code(push(stall(), timeout=30))) for _ in range(3)]
        await asyncio.sleep(0.5)
        codes.append(await _code(push(stall(), timeout=30)))  # the fourth
        codes.extend(await asyncio.gather(*held))

    _serve(setup, client, chunk_timeout_s=1.5, max_streams_per_sender=3)
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] + [grpc.StatusCode.DEADLINE_EXCEEDED] * 3


def test_the_sender_of_a_refused_message_gets_message_refused_error() -> None:
    setup = _setup()

    async def client(channel: grpc.aio.Channel, server: GrpcTransport) -> None:
        sender = GrpcTransport(
            "n0",
            listen="127.0.0.1:0",
            roster={"n1": f"127.0.0.1:{server.port}"},
            run_id=setup.run_id,
            trusted=(),
        )
        await sender.connect(["n1"], timeout_s=5)
        try:
            with pytest.raises(MessageRefusedError, match="FAILED_PRECONDITION"):
                await sender.send(_message(setup, round=10**6))
            with pytest.raises(MessageRefusedError, match="INVALID_ARGUMENT"):
                await sender.send(_message(setup, omega=1.0))
        finally:
            await sender.close(0.1)

    _serve(setup, client)
