"""The robust gossip rules (clippedgossip, trimmed-gossip, median-gossip, bucketing) on
hand-built inboxes: identical honest values pass unchanged, the trimmed mean and the median
stay within the honest values whatever f attackers send, clipping bounds each neighbour's
pull and is D-PSGD bit for bit when nothing is clipped, missing messages are legal, the
bucket shuffle is the documented keyed hash, and many rows give what each row gives alone
(the engines' agreement on parameters is the contract of tests/engines/test_vectorized.py,
which runs every registered rule)."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedcore.algorithms import Rows, Slot, make_algorithm
from fedcore.algorithms.dpsgd import DPSGDRule
from fedcore.algorithms.robust_gossip import (
    ClippedGossip,
    MedianGossip,
    TrimmedGossip,
    sorting_network,
)
from fedcore.cli.app import main
from fedcore.config import load_config
from fedcore.counter_random import hash64, make_key, signed64
from fedcore.errors import ConfigError
from fedcore.simulation.simulate import simulate
from tests import docs_text
from tests.engines.test_vectorized import assert_same_run

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[2]


def _run(
    rule: DPSGDRule,
    own: torch.Tensor,
    values: list[torch.Tensor],
    arrived: list[torch.Tensor],
    weights: list[torch.Tensor] | None = None,
    grad: torch.Tensor | None = None,
    lr: float = 0.0,
    round: int = 0,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """The rule's model after one round: ``own [B, d]``, each slot's values ``[B, d]``,
    arrival masks and weights ``[B]`` (default: Metropolis-like ``1 / (K + 1)``)."""
    b, k = own.shape[0], len(values)
    if weights is None:
        weights = [torch.full((b,), 1.0 / (k + 1), dtype=F64) for _ in values]
    own_weight = 1.0 - torch.stack(weights, 1).sum(1) if weights else torch.ones(b, dtype=F64)
    rows = Rows(round=round, lr=lr, self_weight=own_weight, index=index)
    state = rule.init(own)
    state, _ = rule.step(state, torch.zeros_like(own) if grad is None else grad, rows)
    inbox = [Slot({"x": v}, {}, w, a) for v, w, a in zip(values, weights, arrived, strict=True)]
    new, send = rule.mix(state, 0, inbox, rows)
    assert send is None
    out: torch.Tensor = new.x
    return out


RULES: dict[str, Callable[[], DPSGDRule]] = {
    "clippedgossip": lambda: ClippedGossip(),
    "clippedgossip-tau": lambda: ClippedGossip(tau=0.5),
    "trimmed": lambda: TrimmedGossip(trim=1),
    "trimmed-bucket": lambda: TrimmedGossip(trim=1, bucket=2, seed=3),
    "median": lambda: MedianGossip(),
    "median-bucket": lambda: MedianGossip(bucket=3),
}

finite = st.floats(-(2.0**100), 2.0**100, allow_nan=False, width=32)


@settings(max_examples=30)
@given(
    name=st.sampled_from(sorted(RULES)),
    b=st.integers(1, 3),
    k=st.integers(0, 5),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_identical_honest_values_pass_unchanged(
    name: str, b: int, k: int, d: int, seed: int
) -> None:
    """Every neighbour that arrives sends the peer's own value (the others, which did not
    arrive, hold anything): the mix returns that value, then the gradient step."""
    g = torch.Generator().manual_seed(seed)
    own = torch.randn(b, d, generator=g) * 10
    arrived = [torch.rand(b, generator=g) < 0.7 for _ in range(k)]
    values = [
        torch.where(a.unsqueeze(1), own, 1e6 * torch.randn(b, d, generator=g)) for a in arrived
    ]
    grad = torch.randn(b, d, generator=g)
    out = _run(RULES[name](), own, values, arrived, grad=grad, lr=0.1)
    if name.startswith("clippedgossip"):  # D-PSGD's weighted sum of equal values: rounding
        torch.testing.assert_close(out, own - 0.1 * grad, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(out, own - 0.1 * grad)


@settings(max_examples=60)
@given(data=st.data(), median=st.booleans(), bucket=st.integers(1, 3))
def test_trimmed_mean_and_median_stay_within_the_honest_values(
    data: st.DataObject, median: bool, bucket: int
) -> None:
    """f attackers send anything finite; with the trimmed mean's ``trim = f`` (more than
    ``2 f`` values, or buckets) or the median (fewer than half of them lying), every
    coordinate stays within the [min, max] of the honest values (the own one included).
    Missing honest messages (garbage values, not arrived) are left out."""
    d = data.draw(st.integers(1, 3))
    f = data.draw(st.integers(0, 2))
    honest = data.draw(st.integers(1, 6))  # arrived honest neighbours, own value aside
    count = honest + 1 + f
    buckets = -(-count // bucket)
    assume(2 * f < buckets)
    vec = st.lists(finite, min_size=d, max_size=d)
    own = torch.tensor([data.draw(vec)])
    good = [torch.tensor([data.draw(vec)]) for _ in range(honest)]
    bad = [torch.tensor([data.draw(vec)]) for _ in range(f)]
    lost = [torch.full((1, d), 3e38)] * data.draw(st.integers(0, 2))
    values = good + bad + lost
    arrived = [torch.tensor([True])] * (honest + f) + [torch.tensor([False])] * len(lost)
    order = data.draw(st.permutations(range(len(values))))
    values, arrived = [values[i] for i in order], [arrived[i] for i in order]
    seed = data.draw(st.integers(0, 100))
    rule = MedianGossip(bucket=bucket, seed=seed) if median else TrimmedGossip(f, bucket, seed)
    out = _run(rule, own, values, arrived)
    stack = torch.cat([own, *good])
    assert bool((out >= stack.min(0).values).all() and (out <= stack.max(0).values).all())


def test_too_few_values_to_trim_keep_the_own_value() -> None:
    """Row 0 hears 2 of 3 (3 values > 2 trim), row 1 hears 1 (2 values <= 2 trim): row 1
    keeps its own model, then steps; no message at all is legal too."""
    own = torch.tensor([[0.0], [5.0]])
    values = [
        torch.tensor([[1.0], [7.0]]),
        torch.tensor([[9.0], [8.0]]),
        torch.tensor([[2.0], [6.0]]),
    ]
    arrived = [
        torch.tensor([True, True]),
        torch.tensor([True, False]),
        torch.tensor([False, False]),
    ]
    out = _run(TrimmedGossip(trim=1), own, values, arrived)
    assert out.tolist() == [[1.0], [5.0]]
    alone = _run(TrimmedGossip(trim=1), own, values, [torch.tensor([False, False])] * 3)
    assert torch.equal(alone, own)
    assert _run(MedianGossip(), own, values, arrived).tolist() == [[1.0], [6.0]]


@settings(max_examples=40)
@given(b=st.integers(1, 3), k=st.integers(0, 5), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_clipping_nothing_is_dpsgd_bit_for_bit(b: int, k: int, d: int, seed: int) -> None:
    """A radius no neighbour exceeds (a huge ``tau``, or the adaptive one clipping none),
    with lost messages: D-PSGD's mix and step, bit for bit."""
    g = torch.Generator().manual_seed(seed)
    own = torch.randn(b, d, generator=g)
    values = [own + torch.randn(b, d, generator=g) for _ in range(k)]
    arrived = [torch.rand(b, generator=g) < 0.7 for _ in range(k)]
    weights = [torch.rand(b, generator=g, dtype=F64) / (k + 1) for _ in range(k)]
    grad = torch.randn(b, d, generator=g)
    expected = _run(DPSGDRule(), own, values, arrived, weights, grad, lr=0.3)
    for rule in (ClippedGossip(tau=1e30), ClippedGossip(clipped=0)):
        assert torch.equal(_run(rule, own, values, arrived, weights, grad, lr=0.3), expected)


@settings(max_examples=40)
@given(
    k=st.integers(1, 5),
    d=st.integers(1, 4),
    tau=st.floats(1e-3, 10.0),
    seed=st.integers(0, 2**16),
    scale=st.floats(1e-3, 1e38),
    wide=st.booleans(),
)
def test_a_neighbour_pulls_at_most_its_weight_times_tau(
    k: int, d: int, tau: float, seed: int, scale: float, wide: bool
) -> None:
    """Whatever neighbour ``j`` sends (up to float32's largest values, whose squares
    overflow float32), it moves the peer by at most ``W_ji tau`` from where it would be had
    ``j`` sent the peer's own value."""
    kind = F64 if wide else torch.float32
    g = torch.Generator().manual_seed(seed)
    own = torch.randn(1, d, generator=g, dtype=F64)
    values = [own + torch.randn(1, d, generator=g, dtype=F64) for _ in range(k)]
    weights = [torch.rand(1, generator=g, dtype=F64) / (k + 1) for _ in range(k)]
    arrived = [torch.tensor([True])] * k
    rule = ClippedGossip(tau=tau)
    far = (own + scale * torch.randn(1, d, generator=g, dtype=F64).clamp(-2, 2)).to(kind)
    own, values = own.to(kind), [v.to(kind) for v in values]
    attacked = [*values[:-1], far]
    quiet = [*values[:-1], own.clone()]
    moved = _run(rule, own, attacked, arrived, weights) - _run(rule, own, quiet, arrived, weights)
    slack = 1e-9 if wide else 1e-5 * (1 + float(own.abs().max()) + k)
    assert float(moved.double().norm()) <= float(weights[-1]) * tau + slack


@settings(max_examples=30)
@given(k=st.integers(1, 6), clipped=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_the_adaptive_radius_is_a_fixed_one_at_the_ranked_distance(
    k: int, clipped: int, seed: int
) -> None:
    """``tau_i`` is the ``(clipped + 1)``-th largest distance of the arrived neighbours (the
    smallest when fewer arrived): the fixed radius of that value, computed here apart."""
    g = torch.Generator().manual_seed(seed)
    own = torch.randn(1, 3, generator=g, dtype=F64)
    values = [own + torch.randn(1, 3, generator=g, dtype=F64) * (j + 1) for j in range(k)]
    arrived = [torch.tensor([bool(torch.rand(1, generator=g) < 0.8)]) for _ in range(k)]
    heard = [float((v - own).norm()) for v, a in zip(values, arrived, strict=True) if bool(a)]
    if not heard:
        return
    ranked = sorted(heard, reverse=True)
    tau = ranked[min(clipped, len(ranked) - 1)]
    adaptive = _run(ClippedGossip(clipped=clipped), own, values, arrived)
    assert torch.equal(adaptive, _run(ClippedGossip(tau=tau), own, values, arrived))


def test_distances_whose_squares_overflow_float32_still_rank() -> None:
    """A float32 model, own value 0, neighbours at distances 1e20 and 1e21 (squares beyond
    float32) and 1: the adaptive radius is 1e20 (the second largest), so only the 1e21 one
    is clipped, to 1e20."""
    own = torch.zeros(1, 2)
    values = [torch.tensor([[1e20, 0.0]]), torch.tensor([[0.0, -1e21]]), torch.tensor([[1.0, 0.0]])]
    arrived = [torch.tensor([True])] * 3
    out = _run(ClippedGossip(clipped=1), own, values, arrived)
    quarter = 0.25  # each neighbour's weight (1 / (K + 1))
    expected = torch.tensor([[quarter * (1e20 + 1.0), -quarter * 1e20]])
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0.0)


def test_the_bucket_shuffle_is_the_documented_keyed_hash() -> None:
    """The values (own at slot 0, then the slots that arrived) ordered by ``hash64(key(seed),
    round, index, slot)`` and averaged in pairs; the median of those means (computed here
    apart, with numpy)."""
    own = torch.tensor([[0.0, 100.0]])
    values = [torch.tensor([[float(10**j), -float(j)]]) for j in range(1, 6)]
    arrived = [torch.tensor([j != 3]) for j in range(1, 6)]
    seed, rnd, index = 7, 4, 2
    out = _run(
        MedianGossip(bucket=2, seed=seed),
        own,
        values,
        arrived,
        round=rnd,
        index=torch.tensor([index]),
    )
    key = make_key("fedcore.bucketing", seed)
    items = [(0, own[0])] + [
        (j, v[0]) for j, (v, a) in enumerate(zip(values, arrived, strict=True), 1) if bool(a)
    ]
    items.sort(key=lambda item: signed64(hash64(key, rnd, index, item[0])))
    means = [
        np.mean([v.numpy() for _, v in items[i : i + 2]], axis=0) for i in range(0, len(items), 2)
    ]
    assert out[0].tolist() == pytest.approx(np.median(np.stack(means), axis=0).tolist())
    other = _run(
        MedianGossip(bucket=2, seed=seed + 1),
        own,
        values,
        arrived,
        round=rnd,
        index=torch.tensor([index]),
    )
    assert not torch.equal(out, other)  # another key, other buckets (for these values)


@settings(max_examples=25)
@given(name=st.sampled_from(sorted(RULES)), data=st.data())
def test_many_rows_give_what_each_row_gives_alone(name: str, data: st.DataObject) -> None:
    """B rows with different in-degrees, padded with never-arriving slots (as the vectorized
    engine pads them), give each row's result on its own slots alone (as a peer has them),
    bit for bit: what makes the engines agree."""
    b = data.draw(st.integers(2, 4))
    degrees = [data.draw(st.integers(0, 4)) for _ in range(b)]
    k, d = max(degrees), data.draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    own = torch.randn(b, d, generator=g)
    values = [torch.randn(b, d, generator=g) * 3 for _ in range(k)]
    arrived = [
        torch.tensor([j < degrees[r] and bool(torch.rand(1, generator=g) < 0.8) for r in range(b)])
        for j in range(k)
    ]
    weights = [
        torch.tensor([0.2 if j < degrees[r] else 0.0 for r in range(b)], dtype=F64)
        for j in range(k)
    ]
    grad = torch.randn(b, d, generator=g)
    index = torch.arange(b) + 5
    many = _run(RULES[name](), own, values, arrived, weights, grad, 0.1, round=3, index=index)
    for r in range(b):
        one = _run(
            RULES[name](),
            own[r : r + 1],
            [v[r : r + 1] for v in values[: degrees[r]]],
            [a[r : r + 1] for a in arrived[: degrees[r]]],
            [w[r : r + 1] for w in weights[: degrees[r]]],
            grad[r : r + 1],
            0.1,
            round=3,
            index=index[r : r + 1],
        )
        assert torch.equal(many[r : r + 1], one), (name, r)


def test_the_sorting_network_sorts_every_input_of_zeros_and_ones() -> None:
    """The 0-1 principle (Knuth, TAOCP 5.3.4): a comparator network sorts every input if
    it sorts every one of 0s and 1s; all 2**n of them for n up to 12."""
    for n in range(1, 13):
        bits = torch.arange(2**n).unsqueeze(1).bitwise_right_shift(torch.arange(n)) & 1
        lanes = list(bits.T)
        for i, j in sorting_network(n):
            lanes[i], lanes[j] = (
                torch.minimum(lanes[i], lanes[j]),
                torch.maximum(lanes[i], lanes[j]),
            )
        out = torch.stack(lanes)
        assert bool((out[1:] >= out[:-1]).all()), n


@pytest.mark.parametrize(
    ("name", "options", "says"),
    [
        ("trimmed-gossip", {"trim": -1}, "trim = -1"),
        ("trimmed-gossip", {"trim": True}, "trim = True"),
        ("trimmed-gossip", {"trim": 1.5}, "trim = 1.5"),
        ("trimmed-gossip", {"bucket": 0}, "bucket = 0"),
        ("median-gossip", {"bucket": -3}, "bucket = -3"),
        ("median-gossip", {"seed": "x"}, "seed = 'x'"),
        ("median-gossip", {"trim": 1}, "no option"),
        ("clippedgossip", {"tau": 0}, "tau = 0"),
        ("clippedgossip", {"tau": -1.0}, "tau = -1.0"),
        ("clippedgossip", {"tau": math.nan}, "tau = nan"),
        ("clippedgossip", {"tau": math.inf}, "tau = inf"),
        ("clippedgossip", {"tau": "1"}, "tau = '1'"),
        ("clippedgossip", {"clipped": -1}, "clipped = -1"),
        ("clippedgossip", {"tau": 1.0, "clipped": 2}, "give one of them"),
    ],
)
def test_bad_options_are_refused_in_one_line(
    name: str, options: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        make_algorithm(name, **options)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_options_at_their_extremes_are_taken() -> None:
    assert make_algorithm("trimmed-gossip", trim=0, bucket=1).trim == 0
    assert make_algorithm("clippedgossip", tau=1e-300).tau == 1e-300
    assert make_algorithm("clippedgossip", clipped=0).clipped == 0
    assert make_algorithm("median-gossip", bucket=10**6, seed=-(2**70)).bucket == 10**6
    own = torch.tensor([[1.0, 2.0]])
    values = [torch.tensor([[3.0, 4.0]]), torch.tensor([[5.0, 9.0]])]
    mean = _run(TrimmedGossip(trim=0), own, values, [torch.tensor([True])] * 2)
    assert mean.tolist() == [[3.0, 5.0]]  # trim 0: the plain mean
    far = _run(ClippedGossip(tau=1e-300), own, values, [torch.tensor([True])] * 2)
    assert torch.equal(far, own)  # everything clipped to nothing


def test_trimmed_mean_with_buckets_runs_alike_on_both_engines(tmp_path: Path) -> None:
    """The engine contract runs trimmed-gossip plain and median-gossip bucketed; this is
    the trimmed mean of buckets, with drops and a crash."""
    config = load_config(
        None,
        [
            "run.rounds=6",
            "run.eval_every=6",
            "topology.nodes=7",
            "topology.kind=complete",
            "algorithm.name=trimmed-gossip",
            "algorithm.trim=1",
            "algorithm.bucket=2",
            "algorithm.seed=11",
            "faults.drop=0.2",
            "faults.crashes=[{node='n3',at=2,back=4}]",
        ],
    )
    assert_same_run(config)


def test_the_docs_command_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (line,) = [
        s.strip()
        for s in docs_text.page("algorithms.md").splitlines()
        if s.startswith("fedcore simulate examples/dpsgd.toml --set algorithm.name=trimmed")
    ]
    argv = shlex.split(line)[1:]
    argv[1] = str(ROOT / argv[1])
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--quiet"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "summary.json").is_file()


@pytest.mark.parametrize(
    "settings",
    [
        ["algorithm.name=clippedgossip", "adversary.attack=alie", "faults.drop=0.2"],
        ["algorithm.name=trimmed-gossip", "algorithm.bucket=2", "adversary.attack=dissensus"],
        ["algorithm.name=median-gossip", "adversary.attack=ipm", "adversary.epsilon=2"],
    ],
    ids=["clippedgossip-alie", "trimmed-buckets-dissensus", "median-ipm"],
)
def test_each_defence_under_attack_runs_alike_on_both_engines(
    settings: list[str], tmp_path: Path
) -> None:
    """Two lying peers of seven ([adversary]): the honest peers' defended models are the
    same bits on the vectorized and message engines."""
    common = [
        "topology.kind=erdos-renyi",
        "topology.p=0.6",
        "topology.undirected=true",
        "topology.nodes=7",
        "run.rounds=4",
        "run.eval_every=4",
        'adversary.peers=["n1", "n4"]',
        *settings,
    ]
    runs = [
        simulate(
            load_config(None, [*common, f"simulate.engine={engine}"]),
            out_dir=tmp_path / engine,
            show_progress=False,
        )
        for engine in ("vectorized", "messages")
    ]
    assert [run["engine"] for run in runs] == ["vectorized", "messages"]
    assert runs[0]["params_sha256"] == runs[1]["params_sha256"]
    assert runs[0]["final"] == runs[1]["final"]
