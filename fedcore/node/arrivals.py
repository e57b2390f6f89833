"""What a node makes of each phase's arrivals: one policy (:class:`Arrivals`), chosen once
when the node is built (:meth:`Arrivals.of`), in place of a branch per waiting mode in the
round loop.

A policy says, for one ``(round, phase)`` and the algorithm's expected senders:

* which senders the node does not wait for (:meth:`~Arrivals.not_coming`): those whose
  message a fault plan lost, as far as the node can know it, and, in a simulation, those
  that sent it none;
* how long it waits for the rest (:attr:`~Arrivals.timeout`) and for its own sends
  (:attr:`~Arrivals.send_wait_s`);
* what a rejected message does (:meth:`~Arrivals.rejected`): ends a strict round, is
  counted and left out in deadline mode;
* what the collected inbox comes to (:meth:`~Arrivals.settle`): who is missing, whether a
  strict round fails for it, and which messages came too late.

The three kinds of node:

* a real peer in ``strict`` mode waits for every expected sender up to
  ``strict_timeout_s`` (less those a fault plan announces lost) and fails the round on a
  missing or rejected message;
* a real peer in ``deadline`` mode waits up to ``deadline_s``; what did not come is
  missing (the transport counts it late if it comes after);
* a node of a simulation with a virtual clock (:class:`VirtualArrivals`) knows every loss
  and who sent it nothing, so it waits (up to ``strict_timeout_s``) for exactly the
  messages that come; the clock says which of them came after the deadline: those are
  missing and late, not received.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from fedcore.errors import ProtocolError, TransportTimeoutError
from fedcore.faults import FaultPlan
from fedcore.messages import Payload
from fedcore.node.schedule import NodeOptions

__all__ = ["Arrivals", "Tally", "VirtualArrivals", "VirtualClock"]

logger = logging.getLogger("fedcore.node")


class VirtualClock(Protocol):
    """What a node asks of a simulation's virtual clock
    (:class:`~fedcore.engines.clock.SharedClock`)."""

    def late(self, receiver: str, t: int, phase: int) -> frozenset[str]:
        """The senders whose message of ``(t, phase)`` reaches ``receiver`` too late."""

    def node_times(self, node: str, t: int) -> tuple[float, float]:
        """``(clock at the end of round t, seconds computing in it)`` of ``node``."""

    def record_sent(self, sender: str, t: int, phase: int, receivers: frozenset[str]) -> None:
        """``sender`` sent its ``(t, phase)`` messages to ``receivers``."""

    def sent_to(self, sender: str, t: int, phase: int) -> frozenset[str] | None:
        """Whom ``sender`` sent its ``(t, phase)`` messages to (None: not yet)."""


@dataclass(slots=True)
class Tally:
    """What one round's arrivals came to, over its phases (for its record)."""

    missing: list[str] = field(default_factory=list)
    """Expected senders whose message the node mixed without, in phase order."""
    dropped_in: list[str] = field(default_factory=list)
    """Senders whose message to this node the fault plan lost (as far as it knows)."""
    rejected: int = 0
    """Messages that failed validation (deadline mode; strict mode stops)."""
    late: int = 0
    """Messages the transport received that a virtual clock says came too late."""
    late_bytes: int = 0
    """Their encoded bytes (the transport counted them as received)."""


class Arrivals:
    """The arrivals policy of a real peer (``strict`` or ``deadline`` mode).

    Args:
        node_id: The receiving node.
        strict: Whether a missing or rejected message fails the round.
        timeout: Seconds a phase's collect waits.
        faults: The run's fault plan (``None``: no faults): the senders it announces
            lost are not waited for.
    """

    def __init__(
        self, node_id: str, *, strict: bool, timeout: float, faults: FaultPlan | None
    ) -> None:
        """The policy as given; :meth:`of` chooses it from a node's options."""
        self.node = node_id
        self.strict = strict
        self.timeout = timeout
        self.faults = faults
        self.send_wait_s: float | None = None if strict else timeout
        """How long a round waits for its own sends (``None``: each in turn, to its end)."""

    @staticmethod
    def of(
        node_id: str,
        options: NodeOptions,
        faults: FaultPlan | None = None,
        clock: VirtualClock | None = None,
    ) -> Arrivals:
        """The policy of a node with ``options``: a virtual clock's if there is one, else a
        real peer's in the options' waiting mode."""
        strict = options.mode == "strict"
        if clock is not None:  # every message not lost arrives in a simulation
            return VirtualArrivals(
                node_id, strict=strict, timeout=options.strict_timeout_s, faults=faults, clock=clock
            )
        timeout = options.strict_timeout_s if strict else options.deadline_s
        return Arrivals(node_id, strict=strict, timeout=timeout, faults=faults)

    def sent(self, t: int, phase: int, receivers: frozenset[str]) -> None:
        """This node sent its ``(t, phase)`` messages to ``receivers`` (a real peer's
        receivers see what arrives; nothing to tell)."""

    def lost(self, t: int, phase: int, expected: Collection[str]) -> list[str]:
        """Of ``expected``, the senders whose ``(t, phase)`` message to this node the fault
        plan lost and announces so (a real peer knows no other loss)."""
        if self.faults is None:
            return []
        return self.faults.announced_lost(self.node, t, phase, expected)

    async def not_coming(
        self, t: int, phase: int, expected: tuple[str, ...], tally: Tally
    ) -> list[str]:
        """The expected senders this node does not wait for in ``(t, phase)``; the
        fault plan's losses among them go to ``tally.dropped_in``."""
        lost = self.lost(t, phase, expected)
        tally.dropped_in.extend(lost)
        return lost

    def rejected(self, t: int, phase: int, sender: str, exc: Exception, tally: Tally) -> None:
        """``sender``'s message failed validation: a strict round ends; deadline mode
        logs and counts it, and goes on without it.

        Raises:
            ProtocolError: in strict mode.
        """
        if self.strict:
            raise ProtocolError(
                f"node {self.node!r}, round {t} phase {phase}: the message from "
                f"{sender!r} was rejected: {exc} (strict mode stops here; deadline "
                "mode would proceed without it)."
            ) from exc
        tally.rejected += 1
        logger.warning("%s: rejected round %d message from %s: %s", self.node, t, sender, exc)

    def settle(
        self,
        t: int,
        phase: int,
        expected: tuple[str, ...],
        not_coming: list[str],
        inbox: dict[str, Payload],
        sizes: dict[str, int],
        tally: Tally,
    ) -> None:
        """Account for ``(t, phase)``'s ``inbox`` (its messages' encoded ``sizes`` by
        sender): the expected senders absent from it are missing.

        Raises:
            TransportTimeoutError: in strict mode, a sender that was waited for is absent.
        """
        absent = [s for s in expected if s not in inbox]
        if self.strict and any(s not in not_coming for s in absent):
            absent_alive = [s for s in absent if s not in not_coming]
            raise TransportTimeoutError(
                f"node {self.node!r}, round {t} phase {phase}: no valid message from "
                f"{', '.join(absent_alive)} within {self.timeout:g} s (strict mode). Check that "
                "those peers are running, or use transport.mode = 'deadline' to proceed "
                "without them."
            )
        tally.missing.extend(absent)


class VirtualArrivals(Arrivals):
    """The arrivals policy of a node in a simulation with a virtual ``clock``: it knows
    every loss of the fault plan, announced or not, and whom each sender sent to, so it
    waits for exactly the messages that come; the ones the clock says reach it after the
    deadline are taken out of the inbox, missing and late."""

    def __init__(
        self,
        node_id: str,
        *,
        strict: bool,
        timeout: float,
        faults: FaultPlan | None,
        clock: VirtualClock,
    ) -> None:
        """The policy as given (sends are immediate: a round waits for each in turn)."""
        super().__init__(node_id, strict=strict, timeout=timeout, faults=faults)
        self.clock = clock
        self.send_wait_s = None

    def sent(self, t: int, phase: int, receivers: frozenset[str]) -> None:
        """Tell the clock whom this node sent its ``(t, phase)`` messages to."""
        self.clock.record_sent(self.node, t, phase, receivers)

    def lost(self, t: int, phase: int, expected: Collection[str]) -> list[str]:
        """Of ``expected``, every sender whose message the fault plan lost (the simulation
        knows every loss, announced or not)."""
        if self.faults is None:
            return []
        faults = self.faults
        return [s for s in expected if faults.lost(s, self.node, t, phase) is not None]

    async def not_coming(
        self, t: int, phase: int, expected: tuple[str, ...], tally: Tally
    ) -> list[str]:
        """The lost senders (to ``tally.dropped_in``), and those that sent this node no
        ``(t, phase)`` message (the rule chose not to, as a holding push-sum peer does),
        once each has sent its messages of the phase."""
        lost = await super().not_coming(t, phase, expected, tally)
        withheld = []
        for sender in [s for s in expected if s not in lost]:
            while (receivers := self.clock.sent_to(sender, t, phase)) is None:
                await asyncio.sleep(0)  # the sender's turn (in-process peers, one loop)
            if self.node not in receivers:
                withheld.append(sender)
        return lost + withheld

    def settle(
        self,
        t: int,
        phase: int,
        expected: tuple[str, ...],
        not_coming: list[str],
        inbox: dict[str, Payload],
        sizes: dict[str, int],
        tally: Tally,
    ) -> None:
        """As a real peer's, then: the messages the clock says came after the deadline
        leave the inbox, missing and late, not received (as a real peer's mailbox counts
        a message that comes after its collect)."""
        super().settle(t, phase, expected, not_coming, inbox, sizes, tally)
        after = self.clock.late(self.node, t, phase)
        for sender in [s for s in expected if s in after and s in inbox]:
            del inbox[sender]
            tally.missing.append(sender)
            tally.late += 1
            tally.late_bytes += sizes[sender]
