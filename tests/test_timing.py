"""The virtual time model (:mod:`fedcore.timing`): its draws, links, availability and the
synchronous round clock, without any engine."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import (
    MAX_VIRTUAL_S,
    ClockCost,
    TimeConfig,
    check_clock_horizon,
    config_from_dict,
    fingerprint,
)
from fedcore.errors import ConfigError
from fedcore.timing import PhaseTraffic, RoundClock, TimeModel
from tests.clitools import TINY, assert_one_line_error, cli

NODES = [f"n{i}" for i in range(8)]


def model(**keys: object) -> TimeModel:
    return TimeModel(TimeConfig(**keys), run_seed=3, nodes=NODES)  # type: ignore[arg-type]


def steps(m: TimeModel, node: int, count: int) -> torch.Tensor:
    return m.step_seconds(torch.full((count,), node), torch.arange(count))


def test_draws_are_a_function_of_the_seeds_and_coordinates() -> None:
    a = steps(model(step_s=0.2, compute="lognormal"), 3, 50)
    b = steps(model(step_s=0.2, compute="lognormal"), 3, 50)
    assert torch.equal(a, b)
    other = steps(model(step_s=0.2, compute="lognormal", seed=1), 3, 50)
    assert not torch.equal(a, other)
    assert not torch.equal(a, steps(model(step_s=0.2, compute="lognormal"), 4, 50))


@pytest.mark.parametrize(
    ("keys", "spread"),
    [
        ({"compute": "fixed"}, 0.0),
        ({"compute": "lognormal", "sigma": 0.5}, 0.53),
        ({"compute": "pareto", "alpha": 3.0}, 0.58),
    ],
)
def test_every_distribution_has_mean_step_s(keys: dict[str, object], spread: float) -> None:
    x = steps(model(step_s=0.5, **keys), 0, 200_000)
    assert float(x.mean()) == pytest.approx(0.5, rel=0.02)
    assert float(x.std() / x.mean()) == pytest.approx(spread, abs=0.05)
    assert bool((x > 0).all())


def test_pareto_is_heavy_tailed() -> None:
    x = steps(model(step_s=1.0, compute="pareto", alpha=1.5), 0, 100_000)
    assert float(x.max()) > 50  # P(X > 50) = (1/3 / 50)^1.5: some of 100,000 draws
    assert float(x.min()) >= (1.5 - 1) / 1.5 - 1e-12


def test_slow_peers_and_speeds() -> None:
    many = [f"p{i}" for i in range(4000)]
    m = TimeModel(
        TimeConfig(step_s=1.0, slow_fraction=0.1, slow_factor=10.0), run_seed=0, nodes=many
    )
    assert int((m.speed == 10.0).sum()) == 400  # exactly the share
    few = TimeModel(TimeConfig(slow_fraction=0.1), run_seed=0, nodes=[f"m{i}" for i in range(16)])
    assert int((few.speed > 1).sum()) == 2  # round(1.6)
    assert set(m.speed.tolist()) == {1.0, 10.0}
    m = model(step_s=1.0, speeds={"n2": 4.0})
    assert m.speed.tolist() == [1.0, 1.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert steps(m, 2, 3).tolist() == [4.0, 4.0, 4.0]


def test_a_compute_trace_cycles_each_nodes_step_times(tmp_path: Path) -> None:
    trace = tmp_path / "steps.csv"
    rows = ["node,seconds"] + [f"n{i},{i + 1}" for i in range(8)] + ["n0,5"]
    trace.write_text("\n".join(rows) + "\n")
    m = model(compute_trace=str(trace))
    assert steps(m, 0, 4).tolist() == [1.0, 5.0, 1.0, 5.0]
    assert steps(m, 7, 2).tolist() == [8.0, 8.0]
    trace.write_text("n0,1\n")
    with pytest.raises(ConfigError, match="no rows of n1"):
        model(compute_trace=str(trace))
    trace.write_text("n0,-1\n")
    with pytest.raises(ConfigError, match="line 1"):
        model(compute_trace=str(trace))


def test_transfer_is_latency_plus_bytes_over_bandwidth() -> None:
    m = model(latency_s=0.1, bandwidth_mb_s=2.0, edge_latency_s={"n0->n1": 1.0})
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 0, 3])
    seconds = m.transfer_seconds(src, dst, torch.tensor([2**20, 2**21, 0]))
    assert seconds.tolist() == pytest.approx([1.5, 1.1, 0.1])
    unlimited = model(latency_s=0.25).transfer_seconds(src, dst, torch.tensor([10**9] * 3))
    assert unlimited.tolist() == [0.25] * 3


def test_an_availability_trace_delays_to_the_end_of_an_off_window(tmp_path: Path) -> None:
    trace = tmp_path / "off.csv"
    trace.write_text("n1,2,5\nn1,4,7\nn1,9,10\n")
    m = model(availability_trace=str(trace))
    at = torch.tensor([0.0, 1.0, 3.0, 7.0, 9.5, 3.0])
    nodes = torch.tensor([1, 1, 1, 1, 1, 0])
    assert m.available_from(nodes, at).tolist() == [0.0, 1.0, 7.0, 7.0, 10.0, 3.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 500), min_size=1, max_size=20), st.integers(0, 7))
def test_on_off_periods_answer_the_same_whatever_was_asked_before(
    times: list[float], node: int
) -> None:
    m = model(on_s=3.0, off_s=2.0)
    fresh = model(on_s=3.0, off_s=2.0)
    for t in times:
        at = torch.tensor([t], dtype=torch.float64)
        answer = float(m.available_from(torch.tensor([node]), at)[0])
        alone = float(fresh.available_from(torch.tensor([node]), at)[0])
        assert answer == alone >= t
        again_at = torch.tensor([answer], dtype=torch.float64)
        again = float(m.available_from(torch.tensor([node]), again_at)[0])
        assert again == answer  # the answer is an on moment
        fresh = model(on_s=3.0, off_s=2.0)


def _one_period_at_a_time(m: TimeModel, nodes: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """:meth:`TimeModel.available_from` as it stepped before, one off/on period a step."""
    from fedcore.timing import _OFF, _ON

    at = at.to(torch.float64)
    back = at < m._off_start[nodes]
    if bool(back.any()):
        again = nodes[back]
        m._cycle[again] = 0
        m._on_start[again] = 0.0
        m._off_start[again] = 0.0
        m._on_end[again] = m._period(_ON, again, m._cycle[again])
    while True:
        behind = at >= m._on_end[nodes]
        if not bool(behind.any()):
            break
        moving = torch.unique(nodes[behind])
        k = m._cycle[moving]
        m._off_start[moving] = m._on_end[moving]
        start = m._on_end[moving] + m._period(_OFF, moving, k)
        m._cycle[moving] = k + 1
        m._on_start[moving] = start
        m._on_end[moving] = start + m._period(_ON, moving, k + 1)
    return torch.maximum(at, m._on_start[nodes])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(0, 100, allow_subnormal=False), min_size=8, max_size=8),
        min_size=1,
        max_size=6,
    ),
    st.floats(0.5, 5.0),
    st.floats(0.5, 5.0),
)
def test_many_periods_a_step_land_on_the_bits_of_one_a_step(
    calls: list[list[float]], on_s: float, off_s: float
) -> None:
    """Periods drawn many at a time and summed by a cumulative sum give every moment bit
    for bit as stepping one period at a time did (long schedules in one call, calls that go
    back, peers far apart)."""
    new, old = model(on_s=on_s, off_s=off_s), model(on_s=on_s, off_s=off_s)
    every = torch.arange(8)
    for times in calls:
        at = torch.tensor(times, dtype=torch.float64)
        got = new.available_from(every, at)
        assert torch.equal(got, _one_period_at_a_time(old, every, at))
        for name in ("_cycle", "_on_start", "_off_start", "_on_end"):
            assert torch.equal(getattr(new, name), getattr(old, name)), name


def test_a_thousand_periods_in_one_call_land_on_the_bits_of_one_a_step() -> None:
    """Past the largest step (256 periods): the steps that follow it start where it ended."""
    new, old = model(on_s=1.0, off_s=1.0), model(on_s=1.0, off_s=1.0)
    at = torch.tensor([1500.0, 3.0, 700.0, 0.0], dtype=torch.float64)
    nodes = torch.tensor([0, 1, 2, 3])
    assert torch.equal(new.available_from(nodes, at), _one_period_at_a_time(old, nodes, at))
    assert int(new._cycle.max()) > 600 and torch.equal(new._on_end, old._on_end)


def test_peers_are_off_about_the_share_their_periods_say() -> None:
    m = model(on_s=3.0, off_s=1.0)
    off = 0
    every = torch.arange(8)
    for t in range(1000):  # each peer once a call, at moments that never go back
        at = torch.full((8,), t + 0.5, dtype=torch.float64)
        off += int((m.available_from(every, at) > at).sum())
    assert off / (8 * 1000) == pytest.approx(0.25, abs=0.05)


def _clock(deadline: float | None, **keys: object) -> RoundClock:
    return RoundClock(
        TimeModel(TimeConfig(**keys), run_seed=0, nodes=["a", "b", "c"]),  # type: ignore[arg-type]
        deadline_s=deadline,
    )


def _phase(sent: list[bool], expected: list[bool] | None = None) -> PhaseTraffic:
    # a -> b, c -> b, b -> a: 1 MiB each
    src, dst = torch.tensor([0, 2, 1]), torch.tensor([1, 1, 0])
    s = torch.tensor(sent)
    return PhaseTraffic(
        src, dst, torch.full((3,), 2**20), s, s if expected is None else torch.tensor(expected)
    )


def test_the_round_clock_by_hand() -> None:
    up = torch.ones(3, dtype=torch.bool)
    keys = {"step_s": 1.0, "speeds": {"c": 3.0}, "bandwidth_mb_s": 1.0}
    # Strict: b waits for c (ready at 3, +1 s on the link): b ends at 4; a waits for b's
    # message, sent when b was ready (1 s) and 1 s on the wire: a ends at 2.
    strict = _clock(None, **keys).advance(0, up, up, [_phase([True] * 3)])
    assert strict.end.tolist() == [2.0, 4.0, 3.0]
    assert strict.compute.tolist() == [1.0, 1.0, 3.0]
    assert not bool(strict.late[0].any())
    # Deadline 1.5 s: c's message (arrives at 4 > 1 + 1.5) is late; b waits it out.
    clock = _clock(1.5, **keys)
    times = clock.advance(0, up, up, [_phase([True] * 3)])
    assert times.late[0].tolist() == [False, True, False]
    assert times.end.tolist() == [2.0, 2.5, 3.0]
    # The next round starts from each peer's clock.
    times = clock.advance(1, up, up, [_phase([True] * 3)])
    assert times.start.tolist() == [2.0, 2.5, 3.0]
    # a: b's message sent at 3.5 arrives at 4.5, just in time (at the deadline is in time);
    # b: misses c's again and waits to 3.5 + 1.5.
    assert times.end.tolist() == [4.5, 5.0, 6.0]
    assert clock.busy.tolist() == [2.0, 2.0, 6.0]


def test_a_silently_lost_message_costs_its_receiver_the_whole_deadline() -> None:
    up = torch.ones(3, dtype=torch.bool)
    clock = _clock(2.0, step_s=1.0)
    lost = clock.advance(0, up, up, [_phase([True, False, True], [True, True, True])])
    assert lost.end.tolist() == [1.0, 3.0, 1.0]
    announced = _clock(2.0, step_s=1.0).advance(0, up, up, [_phase([True, False, True])])
    assert announced.end.tolist() == [1.0, 1.0, 1.0]


def test_a_crashed_peer_moves_on_with_the_latest() -> None:
    up = torch.tensor([True, True, False])
    times = _clock(None, step_s=1.0, speeds={"b": 2.0}).advance(
        0, up, up, [_phase([True, False, False])]
    )
    assert times.end.tolist() == [1.0, 2.0, 2.0]
    assert times.compute.tolist() == [1.0, 2.0, 0.0]


def test_time_keys_are_checked_at_load() -> None:
    for keys, needle in (
        ({"compute": "pareto", "alpha": 1.0}, "time.alpha"),
        ({"on_s": 2.0}, "time.off_s"),
        ({"speeds": {"n0": 0}}, "time.speeds.n0"),
        ({"edge_bandwidth_mb_s": {"n0->n1": 0}}, "must be a number > 0"),
        ({"slow_fraction": 2}, "time.slow_fraction"),
        ({"compute": "gamma"}, "time.compute"),
    ):
        with pytest.raises(ConfigError, match=needle):
            config_from_dict({"time": keys})
    with pytest.raises(ConfigError, match=r"run\.target_accuracy"):
        config_from_dict({"run": {"target_accuracy": 2.0}})


def test_time_is_in_the_fingerprint_only_when_set() -> None:
    edges = [("n0", "n1", 1.0)]
    plain = fingerprint(config_from_dict({}), edges)
    assert fingerprint(config_from_dict({"time": {"seed": 0}}), edges) == plain
    assert fingerprint(config_from_dict({"run": {"target_accuracy": 0.9}}), edges) == plain
    timed = fingerprint(config_from_dict({"time": {"step_s": 1.0}}), edges)
    assert timed != plain
    assert math.isfinite(TimeConfig(step_s=1.0).step_s)


# --- traces that cannot be read, and costs past the clock's ceiling ---------------------

TRACE_KEYS = ("compute_trace", "availability_trace")


def _one_line(exc: ConfigError, *needles: str) -> str:
    text = str(exc)
    assert "\n" not in text and "\r" not in text, text
    for needle in needles:
        assert needle in text, (needle, text)
    return text


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"n0,\xff\xfe1\n", "is not UTF-8 text (byte 0xff at offset 3)"),
        (b"\xef\xbb\xbfn0,\x801\n", "(byte 0x80 at offset 6)"),  # after a byte order mark
        (b"n0,abc\nn1,x\n", "line 2"),  # the first line is a header, the second is not
        (b"n0,OK\nn1,-1\n", "line 2"),
        (b"n0,OK\nn1,nan\n", "line 2"),
        (b"node,s\nn0,OK\n\nn1,inf\n", "line 4"),
        (b"n0,1e400\n", "line 1"),
        (b"n0,1e16\n", "line 1"),  # finite, but past MAX_VIRTUAL_S
        (b"n0,OK\nn1\n", "line 2"),  # a missing column
        (b"n0,OK,9\n", "line 1"),  # one too many
        (b"n0,OK\n ,OK\n", "line 2"),  # no node
        (b"n0,1" + b"0" * 200_000 + b"\n", "not CSV (field larger than field limit"),
        (b"node,seconds\n\n", "has no rows"),
    ],
)
@pytest.mark.parametrize("key", TRACE_KEYS)
def test_an_unreadable_trace_is_one_line_naming_the_file(
    tmp_path: Path, key: str, content: bytes, needle: str
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_bytes(content.replace(b"OK", b"1" if key == "compute_trace" else b"1,2"))
    with pytest.raises(ConfigError) as refused:
        model(**{key: str(trace)})
    _one_line(refused.value, f"time.{key} {str(trace)!r}", needle)


@pytest.mark.parametrize("key", TRACE_KEYS)
def test_a_trace_of_nodes_not_in_the_graph_is_refused(tmp_path: Path, key: str) -> None:
    trace = tmp_path / "trace.csv"
    values = "1" if key == "compute_trace" else "1,2"
    rows = [f"{v},{values}" for v in NODES] + [f"n99,{values}", f"'evil\\nnode',{values}"]
    trace.write_text("\n".join(rows) + "\n")
    with pytest.raises(ConfigError) as refused:
        model(**{key: str(trace)})
    _one_line(refused.value, "not in the graph", "'n99'")


def test_a_well_formed_trace_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    trace = tmp_path / "steps.csv"
    rows = ["node,seconds"] + [f"{v},{i}" for i, v in enumerate(NODES)]
    trace.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(rows).encode() + b"\r\n")
    assert steps(model(compute_trace=str(trace)), 3, 2).tolist() == [3.0, 3.0]


_CELLS = st.one_of(
    st.sampled_from(
        ["nan", "inf", "-inf", "-1", "-0", "0", "1", "2.5", "1e15", "1e16", "1e308", "1e400"]
    ),
    st.sampled_from(["", " ", "x", "1_0", "0x10", "1,5", '"1"', '"', "\x00"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
)
_ROWS = st.tuples(
    st.one_of(st.sampled_from(NODES), st.text(max_size=8)), st.lists(_CELLS, max_size=3)
).map(lambda row: ",".join([row[0], *row[1]]))
_FILES = st.one_of(
    st.binary(max_size=300),
    st.lists(_ROWS, max_size=12).map(lambda rows: "\n".join(rows).encode()),
    st.tuples(st.lists(_ROWS, max_size=12), st.binary(min_size=1, max_size=4)).map(
        lambda t: "\n".join(t[0]).encode() + t[1]
    ),
)


def _near_valid(columns: int) -> st.SearchStrategy[bytes]:
    """A row of every node's numbers (the file a run accepts) with rows of any kind
    mixed in."""
    cells = st.lists(st.floats(0, 2e15).map(repr), min_size=columns, max_size=columns)
    every = st.lists(cells, min_size=len(NODES), max_size=len(NODES)).map(
        lambda rows: [",".join([v, *c]) for v, c in zip(NODES, rows, strict=True)]
    )
    return st.tuples(every, st.lists(_ROWS, max_size=3), st.randoms()).map(
        lambda t: "\n".join(t[2].sample([*t[0], *t[1]], len(t[0]) + len(t[1]))).encode()
    )


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from(TRACE_KEYS))
def test_any_trace_is_read_within_the_ceiling_or_refused_in_one_line(
    data: st.DataObject, key: str
) -> None:
    """Random bytes, bad and negative numbers, NaN, inf, huge values, missing or extra
    columns, unknown peers: a trace is refused in one line naming the file, or every
    duration it gives is a number within MAX_VIRTUAL_S."""
    columns = 1 if key == "compute_trace" else 2
    content = data.draw(st.one_of(_FILES, _near_valid(columns)))
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.csv"
        trace.write_bytes(content)
        try:
            m = model(**{key: str(trace)})
        except ConfigError as exc:
            _one_line(exc, f"time.{key} {str(trace)!r}")
            return
    every = torch.arange(len(NODES))
    if key == "compute_trace":
        for k in range(3):
            seconds = m.step_seconds(every, torch.full((len(NODES),), k))
            assert bool(((seconds >= 0) & (seconds <= MAX_VIRTUAL_S)).all()), seconds
    else:
        at = m.available_from(every, torch.zeros(len(NODES), dtype=torch.float64))
        assert bool(((at >= 0) & (at <= MAX_VIRTUAL_S)).all()), at


@pytest.mark.parametrize(
    ("tables", "key"),
    [
        ({"time": {"step_s": 1e308}}, "time.step_s"),
        ({"time": {"step_s": 1e10}, "run": {"rounds": 10**6}}, "time.step_s"),
        ({"time": {"step_s": 1e6}, "run": {"rounds": 10**9, "local_steps": 10}}, "time.step_s"),
        ({"time": {"latency_s": 1e308}}, "time.latency_s"),
        ({"time": {"edge_latency_s": {"n0->n1": 1e16}}}, "time.edge_latency_s.'n0->n1'"),
        ({"time": {"bandwidth_mb_s": 1e-300}}, "time.bandwidth_mb_s"),
        (
            {"time": {"edge_bandwidth_mb_s": {"n0->n1": 5e-324}}},
            "time.edge_bandwidth_mb_s.'n0->n1'",
        ),
        ({"time": {"step_s": 1.0, "slow_fraction": 0.1, "slow_factor": 1e300}}, "time.slow_factor"),
        ({"time": {"step_s": 1.0, "speeds": {"n3": 1e20}}}, "time.speeds.n3"),
        ({"time": {"on_s": 1.0, "off_s": 1e308}}, "time.off_s"),
        ({"time": {"step_s": 1e14, "compute": "pareto", "alpha": 1.0000001}}, "time.step_s"),
    ],
)
def test_costs_past_the_clocks_ceiling_are_refused_at_load(
    tables: dict[str, dict[str, object]], key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        config_from_dict(tables)
    text = _one_line(refused.value, f"{key} = ", "MAX_VIRTUAL_S")
    assert text.startswith(key), text


def test_heavy_tails_and_long_runs_within_the_ceiling_are_accepted_and_finite() -> None:
    config_from_dict({"time": {"step_s": 3600.0, "compute": "pareto", "alpha": 1.1}})
    config_from_dict({"time": {"step_s": 1.0, "latency_s": 0.5}, "run": {"rounds": 10**8}})
    config_from_dict({"time": {"step_s": 1.0, "bandwidth_mb_s": 1e-6}})
    near = steps(model(step_s=1.0, compute="pareto", alpha=1.0 + 1e-9), 0, 20_000)
    wide = steps(model(step_s=1.0, compute="lognormal", sigma=10.0), 0, 20_000)
    for x in (near, wide):  # the draws' extremes are bounded: no clock overflows
        assert bool(torch.isfinite(x).all()) and float(x.max()) < 9.1e15


_SECONDS = st.one_of(
    st.just(0.0),
    st.floats(1e-12, 1e308),
    st.integers(-6, 20).map(lambda e: 10.0**e),  # as often within the ceiling as past it
)


@settings(max_examples=80, deadline=None)
@given(
    step=_SECONDS,
    latency=_SECONDS,
    bandwidth=st.one_of(
        st.just(0.0), st.floats(5e-324, 1e6), st.integers(-12, 3).map(lambda e: 10.0**e)
    ),
    factor=st.one_of(st.floats(1e-3, 1e308), st.integers(-3, 12).map(lambda e: 10.0**e)),
    off=_SECONDS,
    rounds=st.integers(1, 10**9),
    local=st.integers(1, 10**4),
)
def test_a_config_is_refused_or_its_clock_stays_finite(
    step: float,
    latency: float,
    bandwidth: float,
    factor: float,
    off: float,
    rounds: int,
    local: int,
) -> None:
    time: dict[str, object] = {"step_s": step, "latency_s": latency, "bandwidth_mb_s": bandwidth}
    time |= {"slow_fraction": 0.5, "slow_factor": factor, "compute": "lognormal"}
    if off:
        time |= {"on_s": 1.0, "off_s": off}
    try:
        config = config_from_dict({"time": time, "run": {"rounds": rounds, "local_steps": local}})
    except ConfigError as exc:
        # Refused by the clock's ceiling, or (with on/off periods) by the count of periods
        # a peer would walk through.
        text = _one_line(exc)
        assert "MAX_VIRTUAL_S" in text or (off and "MAX_AVAILABILITY_CYCLES" in text), text
        assert text.split(" = ")[0] in {
            "time.step_s",
            "time.latency_s",
            "time.bandwidth_mb_s",
            "time.slow_factor",
            "time.off_s",
            "time.on_s + time.off_s",
        }, text
        return
    costs = config.time.clock_costs(rounds=rounds, local_steps=local)
    assert sum(c.seconds for c in costs) <= MAX_VIRTUAL_S
    # Without the on/off periods, which a clock far past their scale walks one by one
    # (their part is bounded: an off period is at most 36.7 x off_s).
    always_on = dataclasses.replace(config.time, on_s=0.0, off_s=0.0)
    model = TimeModel(always_on, run_seed=0, nodes=["a", "b", "c"])
    clock = RoundClock(model, steps=min(local, 100))
    up = torch.ones(3, dtype=torch.bool)
    for t in range(3):
        times = clock.advance(t, up, up, [_phase([True] * 3)])
        assert bool(torch.isfinite(times.end).all()), times.end


def test_long_off_periods_within_the_ceiling_keep_the_clock_finite() -> None:
    config = config_from_dict({"time": {"step_s": 1e11, "on_s": 1e12, "off_s": 1e12}})
    clock = RoundClock(TimeModel(config.time, run_seed=0, nodes=["a", "b", "c"]))
    up = torch.ones(3, dtype=torch.bool)
    for t in range(5):
        times = clock.advance(t, up, up, [_phase([True] * 3)])
    assert bool(torch.isfinite(times.end).all()) and float(times.end.max()) > 5e11


def test_on_off_periods_far_shorter_than_the_run_are_refused_at_load() -> None:
    """The clock steps a peer through its on/off periods one at a time: a run that would
    pass more than MAX_AVAILABILITY_CYCLES of them (it would hold the run for hours) is
    refused in one line naming both keys; one just within runs."""
    within = {"step_s": 1.0, "on_s": 0.01, "off_s": 0.01}
    config_from_dict({"time": within, "run": {"rounds": 1000}})  # 1.1e5 periods: accepted
    for tables in (
        {"time": within, "run": {"rounds": 10**5}},
        {"time": {"step_s": 1e9, "on_s": 1.0, "off_s": 1.0}},
    ):
        with pytest.raises(ConfigError) as refused:
            config_from_dict(tables)
        text = _one_line(refused.value, "time.on_s + time.off_s = ", "MAX_AVAILABILITY_CYCLES")
        assert "make the periods at least" in text, text
    # The clock of the accepted periods answers. It walks the periods one at a time, a few
    # torch calls each (about 1 ms a period; 5e4 of them, at 1000 s, took 40 s to over 3
    # minutes on a loaded 2-core box): 5e3 periods show it as well.
    clock = TimeModel(config_from_dict({"time": within}).time, run_seed=0, nodes=["a", "b"])
    at = clock.available_from(torch.arange(2), torch.full((2,), 100.0, dtype=torch.float64))
    assert bool((at >= 100.0).all())  # 5e3 periods stepped through


def _costs(
    m: TimeModel, message_bytes: int, deadline_s: float | None = None, delay_s: float = 0.0
) -> list[ClockCost]:
    """A 300-round run of one local step and two phases."""
    return m.clock_costs(
        rounds=300,
        steps=1,
        phases=2,
        message_bytes=message_bytes,
        deadline_s=deadline_s,
        delay_s=delay_s,
    )


def test_the_set_up_adds_phases_message_sizes_deadlines_and_traces(tmp_path: Path) -> None:
    """What the config alone cannot know: the algorithm's phases, its messages' size, the
    deadline of a simulation in deadline mode and the traces' contents."""
    m = model(step_s=1.0, bandwidth_mb_s=1e-12)
    check_clock_horizon(_costs(m, 10))  # 300 x 2 x 10 bytes at 1e-12 MiB/s: 5.7e9 s
    for costs, key in (
        (_costs(m, 10**7), "time.bandwidth_mb_s"),  # 5.7e15 s in all
        (_costs(m, 10, deadline_s=1e13), "transport.deadline_s"),
        (_costs(m, 10, deadline_s=math.inf), "transport.deadline_s"),
        (_costs(m, 10, delay_s=1e13), "faults.delay_s"),
    ):
        with pytest.raises(ConfigError) as refused:
            check_clock_horizon(costs)
        assert _one_line(refused.value, "MAX_VIRTUAL_S").startswith(f"{key} = ")
    # A deadline shorter than the links changes nothing: a receiver waits for what comes.
    assert _costs(m, 10, deadline_s=0.5) == _costs(m, 10)
    trace = tmp_path / "steps.csv"
    trace.write_text("\n".join(f"{v},1e13" for v in NODES) + "\n")
    with pytest.raises(ConfigError) as refused:
        check_clock_horizon(_costs(model(compute_trace=str(trace)), 0))
    _one_line(refused.value, "time.compute_trace = ", "longest step (1e+13 s")
    with pytest.raises(ConfigError, match="speed factor 200 is past"):
        model(compute_trace=str(trace), speeds={"n5": 200.0})
    windows = tmp_path / "off.csv"
    windows.write_text("n1,0,9e14\nn2,5,6\n")
    with pytest.raises(ConfigError) as refused:
        check_clock_horizon(_costs(model(availability_trace=str(windows), step_s=1e12), 0))
    # 3e14 s of steps after 9e14 s off: the larger share is named
    _one_line(
        refused.value, "time.availability_trace = ", "its latest off window, ending at 9e+14 s"
    )
    check_clock_horizon(_costs(model(availability_trace=str(windows), step_s=1.0), 0))


def test_the_cli_refuses_an_unreadable_trace_or_an_overflowing_cost_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"n0,\xff\xfe1\n")
    run = ["simulate", "-q", "--out", str(tmp_path / "run"), *TINY]
    for extra, needle in (
        (["--set", f"time.compute_trace={bad}"], "time.compute_trace"),
        (["--set", f"time.availability_trace={bad}"], "time.availability_trace"),
        (["--set", "time.step_s=1e308"], "time.step_s = 1e+308 is invalid"),
        (
            ["--set", "transport.mode=deadline", "--set", "transport.deadline_s=inf"],
            "transport.deadline_s = inf",
        ),
    ):
        status, out, err = cli(capsys, *run, *extra)
        assert_one_line_error(status, out, err, needle)
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
