"""Hostile input at scale: 10,000 mutated message streams against a real peer's servicer.

The server is a real `GrpcTransport` whose validator is a real node's (`Node.validate`, as
`fedcore node` wires it). Every call must end with a status code from the protocol's set
(never UNKNOWN, which is what an unhandled exception in the servicer gives), the peer must
keep serving, and whatever it accepted must decode into a finite model-shaped tensor.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.compression import get_codec, make_codec
from fedcore.config import load_config
from fedcore.messages import Message
from fedcore.proto import peer_pb2 as pb
from fedcore.setup.prepare import prepare_run
from fedcore.transport.grpc import GrpcTransport
from fedcore.transport.grpc.serde import header_to_proto, message_to_wire, parse_chunk

pytestmark = pytest.mark.grpc

ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
CODECS = [
    ("raw", {}),
    ("fp16", {}),
    ("qsgd", {"bits": 2, "chunk": 7}),
    ("qsgd", {"bits": 8}),
    ("sign", {}),
    ("sign", {"chunk": 5}),
    ("topk", {"ratio": 0.1}),
    ("randk", {"ratio": 0.1}),
    ("fp8", {"chunk": 4}),
    ("float", {"exp_bits": 3, "man_bits": 2}),
    ("s2fp8", {}),
]


def _setup() -> tuple[object, str, int]:
    config = load_config(
        None, ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=3", "run.rounds=2"]
    )
    setup = prepare_run(config)
    return setup, setup.run_id, setup.start.numel()


def _valid(run: str, numel: int, codec: tuple[str, dict[str, float]], seed: int) -> Message:
    name, options = codec
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
    return Message(
        run=run,
        round=0,
        phase=0,
        sender="n0",
        receiver="n1",
        tensors={"x": make_codec(name, seed=seed, **options).encode(x)},  # type: ignore[arg-type]
    )


def _mutate(chunks: list[bytes], rng: np.random.Generator) -> list[bytes]:
    """One of a dozen damages: bytes flipped, chunks cut, dropped, doubled, reordered,
    random chunks, or a header with fields set to odd values."""
    out = list(chunks)
    kind = int(rng.integers(12))
    i = int(rng.integers(len(out)))
    if kind == 0:  # flip bytes anywhere
        b = bytearray(out[i])
        for _ in range(int(rng.integers(1, 8))):
            if b:
                b[int(rng.integers(len(b)))] ^= int(rng.integers(1, 256))
        out[i] = bytes(b)
    elif kind == 1:
        out[i] = out[i][: int(rng.integers(len(out[i]) + 1))]
    elif kind == 2:
        del out[i]
    elif kind == 3:
        out.insert(i, out[i])
    elif kind == 4:
        rng.shuffle(out)  # type: ignore[arg-type]
    elif kind == 5:
        out.insert(i, rng.bytes(int(rng.integers(0, 64))))
    else:  # a well-formed header with one field set to something odd
        header = parse_chunk(out[0])
        assert isinstance(header, pb.MessageHeader)
        t = header.tensors[0] if header.tensors else None
        if kind == 6 and t is not None:
            t.shape[:] = [int(v) for v in rng.integers(-5, 1 << 40, size=int(rng.integers(0, 3)))]
        elif kind == 7 and t is not None:
            t.codec = str(rng.choice(["raw", "fp16", "qsgd", "sign", "topk", "randk", "zzz", ""]))
        elif kind == 8 and t is not None:
            t.dtype = str(rng.choice(["float32", "float64", "int8", "bfloat16", ""]))
        elif kind == 9 and t is not None:
            key = str(rng.choice(["bits", "norm", "chunk", "k", "seed", "scale", "x"]))
            t.params[key] = float(rng.choice([np.nan, np.inf, -1.0, 0.0, 3.0, 2.0**40, 1e300]))
        elif kind == 10 and t is not None:
            t.nbytes = int(rng.integers(0, 1 << 20))
            header.total_bytes = t.nbytes
        else:
            header.round = int(rng.integers(0, 1 << 62))
            header.scalars["omega"] = float(rng.choice([np.nan, np.inf, 1.0]))
        out[0] = pb.Chunk(header=header).SerializeToString()
    return out


async def _fuzz(streams: list[list[bytes]]) -> tuple[dict[grpc.StatusCode, int], GrpcTransport]:
    setup, run, numel = _setup()
    server = GrpcTransport("n1", listen="127.0.0.1:0", roster={}, run_id=run, trusted={"n0", "n2"})
    node = setup.make_node("n1", server)  # type: ignore[attr-defined]
    server.validator = node.validate
    await server.start()
    codes: dict[grpc.StatusCode, int] = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            push = channel.stream_unary(
                "/fedcore.v1.Peer/Push",
                request_serializer=lambda b: b,
                response_deserializer=pb.Ack.FromString,
            )
            for chunks in streams:
                try:
                    await push(iter(chunks), timeout=10)
                    code = grpc.StatusCode.OK
                except grpc.aio.AioRpcError as err:
                    code = err.code()
                codes[code] = codes.get(code, 0) + 1
            # Still serving: a good message goes through.
            await push(iter(list(message_to_wire(_valid(run, numel, CODECS[0], 1)))), timeout=10)
    finally:
        got = await server.collect(0, 0, {"n0"}, timeout=5)
        await server.close(0.1)
    tensor = get_codec(got["n0"].tensors["x"].codec).decode(got["n0"].tensors["x"])
    assert tensor.shape == (numel,) and bool(torch.isfinite(tensor).all())
    return codes, server


def test_ten_thousand_mutated_streams() -> None:
    _, run, numel = _setup()
    rng = np.random.default_rng(0)
    bases = [list(message_to_wire(_valid(run, numel, c, s))) for s in range(3) for c in CODECS]
    streams = [_mutate(bases[int(rng.integers(len(bases)))], rng) for _ in range(10_000)]
    began = time.monotonic()
    codes, server = asyncio.run(_fuzz(streams))
    assert set(codes) <= ALLOWED | {grpc.StatusCode.OK}, codes
    assert sum(codes.values()) == 10_000
    assert server.stats.messages_rejected == 10_000 - codes.get(grpc.StatusCode.OK, 0)
    assert time.monotonic() - began < 240


@given(
    shape=st.lists(st.integers(-3, 1 << 34), max_size=3),
    params=st.dictionaries(
        st.sampled_from(["bits", "norm", "chunk", "k", "seed", "scale"]),
        st.floats(allow_nan=True, allow_infinity=True),
        max_size=4,
    ),
    codec=st.sampled_from(
        ["raw", "fp16", "bf16", "qsgd", "sign", "topk", "randk", "fp8", "float", "s2fp8", "bogus"]
    ),
    data=st.binary(max_size=256),
)
@settings(max_examples=200, deadline=None)
def test_structured_headers_never_crash_the_validator(
    shape: list[int], params: dict[str, float], codec: str, data: bytes
) -> None:
    """Generated headers straight into the node's validation: always a ProtocolError or a
    finite model-shaped tensor, never another exception."""
    from fedcore.errors import ProtocolError
    from fedcore.messages import EncodedTensor

    setup, run, numel = _setup_cached()
    node = setup.make_node("n1", _NullTransport())  # type: ignore[attr-defined]
    enc = EncodedTensor(codec=codec, dtype="float32", shape=tuple(shape), data=data, params=params)
    message = Message(run=run, round=0, phase=0, sender="n0", receiver="n1", tensors={"x": enc})
    try:
        node.validate(message)
    except ProtocolError:
        return
    tensor = get_codec(codec).decode(enc)
    assert tensor.shape == (numel,) and bool(torch.isfinite(tensor).all())
    _ = header_to_proto(message)


_CACHE: list[tuple[object, str, int]] = []


def _setup_cached() -> tuple[object, str, int]:
    if not _CACHE:
        _CACHE.append(_setup())
    return _CACHE[0]


class _NullTransport:
    node_id = "n1"

    def __init__(self) -> None:
        from fedcore.transport.base import TransportStats

        self.stats = TransportStats()
