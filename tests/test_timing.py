"""The virtual time model (:mod:`fedcore.timing`): its draws, links, availability and the
synchronous round clock, without any engine."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import TimeConfig, config_from_dict, fingerprint
from fedcore.errors import ConfigError
from fedcore.timing import PhaseTraffic, RoundClock, TimeModel

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
