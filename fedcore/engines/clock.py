"""A simulated run's virtual clock, shared by both engines (:class:`SharedClock`).

``fedcore simulate`` keeps one :class:`~fedcore.timing.RoundClock` for the whole network
when the config has ``[time]`` or runs in deadline mode (:func:`virtual_clock`). The
vectorized engine advances it with the traffic it computes anyway (:func:`phase_traffic`
of its messages and masks); the message engine's nodes ask it, one row at a time, which of
their in-neighbours' messages are late (:meth:`SharedClock.late`) and what their clock
says (:meth:`SharedClock.node_times`), and it advances itself with the same traffic,
derived from the algorithm's batched form exactly as the vectorized engine derives it. So
both engines see the same times and the same late messages, by construction.

In deadline mode the clock replaces wall-clock waits in a simulation: a message later than
``transport.deadline_s`` (virtual seconds) is late, deterministically, so deadline mode runs
on the vectorized engine too. Real peers (``fedcore node``) keep wall-clock deadlines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedcore.config import check_clock_horizon
from fedcore.engines.batched import Messages, batched_form, has_batched_form
from fedcore.engines.stacked_graph import stack_graph
from fedcore.errors import ConfigError
from fedcore.faults import FaultPlan
from fedcore.setup.prepare import RunSetup
from fedcore.setup.virtual import row_codec
from fedcore.timing import PhaseTraffic, RoundClock, RoundTimes, TimeModel

__all__ = ["SharedClock", "clock_state", "load_clock_state", "phase_traffic", "virtual_clock"]

_KEPT = 4
"""Rounds of times the clock keeps at least; it keeps every round some node may still
ask about."""


def phase_traffic(
    plan: FaultPlan | None,
    m: Messages,
    active: torch.Tensor | None,
    lost: torch.Tensor | None,
    up: torch.Tensor,
    t: int,
    phase: int,
) -> PhaseTraffic:
    """One phase's :class:`~fedcore.timing.PhaseTraffic` from what an engine knows of it:
    the messages, the algorithm's ``active`` mask (``None``: all), the fault plan's
    ``lost`` mask (``None``: no plan) and the nodes that are ``up``."""
    every = torch.ones_like(m.src, dtype=torch.bool) if active is None else active
    if lost is None:
        return PhaseTraffic(m.src, m.dst, m.nbytes, every, every)
    assert plan is not None
    sent = every & ~lost
    # Announced: a receiver waits for no lost message. Silent: it waits for every message
    # of an up sender it would have heard (it cannot tell a crashed one either).
    expected = sent if plan.announce else every & up[m.dst]
    delay = None
    if plan.faults.delay_s > 0:
        delay = plan.faults.delay_s * plan.uniform_edges("delay", m.src, m.dst, t, phase)
    return PhaseTraffic(m.src, m.dst, m.nbytes, sent, expected, delay)


def clock_state(clock: RoundClock) -> dict[str, Any]:
    """What ``clock``'s next round reads that rounds change, copied (for a checkpoint):
    every peer's time, busy seconds and steps taken, and the round. The time model's on/off
    periods reached are not kept: they are a cache (its answers are a function of the
    moments asked, :meth:`~fedcore.timing.TimeModel.available_from`)."""
    return {
        "round": clock.round,
        "clock": clock.clock.clone(),
        "busy": clock.busy.clone(),
        "taken": clock.taken.clone(),
    }


def load_clock_state(clock: RoundClock, saved: Mapping[str, Any]) -> None:
    """Continue ``clock`` from a :func:`clock_state` of a clock of the same run.

    Raises:
        ValueError: it is of other peers (or not a clock's).
    """
    values = [saved["clock"], saved["busy"], saved["taken"]]
    if any(not isinstance(v, torch.Tensor) or v.shape != clock.clock.shape for v in values):
        raise ValueError("a clock of other peers")
    clock.clock = values[0].to(torch.float64).clone()
    clock.busy = values[1].to(torch.float64).clone()
    clock.taken = values[2].to(torch.int64).clone()
    clock.round = int(saved["round"])


def virtual_clock(setup: RunSetup) -> SharedClock | None:
    """The clock of a simulation of ``setup``: with ``[time]`` or in deadline mode, else
    None (no virtual time).

    Raises:
        ConfigError: the algorithm has no batched form (a user's per-message algorithm),
            whose messages the clock cannot size; the run's costs could take its clock
            past :data:`~fedcore.config.MAX_VIRTUAL_S`.
    """
    config = setup.config
    if not (config.time.active or config.transport.mode == "deadline"):
        return None
    if setup.algorithm.asynchronous:
        return None  # no rounds: the event engine keeps its own time
    if not has_batched_form(setup.algorithm):
        raise ConfigError(
            f"virtual time ([time], or deadline mode in a simulation) needs an algorithm "
            f"written as an update rule; {setup.algorithm.name!r} follows the per-message "
            "protocol. Drop [time] and use transport.mode = 'strict'."
        )
    return SharedClock(setup)


@dataclass(slots=True)
class _Round:
    times: RoundTimes
    edges: list[tuple[torch.Tensor, torch.Tensor]]  # per phase: the messages' ends


class SharedClock:
    """The virtual clock of one simulated network (see the module docstring)."""

    def __init__(self, setup: RunSetup) -> None:
        """Size the run's messages as the vectorized engine does.

        Raises:
            ConfigError: the run's costs (its rounds, phases, message size, deadline and
                traces) could take its clock past :data:`~fedcore.config.MAX_VIRTUAL_S`
                (:meth:`~fedcore.timing.TimeModel.clock_costs`), naming the key.
        """
        config = setup.config
        self.nodes = setup.graph.nodes
        self.n = len(self.nodes)
        self._index = {v: i for i, v in enumerate(self.nodes)}
        self.plan = setup.faults
        deadline = config.transport.deadline_s if config.transport.mode == "deadline" else None
        self.model = TimeModel(config.time, run_seed=config.run.seed, nodes=self.nodes)
        self.clock = RoundClock(self.model, steps=config.run.local_steps, deadline_s=deadline)
        self.codec = row_codec(setup)
        self.d = int(setup.start.numel())
        self.dtype = setup.start.dtype
        form = batched_form(
            setup.algorithm, codec=self.codec.name, itemsize=setup.start.element_size()
        )
        held = [0 if setup.source is not None else len(p) for p in setup.parts]
        form.samples = torch.tensor(held, dtype=torch.float64)
        cpu = torch.device("cpu")
        period = setup.graph.period
        self.graphs = [stack_graph(setup.graph.at(t), device=cpu) for t in range(period)]
        form.use_graphs(self.graphs)
        self.form = form
        check_clock_horizon(
            self.model.clock_costs(
                rounds=config.run.rounds,
                steps=config.run.local_steps,
                phases=form.phases,
                message_bytes=self._largest_message(setup.start.element_size()),
                deadline_s=deadline,
                delay_s=config.faults.delay_s if self.plan is not None else 0.0,
            ),
            cycle_s=config.time.cycle_s,
        )
        self._rounds: dict[int, _Round] = {}
        self._asked: dict[str, int] = {}  # each node's last round asked of node_times
        self._sent: dict[tuple[str, int, int], frozenset[str]] = {}
        self._late: dict[tuple[int, int], dict[str, frozenset[str]]] = {}

    def _largest_message(self, itemsize: int) -> int:
        """The bytes of the whole model as a message, encoded by the run's codec or raw
        (``itemsize`` a value), whichever is larger: the size of the run's messages the
        horizon check takes, known before the rule has seen the model (RPS sizes its
        blocks only then). A rule that sends several model-sized tensors in one message
        sends more."""
        return max(self._size(self.d), self.d * itemsize)

    @property
    def deadline(self) -> bool:
        """Whether the clock decides lateness (deadline mode)."""
        return self.clock.deadline_s is not None

    def _size(self, n: int) -> int:
        return self.codec.nbytes(n, self.dtype)

    def traffic(self, t: int) -> tuple[torch.Tensor, torch.Tensor, list[PhaseTraffic]]:
        """``(up, training, phases)`` of round ``t``, as the vectorized engine derives them."""
        plan = self.plan
        up = torch.ones(self.n, dtype=torch.bool) if plan is None else ~plan.down_mask(t)
        trains = self.form.trains(t, self.nodes, torch.device("cpu"))
        training = up if trains is None else up & trains
        graph = self.graphs[t % len(self.graphs)]
        phases = []
        for p in range(self.form.phases):
            m = self.form.messages(p, graph, self._size, self.d, round=t)
            active = self.form.active(p, t, graph, self.nodes)
            lost = None if plan is None else plan.lost_mask(m.src, m.dst, t, p)
            if lost is not None and active is not None:
                lost = lost & active
            phases.append(phase_traffic(plan, m, active, lost, up, t, p))
        return up, training, phases

    def advance(
        self, t: int, up: torch.Tensor, training: torch.Tensor, phases: Sequence[PhaseTraffic]
    ) -> RoundTimes:
        """Round ``t``'s times, given its traffic (the vectorized engine's); the rounds
        before it first, from :meth:`traffic` (a resumed run)."""
        self._reach(t)
        return self._advance(t, up, training, phases)

    def _advance(
        self, t: int, up: torch.Tensor, training: torch.Tensor, phases: Sequence[PhaseTraffic]
    ) -> RoundTimes:
        times = self.clock.advance(t, up, training, phases)
        edges = [(p.src.cpu(), p.dst.cpu()) for p in phases]
        self._rounds[t] = _Round(times, edges)
        return times

    def forget(self, t: int) -> None:
        """Keep no times of the rounds before ``t``: an engine that asks about no past
        round (a sharded run's ranks, :mod:`fedcore.engines.shard_time`)."""
        for old in [r for r in self._rounds if r < t]:
            del self._rounds[old]

    def _forget(self) -> None:
        """Drop the rounds every node is past (the message engine's nodes drift apart
        as far as the algorithm lets them: without messages, a whole run)."""
        if len(self._asked) < self.n or len(self._rounds) <= _KEPT:
            return
        done = min(self._asked.values())
        for old in [r for r in self._rounds if r < done]:
            del self._rounds[old]
        for key in [k for k in self._late if k[0] < done]:
            del self._late[key]
        for sent in [k for k in self._sent if k[1] < done - 1]:
            del self._sent[sent]

    def _reach(self, t: int) -> None:
        """Advance the clock from its own traffic up to (not including) round ``t``."""
        if t < self.clock.round:
            raise ValueError(f"the clock is past round {t} (at {self.clock.round})")
        while self.clock.round < t:
            r = self.clock.round
            self._advance(r, *self.traffic(r))

    def times(self, t: int) -> RoundTimes:
        """Round ``t``'s times (advancing the clock as far as that)."""
        kept = self._rounds.get(t)
        if kept is None:
            self._reach(t + 1)
            kept = self._rounds.get(t)
            if kept is None:
                raise ValueError(f"round {t} is older than the clock keeps (every node is past it)")
        return kept.times

    def late(self, receiver: str, t: int, phase: int) -> frozenset[str]:
        """The senders whose message of ``(t, phase)`` reaches ``receiver`` after its
        deadline."""
        if not self.deadline:
            return frozenset()
        table = self._late.get((t, phase))
        if table is None:
            times = self.times(t)
            src, dst = self._rounds[t].edges[phase]
            late = times.late[phase]
            found: dict[str, set[str]] = {}
            for s, r in zip(src[late].tolist(), dst[late].tolist(), strict=True):
                found.setdefault(self.nodes[r], set()).add(self.nodes[s])
            self._late[(t, phase)] = table = {k: frozenset(v) for k, v in found.items()}
        return table.get(receiver, frozenset())

    def record_sent(self, sender: str, t: int, phase: int, receivers: frozenset[str]) -> None:
        """The message engine: ``sender`` sent its ``(t, phase)`` messages to ``receivers``
        (a rule may send to fewer than its out-neighbours, as a holding push-sum peer
        does: its receivers then know not to wait)."""
        self._sent[(sender, t, phase)] = receivers

    def sent_to(self, sender: str, t: int, phase: int) -> frozenset[str] | None:
        """Whom ``sender`` sent its ``(t, phase)`` messages to; None: it has not sent yet."""
        return self._sent.get((sender, t, phase))

    def node_times(self, node: str, t: int) -> tuple[float, float]:
        """``(clock at the end of round t, seconds computing in it)`` of ``node``."""
        times = self.times(t)
        i = self._index[node]
        self._asked[node] = t + 1  # a node asks at the end of its round: done with t
        self._forget()
        return float(times.end[i]), float(times.compute[i])
