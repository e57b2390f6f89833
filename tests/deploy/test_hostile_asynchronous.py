"""A hostile sender against running asynchronous peers over real gRPC: a FedBuff and a
FedAsync server and worker, and a peer of asynchronous push-sum and of AD-PSGD.

The hostile sender is a trusted in-neighbour with a real :class:`GrpcTransport` (so the
receiver can send to it); it forges each scalar and tensor field of each message kind the
receiver takes at its extremes (NaN, infinite, negative, zero, huge, fractional, the
receiver's own value + 1, a round past the run's, a phase nobody sends, extra or missing
fields) and sends them through the real gRPC client while the receiver runs. Every one
must be refused on arrival (the sender gets MessageRefusedError), counted in the
receiver's records, and the receiver must live.

The result is exact where the protocol makes it so: everything hostile is refused, so the
receiver's run is its run without the hostile sender's messages.

The attack lasts as long as its gRPC round trips, which a loaded machine stretches; so a
receiver that computes is held before one of its rounds until the attack is done
(:func:`_hold`): its run cannot end before the attack does, and it computes while the
attack lands up to that round.

* The server sees only the hostile worker's uploads: the refused ones, and two honest ones
  interleaved (version 0, then the version it was told). Its final model and version are
  the rule applied to those two on its first model, bit for bit, and its one round's
  record counts every refusal.
* The workers and the push-sum and AD-PSGD peers hear nothing but refused messages: their
  final models are those of the same peer run alone (in process, no message ever
  arriving), bit for bit.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch

from fedcore.algorithms.asynchronous import ServerState
from fedcore.compression import RawCodec
from fedcore.config import load_config
from fedcore.errors import MessageRefusedError
from fedcore.messages import Message
from fedcore.node.asynchronous import AsyncPeer
from fedcore.node.records import RoundRecord
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.transport import InProcessNetwork
from fedcore.transport.grpc import GrpcTransport

pytestmark = pytest.mark.grpc

BIG = float(torch.finfo(torch.float32).max)
HOST = "127.0.0.1"


def _setup(algorithm: str, *extra: str) -> RunSetup:
    return prepare_run(
        load_config(
            None,
            [
                f"algorithm.name={algorithm}",
                "transport.deadline_s=0.03",
                "transport.strict_timeout_s=5",
                *extra,
            ],
        )
    )


def _transport(setup: RunSetup, node: str, trusted: set[str]) -> GrpcTransport:
    return GrpcTransport(node, listen=f"{HOST}:0", roster={}, run_id=setup.run_id, trusted=trusted)


async def _pair_up(receiver: GrpcTransport, hostile: GrpcTransport) -> None:
    """Start both, give each the other's address, handshake both ways."""
    await receiver.start()
    await hostile.start()
    receiver.roster[hostile.node_id] = f"{HOST}:{hostile.port}"
    hostile.roster[receiver.node_id] = f"{HOST}:{receiver.port}"
    await asyncio.gather(
        receiver.connect([hostile.node_id], timeout_s=10),
        hostile.connect([receiver.node_id], timeout_s=10),
    )


async def _refused(hostile: GrpcTransport, messages: list[Message]) -> None:
    """Send each; every one must be refused by the receiver."""
    for message in messages:
        with pytest.raises(MessageRefusedError):
            await hostile.send(message)


def _forge(setup: RunSetup, sender: str, receiver: str, codec: Any) -> Any:
    def message(
        tensor: torch.Tensor,
        *,
        round: int = 0,
        phase: int = 0,
        encode: Any = None,
        **scalars: float,
    ) -> Message:
        encoded = (encode or codec).encode(tensor)
        return Message(
            run=setup.run_id,
            round=round,
            phase=phase,
            sender=sender,
            receiver=receiver,
            tensors={"x": encoded},
            scalars=scalars,
            nbytes=encoded.nbytes,
        )

    return message


def _tensor_extremes(d: int, make: Any, **fields: Any) -> list[Message]:
    """The tensor field at its extremes: NaN, +/-inf, another shape, another dtype."""
    return [
        make(torch.full((d,), math.nan), **fields),
        make(torch.full((d,), math.inf), **fields),
        make(torch.full((d,), -math.inf), **fields),
        make(torch.zeros(d + 1), **fields),
        make(torch.zeros(0), **fields),
        make(torch.zeros(d, dtype=torch.float64), encode=RawCodec(), **fields),
    ]


def _hold(peer: AsyncPeer, at: int) -> asyncio.Event:
    """Hold ``peer`` before it computes its round ``at`` until the returned event is set
    (its pace waits on it), so that its run cannot end before the attack does however long
    the attack takes. The peer's result does not depend on when it computes: it takes no
    message."""
    pace = peer.pace
    assert pace is not None, "the test's [time] paces the peer"
    go = asyncio.Event()
    available = pace.available

    async def held() -> None:
        if peer.round == at:
            await go.wait()
        await available()

    pace.available = held  # type: ignore[method-assign]
    return go


def _records() -> tuple[list[RoundRecord], Any]:
    records: list[RoundRecord] = []
    return records, lambda _peer, record: records.append(record)


# --- the server family ----------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasync"])
def test_a_running_server_refuses_every_impossible_upload(algorithm: str) -> None:
    extra = ["algorithm.buffer=1"] if algorithm == "fedbuff" else []
    setup = _setup(
        algorithm,
        "topology.kind=star",
        "topology.nodes=2",
        "run.rounds=2",  # two uploads a worker
        *extra,
    )
    server_id, workers = "server", 2  # n1 never starts: only the hostile n0 uploads
    honest = [torch.full(setup.start.shape, 1e-3), torch.full(setup.start.shape, 2e-3)]

    async def main() -> tuple[AsyncPeer, list[RoundRecord], int]:
        server_t = _transport(setup, server_id, {"n0", "n1"})
        hostile = _transport(setup, "n0", {server_id})
        hostile.keep_newest()
        records, observer = _records()
        server = setup.make_async_peer(server_id, server_t, observer=observer)
        server_t.validator = server.validate
        running: asyncio.Task[None] | None = None
        try:
            await _pair_up(server_t, hostile)
            d = server.d
            upload = _forge(setup, "n0", server_id, server.codec)
            ones = torch.full((d,), 1e-3)
            server.validate(upload(ones, version=0.0))  # the forged form is right
            bad = 0
            running = asyncio.create_task(server.run(1))  # one round: W = 2 uploads
            await asyncio.sleep(0.05)  # the server's round has begun
            for own in (0, 1):  # before and after the first honest upload (own: its version)
                hostile_uploads = [
                    *_tensor_extremes(d, upload, version=float(own)),
                    upload(ones),  # no version
                    upload(ones, version=float(own), extra=1.0),
                    upload(ones, phase=1, version=float(own)),
                    upload(ones, round=1 << 40, version=float(own)),
                    *[
                        upload(ones, round=own, version=v)
                        for v in (math.nan, math.inf, -math.inf, -1.0, 0.5, own + 0.5)
                    ],
                    upload(ones, round=own, version=float(own + 1)),  # the server's own + 1
                    upload(ones, round=own, version=1e9),  # the filed value
                    upload(ones, round=own, version=2.0**63),
                ]
                await _refused(hostile, hostile_uploads)
                bad += len(hostile_uploads)
                assert not running.done()
                await hostile.send(upload(honest[own], round=own, version=float(own)))
                if own == 0:  # the answer: the model and the version to start from
                    assert await hostile.wait_any(5.0)
                    answer = hostile.take({server_id})[server_id]
                    assert answer.scalars["version"] == 1.0
            await asyncio.wait_for(running, 10)
        finally:
            if running is not None:
                running.cancel()
            await hostile.close(0.1)
            await server_t.close(0.1)
        return server, records, bad

    server, records, bad = asyncio.run(main())
    # The run without the refused messages: the rule on the two honest uploads.
    rule, start = setup.algorithm, setup.start
    share = server.shares["n0"]
    state = rule.receive(ServerState(start.clone()), honest[0], 0.0, share, workers)
    state = rule.receive(state, honest[1], 1.0, share, workers)
    assert server.version == state.version == 2
    assert torch.equal(server.x, state.x)
    assert server.transport.stats.messages_rejected == bad
    assert len(records) == 1 and records[0].messages_rejected == bad


# --- decentralized peers ---------------------------------------------------------------------


def _alone(setup: RunSetup, node: str, others: list[str], rounds: int) -> AsyncPeer:
    """``node`` run in process with its neighbours' endpoints open and silent."""
    network = InProcessNetwork()
    for other in others:
        network.endpoint(other).keep_newest()
    peer = setup.make_async_peer(node, network.endpoint(node))
    asyncio.run(peer.run(rounds))
    return peer


def test_a_running_push_sum_peer_refuses_every_impossible_running_sum() -> None:
    rounds = 30
    setup = _setup(
        "async-push-sum",
        "topology.kind=exponential",
        "topology.nodes=2",
        f"run.rounds={rounds}",
        "time.step_s=0.02",  # 20 ms a computation (real sleeps): the attack lands mid-run
    )
    n = 2

    async def main() -> tuple[AsyncPeer, list[RoundRecord], int]:
        peer_t = _transport(setup, "n0", {"n1"})
        hostile = _transport(setup, "n1", {"n0"})
        hostile.keep_newest()
        records, observer = _records()
        peer = setup.make_async_peer("n0", peer_t, observer=observer)
        peer_t.validator = peer.validate
        running: asyncio.Task[None] | None = None
        try:
            await _pair_up(peer_t, hostile)
            d = peer.d
            push = _forge(setup, "n1", "n0", RawCodec())

            def sums(fill: float, weight: float) -> torch.Tensor:
                out = torch.full((d + 1,), fill, dtype=torch.float64)
                out[-1] = weight
                return out

            peer.validate(push(sums(0.25, 0.5)))  # the forged form is right
            hostile_sums = [
                *[push(sums(v, 0.5)) for v in (math.nan, math.inf, -math.inf)],
                *[push(sums(0.0, w)) for w in (math.nan, math.inf, -1.0, -1e-300)],
                push(sums(0.0, n * 1.01)),  # more than one push carries (N = 2)
                push(sums(0.0, 1e300)),
                push(sums(1e300, 0.5)),  # finite, but x + it overflows float32
                push(sums(-1e300, 0.5)),
                push(sums(0.0, 0.5), round=rounds),  # a round past the run's
                push(sums(0.0, 0.5), round=1 << 40),
                push(sums(0.0, 0.5), phase=1),
                push(sums(0.0, 0.5), version=0.0),
                push(sums(0.0, 0.5)[:-1]),  # no weight
                push(sums(0.0, 0.5).float()),  # not a float64 sum
            ]
            go = _hold(peer, rounds - 1)  # it computes through the attack, but the last
            running = asyncio.create_task(peer.run(rounds))
            await asyncio.sleep(0.03)
            await _refused(hostile, hostile_sums)
            assert not running.done(), "the run ended before the attack did"
            go.set()
            await asyncio.wait_for(running, 10)
        finally:
            if running is not None:
                running.cancel()
            await hostile.close(0.1)
            await peer_t.close(0.1)
        return peer, records, len(hostile_sums)

    peer, records, bad = asyncio.run(main())
    alone = _alone(setup, "n0", ["n1"], rounds)
    assert peer.round == alone.round == rounds
    assert torch.equal(peer.x, alone.x) and peer.w == alone.w
    assert peer.transport.stats.messages_rejected == bad
    assert sum(r.messages_rejected for r in records) == bad


def test_a_running_adpsgd_peer_refuses_every_impossible_request_and_reply() -> None:
    rounds = 30
    setup = _setup(
        "adpsgd",
        "topology.kind=ring",
        "topology.undirected=true",
        "topology.nodes=3",
        f"run.rounds={rounds}",
        "time.step_s=0.02",
    )

    async def main() -> tuple[AsyncPeer, list[RoundRecord], int]:
        peer_t = _transport(setup, "n0", {"n1", "n2"})
        hostile = _transport(setup, "n1", {"n0"})
        hostile.keep_newest()
        records, observer = _records()
        peer = setup.make_async_peer("n0", peer_t, observer=observer)
        peer_t.validator = peer.validate
        running: asyncio.Task[None] | None = None
        try:
            await _pair_up(peer_t, hostile)  # n2 never starts: a request to it is not sent
            d = peer.d
            make = _forge(setup, "n1", "n0", peer.codec)
            ones = torch.ones(d)
            # n1's rounds in which n0 is its partner, and those in which it is not.
            asks = [k for k in range(rounds) if peer._partner("n1", k) == "n0"]
            others = [k for k in range(rounds) if k not in asks]
            # n0's rounds in which n1 is its partner, and those in which it is not.
            mine = [k for k in range(rounds) if peer._partner("n0", k) == "n1"]
            not_mine = [k for k in range(rounds) if k not in mine]
            assert asks and others and mine and not_mine
            peer.validate(make(ones, round=asks[0]))  # the forged forms are right
            peer.round = mine[0]  # as if n0 had asked in that round
            peer.validate(make(ones, round=mine[0], phase=1))
            peer.round = 0
            # The last round n1 is n0's partner in: n0 is held in the round before it until
            # the attack is done, so it has not reached it while the reply for it arrives.
            ahead = mine[-1]
            assert ahead > 0
            go = _hold(peer, ahead - 1)
            running = asyncio.create_task(peer.run(rounds))
            await asyncio.sleep(0.02)
            hostile_messages = [
                make(ones, round=ahead, phase=1),  # a reply before n0 asked
                *_tensor_extremes(d, make, round=asks[0]),  # requests
                *_tensor_extremes(d, make, round=ahead, phase=1),  # replies
                make(ones, round=others[0]),  # a request to whom n1 does not ask
                make(ones, round=not_mine[0], phase=1),  # a reply n0 did not ask n1 for
                make(ones, round=rounds),  # past the run
                make(ones, round=1 << 40, phase=1),
                make(ones, round=asks[0], phase=2),
                make(ones, round=asks[0], version=1.0),
            ]
            await _refused(hostile, hostile_messages)
            assert not running.done(), "the run ended before the attack did"
            assert peer.round < ahead  # so the reply for round ahead came before n0 asked
            go.set()
            await asyncio.wait_for(running, 10)
        finally:
            if running is not None:
                running.cancel()
            await hostile.close(0.1)
            await peer_t.close(0.1)
        return peer, records, len(hostile_messages)

    peer, records, bad = asyncio.run(main())
    alone = _alone(setup, "n0", ["n1", "n2"], rounds)  # no reply ever: no averaging
    assert peer.round == alone.round == rounds
    assert torch.equal(peer.x, alone.x)
    assert peer.transport.stats.messages_rejected == bad
    assert sum(r.messages_rejected for r in records) == bad


@pytest.mark.parametrize("algorithm", ["fedbuff", "fedasync"])
def test_a_running_worker_refuses_every_impossible_answer(algorithm: str) -> None:
    """The server's answer at its extremes, from a hostile server: the worker never takes
    one, so it runs as it does when no answer comes (on from its own model)."""
    rounds = 25
    setup = _setup(
        algorithm,
        "topology.kind=star",
        "topology.nodes=2",
        f"run.rounds={rounds}",
        "time.step_s=0.02",
    )
    server_id = "server"

    async def main() -> tuple[AsyncPeer, list[RoundRecord], int]:
        worker_t = _transport(setup, "n0", {server_id})
        hostile = _transport(setup, server_id, {"n0", "n1"})
        hostile.keep_newest()
        records, observer = _records()
        worker = setup.make_async_peer("n0", worker_t, observer=observer)
        worker_t.validator = worker.validate
        running: asyncio.Task[None] | None = None
        try:
            await _pair_up(worker_t, hostile)
            d = worker.d
            answer = _forge(setup, server_id, "n0", worker.codec)
            ones = torch.ones(d)
            worker.validate(answer(ones, version=1.0))  # the forged form is right
            last = (rounds + 1) * 2 - 1  # the server's last upload count (W = 2)
            hostile_answers = [
                *_tensor_extremes(d, answer, version=0.0),
                answer(ones),  # no version
                answer(ones, version=0.0, extra=1.0),
                answer(ones, phase=1, version=0.0),
                answer(ones, round=last + 1, version=0.0),
                *[
                    answer(ones, version=v)  # round 0: at most version 1
                    for v in (math.nan, math.inf, -math.inf, -1.0, 0.5, 2.0, 1e9, 2.0**63)
                ],
                answer(ones, round=5, version=7.0),  # round + 2
            ]
            go = _hold(worker, rounds - 1)  # it computes through the attack, but the last
            running = asyncio.create_task(worker.run(rounds))
            await asyncio.sleep(0.02)
            await _refused(hostile, hostile_answers)
            assert not running.done(), "the run ended before the attack did"
            go.set()
            await asyncio.wait_for(running, 10)
        finally:
            if running is not None:
                running.cancel()
            await hostile.close(0.1)
            await worker_t.close(0.1)
        return worker, records, len(hostile_answers)

    worker, records, bad = asyncio.run(main())
    alone = _alone(setup, "n0", [server_id], rounds)  # the server never answers
    assert worker.round == alone.round == rounds
    assert worker.version == alone.version == 0
    assert torch.equal(worker.x, alone.x)
    assert worker.transport.stats.messages_rejected == bad
    assert sum(r.messages_rejected for r in records) == bad
