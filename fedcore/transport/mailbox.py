"""The receive side every transport shares: per-(round, phase) inboxes and waiting.

A transport puts each arriving message into the :class:`Mailbox` of its node; the node's
``collect`` waits there until every expected sender of a ``(round, phase)`` arrived or a
timeout passed. Rounds and phases are collected in increasing order, so a message for a
``(round, phase)`` at or before the last one collected is late: dropped and counted.
Messages from senders that were not expected are dropped and counted as rejected. A
sender that already delivered a later ``(round, phase)`` is not waited for: senders
deliver in order, so its message for this one is gone (a peer restarted from a checkpoint
catches up this way instead of waiting out a deadline per missed round).

The other side of that: a sender whose message came late is alive but behind (it started
later, was restarted, or its rounds take a little longer than the deadline because it waits
out a dead neighbour of its own). For ten timeouts after a late message, when the timeout
passes without that sender's message, the node waits up to one more timeout for it (for it
alone), so that the two fall into step instead of missing each other's messages for the
rest of the run. A message that arrives in that extra time counts as late for this rule, so
a sender whose rounds are always a little longer than the deadline keeps being waited for.
A sender whose messages are lost, not late, is not waited for. So a collect waits at most
twice its timeout, except at the start: a sender that has said hello
(:meth:`Mailbox.hello`, the gRPC handshake) but not sent its first message yet is still
starting (building its data and model, connecting to its own peers), and is waited for
until ``startup_timeout_s`` after its hello (once: a peer that said hello and went silent
is then treated like any other). Peers on several hosts never start at the same moment;
without this their first rounds would miss each other.

Only deadline mode skips a sender that delivered a later round (``skip_ahead``): in strict
mode every sender delivers every round, so a later message first can only be hostile,
and the node waits for the one it needs instead. How far ahead a message may be at all is
the node's round window (:meth:`fedcore.node.Node.round_window`), checked before a message
is filed, so one message mutes its sender for at most that many rounds.

Asynchronous peers (:meth:`Mailbox.keep_newest`) have no rounds to collect: a message's
``round`` is its sender's own count of the messages it sent, and the mailbox keeps each
sender's newest message of each phase only (:meth:`Mailbox.take` hands them over,
:meth:`Mailbox.wait_any` waits for one). A message no newer than one already kept or
taken is stale: dropped and counted late; one replaced before it was taken counts late
too. So whatever a sender floods, a receiver holds at most one message of each phase of
each of its in-neighbours.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Collection

from fedcore.messages import Message
from fedcore.transport.base import TransportStats

__all__ = ["Mailbox"]

logger = logging.getLogger(__name__)

_Key = tuple[int, int]
_LATE_MEMORY = 10
"""A sender late within this many timeouts is waited for twice as long."""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Mailbox:
    """One node's pending messages, keyed by ``(round, phase)`` and sender."""

    def __init__(
        self,
        node_id: str,
        stats: TransportStats,
        *,
        startup_timeout_s: float = 60.0,
        skip_ahead: bool = True,
    ) -> None:
        """Count into ``stats`` (the owning transport's counters)."""
        self.node_id = node_id
        self.stats = stats
        self.startup_timeout_s = startup_timeout_s
        self.skip_ahead = skip_ahead
        self._hello_at: dict[str, float] = {}  # said hello (when), no message yet
        self._boxes: dict[_Key, dict[str, Message]] = {}
        self._latest: dict[str, _Key] = {}  # newest (round, phase) each sender delivered
        self._last_collected: _Key = (-1, -1)
        self._late_at: dict[str, float] = {}  # when a sender's last message came late
        self._waiting: tuple[_Key, frozenset[str], asyncio.Future[None]] | None = None
        # Asynchronous peers: each sender's newest message, and the newest round taken.
        self._newest: dict[tuple[str, int], Message] | None = None  # by (sender, phase)
        self._taken: dict[tuple[str, int], int] = {}
        self._any: asyncio.Future[None] | None = None

    def keep_newest(self) -> None:
        """Switch to the asynchronous peers' mode (see the module docstring)."""
        self._newest = {}

    def hello(self, sender: str) -> None:
        """``sender`` is up and about to start its rounds (it has not sent anything yet)."""
        if sender not in self._latest:
            self._hello_at[sender] = time.monotonic()

    async def await_greetings(self, senders: Collection[str], timeout: float) -> list[str]:
        """Wait until every one of ``senders`` said hello or sent something, up to
        ``timeout`` s; return those that did not."""
        deadline = time.monotonic() + timeout
        while True:
            # Said hello and sent nothing yet, sent in time, or sent late.
            greeted = self._hello_at.keys() | self._latest.keys() | self._late_at.keys()
            silent = sorted(set(senders) - greeted)
            if not silent or time.monotonic() >= deadline:
                return silent
            await asyncio.sleep(0.05)

    def start_at(self, round: int) -> None:
        """The node starts (resumes) at ``round``: every earlier round counts as collected."""
        self._last_collected = max(self._last_collected, (round - 1, 1 << 30))

    def is_late(self, round: int, phase: int) -> bool:
        """Whether ``(round, phase)`` was already collected."""
        return (round, phase) <= self._last_collected

    def put(self, message: Message) -> bool:
        """File ``message``; return False (and count it) if it came too late."""
        if self._newest is not None:
            return self._put_newest(message)
        key = (message.round, message.phase)
        self._hello_at.pop(message.sender, None)
        if key <= self._last_collected:
            self._late_at[message.sender] = time.monotonic()
            self.stats.messages_late += 1
            logger.debug(
                "%s: late message from %s for %s dropped", self.node_id, message.sender, key
            )
            return False
        box = self._boxes.setdefault(key, {})
        box[message.sender] = message
        if key > self._latest.get(message.sender, (-1, -1)):
            self._latest[message.sender] = key
        waiting = self._waiting
        if (
            waiting is not None
            and key >= waiting[0]
            and not waiting[2].done()
            and not self._outstanding(waiting[0], waiting[1])
        ):
            waiting[2].set_result(None)
        return True

    def _put_newest(self, message: Message) -> bool:
        assert self._newest is not None
        sender, key = message.sender, (message.sender, message.phase)
        self._hello_at.pop(sender, None)
        self._latest[sender] = (message.round, message.phase)
        kept = self._newest.get(key)
        newest = max(self._taken.get(key, -1), -1 if kept is None else kept.round)
        if message.round <= newest:
            self.stats.messages_late += 1
            return False
        if kept is not None:  # superseded before it was taken
            self.stats.messages_late += 1
        self._newest[key] = message
        if self._any is not None and not self._any.done():
            self._any.set_result(None)
        return True

    def take(self, senders: Collection[str], phase: int = 0) -> dict[str, Message]:
        """Asynchronous peers: every sender's newest message of ``phase`` not taken yet
        (those of ``senders``; any other's is dropped as rejected)."""
        if self._newest is None:
            raise RuntimeError("take() needs keep_newest() first")
        inbox: dict[str, Message] = {}
        for key in [k for k in self._newest if k[1] == phase]:
            message = self._newest.pop(key)
            self._taken[key] = message.round
            if key[0] in senders:
                inbox[key[0]] = message
                self.stats.messages_received += 1
                self.stats.bytes_received += message.nbytes
            else:
                self.stats.messages_rejected += 1
        return inbox

    async def wait_any(self, timeout: float | None) -> bool:
        """Asynchronous peers: wait until some message is pending, up to ``timeout`` s;
        return whether one is."""
        if self._newest is None:
            raise RuntimeError("wait_any() needs keep_newest() first")
        if self._newest:
            return True
        loop = asyncio.get_running_loop()
        self._any = future = loop.create_future()
        timer = loop.call_later(timeout, _resolve, future) if timeout is not None else None
        try:
            await future
        finally:
            self._any = None
            if timer is not None:
                timer.cancel()
        return bool(self._newest)

    def _outstanding(self, key: _Key, expected: frozenset[str]) -> set[str]:
        """Expected senders whose ``key`` message may still come.

        A sender delivers its messages in order, so one that already delivered a later
        ``(round, phase)`` will never deliver this one (it was lost, or sent to this node's
        previous process before a restart): waiting for it would only cost the deadline.
        """
        box = self._boxes.get(key, {})
        if not self.skip_ahead:
            return {s for s in expected if s not in box}
        return {s for s in expected if s not in box and self._latest.get(s, (-1, -1)) <= key}

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """Wait for the ``(round, phase)`` messages of ``senders``, up to ``timeout`` s."""
        key = (round, phase)
        expected = frozenset(senders)
        self._boxes.setdefault(key, {})
        if self._outstanding(key, expected):
            await self._wait(key, expected, timeout)
            if timeout is not None:
                now = time.monotonic()
                outstanding = self._outstanding(key, expected)
                # Still starting: said hello less than startup_timeout_s ago, sent nothing.
                starting = {
                    s: self._hello_at[s] + self.startup_timeout_s - now
                    for s in outstanding
                    if s in self._hello_at and self._hello_at[s] + self.startup_timeout_s > now
                }
                behind = {
                    s
                    for s in outstanding
                    if now - self._late_at.get(s, -math.inf) <= _LATE_MEMORY * timeout
                }
                if starting or behind:
                    more = max([timeout, *starting.values()])
                    await self._wait(key, frozenset(starting.keys() | behind), more)
                    # Those that came now would have been late: keep waiting for them.
                    arrived = self._boxes.get(key, {})
                    for s in behind & arrived.keys():
                        self._late_at[s] = time.monotonic()
        box = self._boxes.pop(key, {})
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

    async def _wait(self, key: _Key, expected: frozenset[str], timeout: float | None) -> None:
        """Until every sender in ``expected`` delivered ``key`` (or a later key), or timeout."""
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

    def clear(self) -> None:
        """Drop everything pending."""
        self._boxes.clear()
        if self._newest is not None:
            self._newest.clear()
