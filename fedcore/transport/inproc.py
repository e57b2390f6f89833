"""In-process transport: every node of a simulation in one event loop.

:class:`InProcessNetwork` hands out one :class:`InProcessTransport` per node. Sending
puts the message straight into the receiver's mailbox; ``collect`` waits (as an
asyncio future) until every expected sender's message of that ``(round, phase)`` is
there. Messages are already encoded by the sending node's codec and are decoded by the
receiving node, so the in-process path exercises the same encode/decode code as a real
wire. With ``record=True`` the network keeps every delivered message, in order, for
tests (see :mod:`fedcore.testing`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from fedcore.errors import PeerUnavailableError, TransportClosedError
from fedcore.messages import Message
from fedcore.transport.base import TransportStats
from fedcore.transport.mailbox import Mailbox

__all__ = ["InProcessNetwork", "InProcessTransport"]

logger = logging.getLogger(__name__)


class InProcessNetwork:
    """A set of in-process endpoints that can reach each other by node id."""

    def __init__(self, *, record: bool = False) -> None:
        """Create an empty network; ``record`` keeps every delivered message."""
        self._endpoints: dict[str, InProcessTransport] = {}
        self.record = record
        self.messages: list[Message] = []

    def endpoint(self, node_id: str) -> InProcessTransport:
        """Return the endpoint of ``node_id``, creating it on first use."""
        if node_id not in self._endpoints:
            self._endpoints[node_id] = InProcessTransport(node_id, self)
        return self._endpoints[node_id]


class InProcessTransport:
    """One node's endpoint of an :class:`InProcessNetwork` (receiving via a :class:`Mailbox`)."""

    def __init__(self, node_id: str, network: InProcessNetwork) -> None:
        """Use :meth:`InProcessNetwork.endpoint` rather than calling this directly."""
        self.node_id = node_id
        self.stats = TransportStats()
        self.closed = False
        self._network = network
        self._mailbox = Mailbox(node_id, self.stats)

    async def send(self, message: Message) -> None:
        """Put ``message`` into the receiver's mailbox."""
        if self.closed:
            raise TransportClosedError(f"node {self.node_id!r}: send after close().")
        network = self._network
        target = network._endpoints.get(message.receiver)
        if target is None or target.closed:
            raise PeerUnavailableError(
                f"node {message.sender!r} cannot reach {message.receiver!r}: no such "
                "in-process endpoint is open."
            )
        if network.record:
            network.messages.append(message)
        target._receive(message)
        self.stats.messages_sent += 1
        self.stats.bytes_sent += message.nbytes

    def _receive(self, message: Message) -> None:
        self._mailbox.put(message)

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """Wait for the ``(round, phase)`` messages of ``senders``, up to ``timeout`` s."""
        if self.closed:
            raise TransportClosedError(f"node {self.node_id!r}: collect after close().")
        return await self._mailbox.collect(round, phase, senders, timeout)

    def keep_newest(self) -> None:
        """Asynchronous peers: keep each sender's newest message (see
        :class:`~fedcore.transport.mailbox.Mailbox`)."""
        self._mailbox.keep_newest()

    def take(self, senders: Collection[str], phase: int = 0) -> dict[str, Message]:
        """Asynchronous peers: each of ``senders``' newest message of ``phase`` not taken
        yet."""
        return self._mailbox.take(senders, phase)

    async def wait_any(self, timeout: float | None) -> bool:
        """Asynchronous peers: wait until a message is pending (up to ``timeout`` s)."""
        return await self._mailbox.wait_any(timeout)

    async def close(self) -> None:
        """Close the endpoint; messages sent to it afterwards fail."""
        self.closed = True
        self._mailbox.clear()
