"""Step sizes a node takes round by round (``algorithm.lr_schedule`` and its warm-up), and
the options that say how a node runs its rounds (:class:`NodeOptions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedcore.config import LR_SCHEDULES, MODES
from fedcore.errors import ConfigError

__all__ = ["NodeOptions", "lr_at"]


def lr_at(
    lr: float,
    schedule: str,
    round: int,
    *,
    rounds: int = 0,
    warmup: int = 0,
    power: float = 1.0,
) -> float:
    """Step size of ``round`` (0-based) of a run of ``rounds``.

    The first ``warmup`` rounds rise linearly to ``lr`` (``lr (t + 1) / warmup``); then,
    over the ``rounds - warmup`` rounds after it (``s`` of ``S``): ``constant``, ``sqrt``
    (``lr / sqrt(s + 1)``), ``cosine`` (``lr (1 + cos(pi s / S)) / 2``) or ``poly``
    (``lr (1 - s / S) ** power``). ``cosine`` and ``poly`` need ``rounds``.
    """
    if round < warmup:
        return lr * (round + 1) / warmup
    s = round - warmup
    if schedule == "constant":
        return lr
    if schedule == "sqrt":
        return lr / math.sqrt(s + 1)
    if schedule in ("cosine", "poly"):
        span = rounds - warmup
        if span <= 0:
            raise ConfigError(
                f"algorithm.lr_schedule {schedule!r} needs the run's rounds beyond the warm-up."
            )
        left = max(0.0, 1.0 - s / span)
        if schedule == "cosine":
            return lr * (1.0 + math.cos(math.pi * (1.0 - left))) / 2.0
        return float(lr * left**power)
    raise ConfigError(f"unknown algorithm.lr_schedule {schedule!r}; use one of {LR_SCHEDULES}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeOptions:
    """How a node runs its rounds.

    Attributes:
        run_id: Fingerprint of the run, stamped on every message.
        lr: Base step size.
        lr_schedule: ``"constant"``, ``"sqrt"``, ``"cosine"`` or ``"poly"`` (see
            :func:`lr_at`), after ``warmup_rounds`` of linear warm-up.
        rounds: The run's rounds (what ``cosine`` and ``poly`` decay over).
        warmup_rounds: Rounds of linear warm-up.
        lr_power: ``poly``'s power.
        local_steps: Optimizer steps a round (``run.local_steps``), the last one the
            algorithm's own step; the record's loss is their mean.
        mode: ``"strict"`` or ``"deadline"``.
        deadline_s: Per-phase wait in deadline mode.
        strict_timeout_s: Upper bound of a strict-mode wait before failing.
        round_window: Rounds a sender may be ahead of this node beyond what strict
            lock-step allows (peers drift apart in deadline mode and under a fault plan; a
            restarted peer is behind its neighbours). See :meth:`Node.round_window`.
    """

    run_id: str
    lr: float
    lr_schedule: str = "constant"
    rounds: int = 0
    warmup_rounds: int = 0
    lr_power: float = 1.0
    local_steps: int = 1
    mode: str = "strict"
    deadline_s: float = 5.0
    strict_timeout_s: float = 300.0
    round_window: int = 0

    def __post_init__(self) -> None:
        """Reject unknown modes and schedules early."""
        if self.mode not in MODES:
            raise ConfigError(f"unknown transport.mode {self.mode!r}; use one of {MODES}.")
        self.lr_at(0)

    def lr_at(self, t: int) -> float:
        """The step size of round ``t`` (:func:`lr_at` with these options)."""
        return lr_at(
            self.lr,
            self.lr_schedule,
            t,
            rounds=self.rounds,
            warmup=self.warmup_rounds,
            power=self.lr_power,
        )
