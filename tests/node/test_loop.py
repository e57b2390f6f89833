"""The node loop over the in-process transport: determinism, waiting modes, validation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import replace

import pytest
import torch

from fedcore.errors import ProtocolError, TransportTimeoutError
from fedcore.messages import EncodedTensor, Message
from fedcore.metrics import params_sha256
from fedcore.testing import TestNetwork, make_network
from fedcore.transport import InProcessTransport


class Tamper:
    """Wraps a transport; ``rule(message)`` returns the message to send, or None to drop it."""

    def __init__(
        self, inner: InProcessTransport, rule: Callable[[Message], Message | None]
    ) -> None:
        self.inner = inner
        self.rule = rule
        self.node_id = inner.node_id
        self.stats = inner.stats

    async def send(self, message: Message) -> None:
        changed = self.rule(message)
        if changed is not None:
            await self.inner.send(changed)

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        return await self.inner.collect(round, phase, senders, timeout)

    async def close(self) -> None:
        await self.inner.close()


def _tamper(net: TestNetwork, node: str, rule: Callable[[Message], Message | None]) -> None:
    n = net.nodes[node]
    assert isinstance(n.transport, InProcessTransport)
    n.transport = Tamper(n.transport, rule)


def _small(algorithm: str = "ops", spec: str = "social:6", **settings: object) -> TestNetwork:
    base: dict[str, object] = {"data.batch_size": 8, "algorithm.lr": 0.1}
    base.update(settings)
    return make_network(spec, algorithm=algorithm, settings=base)


def test_messages_flow_only_along_trust_edges() -> None:
    net = _small().run(3)
    graph = net.graph.at(0)
    edges = set(graph.edges())
    assert net.messages, "OPS must communicate"
    assert {(m.sender, m.receiver) for m in net.messages} == edges
    assert len(net.messages_at(1)) == len(edges)
    assert all(m.run == net.network.run_id for m in net.messages)


@pytest.mark.parametrize(
    "algorithm,spec",
    [("ops", "social:6"), ("dpsgd", "ring:5"), ("central", "social:5"), ("local", "ring:4")],
)
def test_runs_are_deterministic(algorithm: str, spec: str) -> None:
    a = _small(algorithm, spec).run(5)
    b = _small(algorithm, spec).run(5)
    for nid in a.nodes:
        assert params_sha256(a.nodes[nid].model()) == params_sha256(b.nodes[nid].model())


def test_run_in_steps_equals_run_at_once() -> None:
    a = _small().run(2).run(3)
    b = _small().run(5)
    assert all(torch.equal(a.models()[n], b.models()[n]) for n in a.nodes)


def test_ops_conserves_omega_over_the_network() -> None:
    net = _small("ops", "social:8").run(6)
    assert sum(n.state.omega for n in net.nodes.values()) == pytest.approx(8.0, abs=1e-9)


def test_strict_mode_names_the_missing_peer() -> None:
    net = _small(**{"transport.strict_timeout_s": 0.2})
    _tamper(net, "n1", lambda m: None)  # n1's messages never arrive
    with pytest.raises(TransportTimeoutError, match="n1"):
        net.run(1)


def test_deadline_mode_proceeds_and_counts_missing() -> None:
    net = _small(**{"transport.mode": "deadline", "transport.deadline_s": 0.05})
    records = []
    for node in net.nodes.values():
        node.observer = lambda _n, r: records.append(r)
    _tamper(net, "n1", lambda m: None)
    net.run(2)
    receivers = set(net.graph.at(0).out_neighbours("n1"))
    # Round 0: exactly n1's receivers miss it. (Later rounds may also miss the messages of
    # those receivers, which waited out the deadline for n1 and so run a deadline behind.)
    missing = {(r.node, r.missing) for r in records if r.messages_missing and r.round == 0}
    assert {node for node, _ in missing} == receivers
    assert all(names == ("n1",) for _, names in missing)
    assert all("n1" in r.missing for r in records if r.node in receivers)


def _corrupt_tensor(message: Message, **changes: object) -> Message:
    tensors = {k: replace(v, **changes) for k, v in message.tensors.items()}  # type: ignore[arg-type]
    return replace(message, tensors=tensors)


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(lambda m: _corrupt_tensor(m, data=m.tensors["x"].data[:-4]), id="truncated"),
        pytest.param(
            lambda m: _corrupt_tensor(
                m, data=torch.full((m.tensors["x"].shape[0],), float("nan")).numpy().tobytes()
            ),
            id="non-finite",
        ),
        pytest.param(lambda m: _corrupt_tensor(m, shape=(1, m.tensors["x"].shape[0])), id="shape"),
        pytest.param(
            lambda m: _corrupt_tensor(m, dtype="float64", data=m.tensors["x"].data * 2), id="dtype"
        ),
        pytest.param(lambda m: replace(m, run="other-run"), id="fingerprint"),
        pytest.param(lambda m: _corrupt_tensor(m, codec="bogus"), id="codec"),
    ],
)
def test_invalid_messages_are_rejected_not_mixed(rule: Callable[[Message], Message]) -> None:
    net = _small(**{"transport.mode": "deadline", "transport.deadline_s": 0.05})
    rejected: dict[str, int] = {}
    for node in net.nodes.values():
        node.observer = lambda n, r: rejected.__setitem__(
            n.id, rejected.get(n.id, 0) + r.messages_rejected
        )
    _tamper(net, "n1", rule)
    net.run(2)
    receivers = net.graph.at(0).out_neighbours("n1")
    assert receivers
    assert {n for n, count in rejected.items() if count} == set(receivers)
    for r in receivers:
        assert rejected[r] == 2
        assert torch.isfinite(net.nodes[r].model()).all()


def test_invalid_message_in_strict_mode_fails_naming_sender_and_reason() -> None:
    net = _small()
    _tamper(net, "n1", lambda m: replace(m, run="other-run"))
    with pytest.raises(ProtocolError, match=r"'n1' was rejected: message of run other-run"):
        net.run(1)


def test_float64_harness_and_own_algorithm_object() -> None:
    """Users can pass their own algorithm object (a rule) and run in float64."""
    from fedcore.algorithms.ops import PushSumRule

    class HalfStepOPS(PushSumRule):
        name = "half-step-ops"

    net = make_network("ring:4", algorithm=HalfStepOPS(), settings={"model.dtype": "float64"})
    net.run(2)
    assert net.network.algorithm.name == "half-step-ops"
    assert all(m.dtype == torch.float64 for m in net.models().values())
    assert all(t.dtype == "float64" for m in net.messages for t in m.tensors.values())


def test_encoded_bytes_are_snapshots() -> None:
    """Changing a node's state after sending never changes a message already sent."""
    net = _small().run(1)
    sent = [bytes(m.tensors["x"].data) for m in net.messages]
    for node in net.nodes.values():
        node.state.x.add_(1000.0)
    assert [m.tensors["x"].data for m in net.messages] == sent
    assert all(isinstance(m.tensors["x"], EncodedTensor) for m in net.messages)


def test_deadline_in_asyncio_does_not_block_other_nodes() -> None:
    """A node waiting on a deadline yields to the others (single event loop)."""
    net = _small(**{"transport.mode": "deadline", "transport.deadline_s": 0.02})
    _tamper(net, "n2", lambda m: None)
    asyncio.run(net.network.run_async(3))
    assert net.round == 3


@pytest.mark.parametrize("algorithm,spec", [("ops", "social:8"), ("dpsgd", "torus:3x3")])
def test_shared_decoding_changes_nothing(algorithm: str, spec: str) -> None:
    """Receivers sharing one decoded tensor get bit-identical results (inboxes are read-only)."""
    from fedcore.engines.messages import build_network
    from fedcore.topology import parse_spec

    config = _small(algorithm, spec).config
    results = []
    for share in (True, False):
        net = build_network(config, trust=parse_spec(spec), share_decoded=share)
        net.run(4)
        results.append({n: params_sha256(node.model()) for n, node in net.nodes.items()})
    assert results[0] == results[1]


def dropout_model(*, input_dim: int, num_classes: int) -> torch.nn.Module:
    """A user model with its own randomness (dropout)."""
    return torch.nn.Sequential(
        torch.nn.Linear(input_dim, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, num_classes)
    )


def test_models_with_dropout_replay_exactly() -> None:
    """The global torch generator is seeded by the run seed, so dropout replays too."""
    digests = []
    for _ in range(2):
        torch.manual_seed(12345)  # whatever state the caller left behind
        torch.rand(7)
        net = make_network("ring:4", model="tests.node.test_loop:dropout_model").run(3)
        digests.append({n: params_sha256(m) for n, m in net.models().items()})
    assert digests[0] == digests[1]


class SlowLink(Tamper):
    """Sends to ``dst`` take ``seconds``, then ``outcome`` happens (None: delivered)."""

    def __init__(
        self, inner: InProcessTransport, dst: str, seconds: float, outcome: Exception | None
    ) -> None:
        super().__init__(inner, lambda m: m)
        self.dst, self.seconds, self.outcome = dst, seconds, outcome

    async def send(self, message: Message) -> None:
        if message.receiver == self.dst:
            await asyncio.sleep(self.seconds)
            if self.outcome is not None:
                raise self.outcome
        await self.inner.send(message)


def _slow_link(net: TestNetwork, src: str, seconds: float, outcome: Exception | None) -> str:
    node = net.nodes[src]
    assert isinstance(node.transport, InProcessTransport)
    dst = sorted(net.graph.at(0).out_neighbours(src))[0]
    node.transport = SlowLink(node.transport, dst, seconds, outcome)
    return dst


def test_deadline_sends_run_past_the_deadline_and_are_accounted_for() -> None:
    """A send slower than the deadline neither holds up the round nor goes uncounted: the
    receiver gets no second message while one is on its way, and every send that ended
    before the last round is in the records (a slow one in a later round's)."""
    net = _small(**{"transport.mode": "deadline", "transport.deadline_s": 0.05})
    records = []
    for node in net.nodes.values():
        node.observer = lambda _n, r: records.append(r)
    dst = _slow_link(net, "n1", 0.12, None)
    net.run(6)
    mine = [r for r in records if r.node == "n1"]
    skipped = [r.round for r in mine if dst in r.unreachable]
    assert skipped, "a receiver with a message on its way must get none"
    assert all(r.wall_s < 0.05 * 2 + 0.1 for r in mine[1:])  # never the slow send's 0.12 s
    size = 4 * net.nodes["n1"].model().numel()  # every OPS message carries one model
    sent = net.nodes["n1"].transport.stats.messages_sent
    # All but possibly the last, which may end after the last round (in finish_sending).
    assert size * (sent - 1) <= sum(r.fp32_bytes_sent for r in mine) <= size * sent


def test_a_refusal_that_ends_after_the_deadline_still_stops_the_node() -> None:
    """A send refused (not unreachable) after the deadline is not lost with its task."""
    net = _small(**{"transport.mode": "deadline", "transport.deadline_s": 0.05})
    _slow_link(net, "n1", 0.08, ProtocolError("refused by the receiver"))
    with pytest.raises(ProtocolError, match="refused by the receiver"):
        net.run(5)
