"""Clipped push-sum: honest identical inputs pass unchanged, mass is conserved when nothing
is clipped, and a lie's reach is bounded (property tests on hand-built inboxes)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import make_algorithm
from fedcore.algorithms.clipped_push_sum import ClippedPushSumRule
from fedcore.algorithms.rule import Rows, Slot
from fedcore.errors import ConfigError

VALUE = st.floats(-100, 100, allow_nan=False, width=32)


def _rows(b: int) -> Rows:
    return Rows(round=0, lr=0.0, self_weight=torch.full((b,), 0.5, dtype=torch.float64), n=8)


def _slot(x: list[list[float]], omega: list[float], weight: float, arrived: list[bool]) -> Slot:
    return Slot(
        {"x": torch.tensor(x)},
        {"omega": torch.tensor(omega, dtype=torch.float64)},
        torch.full((len(omega),), weight, dtype=torch.float64),
        torch.tensor(arrived),
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(VALUE, min_size=3, max_size=3), st.floats(0.25, 2.0), st.integers(1, 4))
def test_identical_honest_shares_pass_unchanged(z: list[float], omega: float, k: int) -> None:
    """Every in-neighbour's de-biased model equals the receiver's: the mix is plain
    push-sum's, bit for bit, whatever the radius rule."""
    rows = _rows(1)
    x = torch.tensor([z]) * omega
    state = (
        make_algorithm("ops")
        .init(torch.tensor([z]))
        ._replace(x=x, omega=torch.tensor([omega], dtype=torch.float64))
    )
    w = 0.5 / k
    inbox = [_slot((x * w).tolist(), [omega * w], w, [True]) for _ in range(k)]
    plain, _ = make_algorithm("ops").mix(state, 0, inbox, rows)
    for tau in (0.0, 1e-2):  # the median, or a radius above the shares' rounding
        clipped, _ = ClippedPushSumRule(tau=tau).mix(state, 0, inbox, rows)
        assert torch.equal(clipped.x, plain.x) and torch.equal(clipped.omega, plain.omega)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(VALUE, min_size=2, max_size=2), min_size=1, max_size=4))
def test_mass_is_conserved_when_nothing_is_clipped(values: list[list[float]]) -> None:
    """A radius and a weight range wide enough for every share: the same sums as plain
    push-sum (the shares are used exactly as they came)."""
    rows = _rows(1)
    state = make_algorithm("ops").init(torch.tensor([[0.5, -0.5]]))
    w = 0.5 / len(values)
    inbox = [_slot([[v * w for v in value]], [w], w, [True]) for value in values]
    plain, _ = make_algorithm("ops").mix(state, 0, inbox, rows)
    wide, _ = ClippedPushSumRule(tau=1e9, kappa=1e6).mix(state, 0, inbox, rows)
    assert torch.equal(wide.x, plain.x) and torch.equal(wide.omega, plain.omega)


@settings(max_examples=40, deadline=None)
@given(st.floats(1e-3, 1e6), st.lists(VALUE, min_size=2, max_size=2))
def test_a_lie_moves_the_receiver_at_most_its_radius(inflate: float, far: list[float]) -> None:
    """One honest share at the receiver's own model and one lying share (any value, any
    weight): the receiver's de-biased model moves at most ``tau`` times the lying share's
    clamped weight over its new weight, and no share weighs more than ``kappa W_ji``."""
    rows = _rows(1)
    rule = ClippedPushSumRule(tau=0.5, kappa=4.0)
    state = rule.init(torch.tensor([[1.0, 2.0]]))
    w = 0.25
    honest = _slot([[0.25, 0.5]], [w], w, [True])
    lie = _slot([[f * w * inflate for f in far]], [w * inflate], w, [True])
    new, _ = rule.mix(state, 0, [honest, lie], rows)
    kept = min(max(w * inflate, w / 4), w * 4)
    assert float(new.omega[0]) == pytest.approx(0.5 + w + kept)
    moved = torch.linalg.vector_norm(rule.model(new)[0].double() - torch.tensor([1.0, 2.0]))
    assert float(moved) <= 0.5 * kept / float(new.omega[0]) + 1e-5


def test_the_median_radius_clips_the_farther_half() -> None:
    """tau = 0: the radius is the lower median distance (2 of 1, 2, 100): the far share
    is pulled to it."""
    rows = _rows(1)
    rule = ClippedPushSumRule()
    state = rule.init(torch.tensor([[0.0]]))
    w = 0.5 / 3
    near = [_slot([[d * w]], [w], w, [True]) for d in (1.0, 2.0)]
    far = _slot([[100.0 * w]], [w], w, [True])
    new, _ = rule.mix(state, 0, [*near, far], rows)
    assert float(rule.model(new)[0, 0]) == pytest.approx((1.0 + 2.0 + 2.0) * w)  # radius 2


@pytest.mark.parametrize("options", [{"tau": -1.0}, {"kappa": 0.5}, {"tau": float("inf")}])
def test_bad_options_are_refused_in_one_line(options: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="clipped-push-sum"):
        make_algorithm("clipped-push-sum", **options)
