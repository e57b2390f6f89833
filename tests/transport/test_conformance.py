"""One transport suite, run over the in-process and the gRPC transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import torch

from fedcore.compression import RawCodec
from fedcore.errors import PeerUnavailableError, ProtocolError, TransportClosedError
from fedcore.messages import Message
from fedcore.transport import InProcessNetwork

RUN = "run-fingerprint"
Endpoints = dict[str, Any]


def _msg(sender: str, receiver: str, round: int = 0, value: float = 1.0) -> Message:
    tensor = RawCodec().encode(torch.full((4,), value))
    return Message(
        run=RUN, round=round, phase=0, sender=sender, receiver=receiver, tensors={"x": tensor}
    )


def _validator(message: Message) -> None:
    x = RawCodec().decode(message.tensors["x"])
    if not bool(torch.isfinite(x).all()):
        raise ProtocolError("non-finite values")


@asynccontextmanager
async def _inproc(trust: dict[str, set[str]]) -> AsyncIterator[Endpoints]:
    net = InProcessNetwork()
    yield {n: net.endpoint(n) for n in trust}


@asynccontextmanager
async def _grpc(trust: dict[str, set[str]]) -> AsyncIterator[Endpoints]:
    from fedcore.transport.grpc import GrpcTransport

    ends = {
        # A short start-up grace: a collect with a deadline waits that long for a sender that
        # said hello but has sent nothing yet (60 s by default).
        n: GrpcTransport(
            n,
            listen="127.0.0.1:0",
            roster={},
            run_id=RUN,
            trusted=trust[n],
            validator=_validator,
            startup_timeout_s=1.0,
        )
        for n in trust
    }
    for t in ends.values():
        await t.start()
    roster = {n: f"127.0.0.1:{t.port}" for n, t in ends.items()}
    for n, t in ends.items():
        t.roster = roster
        await t.connect([m for m in trust if n in trust[m]], timeout_s=10)
    try:
        yield ends
    finally:
        for t in ends.values():
            await t.close(grace_s=0.1)


KINDS = {
    "inproc": _inproc,
    "grpc": pytest.param(_grpc, marks=pytest.mark.grpc),
}
TRUST = {"a": {"b"}, "b": {"a"}, "c": {"a", "b"}}


def _run(kind: Any, body: Callable[[Endpoints], Awaitable[None]]) -> None:
    async def main() -> None:
        async with kind(TRUST) as ends:
            await body(ends)

    asyncio.run(main())


@pytest.fixture(params=list(KINDS.values()), ids=list(KINDS))
def kind(request: pytest.FixtureRequest) -> Any:
    return request.param


def test_round_trip_and_counters(kind: Any) -> None:
    async def body(ends: Endpoints) -> None:
        await ends["a"].send(_msg("a", "c", value=2.0))
        await ends["b"].send(_msg("b", "c", value=3.0))
        inbox = await ends["c"].collect(0, 0, {"a", "b"}, timeout=5)
        assert sorted(inbox) == ["a", "b"]
        assert RawCodec().decode(inbox["b"].tensors["x"]).tolist() == [3.0] * 4
        assert ends["c"].stats.messages_received == 2
        assert ends["a"].stats.bytes_sent == 16

    _run(kind, body)


def test_rounds_arrive_in_order_per_sender(kind: Any) -> None:
    async def body(ends: Endpoints) -> None:
        for r in range(3):
            await ends["a"].send(_msg("a", "c", round=r, value=float(r)))
        for r in range(3):
            got = await ends["c"].collect(r, 0, {"a"}, timeout=5)
            assert RawCodec().decode(got["a"].tensors["x"])[0].item() == r

    _run(kind, body)


def test_deadline_returns_partial_and_late_is_counted(kind: Any) -> None:
    async def body(ends: Endpoints) -> None:
        await ends["a"].send(_msg("a", "c"))
        got = await ends["c"].collect(0, 0, {"a", "b"}, timeout=0.2)
        assert list(got) == ["a"]
        await ends["b"].send(_msg("b", "c"))
        await asyncio.sleep(0.1)
        assert ends["c"].stats.messages_late == 1

    _run(kind, body)


def test_close_semantics(kind: Any) -> None:
    async def body(ends: Endpoints) -> None:
        await ends["a"].close()
        with pytest.raises(TransportClosedError):
            await ends["a"].send(_msg("a", "c"))
        with pytest.raises(TransportClosedError):
            await ends["a"].collect(0, 0, set(), timeout=1)

    _run(kind, body)


def test_unknown_receiver(kind: Any) -> None:
    async def body(ends: Endpoints) -> None:
        with pytest.raises(PeerUnavailableError):
            await ends["a"].send(_msg("a", "zz"))

    _run(kind, body)


def test_asynchronous_peers_take_each_senders_newest_message(kind: Any) -> None:
    """keep_newest: a receiver holds one message a sender, the newest; older and stale ones
    count late; wait_any wakes on a message and times out without one."""

    async def body(ends: Endpoints) -> None:
        c = ends["c"]
        c.keep_newest()
        assert await c.wait_any(0.05) is False
        for r in range(5):  # a fast sender floods: only its newest is kept
            await ends["a"].send(_msg("a", "c", round=r, value=float(r)))
        await ends["b"].send(_msg("b", "c", round=7, value=7.0))
        assert await c.wait_any(5) is True
        for _ in range(100):  # gRPC: the last pushes may still be on their way
            if c.stats.messages_late == 4:
                break
            await asyncio.sleep(0.02)
        inbox = c.take({"a", "b"})
        assert {s: RawCodec().decode(m.tensors["x"])[0].item() for s, m in inbox.items()} == {
            "a": 4.0,
            "b": 7.0,
        }
        assert c.stats.messages_late == 4 and c.stats.messages_received == 2
        assert c.take({"a", "b"}) == {}
        await ends["a"].send(_msg("a", "c", round=3))  # older than one taken: stale
        await ends["a"].send(_msg("a", "c", round=9, value=9.0))
        assert await c.wait_any(5)
        for _ in range(100):
            if c.stats.messages_late == 5:
                break
            await asyncio.sleep(0.02)
        assert c.stats.messages_late == 5
        assert RawCodec().decode(c.take({"a"})["a"].tensors["x"])[0].item() == 9.0

    _run(kind, body)
