"""The gRPC receive path's one preallocated buffer: same message as the join it replaced,
same size bounds, and the ``raw`` codec's in-place decode of it."""

from __future__ import annotations

import gc
import itertools
import random

import numpy as np
import pytest
import torch

from fedcore.compression import CODECS, RawCodec, make_codec
from fedcore.errors import MessageTooLargeError, ProtocolError
from fedcore.messages import EncodedTensor, Message
from fedcore.proto import peer_pb2 as pb
from fedcore.transport.grpc.serde import (
    MessageAssembler,
    header_to_proto,
    message_to_wire,
    parse_chunk,
)

CHUNK = 64  # small chunks: many boundaries in a few hundred bytes


def _reference_decode(wire: list[bytes]) -> Message:
    """The receive path before the preallocated buffer: keep every chunk's data, then
    join each tensor's bytes out of them (the parts may straddle tensors)."""
    header = parse_chunk(wire[0])
    assert isinstance(header, pb.MessageHeader)
    parts: list[bytes] = []
    for raw in wire[1:]:
        part = parse_chunk(raw)
        assert isinstance(part, memoryview)
        parts.append(bytes(part))
    stream = b"".join(parts)
    tensors: dict[str, EncodedTensor] = {}
    offset = 0
    for t in header.tensors:
        tensors[t.name] = EncodedTensor(
            codec=t.codec,
            dtype=t.dtype,
            shape=tuple(t.shape),
            data=stream[offset : offset + t.nbytes],
            params=dict(t.params),
        )
        offset += t.nbytes
    return Message(
        run=header.run,
        round=header.round,
        phase=header.phase,
        sender=header.sender,
        receiver=header.receiver,
        tensors=tensors,
        scalars=dict(header.scalars),
        nbytes=header.total_bytes + 8 * len(header.scalars),
    )


def _message(sizes: list[int], seed: int, dtype: torch.dtype = torch.float32) -> Message:
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        f"t{i}": RawCodec().encode(torch.randn(n, generator=gen, dtype=dtype))
        for i, n in enumerate(sizes)
    }
    return Message(
        run="run",
        round=3,
        phase=1,
        sender="s",
        receiver="r",
        tensors=tensors,
        scalars={"omega": 0.25},
    )


def _assemble(wire: list[bytes], limit: int = 1 << 24) -> Message:
    assembler = MessageAssembler(limit)
    for raw in wire:
        assembler.add(raw)
    return assembler.finish()


def _foreign_wire(message: Message, cuts: list[int]) -> list[bytes]:
    """A stream another sender might write: the same bytes cut at ``cuts``."""
    stream = b"".join(bytes(t.data) for t in message.tensors.values())
    edges = [0, *sorted(c for c in cuts if 0 < c < len(stream)), len(stream)]
    wire = [pb.Chunk(header=header_to_proto(message)).SerializeToString()]
    for a, b in itertools.pairwise(edges):
        if b > a:
            wire.append(pb.Chunk(data=stream[a:b]).SerializeToString())
    return wire


def _assert_same(new: Message, old: Message) -> None:
    assert (new.run, new.round, new.phase, new.sender, new.receiver) == (
        old.run,
        old.round,
        old.phase,
        old.sender,
        old.receiver,
    )
    assert dict(new.scalars) == dict(old.scalars)
    assert new.nbytes == old.nbytes
    assert list(new.tensors) == list(old.tensors)
    for name, t in new.tensors.items():
        ref = old.tensors[name]
        assert (t.codec, t.dtype, t.shape, dict(t.params)) == (
            ref.codec,
            ref.dtype,
            ref.shape,
            dict(ref.params),
        )
        assert bytes(t.data) == ref.data
        a, b = RawCodec().decode(t), RawCodec().decode(ref)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.numpy().tobytes() == b.numpy().tobytes()  # bit for bit


# Element counts (float32: 4 bytes each) around the 64-byte chunk: empty, under one chunk,
# exactly one, one byte-group over, several, and tensors whose boundary falls inside a chunk.
SHAPES = [[], [0], [1], [15], [16], [17], [32], [33], [100], [16, 16], [15, 1, 17], [0, 5, 0, 40]]


@pytest.mark.parametrize("sizes", SHAPES)
def test_the_buffer_decodes_what_the_join_decoded(sizes: list[int]) -> None:
    for seed in range(3):
        message = _message(sizes, seed)
        wire = list(message_to_wire(message, CHUNK))
        new = _assemble(wire)
        _assert_same(new, _reference_decode(wire))
        assert new == message


def test_random_payloads_and_foreign_chunkings_decode_alike() -> None:
    rng = random.Random(25)
    for _ in range(60):
        sizes = [rng.choice([0, 1, 7, 16, 63, 64, 65, 300]) for _ in range(rng.randint(1, 4))]
        dtype = rng.choice([torch.float32, torch.float64])
        message = _message(sizes, rng.randrange(1 << 30), dtype)
        total = sum(len(t.data) for t in message.tensors.values())
        cuts = [rng.randrange(total + 1) for _ in range(rng.randint(0, 6))]
        for wire in (
            list(message_to_wire(message, rng.randint(1, 200))),
            _foreign_wire(message, cuts),
        ):
            _assert_same(_assemble(wire), _reference_decode(wire))


def test_a_large_message_at_the_default_chunk_size() -> None:
    """Several 1 MiB chunks and a tensor boundary inside one of them."""
    message = _message([600_000, 5, 300_001], seed=1)
    wire = list(message_to_wire(message))
    assert len(wire) > 4
    _assert_same(_assemble(wire), _reference_decode(wire))


def test_size_bounds_hold_before_any_buffer_exists() -> None:
    message = _message([100, 28], seed=0)  # 512 bytes
    wire = list(message_to_wire(message, CHUNK))
    with pytest.raises(MessageTooLargeError, match="exceeds this peer's limit"):
        MessageAssembler(511).add(wire[0])
    lazy = MessageAssembler(512)
    lazy.add(wire[0])
    assert lazy._buffer is None  # the header alone allocates nothing
    lazy.add(wire[1])
    assert lazy._buffer is not None and len(lazy._buffer) == 512


def test_chunks_beyond_the_declared_total_are_refused_and_write_nothing() -> None:
    message = _message([20], seed=0)  # 80 bytes
    wire = list(message_to_wire(message, CHUNK))
    assembler = MessageAssembler(1 << 20)
    for raw in wire:
        assembler.add(raw)
    before = bytes(assembler._buffer or b"")
    with pytest.raises(ProtocolError, match="more than the 80 bytes"):
        assembler.add(pb.Chunk(data=b"\xff").SerializeToString())
    assert bytes(assembler._buffer or b"") == before
    # A first chunk already past the total: refused before the buffer is written.
    over = MessageAssembler(1 << 20)
    over.add(wire[0])
    with pytest.raises(ProtocolError, match="more than"):
        over.add(pb.Chunk(data=b"\x00" * 81).SerializeToString())
    assert over._buffer is None


def test_a_truncated_stream_is_refused() -> None:
    wire = list(message_to_wire(_message([40], seed=0), CHUNK))  # 160 bytes, 3 chunks
    assembler = MessageAssembler(1 << 20)
    for raw in wire[:-1]:
        assembler.add(raw)
    with pytest.raises(ProtocolError, match=r"ended after 128 of 160 announced bytes"):
        assembler.finish()
    empty = MessageAssembler(1 << 20)
    empty.add(wire[0])
    with pytest.raises(ProtocolError, match="truncated"):
        empty.finish()


def test_raw_decodes_the_buffer_in_place_and_the_tensor_outlives_it() -> None:
    message = _message([1000, 3], seed=4)
    expected = {n: RawCodec().decode(t) for n, t in message.tensors.items()}
    got = _assemble(list(message_to_wire(message, 256)))
    data = got.tensors["t0"].data
    assert isinstance(data, memoryview) and not data.readonly
    x = RawCodec().decode(got.tensors["t0"])
    assert x.data_ptr() == np.frombuffer(data, dtype=np.uint8).ctypes.data  # no copy
    y = RawCodec().decode(got.tensors["t1"])
    del got, data
    gc.collect()
    assert torch.equal(x, expected["t0"]) and torch.equal(y, expected["t1"])


def test_raw_copies_bytes_and_misaligned_views() -> None:
    t = torch.arange(6, dtype=torch.float32)
    sent = RawCodec().encode(t)
    assert isinstance(sent.data, bytes)
    x = RawCodec().decode(sent)
    x.add_(1)  # the receiver's copy: the sender's bytes do not change
    assert torch.equal(RawCodec().decode(sent), t)
    raw = bytearray(1 + len(sent.data))
    raw[1:] = sent.data
    odd = EncodedTensor(codec="raw", dtype="float32", shape=(6,), data=memoryview(raw)[1:])
    y = RawCodec().decode(odd)
    assert torch.equal(y, t)
    assert y.data_ptr() % 4 == 0  # a copy, aligned


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_codec_decodes_a_received_buffer_as_its_bytes(name: str) -> None:
    """Received tensors are memoryview slices, at any offset of the buffer: every codec
    decodes them bit for bit as it decodes the sender's bytes."""
    gen = torch.Generator().manual_seed(7)
    codec = make_codec(name)
    # Two tensors: the second starts wherever the first one's packed bytes end.
    tensors = {
        "a": codec.encode(torch.randn(257, generator=gen)),
        "b": codec.encode(torch.randn(3)),
    }
    message = Message(run="r", round=0, phase=0, sender="s", receiver="r", tensors=tensors)
    got = _assemble(list(message_to_wire(message, CHUNK)))
    for key, sent in message.tensors.items():
        received = got.tensors[key]
        assert isinstance(received.data, memoryview)
        a, b = CODECS[name].decode(received), CODECS[name].decode(sent)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.numpy().tobytes() == b.numpy().tobytes()


def test_no_memory_for_the_buffer_is_a_refusal_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedcore.transport.grpc import serde

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    wire = list(message_to_wire(_message([40], seed=0), CHUNK))
    assembler = MessageAssembler(1 << 20)
    assembler.add(wire[0])
    monkeypatch.setattr(serde.np, "empty", no_memory)
    with pytest.raises(MessageTooLargeError, match="no memory for a message of 160 bytes"):
        assembler.add(wire[1])
