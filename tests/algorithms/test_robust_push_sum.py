"""Robust push-sum OPS (reference/algorithms.md section 10, I-RPSUM-1/2) and step scaling.

Nodes are driven in a plain Python loop with hand-built inboxes (no transport); each message
is lost independently with probability ``p``, decided by a seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import RoundContext, make_algorithm
from fedcore.algorithms.base import unions
from fedcore.algorithms.inbox import EdgeInbox, Edges
from fedcore.algorithms.ops import (
    OPS,
    PushSumRule,
    PushSumState,
    RobustOPSState,
    RobustPushSumRule,
)
from fedcore.algorithms.rule import Rows
from fedcore.compression import Codec, get_codec, make_codec
from fedcore.errors import ConfigError
from fedcore.messages import EncodedTensor, Payload
from fedcore.node import NodeRule
from fedcore.testing import lockstep
from fedcore.topology import Schedule, Topology, TrustGraph, parse_spec, prepare
from tests.strategies import GradFn, random_grad, random_params, strongly_connected_digraphs

D = 3
State = PushSumState | RobustOPSState
Unions = Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]


def _weighted(topology: str | Topology) -> Topology:
    graph = parse_spec(topology) if isinstance(topology, str) else topology
    return prepare(graph, mixing="push-sum", algorithm="ops")


def _decoded(payload: Payload) -> Payload:
    """What a receiver gets: encoded tensors decoded (as the node does), the rest as sent."""
    tensors = {
        k: get_codec(v.codec).decode(v) if isinstance(v, EncodedTensor) else v
        for k, v in payload.tensors.items()
    }
    return Payload(tensors, payload.scalars)


def _rounds(
    algo: Any,
    topo: Topology,
    params: Mapping[str, torch.Tensor],
    *,
    rounds: int,
    p: float = 0.0,
    seed: int = 0,
    lr: float | Callable[[int], float] = 0.0,
    grad: GradFn | None = None,
    codec: Codec | None = None,
    drop: Callable[[str, str, int], bool] | None = None,
) -> Iterator[tuple[int, dict[str, Any], torch.Tensor]]:
    """Run ``rounds`` rounds; yield ``(round, states, stepped)`` after each one.

    A message is lost with probability ``p`` (a generator seeded with ``seed``), or, if
    ``drop`` is given, when ``drop(sender, receiver, round)`` says so.

    ``stepped`` is the float64 sum over nodes and rounds of what the gradient steps took off
    the numerators (``lr * g``, or ``lr * omega * g`` with ``step_scale="omega"``). Inboxes
    hold the senders' payload objects themselves (with encoded tensors decoded), so an
    in-place update by a receiver would corrupt its sender's state.
    """
    rng = np.random.default_rng(seed)
    nodes = topo.nodes
    states: dict[str, Any] = {n: algo.init(params[n]) for n in nodes}
    stepped = torch.zeros(params[nodes[0]].shape, dtype=torch.float64)
    weights: dict[int, dict[str, tuple[float, dict[str, float], dict[str, float]]]] = {}
    union = {n: unions(topo, n) for n in nodes}
    for t in range(rounds):
        slot = t % topo.period
        if slot not in weights:
            g = topo.at(t)
            weights[slot] = {
                n: (g.self_weight(n), g.out_weights(n), g.in_weights(n)) for n in nodes
            }
        lr_t = lr(t) if callable(lr) else lr
        ctxs = {
            n: RoundContext(
                node=n,
                round=t,
                lr=lr_t,
                self_weight=w[0],
                out_weights=w[1],
                in_weights=w[2],
                nodes=nodes,
                codec=codec,
                out_union=union[n][0],
                in_union=union[n][1],
            )
            for n, w in weights[slot].items()
        }
        outboxes = {}
        for n in nodes:
            model = algo.model(states[n])
            if grad is None:
                gradient = torch.zeros_like(model)
            else:
                gradient = grad(n, t, model)
                scale = states[n].omega if algo.step_scale == "omega" else 1.0
                stepped = stepped + lr_t * scale * gradient.to(torch.float64)
            states[n], outboxes[n] = algo.step(states[n], gradient, ctxs[n])
        for n in nodes:
            inbox = {}
            for s in sorted(algo.expected_senders(0, ctxs[n])):
                lost = drop(s, n, t) if drop is not None else bool(rng.random() < p)
                if not lost and n in outboxes[s]:
                    inbox[s] = _decoded(outboxes[s][n])
            states[n], _ = algo.mix(states[n], 0, inbox, ctxs[n])
        yield t, states, stepped


def _run(
    algo: OPS, topo: Topology, params: Mapping[str, torch.Tensor], **kw: Any
) -> dict[str, Any]:
    final: dict[str, Any] = {}
    for _, states, _ in _rounds(algo, topo, params, **kw):
        final = states
    return final


def _in_flight(
    states: Mapping[str, RobustOPSState], union: Unions, i: str, j: str
) -> tuple[torch.Tensor, float]:
    """``sigma_ij - rho_ij`` of edge ``i -> j`` (each 0 before its first use)."""
    sender, receiver = states[i], states[j]
    x = torch.zeros(sender.x.shape[1], dtype=torch.float64)
    omega = 0.0
    if sender.sent_omega.numel():
        e = union[i][0].index(j)
        x, omega = x + sender.sent_x[e], omega + float(sender.sent_omega[e])
    if receiver.seen_omega.numel():
        e = union[j][1].index(i)
        x, omega = x - receiver.seen_x[e], omega - float(receiver.seen_omega[e])
    return x, omega


def _mass(states: Mapping[str, RobustOPSState], union: Unions) -> tuple[torch.Tensor, float]:
    """I-RPSUM-1's conserved quantity: held mass plus mass in flight (sigma - rho)."""
    x = sum(s.x[0].to(torch.float64) for s in states.values())
    omega = sum(float(s.omega) for s in states.values())
    for i in states:
        for j in union[i][0]:
            dx, domega = _in_flight(states, union, i, j)
            x, omega = x + dx, omega + domega
    assert isinstance(x, torch.Tensor)
    return x, omega


def _unions(topo: Topology) -> Unions:
    return {n: unions(topo, n) for n in topo.nodes}


def _z_error(states: Mapping[str, State], mean: torch.Tensor) -> float:
    return max(
        float((s.x[0].to(torch.float64) / float(s.omega) - mean).abs().max())
        for s in states.values()
    )


def _mean(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return torch.stack([p.to(torch.float64) for p in params.values()]).mean(dim=0)


# --- options -------------------------------------------------------------------------------


def test_options_through_the_registry() -> None:
    """The config's ``algorithm.robust`` / ``algorithm.step_scale`` reach OPS and are checked."""
    algo = NodeRule(make_algorithm("ops", robust=True, step_scale="omega"))
    assert isinstance(algo.rule, RobustPushSumRule) and algo.robust
    assert algo.step_scale == "omega"
    assert isinstance(algo.init(torch.zeros(2)), RobustOPSState)
    default = NodeRule(
        make_algorithm("ops")
    )  # plain push-sum: a separate rule behind the same name
    assert isinstance(default.rule, PushSumRule) and not default.robust
    assert default.step_scale == "none"
    assert type(default.init(torch.zeros(2))) is PushSumState
    with pytest.raises(ConfigError, match=r"step_scale.*'sigma'.*'none', 'omega'"):
        make_algorithm("ops", step_scale="sigma")
    with pytest.raises(ConfigError, match="robust"):
        make_algorithm("ops", robust="yes")
    with pytest.raises(ConfigError, match="no option"):
        make_algorithm("ops", robustness=True)


# --- I-RPSUM-2: exact average under message loss -------------------------------------------


@pytest.mark.parametrize("spec", ["social:12", "social:8:seed=2"])
def test_exact_average_under_drops(spec: str) -> None:
    """I-RPSUM-2: lr = 0, 30% loss: robust z reach the exact mean; plain push-sum misses it."""
    topo = _weighted(spec)
    params = random_params(topo, 7, D)
    mean = _mean(params)
    robust = _run(NodeRule(OPS(robust=True)), topo, params, rounds=500, p=0.3, seed=1)
    plain = _run(NodeRule(OPS()), topo, params, rounds=500, p=0.3, seed=1)
    assert _z_error(robust, mean) < 1e-10  # measured ~1e-13
    assert _z_error(plain, mean) > 1e-3  # measured ~0.16
    assert sum(float(s.omega) for s in plain.values()) < 1e-6  # plain push-sum bled its weight


def test_lost_messages_arrive_with_the_next_total() -> None:
    """Edge n0 -> n1 loses rounds 0-2; round 3's total delivers all of it (plain: lost)."""
    topo = _weighted("directed-ring:4")
    params = random_params(topo, 5, D)
    x0 = sum(params.values())
    assert isinstance(x0, torch.Tensor)

    def drop(sender: str, receiver: str, t: int) -> bool:
        return (sender, receiver) == ("n0", "n1") and t < 3

    union = _unions(topo)
    for t, states, _ in _rounds(NodeRule(OPS(robust=True)), topo, params, rounds=4, drop=drop):
        held = sum(float(s.omega) for s in states.values())
        in_flight = _in_flight(states, union, "n0", "n1")[1]
        if t < 3:
            assert held < 4.0 and in_flight > 0.0
            assert held + in_flight == pytest.approx(4.0, abs=1e-14)
        else:
            assert held == pytest.approx(4.0, abs=1e-14) and in_flight == 0.0
            assert torch.allclose(sum(s.x[0] for s in states.values()), x0, atol=1e-14)
    plain = _run(NodeRule(OPS()), topo, params, rounds=4, drop=drop)
    assert sum(float(s.omega) for s in plain.values()) < 4.0 - 0.1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_one_peer_exponential_schedule_under_drops(dtype: torch.dtype) -> None:
    """Time-varying graph (one out-edge a round) with 30% loss: still the exact average."""
    topo = _weighted("one-peer-exponential:8")
    params = {n: p.to(dtype) for n, p in random_params(topo, 4, D).items()}
    states = _run(NodeRule(OPS(robust=True)), topo, params, rounds=400, p=0.3, seed=2)
    assert _z_error(states, _mean(params)) < (1e-9 if dtype == torch.float64 else 1e-6)


# --- I-RPSUM-1: conservation ---------------------------------------------------------------


def _check_conservation(
    algo: OPS, topo: Topology, params: Mapping[str, torch.Tensor], **kw: Any
) -> None:
    x0 = _mean(params) * len(params)
    n = len(params)
    union = _unions(topo)
    for _, states, stepped in _rounds(algo, topo, params, **kw):
        x, omega = _mass(states, union)
        expected = x0 - stepped
        scale = 1.0 + float(expected.abs().max())
        assert float((x - expected).abs().max()) <= 1e-9 * scale
        assert omega == pytest.approx(n, rel=1e-12)


@given(
    strongly_connected_digraphs(max_nodes=6),
    st.integers(0, 1000),
    st.floats(0.0, 0.7),
    st.sampled_from([0.0, 0.1]),
    st.sampled_from(["none", "omega"]),
)
@settings(max_examples=20, deadline=None)
def test_conservation_every_round(
    graph: TrustGraph, seed: int, p: float, lr: float, step_scale: str
) -> None:
    """I-RPSUM-1: held + in-flight mass = initial mass minus the gradient steps, every round."""
    topo = _weighted(graph)
    params = random_params(topo, seed, D)
    algo = NodeRule(OPS(robust=True, step_scale=step_scale))
    grad = random_grad(seed, D, pull=0.1)
    _check_conservation(algo, topo, params, rounds=25, p=p, seed=seed, lr=lr, grad=grad)


@st.composite
def _schedules(draw: st.DrawFn) -> Schedule:
    """Three random strongly connected digraphs over one node set, taken in turn."""
    n = draw(st.integers(3, 6))
    graphs = [draw(strongly_connected_digraphs(min_nodes=n, max_nodes=n)) for _ in range(3)]
    return Schedule(graphs, name=f"random-schedule-{n}")


@given(_schedules(), st.integers(0, 1000), st.floats(0.0, 0.6))
@settings(max_examples=10, deadline=None)
def test_conservation_on_time_varying_graph(schedule: Schedule, seed: int, p: float) -> None:
    """I-RPSUM-1 when edges come and go between rounds (their totals wait for them)."""
    topo = _weighted(schedule)
    params = random_params(topo, seed, D)
    grad = random_grad(seed, D, pull=0.1)
    _check_conservation(
        NodeRule(OPS(robust=True)), topo, params, rounds=30, p=p, seed=seed, lr=0.1, grad=grad
    )


def _batched_rounds(
    rule: RobustPushSumRule,
    topo: Topology,
    params: Mapping[str, torch.Tensor],
    *,
    rounds: int,
    p: float,
    seed: int,
) -> Iterator[tuple[int, dict[str, RobustOPSState]]]:
    """:func:`_rounds` without gradients on one fixed graph, all nodes at once: the rule's
    batched form (``B`` rows and every edge in one :class:`Rows`, as the vectorized engine
    runs it) in place of one :class:`NodeRule` call per node. The same losses: one draw
    per edge, receivers in node order, each one's senders in sorted order. Yields
    ``(round, states)``, the states sliced per node as :class:`NodeRule` keeps them."""
    assert topo.period == 1, "one fixed graph"
    rng = np.random.default_rng(seed)
    nodes = topo.nodes
    g = topo.at(0)
    union = _unions(topo)
    outs = [(i, j) for i, n in enumerate(nodes) for j in union[n][0]]
    ins = [(i, j) for i, n in enumerate(nodes) for j in union[n][1]]
    at = {n: i for i, n in enumerate(nodes)}
    out_at = {(nodes[i], j): e for e, (i, j) in enumerate(outs)}
    in_to_out = torch.tensor([out_at[(j, nodes[i])] for i, j in ins])

    def put(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype)

    edges = Edges(
        out_row=put([i for i, _ in outs], torch.long),
        out_weight=put([g.out_weights(nodes[i]).get(j, 0.0) for i, j in outs], torch.float64),
        out_live=put([j in g.out_weights(nodes[i]) for i, j in outs], torch.bool),
        in_row=put([i for i, _ in ins], torch.long),
        in_weight=put([g.in_weights(nodes[i]).get(j, 0.0) for i, j in ins], torch.float64),
        in_live=put([j in g.in_weights(nodes[i]) for i, j in ins], torch.bool),
        out_peer=put([at[j] for _, j in outs], torch.long),
        in_peer=put([at[j] for _, j in ins], torch.long),
        b=len(nodes),
    )
    self_weight = put([g.self_weight(n) for n in nodes], torch.float64)
    in_degree = put([len(g.in_weights(n)) for n in nodes], torch.long)
    state = rule.init(torch.stack([params[n] for n in nodes]))
    zeros = torch.zeros_like(state.x)
    for t in range(rounds):
        rows = Rows(
            round=t,
            lr=0.0,
            self_weight=self_weight,
            in_degree=in_degree,
            n=len(nodes),
            ids=tuple(nodes),
            nodes=tuple(nodes),
            edges=edges,
        )
        state, send = rule.step(state, zeros, rows)
        assert send is not None
        arrived = torch.from_numpy(~(rng.random(len(ins)) < p))
        inbox = EdgeInbox(
            {k: v.index_select(0, in_to_out) for k, v in send.tensors.items()},
            {k: v.index_select(0, in_to_out) for k, v in send.scalars.items()},
            arrived,
        )
        state, _ = rule.mix(state, 0, inbox, rows)
        yield t, _per_node(state, edges, nodes)


def _per_node(
    state: RobustOPSState, edges: Edges, nodes: tuple[str, ...]
) -> dict[str, RobustOPSState]:
    """One batched state as each node's own (rows ``i:i+1``, its own edges)."""
    split = {}
    for i, n in enumerate(nodes):
        out, in_ = edges.out_row == i, edges.in_row == i
        split[n] = RobustOPSState(
            state.x[i : i + 1],
            state.omega[i : i + 1],
            state.silent[i : i + 1],
            state.sent_x[out],
            state.sent_omega[out],
            state.seen_x[in_],
            state.seen_omega[in_],
        )
    return split


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_batched_driver_is_the_per_node_driver(dtype: torch.dtype) -> None:
    """:func:`_batched_rounds` is :func:`_rounds` bit for bit (the same losses, the same
    update), so the long run below may take it: 300 rounds, every state compared."""
    topo = _weighted("social:4")
    params = {n: p.to(dtype) for n, p in random_params(topo, 0, 2).items()}
    kw: dict[str, Any] = {"rounds": 300, "p": 0.3, "seed": 3}
    per_node = _rounds(NodeRule(OPS(robust=True)), topo, params, **kw)
    batched = _batched_rounds(RobustPushSumRule(), topo, params, **kw)
    for (t, a, _), (u, b) in zip(per_node, batched, strict=True):
        assert t == u
        for n in topo.nodes:
            for field in RobustOPSState._fields:
                x, y = getattr(a[n], field), getattr(b[n], field)
                assert x.dtype == y.dtype and torch.equal(x, y), (t, n, field)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_ten_thousand_rounds_do_not_drift(dtype: torch.dtype) -> None:
    """10^4 rounds at 30% loss: the totals grow ~10^3-fold, yet z and I-RPSUM-1 stay exact.

    Measured (social:4, d = 2): float64 z error 3e-12 and mass error 8e-14; float32 z error
    3e-7 and mass error 1e-6 (the float32 rounding of x itself), omega exact. Sending the
    x-total without its low part ``x_lo`` leaves a float32 z error of 3e-4, and keeping
    ``W_ii * x`` at home instead of exactly what the totals did not take gives a float64
    mass error that grows with the totals.

    The rounds run batched (:func:`_batched_rounds`, the per-node driver's update and
    losses bit for bit: the test above), four times faster than node by node.
    """
    topo = _weighted("social:4")
    params = {n: p.to(dtype) for n, p in random_params(topo, 0, 2).items()}
    mean = _mean(params)
    total_x = mean * len(params)
    worst_mass = worst_omega = 0.0
    final: dict[str, Any] = {}
    union = _unions(topo)
    for t, states in _batched_rounds(
        RobustPushSumRule(), topo, params, rounds=10_000, p=0.3, seed=3
    ):
        if t % 1000 == 999:
            x, omega = _mass(states, union)
            worst_mass = max(worst_mass, float((x - total_x).abs().max()))
            worst_omega = max(worst_omega, abs(omega - 4.0))
            final = states
    grown = max(float(s.sent_x.abs().max()) for s in final.values())
    assert grown > 1e3  # the totals really are large
    assert worst_omega < 1e-12  # omega travels as a float64 scalar, whatever the model dtype
    if dtype == torch.float64:
        assert _z_error(final, mean) < 1e-10
        assert worst_mass < 1e-12
    else:
        assert _z_error(final, mean) < 2e-6
        assert worst_mass < 2e-5


# --- equivalence with plain OPS and step scaling --------------------------------------------


@pytest.mark.parametrize("step_scale", ["none", "omega"])
def test_no_drops_matches_plain_ops(step_scale: str) -> None:
    """Without loss, robust OPS follows plain OPS's trajectory (to float rounding)."""
    topo = _weighted("social:8")
    params = random_params(topo, 11, D)
    grad = random_grad(11, D, pull=0.1)
    kw: dict[str, Any] = {"rounds": 60, "lr": 0.1, "grad": grad}
    robust = _rounds(NodeRule(OPS(robust=True, step_scale=step_scale)), topo, params, **kw)
    plain = _rounds(NodeRule(OPS(step_scale=step_scale)), topo, params, **kw)
    for (_, a, _), (_, b, _) in zip(robust, plain, strict=True):
        for n in topo.nodes:
            z_robust, z_plain = NodeRule(OPS(robust=True)).model(a[n]), NodeRule(OPS()).model(b[n])
            assert torch.allclose(z_robust, z_plain, rtol=0, atol=1e-11)
            assert float(a[n].omega) == pytest.approx(float(b[n].omega), rel=1e-12)


@pytest.mark.parametrize("robust", [False, True])
def test_step_scale_omega_is_a_step_of_lr_on_z(robust: bool) -> None:
    """One round: ``x -= lr * omega * g`` (z moves by lr * g), against the paper's ``x -= lr g``."""
    x = torch.tensor([2.0, 4.0], dtype=torch.float64)
    g = torch.tensor([1.0, -1.0], dtype=torch.float64)
    ctx = RoundContext(
        node="a", round=0, lr=0.1, self_weight=0.5, out_weights={"b": 0.5}, in_weights={}
    )
    moved = {}
    for step_scale in ("none", "omega"):
        algo = NodeRule(OPS(robust=robust, step_scale=step_scale))
        half = torch.tensor([0.5], dtype=torch.float64)  # the rule's [B]
        state = algo.init(x)._replace(omega=half)
        new, out = algo.step(state, g, ctx)
        sent = out["b"].tensor("x")
        new_x = new.x[0]
        moved[step_scale] = (new_x + sent if robust else new_x) - x  # what the step took off
        z_half = (new_x + sent) / 0.5 if robust else new_x / 0.5
        if step_scale == "omega":
            assert torch.allclose(z_half, x / 0.5 - 0.1 * g, atol=1e-15)
    assert torch.allclose(moved["none"], -0.1 * g, atol=1e-15)
    assert torch.allclose(moved["omega"], -0.1 * 0.5 * g, atol=1e-15)


def _quadratic(topo: Topology) -> tuple[GradFn, torch.Tensor, torch.Tensor]:
    """f_i(z) = |z - c_i|^2 / 2: gradient, uniform optimum, Perron(omega)-weighted optimum."""
    gen = torch.Generator().manual_seed(3)
    c = {n: torch.randn(2, generator=gen, dtype=torch.float64) for n in topo.nodes}
    w = topo.at(0).mixing_matrix()
    vals, vecs = np.linalg.eig(w.T)
    pi = np.abs(np.real(vecs[:, np.argmax(np.real(vals))]))
    pi = pi / pi.sum()
    perron = sum(float(pi[i]) * c[n] for i, n in enumerate(topo.nodes))
    assert isinstance(perron, torch.Tensor)

    def grad(node: str, _t: int, z: torch.Tensor) -> torch.Tensor:
        return z - c[node]

    return grad, torch.stack(list(c.values())).mean(dim=0), perron


@pytest.mark.parametrize(("spec", "target"), [("social:8", "perron"), ("exponential:8", "uniform")])
def test_step_scale_omega_quadratic_under_drops(spec: str, target: str) -> None:
    """Robust OPS + step_scale="omega" at 30% loss converges on a quadratic.

    Its fixed point minimises ``sum_i omega_i f_i``: on the non-regular social graph that is
    the Perron-weighted optimum, not the uniform one (the documented price of the scaling);
    on the regular exponential graph the two coincide.
    """
    topo = _weighted(spec)
    grad, uniform, perron = _quadratic(topo)
    params = {n: torch.zeros(2, dtype=torch.float64) for n in topo.nodes}
    algo = NodeRule(OPS(robust=True, step_scale="omega"))
    states = _run(
        algo, topo, params, rounds=1000, p=0.3, seed=1, lr=lambda t: 0.5 / (t + 1) ** 0.5, grad=grad
    )
    zs = torch.stack([algo.model(s) for s in states.values()])
    centre = zs.mean(dim=0)
    assert float((zs - centre).norm(dim=1).max()) < 0.05  # consensus, up to lr_T * |grad|
    goal = perron if target == "perron" else uniform
    assert float((centre - goal).norm()) < 0.02
    if target == "perron":
        assert float((perron - uniform).norm()) > 0.1  # the two targets are far apart here


# --- wire format, codecs, inbox hygiene ------------------------------------------------------


def _sent_total(
    total: torch.Tensor, omega: float, dtype: torch.dtype, codec: Codec | None
) -> Payload:
    """What a peer whose edge to ``b`` holds the totals ``(total, omega)`` sends on it, as
    ``b`` decodes it (a zero model adds nothing to the totals)."""
    algo = NodeRule(OPS(robust=True))
    ctx = RoundContext(
        node="a", round=0, lr=0.0, self_weight=0.5, out_weights={"b": 0.5}, in_weights={},
        codec=codec,
    )  # fmt: skip
    state = algo.init(torch.zeros(total.shape[0], dtype=dtype))._replace(
        sent_x=total.unsqueeze(0), sent_omega=torch.tensor([omega - 0.5], dtype=torch.float64)
    )
    _, out = algo.step(state, torch.zeros(total.shape[0], dtype=dtype), ctx)
    return _decoded(out["b"])


def test_wire_carries_a_low_part_unless_float64_travels_exactly() -> None:
    """Totals travel in the model dtype; ``x + x_lo`` matches the float64 total to ~u^2."""
    gen = torch.Generator().manual_seed(0)
    total = torch.randn(50, generator=gen, dtype=torch.float64) * 1e4
    fp32 = make_codec("fp32")
    exact = _sent_total(total, 1234.5, torch.float64, None)
    assert set(exact.tensors) == {"x"} and torch.equal(exact.tensor("x"), total)
    assert set(_sent_total(total, 1234.5, torch.float64, make_codec("raw")).tensors) == {"x"}
    for dtype, codec in [(torch.float32, None), (torch.float32, fp32), (torch.float64, fp32)]:
        received = _sent_total(total, 1234.5, dtype, codec)
        assert set(received.tensors) == {"x", "x_lo"}
        assert all(t.dtype == dtype and t.shape == (50,) for t in received.tensors.values())
        assert received.scalars["omega"] == 1234.5
        back = received.tensor("x").double() + received.tensor("x_lo").double()
        hi_only = float((received.tensor("x").double() - total).abs().max())
        assert float((back - total).abs().max()) < 1e-14 * 1e4 * 8
        assert hi_only > 1e-5  # without x_lo the receiver would be off by ~u * |total|


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_fp32_codec_wire_keeps_the_exact_average(dtype: torch.dtype) -> None:
    """With the node's default fp32 codec (lossy for float64 models) under 30% loss."""
    topo = _weighted("social:8")
    params = {n: p.to(dtype) for n, p in random_params(topo, 9, D).items()}
    states = _run(
        NodeRule(OPS(robust=True)),
        topo,
        params,
        rounds=400,
        p=0.3,
        seed=4,
        codec=make_codec("fp32"),
    )
    assert _z_error(states, _mean(params)) < (1e-11 if dtype == torch.float64 else 1e-6)


def test_mix_leaves_inbox_untouched_and_ignores_stale_totals() -> None:
    """Inbox tensors are read only; a total older than the one applied adds nothing."""
    algo = NodeRule(OPS(robust=True))
    ctx = RoundContext(
        node="a", round=0, lr=0.0, self_weight=0.5, out_weights={}, in_weights={"b": 0.5}
    )
    state = algo.init(torch.tensor([1.0, 2.0], dtype=torch.float64))
    old = Payload({"x": torch.tensor([1.0, 1.0], dtype=torch.float64)}, {"omega": 0.5})
    new = Payload({"x": torch.tensor([3.0, 2.0], dtype=torch.float64)}, {"omega": 1.0})
    copy = new.tensor("x").clone()
    s1, out = algo.mix(state, 0, {"b": old}, ctx)
    s2, _ = algo.mix(s1, 0, {"b": new}, ctx)
    s3, _ = algo.mix(s2, 0, {"b": old}, ctx)  # replayed: ignored
    s4, _ = algo.mix(s3, 0, {"b": new}, ctx)  # repeated: adds zero
    assert out == {}
    assert torch.equal(s2.x[0], torch.tensor([4.0, 4.0], dtype=torch.float64))
    assert float(s2.omega) == 2.0
    for s in (s3, s4):
        assert torch.equal(s.x, s2.x) and torch.equal(s.omega, s2.omega)
    assert torch.equal(new.tensor("x"), copy)


def test_new_edge_totals_start_at_zero_and_absent_edges_wait() -> None:
    """An edge's totals start at its first use; an edge absent this round keeps its totals."""
    algo = NodeRule(OPS(robust=True))
    x = torch.tensor([1.0, 3.0], dtype=torch.float64)

    def ctx(out: dict[str, float], self_weight: float) -> RoundContext:
        return RoundContext(
            node="a", round=0, lr=0.0, self_weight=self_weight, out_weights=out,
            in_weights={}, out_union=("b", "c"),
        )  # fmt: skip

    state, _ = algo.step(
        algo.init(x), torch.zeros(2, dtype=torch.float64), ctx({"b": 0.25, "c": 0.25}, 0.5)
    )
    assert torch.equal(state.x[0], 0.5 * x) and float(state.omega) == 0.5
    assert torch.equal(state.sent_x[0], 0.25 * x) and float(state.sent_omega[0]) == 0.25
    after, _ = algo.step(state, torch.zeros(2, dtype=torch.float64), ctx({"c": 0.5}, 0.5))
    assert torch.equal(after.sent_x[0], state.sent_x[0])  # b waits
    assert torch.equal(after.sent_x[1], 0.25 * x + 0.25 * x) and float(after.sent_omega[1]) == 0.5
    assert torch.equal(after.x[0], 0.25 * x) and float(after.omega) == 0.25


# --- through the project's harnesses ---------------------------------------------------------


def test_lockstep_with_drops_reaches_the_average() -> None:
    """fedcore.testing.lockstep (snapshotted messages) with seeded 30% loss."""
    topo = _weighted("social:10")
    params = random_params(topo, 12, D)
    rng = np.random.default_rng(0)
    states = lockstep(
        NodeRule(OPS(robust=True)),
        topo,
        params,
        rounds=400,
        drop=lambda *_: bool(rng.random() < 0.3),
    )
    assert _z_error(states, _mean(params)) < 1e-8


def test_over_the_network_with_faults() -> None:
    """End to end (float32 model, fp32 codec, injected 30% loss): the node accepts the
    totals and their low parts, and no mass is lost."""
    from fedcore.testing import make_network

    net = make_network(
        "social:6",
        algorithm="ops",
        settings={
            "algorithm.robust": True,
            "algorithm.step_scale": "omega",
            "algorithm.lr": 0.0,
            "faults.drop": 0.3,
        },
    )
    start = net.average_model().clone()
    net.run(30)
    states = {n: node.state for n, node in net.nodes.items()}
    assert all(isinstance(s, RobustOPSState) for s in states.values())
    assert {name for m in net.messages for name in m.tensors} == {"x", "x_lo"}
    assert all(t.dtype == "float32" for m in net.messages for t in m.tensors.values())
    union = {
        n: (node._context(0).out_union, node._context(0).in_union) for n, node in net.nodes.items()
    }
    _, omega = _mass(states, union)
    assert omega == pytest.approx(6.0, rel=1e-12)
    assert torch.allclose(
        torch.stack([s.x.double() / s.omega for s in states.values()]).mean(0),
        start.double(),
        atol=1e-2,
    )
