"""Epsilon at a given delta, from Opacus's privacy accountants (the ``fedcore[dp]`` extra).

A private run composes Gaussian mechanisms, each subsampled: ``steps`` applications at
noise multiplier ``sigma`` (the noise's standard deviation over the sensitivity, the clip
norm) and sampling rate ``q``. :func:`epsilon` returns the epsilon of such a history at
``delta`` from one of Opacus's accountants:

* ``"prv"`` (the default): the privacy random variable accountant (Gopi, Lee and Wutschitz,
  "Numerical Composition of Differential Privacy", NeurIPS 2021), which composes the
  privacy loss distributions numerically: the tightest of the two, to within its own
  error bound, asked for as 0.01 or 0.1 % of RDP's epsilon, whichever is larger (its time
  grows with epsilon over the error: 18 s for an epsilon of 500 at 0.01, half a second
  at 0.5).
* ``"rdp"``: Renyi differential privacy of the sampled Gaussian mechanism (Mironov,
  Talwar and Zhang 2019), converted to ``(epsilon, delta)``: an upper bound, looser than
  PRV by a few percent to tens of percent.

Both assume Poisson sampling (each example in a step with probability ``q``). Opacus is
imported on first use, so fedcore runs without it until a run asks for privacy;
:func:`require_accountant` refuses such a run in one line that names the extra.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from fedcore.config.constants import PRIVACY_ACCOUNTANTS
from fedcore.errors import ConfigError

__all__ = [
    "ACCOUNTANTS",
    "DP_EXTRA",
    "Mechanism",
    "epsilon",
    "last_step_within",
    "noise_for",
    "require_accountant",
]

ACCOUNTANTS = PRIVACY_ACCOUNTANTS
"""The accountants :func:`epsilon` takes."""

DP_EXTRA = "pip install 'fedcore[dp]'"
"""How to install what :func:`epsilon` needs (Opacus)."""


class Mechanism(NamedTuple):
    """``steps`` applications of the Gaussian mechanism at noise multiplier ``noise``,
    each on a sample taken at rate ``rate`` (in (0, 1]; 1: every example)."""

    noise: float
    rate: float
    steps: int


def require_accountant() -> None:
    """Refuse, in one line, a private run where Opacus is not installed."""
    if importlib.util.find_spec("opacus") is None:
        raise ConfigError(
            "a [privacy] mechanism needs Opacus's privacy accountants, which are not "
            f"installed; install them with: {DP_EXTRA} (or pip install opacus), or "
            "remove the [privacy] table."
        )


def _prv_accountant(name: str) -> Any:
    """A fresh Opacus PRV accountant for ``"prv"``; None for ``"rdp"`` (computed from
    Opacus's RDP analysis: :func:`_rdp_epsilon`)."""
    if name not in ACCOUNTANTS:
        raise ConfigError(f"privacy accountant {name!r} is not one of {', '.join(ACCOUNTANTS)}.")
    require_accountant()
    from opacus.accountants import PRVAccountant

    return PRVAccountant() if name == "prv" else None


def epsilon(history: Sequence[Mechanism], delta: float, accountant: str = "prv") -> float:
    """The epsilon at ``delta`` of ``history`` composed, by ``accountant`` (see the
    module docstring): ``0.0`` for an empty history (or one of no steps, or of rate 0),
    ``inf`` where any step adds no noise (``noise = 0``: no privacy at all)."""
    if not 0 < delta < 1:
        raise ConfigError(f"privacy delta = {delta!r} is invalid: it must be in (0, 1).")
    steps = [Mechanism(float(m.noise), float(m.rate), int(m.steps)) for m in history]
    for m in steps:
        if m.steps < 0 or not 0 <= m.rate <= 1 or not m.noise >= 0:
            raise ConfigError(
                f"a privacy step of noise {m.noise!r}, rate {m.rate!r} and steps {m.steps!r} "
                "is invalid: noise must be >= 0, rate in [0, 1], steps >= 0."
            )
    steps = [m for m in steps if m.steps > 0 and m.rate > 0]
    if not steps:
        return 0.0
    if any(m.noise == 0 for m in steps):
        return math.inf
    prv = _prv_accountant(accountant)
    with warnings.catch_warnings():  # numerical remarks of the accountants' own
        warnings.simplefilter("ignore")
        bound = _rdp_epsilon(steps, delta)
        if prv is None:
            return bound
        prv.history = [tuple(m) for m in steps]
        return float(prv.get_epsilon(delta=delta, eps_error=max(0.01, 1e-3 * bound)))


def _rdp_epsilon(steps: Sequence[Mechanism], delta: float) -> float:
    """What Opacus's RDP accountant answers for ``steps``: each mechanism's RDP at every
    order of its ``DEFAULT_ALPHAS`` (one step's, :func:`_rdp_step`, times its steps:
    Opacus's own ``compute_rdp``), summed, then converted at ``delta``."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import get_privacy_spent

    rdp = sum(m.steps * _rdp_step(m.noise, m.rate) for m in steps)
    eps, _ = get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
    return float(eps)


@functools.lru_cache(maxsize=256)
def _rdp_step(noise: float, rate: float) -> Any:
    """One step's RDP at every order (a numpy array), computed once per mechanism: a run
    asks for the same one at many step counts (:func:`last_step_within`, each summary)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    return compute_rdp(q=rate, noise_multiplier=noise, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)


def last_step_within(
    noise: float, rate: float, steps: int, delta: float, target: float, accountant: str = "prv"
) -> tuple[int, float]:
    """The most steps ``k <= steps`` of the mechanism ``(noise, rate)`` whose epsilon at
    ``delta`` is at most ``target``, and that epsilon (``(0, 0.0)`` if not even one step
    is). Epsilon grows with the steps. RDP's answer by bisection (RDP costs little once
    its one step is known: :func:`_rdp_step`); PRV's, which is at least RDP's (RDP bounds
    it from above), from a guess: RDP's answer for the target scaled by PRV's gap to RDP
    at RDP's answer, then steps doubling away from the guess, then a bisection. So PRV, a
    second or so a call, is asked a few times, near the target."""

    def eps(k: int, name: str) -> float:
        return epsilon([Mechanism(noise, rate, k)], delta, name)

    low = _bisect(lambda k: eps(k, "rdp") <= target, 0, steps)
    if accountant != "prv" or low == steps:
        return low, eps(low, accountant)
    guess = 1
    if low > 0:
        gap = eps(low, "rdp") / max(eps(low, "prv"), 1e-12)  # >= 1
        guess = _bisect(lambda k: eps(k, "rdp") <= target * gap, low, steps)
    found = _bisect_from(lambda k: eps(k, "prv") <= target, low, steps, guess)
    return found, eps(found, accountant)


def noise_for(
    target: float, rate: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """The noise multiplier whose ``steps`` at ``rate`` spend ``target`` epsilon at
    ``delta``: the least sigma (to within 0.1 %, bisected geometrically) whose epsilon is
    at most ``target``; what a study of accuracy against epsilon sets ``privacy.noise`` to.

    Raises:
        ConfigError: a target no sigma up to 10,000 reaches.
    """
    if not target > 0:
        raise ConfigError(f"a target epsilon of {target!r} is invalid: it must be > 0.")

    def within(sigma: float) -> bool:
        return epsilon([Mechanism(sigma, rate, steps)], delta, accountant) <= target

    low, high = 0.05, 1.0
    while not within(high):
        low, high = high, 2 * high
        if high > 1e4:
            raise ConfigError(f"no noise multiplier up to 10,000 reaches epsilon {target:g}.")
    while high / low > 1.001:
        mid = (low * high) ** 0.5
        low, high = (low, mid) if within(mid) else (mid, high)
    return high


def _bisect_from(within: Any, low: int, high: int, guess: int) -> int:
    """The largest ``k`` in ``[low, high]`` with ``within(k)`` (given ``within(low)``),
    asking first at ``guess``, then at steps doubling away from it, then bisecting."""
    stride = 1
    if within(guess):
        low = guess
        while low < high:
            k = min(low + stride, high)
            if not within(k):
                high = k - 1
                break
            low, stride = k, 2 * stride
    else:
        high = guess - 1
        while high > low:
            k = max(high - stride, low)
            if within(k):
                low = k
                break
            high, stride = k - 1, 2 * stride
    return _bisect(within, low, high)


def _bisect(within: Any, low: int, high: int) -> int:
    """The largest ``k`` in ``[low, high]`` with ``within(k)``, given ``within(low)``
    (``low = 0`` always is) and that it fails above some ``k``."""
    while low < high:
        mid = (low + high + 1) // 2
        if within(mid):
            low = mid
        else:
            high = mid - 1
    return low
