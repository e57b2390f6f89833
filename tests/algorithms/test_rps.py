"""RPS invariants (reference/algorithms.md section 4, I-RPS-1..5) with simulated message loss.

The n workers are simulated in a loop with hand-built inboxes and no transport: every
message of every phase is dropped independently with probability ``p``, drawn from a seeded
numpy generator in a fixed (phase, receiver, sender) order, so a seed fixes the run.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import RPS, RoundContext, RPSState, make_algorithm
from fedcore.algorithms.rps import RPSRule, block_bounds, block_sizes
from fedcore.compression import Codec, get_codec
from fedcore.config import TopologyConfig
from fedcore.errors import AlgorithmError, ConfigError, TopologyError
from fedcore.messages import Payload
from fedcore.node import NodeRule
from fedcore.setup.graph import build_topology, communication_graph
from fedcore.testing import lockstep, make_network
from fedcore.topology import Schedule, TrustGraph, complete, parse_spec, prepare, ring

Keep = Callable[[str, str, int], bool]
"""``keep(sender, receiver, phase)``: whether that message arrives."""


def _nodes(n: int) -> tuple[str, ...]:
    return tuple(f"n{i}" for i in range(n))


def _ctx(
    node: str, nodes: tuple[str, ...], t: int, lr: float, codec: Codec | None = None
) -> RoundContext:
    n = len(nodes)
    others = {v: 1.0 / n for v in nodes if v != node}
    return RoundContext(
        node=node,
        round=t,
        lr=lr,
        self_weight=1.0 / n,
        out_weights=others,
        in_weights=others,
        nodes=nodes,
        codec=codec,
    )


def _coin(p: float, rng: np.random.Generator) -> Keep:
    """Keep each message with probability ``1 - p``, one draw per message in call order."""
    return lambda _s, _r, _phase: bool(rng.random() >= p)


@dataclass
class RoundLog:
    """What one simulated round did."""

    x_half: dict[str, torch.Tensor]
    sent: list[int]  # messages per phase
    dropped: list[int]


def _round(
    algo: NodeRule,
    states: dict[str, RPSState],
    grads: dict[str, torch.Tensor],
    t: int,
    lr: float,
    keep: Keep,
    codec: Codec | None = None,
) -> RoundLog:
    """Run one round of every node in ``states`` (updated in place) and log it.

    Checks on the way that every message has the form ``message_schema`` announces,
    that messages go exactly to those who expect them, and that no inbox tensor is
    modified by ``mix``.
    """
    nodes = tuple(states)
    ctxs = {n: _ctx(n, nodes, t, lr, codec) for n in nodes}
    outboxes: dict[str, dict[str, Payload]] = {}
    for n in nodes:
        states[n], out = algo.step(states[n], grads[n], ctxs[n])
        outboxes[n] = dict(out)
    log = RoundLog({n: states[n].x[0].clone() for n in nodes}, [], [])
    for phase in range(algo.phases):
        sent = dropped = 0
        expected = {(s, n) for n in nodes for s in algo.expected_senders(phase, ctxs[n])}
        assert expected == {(s, dst) for s, out in outboxes.items() for dst in out}
        new_outboxes: dict[str, dict[str, Payload]] = {}
        for n in nodes:
            inbox: dict[str, Payload] = {}
            for s in sorted(algo.expected_senders(phase, ctxs[n])):
                payload = outboxes[s][n]
                (name, tensor), *_ = payload.tensors.items()
                if not isinstance(tensor, torch.Tensor):  # encoded by the sender itself
                    payload = Payload({name: get_codec(tensor.codec).decode(tensor)})
                    tensor = payload.tensor(name)
                schema = algo.message_schema(phase, s, ctxs[n])
                assert schema.tensors == {name: tuple(tensor.shape)} and not payload.scalars
                sent += 1
                if keep(s, n, phase):
                    inbox[s] = payload
                else:
                    dropped += 1
            before = {s: p.tensor(next(iter(p.tensors))).clone() for s, p in inbox.items()}
            states[n], out = algo.mix(states[n], phase, inbox, ctxs[n])
            new_outboxes[n] = dict(out)
            for s, p in inbox.items():
                assert torch.equal(p.tensor(next(iter(p.tensors))), before[s]), "inbox modified"
        outboxes = new_outboxes
        log.sent.append(sent)
        log.dropped.append(dropped)
    assert all(not out for out in outboxes.values())
    assert all(s.y.numel() == 0 for s in states.values())
    return log


def _quadratic(targets: dict[str, torch.Tensor]) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """Gradients of ``f_i(x) = 0.5 * ||x - c_i||^2``."""
    return lambda node, x: x - targets[node]


def _setup(
    n: int, shape: Sequence[int], seed: int
) -> tuple[NodeRule, dict[str, RPSState], dict[str, torch.Tensor]]:
    """An RPS object, per-node random float64 starting points and quadratic targets."""
    gen = torch.Generator().manual_seed(seed)
    algo = NodeRule(RPS())
    nodes = _nodes(n)
    states = {v: algo.init(torch.randn(*shape, generator=gen, dtype=torch.float64)) for v in nodes}
    targets = {v: torch.randn(*shape, generator=gen, dtype=torch.float64) for v in nodes}
    return algo, states, targets


def _run(
    n: int, shape: Sequence[int], p: float, seed: int, rounds: int, lr: float = 0.3
) -> tuple[dict[str, RPSState], list[RoundLog]]:
    algo, states, targets = _setup(n, shape, seed)
    grad = _quadratic(targets)
    keep = _coin(p, np.random.default_rng(seed))
    logs = []
    for t in range(rounds):
        grads = {v: grad(v, algo.model(s)) for v, s in states.items()}
        logs.append(_round(algo, states, grads, t, lr, keep))
    return states, logs


# --- I-RPS-1: no loss is all-reduce SGD ---------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "shape"), [(2, (5,)), (3, (7,)), (4, (8,)), (5, (3,)), (6, (13,)), (3, (12,))]
)
def test_no_loss_is_all_reduce_sgd(n: int, shape: tuple[int, ...]) -> None:
    """I-RPS-1: with p = 0 every node holds exactly mean_i x_half_i after each round, and the
    trajectory is all-reduce SGD x <- mean_i (x - lr * g_i(x))."""
    lr = 0.3
    algo, states, targets = _setup(n, shape, seed=n)
    grad = _quadratic(targets)
    keep = _coin(0.0, np.random.default_rng(0))
    reference: torch.Tensor | None = None
    for t in range(8):
        grads = {v: grad(v, algo.model(s)) for v, s in states.items()}
        log = _round(algo, states, grads, t, lr, keep)
        assert log.dropped == [0, 0]
        mean_half = torch.stack(list(log.x_half.values())).mean(0)
        first = states["n0"].x[0]
        assert first.shape == shape
        for s in states.values():
            assert torch.equal(s.x[0], first)  # bit-identical replicas
        torch.testing.assert_close(first, mean_half)
        if reference is None:  # the nodes start apart; from round 1 on they agree
            reference = mean_half
        else:
            reference = torch.stack([reference - lr * grad(v, reference) for v in states]).mean(0)
        torch.testing.assert_close(first, reference)


@pytest.mark.parametrize("codec", ["fp16", "sign"])
def test_no_loss_replicas_identical_under_a_lossy_codec(codec: str) -> None:
    """The owner keeps exactly what receivers decode, so replicas agree bit for bit."""
    algo, states, targets = _setup(4, (10,), seed=5)
    grad = _quadratic(targets)
    keep = _coin(0.0, np.random.default_rng(0))
    for t in range(3):
        grads = {v: grad(v, algo.model(s)) for v, s in states.items()}
        _round(algo, states, grads, t, 0.3, keep, codec=get_codec(codec))
        assert all(torch.equal(s.x, states["n0"].x) for s in states.values())


# --- I-RPS-2: total loss is local SGD ------------------------------------------------------------


@pytest.mark.parametrize(("n", "dim"), [(3, 7), (4, 2), (1, 5)])
def test_total_loss_is_local_sgd(n: int, dim: int) -> None:
    """I-RPS-2: with p = 1 each worker keeps its own copy of every block: pure local SGD."""
    lr = 0.3
    algo, states, targets = _setup(n, (dim,), seed=7)
    grad = _quadratic(targets)
    local = {v: s.x[0].clone() for v, s in states.items()}
    keep = _coin(1.0, np.random.default_rng(0))
    for t in range(6):
        grads = {v: grad(v, algo.model(s)) for v, s in states.items()}
        log = _round(algo, states, grads, t, lr, keep)
        assert log.dropped == log.sent
        for v in states:
            local[v] = local[v] - lr * grad(v, local[v])
            assert torch.equal(states[v].x[0], local[v])


# --- I-RPS-3: convex hull, non-expansion --------------------------------------------------------


@given(
    n=st.integers(1, 7),
    dim=st.integers(1, 10),
    p=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
    lr=st.sampled_from([0.0, 0.2]),
)
@settings(max_examples=60)
def test_convex_hull_per_coordinate(n: int, dim: int, p: float, seed: int, lr: float) -> None:
    """I-RPS-3: every new coordinate lies in [min_i x_half_i, max_i x_half_i], so the
    consensus diameter never grows (also with numel < n: empty blocks)."""
    algo, states, targets = _setup(n, (dim,), seed)
    grad = _quadratic(targets)
    keep = _coin(p, np.random.default_rng(seed))
    for t in range(4):
        grads = {v: grad(v, algo.model(s)) for v, s in states.items()}
        log = _round(algo, states, grads, t, lr, keep)
        half = torch.stack(list(log.x_half.values()))
        new = torch.stack([s.x[0] for s in states.values()])
        lo, hi = half.min(0).values, half.max(0).values
        slack = 1e-12 * (1.0 + half.abs().max())
        assert bool((new >= lo - slack).all()) and bool((new <= hi + slack).all())
        diameter = hi - lo
        assert bool((new.max(0).values - new.min(0).values <= diameter + slack).all())


# --- I-RPS-4: the owner's own block is always in its average ------------------------------------


def test_owner_averages_own_block_with_what_arrived() -> None:
    """I-RPS-4: y_j = mean over {j} and the senders that arrived; the own value always counts."""
    algo = NodeRule(RPS())
    nodes = _nodes(4)
    x = torch.arange(8, dtype=torch.float64)  # blocks [0:2] [2:4] [4:6] [6:8]
    state = algo.init(x)
    ctx = _ctx("n1", nodes, 0, 0.0)
    state, out = algo.step(state, torch.zeros_like(x), ctx)
    assert set(out) == {"n0", "n2", "n3"}
    assert torch.equal(out["n0"].tensor("block"), x[0:2])
    a, b = torch.tensor([10.0, 20.0], dtype=torch.float64), torch.tensor([-2.0, 0.0]).double()
    state, out = algo.mix(state, 0, {"n0": Payload({"block": a}), "n3": Payload({"block": b})}, ctx)
    torch.testing.assert_close(state.y[0], (x[2:4] + a + b) / 3)
    assert len({id(p) for p in out.values()}) == 1  # one payload, encoded once
    assert set(out) == {"n0", "n2", "n3"}
    # Gather: n0's average arrives, n2's and n3's are lost and keep the local values.
    avg0 = torch.tensor([5.0, 6.0], dtype=torch.float64)
    state, out = algo.mix(state, 1, {"n0": Payload({"avg": avg0})}, ctx)
    expected = torch.cat([avg0, (x[2:4] + a + b) / 3, x[4:8]])
    torch.testing.assert_close(algo.model(state), expected)
    assert out == {} and state.y.numel() == 0


@pytest.mark.parametrize("dim", [2, 9])
def test_every_message_lost_divides_by_one(dim: int) -> None:
    """I-RPS-4: with an empty inbox the average is the own block (|S_j| = 1, no 0/0), also for
    an owner of an empty block (dim 2 < 4 nodes)."""
    algo = NodeRule(RPS())
    nodes = _nodes(4)
    x = torch.linspace(-1.0, 1.0, dim, dtype=torch.float64)
    for node in nodes:
        ctx = _ctx(node, nodes, 0, 0.1)
        state, _ = algo.step(algo.init(x), torch.ones_like(x), ctx)
        state, out = algo.mix(state, 0, {}, ctx)
        start, stop = block_bounds(dim, 4)[nodes.index(node)]
        assert torch.equal(state.y[0, : stop - start], state.x[0, start:stop])
        assert bool(torch.isfinite(state.y).all())
        assert (len(out) == 3) == (stop > start)
        state, _ = algo.mix(state, 1, {}, ctx)
        assert torch.equal(algo.model(state), x - 0.1)


# --- I-RPS-5: message counts, drop rate, determinism --------------------------------------------


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_message_count_and_drop_fraction(p: float) -> None:
    """I-RPS-5: 2n(n-1) block messages a round; the observed drop fraction is close to p."""
    n, rounds = 6, 120
    _, logs = _run(n, (20,), p, seed=3, rounds=rounds)
    assert all(log.sent == [n * (n - 1), n * (n - 1)] for log in logs)
    sent = sum(sum(log.sent) for log in logs)
    assert sent == rounds * 2 * n * (n - 1)
    fraction = sum(sum(log.dropped) for log in logs) / sent
    assert abs(fraction - p) < 0.015  # about 5 standard deviations at p = 0.5


def test_empty_blocks_send_nothing() -> None:
    """With numel < n the owners of empty blocks get no scatter and send no gather message."""
    n, dim = 5, 3
    _, logs = _run(n, (dim,), 0.0, seed=1, rounds=2)
    owners = sum(1 for size in block_sizes(dim, n) if size > 0)
    assert all(log.sent == [owners * (n - 1), owners * (n - 1)] for log in logs)


def test_same_seed_same_trajectory() -> None:
    """I-RPS-5: a fixed seed gives a deterministic trajectory; another seed another one."""
    a, _ = _run(5, (11,), 0.3, seed=42, rounds=10)
    b, _ = _run(5, (11,), 0.3, seed=42, rounds=10)
    assert all(torch.equal(a[v].x, b[v].x) for v in a)
    c, _ = _run(5, (11,), 0.3, seed=43, rounds=10)
    assert not all(torch.equal(a[v].x, c[v].x) for v in a)


def test_lockstep_order_does_not_matter() -> None:
    """The shared lockstep harness runs RPS; results do not depend on node processing order."""
    graph = complete(5)
    gen = torch.Generator().manual_seed(0)
    params = {v: torch.randn(9, generator=gen, dtype=torch.float64) for v in graph.nodes}

    def drop(s: str, r: str, t: int, phase: int) -> bool:
        return zlib.crc32(f"{s}:{r}:{t}:{phase}".encode()) % 4 == 0

    def grad(v: str, t: int, x: torch.Tensor) -> torch.Tensor:
        return x - float(int(v[1:]) + t)

    a = lockstep(NodeRule(RPS()), graph, params, rounds=6, lr=0.2, grad=grad, drop=drop)
    order = list(reversed(graph.nodes))
    b = lockstep(
        NodeRule(RPS()), graph, params, rounds=6, lr=0.2, grad=grad, drop=drop, order=order
    )
    assert all(torch.equal(a[v].x, b[v].x) for v in graph.nodes)
    assert not all(torch.equal(a[v].x, a["n0"].x) for v in graph.nodes)  # some loss happened


# --- message_schema, errors, registry, topology --------------------------------------------------


def test_block_layout_matches_array_split() -> None:
    for numel in range(12):
        for n in range(1, 6):
            expected = tuple(len(b) for b in np.array_split(np.arange(numel), n))
            assert block_sizes(numel, n) == expected
            bounds = block_bounds(numel, n)
            assert [stop - start for start, stop in bounds] == list(expected)
            assert bounds[-1][1] == numel


def test_message_schema() -> None:
    algo = NodeRule(RPS())
    nodes = _nodes(3)
    algo.init(torch.zeros(7))  # blocks of 3, 2, 2
    ctx = _ctx("n1", nodes, 0, 0.1)

    def shape(phase: int, sender: str, c: RoundContext = ctx) -> tuple[int, ...] | None:
        schema = algo.message_schema(phase, sender, c)
        assert not schema.scalars
        ((name, size),) = schema.tensors.items()
        assert name == ("block" if phase == 0 else "avg")
        return size

    assert shape(0, "n0") == (2,)
    assert shape(0, "n2") == (2,)
    assert shape(1, "n0") == (3,)
    assert shape(1, "n2") == (2,)
    assert shape(0, "n1", _ctx("n0", nodes, 0, 0.1)) == (3,)
    with pytest.raises(AlgorithmError, match="2 phases a round"):
        algo.message_schema(2, "n0", ctx)
    for stranger in ("zz", "n1"):
        with pytest.raises(AlgorithmError, match=f"{stranger!r} sends 'n1' nothing"):
            algo.message_schema(1, stranger, ctx)
    with pytest.raises(AlgorithmError, match="call init"):
        NodeRule(RPS()).message_schema(0, "n0", ctx)
    tiny = NodeRule(RPS())
    tiny.init(torch.zeros(2))  # blocks of 1, 1, 0: n2 owns nothing
    with pytest.raises(AlgorithmError, match="'n0' sends 'n2' nothing in phase 0"):
        tiny.message_schema(0, "n0", _ctx("n2", nodes, 0, 0.1))
    with pytest.raises(AlgorithmError, match="'n2' sends 'n1' nothing in phase 1"):
        tiny.message_schema(1, "n2", ctx)
    assert tiny.expected_senders(0, _ctx("n2", nodes, 0, 0.1)) == ()
    assert tiny.expected_senders(1, ctx) == ("n0",)


def test_bad_input_is_refused() -> None:
    algo = NodeRule(RPS())
    nodes = _nodes(3)
    ctx = _ctx("n0", nodes, 0, 0.1)
    state = algo.init(torch.zeros(6))
    with pytest.raises(AlgorithmError, match="without a scatter phase"):
        algo.mix(state, 1, {}, ctx)
    with pytest.raises(AlgorithmError, match="not in the round's node list"):
        algo.step(state, torch.zeros(6), _ctx("n9", nodes, 0, 0.1))
    with pytest.raises(AlgorithmError, match="initialised for 6"):
        algo.step(RPSState(torch.zeros(1, 5), torch.zeros(1, 0)), torch.zeros(5), ctx)


def test_registry() -> None:
    algo = make_algorithm("rps")
    assert isinstance(algo, RPSRule)
    assert (algo.name, algo.phases, algo.mixing) == ("rps", 2, "all-pairs")
    with pytest.raises(ConfigError, match="has no option"):
        make_algorithm("rps", p=0.1)


def test_all_pairs_mixing_needs_every_pair() -> None:
    with pytest.raises(TopologyError, match=r"no edge n0 -> n2\..*topology.kind = \"complete\""):
        prepare(ring(5), mixing="all-pairs", algorithm="rps")
    with pytest.raises(TopologyError, match="every worker to reach every block owner"):
        communication_graph(NodeRule(RPS()), parse_spec("ring:4"))
    one_way = TrustGraph.from_edges(
        [(u, v) for u in _nodes(3) for v in _nodes(3) if u != v and (u, v) != ("n2", "n1")],
        name="almost",
        nodes=_nodes(3),
    )
    with pytest.raises(TopologyError, match="no edge n2 -> n1"):
        prepare(one_way, mixing="all-pairs", algorithm="rps")
    schedule = Schedule([complete(4), ring(4)], name="flip")
    with pytest.raises(TopologyError, match=r"round 1 of schedule 'flip'"):
        prepare(schedule, mixing="all-pairs", algorithm="rps")


def test_all_pairs_mixing_accepts_complete() -> None:
    graph = communication_graph(
        NodeRule(RPS()), build_topology(TopologyConfig(kind="complete", nodes=5))
    )
    assert isinstance(graph, TrustGraph)
    assert len(graph.edges()) == 20
    assert graph.mixing_matrix() == pytest.approx(0.2)
    steady = prepare(
        Schedule([complete(3), complete(3)], name="s"), mixing="all-pairs", algorithm="rps"
    )
    assert isinstance(steady, TrustGraph) and len(steady.edges()) == 6


def test_end_to_end_without_loss_is_consensus() -> None:
    """Through the real node and in-process transport (default fp32 codec on a float64
    model, so lossy): replicas agree after every round; tensors are blocks."""
    net = make_network(
        "complete:4",
        algorithm="rps",
        settings={"model.dtype": "float64", "algorithm.lr": 0.1},
    )
    numel = net.average_model().numel()
    net.run(2)
    models = list(net.models().values())
    assert all(torch.equal(m, models[0]) for m in models)
    for t in range(2):
        assert len(net.messages_at(t, 0)) == len(net.messages_at(t, 1)) == 12
        shapes = {m.tensors[next(iter(m.tensors))].shape for m in net.messages_at(t, 0)}
        assert shapes == {(size,) for size in block_sizes(numel, 4)}
