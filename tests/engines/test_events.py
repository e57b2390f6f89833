"""The event engine and the asynchronous algorithms (:mod:`fedcore.engines.events`,
:mod:`fedcore.algorithms.asynchronous`): determinism, the invariants under asynchrony,
FedBuff = FedAvg at its limit, and parity with the synchronous counterparts per step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms.asynchronous import ADPSGD
from fedcore.config import load_config
from fedcore.engines.events import EventNetwork
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.errors import ConfigError
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate

GRAPHS = {
    "adpsgd": ["topology.kind=ring", "topology.undirected=true"],
    "dpsgd": ["topology.kind=ring", "topology.undirected=true"],
    "async-push-sum": ["topology.kind=exponential"],
    "ops": ["topology.kind=exponential"],
    "fedbuff": ["topology.kind=star"],
    "fedasync": ["topology.kind=star"],
    "fedavg": ["topology.kind=star"],
}
ASYNCHRONOUS = ("adpsgd", "async-push-sum", "fedbuff", "fedasync")


def _overrides(algorithm: str, *extra: str) -> list[str]:
    return [
        f"algorithm.name={algorithm}",
        *GRAPHS[algorithm],
        "topology.nodes=8",
        "run.rounds=12",
        "run.eval_every=6",
        "data.batch_size=16",
        "time.step_s=0.1",
        *extra,
    ]


def _network(algorithm: str, *extra: str) -> EventNetwork:
    return EventNetwork(prepare_run(load_config(None, _overrides(algorithm, *extra))))


def _run(folder: Path, overrides: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = simulate(load_config(None, overrides), out_dir=folder, show_progress=False)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


@pytest.mark.parametrize("algorithm", ASYNCHRONOUS)
def test_the_same_config_gives_the_same_times_and_bits(algorithm: str, tmp_path: Path) -> None:
    extra = ["time.compute='pareto'", "time.slow_fraction=0.25", "time.latency_s=0.01"]
    extra += ["time.on_s=3", "time.off_s=1", "faults.drop=0.1"]
    first, records = _run(tmp_path / "a", _overrides(algorithm, *extra))
    again, records_again = _run(tmp_path / "b", _overrides(algorithm, *extra))
    assert first["engine"] == "events"
    assert first["params_sha256"] == again["params_sha256"]
    assert first["time"] == again["time"] and first["time"]["virtual_seconds"] > 0
    assert records == records_again or [
        {k: v for k, v in r.items() if k != "wall_s"} for r in records
    ] == [{k: v for k, v in r.items() if k != "wall_s"} for r in records_again]
    rounds = [r for r in records if r["kind"] == "round"]
    assert len(rounds) == 12 and all(r["vtime"] > 0 for r in rounds)
    assert [r["vtime"] for r in rounds] == sorted(r["vtime"] for r in rounds)
    assert first["final"]["avg_model_accuracy"] > 0.3


@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_push_sum_mass_is_conserved_up_to_what_is_in_flight(drop: float) -> None:
    net = _network(
        "async-push-sum", f"faults.drop={drop}", "time.compute='lognormal'", "time.latency_s=0.05"
    )
    for _ in range(12):
        net.run_round()
        assert net.mass == pytest.approx(net.n, rel=1e-12)
        in_flight = float((net.sums[:, net.d] - net.applied[:, net.d]).sum())
        assert float(net.w.sum()) + in_flight == pytest.approx(net.n, rel=1e-12)
    assert net.flight or drop == 0.0 or net.mass == pytest.approx(net.n)
    assert bool((net.w > 0).all())


def test_adpsgd_pairwise_averaging_keeps_the_mean_at_zero_step() -> None:
    net = _network("adpsgd", "algorithm.lr=0", "time.compute='pareto'")
    net.x += torch.randn_like(net.x)  # distinct models, so averaging moves them
    mean = net.x.to(torch.float64).mean(dim=0)
    spread = float((net.x - net.x.mean(dim=0)).norm())
    for _ in range(12):
        net.run_round()
        assert torch.allclose(net.x.to(torch.float64).mean(dim=0), mean, atol=1e-5)
    assert float((net.x - net.x.mean(dim=0)).norm()) < spread / 2  # and it mixes


@st.composite
def _pairs(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    n = draw(st.integers(2, 8))
    pairs = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1]),
            max_size=24,
        )
    )
    return n, [i for i, _ in pairs], [j for _, j in pairs]


@settings(max_examples=150, deadline=None)
@given(_pairs(), st.integers(0, 2**31 - 1))
def test_adpsgd_batched_pair_layers_equal_the_averagings_one_by_one(
    case: tuple[int, list[int], list[int]], seed: int
) -> None:
    """The event engine averages a tick's pairs in layers; the result is bit for bit the
    sequential order (pairs sharing a peer keep their order)."""
    n, first, second = case
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(seed))
    one_by_one = x.clone()
    for i, j in zip(first, second, strict=True):
        mean = ADPSGD.average(one_by_one[i], one_by_one[j])
        one_by_one[i] = mean
        one_by_one[j] = mean
    ADPSGD.average_pairs(x, first, second)
    assert torch.equal(x, one_by_one)


def test_adpsgd_refuses_a_pair_of_one_peer() -> None:
    with pytest.raises(ValueError, match="with itself"):
        ADPSGD.average_pairs(torch.zeros(3, 2), [0, 1], [2, 1])


def test_fedbuff_with_every_worker_and_no_staleness_is_fedavg() -> None:
    """Equal compute times: every worker uploads in the same tick, the buffer holds all of
    them, nobody is stale. The same server model as FedAvg's up to float64 rounding order
    (FedAvg divides the example-weighted sum once; FedBuff steps by the weighted mean of
    the differences)."""
    extra = ["run.local_steps=2", "data.partition=dirichlet"]
    buff = _network("fedbuff", "algorithm.buffer=0", *extra)
    avg = VectorizedNetwork(
        prepare_run(load_config(None, _overrides("fedavg", *extra))), device=torch.device("cpu")
    )
    for _ in range(10):
        buff.run_round()
        avg.run_round()
    server = buff.server
    assert server is not None and buff.served.version == 10
    assert torch.allclose(buff.x[server], avg.model()[server], atol=1e-6, rtol=1e-5)
    assert not torch.equal(buff.x[server], buff.setup.start)


@pytest.mark.parametrize(
    ("asynchronous", "synchronous"),
    [("adpsgd", "dpsgd"), ("async-push-sum", "ops"), ("fedbuff", "fedavg")],
)
def test_homogeneous_peers_match_their_synchronous_counterpart_per_step(
    asynchronous: str, synchronous: str, tmp_path: Path
) -> None:
    """Claim (a): equal compute times, instant links: after the same number of gradient
    steps, the asynchronous method is where its synchronous counterpart is (within a few
    points of accuracy on digits)."""
    extra = ["run.rounds=40", "run.eval_every=40", "algorithm.lr=0.1"]
    own = ["algorithm.buffer=0"] if asynchronous == "fedbuff" else []
    a, _ = _run(tmp_path / "a", _overrides(asynchronous, *extra, *own))
    s, _ = _run(tmp_path / "s", _overrides(synchronous, *extra))
    assert a["engine"] == "events"
    acc_a, acc_s = a["final"]["avg_model_accuracy"], s["final"]["avg_model_accuracy"]
    assert acc_s > 0.8 and abs(acc_a - acc_s) < 0.05, (acc_a, acc_s)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            ["algorithm.name=fedbuff", "topology.kind=star", "algorithm.buffer=-1"],
            "algorithm.buffer",
        ),
        (["algorithm.name=fedasync", "topology.kind=star", "algorithm.alpha=2"], "algorithm.alpha"),
        (["algorithm.name=adpsgd", "topology.kind=directed-ring"], "symmetric|undirected"),
    ],
)
def test_bad_options_are_refused_before_any_work(overrides: list[str], needle: str) -> None:
    with pytest.raises(Exception, match=needle):
        prepare_run(load_config(None, [*overrides, "time.step_s=0.1"]))


def test_what_an_asynchronous_run_cannot_do_is_said_in_one_line(tmp_path: Path) -> None:
    base = ["algorithm.name=adpsgd", "topology.kind=ring", "topology.undirected=true"]
    with pytest.raises(ConfigError, match="needs compute times"):
        simulate(load_config(None, base), out_dir=tmp_path / "a", show_progress=False)
    with pytest.raises(ConfigError, match="event engine"):
        config = load_config(None, [*base, "time.step_s=0.1", "simulate.engine=vectorized"])
        simulate(config, out_dir=tmp_path / "b", show_progress=False)
    with pytest.raises(ConfigError, match="crashes"):
        config = load_config(None, [*base, "time.step_s=0.1", "faults.crashes=[{node='n1',at=2}]"])
        simulate(config, out_dir=tmp_path / "c", show_progress=False)
