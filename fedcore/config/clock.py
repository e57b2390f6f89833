"""The ceiling of a run's virtual clock: the shares of the latest moment it could reach
(:class:`ClockCost`), refused past :data:`~fedcore.config.MAX_VIRTUAL_S` before the run
(:func:`check_clock_horizon`), and the arithmetic and wording of those shares."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fedcore.config.constants import MAX_AVAILABILITY_CYCLES, MAX_VIRTUAL_S
from fedcore.config.rules import shown
from fedcore.errors import ConfigError

__all__ = ["ClockCost", "check_clock_horizon", "counted", "safe_product"]


@dataclass(frozen=True, slots=True)
class ClockCost:
    """One share of the latest moment a run's virtual clock could reach
    (:func:`check_clock_horizon`)."""

    key: str
    """The key (``time.step_s``, ``transport.deadline_s`` ...) the share comes from."""
    value: object
    """That key's value (a trace: its path)."""
    seconds: float
    """The share, over the whole run, in virtual seconds (inf if it overflows)."""
    how: str
    """How it comes about, e.g. ``"300 rounds x a latency of 2 s"``."""
    fix: str = "lower it"
    """What to do with the key's value (a bandwidth: raise it)."""


def check_clock_horizon(costs: Iterable[ClockCost], cycle_s: float = 0.0) -> None:
    """Refuse costs whose sum could take a run's virtual clock past :data:`MAX_VIRTUAL_S`
    (or overflow it), naming the key of the largest share; and, with ``cycle_s`` (a mean
    on period plus a mean off period, :attr:`~fedcore.config.TimeConfig.cycle_s`), a sum
    that would pass more than :data:`MAX_AVAILABILITY_CYCLES` of them.

    Raises:
        ConfigError: the sum is above :data:`MAX_VIRTUAL_S`, infinite or NaN, or spans too
            many on/off periods.
    """
    shares = list(costs)
    total = sum((c.seconds for c in shares), 0.0)  # fsum raises on overflow; this is inf
    if total <= MAX_VIRTUAL_S:
        if cycle_s > 0 and total / cycle_s > MAX_AVAILABILITY_CYCLES:
            raise ConfigError(
                f"time.on_s + time.off_s = {cycle_s:.3g} s is too short for a run whose "
                f"clock reaches about {total:.3g} s: each peer would pass "
                f"{total / cycle_s:,.0f} on/off periods, more than the "
                f"{MAX_AVAILABILITY_CYCLES:.0e} the clock steps through "
                f"(fedcore.config.MAX_AVAILABILITY_CYCLES); make the periods at least "
                f"{total / MAX_AVAILABILITY_CYCLES:.4g} s together, or run fewer rounds."
            )
        return
    worst = max(shares, key=lambda c: math.inf if math.isnan(c.seconds) else c.seconds)
    raise ConfigError(
        f"{worst.key} = {shown(worst.value)} is invalid: {worst.how} would take the run's "
        f"virtual clock to {total:.3g} s, past the {MAX_VIRTUAL_S:.0e} s it may reach "
        f"(fedcore.config.MAX_VIRTUAL_S); {worst.fix}, or run fewer rounds."
    )


def counted(n: int, what: str) -> str:
    """``"1 round"``, ``"300 rounds"``."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def safe_product(*factors: float) -> float:
    """The product of non-negative ``factors``: 0 if any is 0 (never ``0 x inf = nan``),
    inf where it overflows (a clock cost's seconds, here and in :mod:`fedcore.timing`)."""
    if any(f == 0 for f in factors):
        return 0.0
    return math.prod(float(f) for f in factors)
