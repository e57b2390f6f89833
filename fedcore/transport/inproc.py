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

import asyncio
import logging
from collections.abc import Collection

from fedcore.errors import PeerUnavailableError, TransportClosedError
from fedcore.messages import Message
from fedcore.transport.base import TransportStats

__all__ = ["InProcessNetwork", "InProcessTransport"]

logger = logging.getLogger(__name__)

_Key = tuple[int, int]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
    """One node's endpoint of an :class:`InProcessNetwork`.

    Rounds and phases are collected in increasing order, so any message for a
    ``(round, phase)`` at or before the last one collected is late: dropped and counted.
    """

    def __init__(self, node_id: str, network: InProcessNetwork) -> None:
        """Use :meth:`InProcessNetwork.endpoint` rather than calling this directly."""
        self.node_id = node_id
        self.stats = TransportStats()
        self.closed = False
        self._network = network
        self._mailbox: dict[_Key, dict[str, Message]] = {}
        self._last_collected: _Key = (-1, -1)
        self._waiting: tuple[_Key, frozenset[str], asyncio.Future[None]] | None = None

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
        key = (message.round, message.phase)
        if key <= self._last_collected:
            self.stats.messages_late += 1
            logger.debug(
                "%s: late message from %s for %s dropped", self.node_id, message.sender, key
            )
            return
        box = self._mailbox.setdefault(key, {})
        box[message.sender] = message
        waiting = self._waiting
        if (
            waiting is not None
            and waiting[0] == key
            and waiting[1].issubset(box)
            and not waiting[2].done()
        ):
            waiting[2].set_result(None)

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """Wait for the ``(round, phase)`` messages of ``senders``, up to ``timeout`` s."""
        if self.closed:
            raise TransportClosedError(f"node {self.node_id!r}: collect after close().")
        key = (round, phase)
        expected = frozenset(senders)
        box = self._mailbox.setdefault(key, {})
        if not expected.issubset(box):
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiting = (key, expected, future)
            # A plain timer that resolves the future is much cheaper than wait_for.
            timer = loop.call_later(timeout, _resolve, future) if timeout is not None else None
            try:
                await future
            finally:
                self._waiting = None
                if timer is not None:
                    timer.cancel()
        box = self._mailbox.pop(key, {})
        self._last_collected = max(self._last_collected, key)
        inbox: dict[str, Message] = {}
        for sender, message in box.items():
            if sender in expected:
                inbox[sender] = message
                self.stats.messages_received += 1
                self.stats.bytes_received += message.nbytes
            else:
                self.stats.messages_rejected += 1
                logger.warning(
                    "%s: rejected a message from %s, which is not a trusted in-neighbour "
                    "for round %d phase %d",
                    self.node_id,
                    sender,
                    round,
                    phase,
                )
        return inbox

    async def close(self) -> None:
        """Close the endpoint; messages sent to it afterwards fail."""
        self.closed = True
        self._mailbox.clear()
