"""Gradient tracking (DSGT, Push-Pull, Push-DIGing): the trackers' sum is the sum of the
latest gradients after every round (under drops, the robust forms' trackers plus the mass in
flight), a quadratic's optimum is reached with a constant step where D-PSGD stops at a bias
(under drops, the robust forms' and not the plain ones'), and Push-Pull's weights are row-
and column-stochastic from each peer's own neighbours."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import RoundContext, make_algorithm
from fedcore.algorithms.rule import Rows, Slot
from fedcore.errors import AlgorithmError, ConfigError, ProtocolError
from fedcore.messages import Payload
from fedcore.testing import lockstep
from fedcore.topology import Topology, TrustGraph, parse_spec
from tests.strategies import (
    connected_undirected_graphs,
    random_grad,
    random_params,
    strongly_connected_digraphs,
)

D = 3


def _renamed(graph: TrustGraph, seed: int) -> TrustGraph:
    """``graph`` with odd ids (not n0, n1 ...), in a shuffled order."""
    names = {v: f"peer-{(7 * i + seed) % 97}x" for i, v in enumerate(graph.nodes)}
    edges = [(names[u], names[v]) for u, v in graph.edges()]
    return TrustGraph.from_edges(edges, name="odd", nodes=sorted(names.values()))


@settings(max_examples=25, deadline=None)
@given(st.data(), st.sampled_from(["dsgt", "push-pull", "push-diging"]), st.integers(0, 50))
def test_the_trackers_sum_is_the_sum_of_the_latest_gradients(
    data: Any, algorithm: str, seed: int
) -> None:
    shapes = connected_undirected_graphs() if algorithm == "dsgt" else strongly_connected_digraphs()
    graph = _renamed(data.draw(shapes), seed)
    grad = random_grad(seed, D, pull=0.5)
    latest: dict[str, torch.Tensor] = {}

    def tracked(node: str, t: int, model: torch.Tensor) -> torch.Tensor:
        latest[node] = grad(node, t, model)
        return latest[node]

    def check(t: int, states: dict[str, Any]) -> None:
        total_y = sum(s.ybar.view(-1) for s in states.values())  # after the mix: C y, its sum
        total_g = sum(latest[n] for n in states)
        torch.testing.assert_close(total_y, total_g, rtol=1e-9, atol=1e-9)

    rule = make_algorithm(algorithm)
    params = random_params(graph, seed, D)
    lockstep(rule, graph, params, rounds=6, lr=0.1, grad=tracked, on_round=check)


@settings(max_examples=15, deadline=None)
@given(
    st.data(),
    st.sampled_from(["dsgt", "push-pull", "push-diging"]),
    st.integers(0, 50),
    st.floats(0.1, 0.6),
)
def test_under_drops_the_robust_trackers_and_the_mass_in_flight_sum_to_the_gradients(
    data: Any, algorithm: str, seed: int, p: float
) -> None:
    """Each round, ``sum_i ybar_i + sum_edges (sigma - rho) = sum_i g_i`` with messages lost
    at random; the last round delivers them all, and nothing is in flight after it."""
    shapes = connected_undirected_graphs() if algorithm == "dsgt" else strongly_connected_digraphs()
    graph = _renamed(data.draw(shapes), seed)
    grad = random_grad(seed, D, pull=0.5)
    rounds = 6
    rng = random.Random(seed)
    latest: dict[str, torch.Tensor] = {}

    def tracked(node: str, t: int, model: torch.Tensor) -> torch.Tensor:
        latest[node] = grad(node, t, model)
        return latest[node]

    def check(t: int, states: dict[str, Any]) -> None:
        total_y = sum(s.ybar.view(-1) for s in states.values())
        flight = sum(s.sent_y.sum(0) - s.seen_y.sum(0) for s in states.values())
        total_g = sum(latest[n] for n in states)
        torch.testing.assert_close(total_y + flight, total_g, rtol=1e-9, atol=1e-9)
        if t == rounds - 1:  # every message of the last round arrived
            torch.testing.assert_close(flight, torch.zeros(D, dtype=torch.float64))

    rule = make_algorithm(algorithm, robust=True)
    params = random_params(graph, seed, D)
    lockstep(
        rule,
        graph,
        params,
        rounds=rounds,
        lr=0.1,
        grad=tracked,
        on_round=check,
        drop=lambda s, r, t, phase: t < rounds - 1 and rng.random() < p,
    )


def _model(state: Any) -> torch.Tensor:
    """A peer's model: ``x``, or push-sum's de-biased ``x / omega``."""
    omega = getattr(state, "omega", None)
    return state.x.view(-1) if omega is None else state.x.view(-1) / float(omega.view(-1)[0])


def _targets(graph: Topology, d: int = D) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Each peer's ``b_i`` of the loss ``||x - b_i||^2/2``, far apart (strongly
    heterogeneous), and the minimiser of their sum, the mean of the ``b_i``."""
    gen = torch.Generator().manual_seed(0)
    b = {
        v: torch.randn(d, generator=gen, dtype=torch.float64) * (1 + i)
        for i, v in enumerate(graph.nodes)
    }
    return b, torch.stack(list(b.values())).mean(0)


def _quadratic(
    algorithm: str, graph: Topology, rounds: int, drop: float = 0.0, **options: Any
) -> float:
    """The largest distance of any peer's model from the minimiser of sum_i ||x - b_i||^2/2
    (:func:`_targets`), a constant step; each message lost with probability ``drop``."""
    b, optimum = _targets(graph)
    params = {v: torch.zeros(D, dtype=torch.float64) for v in graph.nodes}
    rng = random.Random(1)
    out = lockstep(
        make_algorithm(algorithm, **options),
        graph,
        params,
        rounds=rounds,
        lr=0.2,
        grad=lambda node, t, x: x - b[node],
        drop=(lambda *_: rng.random() < drop) if drop else None,
    )
    return max(float((_model(out[v]) - optimum).abs().max()) for v in graph.nodes)


def test_tracking_reaches_the_optimum_of_the_sum_and_dpsgd_does_not() -> None:
    assert _quadratic("dsgt", parse_spec("ring:8"), 300) < 1e-6
    assert _quadratic("push-pull", parse_spec("social:8"), 300) < 1e-6
    assert _quadratic("push-diging", parse_spec("social:8"), 300) < 1e-6
    assert _quadratic("dpsgd", parse_spec("ring:8"), 300) > 0.1  # its bias floor


def test_push_pull_weights_are_each_peers_own() -> None:
    """R: 1/(in-degree + 1) over what a peer hears and itself (rows sum to 1); C: the
    sender's push-sum shares 1/(out-degree + 1) (columns sum to 1), so the mix of a
    constant model is that constant, and the trackers' total is kept."""
    rule = make_algorithm("push-pull")
    w = torch.tensor([1 / 3, 1 / 3], dtype=torch.float64)  # two senders of out-degree 2
    rows = Rows(
        round=0,
        lr=0.5,
        self_weight=torch.tensor([0.5, 0.25], dtype=torch.float64),
        in_degree=torch.tensor([2, 2]),
    )
    state = rule.init(torch.full((2, 1), 3.0, dtype=torch.float64))
    state, _ = rule.step(state, torch.zeros(2, 1, dtype=torch.float64), rows)
    inbox = [
        Slot(
            {
                "v": torch.full((2, 1), 3.0, dtype=torch.float64),
                "y": torch.ones(2, 1, dtype=torch.float64),
            },
            {},
            w,
            torch.tensor([True, True]),
        ),
        Slot(
            {
                "v": torch.full((2, 1), 3.0, dtype=torch.float64),
                "y": torch.ones(2, 1, dtype=torch.float64),
            },
            {},
            w,
            torch.tensor([True, False]),
        ),
    ]
    new, _ = rule.mix(state, 0, inbox, rows)
    assert new.x.tolist() == [[3.0], [3.0]]  # R's rows are stochastic, a missing share to self
    assert new.ybar.view(-1).tolist() == pytest.approx([2 / 3, 1 / 3])  # C's shares, one lost


def test_local_steps_are_refused() -> None:
    rule = make_algorithm("dsgt")
    rows = Rows(round=0, lr=0.1, self_weight=torch.ones(1, dtype=torch.float64))
    with pytest.raises(AlgorithmError, match=r"run\.local_steps = 1"):
        rule.local_step(rule.init(torch.zeros(1, 2)), torch.zeros(1, 2), rows)


@pytest.mark.parametrize(
    ("algorithm", "spec"),
    [("dsgt", "ring:6"), ("push-pull", "social:8"), ("push-diging", "social:8")],
)
def test_under_drops_the_robust_form_reaches_the_optimum_and_the_plain_one_does_not(
    algorithm: str, spec: str
) -> None:
    """20% of the messages lost: a plain tracker loses their mass for good (Push-DIGing's
    weights too, whose step then grows without bound); the running totals deliver it later."""
    graph = parse_spec(spec)
    assert _quadratic(algorithm, graph, 120, drop=0.2, robust=True) < 1e-6
    assert not _quadratic(algorithm, graph, 120, drop=0.2) < 0.1  # or NaN: diverged


@pytest.mark.parametrize("name", ["dsgt", "push-pull", "push-diging"])
@pytest.mark.parametrize("robust", [None, 1, 0, "true", 1.0, []])
def test_robust_must_be_a_bool(name: str, robust: Any) -> None:
    why = rf"^algorithm\.robust for {name!r} must be true or false"
    with pytest.raises(ConfigError, match=why) as err:
        make_algorithm(name, robust=robust)
    assert "\n" not in str(err.value)


def test_a_shares_total_that_goes_backwards_is_refused() -> None:
    """A robust Push-Pull peer refuses a total of shares below the last it applied on that
    edge (a replayed or stale message), and accepts one that grew."""
    rule = make_algorithm("push-pull", robust=True)
    seen = torch.tensor([0.0, 1.5], dtype=torch.float64)  # per in-edge: a, b
    state = rule.init(torch.zeros(1, 2))._replace(seen_n=seen)
    ctx = RoundContext(
        node="c",
        round=3,
        lr=0.1,
        self_weight=0.5,
        out_weights={},
        in_weights={"a": 0.5, "b": 0.5},
    )
    rule.accept(state, 0, "b", Payload({}, {"shares": 2.0}), ctx)
    with pytest.raises(ProtocolError, match=r"smaller than the 1\.5 already applied"):
        rule.accept(state, 0, "b", Payload({}, {"shares": 1.0}), ctx)


def test_the_memory_bound_counts_robust_push_digings_four_totals_an_edge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Robust Push-DIGing keeps four model-sized float64 totals an edge (sent and seen, of
    u and of y), robust Push-Pull two, as robust push-sum: a machine with room for two but
    not four refuses the first only, in one line."""
    import dataclasses

    from fedcore.config import Config
    from fedcore.errors import ConfigError
    from fedcore.setup import plan

    topology = dataclasses.replace(Config().topology, kind="social", nodes=6)
    edges = plan.estimated_edges(topology, 6)
    model = plan.ModelSize(params=1000, itemsize=4)
    models = 6 * 1000 * 4 * plan.COPIES
    room = edges * plan.EDGE_BYTES + models + 3 * edges * 1000 * 8  # two fit, four do not
    monkeypatch.setattr(plan, "physical_memory", lambda: room)
    shape = plan.Shape(6, None)
    pull = make_algorithm("push-pull", robust=True)
    plan.check_run_memory(topology, pull, shape, None, model)
    with pytest.raises(ConfigError, match="this run needs at least"):
        plan.check_run_memory(
            topology, make_algorithm("push-diging", robust=True), shape, None, model
        )


def test_a_robust_rule_with_fp16_warns_that_its_totals_may_pass_65504(tmp_path: Any) -> None:
    """The running totals grow every round; fp16 stops at 65504, bf16 does not: the run
    goes on and its summary's warnings say so, naming bf16."""
    import fedcore

    settings = {"topology.kind": "social", "topology.nodes": 4, "run.rounds": 2}
    warned = {}
    for codec in ("fp16", "bf16"):
        result = fedcore.run(
            None,
            out_dir=tmp_path / codec,
            threads=1,
            **settings,
            **{"algorithm.name": "push-pull", "algorithm.robust": True},
            **{"compression.codec": codec, "run.eval_every": 2},
        )
        warned[codec] = [w for w in result.summary["warnings"] if "65504" in w]
    assert len(warned["fp16"]) == 1 and "'bf16'" in warned["fp16"][0]
    assert warned["bf16"] == []
