"""Epsilon at a given delta, from Opacus's privacy accountants (the ``fedcore[dp]`` extra).

A private run composes Gaussian mechanisms, each subsampled: ``steps`` applications at
noise multiplier ``sigma`` (the noise's standard deviation over the sensitivity, the clip
norm) and sampling rate ``q``. :func:`epsilon` returns the epsilon of such a history at
``delta`` from one of Opacus's accountants:

* ``"prv"`` (the default): the privacy random variable accountant (Gopi, Lee and Wutschitz,
  "Numerical Composition of Differential Privacy", NeurIPS 2021), which composes the
  privacy loss distributions numerically: the tightest of the two, to within its own
  error bound (``eps_error`` 0.01).
* ``"rdp"``: Renyi differential privacy of the sampled Gaussian mechanism (Mironov,
  Talwar and Zhang 2019), converted to ``(epsilon, delta)``: an upper bound, looser than
  PRV by a few percent to tens of percent.

Both assume Poisson sampling (each example in a step with probability ``q``). Opacus is
imported on first use, so fedcore runs without it until a run asks for privacy;
:func:`require_accountant` refuses such a run in one line that names the extra.
"""

from __future__ import annotations

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


def _accountant(name: str) -> Any:
    if name not in ACCOUNTANTS:
        raise ConfigError(f"privacy accountant {name!r} is not one of {', '.join(ACCOUNTANTS)}.")
    require_accountant()
    from opacus.accountants import PRVAccountant, RDPAccountant

    return PRVAccountant() if name == "prv" else RDPAccountant()


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
    acc = _accountant(accountant)
    acc.history = [tuple(m) for m in steps]
    with warnings.catch_warnings():  # numerical remarks of the accountants' own
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta=delta))


def last_step_within(
    noise: float, rate: float, steps: int, delta: float, target: float, accountant: str = "prv"
) -> tuple[int, float]:
    """The most steps ``k <= steps`` of the mechanism ``(noise, rate)`` whose epsilon at
    ``delta`` is at most ``target``, and that epsilon (``(0, 0.0)`` if not even one step
    is). Epsilon grows with the steps, so a bisection; with PRV, RDP's bound (fast, and at
    least PRV's) first narrows the range, so PRV is asked only near the target (it is slow
    far above it)."""

    def eps(k: int, name: str) -> float:
        return epsilon([Mechanism(noise, rate, k)], delta, name)

    low, high = 0, steps  # eps(low) <= target; the answer is in [low, high]
    if eps(steps, accountant) <= target:
        return steps, eps(steps, accountant)
    if accountant == "prv":  # RDP >= PRV: RDP's last step within is a lower bound
        low = _bisect(lambda k: eps(k, "rdp") <= target, 0, steps)
    found = _bisect(lambda k: eps(k, accountant) <= target, low, high)
    return found, eps(found, accountant)


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
