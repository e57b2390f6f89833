"""FedAvg's robust aggregators (fedcore.algorithms.aggregators): each rule's definition on
hand-built [K, d] inputs, the one-line refusals, the run-time fallback, and the engines'
agreement with Krum."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms.aggregators import AGGREGATORS, Aggregator, make_aggregator
from fedcore.algorithms.robust_math import row_norms
from fedcore.algorithms.rule import Gathered, Rows
from fedcore.algorithms.server import FedAvgRule, FedAvgState
from fedcore.config import load_config
from fedcore.errors import ConfigError
from fedcore.setup.plan import outline_run
from fedcore.simulation.simulate import simulate
from tests import docs_text
from tests.clitools import one_line_error
from tests.engines.test_cohort import POPULATION
from tests.engines.test_sharded import equal_on_ranks
from tests.engines.test_sharded_faults import _case
from tests.engines.test_vectorized import _config, assert_same_run

FAST = settings(max_examples=25, deadline=None)

ROBUST = [name for name in AGGREGATORS if name != "mean"]


def _rule(name: str, **options: object) -> Aggregator:
    if name == "centered-clipping":
        options.setdefault("tau", 1.0)
    return make_aggregator(name, seed=5, **options)


def _floats(bound: float) -> st.SearchStrategy[float]:
    return st.floats(-bound, bound, allow_nan=False, width=32)


@st.composite
def _points(draw: st.DrawFn, k: int, d: int, bound: float = 100.0) -> torch.Tensor:
    values = draw(st.lists(_floats(bound), min_size=k * d, max_size=k * d))
    return torch.tensor(values, dtype=torch.float32).reshape(k, d)


@FAST
@given(
    st.sampled_from(ROBUST),
    st.integers(0, 2),
    st.sampled_from(["", "bucket", "nnm"]),
    st.data(),
)
def test_identical_honest_models_come_back_unchanged(
    name: str, f: int, pre: str, data: st.DataObject
) -> None:
    """K identical models (K enough for f): every rule returns that model, with bucketing
    or NNM first too; centered clipping from a centre within its radius."""
    options: dict[str, object] = {"f": f}
    if pre == "bucket":
        options["bucket"] = 2
    elif pre == "nnm":
        options["nnm"] = True
    rule = _rule(name, **options)
    k = data.draw(st.integers(2 * (2 * f + 3), 14))
    value = data.draw(_points(1, 3))[0]
    points = value.repeat(k, 1)
    center = value + torch.tensor([0.25, -0.25, 0.0])
    assert rule.short(k) is None
    out = rule(points, center, data.draw(st.integers(0, 50))).to(torch.float32)
    assert torch.equal(out, value), (out, value)


@FAST
@given(st.sampled_from(["trimmed-mean", "median"]), st.integers(0, 3), st.data())
def test_trimmed_mean_and_median_stay_within_the_honest_range(
    name: str, f: int, data: st.DataObject
) -> None:
    """f arbitrary finite outliers anywhere among the K models: every coordinate stays in
    the honest models' [min, max] of that coordinate."""
    honest_count = data.draw(st.integers(f + 1, f + 6))
    honest = data.draw(_points(honest_count, 4))
    outliers = data.draw(_points(f, 4, bound=2.0**127))
    order = torch.tensor(data.draw(st.permutations(range(honest_count + f))))
    points = torch.cat([honest, outliers])[order]
    rule = _rule(name, f=f)
    assert rule.short(points.shape[0]) is None
    out = rule(points, points[0], 0)
    low, high = (
        honest.to(torch.float64).min(dim=0).values,
        honest.to(torch.float64).max(dim=0).values,
    )
    assert bool(((low <= out) & (out <= high)).all()), (out, low, high)


@FAST
@given(st.integers(1, 3), st.booleans(), st.data())
def test_krum_picks_honest_models_when_attackers_sit_far_away(
    f: int, multi: bool, data: st.DataObject
) -> None:
    """Honest models within [-1, 1], f attackers near 1e6: Krum returns an honest model
    (one of them, bit for bit); Multi-Krum's mean of K - f stays among the honest."""
    k = data.draw(st.integers(2 * f + 3, 2 * f + 8))
    honest = data.draw(_points(k - f, 5, bound=1.0))
    attackers = 1e6 + data.draw(_points(f, 5, bound=10.0))
    order = torch.tensor(data.draw(st.permutations(range(k))))
    points = torch.cat([honest, attackers])[order]
    out = _rule("multikrum" if multi else "krum", f=f)(points, points[0], 0)
    if multi:
        assert float(out.abs().max()) <= 1.0
    else:
        assert any(torch.equal(out.to(torch.float32), h) for h in honest)


@FAST
@given(_points(4, 3, bound=10.0), _points(1, 3, bound=10.0))
def test_the_geometric_median_of_symmetric_points_is_their_centre(
    spokes: torch.Tensor, centre: torch.Tensor
) -> None:
    c = centre[0].to(torch.float64)
    s = spokes.to(torch.float64)
    points = torch.cat([c + s, c - s])
    rule = _rule("geomed", iterations=50)
    out = rule(points, points[0], 0)
    assert torch.allclose(out, c, atol=1e-6 * (1 + float(s.abs().max())))


@FAST
@given(st.integers(1, 4), st.floats(0.01, 10.0), st.data())
def test_centered_clipping_moves_at_most_tau_a_step(
    iterations: int, tau: float, data: st.DataObject
) -> None:
    """Any models, attackers far away included: the result lies within iterations x tau
    of the centre (each step moves at most tau)."""
    points = torch.cat([data.draw(_points(5, 3)), data.draw(_points(2, 3, bound=2.0**100))])
    centre = data.draw(_points(1, 3))[0].to(torch.float64)
    rule = _rule("centered-clipping", tau=tau, iterations=iterations)
    out = rule(points, centre, 0)
    moved = float(row_norms((out - centre).unsqueeze(0))[0])
    assert moved <= iterations * tau * (1 + 1e-9)


def test_bucketing_is_a_keyed_shuffle_of_the_round() -> None:
    """The same (seed, round) gives the same buckets; another round another shuffle."""
    points = torch.arange(12.0, dtype=torch.float64).reshape(6, 2) ** 2
    rule = _rule("median", bucket=2)
    assert torch.equal(rule(points, points[0], 3), rule(points, points[0], 3))
    outs = {tuple(rule(points, points[0], t).tolist()) for t in range(12)}
    assert len(outs) > 1


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("krumm", {}, "did you mean"),
        ("krum", {"m": 2}, "algorithm.m is an option of aggregator 'multikrum'"),
        ("mean", {"bucket": 2}, "bucketing and NNM feed a robust rule"),
        ("mean", {"f": 1}, "not of algorithm.aggregator = 'mean'"),
        ("krum", {"f": -1}, "algorithm.f must be a whole number >= 0"),
        ("krum", {"f": True}, "algorithm.f must be a whole number"),
        ("krum", {"f": 1.5}, "algorithm.f must be a whole number"),
        ("median", {"bucket": 0}, "algorithm.bucket must be at least 1"),
        ("median", {"bucket": 2, "nnm": True}, "two pre-aggregations"),
        ("median", {"nnm": 1}, "algorithm.nnm must be true or false"),
        ("multikrum", {"m": 0}, "algorithm.m must be at least 1"),
        ("geomed", {"iterations": 0}, "algorithm.iterations must be at least 1"),
        ("geomed", {"nu": 0.0}, r"algorithm.nu must be a finite number > 0"),
        ("geomed", {"tolerance": -1e-9}, r"algorithm.tolerance must be a finite number >= 0"),
        ("centered-clipping", {}, "needs algorithm.tau"),
        ("centered-clipping", {"tau": float("inf")}, "algorithm.tau must be a finite"),
        ("centered-clipping", {"tau": 0}, "algorithm.tau must be a finite number > 0"),
        ("trimmed-mean", {"f": 2, "trim": 1}, "below algorithm.f = 2"),
    ],
)
def test_bad_options_are_refused_in_one_line(name: str, options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        make_aggregator(name, **options)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "f", "fits", "short"),
    [
        ("krum", 1, 5, 4),  # K > 2f + 2
        ("multikrum", 2, 7, 6),
        ("median", 2, 5, 4),  # a majority
        ("geomed", 1, 3, 2),
        ("centered-clipping", 1, 3, 2),
        ("trimmed-mean", 2, 5, 4),
    ],
)
def test_the_cohort_must_leave_a_majority(name: str, f: int, fits: int, short: int) -> None:
    rule = _rule(name, f=f)
    assert rule.short(fits) is None
    assert rule.short(short) is not None
    bucketed = _rule(name, f=f, bucket=2)  # ceil(K / 2) buckets then
    assert bucketed.short(2 * fits - 1) is None and bucketed.short(2 * short) is not None


def test_a_config_whose_cohort_is_too_small_is_refused_at_set_up() -> None:
    base = ["algorithm.name=fedavg", "topology.kind=star", "algorithm.aggregator=krum"]
    config = load_config(
        None, [*base, "topology.nodes=8", "algorithm.f=1", "algorithm.fraction=0.5"]
    )
    with pytest.raises(ConfigError, match=r"more than 2f \+ 2 = 4 inputs.*a cohort of 4") as e:
        outline_run(config)
    assert "\n" not in str(e.value)
    outline_run(load_config(None, [*base, "topology.nodes=5", "algorithm.f=1"]))
    liars = ["adversary.peers=['n1']", "adversary.attack='signflip'"]  # the wrapped rule too
    with pytest.raises(ConfigError, match=r"more than 2f \+ 2 = 4 inputs"):
        outline_run(load_config(None, [*base, "topology.nodes=4", "algorithm.f=1", *liars]))


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (["algorithm.aggregator='geo-median'"], "did you mean `median` or `geomed`?"),
        (["algorithm.aggregator='krum'", "algorithm.f=2"], "more than 2f + 2 = 6 inputs"),
        (["algorithm.aggregator='median'", "algorithm.f=-1"], "algorithm.f must be a whole"),
    ],
    ids=["name", "cohort", "negative"],
)
def test_the_cli_refuses_in_one_line(
    settings: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = ["algorithm.name=fedavg", "topology.kind=star", "topology.nodes=6", *settings]
    argv = ["simulate", "-q", "--out", str(tmp_path)]
    one_line_error(capsys, [*argv, *(x for s in base for x in ("--set", s))], needle)


def test_too_few_arrivals_keep_the_global_model_and_are_counted() -> None:
    """Deadline mode: 4 of a cohort of 5 arrive, Krum with f = 1 needs 5: the server keeps
    its model (and its optimizer state) and counts the round; 5 arrive: it aggregates."""
    rule = FedAvgRule(aggregator="krum", f=1, server_optimizer="momentum", server_lr=0.5)
    x = torch.zeros(1, 3)
    rows = Rows(round=2, lr=0.1, self_weight=torch.zeros(1, dtype=torch.float64))

    def inbox(k: int) -> Gathered:
        models = torch.arange(3.0 * k).reshape(k, 3)
        samples = torch.ones(k, dtype=torch.float64)
        return Gathered({"x": models}, {"samples": samples}, torch.zeros(k, dtype=torch.long), 1)

    state, send = rule.mix(FedAvgState(x, None), 0, inbox(4), rows)
    assert torch.equal(state.x, x) and state.server_opt is None and rule.short_rounds == 1
    assert send is not None and torch.equal(send.tensors["x"], x)
    state, _ = rule.mix(FedAvgState(x, None), 0, inbox(5), rows)
    assert not torch.equal(state.x, x) and rule.short_rounds == 1


@pytest.mark.parametrize(
    "options",
    [
        ["algorithm.aggregator=krum", "algorithm.f=1"],
        ["algorithm.aggregator=trimmed-mean", "algorithm.f=1", "algorithm.bucket=2"],
        ["algorithm.aggregator=centered-clipping", "algorithm.tau=0.5", "algorithm.nnm=true"],
    ],
    ids=["krum", "trimmed-mean-bucket", "centered-clipping-nnm"],
)
def test_the_vectorized_and_message_engines_aggregate_the_same_bits(options: list[str]) -> None:
    """FedAvg with a robust aggregator under drops, a partition and crashes (a round whose
    arrivals are too few keeps the global model): both engines end with the same bits."""
    config = _config("fedavg", "fp32", True, "algorithm.fraction=1", "run.rounds=6", *options)
    assert_same_run(config)


def test_ranks_and_the_cohort_engine_aggregate_as_one_process(tmp_path: Path) -> None:
    """Geometric median over buckets, with drops, a partition and crashes, on 2 ranks: one
    process's bits and records; Multi-Krum over NNM on the cohort engine: the vectorized
    engine's global model."""
    options = ["algorithm.fraction=1", "algorithm.aggregator=geomed", "algorithm.f=1"]
    config = _case("fedavg", "fp32", True, tmp_path, *options, "algorithm.bucket=2")
    assert equal_on_ranks(config, tmp_path, "geomed", 2)["ranks"] == 2
    digests = {}
    for engine in ("vectorized", "cohort"):
        settings = [*POPULATION, "topology.nodes=10", "algorithm.fraction=0.5"]
        settings += ["algorithm.aggregator=multikrum", "algorithm.f=1", "algorithm.nnm=true"]
        settings += ["run.rounds=3", "model.hidden=16", f"simulate.engine={engine}"]
        summary = simulate(load_config(None, settings), out_dir=tmp_path / engine)
        digests[engine] = summary["params_sha256"]["server"]
    assert digests["cohort"] == digests["vectorized"]


def test_the_docs_config_runs(tmp_path: Path) -> None:
    """The TOML block of "Robust aggregation at the server" (docs/algorithms.md) runs."""
    block = docs_text.section("Robust aggregation at the server").split("```toml\n")[1]
    path = tmp_path / "robust.toml"
    path.write_text(block.split("```")[0], encoding="utf-8")
    config = load_config(path, ["run.rounds=2", "model.hidden=8"])
    assert config.algorithm.options == {"aggregator": "krum", "f": 1, "bucket": 2}
    summary = simulate(config, out_dir=tmp_path / "run")
    assert summary["rounds"] == 2


def test_two_sign_flipping_workers_of_eight_break_the_mean_not_median_or_krum(
    tmp_path: Path,
) -> None:
    """[adversary]: n2 and n5 upload -4 times their models. FedAvg's mean collapses; the
    median and Krum with f = 2 keep learning (digits, 15 rounds)."""
    base = ["algorithm.name=fedavg", "topology.kind=star", "topology.nodes=8"]
    base += ["run.rounds=15", "run.eval_every=15", "algorithm.lr=0.3", "data.partition=iid"]
    base += ["model.hidden=16", "adversary.peers=['n2','n5']", "adversary.attack='signflip'"]
    base += ["adversary.scale=4.0"]
    accuracy = {}
    for name in ("mean", "median", "krum"):
        robust = [] if name == "mean" else ["algorithm.f=2"]
        config = load_config(None, [*base, f"algorithm.aggregator={name}", *robust])
        summary = simulate(config, out_dir=tmp_path / name)
        accuracy[name] = summary["final"]["avg_model_accuracy"]
    assert accuracy["mean"] < 0.5 < 0.85 < min(accuracy["median"], accuracy["krum"]), accuracy
