"""Online Push-Sum invariants (reference/algorithms.md, I-OPS-1..7) as property tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedcore.algorithms import OPS, RoundContext, Rows, Slot
from fedcore.algorithms.ops import PushSumRule, PushSumState
from fedcore.node import NodeRule
from fedcore.testing import lockstep
from fedcore.topology import TrustGraph, complete, parse_spec, prepare, ring, uniform_push_sum
from tests.strategies import GradFn, random_grad, random_params, strongly_connected_digraphs

D = 3


def _params(graph: TrustGraph, seed: int) -> dict[str, torch.Tensor]:
    return random_params(graph, seed, D)


def _grad(seed: int) -> GradFn:
    return random_grad(seed, D, pull=0.1)


@given(strongly_connected_digraphs(), st.integers(0, 1000))
@settings(max_examples=30)
def test_mass_conservation(graph: TrustGraph, seed: int) -> None:
    """I-OPS-1: sum omega = n; sum x moves exactly by the summed gradient steps."""
    weighted = prepare(graph, mixing="push-sum", algorithm="ops")
    lr = 0.1
    grad = _grad(seed)
    states = {n: NodeRule(OPS()).init(p) for n, p in _params(graph, seed).items()}
    for t in range(10):
        steps = sum(grad(n, t, NodeRule(OPS()).model(s)) for n, s in states.items())
        before = sum(s.x for s in states.values())
        states = lockstep(
            NodeRule(OPS()),
            weighted,
            {},
            rounds=1,
            lr=lr,
            grad=lambda n, _t, m, t=t: grad(n, t, m),
            states=states,
        )
        after = sum(s.x for s in states.values())
        assert torch.allclose(after, before - lr * steps, atol=1e-12)
        assert sum(s.omega for s in states.values()) == pytest.approx(len(graph), abs=1e-12)


@given(strongly_connected_digraphs(max_nodes=7), st.integers(0, 1000))
@settings(max_examples=15)
def test_exact_average_on_digraph(graph: TrustGraph, seed: int) -> None:
    """I-OPS-2: with zero step, every z reaches the exact mean of x_0 (1e-8) within 1500
    rounds. Run 100 rounds at a time, and stopped at the first hundred where it has."""
    params = _params(graph, seed)
    mean = torch.stack(list(params.values())).mean(dim=0)
    algorithm = NodeRule(OPS())
    states = None
    for _ in range(15):  # 1500 rounds at most
        states = lockstep(algorithm, graph, params, rounds=100, states=states)
        apart = max(float((s.x / s.omega - mean).abs().max()) for s in states.values())
        if apart < 1e-8:
            break
    assert apart < 1e-8


def _plain_mixing(graph: TrustGraph, x0: np.ndarray, rounds: int) -> np.ndarray:
    """DOL-asym: mix x with the same push-sum weights but never divide by omega."""
    w = uniform_push_sum(graph).mixing_matrix()
    x = x0.copy()
    for _ in range(rounds):
        x = w.T @ x
    return x


@pytest.mark.parametrize("spec", ["social:16", "erdos-renyi:10:p=0.4,seed=1", "social:8:seed=2"])
def test_debiasing_matters(spec: str) -> None:
    """I-OPS-3: on a non-doubly-stochastic graph, mixing without omega misses the mean."""
    graph = parse_spec(spec)
    assert isinstance(graph, TrustGraph)
    w = uniform_push_sum(graph).mixing_matrix()
    column_sums = w.sum(axis=0)
    if np.allclose(column_sums, 1.0):
        pytest.skip(f"{spec} weights happen to be doubly stochastic")
    params = _params(graph, 0)
    x0 = np.stack([params[n].numpy() for n in graph.nodes])
    mean = x0.mean(axis=0)
    plain = _plain_mixing(graph, x0, 1500)
    states = lockstep(NodeRule(OPS()), graph, params, rounds=1500)
    ops_err = max(
        float((s.x / s.omega - torch.from_numpy(mean)).abs().max()) for s in states.values()
    )
    plain_err = float(np.abs(plain - mean).max())
    assert ops_err < 1e-8
    assert plain_err > 1e-2


@given(strongly_connected_digraphs(), st.integers(0, 1000))
@settings(max_examples=10)
def test_debiasing_matters_random(graph: TrustGraph, seed: int) -> None:
    """I-OPS-3 over random digraphs whose push-sum weights are far from doubly stochastic."""
    w = uniform_push_sum(graph).mixing_matrix()
    vals, vecs = np.linalg.eig(w.T)
    pi = np.abs(np.real(vecs[:, np.argmax(np.real(vals))]))
    pi = pi / pi.sum() * len(graph)
    assume(np.abs(pi - 1).max() > 0.2)
    params = _params(graph, seed)
    x0 = np.stack([params[n].numpy() for n in graph.nodes])
    spread = np.abs(x0 - x0.mean(axis=0)).max()
    assume(spread > 0.5)
    plain = _plain_mixing(graph, x0, 1500)
    assert np.abs(plain - x0.mean(axis=0)).max() > 1e-3


@pytest.mark.parametrize("graph", [ring(6), ring(7, directed=True), complete(5)], ids=str)
def test_omega_stays_one_on_doubly_stochastic(graph: TrustGraph) -> None:
    """I-OPS-4: doubly stochastic weights keep omega == 1 and z == x at every step."""
    weighted = prepare(graph, mixing="push-sum", algorithm="ops")
    assert np.allclose(weighted.mixing_matrix().sum(axis=0), 1.0)
    seen: list[float] = []

    def check(_t: int, states: dict[str, PushSumState]) -> None:
        for s in states.values():
            seen.append(s.omega)
            assert s.omega == pytest.approx(1.0, abs=1e-14)
            assert torch.allclose(NodeRule(OPS()).model(s), s.x, atol=1e-14)

    lockstep(
        NodeRule(OPS()),
        weighted,
        _params(graph, 1),
        rounds=20,
        lr=0.1,
        grad=_grad(1),
        on_round=check,
    )
    assert len(seen) == 20 * len(graph)


def test_complete_uniform_gives_mean_in_one_step() -> None:
    """I-OPS-5: W = 11^T/n puts every z at the mean of the post-step x after one round."""
    graph = complete(5)
    weighted = graph.with_weights({(u, v): 0.2 for u in graph.nodes for v in graph.nodes})
    params = _params(graph, 2)
    grad = _grad(2)
    lr = 0.3
    expected = torch.stack([params[n] - lr * grad(n, 0, params[n]) for n in graph.nodes]).mean(0)
    states = lockstep(NodeRule(OPS()), weighted, params, rounds=1, lr=lr, grad=grad)
    for s in states.values():
        assert torch.allclose(NodeRule(OPS()).model(s), expected, atol=1e-12)


def test_identity_weights_give_local_sgd() -> None:
    """I-OPS-5: W = I is independent online gradient descent at every node."""
    graph = TrustGraph.from_edges([], name="isolated", nodes=["a", "b", "c"])
    weighted = graph.with_weights({(n, n): 1.0 for n in graph.nodes})
    params = _params(graph, 3)
    lr = 0.2

    def grad(node: str, t: int, model: torch.Tensor) -> torch.Tensor:
        return model - 1.0

    states = lockstep(NodeRule(OPS()), weighted, params, rounds=5, lr=lr, grad=grad)
    for n in graph.nodes:
        x = params[n].clone()
        for _ in range(5):
            x = x - lr * (x - 1.0)
        assert torch.allclose(states[n].x, x, atol=1e-14)


def test_gradient_at_debiased_point_and_step_on_numerator() -> None:
    """I-OPS-6: the gradient is taken at z = x/omega and subtracted from x."""
    ops = NodeRule(OPS())
    state = PushSumState(
        torch.tensor([[2.0, 4.0]], dtype=torch.float64),
        torch.tensor([0.5], dtype=torch.float64),
        torch.zeros(1, dtype=torch.long),
    )
    assert torch.equal(ops.model(state), torch.tensor([4.0, 8.0], dtype=torch.float64))
    ctx = RoundContext(
        node="a", round=0, lr=0.1, self_weight=0.5, out_weights={"b": 0.5}, in_weights={}
    )
    new, outbox = ops.step(state, torch.tensor([1.0, 1.0], dtype=torch.float64), ctx)
    assert torch.allclose(new.x, torch.tensor([[1.9, 3.9]], dtype=torch.float64))
    assert torch.allclose(outbox["b"].tensors["x"], 0.5 * new.x[0])
    assert outbox["b"].scalars["omega"] == pytest.approx(0.25)


@given(strongly_connected_digraphs(), st.integers(0, 1000), st.randoms(use_true_random=False))
@settings(max_examples=20)
def test_snapshot_semantics(graph: TrustGraph, seed: int, rnd) -> None:  # type: ignore[no-untyped-def]
    """I-OPS-7: results are bit-identical whatever order nodes are processed in."""
    params = _params(graph, seed)
    order = list(graph.nodes)
    rnd.shuffle(order)
    a = lockstep(NodeRule(OPS()), graph, params, rounds=8, lr=0.1, grad=_grad(seed))
    b = lockstep(NodeRule(OPS()), graph, params, rounds=8, lr=0.1, grad=_grad(seed), order=order)
    for n in graph.nodes:
        assert torch.equal(a[n].x, b[n].x) and a[n].omega == b[n].omega


def test_time_varying_schedule_reaches_average() -> None:
    """OPS on the one-peer exponential schedule: exact average with zero step."""
    schedule = parse_spec("one-peer-exponential:8")
    params = _params(schedule.union(), 4)
    mean = torch.stack([params[n] for n in schedule.nodes]).mean(0)
    states = lockstep(NodeRule(OPS()), schedule, params, rounds=60)
    for s in states.values():
        assert (s.x / s.omega - mean).abs().max() < 1e-10


def test_lost_message_loses_mass() -> None:
    """Plain push-sum under a lost message: sum omega drops below n (why robust push-sum exists)."""
    graph = parse_spec("directed-ring:4")
    params = _params(graph.union(), 5)
    states = lockstep(NodeRule(OPS()), graph, params, rounds=1, drop=lambda s, r, t, p: s == "n0")
    assert sum(s.omega for s in states.values()) == pytest.approx(3.5)


def test_mix_uses_only_arrived_shares() -> None:
    """The rule with a hand-built inbox of two rows: own share plus the shares that
    arrived, nothing else (row 0 heard ``b`` only, row 1 both)."""
    rule = PushSumRule()
    f64 = torch.float64
    state = rule.init(torch.tensor([[1.0], [1.0]], dtype=f64))
    rows = Rows(round=0, lr=0.0, self_weight=torch.tensor([0.25, 0.25], dtype=f64))
    half = torch.tensor([0.5, 0.5], dtype=f64)
    inbox = [
        Slot(
            {"x": torch.tensor([[2.0], [2.0]], dtype=f64)},
            {"omega": half},
            half,
            torch.tensor([True, True]),
        ),
        Slot(
            {"x": torch.tensor([[7.0], [4.0]], dtype=f64)},
            {"omega": half},
            half,
            torch.tensor([False, True]),
        ),
    ]
    new, out = rule.mix(state, 0, inbox, rows)
    assert out is None
    assert new.x[:, 0].tolist() == pytest.approx([2.25, 6.25])
    assert new.omega.tolist() == pytest.approx([0.75, 1.25])


@pytest.mark.parametrize("robust", [False, True], ids=["plain", "robust"])
def test_a_node_whose_in_neighbours_went_silent_holds_and_lives(robust: bool) -> None:
    """Directed ring n0 -> n1 -> n2 -> n0 in deadline mode; n0 dies at round 5. Push-sum
    would have n1 give away half its weight every round until it underflows (about 1,080
    rounds); instead n1 holds after ISOLATED_AFTER silent rounds (pushes nothing, keeps its
    weight, local SGD on z), then so does n2, and the run ends with finite models."""
    from fedcore.algorithms.ops import ISOLATED_AFTER
    from fedcore.testing import make_network

    settings = {
        "data.batch_size": 8,
        "algorithm.lr": 0.05,
        "algorithm.robust": robust,
        "transport.mode": "deadline",
        "transport.deadline_s": 0.001,
        "faults.crashes": [{"node": "n0", "at": 5}],
    }
    net = make_network("directed-ring:3", algorithm="ops", settings=settings).run(1200)
    for node in ("n1", "n2"):
        state = net.nodes[node].state
        assert int(state.silent) >= ISOLATED_AFTER
        assert 0.5 ** (ISOLATED_AFTER + 6) < float(state.omega) <= 3.0
        assert bool(torch.isfinite(net.nodes[node].model()).all())
    # Holding nodes send nothing: after the hold began, n1 and n2 pushed no message.
    assert not [m for m in net.messages if m.round > 5 + 3 * ISOLATED_AFTER]
    assert net.evaluate()["node_accuracy"]["n1"] > 0.3
