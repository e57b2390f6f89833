"""Message <-> protobuf, in symmetric pairs: the only module that knows both.

A message travels as one client stream of :class:`Chunk`: a header chunk, then the
tensors' packed bytes in header order, in data chunks of at most ``chunk_bytes``.
:class:`MessageAssembler` rebuilds the message on the receiving side, bounding the size
it accepts before it allocates anything, and checking that exactly the announced bytes
arrived.

The hot path writes and reads data chunks as protobuf wire bytes directly
(:func:`message_to_wire`, :func:`parse_chunk`): a data chunk is the tag of field 2, a varint
length and the bytes, which every protobuf library reads as a ``Chunk``. Copies per byte,
beside gRPC's own buffers:

* sending, one: the tag, length and a slice of the tensor joined into the chunk's ``bytes``
  (grpcio's ``SendMessageOperation`` takes ``bytes`` only, not a ``memoryview``, so this
  copy is the least a chunk can cost; nothing is serialized twice or concatenated);
* receiving, one: each chunk copied, on arrival, into one buffer preallocated from the
  header's ``total_bytes``; the tensors are ``memoryview`` slices of it, and the ``raw``
  codec decodes them in place (``np.frombuffer``, no copy).

Going through the generated classes instead costs three copies a side (slice, field,
serialize; parse, field, join) plus page faults on fresh buffers, which measured 2-3x
slower at 64 MiB. :func:`message_to_chunks` keeps the generated-class form for tools and tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from fedcore.errors import MessageTooLargeError, ProtocolError
from fedcore.messages import EncodedTensor, Message
from fedcore.proto import peer_pb2 as pb

__all__ = [
    "CHUNK_BYTES",
    "MAX_FIELDS",
    "MAX_NAME",
    "PROTOCOL_VERSION",
    "MessageAssembler",
    "header_to_proto",
    "message_to_chunks",
    "message_to_wire",
    "parse_chunk",
]

PROTOCOL_VERSION = 1
MAX_FIELDS = 16
"""Most tensors (and most scalars) a message header may list."""
MAX_NAME = 64
"""Longest tensor or scalar name."""
CHUNK_BYTES = 1 << 20
"""1 MiB: measured fastest on loopback against 64 KiB, 256 KiB and 4 MiB (lessons.md)."""


def header_to_proto(message: Message) -> pb.MessageHeader:
    """The header of ``message``: addressing, scalars, and each tensor's metadata."""
    tensors = [
        pb.TensorHeader(
            name=name,
            codec=t.codec,
            dtype=t.dtype,
            shape=list(t.shape),
            nbytes=len(t.data),
            params=dict(t.params),
        )
        for name, t in message.tensors.items()
    ]
    return pb.MessageHeader(
        run=message.run,
        round=message.round,
        phase=message.phase,
        sender=message.sender,
        receiver=message.receiver,
        tensors=tensors,
        scalars=dict(message.scalars),
        total_bytes=sum(len(t.data) for t in message.tensors.values()),
    )


def message_to_chunks(message: Message, chunk_bytes: int = CHUNK_BYTES) -> Iterator[pb.Chunk]:
    """The stream that carries ``message``: header first, then data chunks."""
    yield pb.Chunk(header=header_to_proto(message))
    for tensor in message.tensors.values():
        view = memoryview(tensor.data)
        for start in range(0, len(view), chunk_bytes):
            yield pb.Chunk(data=bytes(view[start : start + chunk_bytes]))


_DATA_TAG = b"\x12"  # field 2 ("data"), wire type 2 (length-delimited)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def message_to_wire(message: Message, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The same stream as :func:`message_to_chunks`, already serialized (one copy a byte)."""
    yield pb.Chunk(header=header_to_proto(message)).SerializeToString()
    for tensor in message.tensors.values():
        view = memoryview(tensor.data)
        for start in range(0, len(view), chunk_bytes):
            piece = view[start : start + chunk_bytes]
            yield b"".join((_DATA_TAG, _varint(len(piece)), piece))


def parse_chunk(raw: bytes) -> pb.MessageHeader | memoryview:
    """A serialized ``Chunk``: its header, or a view of its data (no copy).

    Raises:
        ProtocolError: bytes that are not a ``Chunk``, or an empty one.
    """
    if raw[:1] == _DATA_TAG:
        length, shift, pos = 0, 0, 1
        while pos < len(raw) and pos < 11:
            byte = raw[pos]
            length |= (byte & 0x7F) << shift
            pos += 1
            if not byte & 0x80:
                if pos + length == len(raw):
                    return memoryview(raw)[pos:]
                break
            shift += 7
    try:
        chunk = pb.Chunk.FromString(raw)
    except Exception as exc:  # protobuf raises its own DecodeError
        raise ProtocolError(f"a chunk is not a valid protobuf Chunk: {exc}.") from exc
    kind = chunk.WhichOneof("kind")
    if kind == "header":
        header: pb.MessageHeader = chunk.header
        return header
    if kind == "data":
        return memoryview(chunk.data)
    raise ProtocolError("a message stream carried an empty chunk.")


class MessageAssembler:
    """Rebuilds one message from its chunk stream, into one buffer.

    The buffer is allocated once, uninitialised, at the first data chunk (after the
    header's bounds and the servicer's sender checks passed), sized from the header's
    ``total_bytes``; each chunk is copied into it on arrival, while it is still in cache,
    and dropped. The message's tensors are slices of that buffer (``EncodedTensor.data`` a
    ``memoryview``): no ``bytes`` is built per tensor, and the ``raw`` codec decodes them
    without a copy.

    Args:
        limit_bytes: Largest total tensor payload accepted.
    """

    def __init__(self, limit_bytes: int) -> None:
        """Wait for the header."""
        self.limit_bytes = limit_bytes
        self.header: pb.MessageHeader | None = None
        self._total = 0
        self._filled = 0
        self._buffer: memoryview | None = None

    def add(self, chunk: pb.Chunk | bytes) -> None:
        """Take the next chunk (a generated ``Chunk`` or its serialized bytes).

        Raises:
            ProtocolError: a second header, data before the header, more data than
                announced, or bytes that are no ``Chunk``.
            MessageTooLargeError: the header announces more than ``limit_bytes``.
        """
        if isinstance(chunk, bytes):
            part = parse_chunk(chunk)
        else:
            kind = chunk.WhichOneof("kind")
            if kind is None:
                raise ProtocolError("a message stream carried an empty chunk.")
            part = chunk.header if kind == "header" else memoryview(chunk.data)
        if isinstance(part, pb.MessageHeader):
            if self.header is not None:
                raise ProtocolError("a message stream carried a second header.")
            self._start(part)
            return
        if self.header is None:
            raise ProtocolError("a message stream carried data before its header.")
        start = self._filled
        end = start + len(part)
        if end > self._total:
            raise ProtocolError(
                f"a message stream carried more than the {self._total} bytes its header announced."
            )
        buffer = self._buffer
        if buffer is None:
            # Uninitialised (no zero-fill pass): every byte is written before finish()
            # accepts the message. Within the bound that _start checked; pages become
            # resident only as chunks fill them.
            try:
                buffer = self._buffer = np.empty(self._total, dtype=np.uint8).data
            except MemoryError:
                raise MessageTooLargeError(
                    f"no memory for a message of {self._total} bytes on this peer now."
                ) from None
        buffer[start:end] = part  # one memcpy
        self._filled = end

    def _start(self, header: pb.MessageHeader) -> None:
        names = [t.name for t in header.tensors]
        if len(names) > MAX_FIELDS or len(header.scalars) > MAX_FIELDS:
            raise ProtocolError(
                f"a message header lists {len(names)} tensors and {len(header.scalars)} "
                f"scalars; no algorithm sends more than {MAX_FIELDS} of either."
            )
        for name in [*names, *header.scalars]:
            if not 0 < len(name) <= MAX_NAME:
                raise ProtocolError(
                    f"a message header has a tensor or scalar name of {len(name)} characters "
                    f"(names have 1 to {MAX_NAME})."
                )
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ProtocolError(f"a message header lists the tensor {twice[0]!r} twice.")
        announced = sum(t.nbytes for t in header.tensors)
        if announced != header.total_bytes:
            raise ProtocolError(
                f"the header announces {header.total_bytes} bytes but its tensors add up to "
                f"{announced}."
            )
        if announced > self.limit_bytes:
            raise MessageTooLargeError(
                f"a message of {announced} bytes exceeds this peer's limit of "
                f"{self.limit_bytes} bytes (transport.max_message_mb)."
            )
        self.header = header
        self._total = announced

    def finish(self) -> Message:
        """The message, once every announced byte arrived.

        Its tensors' ``data`` are ``memoryview`` slices of the receive buffer, which only
        this message holds.

        Raises:
            ProtocolError: no header, or fewer bytes than announced (a truncated stream).
        """
        header = self.header
        if header is None:
            raise ProtocolError("a message stream ended before its header.")
        if self._filled != self._total:
            raise ProtocolError(
                f"a message stream ended after {self._filled} of {self._total} "
                "announced bytes (truncated)."
            )
        buffer = self._buffer if self._buffer is not None else memoryview(b"")
        tensors: dict[str, EncodedTensor] = {}
        offset = 0
        for t in header.tensors:
            # A tensor is its byte range of the stream, however the sender cut the chunks.
            tensors[t.name] = EncodedTensor(
                codec=t.codec,
                dtype=t.dtype,
                shape=tuple(t.shape),
                data=buffer[offset : offset + t.nbytes],
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
            nbytes=self._total + 8 * len(header.scalars),
        )
