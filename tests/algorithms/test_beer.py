"""BEER (compressed gradient tracking): the trackers' sum is the sum of the latest gradients
after every round whatever the codec, the public copies are every neighbour's alike, and on
the heterogeneous quadratic of test_tracking.py it reaches the optimum of the sum with a
compressing codec and a constant step where CHOCO with the same codec and bytes does not."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import make_algorithm
from fedcore.algorithms.rule import Rows
from fedcore.compression import make_codec
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.testing import lockstep
from fedcore.topology import metropolis_hastings, parse_spec
from tests.algorithms.test_tracking import _renamed, _targets
from tests.strategies import connected_undirected_graphs, random_grad, random_params

D = 3


@settings(max_examples=20, deadline=None)
@given(st.data(), st.sampled_from(["fp32", "topk", "sign", "qsgd"]), st.integers(0, 50))
def test_the_trackers_sum_is_the_sum_of_the_latest_gradients(
    data: Any, codec: str, seed: int
) -> None:
    """After each round's mix, sum_i v_i = sum_i g_i (W doubly stochastic: the consensus
    step moves no mass), and each peer's sums of public copies are its neighbours' own."""
    graph = _renamed(data.draw(connected_undirected_graphs()), seed)
    weighted = metropolis_hastings(graph)
    grad = random_grad(seed, D, pull=0.5)
    latest: dict[str, torch.Tensor] = {}
    codecs = {v: make_codec(codec, ratio=0.33, bits=2, seed=i) for i, v in enumerate(graph.nodes)}

    def tracked(node: str, t: int, model: torch.Tensor) -> torch.Tensor:
        latest[node] = grad(node, t, model)
        return latest[node]

    def check(t: int, states: dict[str, Any]) -> None:
        total_v = sum(s.v.view(-1) for s in states.values())
        total_g = sum(latest[n] for n in states)
        torch.testing.assert_close(total_v, total_g, rtol=1e-9, atol=1e-9)
        for i, s in states.items():
            want_x = weighted.self_weight(i) * states[i].xhat[0]
            want_v = weighted.self_weight(i) * states[i].vhat[0]
            for j in sorted(weighted.in_neighbours(i)):
                want_x = want_x + weighted.weight(j, i) * states[j].xhat[0]
                want_v = want_v + weighted.weight(j, i) * states[j].vhat[0]
            torch.testing.assert_close(s.sx[0], want_x, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(s.sv[0], want_v, rtol=1e-9, atol=1e-9)

    rule = make_algorithm("beer", gamma=0.4)
    params = random_params(graph, seed, D)
    lockstep(rule, weighted, params, rounds=6, lr=0.1, grad=tracked, on_round=check, codecs=codecs)


def _distance(algorithm: str, codec: str, rounds: int) -> float:
    """The largest distance of any peer's model from the minimiser of sum_i ||x - b_i||^2/2
    (test_tracking.py's peers, b_i far apart) on a ring of 6, lr = 0.1, gamma = 0.5 (the
    default), every peer compressing with ``codec`` (top-k: one value of 3; scaled sign)."""
    graph = parse_spec("ring:6")
    b, optimum = _targets(graph, D)
    codecs = {v: make_codec(codec, ratio=0.33, seed=i) for i, v in enumerate(graph.nodes)}
    out = lockstep(
        make_algorithm(algorithm, gamma=0.5),
        graph,
        {v: torch.zeros(D, dtype=torch.float64) for v in graph.nodes},
        rounds=rounds,
        lr=0.1,
        grad=lambda node, t, x: x - b[node],
        codecs=codecs,
    )
    return max(float((out[v].x - optimum).abs().max()) for v in graph.nodes)


@pytest.mark.parametrize("codec", ["topk", "sign"])
def test_beer_reaches_the_optimum_with_compression_and_choco_does_not(codec: str) -> None:
    """BEER sends two compressed tensors a round, CHOCO one: CHOCO gets twice the rounds
    (the same bytes) and still stops at its bias floor (0.94 for both codecs), where BEER is
    within 6e-8 of the optimum (top-k; 3e-8 with sign)."""
    assert _distance("beer", codec, 200) < 1e-6
    assert _distance("choco", codec, 400) > 0.1


def test_local_steps_and_bad_gamma_are_refused() -> None:
    rule = make_algorithm("beer")
    rows = Rows(round=0, lr=0.1, self_weight=torch.ones(1, dtype=torch.float64))
    with pytest.raises(AlgorithmError, match=r"run\.local_steps = 1"):
        rule.local_step(rule.init(torch.zeros(1, 2)), torch.zeros(1, 2), rows)
    for bad in (0, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ConfigError, match=r"'beer': gamma = .* must be a number in \(0, 1\]"):
            make_algorithm("beer", gamma=bad)
    assert make_algorithm("beer", gamma=1).gamma == 1  # the extreme that is allowed


@pytest.mark.parametrize("mode", ["deadline", "strict"])
def test_deadline_mode_warns_that_a_late_message_is_lost_for_good(tmp_path: Any, mode: str) -> None:
    """CHOCO and BEER keep copies of their neighbours' public values: in deadline mode a
    message past the deadline leaves them behind for good, which the summary's warnings say
    (no refusal: every message may well arrive in time); strict mode says nothing."""
    import fedcore

    result = fedcore.run(
        None,
        out_dir=tmp_path,
        threads=1,
        **{
            "algorithm.name": "beer",
            "topology.kind": "ring",
            "topology.nodes": 4,
            "run.rounds": 2,
            "run.eval_every": 2,
            "transport.mode": mode,
        },
    )
    said = [w for w in result.summary["warnings"] if "needs every message" in w]
    assert len(said) == (mode == "deadline"), result.summary["warnings"]
    if said:
        assert "'beer'" in said[0] and "transport.mode = 'strict'" in said[0]
