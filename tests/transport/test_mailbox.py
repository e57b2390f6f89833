"""The mailbox's waiting rules in deadline mode: peers that start late or fall behind."""

from __future__ import annotations

import asyncio
import time

import torch

from fedcore.compression import RawCodec
from fedcore.messages import Message
from fedcore.transport.base import TransportStats
from fedcore.transport.mailbox import Mailbox


def _msg(sender: str, round: int) -> Message:
    tensor = RawCodec().encode(torch.ones(2))
    return Message(
        run="r", round=round, phase=0, sender=sender, receiver="b", tensors={"x": tensor}
    )


def _timed(box: Mailbox, round: int, senders: list[str], timeout: float) -> tuple[set[str], float]:
    async def go() -> tuple[set[str], float]:
        began = time.monotonic()
        got = await box.collect(round, 0, senders, timeout)
        return set(got), time.monotonic() - began

    return asyncio.run(go())


def test_a_peer_that_said_hello_is_waited_for_once_not_forever() -> None:
    box = Mailbox("b", TransportStats(), startup_timeout_s=0.3)
    box.hello("a")
    got, waited = _timed(box, 0, ["a"], 0.05)
    assert got == set() and 0.25 < waited < 1.0  # still starting: up to the startup timeout
    got, waited = _timed(box, 1, ["a"], 0.05)
    assert got == set() and waited < 0.2  # said hello, then silence: just the timeout


def test_a_late_sender_is_waited_for_once_more() -> None:
    box = Mailbox("b", TransportStats(), startup_timeout_s=0.3)
    assert _timed(box, 0, ["a"], 0.05)[0] == set()
    box.put(_msg("a", 0))  # round 0 is closed: late, so "a" is alive but behind
    assert box.stats.messages_late == 1

    async def late_by(delay: float) -> tuple[set[str], float]:
        async def deliver() -> None:
            await asyncio.sleep(delay)
            box.put(_msg("a", 1))

        began = time.monotonic()
        sender = asyncio.create_task(deliver())
        got = await box.collect(1, 0, ["a"], 0.05)
        await sender
        return set(got), time.monotonic() - began

    got, waited = asyncio.run(late_by(0.08))  # after the timeout, within a second one
    assert got == {"a"} and waited < 0.1


def test_a_silent_sender_costs_one_timeout() -> None:
    box = Mailbox("b", TransportStats(), startup_timeout_s=0.3)
    for round in range(3):
        got, waited = _timed(box, round, ["a"], 0.2)
        assert got == set() and waited < 0.35  # not the 0.4 of a second timeout
