"""gRPC transport: one ``grpc.aio`` server per node, one channel per out-neighbour.

Receiving: a thin servicer turns each ``Push`` stream back into a message (serde), checks
it (trusted sender, this run, size, then the node's own validator for shapes, dtypes and
finite values), files it in the node's :class:`~fedcore.transport.mailbox.Mailbox`, and
maps every failure to a status code; a rejected message is logged and counted, and the
server keeps serving. Sending: one long-lived channel per out-neighbour, opened with a
handshake (node id, protocol version, run fingerprint) retried with backoff until a
startup deadline; every call has a timeout.

With ``tls`` (:class:`~fedcore.certs.TlsFiles`) every channel is mutual TLS: the server
accepts only clients whose certificate the deployment's CA signed, the client checks that
the server's certificate names the peer it meant to reach (the node id as the TLS target
name, whatever address the roster gives), and a sender's identity is the node id its
certificate names; a message or handshake that claims another id is refused. The trust
graph is enforced on that identity.

Status codes: ``PERMISSION_DENIED`` sender not a trusted in-neighbour, or not the node its
certificate names; ``UNAUTHENTICATED`` no certificate identity (TLS on);
``FAILED_PRECONDITION`` another run or protocol version, or a round further ahead than the
receiver's round window; ``INVALID_ARGUMENT`` bytes that are no message, a phase or
content the algorithm does not send, a bad tensor (shape, dtype, non-finite values,
truncated data), an impossible scalar; ``RESOURCE_EXHAUSTED`` a message above the size
bound, or a sender with ``max_streams_per_sender`` streams already open;
``DEADLINE_EXCEEDED`` a stream that waited more than ``chunk_timeout_s`` for its header or
any next chunk, or took longer in all than its size allows at ``min_rate_bytes_s``. Every
refusal is counted (``stats.messages_rejected``) and logged at most once per kind every
10 s, each value in the line cut short. A sender whose message is refused gets
:class:`~fedcore.errors.MessageRefusedError`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from fedcore.certs import TlsFiles
from fedcore.errors import (
    MessageRefusedError,
    MessageTooLargeError,
    OutOfWindowError,
    PeerUnavailableError,
    ProtocolError,
    RunMismatchError,
    StalledStreamError,
    TooManyStreamsError,
    TransportClosedError,
    TransportTimeoutError,
    UntrustedPeerError,
)
from fedcore.ids import clip, shorten
from fedcore.messages import Message
from fedcore.proto import peer_pb2 as pb
from fedcore.proto import peer_pb2_grpc as pb_grpc
from fedcore.transport.base import TransportStats
from fedcore.transport.grpc.channel import GRPC_OPTIONS, open_channel
from fedcore.transport.grpc.serde import PROTOCOL_VERSION, MessageAssembler, message_to_wire
from fedcore.transport.mailbox import Mailbox

__all__ = ["GrpcTransport"]

logger = logging.getLogger(__name__)


class UnauthenticatedPeerError(UntrustedPeerError):
    """TLS is on and the caller's certificate names no node id."""


def _certificate_ids(context: Any) -> list[str]:
    """The node ids of the caller's verified certificate: its DNS subject alternative names
    (``peer_dns``; not URI, e-mail or IP names, which ``certs init`` never writes)."""
    values = context.auth_context().get("peer_dns", [])
    return [v.decode("ascii", "replace") if isinstance(v, bytes) else str(v) for v in values]


_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (UnauthenticatedPeerError, grpc.StatusCode.UNAUTHENTICATED),
    (UntrustedPeerError, grpc.StatusCode.PERMISSION_DENIED),
    (RunMismatchError, grpc.StatusCode.FAILED_PRECONDITION),
    (OutOfWindowError, grpc.StatusCode.FAILED_PRECONDITION),
    (MessageTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StalledStreamError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ProtocolError, grpc.StatusCode.INVALID_ARGUMENT),
]


def _status_for(exc: Exception) -> grpc.StatusCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INVALID_ARGUMENT


_LOG_CHARS = 300
"""Longest rejection text in a log line."""

_SERVICE = pb.DESCRIPTOR.services_by_name["Peer"].full_name
_PUSH = f"/{_SERVICE}/Push"


class _RejectionLog:
    """Logs rejections, at most one line per kind of error every ``every_s`` seconds.

    A stranger flooding a peer with calls must not flood its log (or disk) too: the rest of
    a burst is counted and reported with the next line of that kind.
    """

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, node_id: str, what: str, exc: Exception, *, internal: bool = False) -> None:
        """Log ``exc`` unless one of its kind was logged less than ``every_s`` ago
        (``internal``: a bug of ours, logged with its traceback)."""
        kind = f"{what}/{type(exc).__name__}"
        now = time.monotonic()
        if now - self._last.get(kind, -math.inf) < self.every_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        more = f" (and {held} more like it in the last {self.every_s:g} s)" if held else ""
        # A stranger's values must not make the line long.
        text = shorten(str(exc), _LOG_CHARS)
        logger.warning("%s: %s: %s%s", node_id, what, text, more, exc_info=internal)


class _PeerServicer:
    """Thin: assemble, check, enqueue, map errors to status codes.

    ``Push`` receives each chunk as its serialized bytes (no request deserializer), so the
    assembler can take data chunks without copying them (see :mod:`serde`).
    """

    def __init__(self, transport: GrpcTransport) -> None:
        self.t = transport

    def _check_peer(self, context: Any, sender: str, run: str, version: int | None = None) -> None:
        t = self.t
        if t.tls is not None:
            names = _certificate_ids(context)
            if not names:
                raise UnauthenticatedPeerError(
                    f"a client without a certificate identity claimed to be {clip(sender)}."
                )
            if sender not in names:
                named = shorten(", ".join(names), 80)
                raise UntrustedPeerError(
                    f"a client whose certificate names {named} claimed to be {clip(sender)}."
                )
        if sender not in t.trusted:
            raise UntrustedPeerError(
                f"{clip(sender)} is not a trusted in-neighbour of {t.node_id!r}."
            )
        if run != t.run_id:
            raise RunMismatchError(
                f"{sender!r} runs {clip(run[:12])}, not this run {t.run_id[:12]!r} (another "
                "config or graph)."
            )
        if version is not None and version != PROTOCOL_VERSION:
            raise RunMismatchError(
                f"{sender!r} speaks protocol version {version}, this peer {PROTOCOL_VERSION}."
            )

    def _refuse(self, what: str, exc: Exception) -> grpc.StatusCode:
        """Count and log a refusal; the status code to answer with."""
        t = self.t
        t.stats.messages_rejected += 1
        internal = not isinstance(exc, ProtocolError)
        t.rejections.log(t.node_id, what, exc, internal=internal)
        return grpc.StatusCode.INTERNAL if internal else _status_for(exc)

    async def Handshake(self, request: bytes, context: Any) -> pb.Welcome:
        # Raw bytes (no request deserializer): bytes that are no Hello get INVALID_ARGUMENT
        # here, instead of UNKNOWN and a traceback from inside gRPC.
        try:
            try:
                hello = pb.Hello.FromString(request)
            except Exception as exc:  # protobuf raises its own DecodeError
                raise ProtocolError(
                    f"a handshake is not a valid Hello: {shorten(str(exc), 80)}."
                ) from exc
            self._check_peer(context, hello.node_id, hello.run, hello.protocol_version)
        except Exception as exc:
            code = self._refuse("refused a handshake", exc)
            await context.abort(code, shorten(str(exc), _LOG_CHARS))
        self.t.mailbox.hello(hello.node_id)
        return pb.Welcome(
            node_id=self.t.node_id, protocol_version=PROTOCOL_VERSION, run=self.t.run_id
        )

    async def Push(self, request_iterator: AsyncIterator[bytes], context: Any) -> pb.Ack:
        t = self.t
        assembler = MessageAssembler(t.max_message_bytes)
        sender: str | None = None  # set once its stream is counted
        try:
            chunks = request_iterator.__aiter__()
            loop = asyncio.get_running_loop()
            began = loop.time()
            give_up: float | None = None  # once the header told the size
            try:
                # One timer for the stream, moved at each chunk: no task per chunk (as
                # asyncio.wait_for would start), no extra turn of the event loop.
                async with asyncio.timeout(None) as deadline:
                    while True:
                        wait = t.chunk_timeout_s
                        if give_up is not None:
                            wait = min(wait, give_up - loop.time())
                        if wait <= 0:
                            raise TimeoutError
                        deadline.reschedule(loop.time() + wait)
                        try:
                            chunk = await chunks.__anext__()
                        except StopAsyncIteration:
                            break
                        assembler.add(chunk)
                        header = assembler.header
                        if header is not None and sender is None:
                            self._check_peer(context, header.sender, header.run)
                            if header.receiver != t.node_id:
                                raise ProtocolError(
                                    f"a message for {clip(header.receiver)} reached {t.node_id!r}."
                                )
                            if t.open_streams.get(header.sender, 0) >= t.max_streams_per_sender:
                                raise TooManyStreamsError(
                                    f"{header.sender!r} already has {t.max_streams_per_sender} "
                                    "message streams open here (transport.max_streams_per_sender)."
                                )
                            sender = header.sender
                            t.open_streams[sender] = t.open_streams.get(sender, 0) + 1
                            give_up = (
                                began + t.chunk_timeout_s + header.total_bytes / t.min_rate_bytes_s
                            )
            except TimeoutError:
                raise StalledStreamError(
                    f"a message stream from {clip(sender or 'a client not yet known')} "
                    f"stalled: no chunk for {t.chunk_timeout_s:g} s, or slower in all than "
                    f"{t.min_rate_bytes_s / (1 << 20):g} MiB/s (transport.chunk_timeout_s, "
                    "transport.min_rate_mb_s)."
                ) from None
            message = assembler.finish()
            if t.validator is not None:
                t.validator(message)
        except Exception as exc:
            code = self._refuse("rejected a message", exc)
            await context.abort(code, shorten(str(exc), _LOG_CHARS))
        finally:
            if sender is not None:
                t.open_streams[sender] -= 1
        t.mailbox.put(message)
        return pb.Ack(received_bytes=message.nbytes)


def _health_handlers(health_servicer: Any, peer: _PeerServicer) -> Any:
    """The standard health service, parsing its requests itself: bytes that are no
    ``HealthCheckRequest`` get ``INVALID_ARGUMENT`` (counted, logged within the rate limit),
    not ``UNKNOWN`` and a traceback from inside gRPC."""

    async def parse(request: bytes, context: Any) -> Any:
        try:
            return health_pb2.HealthCheckRequest.FromString(request)
        except Exception as exc:  # protobuf raises its own DecodeError
            bad = ProtocolError(f"a health check is not a valid request: {shorten(str(exc), 80)}.")
            code = peer._refuse("refused a health check", bad)
            await context.abort(code, str(bad))

    async def check(request: bytes, context: Any) -> Any:
        return await health_servicer.Check(await parse(request, context), context)

    async def watch(request: bytes, context: Any) -> None:
        await health_servicer.Watch(await parse(request, context), context)

    response = health_pb2.HealthCheckResponse.SerializeToString
    return grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health",
        {
            "Check": grpc.unary_unary_rpc_method_handler(check, response_serializer=response),
            "Watch": grpc.unary_stream_rpc_method_handler(watch, response_serializer=response),
        },
    )


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
        tls: This node's CA, certificate and key: mutual TLS on every channel. None:
            plaintext, and a sender is whoever its messages say.
        startup_timeout_s: How long a peer that said hello may take to send its first
            message before it counts as missing (peers start at different times).
        chunk_timeout_s: Longest wait for a stream's header or its next chunk.
        min_rate_bytes_s: Slowest transfer waited for: a message of ``S`` bytes may take
            ``chunk_timeout_s + S / min_rate_bytes_s`` seconds in all.
        max_streams_per_sender: Message streams one sender may have open at once.
        skip_ahead: Do not wait for a sender that already delivered a later round
            (deadline mode; see :class:`~fedcore.transport.mailbox.Mailbox`).
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
        tls: TlsFiles | None = None,
        startup_timeout_s: float = 60.0,
        chunk_timeout_s: float = 10.0,
        min_rate_bytes_s: float = float(1 << 20),
        max_streams_per_sender: int = 4,
        skip_ahead: bool = True,
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
        self.tls = tls
        self.stats = TransportStats()
        self.chunk_timeout_s = chunk_timeout_s
        self.min_rate_bytes_s = min_rate_bytes_s
        self.max_streams_per_sender = max_streams_per_sender
        self.open_streams: dict[str, int] = {}
        self.rejections = _RejectionLog()
        self.mailbox = Mailbox(
            node_id, self.stats, startup_timeout_s=startup_timeout_s, skip_ahead=skip_ahead
        )
        self.port: int | None = None
        self._server: Any = None
        self._health: Any = None
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}
        self._push: dict[str, Any] = {}
        self._closed = False
        # The out-neighbours connect() has not had a handshake with yet (for progress lines).
        self.connecting: tuple[str, ...] = ()

    async def start(self) -> int:
        """Start serving; return the bound port."""
        server = grpc.aio.server(options=GRPC_OPTIONS)
        servicer = _PeerServicer(self)
        handlers = {
            "Handshake": grpc.unary_unary_rpc_method_handler(
                servicer.Handshake, response_serializer=pb.Welcome.SerializeToString
            ),
            "Push": grpc.stream_unary_rpc_method_handler(
                servicer.Push, response_serializer=pb.Ack.SerializeToString
            ),
        }
        self._health = health.aio.HealthServicer()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(_SERVICE, handlers),
                _health_handlers(self._health, servicer),
            )
        )
        try:
            if self.tls is None:
                port: int = server.add_insecure_port(self.listen)
            else:
                credentials = grpc.ssl_server_credentials(
                    [(self.tls.key, self.tls.cert)],
                    root_certificates=self.tls.ca,
                    require_client_auth=True,
                )
                port = server.add_secure_port(self.listen, credentials)
        except RuntimeError:  # newer grpcio raises "Failed to bind" instead of returning 0
            port = 0
        if port == 0:
            raise PeerUnavailableError(
                f"node {self.node_id!r} cannot listen on {self.listen}: the port is in use, or "
                "the address is not one of this machine's. Stop what holds the port, or give "
                "another HOST:PORT (--listen, or the roster)."
            )
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self.port = port
        return port

    async def connect(
        self,
        peers: Collection[str],
        *,
        timeout_s: float = 60.0,
        required: bool = True,
        together: bool = False,
    ) -> list[str]:
        """Open a channel to each peer and handshake, retrying until ``timeout_s``.

        With ``required`` false (deadline mode) the peers still unreachable at the deadline
        (down, or failing the TLS handshake) are logged and returned instead: their channels
        stay open and reconnect by themselves, and sends to them fail until they answer.
        Then, and with ``together`` (asynchronous peers, which no round holds back), it also
        waits, within the same ``timeout_s``, until every trusted in-neighbour has said
        hello (or sent), so that peers start together: no peer starts (or finishes and
        stops) before the peers that send to it have reached it.

        Raises:
            PeerUnavailableError: naming the peers still unreachable at the deadline.
            RunMismatchError / UntrustedPeerError: a peer refused the handshake.
        """
        deadline = time.monotonic() + timeout_s
        pending = sorted(peers)
        for peer in pending:
            if peer not in self.roster:
                raise PeerUnavailableError(f"node {peer!r} is not in the roster.")
            channel = self._channel(peer)
            self._channels[peer] = channel
            self._stubs[peer] = pb_grpc.PeerStub(channel)  # type: ignore[no-untyped-call]
            # Push sends pre-serialized chunks (serde.message_to_wire): no request serializer.
            self._push[peer] = channel.stream_unary(_PUSH, response_deserializer=pb.Ack.FromString)
        delay = 0.05
        hello = pb.Hello(node_id=self.node_id, protocol_version=PROTOCOL_VERSION, run=self.run_id)
        why: dict[str, str] = {}
        while pending:
            self.connecting = tuple(pending)
            still: list[str] = []
            for peer in pending:
                try:
                    await self._stubs[peer].Handshake(hello, timeout=2.0)
                except grpc.aio.AioRpcError as exc:
                    code = exc.code()
                    if code == grpc.StatusCode.FAILED_PRECONDITION:
                        raise RunMismatchError(f"peer {peer!r} refused: {exc.details()}") from exc
                    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                        raise UntrustedPeerError(f"peer {peer!r} refused: {exc.details()}") from exc
                    why[peer] = exc.details() or code.name
                    still.append(peer)
            pending = still
            self.connecting = tuple(pending)
            if pending:
                if time.monotonic() > deadline:
                    where = "; ".join(f"{p} at {self.roster[p]} ({why[p]})" for p in pending)
                    if not required:
                        logger.warning(
                            "%s: no handshake with %s within %g s; going on without them",
                            self.node_id,
                            where,
                            timeout_s,
                        )
                        return pending
                    raise PeerUnavailableError(
                        f"node {self.node_id!r} could not reach {where} within {timeout_s:g} s; "
                        "check that those peers are started, the roster is right and, with "
                        "TLS, that every peer's certificate comes from the same CA."
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        if together or not required:
            # Start only when the in-neighbours are up too (said hello, or already sent), or
            # the time is up; otherwise a peer that starts later than this one misses its
            # first deadlines (deadline mode), or finds it gone (asynchronous peers).
            silent = await self.mailbox.await_greetings(
                self.trusted, max(0.0, deadline - time.monotonic())
            )
            if silent:
                logger.warning(
                    "%s: %s did not connect within %g s; going on without waiting for them",
                    self.node_id,
                    ", ".join(silent),
                    timeout_s,
                )
        return []

    def _channel(self, peer: str) -> Any:
        return open_channel(self.roster[peer], self.tls, peer)

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
            raise MessageRefusedError(
                f"{message.receiver!r} refused the message of round {message.round} phase "
                f"{message.phase} ({code.name}): {exc.details()}"
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

    def keep_newest(self) -> None:
        """Asynchronous peers: keep each sender's newest message (see
        :class:`~fedcore.transport.mailbox.Mailbox`)."""
        self.mailbox.keep_newest()

    def take(self, senders: Collection[str], phase: int = 0) -> dict[str, Message]:
        """Asynchronous peers: each of ``senders``' newest message of ``phase`` not taken
        yet."""
        return self.mailbox.take(senders, phase)

    async def wait_any(self, timeout: float | None) -> bool:
        """Asynchronous peers: wait until a message is pending (up to ``timeout`` s)."""
        return await self.mailbox.wait_any(timeout)

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
