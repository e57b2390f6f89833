"""FedAvg on a star: the invariants of reference/algorithms.md section 13 (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms.server import sample_workers
from fedcore.config import load_config
from fedcore.engines.messages import build_network
from fedcore.errors import ConfigError, TopologyError
from fedcore.setup.prepare import prepare_run
from tests.clitools import TINY, cli
from tests.resume import assert_resumes_exactly

STAR = ["algorithm.name=fedavg", "topology.kind=star", "model.name=mlp"]


def _run(overrides: list[str], rounds: int) -> dict[str, torch.Tensor]:
    network = build_network(load_config(None, [*overrides, f"run.rounds={rounds}"]))
    network.run(rounds)
    return {nid: node.model() for nid, node in network.nodes.items()}


def test_full_participation_one_step_equal_counts_is_central() -> None:
    """C = 1, K = 1, equal sample counts, plain SGD: the global model follows CENTRAL
    (mini-batch SGD on the union) to float tolerance."""
    common = ["topology.nodes=3", "data.partition=iid", "model.name=mlp", "algorithm.lr=0.3"]
    setup = prepare_run(load_config(None, [*STAR, *common]))
    assert [len(p) for p in setup.parts] == [479, 479, 479, 0]  # the server holds none
    fed = _run([*STAR, *common], 25)
    central = _run(["algorithm.name=central", "topology.kind=complete", *common], 25)
    for worker in ("n0", "n1", "n2"):
        assert torch.allclose(fed["server"], central[worker], atol=1e-5, rtol=1e-5)
        assert torch.allclose(fed[worker], fed["server"], atol=0, rtol=0)


def test_zero_step_size_never_moves_the_global_model() -> None:
    settings = [*STAR, "algorithm.lr=0", "algorithm.fraction=0.5", "run.local_steps=3"]
    settings += ["algorithm.server_optimizer=momentum", "optimizer.name=adam"]
    network = build_network(load_config(None, settings))
    start = network.nodes["server"].model().clone()
    network.run(6)
    assert torch.equal(network.nodes["server"].model(), start)


def test_the_sample_is_a_pure_function_of_seed_and_round() -> None:
    workers = tuple(f"n{i}" for i in range(16))
    first = sample_workers(workers, 0.25, seed=3, t=7)
    assert len(first) == 4 and first == sample_workers(workers, 0.25, seed=3, t=7)
    assert len({frozenset(sample_workers(workers, 0.25, 3, t)) for t in range(20)}) > 10
    assert sample_workers(workers, 1.0, 3, 0) == set(workers)
    assert len(sample_workers(workers, 0.01, 3, 0)) == 1  # at least one worker


@pytest.mark.parametrize("engine", ["messages", "vectorized"])
def test_only_the_sampled_workers_train_and_talk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    args = [*TINY, "--set", "algorithm.name=fedavg", "--set", "topology.kind=star"]
    args += ["--set", "topology.nodes=8", "--set", "algorithm.fraction=0.25"]
    args += ["--set", f"simulate.engine={engine}"]
    args += ["--set", "run.rounds=6", "--out", str(tmp_path / "run"), "-q"]
    status, _, err = cli(capsys, "simulate", *args)
    assert status == 0, err
    lines = (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    nodes = [r for r in records if r["kind"] == "node"]
    workers = tuple(f"n{i}" for i in range(8))
    for t in range(6):
        mine = {r["node"]: r for r in nodes if r["round"] == t}
        sample = sample_workers(workers, 0.25, 0, t)
        for node, r in mine.items():
            trained = node in sample
            assert r.get("idle", False) == (not trained), (t, node)
            assert (r["loss"] is not None) == trained
            assert r["messages_sent"] == (1 if trained else 0 if node != "server" else 2)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text(encoding="utf-8"))
    assert "server" not in summary["final"]["node_accuracy"]
    assert summary["engine"] == engine


def test_lost_messages_average_what_arrived() -> None:
    """Under a fault plan the server averages the models that arrive, workers without the
    global model train on: the run ends, every model finite, and it learned."""
    settings = [*STAR, "faults.drop=0.3", "run.rounds=40", "algorithm.lr=0.3"]
    network = build_network(load_config(None, settings))
    network.run(40)
    for node in network.nodes.values():
        assert bool(torch.isfinite(node.model()).all())
    setup = prepare_run(load_config(None, settings))
    _, accuracy = setup.evaluator.evaluate(
        network.nodes["server"].model(), setup.dataset.x_test, setup.dataset.y_test
    )
    assert accuracy > 0.6


def test_server_momentum_zero_is_plain_fedavg() -> None:
    base = [*STAR, "algorithm.fraction=0.5", "run.local_steps=2"]
    plain = _run(base, 8)
    heavy = _run([*base, "algorithm.server_optimizer=momentum", "algorithm.server_momentum=0"], 8)
    assert torch.allclose(plain["server"], heavy["server"], atol=1e-6)


@pytest.mark.parametrize("server_optimizer", ["sgd", "adam"])
def test_fedavg_resumes_exactly(tmp_path: Path, server_optimizer: str) -> None:
    settings = [*STAR, "topology.nodes=4", "algorithm.fraction=0.5", "run.local_steps=2"]
    settings += [f"algorithm.server_optimizer={server_optimizer}", "algorithm.server_lr=0.5"]
    assert_resumes_exactly(load_config(None, settings), tmp_path, stop=5, end=9)


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        (["algorithm.name=fedavg", "topology.kind=ring"], ConfigError, "runs on a star"),
        ([*STAR, "algorithm.fraction=0"], ConfigError, "algorithm.fraction"),
        ([*STAR, "algorithm.fraction=1.5"], ConfigError, "algorithm.fraction"),
        ([*STAR, "algorithm.server_optimizer=lamb"], ConfigError, "server_optimizer"),
        ([*STAR, "data.stream=synthetic", "model.name=logreg"], ConfigError, "holds no data"),
        ([*STAR, "topology.server=n3"], TopologyError, "worker's name"),
        ([*STAR, "topology.nodes=0"], ConfigError, "topology.nodes"),
    ],
)
def test_bad_settings_are_clear_errors(
    settings: list[str], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        prepare_run(load_config(None, settings))


def test_a_graph_file_names_its_server(tmp_path: Path) -> None:
    graph = tmp_path / "star.txt"
    graph.write_text("ps a\nps b\na ps\nb ps\n", encoding="utf-8")
    setup = prepare_run(load_config(None, [*STAR, f"topology.file={graph}", "topology.server=ps"]))
    assert [len(p) for p in setup.parts][setup.graph.index("ps")] == 0
    with pytest.raises(TopologyError, match="'server'"):
        prepare_run(load_config(None, [*STAR, f"topology.file={graph}"]))
    one_way = tmp_path / "oneway.txt"
    one_way.write_text("ps a\nps b\na ps\n", encoding="utf-8")
    with pytest.raises(TopologyError, match="no edge b -> ps"):
        prepare_run(load_config(None, [*STAR, f"topology.file={one_way}", "topology.server=ps"]))


def test_fedavg_runs_ten_thousand_workers_on_the_vectorized_engine() -> None:
    """The workload federated simulators run most: 10,000 workers, a tenth sampled each
    round, 5 local steps; the server is one more row. Only the sampled workers train and
    talk, and the global model moves."""
    from fedcore.data import Dataset
    from fedcore.engines.vectorized import VectorizedNetwork

    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 8, generator=gen)
    y = torch.randint(0, 4, (30_000,), generator=gen)
    x = centers[y] + 0.5 * torch.randn(30_000, 8, generator=gen)
    data = Dataset(
        name="blobs",
        x_train=x[:25_000],
        y_train=y[:25_000],
        x_test=x[25_000:],
        y_test=y[25_000:],
        num_classes=4,
    )
    settings = [
        "algorithm.name=fedavg",
        "topology.kind=star",
        "topology.nodes=10000",
        "algorithm.fraction=0.1",
        "run.local_steps=5",
        "data.partition=iid",
    ]
    net = VectorizedNetwork(
        prepare_run(load_config(None, settings), dataset=data), device=torch.device("cpu")
    )
    start = net.model()[net.nodes.index("server")].clone()
    figures = [net.run_round() for _ in range(2)]
    workers = tuple(v for v in net.nodes if v != "server")
    for t, f in enumerate(figures):
        sampled = sample_workers(workers, 0.1, 0, t)
        assert len(sampled) == 1000
        trained = {net.nodes[i] for i in torch.nonzero(~f.idle & f.up).flatten().tolist()}
        assert trained == sampled  # the server and the unsampled workers idle
        assert int(f.sent.sum()) == 1000 + len(sample_workers(workers, 0.1, 0, t + 1))
    server = net.model()[net.nodes.index("server")]
    assert bool(torch.isfinite(server).all()) and not torch.equal(server, start)


@settings(max_examples=50, deadline=None)
@given(b=st.integers(1, 9), pattern=st.integers(0, 2**9 - 1), seed=st.integers(0, 2**16))
def test_where_rows_is_torch_where_computing_only_what_it_keeps(
    b: int, pattern: int, seed: int
) -> None:
    """However many rows heard (none, few, most, all): the bits of ``torch.where``."""
    from fedcore.algorithms.server import _where_rows

    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(b, 7, generator=g), torch.randn(b, 7, generator=g)
    heard = torch.tensor([bool(pattern >> i & 1) for i in range(b)]).unsqueeze(1)
    asked: list[int] = []

    def value(rows: torch.Tensor | None) -> torch.Tensor:
        asked.append(b if rows is None else rows.numel())
        return (x * 3 - y) if rows is None else (x[rows] * 3 - y[rows])

    got = _where_rows(heard, x, value)
    assert torch.equal(got, torch.where(heard, x * 3 - y, x))
    assert got is not x
    heard_rows = int(heard.sum())
    assert sum(asked) == (heard_rows if 2 * heard_rows <= b else b)
