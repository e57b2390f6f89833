"""gRPC-specific behaviour: status codes for hostile input, big messages, serde."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.compression import RawCodec
from fedcore.errors import MessageTooLargeError, PeerUnavailableError, ProtocolError
from fedcore.messages import Message
from fedcore.proto import peer_pb2 as pb
from fedcore.proto import peer_pb2_grpc as pb_grpc
from fedcore.transport.grpc import GrpcTransport
from fedcore.transport.grpc.serde import (
    MessageAssembler,
    header_to_proto,
    message_to_chunks,
    message_to_wire,
)

RUN = "run-fingerprint"


def _msg(
    sender: str = "a", receiver: str = "b", n: int = 4, value: float = 1.0, run: str = RUN
) -> Message:
    return Message(
        run=run,
        round=0,
        phase=0,
        sender=sender,
        receiver=receiver,
        tensors={"x": RawCodec().encode(torch.full((n,), value))},
        scalars={"omega": 0.5},
    )


def _validator(message: Message) -> None:
    x = RawCodec().decode(message.tensors["x"])
    if x.shape != (4,):
        raise ProtocolError(f"wrong shape {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ProtocolError("non-finite values")


@given(
    st.lists(st.integers(0, 3000), min_size=0, max_size=3),
    st.integers(1, 5000),
    st.dictionaries(st.text(min_size=1, max_size=5), st.floats(allow_nan=False), max_size=3),
)
@settings(max_examples=40)
def test_serde_round_trip(sizes: list[int], chunk: int, scalars: dict[str, float]) -> None:
    tensors = {
        f"t{i}": RawCodec().encode(torch.arange(n, dtype=torch.float64))
        for i, n in enumerate(sizes)
    }
    m = Message(
        run="r", round=7, phase=1, sender="s", receiver="r", tensors=tensors, scalars=scalars
    )
    assembler = MessageAssembler(1 << 20)
    for c in message_to_chunks(m, chunk):
        assembler.add(c)
    assert assembler.finish() == m


def test_assembler_rejects_bad_streams() -> None:
    m = _msg(n=1000)
    chunks = list(message_to_chunks(m, 1000))
    a = MessageAssembler(1 << 20)
    a.add(chunks[0])
    a.add(chunks[1])
    with pytest.raises(ProtocolError, match="truncated"):
        a.finish()
    with pytest.raises(MessageTooLargeError):
        MessageAssembler(100).add(chunks[0])
    b = MessageAssembler(1 << 20)
    with pytest.raises(ProtocolError, match="before its header"):
        b.add(chunks[1])
    c = MessageAssembler(1 << 20)
    for ch in chunks:
        c.add(ch)
    with pytest.raises(ProtocolError, match="more than"):
        c.add(chunks[1])


async def _serve(**kwargs: Any) -> GrpcTransport:
    t = GrpcTransport(
        "b",
        listen="127.0.0.1:0",
        roster={},
        run_id=RUN,
        trusted={"a"},
        validator=_validator,
        **kwargs,
    )
    await t.start()
    return t


def _chunks_with(header_changes: dict[str, Any], data: bytes | None = None) -> Iterator[pb.Chunk]:
    m = _msg()
    header = header_to_proto(m)
    for k, v in header_changes.items():
        setattr(header, k, v)
    yield pb.Chunk(header=header)
    yield pb.Chunk(data=data if data is not None else m.tensors["x"].data)


HOSTILE = {
    "untrusted-sender": ({"sender": "mallory"}, None, grpc.StatusCode.PERMISSION_DENIED),
    "other-run": ({"run": "another-run"}, None, grpc.StatusCode.FAILED_PRECONDITION),
    "nan": ({}, torch.full((4,), float("nan")).numpy().tobytes(), grpc.StatusCode.INVALID_ARGUMENT),
    "truncated": ({}, b"\x00" * 8, grpc.StatusCode.INVALID_ARGUMENT),
    "wrong-receiver": ({"receiver": "c"}, None, grpc.StatusCode.INVALID_ARGUMENT),
}


@pytest.mark.grpc
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_pushes_get_their_status_and_peer_keeps_serving(case: str) -> None:
    changes, data, expected = HOSTILE[case]

    async def main() -> None:
        server = await _serve()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.PeerStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Push(_chunks_with(changes, data), timeout=5)
                assert err.value.code() == expected
                # The peer still serves a good message afterwards.
                await stub.Push(message_to_chunks(_msg()), timeout=5)
            got = await server.collect(0, 0, {"a"}, timeout=5)
            assert list(got) == ["a"]
            assert server.stats.messages_rejected == 1
        finally:
            await server.close(0.1)

    asyncio.run(main())


@pytest.mark.grpc
def test_oversized_and_shape_mismatch() -> None:
    async def main() -> None:
        server = await _serve(max_message_bytes=64)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.PeerStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Push(message_to_chunks(_msg(n=100)), timeout=5)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Push(message_to_chunks(_msg(n=5)), timeout=5)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                bad = pb.Hello(node_id="a", protocol_version=99, run=RUN)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.Handshake(bad, timeout=5)
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await server.close(0.1)

    asyncio.run(main())


@pytest.mark.grpc
def test_health_service_reports_serving() -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async def main() -> None:
        server = await _serve()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=5
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.close(0.1)

    asyncio.run(main())


@pytest.mark.grpc
def test_unreachable_peer_is_named() -> None:
    async def main() -> None:
        t = GrpcTransport(
            "a", listen="127.0.0.1:0", roster={"b": "127.0.0.1:1"}, run_id=RUN, trusted=set()
        )
        await t.start()
        try:
            with pytest.raises(
                PeerUnavailableError, match=r"'a' could not reach b at 127\.0\.0\.1:1"
            ):
                await t.connect(["b"], timeout_s=0.5)
        finally:
            await t.close(0.1)

    asyncio.run(main())


@pytest.mark.grpc
def test_peers_that_start_together_wait_for_their_in_neighbours() -> None:
    """``together`` (asynchronous peers): a peer that sends to nobody still waits until the
    peer that sends to it said hello, so it cannot finish and stop before that one came;
    without it, strict mode starts at once."""

    async def main() -> None:
        a = GrpcTransport("a", listen="127.0.0.1:0", roster={}, run_id=RUN, trusted={"b"})
        b = GrpcTransport("b", listen="127.0.0.1:0", roster={}, run_id=RUN, trusted=set())
        await a.start()
        await b.start()
        b.roster = {"a": f"127.0.0.1:{a.port}"}
        try:
            assert await asyncio.wait_for(a.connect([], timeout_s=5.0), 1.0) == []
            waiting = asyncio.create_task(a.connect([], timeout_s=5.0, together=True))
            await asyncio.sleep(0.3)
            assert not waiting.done()  # b has not said hello yet
            await b.connect(["a"], timeout_s=5.0)
            assert await asyncio.wait_for(waiting, 1.0) == []
        finally:
            await a.close(0.1)
            await b.close(0.1)

    asyncio.run(main())


@pytest.mark.grpc
def test_100_mb_model_crosses() -> None:
    async def main() -> None:
        b = GrpcTransport("b", listen="127.0.0.1:0", roster={}, run_id=RUN, trusted={"a"})
        await b.start()
        a = GrpcTransport(
            "a",
            listen="127.0.0.1:0",
            roster={"b": f"127.0.0.1:{b.port}"},
            run_id=RUN,
            trusted=set(),
        )
        await a.start()
        try:
            await a.connect(["b"], timeout_s=10)
            big = torch.arange(26_214_400, dtype=torch.float32)  # 100 MiB
            m = Message(
                run=RUN,
                round=0,
                phase=0,
                sender="a",
                receiver="b",
                tensors={"x": RawCodec().encode(big)},
            )
            await a.send(m)
            got = await b.collect(0, 0, {"a"}, timeout=30)
            assert torch.equal(RawCodec().decode(got["a"].tensors["x"]), big)
        finally:
            await a.close(0.1)
            await b.close(0.1)

    asyncio.run(main())


@given(
    st.lists(st.integers(0, 3000), min_size=0, max_size=3),
    st.integers(1, 5000),
)
@settings(max_examples=40)
def test_wire_bytes_are_the_generated_chunks(sizes: list[int], chunk: int) -> None:
    """The hand-written data chunks are byte-identical to the generated class's output."""
    tensors = {
        f"t{i}": RawCodec().encode(torch.arange(n, dtype=torch.float32))
        for i, n in enumerate(sizes)
    }
    m = Message(run="r", round=1, phase=0, sender="s", receiver="r", tensors=tensors)
    wire = list(message_to_wire(m, chunk))
    assert wire == [c.SerializeToString() for c in message_to_chunks(m, chunk)]
    assembler = MessageAssembler(1 << 20)
    for raw in wire:
        assembler.add(raw)
    assert assembler.finish() == m


def test_foreign_chunking_across_tensor_boundaries() -> None:
    """Another sender may cut chunks anywhere; the assembler regroups the bytes per tensor."""
    a, b = torch.arange(5, dtype=torch.float32), torch.arange(7, dtype=torch.float64)
    m = Message(
        run="r", round=0, phase=0, sender="s", receiver="r",
        tensors={"a": RawCodec().encode(a), "b": RawCodec().encode(b)},
    )  # fmt: skip
    data = m.tensors["a"].data + m.tensors["b"].data
    assembler = MessageAssembler(1 << 20)
    assembler.add(pb.Chunk(header=header_to_proto(m)).SerializeToString())
    for start in range(0, len(data), 9):  # 9-byte pieces straddle the 20-byte boundary
        assembler.add(pb.Chunk(data=data[start : start + 9]).SerializeToString())
    assert assembler.finish() == m


def test_garbage_bytes_are_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="not a valid protobuf"):
        MessageAssembler(100).add(b"\xff\xff\xff")
    with pytest.raises(ProtocolError, match="empty chunk"):
        MessageAssembler(100).add(b"")


def test_a_busy_listen_port_is_one_clear_error() -> None:
    """Another process holds the port: the peer says so, naming the address and the fix."""
    import asyncio
    import socket

    from fedcore.errors import PeerUnavailableError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    t = GrpcTransport("n0", listen=f"127.0.0.1:{port}", roster={}, run_id="r", trusted=set())
    try:
        with pytest.raises(
            PeerUnavailableError, match=r"cannot listen on 127\.0\.0\.1:\d+: the port is in use"
        ):
            asyncio.run(t.start())
    finally:
        holder.close()
