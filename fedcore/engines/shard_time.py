"""Virtual time on a sharded run (``[time]``, ``transport.mode = "deadline"``): a part of
:class:`~fedcore.engines.sharded.ShardedNetwork` (:func:`plan_faults_and_time`,
:class:`ShardTime`).

The one-process vectorized engine advances the run's
:class:`~fedcore.engines.clock.SharedClock` once a round with the whole graph's traffic
(every message's ends and bytes, which were sent, which their receivers wait for, the
fault plan's delays) and every peer's compute time; in deadline mode the clock says which
messages arrive after their receiver's deadline, and those are missing, as lost ones are.
A peer's time depends on its in-neighbours' times, theirs on theirs: the clock is a
function of the whole graph. So every rank keeps the same clock and advances it over the
whole graph, as one process does (every rank knows every edge, the fault plan and who is
down), and reads of the late masks only its own rows' in-edges (more missing messages) and
out-edges (their senders' figures): the same times, the same late messages, on every
rank, by construction. Rank 0 puts the times in the round's figures (each peer's clock and
compute seconds, the summary's ``time`` block).

What it costs: every rank does the clock's work of the whole graph, ``O(edges)`` a round
(one process's too: the fault plan's masks of every edge, each message's transfer time, a
maximum per receiver), whatever ``R``; the rows' own work shrinks with ``R``, the clock's
does not (``benchmarks/sharded_time.py`` measures it).

Deadline mode counts every message at its receiver's rank as a fault plan does
(:class:`~fedcore.engines.shard_faults.ShardFaults`, also without a plan): a late message
was sent (its bytes count) and is missing at its receiver (the summary's
``messages_late``, the per-edge ``missing`` table). Unannounced faults
(``faults.announce = false``) change only what the clock waits for, so they run in
deadline mode as one process runs them. Every rank's checkpoint holds the clock
(:meth:`ShardTime.state_dict`: each peer's time, busy seconds and steps, ``O(peers)``),
the same on every rank, so re-sharding takes any old rank's; a checkpoint without it (an
older fedcore's) replays the clock from round 0 over its own traffic, as one process
resumes (:meth:`~fedcore.engines.clock.SharedClock.advance`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch

from fedcore.engines.batched import BatchedRule, Messages
from fedcore.engines.clock import (
    SharedClock,
    clock_state,
    load_clock_state,
    phase_traffic,
    virtual_clock,
)
from fedcore.engines.shard_faults import Lost, ShardFaults
from fedcore.engines.stacked_graph import StackedGraph
from fedcore.errors import ConfigError
from fedcore.faults import FaultPlan
from fedcore.setup.prepare import RunSetup
from fedcore.timing import RoundTimes

__all__ = ["ShardTime", "Tick", "masks_of", "plan_faults_and_time"]


class Tick(NamedTuple):
    """One round of the clock: its times (every peer's) and, per phase, the whole graph's
    messages the fault plan lost (``None``: no plan) and those past the deadline
    (``None``: strict mode, or none late)."""

    times: RoundTimes
    lost: list[Lost]
    late: list[Lost]


class ShardTime:
    """Every rank's copy of the run's virtual clock, advanced over the whole graph (see
    the module docstring).

    Args:
        clock: The run's clock (:func:`~fedcore.engines.clock.virtual_clock`).
        plan: The run's fault plan, if any.
        messages: Per graph of the period and phase (graph by graph), every message of the
            graph, as the one-process engine sizes them.
        active: Per entry of ``messages``, the messages the rule sends at all (``None``:
            every one).
        phases: The rule's phases a round.
    """

    def __init__(
        self,
        clock: SharedClock,
        plan: FaultPlan | None,
        messages: list[Messages],
        active: list[torch.Tensor | None],
        phases: int,
    ) -> None:
        """Keep what a round's traffic reads."""
        self.clock = clock
        self.plan = plan
        self.messages = messages
        self.active = active
        self.phases = phases
        self.period = len(messages) // phases

    def advance(self, t: int, up: torch.Tensor) -> Tick:
        """Advance the clock through round ``t`` (``up``: ``[N]`` bool, the peers that run
        it; every one computes), as the one-process engine advances it."""
        slot = t % self.period
        lost: list[Lost] = []
        traffic = []
        for phase in range(self.phases):
            at = slot * self.phases + phase
            m, sends = self.messages[at], self.active[at]
            gone = None
            if self.plan is not None:
                gone = self.plan.lost_mask(m.src, m.dst, t, phase)
                if sends is not None:
                    gone = gone & sends
            lost.append(gone)
            traffic.append(phase_traffic(self.plan, m, sends, gone, up, t, phase))
        times = self.clock.advance(t, up, up, traffic)
        self.clock.forget(t)  # no rank asks about a past round
        deadline = self.clock.deadline
        late = [mask if deadline and bool(mask.any()) else None for mask in times.late]
        return Tick(times, lost, late)

    def state_dict(self) -> dict[str, Any]:
        """The clock after the last round advanced (for a checkpoint: every rank's)."""
        return clock_state(self.clock.clock)

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        """Continue from a :meth:`state_dict` (``None``: a checkpoint without one, whose
        next round replays the clock from round 0).

        Raises:
            ValueError: it is of other peers.
        """
        if saved is not None:
            load_clock_state(self.clock.clock, saved)


def masks_of(tick: Tick | None, phase: int | None = None) -> tuple[Any, Any]:
    """``(lost, late)`` of ``phase`` of ``tick`` (``phase`` ``None``: the lists of every
    phase), as :class:`~fedcore.engines.shard_faults.ShardFaults` takes them; ``(None,
    None)`` without a clock."""
    if tick is None:
        return None, None
    if phase is None:
        return tick.lost, tick.late
    return tick.lost[phase], tick.late[phase]


class _Block(Protocol):
    """What :func:`plan_faults_and_time` reads of a rank's block
    (:class:`~fedcore.engines.sharded.ShardedNetwork`)."""

    setup: RunSetup
    form: BatchedRule
    d: int
    own: Any
    local_of: torch.Tensor

    def _size(self, n: int) -> int: ...

    def _inbox_edges(
        self, graphs: list[StackedGraph]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None] | None]: ...


def plan_faults_and_time(
    net: _Block, graphs: list[StackedGraph]
) -> tuple[ShardFaults | None, ShardTime | None]:
    """A rank's fault plan of its rows (with a plan, or in deadline mode, where late
    messages go missing) and its clock (with ``[time]`` or in deadline mode: the set-up's,
    made here if it has none), for the period's ``graphs``.

    Raises:
        ConfigError: the run's costs could take its clock past its ceiling
            (:func:`~fedcore.engines.clock.virtual_clock`); virtual time with a rule that
            chooses who talks or trains (not sharded yet).
    """
    setup = net.setup
    if setup.clock is None:  # a set-up made without its clock: the run's own
        setup.clock = virtual_clock(setup)
    clock = setup.clock
    assert clock is None or isinstance(clock, SharedClock)  # a simulation's (virtual_clock)
    deadline = clock is not None and clock.deadline
    if setup.faults is None and clock is None:
        return None, None
    rule = net.form.rule
    if clock is not None and (rule.trains is not None or rule.pattern == "chosen"):
        raise ConfigError(  # a user's rule (the server family: time_refusal)
            f"a sharded run cannot run this config: virtual time ([time], deadline mode) "
            f"with {rule.name!r}, which chooses who talks or trains, is not sharded yet."
        )
    phases = net.form.phases
    messages = [  # graph by graph, phase by phase
        net.form.messages(p, g, net._size, net.d) for g in graphs for p in range(phases)
    ]
    slots, active = net._inbox_edges(graphs)
    sends: list[torch.Tensor | None] = list(active) if active else [None] * len(messages)
    faults = None
    if setup.faults is not None or deadline:
        own = torch.from_numpy(net.own)
        faults = ShardFaults(setup.faults, messages, own, net.local_of, slots, active)
    time = None if clock is None else ShardTime(clock, setup.faults, messages, sends, phases)
    return faults, time
