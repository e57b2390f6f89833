"""``[time]``: how long things take, in virtual seconds (:mod:`fedcore.timing` keeps the
clock)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from fedcore.config.clock import ClockCost, check_clock_horizon, counted, safe_product
from fedcore.config.constants import COMPUTE_TIMES, SEED_LIMIT
from fedcore.config.rules import (
    Table,
    choice,
    number,
    parse_edge,
    require,
    rule,
    shown,
    whole,
)
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id

__all__ = ["TimeConfig"]


def _speeds(key: str, speeds: object) -> None:
    """``{ node = factor }``: safe node ids, factors > 0."""
    if not isinstance(speeds, Mapping):
        raise ConfigError(f"{key} must be a table {{ node = factor }}, got {shown(speeds)}.")
    for node, factor in speeds.items():
        check_node_id(node, key, ConfigError)
        ok = isinstance(factor, int | float) and not isinstance(factor, bool)
        require(
            ok and math.isfinite(factor) and factor > 0,
            f"{key}.{node}",
            factor,
            "must be a number > 0 (the peer's compute time multiplier)",
        )


def _edge_table(*, positive: bool) -> Callable[[str, object], None]:
    """The rule of a per-edge table of seconds or rates: ``{"u->v" = number}``, each
    number ``> 0`` (``positive``) or ``>= 0``."""

    def check(key: str, table: object) -> None:
        if not isinstance(table, Mapping):
            raise ConfigError(f'{key} must be a table {{ "u->v" = number }}, got {shown(table)}.')
        for edge, value in table.items():
            parse_edge(key, edge)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value > 0 if positive else value >= 0)
            bound = "> 0" if positive else ">= 0"
            require(ok, f"{key}.{edge!r}", value, f"must be a number {bound}")

    return check


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeConfig(Table):
    """``[time]``: how long things take, in virtual seconds (:mod:`fedcore.timing`).

    Compute: one local step of a peer takes ``step_s`` times the peer's speed factor times a
    draw of ``compute`` (``"fixed"``: 1; ``"lognormal"``: mean 1, log-spread ``sigma``;
    ``"pareto"``: mean 1, tail index ``alpha`` > 1, heavy-tailed). Speed factors: a share
    ``slow_fraction`` of the peers (``round(slow_fraction * N)`` of them, chosen by the
    keyed hash) is ``slow_factor`` times slower, and ``speeds = { n3 = 4.0 }`` sets a peer's
    factor outright. ``compute_trace``: a CSV file of ``node,seconds`` rows, each node's
    successive step times (cycled), instead of the draws.

    Links: a message takes ``latency_s`` plus its encoded bytes over ``bandwidth_mb_s``
    (MiB/s; 0: unlimited), per edge ``edge_latency_s`` / ``edge_bandwidth_mb_s``
    (``{ "n0->n1" = 0.5 }``); ``faults.delay_s`` adds its delay.

    Availability: each peer alternates on and off periods of exponential length with means
    ``on_s`` and ``off_s`` (both > 0 to switch it on), or the off windows of
    ``availability_trace`` (a CSV of ``node,start_s,end_s`` rows). A peer starts a
    computation only while on.

    Every draw is a keyed hash of ``(run.seed, time.seed, node, step)``, so both engines
    and every process see the same times. Costs that could take a run's clock past
    :data:`~fedcore.config.MAX_VIRTUAL_S` (every draw at its mean: ``run.rounds`` x
    ``run.local_steps`` x ``step_s`` x the slowest factor, plus the latencies, transfers
    and off periods) are refused at load, naming the key (:meth:`clock_costs`). Unset (the
    default), time is not simulated (every duration 0), except that ``fedcore simulate`` in
    deadline mode keeps a virtual clock for its deadlines.
    """

    TABLE: ClassVar[str] = "time"

    seed: int = field(default=0, metadata=whole(0, SEED_LIMIT - 1))
    step_s: float = field(default=0.0, metadata=number(">= 0"))
    compute: str = field(default="fixed", metadata=choice(COMPUTE_TIMES))
    sigma: float = field(default=1.0, metadata=number("(0, 10]"))
    alpha: float = field(
        default=2.0,
        metadata=number("(1, 100]", why="must be in (1, 100] (a Pareto tail with a finite mean)"),
    )
    slow_fraction: float = field(
        default=0.0, metadata=number("[0, 1]", why="must be a share in [0, 1]")
    )
    slow_factor: float = field(default=10.0, metadata=number("> 0"))
    speeds: Mapping[str, float] = field(default_factory=dict, metadata=rule(_speeds))
    compute_trace: str = ""
    latency_s: float = field(default=0.0, metadata=number(">= 0"))
    bandwidth_mb_s: float = field(default=0.0, metadata=number(">= 0"))
    edge_latency_s: Mapping[str, float] = field(
        default_factory=dict, metadata=rule(_edge_table(positive=False))
    )
    edge_bandwidth_mb_s: Mapping[str, float] = field(
        default_factory=dict, metadata=rule(_edge_table(positive=True))
    )
    on_s: float = field(default=0.0, metadata=number(">= 0"))
    off_s: float = field(default=0.0, metadata=number(">= 0"))
    availability_trace: str = ""

    def check(self) -> None:
        """One source of availability, and costs the clock can reach."""
        require(
            (self.on_s > 0) == (self.off_s > 0),
            "time.off_s" if self.on_s > 0 else "time.on_s",
            self.off_s if self.on_s > 0 else self.on_s,
            "must be set with the other (time.on_s and time.off_s, both > 0: mean on and "
            "off periods)",
        )
        require(
            not (self.on_s > 0 and self.availability_trace),
            "time.availability_trace",
            self.availability_trace,
            "cannot be set with time.on_s and time.off_s (one source of availability)",
        )
        check_clock_horizon(self.clock_costs(rounds=1, local_steps=1))

    @property
    def active(self) -> bool:
        """Whether any duration is set (a run then keeps a virtual clock)."""
        return self != TimeConfig(seed=self.seed)

    @property
    def cycle_s(self) -> float:
        """A mean on period plus a mean off period (0: no on/off periods)."""
        return self.on_s + self.off_s if self.on_s > 0 and self.off_s > 0 else 0.0

    def slowest(self) -> tuple[str, float]:
        """The key and value of the largest speed factor a peer may have (1: no key makes
        any peer slower; ``slow_factor`` counts when ``slow_fraction`` > 0)."""
        factors = [("time.slow_factor", float(self.slow_factor))] if self.slow_fraction else []
        factors += [(f"time.speeds.{v}", float(f)) for v, f in self.speeds.items()]
        return max(factors, key=lambda kv: kv[1], default=("time.speeds", 1.0))

    def clock_costs(self, *, rounds: int, local_steps: int) -> list[ClockCost]:
        """What ``[time]`` alone (every draw at its mean, one phase, one-byte messages)
        adds to a run's clock over ``rounds`` rounds of ``local_steps`` steps: the least
        any run of these keys costs, refused at load above
        :data:`~fedcore.config.MAX_VIRTUAL_S` (:func:`~fedcore.config.check_clock_horizon`;
        the set-up adds the phases, message sizes, traces and deadlines:
        :meth:`fedcore.timing.TimeModel.clock_costs`)."""
        compute, links, off = self.clock_shares(rounds=rounds, local_steps=local_steps)
        return [*compute, *links, *off]

    def clock_shares(
        self,
        *,
        rounds: int,
        local_steps: int,
        phases: int = 1,
        message_bytes: int = 1,
        speed: float | None = None,
    ) -> tuple[list[ClockCost], list[ClockCost], list[ClockCost]]:
        """What ``[time]``'s keys add to a run's clock, every draw at its mean, over
        ``rounds`` rounds of ``local_steps`` steps and ``phases`` phases of messages of at
        most ``message_bytes`` bytes, as three lists: the compute (``step_s`` times
        ``speed``, the slowest speed factor of the run's peers; ``None``: the slowest any
        peer may have, :meth:`slowest`; nothing with a compute trace, whose values only the
        set-up reads), the links (per phase the longest latency, and the message over the
        slowest bandwidth) and the off periods. Apart, so that the set-up
        (:meth:`fedcore.timing.TimeModel.clock_costs`) adds to each what it alone knows:
        the compute trace, the fault plan's delay and the deadline."""
        compute = []
        if not self.compute_trace and self.step_s > 0:
            factor_key, slowest = self.slowest()
            factor = slowest if speed is None else speed
            key, value = ("time.step_s", self.step_s)
            if factor > max(self.step_s, 1.0):  # the factor is the unusual one
                key, value = factor_key, slowest
            compute.append(
                ClockCost(
                    key,
                    value,
                    safe_product(rounds, local_steps, self.step_s, factor),
                    f"{counted(rounds, 'round')} x {counted(local_steps, 'local step')} x "
                    f"time.step_s = {self.step_s:.3g} s x the slowest speed factor "
                    f"{factor:.3g}",
                )
            )
        each = counted(rounds, "round") + (f" x {counted(phases, 'phase')}" if phases != 1 else "")
        links = []
        latency = max(
            [("time.latency_s", float(self.latency_s))]
            + [(f"time.edge_latency_s.{e!r}", float(v)) for e, v in self.edge_latency_s.items()],
            key=lambda kv: kv[1],
        )
        if latency[1] > 0:
            links.append(
                ClockCost(
                    *latency,
                    safe_product(rounds, phases, latency[1]),
                    f"{each} x a latency of {latency[1]:.3g} s",
                )
            )
        rates = [("time.bandwidth_mb_s", float(self.bandwidth_mb_s))]
        rates += [
            (f"time.edge_bandwidth_mb_s.{e!r}", float(v))
            for e, v in self.edge_bandwidth_mb_s.items()
        ]
        rates = [kv for kv in rates if kv[1] > 0]  # 0: unlimited
        if rates and message_bytes > 0:
            key, rate = min(rates, key=lambda kv: kv[1])
            message = "one byte" if message_bytes == 1 else f"a message of {message_bytes} bytes"
            links.append(
                ClockCost(
                    key,
                    rate,
                    safe_product(rounds, phases, message_bytes / (rate * 2**20)),
                    f"{each} x {message} at {rate:.3g} MiB/s",
                    "raise it",
                )
            )
        off = []
        if self.off_s > 0:
            off.append(
                ClockCost(
                    "time.off_s",
                    self.off_s,
                    safe_product(rounds, self.off_s),
                    f"{counted(rounds, 'round')} x a mean off period of {self.off_s:.3g} s",
                )
            )
        return compute, links, off
