"""DeepSqueeze (I-DS-1..5) and CHOCO (I-CH-1) invariants, over codecs and random graphs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import CHOCO, Algorithm, DeepSqueeze, DeepSqueezeState
from fedcore.compression import Codec, make_codec
from fedcore.errors import ConfigError
from fedcore.node import NodeRule
from fedcore.testing import lockstep
from fedcore.topology import TrustGraph, metropolis_hastings, parse_spec
from tests.strategies import GradFn, connected_undirected_graphs, random_grad, random_params

D = 12
CODECS = ["sign", "topk", "qsgd", "randk", "fp16"]


def _codecs(graph: TrustGraph, name: str) -> dict[str, Codec]:
    return {n: make_codec(name, bits=2, ratio=0.25, seed=i) for i, n in enumerate(graph.nodes)}


def _grad(seed: int) -> GradFn:
    return random_grad(seed, D, pull=0.2)


def _stack(states: dict[str, object], field: str = "x") -> torch.Tensor:
    return torch.stack([getattr(s, field) for s in states.values()])


def _rounds_follow_exact_sgd(
    algo: Algorithm, graph: TrustGraph, seed: int, codec: str
) -> Iterator[dict[str, Any]]:
    """Run 5 rounds; assert each moves the mean by exactly -lr * mean g; yield the states."""
    weighted = metropolis_hastings(graph)
    codecs = _codecs(graph, codec)
    grad = _grad(seed)
    states = {n: algo.init(p) for n, p in random_params(graph, seed, D).items()}
    for t in range(5):
        before = _stack(states).mean(0)
        mean_g = torch.stack([grad(n, t, s.x) for n, s in states.items()]).mean(0)
        states = lockstep(
            algo, weighted, {}, rounds=1, lr=0.1, states=states, codecs=codecs,
            grad=lambda n, _t, m, t=t: grad(n, t, m),
        )  # fmt: skip
        assert torch.allclose(_stack(states).mean(0), before - 0.1 * mean_g, atol=1e-10)
        yield states


@given(connected_undirected_graphs(), st.integers(0, 1000), st.sampled_from(CODECS))
@settings(max_examples=30)
def test_mean_follows_exact_sgd_whatever_the_codec(
    graph: TrustGraph, seed: int, codec: str
) -> None:
    """I-DS-2: x_bar(t+1) = x_bar(t) - lr * mean g, for any codec and doubly stochastic W."""
    for _ in _rounds_follow_exact_sgd(NodeRule(DeepSqueeze(eta=0.3)), graph, seed, codec):
        pass


@pytest.mark.parametrize("codec", CODECS)
def test_error_feedback_telescopes(codec: str) -> None:
    """I-DS-3: c_t + delta_t == x_half_t + delta_(t-1), every node, every step."""
    graph = parse_spec("ring:5")
    algo = NodeRule(DeepSqueeze(eta=0.2))
    codecs = _codecs(graph.union(), codec)
    states = {n: algo.init(p) for n, p in random_params(graph, 1, D).items()}
    grad = _grad(1)
    weighted = metropolis_hastings(graph)
    for t in range(4):
        old = dict(states)
        from fedcore.algorithms import RoundContext

        for n in graph.nodes:
            g = weighted.at(t)
            ctx = RoundContext(
                node=n, round=t, lr=0.1, self_weight=g.self_weight(n),
                out_weights=g.out_weights(n), in_weights=g.in_weights(n), codec=codecs[n],
            )  # fmt: skip
            new, _ = algo.step(old[n], grad(n, t, old[n].x), ctx)
            assert isinstance(new, DeepSqueezeState) and new.c is not None
            x_half = old[n].x - 0.1 * grad(n, t, old[n].x)
            assert torch.allclose(new.c + new.delta, x_half + old[n].delta, atol=1e-12)
        states = lockstep(
            algo, weighted, {}, rounds=1, lr=0.1, states=states, codecs=codecs,
            grad=lambda n, _t, m, t=t: grad(n, t, m),
        )  # fmt: skip


@pytest.mark.parametrize(
    "algo,spec",
    [(NodeRule(DeepSqueeze(eta=1.0)), "torus:3x3"), (NodeRule(CHOCO(gamma=1.0)), "ring:4")],
    ids=["deepsqueeze-eta1", "choco-gamma1"],
)
def test_identity_codec_and_full_step_is_atc_dpsgd(algo: Algorithm, spec: str) -> None:
    """I-DS-1 (and CHOCO's first step): C = id, step 1 gives X(t+1) = (X(t) - lr G) W."""
    graph = metropolis_hastings(parse_spec(spec))
    assert isinstance(graph, TrustGraph)
    params = random_params(graph, 2, D)
    grad = _grad(2)
    out = lockstep(algo, graph, params, rounds=1, lr=0.1, grad=grad)
    w = torch.from_numpy(graph.mixing_matrix())
    x_half = torch.stack([params[n] - 0.1 * grad(n, 0, params[n]) for n in graph.nodes])
    expected = w.T @ x_half
    for i, n in enumerate(graph.nodes):
        assert torch.allclose(out[n].x, expected[i], atol=1e-12)


@pytest.mark.parametrize("codec", ["sign", "topk"])
def test_no_mixing_is_local_sgd(codec: str) -> None:
    """I-DS-4: W = I gives local SGD whatever C (delta evolves but never reaches x)."""
    nodes = ["a", "b"]
    graph = TrustGraph.from_edges([], name="isolated", nodes=nodes).with_weights(
        {(n, n): 1.0 for n in nodes}
    )
    params = random_params(graph, 3, D)
    out = lockstep(
        NodeRule(DeepSqueeze(eta=0.5)), graph, params, rounds=3, lr=0.5, grad=lambda n, t, x: x,
        codecs=_codecs(graph, codec),
    )  # fmt: skip
    for n in nodes:
        assert torch.allclose(out[n].x, params[n] * 0.5**3, atol=1e-12)


def test_consensus_contracts_at_the_lazy_rate() -> None:
    """I-DS-5: lr = 0, C = id: disagreement shrinks by max|eig((1-eta)I + eta W)| (excl. 1)."""
    graph = metropolis_hastings(parse_spec("ring:6"))
    assert isinstance(graph, TrustGraph)
    eta = 0.5
    w = graph.mixing_matrix()
    eig = np.sort(np.abs(np.linalg.eigvals((1 - eta) * np.eye(6) + eta * w)))
    rate = eig[-2]
    params = random_params(graph, 4, D)
    states = {n: NodeRule(DeepSqueeze(eta)).init(p) for n, p in params.items()}

    def spread(s: dict[str, DeepSqueezeState]) -> float:
        x = _stack(s)
        return float((x - x.mean(0)).norm())

    for _ in range(8):
        before = spread(states)
        states = lockstep(NodeRule(DeepSqueeze(eta)), graph, {}, rounds=1, states=states)
        assert spread(states) <= rate * before + 1e-12


@given(connected_undirected_graphs(), st.integers(0, 1000), st.sampled_from(CODECS))
@settings(max_examples=25)
def test_choco_mean_preserved_and_copies_summed(graph: TrustGraph, seed: int, codec: str) -> None:
    """I-CH-1: the consensus step preserves the mean; every peer's weighted sum of public
    copies is ``W_ii xhat_i + sum_j W_ji xhat_j`` of the neighbours' own ``xhat``."""
    weighted = metropolis_hastings(graph)
    for states in _rounds_follow_exact_sgd(NodeRule(CHOCO(gamma=0.4)), graph, seed, codec):
        for i, s in states.items():
            want = weighted.self_weight(i) * states[i].xhat[0]
            for j in sorted(weighted.in_neighbours(i)):
                want = want + weighted.weight(j, i) * states[j].xhat[0]
            assert torch.allclose(s.s[0], want, atol=1e-12), i


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="eta"):
        NodeRule(DeepSqueeze(eta=0.0))
    with pytest.raises(ConfigError, match="gamma"):
        NodeRule(CHOCO(gamma=1.5))


def test_over_the_network_deepsqueeze_keeps_the_mean_naive_does_not() -> None:
    """End to end: sign-compressed D-PSGD moves the mean with lr = 0; DeepSqueeze does not."""
    from fedcore.testing import make_network

    means = {}
    for algorithm in ("dpsgd", "deepsqueeze"):
        net = make_network(
            "ring:5",
            algorithm=algorithm,
            settings={"compression.codec": "sign", "algorithm.lr": 0.0, "model.dtype": "float64"},
        )
        start = net.average_model().clone()
        net.run(3)
        means[algorithm] = float((net.average_model() - start).abs().max())
        numel = start.numel()
        sizes = {m.nbytes for m in net.messages}
        assert sizes == {(numel + 7) // 8 + 8}  # 1 bit a value plus one scale
    assert means["deepsqueeze"] < 1e-9
    assert means["dpsgd"] > 1e-3


def test_choco_refuses_a_schedule() -> None:
    """CHOCO's weighted sums of public copies need the same weights every round."""
    from fedcore.config import load_config
    from fedcore.setup.prepare import prepare_run
    from fedcore.topology import Schedule

    ring, torus = parse_spec("ring:9"), parse_spec("torus:3x3")
    config = load_config(None, ["algorithm.name=choco", "topology.nodes=9"])
    with pytest.raises(ConfigError, match=r"fixed graph.*schedule of 2"):
        prepare_run(config, trust=Schedule([ring, torus], name="ring-torus"))
