"""Contract: every registered algorithm declares what it sends, and a node refuses the rest.

For every algorithm of the registry, a real message of each phase (recorded from a run) is
accepted by its receiver's ``Node.validate``, and every malformed variant of it (a tensor or
scalar removed, added, renamed, retyped, reshaped, set to an impossible value; another phase;
a round beyond the window) is refused with a ProtocolError, never another exception. In
strict mode such a message stops the receiver with a ProtocolError naming the sender; in
deadline mode it is counted as rejected and the run goes on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore import registry
from fedcore.algorithms import ALGORITHMS, OPS, RoundContext
from fedcore.errors import AlgorithmError, OutOfWindowError, ProtocolError
from fedcore.messages import EncodedTensor, Message, Payload
from fedcore.node import NodeRule
from fedcore.testing import TestNetwork, make_network

CASES: dict[str, tuple[str, str, dict[str, object]]] = {
    "ops": ("ops", "social:5", {}),
    "clipped-push-sum": ("clipped-push-sum", "social:5", {}),
    "ops-robust": ("ops", "social:5", {"algorithm.robust": True}),
    "ops-robust-f64": (
        "ops",
        "social:5",
        {"algorithm.robust": True, "model.dtype": "float64", "compression.codec": "raw"},
    ),
    "dpsgd": ("dpsgd", "ring:4", {}),
    "dsgt": ("dsgt", "ring:4", {}),
    "push-pull": ("push-pull", "social:5", {}),
    "push-pull-robust": ("push-pull", "social:5", {"algorithm.robust": True}),
    "push-diging": ("push-diging", "social:5", {}),
    "push-diging-robust": ("push-diging", "social:5", {"algorithm.robust": True}),
    "exact-diffusion": ("exact-diffusion", "ring:4", {}),
    "dog": ("dog", "ring:4", {}),
    "clippedgossip": ("clippedgossip", "ring:4", {}),
    "trimmed-gossip": ("trimmed-gossip", "ring:4", {"algorithm.bucket": 2}),
    "median-gossip": ("median-gossip", "ring:4", {}),
    "dol": ("dol", "social:5", {}),
    "central": ("central", "ring:4", {}),
    "deepsqueeze": ("deepsqueeze", "ring:4", {"compression.codec": "sign"}),
    "choco": ("choco", "ring:4", {"compression.codec": "qsgd", "compression.scaled": True}),
    "beer": ("beer", "ring:4", {"compression.codec": "topk", "compression.ratio": 0.25}),
    "rps": ("rps", "complete:4", {}),
    "fedavg": ("fedavg", "star:4", {}),
    "doublesqueeze": ("doublesqueeze", "star:4", {"compression.codec": "sign"}),
    "apmsqueeze-warm-up": ("apmsqueeze", "star:4", {"compression.codec": "sign"}),
    "apmsqueeze": (
        "apmsqueeze",
        "star:4",
        {"compression.codec": "sign", "algorithm.precondition_rounds": 1},
    ),
}


def test_every_registered_algorithm_is_covered() -> None:
    """Every synchronous one (an asynchronous algorithm sends no round's messages yet:
    it runs on the event engine only)."""
    asynchronous = set(registry.ALGORITHMS.tagged("asynchronous"))
    assert {algo for algo, _, _ in CASES.values()} | {"local"} == set(ALGORITHMS) - asynchronous
    for name, factory in ALGORITHMS.items():
        if name in asynchronous:
            continue
        assert callable(getattr(NodeRule(factory()), "message_schema", None)), name


@functools.cache
def _network(case: str) -> TestNetwork:
    algorithm, spec, extra = CASES[case]
    net = make_network(
        spec, algorithm=algorithm, settings={"data.batch_size": 8, "algorithm.lr": 0.1, **extra}
    )
    return net.run(2)


def _samples(case: str) -> list[Message]:
    """One recorded message of each phase of round 1."""
    net = _network(case)
    by_phase: dict[int, Message] = {}
    for m in net.messages:
        if m.round == 1:
            by_phase.setdefault(m.phase, m)
    assert sorted(by_phase) == list(range(net.network.algorithm.phases))
    return [by_phase[p] for p in sorted(by_phase)]


def _validate(case: str, message: Message) -> None:
    _network(case).nodes[message.receiver].validate(message)


def _some(message: Message) -> tuple[str, EncodedTensor]:
    return next(iter(message.tensors.items()))


Mutation = Callable[[Message], Message]


def _mutations(message: Message) -> dict[str, Mutation]:
    name, enc = _some(message)
    rest = {k: v for k, v in message.tensors.items() if k != name}
    out: dict[str, Mutation] = {
        "no tensors": lambda m: replace(m, tensors={}),
        "tensor removed": lambda m: replace(m, tensors=rest),
        "tensor added": lambda m: replace(m, tensors={**m.tensors, "evil": enc}),
        "tensor renamed": lambda m: replace(m, tensors={**rest, "y": enc}),
        "tensor retyped": lambda m: replace(
            m, tensors={**m.tensors, name: replace(enc, dtype="float16")}
        ),
        "tensor reshaped": lambda m: replace(
            m, tensors={**m.tensors, name: replace(enc, shape=(math.prod(enc.shape) + 1,))}
        ),
        "tensor as a matrix": lambda m: replace(
            m, tensors={**m.tensors, name: replace(enc, shape=(1, *enc.shape))}
        ),
        "scalar added": lambda m: replace(m, scalars={**m.scalars, "extra": 1.0}),
        "empty scalar name": lambda m: replace(m, scalars={**m.scalars, "": 0.5}),
        "long scalar name": lambda m: replace(m, scalars={**m.scalars, "s" * 10_000: 0.5}),
        "phase out of range": lambda m: replace(m, phase=m.phase + 2),
        "huge phase": lambda m: replace(m, phase=2**31),
        "another run": lambda m: replace(m, run="0" * 64),
    }
    for s, value in message.scalars.items():
        others = {k: v for k, v in message.scalars.items() if k != s}
        out[f"scalar {s} removed"] = lambda m, o=others: replace(m, scalars=o)  # type: ignore[misc]
        out[f"scalar {s} renamed"] = lambda m, o=others, v=value, s=s: replace(  # type: ignore[misc]
            m, scalars={**o, s.upper(): v}
        )
        for bad in (0.0, -1.0, -0.0, math.nan, math.inf, -math.inf, 1e300):
            out[f"scalar {s} = {bad}"] = lambda m, b=bad, s=s: replace(  # type: ignore[misc]
                m, scalars={**m.scalars, s: b}
            )
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_messages_are_accepted_and_every_malformed_variant_refused(case: str) -> None:
    for message in _samples(case):
        _validate(case, message)
        for what, mutate in _mutations(message).items():
            bad = mutate(message)
            if bad == message:  # e.g. removing the only tensor of a one-tensor message twice
                continue
            with pytest.raises(ProtocolError):
                _validate(case, bad)
                pytest.fail(f"{case}: {what} was accepted")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_round_beyond_the_window_is_refused(case: str) -> None:
    message = _samples(case)[0]
    node = _network(case).nodes[message.receiver]
    window = node.round_window(message.sender)
    assert window >= 2
    for far in (node.round + window + 1, node.round + 10**6, 2**63, 2**64 - 1):
        with pytest.raises(OutOfWindowError, match="ahead of this peer's round"):
            node.validate(replace(message, round=far))


def test_the_window_is_the_strict_lead_plus_deadline_drift() -> None:
    strict = _network("ops")
    # social:5 is one-way: a sender's lead is the length of the path back to it.
    node = strict.nodes["n0"]
    graph = strict.graph.at(0)
    for sender in graph.in_neighbours("n0"):
        assert node.round_window(sender) == graph.hops_from("n0")[sender] + 1
        assert 2 <= node.round_window(sender) <= len(graph.nodes) + 1
    from fedcore.topology import build

    hops = build("directed-ring", nodes=4).hops_from("n0")
    assert hops == {"n0": 0, "n1": 1, "n2": 2, "n3": 3}
    ring = make_network(
        "ring:4", algorithm="dpsgd", settings={"transport.mode": "deadline", "data.batch_size": 8}
    )
    assert ring.nodes["n0"].round_window("n1") == 1 + 1 + 32  # neighbour, margin, drift
    # Strict with a fault plan: nodes cut off by a partition or a crash run on unheld.
    faulty = make_network(
        "ring:4",
        algorithm="dpsgd",
        settings={
            "data.batch_size": 8,
            "run.rounds": 50,
            "faults.drop": 0.1,
            "faults.partitions": [{"nodes": ["n0"], "start": 3, "end": 13}],
            "faults.crashes": [{"node": "n2", "at": 40}],
        },
    )
    assert faulty.nodes["n0"].round_window("n1") == 1 + 1 + 32 + 10 + 10


@given(
    case=st.sampled_from(sorted(CASES)),
    name=st.text(max_size=80),
    value=st.floats(allow_nan=True, allow_infinity=True),
    kind=st.sampled_from(["add tensor", "rename tensor", "add scalar", "rename scalar", "set"]),
)
@settings(max_examples=150, deadline=None)
def test_property_a_changed_field_is_refused(case: str, name: str, value: float, kind: str) -> None:
    """Any name or value drawn: a message changed that way is refused unless it is still
    exactly what the algorithm sends (then it must be accepted)."""
    message = _samples(case)[0]
    tname, enc = _some(message)
    if kind == "add tensor":
        bad = replace(message, tensors={**message.tensors, name: enc})
    elif kind == "rename tensor":
        tensors = {k: v for k, v in message.tensors.items() if k != tname}
        bad = replace(message, tensors={**tensors, name: enc})
    elif kind == "add scalar":
        bad = replace(message, scalars={**message.scalars, name: value})
    elif kind == "rename scalar" and message.scalars:
        (s, v), *_ = message.scalars.items()
        scalars = {k: x for k, x in message.scalars.items() if k != s}
        bad = replace(message, scalars={**scalars, name: v})
    elif message.scalars:
        (s, _), *_ = message.scalars.items()
        bad = replace(message, scalars={**message.scalars, s: value})
    else:
        bad = replace(message, scalars={name: value})
    if bad == message:
        _validate(case, bad)
        return
    try:
        _validate(case, bad)
    except ProtocolError:
        return
    # Accepted: only a value the schema allows for an existing scalar.
    assert kind == "set" and set(bad.scalars) == set(message.scalars)
    schema = _network(case).network.algorithm.message_schema(
        0, bad.sender, _network(case).nodes[bad.receiver]._context(bad.round)
    )
    (s, v), *_ = bad.scalars.items()
    assert schema.scalars[s].problem(v) is None


def test_robust_totals_that_go_backwards_are_refused() -> None:
    message = _samples("ops-robust")[0]
    node = _network("ops-robust").nodes[message.receiver]
    senders = node._context(message.round).in_union
    last = float(node.state.seen_omega[senders.index(message.sender)])
    assert message.scalars["omega"] <= last
    node.validate(replace(message, scalars={"omega": last}))
    with pytest.raises(ProtocolError, match="never go backwards"):
        node.validate(replace(message, scalars={"omega": last * 0.999}))


def test_push_sum_weight_bounds() -> None:
    algo = NodeRule(OPS())
    algo.init(torch.zeros(3))
    ctx = RoundContext(
        node="a", round=4, lr=0.1, self_weight=0.5, out_weights={}, in_weights={"b": 0.5},
        nodes=("a", "b", "c"),
    )  # fmt: skip
    share = algo.message_schema(0, "b", ctx).scalars["omega"]
    assert share.problem(3.0) is None and share.problem(1e-300) is None
    for bad in (0.0, -1e-9, 3.01, math.inf, math.nan):
        assert share.problem(bad) is not None
    robust = NodeRule(OPS(robust=True))
    robust.init(torch.zeros(3))
    total = robust.message_schema(0, "b", ctx).scalars["omega"]
    assert total.problem(15.0) is None and total.problem(15.1) is not None  # n * (t + 1)
    with pytest.raises(AlgorithmError, match="phase"):
        algo.message_schema(1, "b", ctx)


def test_local_accepts_no_message() -> None:
    net = make_network("ring:4", algorithm="local", settings={"data.batch_size": 8}).run(1)
    enc = _some(_samples("dpsgd")[0])[1]
    message = Message(
        run=net.network.run_id, round=1, phase=0, sender="n1", receiver="n0", tensors={"x": enc}
    )
    with pytest.raises(ProtocolError, match="sends no messages"):
        net.nodes["n0"].validate(message)


def _tampering(net: TestNetwork, victim: str, mutate: Mutation, at_round: int) -> None:
    node = net.nodes[victim]
    inner = node.transport
    original = inner.send

    async def send(message: Message) -> None:
        await original(mutate(message) if message.round == at_round else message)

    inner.send = send  # type: ignore[method-assign]


def test_strict_mode_stops_with_a_protocol_error_naming_the_sender() -> None:
    net = make_network("social:5", algorithm="ops", settings={"data.batch_size": 8})
    _tampering(net, "n1", lambda m: replace(m, scalars={}), at_round=1)
    with pytest.raises(ProtocolError, match=r"from 'n1' was rejected: its scalars are none"):
        net.run(3)


def test_deadline_mode_counts_the_malformed_message_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings_ = {"data.batch_size": 8, "transport.mode": "deadline", "transport.deadline_s": 0.05}
    net = make_network("social:5", algorithm="ops", settings=settings_)
    _tampering(
        net, "n1", lambda m: replace(m, scalars={"omega": -1.0}), at_round=1
    )  # an impossible weight
    net.run(4)
    rejected = [r for r in caplog.messages if "rejected round 1 message from n1" in r]
    assert "outside (0, 5]" in rejected[0]
    assert len(rejected) == len(net.graph.at(0).out_neighbours("n1"))
    assert all(n.round == 4 for n in net.nodes.values())


def test_inbox_payloads_keep_the_schema_names() -> None:
    """What mix sees is exactly the schema's names (a sanity check of the decode)."""
    for case in sorted(CASES):
        for message in _samples(case):
            node = _network(case).nodes[message.receiver]
            ctx = node._context(message.round)
            payload: Payload = node.intake.payload(message, node.state, ctx)
            assert set(payload.tensors) == set(message.tensors)
