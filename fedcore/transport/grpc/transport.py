"""gRPC transport: one ``grpc.aio`` server per node, one channel per out-neighbour.

Receiving: a thin servicer turns each ``Push`` stream back into a message (serde), checks
it (trusted sender, this run, size, then the node's own validator for shapes, dtypes and
finite values), files it in the node's :class:`~fedcore.transport.mailbox.Mailbox`, and
maps every failure to a status code; a rejected message is logged and counted, and the
server keeps serving. Sending: one long-lived channel per out-neighbour, opened with a
handshake (node id, protocol version, run fingerprint) retried with backoff until a
startup deadline; every call has a timeout.

Status codes: ``PERMISSION_DENIED`` sender not a trusted in-neighbour;
``FAILED_PRECONDITION`` another run or protocol version; ``INVALID_ARGUMENT`` a bad
tensor (shape, dtype, non-finite values, truncated data) or a malformed stream;
``RESOURCE_EXHAUSTED`` a message above the size bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedcore.errors import (
    MessageTooLargeError,
    PeerUnavailableError,
    ProtocolError,
    RunMismatchError,
    TransportClosedError,
    TransportError,
    TransportTimeoutError,
    UntrustedPeerError,
)
from fedcore.messages import Message
from fedcore.proto import peer_pb2 as pb
from fedcore.proto import peer_pb2_grpc as pb_grpc
from fedcore.transport.base import TransportStats
from fedcore.transport.grpc.serde import PROTOCOL_VERSION, MessageAssembler, message_to_wire
from fedcore.transport.mailbox import Mailbox

__all__ = ["GRPC_OPTIONS", "GrpcTransport"]

logger = logging.getLogger(__name__)

GRPC_OPTIONS: list[tuple[str, int]] = [
    # Messages travel as 1 MiB chunks, so no single gRPC message needs more than a few MiB;
    # the bound on a whole fedcore message is enforced by the assembler instead.
    ("grpc.max_send_message_length", 8 << 20),
    ("grpc.max_receive_message_length", 8 << 20),
    # Keep long-lived peer channels alive through long local steps (idle proxies and NATs
    # drop silent connections); ping every 20 s, give up after 10 s without an answer.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Servers must accept those pings, or they answer with GOAWAY "too_many_pings".
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
]

_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (UntrustedPeerError, grpc.StatusCode.PERMISSION_DENIED),
    (RunMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (MessageTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ProtocolError, grpc.StatusCode.INVALID_ARGUMENT),
]


def _status_for(exc: Exception) -> grpc.StatusCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INVALID_ARGUMENT


_SERVICE = pb.DESCRIPTOR.services_by_name["Peer"].full_name
_PUSH = f"/{_SERVICE}/Push"


class _PeerServicer:
    """Thin: assemble, check, enqueue, map errors to status codes.

    ``Push`` receives each chunk as its serialized bytes (no request deserializer), so the
    assembler can take data chunks without copying them (see :mod:`serde`).
    """

    def __init__(self, transport: GrpcTransport) -> None:
        self.t = transport

    def _check_peer(self, sender: str, run: str, version: int | None = None) -> None:
        t = self.t
        if sender not in t.trusted:
            raise UntrustedPeerError(f"{sender!r} is not a trusted in-neighbour of {t.node_id!r}.")
        if run != t.run_id:
            raise RunMismatchError(
                f"{sender!r} runs {run[:12]!r}, not this run {t.run_id[:12]!r} (another "
                "config or graph)."
            )
        if version is not None and version != PROTOCOL_VERSION:
            raise RunMismatchError(
                f"{sender!r} speaks protocol version {version}, this peer {PROTOCOL_VERSION}."
            )

    async def Handshake(self, request: pb.Hello, context: Any) -> pb.Welcome:
        try:
            self._check_peer(request.node_id, request.run, request.protocol_version)
        except ProtocolError as exc:
            self.t.stats.messages_rejected += 1
            await context.abort(_status_for(exc), str(exc))
        return pb.Welcome(
            node_id=self.t.node_id, protocol_version=PROTOCOL_VERSION, run=self.t.run_id
        )

    async def Push(self, request_iterator: AsyncIterator[bytes], context: Any) -> pb.Ack:
        t = self.t
        assembler = MessageAssembler(t.max_message_bytes)
        try:
            checked = False
            async for chunk in request_iterator:
                assembler.add(chunk)
                header = assembler.header
                if header is not None and not checked:
                    checked = True
                    self._check_peer(header.sender, header.run)
                    if header.receiver != t.node_id:
                        raise ProtocolError(
                            f"a message for {header.receiver!r} reached {t.node_id!r}."
                        )
            message = assembler.finish()
            if t.validator is not None:
                t.validator(message)
        except ProtocolError as exc:
            t.stats.messages_rejected += 1
            logger.warning("%s: rejected a message: %s", t.node_id, exc)
            await context.abort(_status_for(exc), str(exc))
        t.mailbox.put(message)
        return pb.Ack(received_bytes=message.nbytes)


class GrpcTransport:
    """One node's gRPC endpoint: a server for its in-neighbours, channels to out-neighbours.

    Args:
        node_id: This node.
        listen: ``HOST:PORT`` to serve on (port 0 picks a free one).
        roster: Node id -> ``HOST:PORT`` of every peer this node sends to.
        run_id: Run fingerprint; peers of other runs are refused.
        trusted: Node ids allowed to send here (the in-neighbours, over all rounds).
        validator: Called on every assembled message; raises ProtocolError to reject it.
        max_message_bytes: Bound on one message's tensor bytes.
        call_timeout_s: Timeout of each Push call.
    """

    def __init__(
        self,
        node_id: str,
        *,
        listen: str,
        roster: Mapping[str, str],
        run_id: str,
        trusted: Collection[str],
        validator: Callable[[Message], None] | None = None,
        max_message_bytes: int = 1 << 30,
        call_timeout_s: float = 60.0,
    ) -> None:
        """Configure; nothing opens until :meth:`start`."""
        self.node_id = node_id
        self.listen = listen
        self.roster = dict(roster)
        self.run_id = run_id
        self.trusted = frozenset(trusted)
        self.validator = validator
        self.max_message_bytes = max_message_bytes
        self.call_timeout_s = call_timeout_s
        self.stats = TransportStats()
        self.mailbox = Mailbox(node_id, self.stats)
        self.port: int | None = None
        self._server: Any = None
        self._health: Any = None
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}
        self._push: dict[str, Any] = {}
        self._closed = False

    async def start(self) -> int:
        """Start serving; return the bound port."""
        server = grpc.aio.server(options=GRPC_OPTIONS)
        servicer = _PeerServicer(self)
        handlers = {
            "Handshake": grpc.unary_unary_rpc_method_handler(
                servicer.Handshake,
                request_deserializer=pb.Hello.FromString,
                response_serializer=pb.Welcome.SerializeToString,
            ),
            "Push": grpc.stream_unary_rpc_method_handler(
                servicer.Push, response_serializer=pb.Ack.SerializeToString
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        port: int = server.add_insecure_port(self.listen)
        if port == 0:
            raise PeerUnavailableError(f"node {self.node_id!r} cannot listen on {self.listen}.")
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.port = port
        return port

    async def connect(self, peers: Collection[str], *, timeout_s: float = 60.0) -> None:
        """Open a channel to each peer and handshake, retrying until ``timeout_s``.

        Raises:
            PeerUnavailableError: naming the peers still unreachable at the deadline.
            RunMismatchError / UntrustedPeerError: a peer refused the handshake.
        """
        deadline = time.monotonic() + timeout_s
        pending = sorted(peers)
        for peer in pending:
            if peer not in self.roster:
                raise PeerUnavailableError(f"node {peer!r} is not in the roster.")
            channel = grpc.aio.insecure_channel(self.roster[peer], options=GRPC_OPTIONS)
            self._channels[peer] = channel
            self._stubs[peer] = pb_grpc.PeerStub(channel)  # type: ignore[no-untyped-call]
            # Push sends pre-serialized chunks (serde.message_to_wire): no request serializer.
            self._push[peer] = channel.stream_unary(_PUSH, response_deserializer=pb.Ack.FromString)
        delay = 0.05
        hello = pb.Hello(node_id=self.node_id, protocol_version=PROTOCOL_VERSION, run=self.run_id)
        while pending:
            still: list[str] = []
            for peer in pending:
                try:
                    await self._stubs[peer].Handshake(hello, timeout=2.0)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    if code == grpc.StatusCode.FAILED_PRECONDITION:
                        raise RunMismatchError(f"peer {peer!r} refused: {exc.details()}") from exc
                    if code == grpc.StatusCode.PERMISSION_DENIED:
                        raise UntrustedPeerError(f"peer {peer!r} refused: {exc.details()}") from exc
                    still.append(peer)
            pending = still
            if pending:
                if time.monotonic() > deadline:
                    where = ", ".join(f"{p} at {self.roster[p]}" for p in pending)
                    raise PeerUnavailableError(
                        f"node {self.node_id!r} could not reach {where} within {timeout_s:g} s; "
                        "check that those peers are started and the roster is right."
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def send(self, message: Message) -> None:
        """Stream ``message`` to its receiver."""
        if self._closed:
            raise TransportClosedError(f"node {self.node_id!r}: send after close().")
        push = self._push.get(message.receiver)
        if push is None:
            raise PeerUnavailableError(
                f"node {self.node_id!r} has no channel to {message.receiver!r}."
            )
        try:
            await push(message_to_wire(message), timeout=self.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise PeerUnavailableError(
                    f"{message.receiver!r} is unreachable: {exc.details()}"
                ) from exc
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TransportTimeoutError(
                    f"sending to {message.receiver!r} took over {self.call_timeout_s:g} s."
                ) from exc
            raise TransportError(
                f"{message.receiver!r} refused a message ({code.name}): {exc.details()}"
            ) from exc
        self.stats.messages_sent += 1
        self.stats.bytes_sent += message.nbytes

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """Wait for the ``(round, phase)`` messages of ``senders``, up to ``timeout`` s."""
        if self._closed:
            raise TransportClosedError(f"node {self.node_id!r}: collect after close().")
        return await self.mailbox.collect(round, phase, senders, timeout)

    async def close(self, grace_s: float = 2.0) -> None:
        """Close channels, then stop the server after ``grace_s`` for in-flight calls."""
        if self._closed:
            return
        self._closed = True
        for channel in self._channels.values():
            await channel.close()
        if self._server is not None:
            await self._server.stop(grace_s)
        self.mailbox.clear()
