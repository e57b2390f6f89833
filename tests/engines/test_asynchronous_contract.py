"""The contract between the two runtimes of an asynchronous rule, over every registry entry
tagged ``asynchronous`` (a new one is covered by registering it): the event engine
(:mod:`fedcore.engines.events`, rows in virtual time) and the real peers
(:class:`~fedcore.node.asynchronous.AsyncPeer`, over the in-process transport) run it by
what it declares (:class:`~fedcore.algorithms.asynchronous.AsynchronousRule`: its pattern,
server, message form and row functions), and end alike where the protocol makes them:

* what the rule declares is what both runtimes ask of it;
* with every message lost, every peer computes alone: each node ends with the same
  parameters, bit for bit, on both (a worker of the ``"upload"`` pattern excepted: the
  engine's worker downloads the server's model again, the real one goes on from its own);
* without faults, both keep the same books: a record a node a round, the same nodes idle,
  and as many messages sent in all (``"pair"``: as many requests; a real peer that is done
  answers only while requests keep coming). An asynchronous peer's timing is the
  machine's, so its models are not the engine's.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, get_args

import pytest
import torch

from fedcore.algorithms.asynchronous import AsynchronousRule, Carries, Pattern, is_asynchronous
from fedcore.config import load_config
from fedcore.engines.events import EventNetwork
from fedcore.node.asynchronous import AsyncPeer
from fedcore.node.records import RoundRecord
from fedcore.registry import ALGORITHMS
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.transport import InProcessNetwork

ASYNCHRONOUS = ALGORITHMS.tagged("asynchronous")
GRAPHS: dict[str, list[str]] = {  # a graph a pattern runs on
    "pair": ["topology.kind=ring", "topology.undirected=true"],
    "push": ["topology.kind=exponential"],
    "upload": ["topology.kind=star"],
}
ROW_FUNCTIONS: dict[str, tuple[str, ...]] = {  # what the runtimes call, by pattern
    "pair": ("pair", "average_pairs", "step"),
    "push": ("step", "mass", "push", "admit", "receive", "receive_rows"),
    "upload": ("step", "upload", "receive"),
}
ROUNDS = 3


def _pattern(name: str) -> str:
    pattern: str = ALGORITHMS.load(name).pattern
    return pattern


def _setup(name: str, *extra: str) -> RunSetup:
    overrides = [
        f"algorithm.name={name}",
        *GRAPHS[_pattern(name)],
        "topology.nodes=3",
        f"run.rounds={ROUNDS}",
        "time.step_s=0.001",
        "transport.deadline_s=1.0",
        "transport.strict_timeout_s=0.5",
        *extra,
    ]
    return prepare_run(load_config(None, overrides))


def _engine(setup: RunSetup) -> tuple[EventNetwork, list[RoundRecord]]:
    net = EventNetwork(setup)
    records = []
    for _ in range(ROUNDS):
        records += net.records(net.run_round(), setup.options.lr)
    return net, records


def _peers(setup: RunSetup) -> tuple[dict[str, AsyncPeer], list[RoundRecord]]:
    network = InProcessNetwork()
    records: list[RoundRecord] = []

    def observe(_peer: Any, record: RoundRecord) -> None:
        records.append(record)

    peers = {
        v: setup.make_async_peer(v, network.endpoint(v), observer=observe)
        for v in setup.graph.nodes
    }

    async def main() -> None:
        await asyncio.gather(*(peer.run(ROUNDS) for peer in peers.values()))

    asyncio.run(main())
    return peers, records


def test_an_entry_is_tagged_asynchronous_exactly_when_its_rule_declares_it() -> None:
    assert {"adpsgd", "async-push-sum", "fedbuff", "fedasync"} <= set(ASYNCHRONOUS)
    for name in ALGORITHMS.names:
        factory = ALGORITHMS.load(name)
        declared = isinstance(factory, type) and issubclass(factory, AsynchronousRule)
        assert declared == (name in ASYNCHRONOUS), name


@pytest.mark.parametrize("name", ASYNCHRONOUS)
def test_the_rule_declares_what_both_runtimes_ask_of_it(name: str) -> None:
    rule = _setup(name).algorithm
    assert is_asynchronous(rule)
    pattern = rule.pattern  # type: ignore[attr-defined]
    assert pattern in get_args(Pattern) and pattern in GRAPHS and pattern in ROW_FUNCTIONS
    assert rule.asynchronous is True  # type: ignore[attr-defined]
    assert (rule.server is not None) == (pattern == "upload")  # type: ignore[attr-defined]
    carries = rule.carries  # type: ignore[attr-defined]
    assert isinstance(carries, Carries) and 0 in carries.phases
    for function in ROW_FUNCTIONS[pattern]:
        assert callable(getattr(rule, function)), function
    x = torch.randn(2, 5)
    w = torch.tensor([1.0, 0.5], dtype=torch.float64)
    model = rule.model(x, w)  # type: ignore[attr-defined]
    assert model.shape == x.shape and model.dtype == x.dtype
    assert torch.equal(rule.model(x, torch.ones(2, dtype=torch.float64)), x)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ASYNCHRONOUS)
def test_with_every_message_lost_both_runtimes_end_with_the_same_parameters(name: str) -> None:
    engine, _ = _engine(_setup(name, "faults.drop=1.0"))
    setup = _setup(name, "faults.drop=1.0", "transport.deadline_s=0.01")
    peers, records = _peers(setup)
    models = engine.models()
    server = engine.algorithm.server
    for i, node in enumerate(setup.graph.nodes):
        if server is not None and node != server:
            continue  # the engine's worker downloads again; the real one goes on alone
        assert torch.equal(peers[node].model(), models[i]), node
    assert all(r.messages_received == 0 and r.messages_rejected == 0 for r in records)


@pytest.mark.parametrize("name", ASYNCHRONOUS)
def test_without_faults_both_runtimes_keep_the_same_books(name: str) -> None:
    setup = _setup(name)
    engine, simulated = _engine(setup)
    peers, real = _peers(_setup(name))

    def books(records: list[RoundRecord]) -> dict[str, list[tuple[int, bool]]]:
        out: dict[str, list[tuple[int, bool]]] = {v: [] for v in setup.graph.nodes}
        for r in sorted(records, key=lambda r: (r.node, r.round)):
            out[r.node].append((r.round, r.idle))
        return out

    assert books(simulated) == books(real)
    assert {v: len(b) for v, b in books(real).items()} == dict.fromkeys(setup.graph.nodes, ROUNDS)
    sent = sum(r.messages_sent for r in real)
    if _pattern(name) == "pair":  # every request goes; a reply only while its peer answers
        # (a peer done with its rounds answers until transport.deadline_s without a request)
        computations = ROUNDS * len(setup.graph.nodes)
        assert computations <= sent <= sum(r.messages_sent for r in simulated)
    else:
        assert sent == sum(r.messages_sent for r in simulated)
    assert all(r.messages_rejected == 0 for r in simulated + real)
    for node, peer in peers.items():
        assert bool(torch.isfinite(peer.model()).all()), node
    assert bool(torch.isfinite(engine.models()).all())
    assert all(math.isfinite(r.loss) for r in real if not r.idle)
