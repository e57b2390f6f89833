"""Epidemic learning's schedules (``epidemic-local``, ``epidemic-oracle``): draws from the seed
alone, EL's weights, one-line refusals, and the same run on both in-process engines."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from fedcore.cli.app import main
from fedcore.config import load_config
from fedcore.errors import ConfigError, FedcoreError, TopologyError
from fedcore.setup.prepare import prepare_run
from fedcore.topology import build, parse_spec, prepare
from fedcore.topology.epidemic import epidemic_local, epidemic_oracle, local_targets
from tests import docs_text
from tests.engines.test_vectorized import ROUNDS, assert_same_run

KINDS = ("epidemic-local", "epidemic-oracle")


@pytest.mark.parametrize("kind", KINDS)
def test_a_schedule_is_a_function_of_the_seed(kind: str) -> None:
    one = build(kind, nodes=10, seed=7, degree=2, period=6)
    assert one == build(kind, nodes=10, seed=7, degree=2, period=6)
    other = build(kind, nodes=10, seed=8, degree=2, period=6)
    assert [g.edges() for g in one.graphs] != [g.edges() for g in other.graphs]
    # fresh each round, and keyed by (seed, round) alone: a shorter period is a prefix
    assert len({g.edges() for g in one.graphs}) == 6
    short = build(kind, nodes=10, seed=7, degree=2, period=2)
    assert [g.edges() for g in short.graphs] == [g.edges() for g in one.graphs[:2]]


def test_local_peers_draw_alone_distinct_others() -> None:
    n, s = 9, 3
    schedule = epidemic_local(n, s, seed=4, period=5)
    for t, g in enumerate(schedule.graphs):
        rows = local_targets(n, s, seed=4, round=t)
        for i, node in enumerate(g.nodes):
            out = g.out_neighbours(node)
            assert len(out) == s and node not in out
            assert [g.nodes.index(v) for v in out] == sorted(rows[i])
            # a real peer computes its own row from the keyed hash alone
            assert local_targets(n, s, seed=4, round=t, peers=[i]).tolist() == [rows[i].tolist()]
    ins = {len(g.in_neighbours(v)) for g in schedule.graphs for v in g.nodes}
    assert len(ins) > 1  # EL-Local's in-degrees vary
    # every other peer equally likely: 4 others, 2 drawn, 400 rounds -> 200 each
    counts = Counter(
        int(v) for t in range(400) for v in local_targets(5, 2, seed=1, round=t, peers=[0])[0]
    )
    assert set(counts) == {1, 2, 3, 4} and all(150 < c < 250 for c in counts.values())


def test_oracle_rounds_are_regular_and_weigh_as_el() -> None:
    n, s = 10, 3
    schedule = epidemic_oracle(n, s, seed=2, period=4)
    assert schedule.is_symmetric()
    for g in schedule.graphs:
        assert {len(g.out_neighbours(u)) for u in g.nodes} == {s}
    weighted = prepare(schedule, mixing="doubly-stochastic", algorithm="dpsgd")
    for g in weighted.graphs:  # a receiver's uniform average of itself and what arrives
        _, _, w = g.index_edges()
        assert w is not None and np.all(w == 1 / (s + 1))
        assert np.all(g.self_weights() == 1 - s / (s + 1))
    pushed = prepare(epidemic_local(n, s, seed=2, period=4), mixing="push-sum", algorithm="ops")
    for g in pushed.graphs:
        _, _, w = g.index_edges()
        assert w is not None and np.all(w == 1 / (s + 1))


@pytest.mark.parametrize(
    ("kind", "params", "says"),
    [
        ("epidemic-local", {"degree": 0, "period": 3}, "from 1 to 5"),
        ("epidemic-oracle", {"degree": 6, "period": 3}, "from 1 to 5"),
        ("epidemic-local", {"degree": 2.5, "period": 3}, "whole number of peers"),
        ("epidemic-local", {"degree": True, "period": 3}, "whole number of peers"),
        ("epidemic-local", {"degree": 2, "period": 0}, "period"),
        ("epidemic-oracle", {"degree": 2}, "needs period"),
        ("epidemic-oracle", {"degree": 3, "period": 2, "nodes": 5}, "degree must be even"),
    ],
)
def test_bad_degree_or_period_is_refused_in_one_line(
    kind: str, params: dict[str, object], says: str
) -> None:
    params = dict(params)  # the case's own, untouched for a rerun
    nodes = params.pop("nodes", 6)
    with pytest.raises(TopologyError, match=says) as info:
        build(kind, nodes=nodes, **params)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_the_extremes_of_degree_run() -> None:
    full = epidemic_local(6, 5, seed=0, period=2)  # every other peer: the complete graph
    assert all(len(g.edges()) == 30 for g in full.graphs)
    ones = parse_spec("epidemic-oracle:6:degree=1,period=8")  # a perfect matching a round
    assert all(len(g.edges()) == 6 for g in ones.graphs) and ones.is_strongly_connected()


def _config(*settings: str) -> list[str]:
    return [f"run.rounds={ROUNDS}", "run.eval_every=10", "topology.nodes=8", *settings]


def test_a_config_draws_a_graph_every_round_unless_given_a_period() -> None:
    run = prepare_run(load_config(None, _config("topology.kind=epidemic-oracle")))
    assert run.graph.period == ROUNDS
    four = _config("topology.kind=epidemic-local", "topology.period=4", "algorithm.name=ops")
    assert prepare_run(load_config(None, four)).graph.period == 4
    for bad, says in (("topology.degree=0", "degree"), ("topology.period=-1", "period")):
        with pytest.raises(ConfigError, match=says):
            load_config(None, _config("topology.kind=epidemic-local", bad))
    with pytest.raises(FedcoreError, match="from 1 to 7") as info:
        prepare_run(
            load_config(None, _config("topology.kind=epidemic-oracle", "topology.degree=8"))
        )
    assert "\n" not in str(info.value)


def test_a_doubly_stochastic_rule_refuses_epidemic_local_in_one_line() -> None:
    config = load_config(None, _config("topology.kind=epidemic-local", "algorithm.name=dpsgd"))
    with pytest.raises(FedcoreError, match=r"one-way.*push-sum") as info:
        prepare_run(config)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "settings",
    [
        ["algorithm.name=dpsgd", "topology.kind=epidemic-oracle", "topology.degree=2"],
        ["algorithm.name=dsgt", "topology.kind=epidemic-oracle", "topology.seed=3"],
        [
            "algorithm.name=ops",
            "algorithm.robust=true",
            "topology.kind=epidemic-local",
            "topology.degree=2",
            "faults.drop=0.2",
        ],
    ],
    ids=["dpsgd-oracle", "dsgt-oracle", "robust-ops-local-drops"],
)
def test_engines_agree_bit_for_bit(settings: list[str]) -> None:
    assert_same_run(load_config(None, _config("algorithm.lr=0.3", *settings)))


def test_the_documented_config_and_command_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = docs_text.section("Epidemic learning")
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "el.toml").write_text(block, encoding="utf-8")
    config = load_config(tmp_path / "el.toml")
    assert (config.topology.kind, config.algorithm.name) == ("epidemic-oracle", "dpsgd")
    short = load_config(tmp_path / "el.toml", ["run.rounds=3"])
    assert prepare_run(short).graph.period == 3
    (line,) = [s for s in docs_text.all_text().splitlines() if "topology show epidemic" in s]
    argv = shlex.split(line, comments=True)
    assert argv[0] == "fedcore" and main(argv[1:]) == 0
    assert "schedule repeating every 10 rounds" in capsys.readouterr().out


def test_a_schedule_past_memory_is_refused_naming_the_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedcore.setup import plan

    monkeypatch.setattr(plan, "physical_memory", lambda: 1 << 20)  # 1 MiB
    config = load_config(None, ["topology.kind=epidemic-oracle", "run.rounds=100000"])
    with pytest.raises(ConfigError, match=r"a shorter topology\.period") as info:
        prepare_run(config)  # refused before one graph of its 100,000 is drawn
    assert "about 8,000,000 graph edges" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.grpc
def test_real_peers_draw_the_same_graphs(tmp_path: Path) -> None:
    """Each real peer builds the schedule from the seed alone: launch == simulate."""
    from fedcore.deploy.launch import launch
    from fedcore.simulation.simulate import simulate

    config = load_config(
        None,
        [
            "algorithm.name=ops",
            "topology.kind=epidemic-local",
            "topology.nodes=5",
            "topology.degree=2",
            "run.rounds=6",
            "run.eval_every=6",
            "simulate.engine=messages",
        ],
    )
    sim = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    real = launch(config, out_dir=tmp_path / "launch", show_progress=False, peers_per_process=64)
    assert real["transport"] == "grpc" and real["params_sha256"] == sim["params_sha256"]
    assert real["traffic"]["messages_sent"] == sim["traffic"]["messages_sent"] == 5 * 2 * 6
