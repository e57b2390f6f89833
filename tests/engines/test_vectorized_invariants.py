"""The invariants of reference/algorithms.md, held by both engines.

Each property runs the same config on the message engine (one node object per peer,
exchanging messages) and on the vectorized engine (every peer's state stacked), checks the
invariant on each, and checks that the two ended bit for bit alike. Most cases start the
nodes from different random parameters (the rule's own ``init`` of one random row per node)
and take zero steps (``algorithm.lr = 0``), so what the invariants promise is exact:
push-sum mass, the network average, consensus, the error memories' telescoping sums. The
per-node forms of these invariants (the rules stepped by hand, no engine) are in
``tests/algorithms/``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import Config, load_config
from fedcore.engines.messages import Network, build_network
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.setup.prepare import prepare_run

ENGINES = ("messages", "vectorized")


class Engine:
    """One engine's network of ``config``, every node started from its row of ``start``
    (or, ``start = None``, from the run's own initial parameters).

    Args:
        engine: ``"messages"`` or ``"vectorized"``.
        config: The run.
        start: ``[N, d]``: node ``i`` (in graph order) starts from row ``i``.
        edit: Changes the rule's state of every node (``[N, ...]``) before the run, for
            both engines alike (the message engine's nodes get their rows of it).
    """

    def __init__(
        self,
        engine: str,
        config: Config,
        start: torch.Tensor | None = None,
        edit: Callable[[Any], Any] | None = None,
    ) -> None:
        setup = prepare_run(config)
        self.engine = engine
        self.ids = setup.graph.nodes
        self.rounds = 0
        self.net: Network | VectorizedNetwork
        if engine == "vectorized":
            self.net = VectorizedNetwork(setup, device=torch.device("cpu"))
            if start is not None:
                state = self.net.form.init(start)
                self.net.state = edit(state) if edit is not None else state
            return
        self.net = build_network(config, setup=setup)
        if start is None:
            return
        nodes = [self.net.nodes[v] for v in self.ids]
        if edit is None:
            for i, node in enumerate(nodes):
                node.state = node.algorithm.init(start[i])
            return
        state = edit(nodes[0].algorithm.rule.init(start))
        for i, node in enumerate(nodes):
            node.state = type(state)(*(f[i : i + 1].clone() for f in state))

    def run(self, rounds: int) -> Engine:
        """Run ``rounds`` more rounds."""
        if isinstance(self.net, VectorizedNetwork):
            for _ in range(rounds):
                self.net.run_round()
        else:
            self.net.run(self.rounds + rounds)
        self.rounds += rounds
        return self

    def models(self) -> torch.Tensor:
        """``[N, d]``: every node's model, in graph order."""
        if isinstance(self.net, VectorizedNetwork):
            return self.net.model()
        return torch.stack([self.net.nodes[v].model() for v in self.ids])

    def field(self, name: str) -> torch.Tensor:
        """``[N, ...]``: a per-node field of the rule's state (``x``, ``omega``, ``delta``)."""
        if isinstance(self.net, VectorizedNetwork):
            return getattr(self.net.state, name)
        return torch.cat([getattr(self.net.nodes[v].state, name) for v in self.ids])


def _config(*settings_: str) -> Config:
    return load_config(None, ["algorithm.lr=0", "run.rounds=1000", *settings_])


def _start(config: Config, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[N, d]`` random starting parameters for the nodes of ``config``."""
    setup = prepare_run(config)
    n, d = len(setup.graph.nodes), setup.start.numel()
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _both(
    config: Config,
    rounds: int,
    start: torch.Tensor | None = None,
    edit: Callable[[Any], Any] | None = None,
) -> list[Engine]:
    """Both engines run ``rounds`` rounds of ``config`` and end bit for bit alike."""
    runs = [Engine(e, config, start, edit).run(rounds) for e in ENGINES]
    assert torch.equal(runs[0].models(), runs[1].models())
    return runs


@settings(max_examples=3)
@given(seed=st.integers(0, 10_000), nodes=st.integers(4, 9))
def test_push_sum_reaches_the_exact_average_on_a_digraph(seed: int, nodes: int) -> None:
    """I-OPS-1/2: mass is conserved and every de-biased model reaches the initial average
    (OPS at zero step on a directed social graph, whose weights are not doubly stochastic)."""
    config = _config(
        "algorithm.name=ops",
        "topology.kind=social",
        f"topology.nodes={nodes}",
        f"topology.seed={seed}",
    )
    start = _start(config, seed)
    for run in _both(config, 250, start):
        omega = run.field("omega").to(torch.float64)
        assert abs(float(omega.sum()) - nodes) < 1e-9 * nodes, run.engine
        x = run.field("x").to(torch.float64).sum(dim=0)
        assert torch.allclose(x, start.to(torch.float64).sum(dim=0), atol=1e-4), run.engine
        assert float((run.models() - start.mean(dim=0)).abs().max()) < 1e-4, run.engine


@settings(max_examples=2)
@given(seed=st.integers(0, 10_000))
def test_robust_push_sum_survives_thirty_percent_loss(seed: int) -> None:
    """I-RPSUM-2: under independent loss of 30% of the messages, robust push-sum still
    reaches the exact average, on either engine."""
    config = _config(
        "algorithm.name=ops",
        "topology.kind=social",
        "topology.nodes=8",
        f"topology.seed={seed % 100}",
        "algorithm.robust=true",
        "faults.drop=0.3",
        f"faults.seed={seed}",
    )
    start = _start(config, seed)
    for run in _both(config, 150, start):
        assert float((run.models() - start.mean(dim=0)).abs().max()) < 1e-4, run.engine


@settings(max_examples=6)
@given(
    algorithm=st.sampled_from(["dpsgd", "dog", "deepsqueeze", "choco"]),
    codec=st.sampled_from(["fp32", "sign", "topk", "qsgd"]),
    seed=st.integers(0, 10_000),
)
def test_gossip_families_keep_the_mean(algorithm: str, codec: str, seed: int) -> None:
    """I-DOG-1 / I-DS-2 / I-CH-1: on doubly stochastic weights the network mean never moves
    at zero step: DeepSqueeze and CHOCO whatever the codec (they mix the node's own
    compressed value), D-PSGD and DOG uncompressed; uncompressed gossip also reaches
    consensus. (qsgd at 8 bits: at 4 bits its error on a whole model of this size exceeds
    the model, and DeepSqueeze's error feedback at zero step then grows without bound, on
    both engines alike; the mean is kept even so, up to float32 rounding of large values.)"""
    if algorithm in ("dpsgd", "dog"):
        codec = "fp32"  # a compressed neighbour against an exact self value moves the mean
    config = _config(
        "topology.kind=erdos-renyi",
        "topology.p=0.5",
        "topology.undirected=true",
        "topology.nodes=8",
        f"topology.seed={seed % 50}",
        f"algorithm.name={algorithm}",
        f"compression.codec={codec}",
        "compression.ratio=0.3",
        "compression.bits=8",
    )
    start = _start(config, seed)
    for run in _both(config, 40, start):
        mean = run.models().to(torch.float64).mean(dim=0)
        # float32 rounding of 40 rounds of sums of values near 1 reaches ~1e-5; a lossy
        # codec that moved the mean would move it by ~1e-2 or more.
        assert float((mean - start.to(torch.float64).mean(dim=0)).abs().max()) < 1e-4
        if codec == "fp32" and algorithm in ("dpsgd", "dog"):
            assert float((run.models() - start.mean(dim=0)).abs().max()) < 1e-3


@settings(max_examples=3)
@given(algorithm=st.sampled_from(["dpsgd", "dog"]), seed=st.integers(0, 10_000))
def test_mean_moves_by_the_mean_step(algorithm: str, seed: int) -> None:
    """I-DOG-1 with steps: on doubly stochastic weights the mean of the models moves by
    exactly -lr * mean(g) in a round, whether the round mixes first (DOG, combine then
    adapt) or steps first (D-PSGD's adapt then combine)."""
    config = load_config(
        None,
        [
            f"algorithm.name={algorithm}",
            "topology.kind=erdos-renyi",
            "topology.p=0.5",
            "topology.undirected=true",
            "topology.nodes=8",
            f"topology.seed={seed % 50}",
            f"run.seed={seed}",
            "algorithm.lr=0.3",
        ],
    )
    start = _start(config, seed)
    # The gradients of round 0, at the starting models: replay the round's batches.
    replay = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    grads = torch.zeros_like(start)
    for rows, x, y, mask in replay._data(0, replay.up(0)):
        grads[rows] = replay.objective.loss_and_grad(start[rows], x, y, mask)[1]
    step = 0.3 * grads.to(torch.float64).mean(dim=0)
    before = start.to(torch.float64).mean(dim=0)
    for run in _both(config, 1, start):
        after = run.models().to(torch.float64).mean(dim=0)
        assert float((after - (before - step)).abs().max()) < 1e-6, run.engine


@settings(max_examples=3)
@given(codec=st.sampled_from(["sign", "topk", "qsgd"]), seed=st.integers(0, 10_000))
def test_doublesqueeze_memories_telescope(codec: str, seed: int) -> None:
    """DoubleSqueeze's telescoping identity, every round, over the whole star: what was
    sent plus the memory left is what was meant to be sent. At zero step a worker means to
    send only its memory, so the broadcasts so far (the global model's move,
    ``x_0 - x_s``) plus the server's memory are the server's first memory plus the mean of
    what the workers sent: ``x_0 - x_s + delta_s - delta_s0 == mean_w(delta_w0 - delta_w)``.
    The nodes start from one model with random memories; every worker holds the global
    model throughout (nothing is lost)."""
    config = _config(
        "algorithm.name=doublesqueeze",
        "topology.kind=star",
        "topology.nodes=5",
        f"compression.codec={codec}",
        "compression.ratio=0.2",
        "compression.bits=8",
    )
    rows = _start(config, seed)
    start = rows[:1].expand_as(rows).clone()  # one global model
    memories = 0.1 * rows.roll(1, dims=0)
    server = prepare_run(config).graph.nodes.index("server")
    workers = [i for i in range(len(rows)) if i != server]

    def remember(state: Any) -> Any:
        return state._replace(delta=memories.clone())

    runs = [Engine(e, config, start, remember) for e in ENGINES]
    moved = False
    for _ in range(6):
        for run in runs:
            run.run(1)
            x, delta = run.models().double(), run.field("delta").double()
            sent = start[server].double() - x[server] + delta[server] - memories[server].double()
            meant = (memories[workers].double() - delta[workers]).mean(dim=0)
            scale = 1.0 + float(x.abs().max()) + float(delta.abs().max())  # float32 sums
            assert torch.allclose(sent, meant, atol=1e-6 * scale, rtol=0), run.engine
            assert torch.equal(x[workers], x[server].expand(len(workers), -1)), run.engine
            moved = moved or float((x[server] - start[server]).abs().max()) > 1e-3
        assert torch.equal(runs[0].models(), runs[1].models())
        assert torch.equal(runs[0].field("delta"), runs[1].field("delta"))
    assert moved  # the memories really were sent


@pytest.mark.parametrize("algorithm", ["fedavg", "doublesqueeze"])
def test_full_participation_one_step_is_central(algorithm: str) -> None:
    """FedAvg with C = 1, K = 1 local step and equal sample counts (and DoubleSqueeze with a
    lossless codec) follows CENTRAL, mini-batch SGD on the union, on either engine."""
    common = ["topology.nodes=3", "data.partition=iid", "model.name=mlp", "algorithm.lr=0.3"]
    star = load_config(
        None,
        [
            f"algorithm.name={algorithm}",
            "topology.kind=star",
            "algorithm.fraction=1.0" if algorithm == "fedavg" else "compression.codec=fp32",
            "run.local_steps=1",
            *common,
        ],
    )
    assert [len(p) for p in prepare_run(star).parts] == [479, 479, 479, 0]
    central = load_config(None, ["algorithm.name=central", "topology.kind=complete", *common])
    fed, cen = _both(star, 15), _both(central, 15)
    start = prepare_run(star).start
    for engine, (f, c) in zip(ENGINES, zip(fed, cen, strict=True), strict=True):
        server = f.models()[f.ids.index("server")]
        assert not torch.allclose(server, start, atol=1e-3), engine
        for worker in ("n0", "n1", "n2"):
            assert torch.allclose(server, c.models()[c.ids.index(worker)], atol=1e-5), engine
            assert torch.equal(f.models()[f.ids.index(worker)], server), engine


def test_ten_thousand_peers_keep_the_exact_average() -> None:
    """A 10,000-peer network of degree 15 in the default suite, on the vectorized engine
    only (the message engine's node objects are too slow at this size): a few zero-step
    rounds keep the network average to 1e-6 and shrink the disagreement."""
    config = _config(
        "topology.kind=random-regular",
        "topology.nodes=10000",
        "topology.degree=15",
        "algorithm.name=dog",
        "data.stream=synthetic",
        "data.batch_size=1",
    )
    net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(net.n, net.d, generator=gen, dtype=net.dtype)
    net.state = net.form.init(start)
    spread = float((start - start.mean(dim=0)).norm(dim=1).mean())
    for _ in range(3):
        net.run_round()
    x = net.model().to(torch.float64)
    assert float((x.mean(dim=0) - start.to(torch.float64).mean(dim=0)).abs().max()) < 1e-6
    assert float((x - x.mean(dim=0)).norm(dim=1).mean()) < 0.5 * spread
