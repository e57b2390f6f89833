"""In-process transport semantics: collect, late and untrusted messages, close."""

from __future__ import annotations

import asyncio

import pytest

from fedcore.errors import PeerUnavailableError, TransportClosedError
from fedcore.messages import EncodedTensor, Message
from fedcore.transport import InProcessNetwork


def _msg(sender: str, receiver: str, round: int = 0, phase: int = 0) -> Message:
    tensor = EncodedTensor(codec="raw", dtype="float32", shape=(1,), data=b"\x00\x00\x80?")
    return Message(
        run="r", round=round, phase=phase, sender=sender, receiver=receiver, tensors={"x": tensor}
    )


def test_collect_waits_for_every_expected_sender() -> None:
    async def main() -> dict[str, Message]:
        net = InProcessNetwork()
        a, b, c = (net.endpoint(n) for n in "abc")
        task = asyncio.create_task(c.collect(0, 0, {"a", "b"}, timeout=5))
        await asyncio.sleep(0)
        await a.send(_msg("a", "c"))
        await asyncio.sleep(0)
        assert not task.done()
        await b.send(_msg("b", "c"))
        return await task

    inbox = asyncio.run(main())
    assert sorted(inbox) == ["a", "b"]


def test_deadline_returns_what_arrived() -> None:
    async def main() -> dict[str, Message]:
        net = InProcessNetwork()
        a, c = net.endpoint("a"), net.endpoint("c")
        net.endpoint("b")
        await a.send(_msg("a", "c"))
        return await c.collect(0, 0, {"a", "b"}, timeout=0.05)

    assert list(asyncio.run(main())) == ["a"]


def test_late_and_untrusted_messages_are_dropped_and_counted() -> None:
    async def main() -> None:
        net = InProcessNetwork()
        a, b, c = (net.endpoint(n) for n in "abc")
        await b.send(_msg("b", "c"))  # b is not expected: rejected at collect
        await a.send(_msg("a", "c"))
        inbox = await c.collect(0, 0, {"a"}, timeout=1)
        assert list(inbox) == ["a"]
        assert c.stats.messages_rejected == 1
        await b.send(_msg("b", "c", round=0))  # round 0 already collected: late
        assert c.stats.messages_late == 1
        await a.send(_msg("a", "c", round=1))  # future rounds are kept
        assert list(await c.collect(1, 0, {"a"}, timeout=1)) == ["a"]
        assert c.stats.messages_received == 2 and a.stats.messages_sent == 2
        assert a.stats.bytes_sent == 8

    asyncio.run(main())


def test_closed_and_unknown_endpoints() -> None:
    async def main() -> None:
        net = InProcessNetwork()
        a = net.endpoint("a")
        with pytest.raises(PeerUnavailableError, match="'zz'"):
            await a.send(_msg("a", "zz"))
        await a.close()
        with pytest.raises(TransportClosedError):
            await a.send(_msg("a", "b"))
        with pytest.raises(TransportClosedError):
            await a.collect(0, 0, set(), timeout=1)

    asyncio.run(main())


def test_record_keeps_messages_in_order() -> None:
    async def main() -> InProcessNetwork:
        net = InProcessNetwork(record=True)
        a, _ = net.endpoint("a"), net.endpoint("b")
        await a.send(_msg("a", "b", round=0))
        await a.send(_msg("a", "b", round=1))
        return net

    net = asyncio.run(main())
    assert [m.round for m in net.messages] == [0, 1]
