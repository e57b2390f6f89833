"""The rules whose state and messages are per edge (pattern ``"edges"``: RPS, and robust
push-sum, ``ops`` with ``robust = true``) on a sharded run against one process: R = 2 (and
4) ranks end with the one-process run's parameters (``params_sha256``), traffic, byte and
fault counts, evaluations and per-node records, with ``fp32`` and a compressing codec (RPS:
``sign``; robust push-sum takes only cast codecs: ``bf16``), without faults and with drops
and a crash, on a graph file with odd ids (RPS also with empty blocks: a model smaller than
the peers; robust push-sum also with a node optimizer and local steps), and robust push-sum
on the one-peer exponential schedule; robust push-sum's totals per edge survive an interrupt
and ``--resume`` on 2 ranks. Each cut edge's message crosses once, to its receiver's rank
(:func:`~fedcore.engines.shard_edges.plan_edges`), and the summary's halo bytes are those
messages' bytes.

The ranks are forked processes, as in ``tests/engines/test_sharded.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedcore import topology
from fedcore.algorithms.ops import OPS
from fedcore.algorithms.rps import block_sizes
from fedcore.config import Config, load_config
from fedcore.engines.batched import batched_form
from fedcore.engines.partition import place
from fedcore.engines.shard_edges import plan_edges
from fedcore.engines.shard_plan import plan_graph
from fedcore.engines.sharded import config_refusal, setup_refusal
from fedcore.engines.stacked_graph import StackedGraph, stack_graph
from fedcore.setup import checkpoint
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.rank_checkpoints import rank_file
from fedcore.simulation.simulate import simulate
from tests.engines.test_sharded import SAME, _config, _edges, _records, run_ranks
from tests.engines.test_sharded_faults import CODECS, FAULTS
from tests.engines.test_sharded_resume import STOP_AT, run_world
from tests.engines.test_sharded_schedules import _config as _schedule_config
from tests.engines.test_vectorized import GRAPHS, ODD_IDS

ROBUST = ["algorithm.robust=true"]
TINY = ["data.dataset=tests.engines.test_vectorized:tiny_dataset", "model.name=logreg"]

CASES = {
    # name: (algorithm, codec, faults, worlds, extra settings)
    "rps-fp32": ("rps", "fp32", False, (2,), []),
    "rps-sign-faults": ("rps", "sign", True, (2, 4), []),
    # a model of 4 values on 8 peers: 4 owners of an empty block, no message on their edges
    "rps-empty-blocks": ("rps", "sign", True, (3,), TINY),
    # with a node optimizer and local steps (each row's own, beside its edges')
    "robust-bf16": (
        "ops",
        "bf16",
        False,
        (2,),
        [*ROBUST, "optimizer.name=adam", "run.local_steps=2"],
    ),
    # its checkpoints are what the resume test interrupts and resumes
    "robust-fp32-faults": ("ops", "fp32", True, (), [*ROBUST, "run.checkpoint_every=2"]),
    # the gradient trackers' running sums per edge (push-diging: its value's and weight's too)
    "robust-push-pull-bf16-faults": ("push-pull", "bf16", True, (2,), ROBUST),
    "robust-push-diging-faults": ("push-diging", "fp32", True, (3,), ROBUST),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded-edges")


def _case(name: str, folder: Path) -> Config:
    algorithm, codec, faults, _, extra = CASES[name]
    return _config(
        algorithm,
        folder,
        *(s for s in GRAPHS[algorithm] if "topology" not in s),
        *CODECS[codec],
        *(FAULTS if faults else []),
        *extra,
    )


def _one(config: Config, out: Path) -> dict[str, object]:
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=out, show_progress=False, threads=1)
    assert expected["engine"] == "vectorized"
    return expected


def _equal(out: Path, one: Path, expected: dict[str, object], world: int) -> dict[str, object]:
    got: dict[str, object] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert got["ranks"] == world
    for key in SAME:
        assert got.get(key) == expected.get(key), (world, key)
    assert _records(out) == _records(one), world
    return got


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3]])
def test_per_edge_rules_on_ranks_equal_one_process(name: str, folder: Path) -> None:
    algorithm, codec, faults, worlds, _ = CASES[name]
    config = _case(name, folder)
    assert config_refusal(config) is None
    one = folder / f"{name}-one"
    expected = _one(config, one)
    halo = {}
    for world in worlds:
        out = folder / f"{name}-{world}"
        assert run_ranks(config, world, out) == dict.fromkeys(range(world), "ok")
        halo[world] = _equal(out, one, expected, world)["halo_bytes_per_round"]
    traffic = expected["traffic"]
    assert isinstance(traffic, dict)
    if faults:  # the plan lost messages, and a crashed peer sent none
        assert traffic["messages_dropped"] > 0
        assert expected["faults"]["down_rounds"] == {ODD_IDS[3]: [[1, 2]]}  # type: ignore[index]
    if codec != "fp32" and name != "rps-empty-blocks":  # (a block of one value grows)
        assert traffic["compression_ratio_vs_fp32"] > 1.5
    if algorithm == "rps" and 2 in halo:  # the halo, edge by edge: each cut edge's block once
        fp32 = _rps_halo(config)
        if codec == "fp32":
            assert halo[2] == fp32
        else:  # the sign codec shrinks every block that crosses
            assert 0 < halo[2] < fp32 / 4


def _rps_halo(config: Config) -> int:
    """RPS's halo bytes a round on 2 ranks, fp32, every peer up: each cut edge's message
    once, the sender's block of its receiver (the scatter), and each sender's average of
    its own block once per other rank it has an edge into (the gather)."""
    setup = prepare_run(config)
    src, dst = _edges(setup)
    n = len(setup.graph.nodes)
    owner = place("auto", n, src, dst, 2).owner
    size = block_sizes(setup.start.numel(), n)
    cut = [(int(u), int(v)) for u, v in zip(src, dst, strict=True) if owner[u] != owner[v]]
    scatter = sum(4 * size[v] for _, v in cut)
    gather = sum(4 * size[u] for u, _ in {(u, int(owner[v])) for u, v in cut})
    return scatter + gather


def test_robust_push_sum_on_a_schedule_on_ranks_equals_one_process(folder: Path) -> None:
    """The one-peer exponential schedule: each round's graph holds some of the union's
    edges; the totals of the others wait on their ranks."""
    config = _schedule_config("ops", *ROBUST)
    assert prepare_run(config).graph.period == 3
    one = folder / "schedule-one"
    expected = _one(config, one)
    out = folder / "schedule-2"
    assert run_ranks(config, 2, out) == {0: "ok", 1: "ok"}
    got = _equal(out, one, expected, 2)
    assert got["halo_bytes"] > 0


def test_resume_of_robust_push_sum_on_2_ranks_equals_the_uninterrupted_run(
    folder: Path,
) -> None:
    """Its running totals per edge (sent and seen) are in each rank's checkpoint, with
    drops and a crash: interrupted after the checkpoint of round 2 and resumed, the run
    ends as one process does."""
    config = _case("robust-fp32-faults", folder)
    one = folder / "robust-resume-one"
    expected = _one(config, one)
    out = folder / "robust-resume-2"
    outcomes = run_world(config, out, stop=STOP_AT)
    assert outcomes[0].startswith(f"KeyboardInterrupt: after round {STOP_AT} of 6"), outcomes
    saved = checkpoint.read(rank_file(out, 1, 2, 2))
    totals = saved["network"]["state"]["fields"]  # rank 1's out- and in-edges' totals
    assert totals["sent_x"].shape[0] > 0 and totals["seen_omega"].shape[0] > 0
    resumed = folder / "robust-resumed"
    shutil.copytree(out, resumed)
    assert run_world(config, resumed, resume=True) == {0: "ok", 1: "ok"}
    got = _equal(resumed, one, expected, 2)
    assert got["status"] == "completed" and got["faults"]


def _random_union(n: int, seed: int) -> tuple[Any, StackedGraph]:
    rng = np.random.default_rng(seed)
    ids = [f"p{i}" for i in rng.permutation(n)]  # graph order is not sorted-id order
    pairs = {(int(u), int(v)) for u, v in rng.integers(0, n, (3 * n, 2)) if u != v}
    edges = [(ids[u], ids[v]) for u, v in sorted(pairs)]
    graph = topology.TrustGraph.from_edges(edges, name="random", nodes=ids)
    weights = {**dict.fromkeys(edges, 0.1), **{(v, v): 0.5 for v in ids}}
    form = batched_form(OPS(robust=True))
    stacked = stack_graph(graph.with_weights(weights), device=torch.device("cpu"))
    form.use_graphs([stacked])
    return form.union, stacked


@pytest.mark.parametrize("world", [1, 3])
def test_each_cut_edge_crosses_once_to_its_receivers_rank(world: int) -> None:
    """What rank r sends rank q is, in order, what q expects from r: the cut edges from r's
    rows into q's, each once; every in-edge reads its own edge's message (a local sender's
    out-edge, or the received one)."""
    union, graph = _random_union(11, 4)
    n = graph.n
    shards = [np.arange(r, n, world, dtype=np.int64) for r in range(world)]  # interleaved
    owner = torch.empty(n, dtype=torch.long)
    for r, rows in enumerate(shards):
        owner[torch.from_numpy(rows)] = r
    plans = []
    for r in range(world):
        halo = plan_graph(graph, shards, r).halo
        plans.append(plan_edges(union, graph, owner, torch.from_numpy(shards[r]), r, halo))
    out_mine = [torch.nonzero(owner[union.out_row] == r).squeeze(1) for r in range(world)]
    in_mine = [torch.nonzero(owner[union.in_row] == r).squeeze(1) for r in range(world)]
    crossing = 0
    for r in range(world):
        p = plans[r]
        sent = out_mine[r][p.send]  # the union's out-edges r sends, by destination rank
        got = union.in_to_out[in_mine[r][p.recv_in]]  # the out-edges r receives
        assert torch.equal(union.out_row[got], p.recv_sender)
        for q in range(world):
            start = sum(p.send_counts[:q])
            block = sent[start : start + p.send_counts[q]]
            theirs = plans[q]
            begin = sum(theirs.recv_counts[:r])
            expect = union.in_to_out[in_mine[q][theirs.recv_in[begin : begin + len(block)]]]
            assert torch.equal(block, expect)
            assert bool((owner[union.out_peer[block]] == q).all()) and (q != r or not len(block))
            crossing += len(block)
        # Each in-edge reads its own out-edge's message.
        ids = torch.cat([out_mine[r], got, torch.tensor([-1])])
        assert torch.equal(ids[p.at], union.in_to_out[in_mine[r]])
    assert crossing == int((owner[union.out_row] != owner[union.out_peer]).sum())


def test_rps_with_a_stochastic_codec_is_refused_as_one_process_refuses_it() -> None:
    config = load_config(
        None, ["algorithm.name=rps", "topology.kind=complete", "topology.nodes=4", *CODECS["qsgd"]]
    )
    assert config_refusal(config) is None
    why = setup_refusal(prepare_run(config))
    assert why is not None and "stochastic codec 'qsgd'" in why and "\n" not in why
