"""Schedules of graphs (time-varying topologies) on a sharded run against one process: the
one-peer exponential schedule (``ops``), and a schedule of three random graphs over the
odd ids whose largest in-degrees and halos differ from graph to graph (``ops``, ``dpsgd``,
``dol``, ``deepsqueeze``), end with the one-process run's parameters (``params_sha256``),
traffic, byte and fault counts, evaluations and per-node records, with codecs and a fault
plan, on R = 1 to 4 ranks. Each graph of the
period has its own plan on every rank (:mod:`fedcore.engines.shard_plan`), and the
summary's placement figures are those of one period's rounds.

The ranks are forked processes, as in ``tests/engines/test_sharded.py``; the odd schedule
is built in place of the generator (``_odd_builder``, run in every rank first).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore import topology
from fedcore.config import Config, load_config
from fedcore.engines.partition import halo_rows, place
from fedcore.engines.shard_plan import placement_figures, plan_graph, union_edges
from fedcore.engines.sharded import setup_refusal
from fedcore.engines.stacked_graph import StackedGraph, stack_graph
from fedcore.setup import plan
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate
from tests.engines.test_sharded import SAME, _records, run_ranks
from tests.engines.test_sharded_faults import CODECS, FAULTS
from tests.engines.test_vectorized import ODD_IDS

ODD = ODD_IDS[:8]


def odd_schedule() -> topology.Schedule:
    """Three symmetric graphs over the odd ids: a ring in a random order, another with
    random chords, a perfect matching (largest in-degrees 2, more, 1); their union is
    connected, each graph's halo its own."""
    rng = np.random.default_rng(7)
    n = len(ODD)

    def graph(t: int, pairs: list[tuple[int, int]]) -> topology.TrustGraph:
        edges = {(ODD[u], ODD[v]) for u, v in pairs} | {(ODD[v], ODD[u]) for u, v in pairs}
        return topology.TrustGraph.from_edges(sorted(edges), name=f"odd-{t}", nodes=ODD)

    ring = rng.permutation(n).tolist()
    other = rng.permutation(n).tolist()
    chords = [(int(u), int(v)) for u, v in rng.integers(0, n, (6, 2)) if u != v]
    match = rng.permutation(n).tolist()
    return topology.Schedule(
        [
            graph(0, [(ring[i], ring[(i + 1) % n]) for i in range(n)]),
            graph(1, [(other[i], other[(i + 1) % n]) for i in range(n)] + chords),
            graph(2, [(match[2 * i], match[2 * i + 1]) for i in range(n // 2)]),
        ],
        name="odd-schedule",
    )


def _odd_builder() -> None:
    """In a rank's process: the generator builds :func:`odd_schedule`."""
    plan.build_topology = lambda cfg: odd_schedule()


@pytest.fixture
def odd(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator builds :func:`odd_schedule` (in this process and the ranks it forks)."""
    monkeypatch.setattr(plan, "build_topology", lambda cfg: odd_schedule())


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded-schedules")


def _config(algorithm: str, *extra: str) -> Config:
    return load_config(
        None,
        [
            "run.rounds=6",  # two periods of three graphs
            "run.eval_every=3",
            f"algorithm.name={algorithm}",
            "algorithm.lr=0.3",
            "transport.strict_timeout_s=120",
            "topology.kind=one-peer-exponential",
            "topology.nodes=8",
            *extra,
        ],
    )


def _stacked(config: Config) -> list[StackedGraph]:
    setup = prepare_run(config)
    return [stack_graph(setup.graph.at(t), device=torch.device("cpu")) for t in range(3)]


CASES = [
    # examples/ops-time-varying.toml's schedule (n0 .. n7), without codec or faults
    ("ops", "one-peer", "fp32", (1, 2, 3), False),
    # the odd schedule: push-sum's encoded shares, each graph's own; gossip; a stochastic
    # codec's draws; error feedback
    ("ops", "odd", "topk", (2, 3), True),
    ("dpsgd", "odd", "sign", (4,), True),
    ("dol", "odd", "qsgd", (3,), True),
    ("deepsqueeze", "odd", "randk", (2,), False),
]


@pytest.mark.parametrize(("algorithm", "graph", "codec", "worlds", "faults"), CASES)
def test_a_schedule_on_ranks_equals_one_process(
    algorithm: str,
    graph: str,
    codec: str,
    worlds: tuple[int, ...],
    faults: bool,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if graph == "odd":
        monkeypatch.setattr(plan, "build_topology", lambda cfg: odd_schedule())
    extra = CODECS[codec] + (FAULTS if faults else [])
    config = _config(algorithm, *extra)
    setup = prepare_run(config)
    assert setup.graph.period == 3 and setup_refusal(setup) is None
    case = f"{algorithm}-{graph}-{codec}-{faults}"
    one = folder / f"{case}-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    assert expected["engine"] == "vectorized"
    graphs = _stacked(config)
    src, dst = union_edges(graphs)
    for world in worlds:
        out = folder / f"{case}-{world}"
        prepare = _odd_builder if graph == "odd" else None
        assert run_ranks(config, world, out, prepare=prepare) == dict.fromkeys(range(world), "ok")
        got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert got["ranks"] == world
        for key in SAME:
            assert got.get(key) == expected.get(key), (world, key)
        assert _records(out) == _records(one), world
        owner = place("auto", 8, src, dst, world).owner
        cut, _ = placement_figures(graphs, owner, world)
        assert got["cut_fraction"] == cut
        assert (world == 1) == (got["halo_bytes"] == 0)
    if faults:
        assert expected["traffic"]["messages_dropped"] > 0
        assert expected["faults"]["down_rounds"] == {ODD_IDS[3]: [[1, 2]]}
    if codec != "fp32":
        assert expected["traffic"]["compression_ratio_vs_fp32"] > 1.5


def test_each_graph_of_a_schedule_has_its_own_plan(odd: None) -> None:
    """One placement from the union of the period's edges; per graph and rank, the halo
    sends what the other ranks' plans expect, every inbox slot reads its in-neighbour's
    row in the extended stack, and the split sizes differ from graph to graph; the cut
    fraction counts the edges of one period's rounds."""
    graphs = _stacked(_config("ops"))
    src, dst = union_edges(graphs)
    keys = {(int(u), int(v)) for g in graphs for u, v in zip(g.src, g.dst, strict=True)}
    assert sorted(keys) == sorted(zip(src.tolist(), dst.tolist(), strict=True))
    assert [int(g.nbr.shape[1]) for g in graphs][::2] == [2, 1]
    world = 3
    placed = place("graph", 8, src, dst, world)
    sizes = set()
    for g in graphs:
        plans = [plan_graph(g, placed.rows, r) for r in range(world)]
        for r, p in enumerate(plans):
            mine = torch.from_numpy(placed.rows[r])
            extended = torch.cat([mine, p.halo.recv_rows])
            assert torch.equal(extended[p.nbr], g.nbr[mine])
            for q, count in enumerate(p.halo.send_counts):
                at = sum(p.halo.send_counts[:q])
                sent = mine[p.halo.send_rows[at : at + count]]
                start = sum(plans[q].halo.recv_counts[:r])
                assert torch.equal(sent, plans[q].halo.recv_rows[start : start + count])
        sizes.add(tuple(c for p in plans for c in p.halo.send_counts))
    assert len(sizes) == 3
    cut, rows = placement_figures(graphs, placed.owner, world)
    owner = placed.owner
    pairs = [(u, v) for g in graphs for u, v in zip(g.src.tolist(), g.dst.tolist(), strict=True)]
    assert cut == sum(owner[u] != owner[v] for u, v in pairs) / len(pairs)
    per_graph = [halo_rows(g.src.numpy(), g.dst.numpy(), owner, world) for g in graphs]
    assert rows == sum(per_graph) / 3
