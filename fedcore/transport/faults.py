"""Fault injection on the wire: a transport wrapper that loses and delays messages.

:class:`FaultyTransport` wraps any transport and applies a :class:`~fedcore.faults.
FaultPlan` (the run's one source of fault decisions, re-exported here) to what its node
sends:

* a message the plan lost is not sent (counted in ``stats.messages_dropped``);
* a delayed one is sent after ``asyncio.sleep``.

The wrapper decides nothing else. The node is given the same plan (``Node(faults=...)``)
and asks it whether it is crashed in a round (then it skips the round), which of its
messages were lost, and, with ``announce`` (the default), which messages it must not wait
for: every peer knows the plan, so strict mode stays strict about every *other* message,
runs are fast, and in-process and gRPC runs agree bit for bit. Without ``announce`` a lost
message simply never arrives and the node needs ``transport.mode = "deadline"`` to go on
without it.
"""

from __future__ import annotations

import asyncio

from fedcore.faults import FaultPlan
from fedcore.messages import Message
from fedcore.transport.base import Transport, TransportWrapper

__all__ = ["FaultPlan", "FaultyTransport"]


class FaultyTransport(TransportWrapper):
    """``inner`` with a :class:`~fedcore.faults.FaultPlan` applied to what this node sends.

    Counts into the inner transport's ``stats`` (one set of counters for the metrics).
    """

    def __init__(self, inner: Transport, plan: FaultPlan, *, delays: bool = True) -> None:
        """Wrap ``inner`` (this node's endpoint); ``delays``: wait out the plan's delays
        (a simulation's virtual clock counts them instead)."""
        super().__init__(inner)
        self.plan = plan
        self.delays = delays

    async def send(self, message: Message) -> None:
        """Send ``message`` after its delay, or lose it."""
        coords = (message.sender, message.receiver, message.round, message.phase)
        if self.plan.lost(*coords) is not None:
            self.stats.messages_dropped += 1
            return
        wait = self.plan.delay(*coords) if self.delays else 0.0
        if wait > 0:
            await asyncio.sleep(wait)
        await self.inner.send(message)
