"""The vectorized engine against the message engine, over the whole algorithm registry.

For every registered algorithm, every codec family (fp32, sign, topk, qsgd) and two fault
plans (none; drops, a partition and crash-and-return), on small random graphs whose node ids
are odd but safe names that sort differently from the graph order, the two engines must end
20 rounds with bit-identical parameters, identical traffic and fault counts, and accuracies
within one test sample; a combination one engine cannot run is refused with a one-line
reason, which the suite asserts instead. The parameters hold by construction: one
gradient path (:mod:`fedcore.gradients`, whose batch-invariance ``tests/gradients/test_rows.py``
checks) and mixing sums in the per-node inbox order; ``.ci/run`` runs these tests under
a second, forced kernel level too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore import registry, topology
from fedcore.algorithms import ALGORITHMS
from fedcore.config import Config, load_config
from fedcore.data import Dataset
from fedcore.engines.batched import has_batched_form
from fedcore.engines.messages import build_network
from fedcore.engines.vectorized import VectorizedNetwork, unsupported
from fedcore.errors import ConfigError
from fedcore.setup.graph import build_topology
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.simulation.drivers import run_vectorized
from fedcore.simulation.observer import RunObserver
from fedcore.simulation.simulate import choose_engine

ROUNDS = 20

BATCHED = sorted(name for name, factory in ALGORITHMS.items() if has_batched_form(factory()))
"""The registered algorithms the vectorized engine runs: all of them."""

# A small graph each algorithm can run on (symmetric for the gossip family).
GRAPHS = {
    "ops": ["topology.kind=erdos-renyi", "topology.p=0.4"],
    "clipped-push-sum": ["topology.kind=erdos-renyi", "topology.p=0.4"],
    "dol": ["topology.kind=social"],
    "dpsgd": ["topology.kind=erdos-renyi", "topology.p=0.4", "topology.undirected=true"],
    "dog": ["topology.kind=exponential", "topology.undirected=true"],
    "dsgt": ["topology.kind=ring"],
    "push-pull": ["topology.kind=social"],
    "push-diging": ["topology.kind=social"],
    "exact-diffusion": ["topology.kind=erdos-renyi", "topology.p=0.4", "topology.undirected=true"],
    "clippedgossip": ["topology.kind=erdos-renyi", "topology.p=0.4", "topology.undirected=true"],
    "trimmed-gossip": ["topology.kind=erdos-renyi", "topology.p=0.5", "topology.undirected=true"],
    "median-gossip": [
        "topology.kind=erdos-renyi",
        "topology.p=0.5",
        "topology.undirected=true",
        "algorithm.bucket=2",
    ],
    "local": ["topology.kind=ring"],
    "central": ["topology.kind=complete"],
    "deepsqueeze": ["topology.kind=erdos-renyi", "topology.p=0.4", "topology.undirected=true"],
    "choco": ["topology.kind=ring", "algorithm.gamma=0.3"],
    "beer": ["topology.kind=ring", "algorithm.gamma=0.3"],
    "rps": ["topology.kind=complete"],
    "fedavg": ["topology.kind=star", "algorithm.fraction=0.5", "run.local_steps=2"],
    "doublesqueeze": ["topology.kind=star"],
    "apmsqueeze": ["topology.kind=star", "algorithm.precondition_rounds=5", "algorithm.lr=0.01"],
}

FAULTS = [
    "faults.drop=0.2",
    "faults.partitions=[{nodes=['n0','n1','n2'],start=5,end=9}]",
    "faults.crashes=[{node='n3',at=4,back=8},{node='n5',at=12,back=15}]",
]

CODECS = {
    "fp32": [],
    "sign": ["compression.codec=sign"],
    "topk": ["compression.codec=topk", "compression.ratio=0.1"],
    "qsgd": ["compression.codec=qsgd", "compression.bits=4"],
}


ODD_IDS = (
    "zeta.9",
    "B-2",
    "a",
    "Node_10",
    "0",
    "node-1x",
    "7up",
    "Q.q.Q",
    "m" * 40 + ".long-one_ID",
)
"""Node ids of the contract's graphs, in graph order: safe names (:mod:`fedcore.ids`) with
dots, dashes, underscores, mixed case, leading digits and lengths from 1 to 52, whose sorted
order (``0, 7up, B-2, Node_10, Q.q.Q, a, mmm..., node-1x, zeta.9``) is far from the graph
order, so that every "in sorted sender order" of either engine is exercised. Unicode letters
are not safe ids (certificates and file systems), so there are none. The last one is a
star's server."""

ODD_FAULTS = [
    "faults.drop=0.2",
    f"faults.partitions=[{{nodes={list(ODD_IDS[:3])!r},start=5,end=9}}]",
    f"faults.crashes=[{{node={ODD_IDS[3]!r},at=4,back=8}},{{node={ODD_IDS[5]!r},at=12,back=15}}]",
]
"""FAULTS on the odd ids: drops, a partition and two crash-and-returns."""


def odd_graph(algorithm: str, folder: Path) -> list[str]:
    """The settings of ``algorithm``'s graph (GRAPHS) with the odd ids: the generated graph,
    renamed in place by ODD_IDS, written to a JSON graph file in ``folder``."""
    table = [s for s in GRAPHS[algorithm] if s.startswith("topology.")]
    generated = build_topology(
        load_config(None, ["topology.nodes=8", "topology.seed=3", *table]).topology
    )
    rename = dict(zip(generated.nodes, ODD_IDS, strict=False))
    graph = topology.TrustGraph.from_edges(
        [(rename[u], rename[v]) for u, v in generated.edges()],
        name=f"{algorithm}-odd",
        nodes=[rename[n] for n in generated.nodes],
    )
    assert sorted(graph.nodes) != list(graph.nodes)
    path = folder / f"{algorithm}-odd.json"
    topology.save(graph, path)
    settings = [f"topology.file={path}"]
    if "server" in rename:  # a star's server, renamed too
        settings.append(f"topology.server={rename['server']!r}")
    return settings


def odd_config(algorithm: str, codec: str, faults: bool, folder: Path) -> Config:
    """The contract's run: ``algorithm`` on its graph with the odd ids."""
    settings = [
        f"run.rounds={ROUNDS}",
        "run.eval_every=10",
        f"algorithm.name={algorithm}",
        "algorithm.lr=0.3",
        *(s for s in GRAPHS[algorithm] if not s.startswith("topology.")),
        *odd_graph(algorithm, folder),
        *CODECS[codec],
        *(ODD_FAULTS if faults else []),
    ]
    return load_config(None, settings)


def _config(algorithm: str, codec: str, faults: bool, *extra: str) -> Config:
    settings = [
        f"run.rounds={ROUNDS}",
        "run.eval_every=10",
        "topology.nodes=8",
        "topology.seed=3",
        f"algorithm.name={algorithm}",
        "algorithm.lr=0.3",
        *GRAPHS[algorithm],
        *CODECS[codec],
        *(FAULTS if faults else []),
        *extra,
    ]
    return load_config(None, settings)


def _observer(config: Config, setup: Any, nodes: Any) -> RunObserver:
    return RunObserver(
        nodes=nodes,
        config=config,
        evaluator=setup.evaluator,
        dataset=setup.dataset,
        writer=None,
        progress=None,
        server=getattr(setup.algorithm, "server", None),  # as simulate's
        own_tests=setup.own_tests(),
    )


def run_both(
    config: Config, setup: RunSetup | None = None
) -> tuple[tuple[RunObserver, Any], tuple[RunObserver, Any]]:
    """``((observer, params), (observer, params))`` of the message and vectorized engines.

    ``setup``: the message engine's, ``prepare_run(config)`` fresh from the caller (that
    used it for checks of its own; one set-up and model probe fewer). Each engine runs on
    a set-up of its own, as ``simulate`` would."""
    return _run_both(config, setup)[:2]


def _run_both(
    config: Config, setup: RunSetup | None = None
) -> tuple[tuple[RunObserver, Any], tuple[RunObserver, Any], RunSetup]:
    """:func:`run_both`, and the message engine's set-up."""
    if setup is None:
        setup = prepare_run(config)
    network = build_network(config, setup=setup)
    slow = _observer(config, setup, list(network.nodes))
    slow.attach(network)
    network.run(config.run.rounds)
    slow_params = torch.stack([node.model() for node in network.nodes.values()])
    fresh = prepare_run(config)
    net = VectorizedNetwork(fresh, device=torch.device("cpu"))
    fast = _observer(config, fresh, net.nodes)
    final = run_vectorized(net, fast, None, None)
    return (slow, slow_params), (fast, torch.stack(list(final.values()))), setup


def assert_same_run(config: Config) -> None:
    """Both engines agree on parameters, traffic, faults and accuracy."""
    (slow, a), (fast, b), setup = _run_both(config)
    assert torch.equal(a, b), float((a - b).abs().max() / a.abs().max().clamp(min=1.0))
    assert slow.totals == fast.totals
    assert slow.missing == fast.missing
    assert slow.missing_edges == fast.missing_edges
    assert slow.dropped_edges == fast.dropped_edges
    assert slow.down == fast.down
    tests = len(setup.dataset.y_test)  # the run's test set (a run does not change it)
    for e_slow, e_fast in zip(slow.evals, fast.evals, strict=True):
        assert e_slow["round"] == e_fast["round"]
        for key in ("avg_model_accuracy", "mean_node_accuracy", "min_node_accuracy"):
            assert abs(e_slow[key] - e_fast[key]) <= 1 / tests + 1e-12, key
        assert math.isclose(e_slow["average_loss"], e_fast["average_loss"], rel_tol=1e-5)
        assert e_slow["bytes_sent_per_node"] == e_fast["bytes_sent_per_node"]
    for node, losses in slow.losses.items():
        for x, y in zip(losses, fast.losses[node], strict=True):
            assert (x is None) == (y is None)
            if x is not None:
                assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6), (node, x, y)


REFUSED: dict[tuple[str, str | None, bool | None], str] = {
    # CHOCO keeps a copy of every neighbour's public model that only the neighbour's next
    # message updates: a lost message would leave it behind for good, so a fault plan that
    # loses messages is refused on both engines (before either is built), whatever the codec.
    ("choco", None, True): "needs every message",
    ("beer", None, True): "needs every message",  # CHOCO's copies, of the tracker too
    # RPS with a stochastic codec: a worker draws for blocks of two lengths in receiver
    # order, and the vectorized engine's codec calls go one length at a time, so it refuses
    # it (the message engine runs it): there is no second run to be bit-identical with.
    ("rps", "qsgd", None): "rps with the stochastic codec 'qsgd'",
}
"""The contract's combinations that one engine (or both) refuses, with what the one-line
reason says; every other combination must agree bit for bit."""


def _refused(algorithm: str, codec: str, faults: bool) -> str | None:
    for (a, c, f), why in REFUSED.items():
        if a == algorithm and c in (None, codec) and f in (None, faults):
            return why
    return None


ROBUST_MIXES = ("clipped-push-sum", "clippedgossip", "trimmed-gossip", "median-gossip")
"""Rules that are another rule (ops, dpsgd) with a robust mix: every codec, with faults
only (lost and missing slots are the mix's hard case; with every message delivered, the
same code runs with every slot arrived), to keep the matrix's CI time."""


def _cases(refused: bool) -> list[Any]:
    return [
        pytest.param(algorithm, codec, faults, id=f"{algorithm}-{codec}-{faults}")
        for algorithm in BATCHED
        for codec in CODECS
        for faults in ((True,) if algorithm in ROBUST_MIXES else (False, True))
        if (_refused(algorithm, codec, faults) is not None) == refused
    ]


def test_every_algorithm_has_a_case() -> None:
    assert set(GRAPHS) == set(BATCHED)
    assert {"ops", "dpsgd", "dog", "dol", "choco", "rps"} <= set(BATCHED)
    covered = {(a, c) for a, c, _ in (p.values for p in [*_cases(False), *_cases(True)])}
    assert covered == {(a, c) for a in BATCHED for c in CODECS}
    for algorithm in BATCHED:  # qsgd runs on both engines for all but RPS
        faults = algorithm in ROBUST_MIXES
        assert (algorithm, "qsgd", faults) in [p.values for p in _cases(algorithm == "rps")]


def test_every_registered_algorithm_runs_on_the_vectorized_engine() -> None:
    """The server family included: the server is one more row. (The asynchronous ones
    have no rounds: they run on the event engine, tests/engines/test_events.py.)"""
    assert set(BATCHED) == set(ALGORITHMS) - set(registry.ALGORITHMS.tagged("asynchronous"))
    config = load_config(None, ["algorithm.name=apmsqueeze", "topology.kind=star"])
    assert choose_engine(prepare_run(config), "auto") == ("vectorized", None)


@pytest.mark.parametrize(("algorithm", "codec", "faults"), _cases(refused=False))
def test_engines_agree(algorithm: str, codec: str, faults: bool, tmp_path: Path) -> None:
    """The contract, on the odd ids. qsgd draws per node from the node's own generator, in
    the node's encoding order; a crashed node draws nothing."""
    assert_same_run(odd_config(algorithm, codec, faults, tmp_path))


@pytest.mark.parametrize(("algorithm", "codec", "faults"), _cases(refused=True))
def test_engines_refuse_what_they_cannot_run(
    algorithm: str, codec: str, faults: bool, tmp_path: Path
) -> None:
    """Where bit-identity cannot hold, the run is refused with a one-line reason (see
    REFUSED): by both engines in the config's checks, or by the vectorized engine alone,
    which ``auto`` then falls back from."""
    why = _refused(algorithm, codec, faults)
    assert why is not None
    config = odd_config(algorithm, codec, faults, tmp_path)
    try:
        setup = prepare_run(config)
    except ConfigError as exc:  # both engines: nothing is built
        assert why in str(exc) and "\n" not in str(exc)
        return
    reason = unsupported(setup)
    assert reason is not None and why in reason and "\n" not in reason
    assert choose_engine(setup, "auto") == ("messages", reason)
    with pytest.raises(ConfigError, match="vectorized"):
        choose_engine(setup, "vectorized")
    network = build_network(config, setup=setup)  # which the message engine runs
    network.run(2)
    assert all(bool(node.model().isfinite().all()) for node in network.nodes.values())


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm.robust=true"],
        ["algorithm.robust=true", "compression.codec=bf16"],
        ["algorithm.step_scale='omega'"],
        [
            "algorithm.robust=true",
            "algorithm.step_scale='omega'",
            "model.dtype='float64'",
            "compression.codec=raw",
        ],
    ],
)
@pytest.mark.parametrize("faults", [False, True])
def test_ops_variants_agree(extra: list[str], faults: bool) -> None:
    assert_same_run(_config("ops", "fp32", faults, *extra))


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("dsgt", ["compression.codec=bf16"]),
        ("push-pull", ["compression.codec=bf16"]),
        ("push-diging", ["compression.codec=bf16"]),
        ("push-pull", ["model.dtype='float64'", "compression.codec=raw"]),
    ],
)
def test_robust_tracking_agrees(algorithm: str, extra: list[str]) -> None:
    """The tracking rules' running-sum forms (state per edge) under drops, a partition and
    crashes: a cast codec (totals and their low parts) and a float64 wire (totals alone)."""
    assert_same_run(_config(algorithm, "fp32", True, "algorithm.robust=true", *extra))


@pytest.mark.parametrize("algorithm", ["dpsgd", "ops"])
def test_randk_draws_agree(algorithm: str) -> None:
    assert_same_run(_config(algorithm, "topk", True, "compression.codec=randk"))


def tiny_dataset(*, seed: int, test_fraction: float) -> Dataset:
    """One feature, two classes: ``logreg`` on it has 4 parameters, fewer than peers."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(240, 1, generator=gen)
    y = (x[:, 0] + 0.5 * torch.randn(240, generator=gen) > 0).long()
    cut = int(240 * (1 - test_fraction))
    return Dataset(
        name="tiny", x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:], num_classes=2
    )


@pytest.mark.parametrize("faults", [False, True])
def test_rps_with_empty_blocks_agrees(faults: bool) -> None:
    """A model of 4 values on 8 peers: 4 owners hold an empty block, get no scatter and send
    no gather message; both engines send, lose and count the same messages."""
    assert_same_run(
        _config(
            "rps",
            "sign",
            faults,
            "data.dataset=tests.engines.test_vectorized:tiny_dataset",
            "model.name=logreg",
        )
    )


def test_time_varying_schedule_agrees() -> None:
    config = load_config(
        None,
        [
            f"run.rounds={ROUNDS}",
            "topology.kind=one-peer-exponential",
            "topology.nodes=8",
            "algorithm.name=ops",
            "algorithm.robust=true",
            *FAULTS,
        ],
    )
    assert_same_run(config)


def test_mlp_and_online_stream_agree() -> None:
    assert_same_run(_config("dog", "fp32", True, "model.name=mlp", "model.hidden=16"))
    assert_same_run(_config("dog", "fp32", False, "data.stream=synthetic", "data.batch_size=4"))


def test_auto_falls_back_with_a_reason() -> None:
    deadline = load_config(None, ["transport.mode=deadline", "run.rounds=2"])
    engine, why = choose_engine(prepare_run(deadline), "auto")
    assert engine == "messages" and why is not None and "deadline" in why
    with pytest.raises(ConfigError, match="vectorized"):
        choose_engine(prepare_run(deadline), "vectorized")
    rps = load_config(
        None,
        [
            "algorithm.name=rps",
            "topology.kind=complete",
            "topology.nodes=4",
            "compression.codec=qsgd",
        ],
    )
    assert "rps" in (unsupported(prepare_run(rps)) or "")
    assert choose_engine(prepare_run(load_config(None, [])), "auto") == ("vectorized", None)


def test_a_per_message_user_algorithm_runs_on_the_message_engine() -> None:
    """An algorithm written to the node's per-message protocol, not as a rule."""
    from tests.algorithms.test_user_algorithm import MyCentral

    class Mine(MyCentral):
        name = "mine"

    config = load_config(None, ["topology.kind=complete", "algorithm.name=central"])
    setup = prepare_run(config, algorithm=Mine())
    assert "no batched form" in (unsupported(setup) or "")


def test_a_user_rule_runs_on_the_vectorized_engine() -> None:
    """A user's rule (here a renamed D-PSGD) gets the fast engine, with the same run."""
    from fedcore.algorithms.dpsgd import DPSGDRule
    from fedcore.testing import make_network

    class Mine(DPSGDRule):
        name = "mine"

    config = load_config(None, ["topology.kind=ring", "algorithm.name=dpsgd"])
    assert unsupported(prepare_run(config, algorithm=Mine())) is None
    models = []
    for engine in ("messages", "vectorized"):
        net = make_network("ring:6", algorithm=Mine(), engine=engine)
        net.run(5)
        models.append(net.models())
    assert models[0].keys() == models[1].keys()
    for node, x in models[0].items():
        assert torch.equal(x, models[1][node]), node


def batchnorm_model(*, input_dim: int, num_classes: int) -> torch.nn.Module:
    """A user model vmap cannot map: BatchNorm updates its running statistics in place."""
    return torch.nn.Sequential(
        torch.nn.Linear(input_dim, 8),
        torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(),
        torch.nn.Linear(8, num_classes),
    )


def test_a_model_vmap_cannot_map_falls_back_to_one_module_per_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    config = _config(
        "dpsgd", "fp32", True, "model.name=tests.engines.test_vectorized:batchnorm_model"
    )
    net = VectorizedNetwork(prepare_run(config), device=torch.device("cpu"))
    assert net.objective.mode == "module" and net.objective.why
    assert_same_run(config)


def test_the_test_harness_offers_the_vectorized_engine() -> None:
    from fedcore.testing import VectorizedTestNetwork, make_network

    fast = make_network("social:8", algorithm="ops", engine="vectorized")
    slow = make_network("social:8", algorithm="ops")
    assert isinstance(fast, VectorizedTestNetwork)
    fast.run(5)
    slow.run(5)
    assert fast.round == slow.round == 5
    for nid, model in slow.models().items():
        assert torch.equal(fast.models()[nid], model)
    assert fast.evaluate()["avg_model_accuracy"] == slow.evaluate()["avg_model_accuracy"]
    assert abs(float(fast.state.omega.sum()) - 8) < 1e-9
    with pytest.raises(ConfigError, match="vectorized"):
        make_network("ring:4", settings={"transport.mode": "deadline"}, engine="vectorized")


@pytest.mark.parametrize("engine", ["messages", "vectorized"])
def test_a_diverged_message_stops_either_engine(engine: str, tmp_path: Any) -> None:
    """Strict mode: a receiver refuses a message holding non-finite values, on both engines."""
    from fedcore.errors import ProtocolError
    from fedcore.simulation.simulate import simulate

    # 1e38: the largest order a float32 model takes (1e39 is refused at load).
    config = _config("dpsgd", "fp32", False, "algorithm.lr=1e38", f"simulate.engine={engine}")
    with pytest.raises(ProtocolError, match="non-finite"):
        simulate(config, out_dir=tmp_path, show_progress=False)
