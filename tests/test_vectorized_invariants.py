"""The invariants of reference/algorithms.md, held by the vectorized engine.

Every case starts the nodes from different random parameters (a stacked state built with
the batched algorithm's own ``init``) and takes zero steps (``algorithm.lr = 0``), so what
the invariants promise is exact: push-sum mass, the network average, consensus.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import load_config
from fedcore.runners.network import prepare_run
from fedcore.runners.vectorized import VectorizedNetwork


def _network(*settings_: str, seed: int = 0) -> tuple[VectorizedNetwork, torch.Tensor]:
    config = load_config(None, ["algorithm.lr=0", "run.rounds=1000", *settings_])
    net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(net.n, net.d, generator=gen, dtype=net.dtype)
    net.state = net.form.init(start)
    return net, start


def _run(net: VectorizedNetwork, rounds: int) -> None:
    for _ in range(rounds):
        net.run_round()


@settings(max_examples=4)
@given(seed=st.integers(0, 10_000), nodes=st.integers(4, 12))
def test_push_sum_reaches_the_exact_average_on_a_digraph(seed: int, nodes: int) -> None:
    """I-OPS: mass is conserved and every de-biased model reaches the initial average."""
    net, start = _network(
        "topology.kind=social", f"topology.nodes={nodes}", f"topology.seed={seed}", seed=seed
    )
    _run(net, 400)
    omega = net.state.omega
    assert abs(float(omega.sum()) - nodes) < 1e-9 * nodes
    assert torch.allclose(net.state.x.sum(dim=0), start.sum(dim=0), atol=1e-4)
    target = start.mean(dim=0)
    assert float((net.model() - target).abs().max()) < 1e-4


@settings(max_examples=2)
@given(seed=st.integers(0, 10_000))
def test_robust_push_sum_survives_thirty_percent_loss(seed: int) -> None:
    """I-RPSUM-2: under independent loss, robust push-sum still reaches the average."""
    net, start = _network(
        "topology.kind=social",
        "topology.nodes=10",
        "algorithm.robust=true",
        "faults.drop=0.3",
        f"faults.seed={seed}",
        seed=seed,
    )
    _run(net, 600)
    assert float((net.model() - start.mean(dim=0)).abs().max()) < 1e-4


@settings(max_examples=6)
@given(
    algorithm=st.sampled_from(["dpsgd", "dog", "deepsqueeze", "choco"]),
    codec=st.sampled_from(["fp32", "sign", "topk"]),
    seed=st.integers(0, 10_000),
)
def test_gossip_families_keep_the_mean(algorithm: str, codec: str, seed: int) -> None:
    """I-DOG-1 / I-DS-2 / CHOCO: on doubly stochastic weights the network mean never moves
    at zero step: DeepSqueeze and CHOCO whatever the codec (they mix the node's own
    compressed value), D-PSGD uncompressed; uncompressed gossip also reaches consensus."""
    if algorithm in ("dpsgd", "dog"):
        codec = "fp32"  # a compressed neighbour against an exact self value moves the mean
    net, start = _network(
        "topology.kind=erdos-renyi",
        "topology.p=0.5",
        "topology.undirected=true",
        "topology.nodes=8",
        f"topology.seed={seed % 50}",
        f"algorithm.name={algorithm}",
        f"compression.codec={codec}",
        "compression.ratio=0.3",
        seed=seed,
    )
    _run(net, 60)
    mean = net.model().to(torch.float64).mean(dim=0)
    assert float((mean - start.to(torch.float64).mean(dim=0)).abs().max()) < 1e-5
    if codec == "fp32" and algorithm in ("dpsgd", "dog"):
        assert float((net.model() - start.mean(dim=0)).abs().max()) < 1e-3


def test_mean_moves_by_the_mean_step() -> None:
    """I-DOG-1 with steps: the mean of D-PSGD's models moves by exactly -lr * mean(g)."""
    config = load_config(
        None, ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=8", "algorithm.lr=0.3"]
    )
    net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    before = net.model().to(torch.float64).mean(dim=0)
    params = net.model()
    grads = []
    # The gradient the round takes: replay the same batches through a fresh copy.
    replay = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    for rows, x, y, mask in replay._data(0, replay.up(0)):
        grads.append(replay.objective.loss_and_grad(params[rows], x, y, mask)[1])
    net.run_round()
    step = torch.cat(grads).to(torch.float64).mean(dim=0) * 0.3
    after = net.model().to(torch.float64).mean(dim=0)
    assert float((after - (before - step)).abs().max()) < 1e-6


def test_ten_thousand_peers_keep_the_exact_average() -> None:
    """A 10,000-peer network of degree 15 in the default suite: a few zero-step rounds keep
    the network average to 1e-6 and shrink the disagreement."""
    net, start = _network(
        "topology.kind=random-regular",
        "topology.nodes=10000",
        "topology.degree=15",
        "algorithm.name=dog",
        "data.stream=synthetic",
        "data.batch_size=1",
        seed=1,
    )
    spread = float((start - start.mean(dim=0)).norm(dim=1).mean())
    _run(net, 3)
    x = net.model().to(torch.float64)
    assert float((x.mean(dim=0) - start.to(torch.float64).mean(dim=0)).abs().max()) < 1e-6
    assert float((x - x.mean(dim=0)).norm(dim=1).mean()) < 0.5 * spread
