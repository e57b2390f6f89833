"""Fault injection: a transport wrapper that loses, delays and cuts messages reproducibly.

A :class:`FaultPlan` answers, for one message ``(sender, receiver, round, phase)``, whether
it is lost and why (random drop, partition, crashed peer) and how long it waits. Every
answer is a keyed hash of ``(run seed, faults seed, sender, receiver, round, phase)``,
never a draw from shared random state, so the same plan loses the same messages in one
process and across gRPC peers, whatever the timing. :class:`FaultyTransport` wraps any
transport:

* sending: a lost message is not sent (counted in ``stats.messages_dropped``); a delayed
  one is sent after ``asyncio.sleep``;
* receiving, with ``announce`` (the default): every peer knows the plan, so the receiver
  (the node, through :meth:`FaultyTransport.announced_lost`) does not wait for a message
  the plan lost and proceeds at once: strict mode stays strict about every *other*
  message, runs are fast, and in-process and gRPC runs agree bit for bit. Without
  ``announce`` a lost message simply never arrives and the node needs
  ``transport.mode = "deadline"`` to go on without it;
* a crashed node (:meth:`FaultyTransport.down`) skips its rounds entirely.

The node asks these questions of a transport that has them (:class:`FaultAware`); plain
transports have none.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Collection
from typing import Protocol, runtime_checkable

from fedcore.config import FaultsConfig
from fedcore.errors import ConfigError
from fedcore.messages import Message
from fedcore.transport.base import Transport, TransportStats

__all__ = ["FaultAware", "FaultPlan", "FaultyTransport"]


class FaultPlan:
    """The fault decisions of one run: a pure function of the message's coordinates."""

    def __init__(self, faults: FaultsConfig, *, run_seed: int, nodes: Collection[str] = ()) -> None:
        """Bind ``faults`` to ``run_seed``; ``nodes`` (if given) checks the node ids named.

        Raises:
            ConfigError: the plan names a node that is not in ``nodes``.
        """
        self.faults = faults
        self._key = f"{run_seed}:{faults.seed}".encode()
        self._edge_drop: dict[tuple[str, str], float] = {}
        for text, p in faults.edge_drop.items():
            sender, receiver = (part.strip() for part in text.split("->"))
            self._edge_drop[(sender, receiver)] = float(p)
        if nodes:
            named = {n for edge in self._edge_drop for n in edge}
            named |= {n for part in faults.partitions for n in part.nodes}
            named |= {c.node for c in faults.crashes}
            unknown = sorted(named - set(nodes))
            if unknown:
                raise ConfigError(
                    f"[faults] names nodes that are not in the graph: {', '.join(unknown)}."
                )

    def uniform(self, kind: str, sender: str, receiver: str, round: int, phase: int) -> float:
        """A uniform number in [0, 1) that only these coordinates (and the seeds) determine."""
        text = f"{kind}|{sender}|{receiver}|{round}|{phase}".encode()
        digest = hashlib.blake2b(text, key=self._key, digest_size=8).digest()
        (value,) = struct.unpack("<Q", digest)
        return float(value >> 11) / float(1 << 53)

    def down(self, node: str, round: int) -> bool:
        """Whether ``node`` is crashed in ``round``."""
        return any(
            c.node == node and c.at <= round and (c.back < 0 or round < c.back)
            for c in self.faults.crashes
        )

    def lost(self, sender: str, receiver: str, round: int, phase: int) -> str | None:
        """Why the message is lost (``"crash"``, ``"partition"``, ``"drop"``), or None."""
        if self.down(sender, round) or self.down(receiver, round):
            return "crash"
        for part in self.faults.partitions:
            crosses = (sender in part.nodes) != (receiver in part.nodes)
            if crosses and part.start <= round < part.end:
                return "partition"
        p = self._edge_drop.get((sender, receiver), self.faults.drop)
        if p > 0 and self.uniform("drop", sender, receiver, round, phase) < p:
            return "drop"
        return None

    def delay(self, sender: str, receiver: str, round: int, phase: int) -> float:
        """Seconds the message waits before it is sent."""
        if self.faults.delay_s <= 0:
            return 0.0
        return self.faults.delay_s * self.uniform("delay", sender, receiver, round, phase)


@runtime_checkable
class FaultAware(Protocol):
    """What the node asks of a transport that injects faults."""

    def down(self, round: int) -> bool:
        """Whether this node is crashed in ``round``."""
        ...

    def announced_lost(self, round: int, phase: int, senders: Collection[str]) -> list[str]:
        """Which of ``senders`` the node must not wait for: the plan lost their message."""
        ...

    def pop_lost_sent(self, round: int) -> list[str]:
        """Receivers of this node's messages the plan lost in ``round`` (then forgotten)."""
        ...

    def loses(self, message: Message) -> bool:
        """Whether the plan loses ``message``."""
        ...


class FaultyTransport:
    """``inner`` with a :class:`FaultPlan` applied to what this node sends and awaits.

    Counts into the inner transport's ``stats`` (one set of counters for the metrics).
    """

    def __init__(self, inner: Transport, plan: FaultPlan) -> None:
        """Wrap ``inner`` (this node's endpoint)."""
        self.inner = inner
        self.plan = plan
        self.node_id = inner.node_id
        self.stats: TransportStats = inner.stats
        self._lost_sent: dict[int, list[str]] = {}

    def down(self, round: int) -> bool:
        """Whether this node is crashed in ``round`` (the node then skips the round)."""
        return self.plan.down(self.node_id, round)

    def announced_lost(self, round: int, phase: int, senders: Collection[str]) -> list[str]:
        """With ``announce``: the senders whose ``(round, phase)`` message the plan lost."""
        if not self.plan.faults.announce:
            return []
        lost = self.plan.lost
        return [s for s in senders if lost(s, self.node_id, round, phase) is not None]

    def pop_lost_sent(self, round: int) -> list[str]:
        """Receivers of this node's messages the plan lost in ``round``."""
        return self._lost_sent.pop(round, [])

    def loses(self, message: Message) -> bool:
        """Whether the plan loses ``message``."""
        coords = (message.sender, message.receiver, message.round, message.phase)
        return self.plan.lost(*coords) is not None

    async def send(self, message: Message) -> None:
        """Send ``message`` after its delay, or lose it."""
        coords = (message.sender, message.receiver, message.round, message.phase)
        if self.loses(message):
            self.stats.messages_dropped += 1
            self._lost_sent.setdefault(message.round, []).append(message.receiver)
            return
        wait = self.plan.delay(*coords)
        if wait > 0:
            await asyncio.sleep(wait)
        await self.inner.send(message)

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """The inner inbox; the node leaves out the senders :meth:`announced_lost` names."""
        return await self.inner.collect(round, phase, senders, timeout)

    async def close(self) -> None:
        """Close the inner transport."""
        await self.inner.close()
