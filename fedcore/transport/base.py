"""The transport protocol: how a node sends messages and collects a phase's inbox.

A node is *given* a transport and never builds one, so the same node code runs over
the in-process transport and over gRPC. A transport

* ``send``s a :class:`~fedcore.messages.Message` to ``message.receiver``;
* ``collect``s the messages of one ``(round, phase)`` from a set of expected senders,
  returning when all of them arrived or the timeout passed (whatever arrived by then);
* drops, and counts, messages of a ``(round, phase)`` already collected (late) and
  messages from senders that were not expected (not trusted in-neighbours);
* is closed with ``close()``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from fedcore.messages import Message

__all__ = ["AsyncTransport", "Transport", "TransportStats", "TransportWrapper"]


@dataclass(slots=True)
class TransportStats:
    """Running counters of one endpoint (mutable; read them, do not reset them)."""

    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    messages_late: int = 0
    messages_rejected: int = 0
    messages_dropped: int = 0
    """Messages this endpoint sent that fault injection lost (``[faults]``)."""


class Transport(Protocol):
    """One node's endpoint of a network."""

    node_id: str
    stats: TransportStats

    async def send(self, message: Message) -> None:
        """Deliver ``message`` to ``message.receiver`` (or raise TransportError)."""
        ...

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """Messages of ``(round, phase)`` from ``senders`` that arrived within ``timeout`` s."""
        ...

    async def close(self) -> None:
        """Release resources; later calls raise TransportClosedError."""
        ...


class AsyncTransport(Transport, Protocol):
    """A :class:`Transport` for asynchronous peers, who take what arrived, not a round's
    inbox (every transport of fedcore is one; see :class:`~fedcore.transport.mailbox.Mailbox`
    for what a receiver keeps)."""

    def keep_newest(self) -> None:
        """Keep each sender's newest message only, from now on."""
        ...

    def take(self, senders: Collection[str], phase: int = 0) -> dict[str, Message]:
        """Each of ``senders``' newest message of ``phase`` not taken yet."""
        ...

    async def wait_any(self, timeout: float | None) -> bool:
        """Wait until a message is pending, up to ``timeout`` s; return whether one is."""
        ...


class TransportWrapper:
    """A transport around another (``inner``) that changes how messages are sent and
    passes everything else through: its counters, its inbox, its asynchronous peers'
    methods, its closing. Wrappers override :meth:`send`."""

    def __init__(self, inner: Transport) -> None:
        """Wrap ``inner`` (this node's endpoint); count into its ``stats``."""
        self.inner = inner
        self.node_id = inner.node_id
        self.stats: TransportStats = inner.stats

    async def send(self, message: Message) -> None:
        """Send through ``inner``."""
        await self.inner.send(message)

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """The inner inbox."""
        return await self.inner.collect(round, phase, senders, timeout)

    def _asynchronous(self) -> AsyncTransport:
        if not hasattr(self.inner, "take"):
            raise TypeError(f"{type(self.inner).__name__} cannot serve an asynchronous peer")
        return self.inner  # type: ignore[return-value]

    def keep_newest(self) -> None:
        """Asynchronous peers: the inner transport keeps each sender's newest message."""
        self._asynchronous().keep_newest()

    def take(self, senders: Collection[str], phase: int = 0) -> dict[str, Message]:
        """Asynchronous peers: the inner transport's newest messages of ``phase``."""
        return self._asynchronous().take(senders, phase)

    async def wait_any(self, timeout: float | None) -> bool:
        """Asynchronous peers: wait for a message at the inner transport."""
        return await self._asynchronous().wait_any(timeout)

    async def close(self) -> None:
        """Close the inner transport."""
        await self.inner.close()
