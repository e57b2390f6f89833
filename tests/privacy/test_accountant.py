"""The accountant: epsilon from Opacus's PRV and RDP accountants, checked against each other
and against the Gaussian mechanism's values computed by hand."""

from __future__ import annotations

import importlib.util
import math

import pytest

from fedcore.errors import ConfigError
from fedcore.privacy import Mechanism, accountant, epsilon, last_step_within, noise_for

needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="needs the fedcore[dp] extra (opacus)"
)

ALPHAS = [1 + k / 10 for k in range(1, 100)] + list(range(12, 64))
"""Opacus's RDP orders, written out here: the hand computation below minimises over them."""


def _rdp_by_hand(sigma: float, steps: int, delta: float) -> float:
    """The Gaussian mechanism without sampling: RDP ``alpha / (2 sigma^2)`` a step, added
    over the steps, turned into (epsilon, delta) by Balle et al. 2020 (Theorem 21)."""
    return min(
        steps * a / (2 * sigma**2)
        - (math.log(delta) + math.log(a)) / (a - 1)
        + math.log((a - 1) / a)
        for a in ALPHAS
    )


def _gaussian_delta(eps: float, mu: float) -> float:
    """The exact delta at ``eps`` of a Gaussian mechanism of sensitivity over noise ``mu``
    (Balle and Wang 2018): ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``."""
    phi = lambda z: 0.5 * math.erfc(-z / math.sqrt(2))  # noqa: E731
    return phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2)


@needs_opacus
@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (2.0, 10), (4.0, 50)])
def test_unsampled_gaussian_against_hand_computation(sigma: float, steps: int) -> None:
    delta = 1e-5
    rdp = epsilon([Mechanism(sigma, 1.0, steps)], delta, "rdp")
    assert rdp == pytest.approx(_rdp_by_hand(sigma, steps, delta), rel=1e-9)
    prv = epsilon([Mechanism(sigma, 1.0, steps)], delta, "prv")
    # PRV composes the exact privacy loss: delta at its epsilon is the target's, to
    # within its epsilon error (0.01).
    mu = math.sqrt(steps) / sigma
    assert _gaussian_delta(prv + 0.011, mu) <= delta <= _gaussian_delta(prv - 0.011, mu)


@needs_opacus
@pytest.mark.parametrize("sigma,rate,steps", [(1.1, 0.004, 30_000), (1.0, 0.01, 1_000)])
def test_rdp_bounds_prv_within_a_factor(sigma: float, rate: float, steps: int) -> None:
    history = [Mechanism(sigma, rate, steps)]
    prv, rdp = epsilon(history, 1e-5, "prv"), epsilon(history, 1e-5, "rdp")
    assert 0 < prv <= rdp <= 1.25 * prv


@needs_opacus
def test_composition_and_extremes() -> None:
    one = Mechanism(1.0, 0.1, 100)
    assert epsilon([one, one], 1e-5, "rdp") == pytest.approx(
        epsilon([Mechanism(1.0, 0.1, 200)], 1e-5, "rdp")
    )
    assert epsilon([], 1e-5) == 0.0
    assert epsilon([Mechanism(1.0, 0.0, 10), Mechanism(1.0, 0.5, 0)], 1e-5) == 0.0
    assert epsilon([Mechanism(0.0, 0.1, 1)], 1e-5) == math.inf
    for bad in (0.0, 1.0):
        with pytest.raises(ConfigError, match="delta"):
            epsilon([one], bad)
    with pytest.raises(ConfigError, match="rate"):
        epsilon([Mechanism(1.0, 1.5, 1)], 1e-5)
    with pytest.raises(ConfigError, match="prv, rdp"):
        epsilon([one], 1e-5, "gdp")


@needs_opacus
def test_last_step_within_a_target() -> None:
    sigma, rate, delta = 1.0, 0.05, 1e-5
    k, eps = last_step_within(sigma, rate, 400, delta, 2.0, "rdp")
    assert 0 < k < 400 and eps <= 2.0
    assert eps == epsilon([Mechanism(sigma, rate, k)], delta, "rdp")
    assert epsilon([Mechanism(sigma, rate, k + 1)], delta, "rdp") > 2.0
    # PRV (tighter) allows at least as many steps; checked at one step past its answer.
    k_prv, eps = last_step_within(sigma, 1.0, 40, delta, 3.0, "prv")
    assert eps <= 3.0 < epsilon([Mechanism(sigma, 1.0, k_prv + 1)], delta, "prv")
    assert k_prv >= last_step_within(sigma, 1.0, 40, delta, 3.0, "rdp")[0]
    assert last_step_within(sigma, rate, 3, delta, 50.0, "rdp")[0] == 3
    assert last_step_within(0.1, 1.0, 3, delta, 0.5, "rdp") == (0, 0.0)


def test_a_run_without_opacus_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        accountant.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "opacus" else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install 'fedcore\[dp\]'") as caught:
        epsilon([Mechanism(1.0, 0.1, 1)], 1e-5)
    assert "\n" not in str(caught.value)


@needs_opacus
def test_noise_for_a_target() -> None:
    sigma = noise_for(2.0, 0.05, 300, 1e-5)
    assert epsilon([Mechanism(sigma, 0.05, 300)], 1e-5, "rdp") <= 2.0
    assert epsilon([Mechanism(sigma / 1.002, 0.05, 300)], 1e-5, "rdp") > 2.0
    with pytest.raises(ConfigError, match="must be > 0"):
        noise_for(0.0, 0.05, 300, 1e-5)


@needs_opacus
def test_epsilon_is_opacus_own_value() -> None:
    from opacus.accountants import PRVAccountant, RDPAccountant

    history = [Mechanism(1.1, 0.02, 500), Mechanism(2.0, 0.05, 100)]
    rdp = RDPAccountant()
    rdp.history = [tuple(m) for m in history]
    assert epsilon(history, 1e-5, "rdp") == rdp.get_epsilon(delta=1e-5)
    prv = PRVAccountant()  # below an RDP epsilon of 10, the error asked for is Opacus's 0.01
    prv.history = [tuple(m) for m in history]
    assert epsilon(history, 1e-5, "prv") == prv.get_epsilon(delta=1e-5)
