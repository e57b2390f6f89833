"""What can be checked cheaply is checked before expensive work, in one line.

Too many nodes for the data, a split that cannot be made, a mixing over every pair of too
many nodes and a run clearly larger than memory are refused before the graph is built; a
missing certificate folder before any peer starts. The generators and the data split that
got faster give exactly what they gave before.
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedcore import progress
from fedcore.certs import check_tls_dir, init_certs
from fedcore.config import TopologyConfig, load_config
from fedcore.data import digits, partition, training_examples
from fedcore.errors import ConfigError, DataError, TopologyError
from fedcore.setup import plan
from fedcore.setup.graph import build_topology, estimated_edges
from fedcore.setup.prepare import prepare_run
from fedcore.topology import analysis, build, prepare, social, spectral_gap
from fedcore.topology.kinds import KINDS
from fedcore.topology.weights import MAX_MIXING_PAIRS, check_mixing_size
from tests.clitools import one_line_error


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in a scratch folder, so that no runs/ folder lands in the repository."""
    monkeypatch.chdir(tmp_path)


# --- the command line: one line, quickly --------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["topology.nodes=20000"], ["1437 training examples", "20000 nodes", "at most 718"]),
        (["topology.nodes=2000000"], ["topology.nodes = 2000000", "1,000,000"]),
        (["topology.nodes=700"], ["Dirichlet", "700 nodes", "data.alpha"]),
        (["topology.nodes=5000", "algorithm.name=central"], ["every pair", "at most 3,162"]),
        (["topology.nodes=1000", "data.partition=shards"], ["too few", "1000 nodes"]),
    ],
)
def test_too_large_runs_fail_in_one_line_before_the_graph(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    overrides: list[str],
    needles: list[str],
) -> None:
    def no_graph(*args: object, **kwargs: object) -> None:
        raise AssertionError("the graph was built before the cheap checks")

    monkeypatch.setattr(plan, "build_topology", no_graph)
    monkeypatch.setattr(plan, "EARLY_GRAPH_EDGES", 0)  # as for a graph of a million edges
    argv = ["simulate", "-q"]
    for item in overrides:
        argv += ["--set", item]
    one_line_error(capsys, argv, *needles)
    assert not Path("runs").exists()


ENGINE = "simulate.engine=vectorized"


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (
            ["algorithm.name=dpsgd", "topology.kind=directed-ring"],
            ["'dpsgd' needs an undirected", "directed-ring-4", "n0 -> n1"],
        ),
        (["algorithm.name=rps", "topology.kind=ring"], ["'rps'", "ring-4"]),
        (
            ["algorithm.name=dpsgd", "topology.kind=ring", 'faults.edge_drop={"n0->n2"=0.5}'],
            ["faults.edge_drop names 'n0->n2'", "not an edge"],
        ),
        (
            ["algorithm.name=rps", "topology.kind=complete", "compression.codec=qsgd", ENGINE],
            ["simulate.engine = 'vectorized' cannot run", "stochastic codec 'qsgd'", "'messages'"],
        ),
        (
            ["algorithm.name=ops", "transport.mode=deadline", "simulate.device=cuda"],
            ["simulate.device = 'cuda' needs the vectorized engine", "holds a silent peer"],
        ),
        (
            ["algorithm.name=fedbuff", "topology.kind=star", "simulate.engine=messages"],
            ["asynchronous algorithm 'fedbuff'", "simulate.engine = 'auto'"],
        ),
    ],
    ids=["one-way-graph", "not-all-pairs", "no-such-edge", "rps-qsgd", "device", "asynchronous"],
)
def test_a_graph_or_engine_the_run_cannot_take_is_refused_before_any_data(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    overrides: list[str],
    needles: list[str],
) -> None:
    """Issue 40: a graph that does not suit the algorithm, and what the engine asked for
    cannot run, were refused only once the data were loaded and the model built, after
    the warning of a batch larger than a peer's data. Now with the cheap checks: one
    line, no data loaded, no model built, no warning."""
    from fedcore.setup import prepare

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("data loaded or a model built before the cheap checks")

    monkeypatch.setattr(prepare, "load_training_data", never)
    monkeypatch.setattr(prepare, "build_evaluator", never)
    argv = ["simulate", "-q", "--set", "topology.nodes=4", "--set", "data.batch_size=100000"]
    for item in overrides:
        argv += ["--set", item]
    with caplog.at_level(logging.WARNING, logger="fedcore"):
        one_line_error(capsys, argv, *needles)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert not Path("runs").exists()


def test_a_small_graph_is_weighted_before_the_data_and_a_large_one_after(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same run either way (its fingerprint and weights); only the order differs."""
    config = load_config(None, SMALL)
    steps = ("loaded dataset", "weighted the graph")
    with caplog.at_level(logging.INFO, logger="fedcore.setup"):
        early = prepare_run(config)
    text = caplog.text
    assert text.index(steps[1]) < text.index(steps[0])
    caplog.clear()
    monkeypatch.setattr(plan, "EARLY_GRAPH_EDGES", 10)
    with caplog.at_level(logging.INFO, logger="fedcore.setup"):
        late = prepare_run(config)
    text = caplog.text
    assert text.index(steps[0]) < text.index(steps[1])
    assert early.run_id == late.run_id and early.graph.nodes == late.graph.nodes


# --- prepare_run: memory estimate, progress, timings --------------------------------------


SMALL = ["topology.nodes=16", "data.partition=iid", "run.rounds=2"]


def test_a_run_clearly_over_memory_is_refused_before_the_graph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = load_config(None, SMALL)
    built: list[object] = []
    real = plan.build_topology
    monkeypatch.setattr(plan, "build_topology", lambda cfg: built.append(cfg) or real(cfg))
    monkeypatch.setattr(plan, "physical_memory", lambda: 2_000)
    monkeypatch.setattr(plan, "EARLY_GRAPH_EDGES", 0)  # a large graph: built after the bound
    with pytest.raises(ConfigError) as info:
        prepare_run(config)
    text = str(info.value)
    assert "KiB" in text and "graph edges" in text and "topology.nodes" in text
    assert "models" not in text  # a peer holds one model: only the graph counts
    with pytest.raises(ConfigError, match=r"16 models of 650 parameters x 4 copies"):
        prepare_run(config, hosts_all=True)
    assert not built
    # Enough memory: the run is prepared (and every node's models are counted).
    monkeypatch.setattr(plan, "physical_memory", lambda: 2**30)
    assert len(prepare_run(config, hosts_all=True).graph.nodes) == 16
    assert len(built) == 1


def test_estimated_edges_are_close_to_the_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    for kind in KINDS:
        schedule = kind == "one-peer-exponential" or kind.startswith("epidemic-")
        for undirected in (False, True) if not schedule else (False,):
            cfg = TopologyConfig(kind=kind, nodes=64, undirected=undirected, period=3)
            t = build_topology(cfg)
            graphs = [t.at(r) for r in range(t.period)]
            actual = sum(len(g.edges()) + len(g.nodes) for g in graphs)
            assert 0.9 * actual <= estimated_edges(cfg, 64) <= 1.2 * actual, (kind, undirected)
    assert estimated_edges(TopologyConfig(file="g.json"), 64) == 0


def test_a_slow_preparation_prints_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.05)
    stream = io.StringIO()
    with progress.announce_if_slow(stream, 16):  # below PROGRESS_NODES: no line
        time.sleep(0.3)
    assert stream.getvalue() == ""
    with progress.announce_if_slow(stream, None):  # a graph file, its size unknown
        time.sleep(0.3)
    assert stream.getvalue() == ""
    monkeypatch.setattr(progress, "PROGRESS_NODES", 16)
    with progress.announce_if_slow(stream, 16):
        time.sleep(0.5)
    assert stream.getvalue() == "preparing 16 nodes (graph and weights) ...\n"
    with progress.announce_if_slow(None, 16):  # no stream: nothing anywhere, no error
        time.sleep(0.1)


def test_a_quick_preparation_prints_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PROGRESS_NODES", 1)
    stream = io.StringIO()
    with progress.announce_if_slow(stream, 16):
        prepare_run(load_config(None, SMALL))
    time.sleep(0.1)
    assert stream.getvalue() == ""


def test_simulate_announces_a_slow_preparation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``simulate`` (the caller that wants it) shows the line; preparing itself prints
    nothing and starts no thread."""
    from fedcore.simulation.simulate import simulate

    real = plan.build_topology

    def slow(cfg: TopologyConfig) -> object:
        time.sleep(0.5)
        return real(cfg)

    monkeypatch.setattr(plan, "build_topology", slow)
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.05)
    monkeypatch.setattr(progress, "PROGRESS_NODES", 16)
    threads = threading.active_count()
    prepare_run(load_config(None, SMALL))
    assert threading.active_count() == threads
    stream = io.StringIO()
    config = load_config(None, [*SMALL, "run.rounds=1"])
    simulate(config, out_dir=tmp_path, progress_stream=stream)
    assert stream.getvalue().startswith("preparing 16 nodes (graph and weights) ...\n")


def test_each_step_is_logged_with_its_time(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fedcore.setup"):
        prepare_run(load_config(None, SMALL))
    text = caplog.text
    for step in ("loaded dataset digits", "split the data", "built the graph", "weighted"):
        assert step in text, text
    assert "prepared 16 nodes in" in text


def test_training_examples_of_digits_match_the_split() -> None:
    for fraction in (0.2, 0.1, 0.33, 0.5):
        assert training_examples("digits", test_fraction=fraction) == len(
            digits(test_fraction=fraction).y_train
        )
    assert training_examples("mnist1d", test_fraction=0.2) is None
    assert training_examples("pkg.mod:factory", test_fraction=0.2) is None


# --- mixings over every pair ----------------------------------------------------------------


def test_check_mixing_size() -> None:
    check_mixing_size(3162, mixing="complete", algorithm="central")
    check_mixing_size(100_000, mixing="push-sum", algorithm="ops")
    with pytest.raises(TopologyError, match=r"3,163 nodes .* at most 3,162 nodes"):
        check_mixing_size(3163, mixing="all-pairs", algorithm="rps")
    assert 3162 * 3161 <= MAX_MIXING_PAIRS < 3163 * 3162
    with pytest.raises(TopologyError, match="every pair"):
        prepare(build("ring", nodes=4000), mixing="complete", algorithm="central")


# --- faster, and the same as before ---------------------------------------------------------


def test_social_graphs_are_the_ones_they_were() -> None:
    """The Fenwick-tree pick gives exactly the edges of the linear scan it replaced."""
    edges = sorted((int(u[1:]), int(v[1:])) for u, v in social(300, seed=3).edges())
    digest = hashlib.sha256(repr(edges).encode()).hexdigest()
    assert digest == "c7c588ddc915f856cd79e7addf328bb2e68f826c392510140be5a2f28ecd05c7"


def test_the_dirichlet_split_is_the_one_it_was() -> None:
    parts = partition(digits().y_train, 16, "dirichlet", seed=0, alpha=0.3)
    blob = b"".join(p.astype(np.int64).tobytes() + b"|" for p in parts)
    digest = hashlib.sha256(blob).hexdigest()
    assert digest == "7e7987557238e09a83b492ded191e0a42a7f27c5167524516dc904f959abab4f"


def test_a_hopeless_dirichlet_split_fails_at_once() -> None:
    y = digits().y_train
    with pytest.raises(DataError, match=r"left \d+ of 700 nodes .* no try would leave none"):
        partition(y, 700, "dirichlet", seed=0, alpha=0.3)
    with pytest.raises(DataError, match="1000 tries"):  # few nodes short: every try is made
        partition(np.repeat(np.arange(2), 10), 10, "dirichlet", seed=0, alpha=0.001)


def test_the_sparse_spectral_gap_agrees_with_the_dense_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = prepare(build("social", nodes=600, seed=0), mixing="push-sum", algorithm="ops")
    dense = 1.0 - analysis._dense_modulus(graph)
    assert spectral_gap(graph) == pytest.approx(dense, abs=1e-9)
    schedule = build("one-peer-exponential", nodes=600)
    assert spectral_gap(schedule) == pytest.approx(
        1.0 - analysis._dense_modulus(schedule), abs=1e-9
    )

    from scipy.sparse import linalg

    def fails(*args: object, **kwargs: object) -> None:
        raise linalg.ArpackNoConvergence("no convergence", np.zeros(0), np.zeros(0))

    monkeypatch.setattr(linalg, "eigs", fails)
    assert spectral_gap(graph) == dense  # ARPACK gave up: the dense way


# --- the certificate folder -----------------------------------------------------------------


NODES = [f"n{i}" for i in range(8)]


def test_check_tls_dir_passes_a_complete_folder(tmp_path: Path) -> None:
    init_certs(NODES, tmp_path / "certs")
    (tmp_path / "certs" / "ca.key").unlink()  # peers never need the CA's key
    check_tls_dir(tmp_path / "certs", NODES)


def test_check_tls_dir_names_a_missing_folder(tmp_path: Path) -> None:
    folder = tmp_path / "nope"
    with pytest.raises(ConfigError) as info:
        check_tls_dir(folder, NODES, config="exp.toml")
    text = str(info.value)
    assert "\n" not in text
    assert f"transport.tls.dir {folder} does not exist" in text
    assert f"fedcore certs init --config exp.toml --out {folder}" in text
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not a folder"):
        check_tls_dir(tmp_path / "file", NODES)


def test_check_tls_dir_names_the_missing_files(tmp_path: Path) -> None:
    folder = tmp_path / "certs"
    init_certs(NODES[:3], folder)
    with pytest.raises(ConfigError) as info:
        check_tls_dir(folder, NODES)
    text = str(info.value)
    assert "has no n3.crt, n3.key, n4.crt, n4.key and 6 more;" in text
    assert "fedcore certs init --config CONFIG --out" in text
    (folder / "ca.crt").unlink()
    (folder / "n1.key").unlink()
    with pytest.raises(ConfigError, match=r"has no ca\.crt, n1\.key, n3\.crt, n3\.key and "):
        check_tls_dir(folder, NODES)


def test_check_tls_dir_refuses_an_id_that_cannot_name_a_file(tmp_path: Path) -> None:
    init_certs(NODES, tmp_path)
    with pytest.raises(ConfigError, match="cannot name a certificate"):
        check_tls_dir(tmp_path, ["../evil"])


def test_random_draws_of_the_generators_are_untouched() -> None:
    """The generators still draw only from random.Random(seed): one seed, one graph."""
    state = random.getstate()
    a, b = social(500, seed=7), social(500, seed=7)
    assert a == b and random.getstate() == state


def test_launch_names_a_missing_certificate_folder_before_any_peer_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["launch", "--out", str(out), "-q", "--set", f"transport.tls.dir={tmp_path / 'nope'}"]
    line = one_line_error(capsys, argv, str(tmp_path / "nope"))
    assert "fedcore certs init" in line
    assert not (out / "nodes").exists()  # no peer was started
