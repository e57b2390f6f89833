"""Every value a peer sends to an asynchronous algorithm is checked against the receiver's
own state before any arithmetic (:mod:`fedcore.algorithms.asynchronous`, and the real peer
:mod:`fedcore.node.asynchronous` where it takes a message): extreme values are refused with
a ProtocolError (counted, at a peer), the receiver's state is unchanged, nothing else
escapes; the values an honest peer sends are taken."""

from __future__ import annotations

import asyncio
import heapq
import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms.asynchronous import (
    ADPSGD,
    AsyncPushSum,
    FedAsync,
    FedBuff,
    ServerState,
    answer_version,
)
from fedcore.compression import RawCodec
from fedcore.config import load_config
from fedcore.engines.events import EventNetwork
from fedcore.errors import ProtocolError
from fedcore.messages import Message
from fedcore.node.asynchronous import AsyncPeer
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.transport import InProcessNetwork

BIG = float(torch.finfo(torch.float32).max)
EXTREMES = [
    math.nan,
    math.inf,
    -math.inf,
    -1.0,
    -1e-300,
    0.5,
    1e9,
    1e300,
    2.0**63,
    2.0**53 + 2,
    -(2.0**63),
]
"""Scalars no honest peer sends for a version (beside the receiver's own +/- 1)."""

_VERSIONS = st.one_of(
    st.sampled_from(EXTREMES),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 12).map(float),
)
_TENSOR_VALUES = st.sampled_from([0.0, 1.0, -1.0, 1e30, BIG, -BIG, math.inf, -math.inf, math.nan])


def _whole_in(value: float, low: int, high: int) -> bool:
    return math.isfinite(value) and value == math.floor(value) and low <= value <= high


def _server_rule(kind: str) -> Any:
    return FedBuff(buffer=2, server_lr=1e6) if kind == "fedbuff" else FedAsync(alpha=1.0)


# --- the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fedbuff", "fedasync"])
@given(version=_VERSIONS, own=st.integers(0, 8), fill=_TENSOR_VALUES)
@settings(max_examples=80, deadline=None)
def test_an_upload_is_taken_only_with_a_version_the_server_made_and_a_finite_step(
    kind: str, version: float, own: int, fill: float
) -> None:
    rule = _server_rule(kind)
    x = torch.linspace(-1.0, 1.0, 6)
    state = ServerState(x.clone(), own)
    sent = torch.full((6,), fill)
    try:
        after = rule.receive(state, sent, version, 1.0, 3)
    except ProtocolError as exc:
        assert torch.equal(state.x, x) and state.version == own  # nothing changed
        assert "version" in str(exc) or "finite" in str(exc) or "range" in str(exc)
        assert not _whole_in(version, 0, own) or not math.isfinite(fill) or abs(fill) >= 1e30
        return
    assert _whole_in(version, 0, own)  # the bug: 1e9 was taken, a staleness below zero
    assert math.isfinite(fill)
    assert bool(torch.isfinite(after.x).all())
    assert after.version in (own, own + 1)


@pytest.mark.parametrize("kind", ["fedbuff", "fedasync"])
def test_the_filed_upload_ahead_of_the_server_is_refused_and_its_neighbours_in_version(
    kind: str,
) -> None:
    rule = _server_rule(kind)
    state = ServerState(torch.zeros(4), 3)
    for version in (1e9, 4.0, -1.0):  # the filed value; the server's own + 1; below 0
        with pytest.raises(ProtocolError, match="version"):
            rule.receive(state, torch.ones(4), version, 1.0, 3)
    for version in (3.0, 2.0, 0.0):  # the server's own, own - 1, the first
        rule.receive(state, torch.ones(4) * 1e-3, version, 1.0, 3)
    with pytest.raises(ProtocolError, match="shape"):
        rule.receive(state, torch.ones(5), 3.0, 1.0, 3)


def test_a_fedbuff_buffer_of_huge_updates_never_steps_out_of_range() -> None:
    """Each update is checked alone against the server's model, which stays put while it
    buffers: every one taken keeps the buffer's step in range."""
    rule = FedBuff(buffer=3, server_lr=1.0)
    state = ServerState(torch.full((3,), BIG / 2), 0)
    state = rule.receive(state, torch.full((3,), -BIG / 2), 0.0, 1.0, 3)  # x - u = BIG
    with pytest.raises(ProtocolError, match="range"):
        rule.receive(state, torch.full((3,), -BIG), 0.0, 1.0, 3)  # x - u = 1.5 BIG
    state = rule.receive(state, torch.full((3,), -BIG / 4), 0.0, 1.0, 3)
    state = rule.receive(state, torch.full((3,), -BIG / 2), 0.0, 1.0, 3)
    assert state.version == 1 and bool(torch.isfinite(state.x).all())


def test_a_float64_fedbuff_buffer_whose_sum_overflows_is_refused_state_unchanged() -> None:
    """Each float64 update alone keeps the step in range, but their buffered sum overflows
    float64: the upload that fills the buffer is refused, the state stays."""
    rule = FedBuff(buffer=2, server_lr=1.0)
    huge = torch.full((3,), 1e308, dtype=torch.float64)
    state = rule.receive(ServerState(torch.zeros(3, dtype=torch.float64)), huge, 0.0, 1.0, 2)
    with pytest.raises(ProtocolError, match="not finite"):
        rule.receive(state, huge, 0.0, 1.0, 2)
    assert state.version == 0 and state.held == 1
    assert state.total is not None and torch.equal(state.total, huge)


@given(version=_VERSIONS, own=st.integers(0, 8), round=st.integers(0, 8))
@settings(max_examples=80, deadline=None)
def test_a_servers_answer_is_no_older_than_the_worker_and_one_version_an_upload(
    version: float, own: int, round: int
) -> None:
    try:
        taken = answer_version(own, round, version)
    except ProtocolError:
        assert not _whole_in(version, own, max(own, round + 1))
        return
    assert taken == version and own <= taken <= max(own, round + 1)


@given(
    weight=st.one_of(st.sampled_from(EXTREMES), st.floats(-2.0, 4.0)),
    applied=st.floats(0.0, 3.0),
    fill=_TENSOR_VALUES,
)
@settings(max_examples=80, deadline=None)
def test_a_running_sum_is_applied_only_if_it_grew_and_the_sum_is_finite(
    weight: float, applied: float, fill: float
) -> None:
    d = 4
    x = torch.full((1, d), 0.5)
    w = torch.tensor([0.75], dtype=torch.float64)
    sums = (
        torch.full((1, d), fill, dtype=torch.float64),
        torch.tensor([weight], dtype=torch.float64),
    )
    before = (torch.zeros(1, d, dtype=torch.float64), torch.tensor([applied], dtype=torch.float64))
    try:
        new_x, new_w = AsyncPushSum.receive(x, w, sums, before)
    except ProtocolError:
        assert torch.equal(x, torch.full((1, d), 0.5)) and float(w[0]) == 0.75
        assert not (math.isfinite(weight) and weight >= applied and abs(fill) < 1e30)
        return
    assert math.isfinite(weight) and weight >= applied and math.isfinite(fill)
    assert new_x.dtype == x.dtype and bool(torch.isfinite(new_x).all())
    assert float(new_w[0]) == 0.75 + (weight - applied) > 0


def test_push_sum_admit_bounds_the_weight_by_what_the_pushes_carry() -> None:
    sums = torch.tensor([[1.0, 2.0], [1.0, 9.0]], dtype=torch.float64)
    applied = torch.zeros_like(sums)
    assert AsyncPushSum.admit(sums, applied, 8.0).tolist() == [True, False]
    assert AsyncPushSum.admit(sums, sums + 1e-9).tolist() == [False, False]  # shrank


@given(fill=_TENSOR_VALUES, shape=st.sampled_from([(5,), (4,), (5, 1)]))
@settings(max_examples=40, deadline=None)
def test_an_adpsgd_pair_is_averaged_only_if_finite(fill: float, shape: tuple[int, ...]) -> None:
    mine = torch.full((5,), BIG * 0.75)
    theirs = torch.full(shape, fill)
    try:
        mean = ADPSGD.pair(mine, theirs)
    except ProtocolError:
        assert torch.equal(mine, torch.full((5,), BIG * 0.75))
        assert shape != (5,) or not math.isfinite(fill) or fill >= BIG * 0.25
        return
    assert shape == (5,) and torch.equal(mean, ADPSGD.average(mine, theirs))


def test_adpsgd_batched_pairs_refuse_a_pair_whose_average_overflows() -> None:
    x = torch.tensor([[BIG], [BIG], [1.0], [3.0]])
    kept = ADPSGD.average_pairs(x, [0, 2, 1], [1, 3, 2])
    assert kept.tolist() == [False, True, True]  # BIG + BIG overflows: refused
    assert x[:, 0].tolist() == [BIG, (BIG + 2.0) * 0.5, (BIG + 2.0) * 0.5, 2.0]


# --- the event engine refuses as the rules do ----------------------------------------------


def _network(algorithm: str, graph: str, *extra: str) -> EventNetwork:
    overrides = [
        f"algorithm.name={algorithm}",
        f"topology.kind={graph}",
        "topology.nodes=4",
        "time.step_s=0.1",
        "run.rounds=2",
        *extra,
    ]
    return EventNetwork(prepare_run(load_config(None, overrides)))


def test_the_event_engine_refuses_as_the_rules_do_counted_state_unchanged() -> None:
    pairs = _network("adpsgd", "ring", "topology.undirected=true")
    group = torch.arange(pairs.n)
    pairs.x[:] = BIG  # every pair's average overflows: every request refused
    before = pairs.x.clone()
    pairs._average(group)
    assert torch.equal(pairs.x, before)
    assert int(pairs._rejected.sum()) == pairs.n  # one a pair, at the partner asked

    pushes = _network("async-push-sum", "exponential")
    d, edge = pushes.d, 0
    dst = int(pushes.graph.dst[edge])
    x, w, applied = pushes.x.clone(), pushes.w.clone(), pushes.applied.clone()
    huge = torch.cat(
        [torch.full((d,), 1e300, dtype=torch.float64), torch.ones(1, dtype=torch.float64)]
    )
    for payload in (torch.full((d + 1,), math.nan, dtype=torch.float64), huge):
        pushes.seq += 1
        pushes.payloads[pushes.seq] = payload
        heapq.heappush(pushes.flight, (0.0, pushes.seq, edge))
        pushes._arrivals(0.0)
    assert torch.equal(pushes.x, x) and torch.equal(pushes.w, w)
    assert torch.equal(pushes.applied, applied)
    assert pushes._rejected.tolist() == [2 if i == dst else 0 for i in range(pushes.n)]

    server = _network("fedbuff", "star", "algorithm.buffer=1", "algorithm.server_lr=1e6")
    assert server.server is not None
    server.x[1] = BIG / 2  # a worker's model: its update steps the server out of range
    served = server.served
    server._upload(torch.tensor([1]))
    assert server.served is served and int(server._rejected[server.server]) == 1
    figures = server.run_round()  # honest uploads are still taken
    assert server.served.version > 0 and figures.rejected[server.server] >= 1


# --- a real peer: refused where it takes a message, counted, state unchanged -----------------


def _setup(algorithm: str, graph: str, *extra: str) -> RunSetup:
    overrides = [
        f"algorithm.name={algorithm}",
        f"topology.kind={graph}",
        "topology.nodes=3",
        "run.rounds=4",
        "transport.deadline_s=0.05",
        "transport.strict_timeout_s=0.2",
        *extra,
    ]
    return prepare_run(load_config(None, overrides))


def _message(
    setup: RunSetup,
    sender: str,
    receiver: str,
    tensor: torch.Tensor,
    *,
    round: int = 0,
    phase: int = 0,
    codec: Any = None,
    **scalars: float,
) -> Message:
    encoded = (codec or RawCodec()).encode(tensor)
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


def _peers(setup: RunSetup, *nodes: str) -> tuple[InProcessNetwork, dict[str, AsyncPeer]]:
    network = InProcessNetwork()
    return network, {v: setup.make_async_peer(v, network.endpoint(v)) for v in nodes}


def _deliver(peer: AsyncPeer, message: Message) -> None:
    """Into the mailbox without the arrival check: as a message that was fine on arrival
    and is impossible by the time it is taken."""
    transport = getattr(peer.transport, "inner", peer.transport)
    transport._receive(message)


@pytest.mark.parametrize("kind", ["fedbuff", "fedasync"])
@pytest.mark.parametrize("version", [1e9, 1.0, -1.0, 0.5, math.nan, 2.0**63])
def test_a_server_peer_refuses_an_upload_ahead_of_it_and_lives(kind: str, version: float) -> None:
    """The filed defect at the peer: the upload's version is refused on arrival and where
    it is taken; the server stops on its timeout holding its first model and version."""
    setup = _setup(kind, "star")
    _, peers = _peers(setup, "server", "n0")
    server = peers["server"]
    upload = _message(
        setup, "n0", "server", torch.ones(server.d), codec=server.codec, version=version
    )
    with pytest.raises(ProtocolError, match="version"):
        server.validate(upload)
    _deliver(server, upload)
    start = server.x.clone()
    asyncio.run(server.run(4))
    assert server.version == 0 and torch.equal(server.x, start)
    assert server.transport.stats.messages_rejected == 1


def test_a_server_peer_takes_only_a_version_it_told_that_worker() -> None:
    setup = _setup("fedasync", "star")
    _, peers = _peers(setup, "server", "n0", "n1")
    server = peers["server"]
    one = torch.ones(server.d)
    server.version, server._told = 5, {"n0": 5}  # n1 was never told a version
    server.validate(_message(setup, "n0", "server", one, codec=server.codec, version=5.0))
    with pytest.raises(ProtocolError, match="version"):
        server.validate(_message(setup, "n1", "server", one, codec=server.codec, version=1.0))
    for scalars in ({}, {"version": 0.0, "extra": 1.0}):
        with pytest.raises(ProtocolError, match="scalars"):
            server.validate(_message(setup, "n1", "server", one, codec=server.codec, **scalars))
    with pytest.raises(ProtocolError, match="phase"):  # nobody takes it: a busy loop before
        server.validate(
            _message(setup, "n1", "server", one, codec=server.codec, phase=1, version=0.0)
        )
    last = server._last_round("n1")
    assert last == setup.config.run.rounds - 1
    with pytest.raises(ProtocolError, match="round"):
        server.validate(
            _message(setup, "n1", "server", one, codec=server.codec, round=last + 1, version=0.0)
        )


@pytest.mark.parametrize("version", [math.nan, -1.0, 2.0, 0.5, 1e300])
def test_a_worker_refuses_an_answer_with_an_impossible_version(version: float) -> None:
    setup = _setup("fedbuff", "star")
    _, peers = _peers(setup, "server", "n0")
    worker = peers["n0"]
    worker.version = 1
    answer = _message(
        setup, "server", "n0", torch.ones(worker.d), codec=worker.codec, version=version
    )
    with pytest.raises(ProtocolError, match="version"):
        worker.validate(answer)  # round 0: at most version 1, and no older than the worker's 1
    _deliver(worker, answer)
    mine = worker.x.clone()
    asyncio.run(worker._upload(0, mine))
    assert worker.version == 1 and torch.equal(worker.x, mine)
    assert worker.transport.stats.messages_rejected == 1
    worker.validate(
        _message(setup, "server", "n0", torch.ones(worker.d), codec=worker.codec, version=1.0)
    )


@pytest.mark.parametrize(
    ("tensor", "round"),
    [
        ("nan", 0),
        ("shrunk", 1),  # a weight below the one applied from that edge
        ("heavy", 0),  # a weight more than one push carries
        ("huge", 1),  # finite, but x + gain overflows float32
        ("good", 9),  # a round past the run's
    ],
)
def test_a_push_sum_peer_refuses_impossible_running_sums(tensor: str, round: int) -> None:
    setup = _setup("async-push-sum", "exponential")
    _, peers = _peers(setup, "n0", "n1", "n2")
    peer = peers["n0"]
    sender = peer.ins[0]
    d = peer.d
    peer._applied[sender] = torch.cat([torch.zeros(d), torch.tensor([0.5])]).double()
    f64 = torch.float64

    def running(fill: float, weight: float) -> torch.Tensor:
        return torch.cat([torch.full((d,), fill, dtype=f64), torch.tensor([weight], dtype=f64)])

    sums = {
        "nan": running(math.nan, math.nan),
        "shrunk": running(0.0, 0.25),
        "heavy": running(0.0, 4.0),  # 1 push, N = 3
        "huge": running(1e300, 1.0),
        "good": running(0.0, 1.0),
    }[tensor]
    message = _message(setup, sender, "n0", sums, round=round)
    with pytest.raises(ProtocolError):  # on arrival (huge: x + gain overflows float32)
        peer.validate(message)
    x, w, applied = peer.x.clone(), peer.w, peer._applied[sender].clone()
    _deliver(peer, message)
    peer._absorb()
    assert torch.equal(peer.x, x) and peer.w == w and torch.equal(peer._applied[sender], applied)
    assert peer.transport.stats.messages_rejected == 1
    if round < 3:  # (a taken message's round is the edge's newest: a later one is next)
        good = torch.cat([torch.full((d,), 0.25), torch.tensor([1.0])]).double()
        _deliver(peer, _message(setup, sender, "n0", good, round=3))
        peer._absorb()  # an honest one is still taken
        assert peer.w == w + 0.5 and peer.transport.stats.messages_rejected == 1


def test_an_adpsgd_peer_refuses_requests_and_replies_it_cannot_have_and_averages_none() -> None:
    setup = _setup("adpsgd", "ring", "topology.undirected=true")
    _, peers = _peers(setup, "n0", "n1", "n2")
    peer = peers["n0"]
    d, codec = peer.d, peer.codec
    k = 0
    partner = peer._partner("n0", k)
    other = next(v for v in peer.partners if v != partner)
    # a neighbour whose partner n0 is in one of its rounds, and one whose partner it is not
    asks = next((v, j) for j in range(4) for v in ("n1", "n2") if peer._partner(v, j) == "n0")
    not_asks = next((v, j) for j in range(4) for v in ("n1", "n2") if peer._partner(v, j) != "n0")
    bad = [
        _message(setup, partner, "n0", torch.ones(d), codec=codec, phase=1, round=1),  # ahead
        _message(setup, other, "n0", torch.ones(d), codec=codec, phase=1),  # not the partner
        _message(setup, partner, "n0", torch.ones(d), codec=codec, phase=2),
        _message(setup, partner, "n0", torch.ones(d), codec=codec, phase=1, version=0.0),
        _message(setup, partner, "n0", torch.full((d,), math.nan), codec=codec, phase=1),
        _message(setup, not_asks[0], "n0", torch.ones(d), codec=codec, round=not_asks[1]),
        _message(setup, asks[0], "n0", torch.ones(d), codec=codec, round=4),  # past the run
    ]
    for message in bad:
        with pytest.raises(ProtocolError):
            peer.validate(message)
    peer.validate(_message(setup, asks[0], "n0", torch.ones(d), codec=codec, round=asks[1]))
    peer.validate(_message(setup, partner, "n0", torch.ones(d), codec=codec, phase=1))
    # Taken: a reply whose average overflows, and a request whose average overflows.
    peer.x = torch.full((d,), BIG)
    mine = peer.x.clone()
    _deliver(peer, _message(setup, partner, "n0", torch.full((d,), BIG), codec=codec, phase=1))
    asyncio.run(peer._pair(k))
    assert torch.equal(peer.x, mine) and peer.transport.stats.messages_rejected == 1

    async def answer_briefly() -> None:
        task = asyncio.create_task(peer._answer())
        await asyncio.sleep(0.05)
        task.cancel()

    big = torch.full((d,), BIG)
    _deliver(peer, _message(setup, asks[0], "n0", big, codec=codec, round=asks[1]))
    sent = peer.transport.stats.messages_sent
    asyncio.run(answer_briefly())
    assert torch.equal(peer.x, mine)
    assert peer.transport.stats.messages_rejected == 2
    assert peer.transport.stats.messages_sent == sent  # no reply to a refused request
