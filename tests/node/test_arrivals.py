"""The node's arrivals policy (fedcore/node/arrivals.py), on its own: which policy a node
gets, and what each makes of a phase's inbox. The round loop's runs (tests/node/test_loop.py,
the engine-agreement and launch tests) check it in use."""

from __future__ import annotations

import asyncio

import pytest

from fedcore.errors import ProtocolError, TransportTimeoutError
from fedcore.messages import Payload
from fedcore.node.arrivals import Arrivals, Tally, VirtualArrivals
from fedcore.node.schedule import NodeOptions

EXPECTED = ("a", "b", "c")


class _Clock:
    """A virtual clock of one phase: whom each sender sent to, and who came late."""

    def __init__(self, sent: dict[str, frozenset[str]], late: frozenset[str]) -> None:
        self.sent = sent
        self.late_senders = late
        self.recorded: list[tuple[str, int, int, frozenset[str]]] = []

    def late(self, receiver: str, t: int, phase: int) -> frozenset[str]:
        return self.late_senders

    def node_times(self, node: str, t: int) -> tuple[float, float]:
        return (0.0, 0.0)

    def record_sent(self, sender: str, t: int, phase: int, receivers: frozenset[str]) -> None:
        self.recorded.append((sender, t, phase, receivers))

    def sent_to(self, sender: str, t: int, phase: int) -> frozenset[str] | None:
        return self.sent.get(sender)


def _options(mode: str) -> NodeOptions:
    return NodeOptions(run_id="r", lr=0.1, mode=mode, deadline_s=0.5, strict_timeout_s=30.0)


def _inbox(*senders: str) -> dict[str, Payload]:
    return {s: Payload({}, {}) for s in senders}


def test_a_node_gets_its_policy_once_from_its_mode_and_clock() -> None:
    strict = Arrivals.of("n", _options("strict"))
    deadline = Arrivals.of("n", _options("deadline"))
    virtual = Arrivals.of("n", _options("deadline"), clock=_Clock({}, frozenset()))
    assert type(strict) is Arrivals and strict.strict and strict.timeout == 30.0
    assert strict.send_wait_s is None  # strict sends go one after another, to their end
    assert type(deadline) is Arrivals and not deadline.strict
    assert deadline.timeout == deadline.send_wait_s == 0.5
    # A simulation waits for exactly what comes: the strict timeout bounds it, sends are
    # immediate.
    assert isinstance(virtual, VirtualArrivals) and not virtual.strict
    assert virtual.timeout == 30.0 and virtual.send_wait_s is None


def test_strict_mode_fails_on_a_missing_or_rejected_message() -> None:
    policy = Arrivals.of("n", _options("strict"))
    tally = Tally()
    with pytest.raises(TransportTimeoutError, match="no valid message from b"):
        policy.settle(0, 0, EXPECTED, [], _inbox("a", "c"), {}, tally)
    with pytest.raises(ProtocolError, match="the message from 'b' was rejected"):
        policy.rejected(0, 0, "b", ProtocolError("bad"), tally)
    # A sender it was told not to wait for is missing, and no failure.
    policy.settle(0, 0, EXPECTED, ["b"], _inbox("a", "c"), {}, tally)
    assert tally.missing == ["b"] and tally.rejected == 0


def test_deadline_mode_goes_on_without_what_did_not_come() -> None:
    policy = Arrivals.of("n", _options("deadline"))
    tally = Tally()
    policy.rejected(0, 0, "c", ProtocolError("bad"), tally)
    policy.settle(0, 0, EXPECTED, [], _inbox("a"), {"a": 8}, tally)
    assert tally.missing == ["b", "c"] and tally.rejected == 1
    assert tally.late == 0 and tally.dropped_in == []
    assert asyncio.run(policy.not_coming(0, 0, EXPECTED, tally)) == []  # no fault plan


def test_a_virtual_clock_skips_withheld_senders_and_takes_out_late_messages() -> None:
    clock = _Clock({"a": frozenset({"n"}), "b": frozenset(), "c": frozenset({"n"})}, {"c"})
    policy = Arrivals.of("n", _options("deadline"), clock=clock)
    tally = Tally()
    policy.sent(3, 1, frozenset({"a"}))
    assert clock.recorded == [("n", 3, 1, frozenset({"a"}))]
    not_coming = asyncio.run(policy.not_coming(3, 1, EXPECTED, tally))
    assert not_coming == ["b"] and tally.dropped_in == []  # withheld, not lost
    inbox = _inbox("a", "c")
    policy.settle(3, 1, EXPECTED, not_coming, inbox, {"a": 8, "c": 12}, tally)
    assert set(inbox) == {"a"}
    assert tally.missing == ["b", "c"] and tally.late == 1 and tally.late_bytes == 12
