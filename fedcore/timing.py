"""Virtual time: how long each computation and message takes, and a run's clock.

A :class:`TimeModel` answers, as pure functions of ``[time]`` and the keyed hash
(:mod:`fedcore.counter_random`), the three durations a simulation needs:

* :meth:`~TimeModel.compute_seconds`: one local step of a peer, ``step_s`` x the peer's
  speed factor x a draw (fixed, lognormal or Pareto, each of mean 1), or a step time of
  the user's trace;
* :meth:`~TimeModel.transfer_seconds`: a message's latency plus its encoded bytes over
  the link's bandwidth (plus the fault plan's delay, drawn by the plan);
* :meth:`~TimeModel.available_from`: the first moment, from a given one, at which a peer
  is on (alternating exponential on/off periods, or the off windows of a trace).

Every draw is ``hash64(key, kind, node, step)`` with ``key = make_key("fedcore.time",
run.seed, time.seed)``, never shared random state, so the vectorized engine (every peer at
once), the message engine and an asynchronous event loop see the same durations.

A :class:`RoundClock` turns them into the clock of a synchronous run (every peer's
virtual time, a round at a time). A peer starts round ``t`` at its clock, waits until it
is available, computes its local steps, then each phase sends at the time it is ready and
waits for the messages it expects (the announced-lost ones excepted); a message arrives at
its sender's ready time plus its transfer time. In deadline mode a receiver waits at most
``deadline_s`` a phase: a message arriving later is *late* (it was sent, its bytes count,
but the round goes on without it), and a receiver missing any expected message waits the
whole deadline. So the lateness of every message is a function of the config alone, the
same on both engines. A crashed peer's clock moves on with the latest peer of the round.

No clock overflows: a config whose costs could take a run's clock past
:data:`~fedcore.config.MAX_VIRTUAL_S` is refused at load (``[time]`` with the rounds) and
at set-up (:meth:`TimeModel.clock_costs`: the phases, message sizes, deadline and traces),
and a trace is read as UTF-8 CSV of numbers within that ceiling, or refused naming the file.
"""

from __future__ import annotations

import codecs
import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from fedcore import counter_random as keyed
from fedcore.config import MAX_VIRTUAL_S, ClockCost, TimeConfig, counted, safe_product
from fedcore.errors import ConfigError
from fedcore.ids import clip, shorten

__all__ = ["PhaseTraffic", "RoundClock", "RoundTimes", "TimeModel", "read_trace"]

_COMPUTE = keyed.string_id("compute")
_SLOW = keyed.string_id("slow")
_ON = keyed.string_id("on")
_OFF = keyed.string_id("off")
_F64 = torch.float64
_MOST_PERIODS = 256
"""The most on/off periods :meth:`TimeModel.available_from` draws for a peer in one step
(it starts at one and doubles while a peer is still behind)."""
_MIB = float(2**20)


def read_trace(path: str, columns: int, what: str) -> dict[str, list[tuple[float, ...]]]:
    """The rows of a CSV trace, ``node,number[,number]`` (UTF-8; a first line that is not
    numbers is a header, skipped), by node in file order.

    Raises:
        ConfigError: one line naming the file (and the line): it cannot be read, is not
            UTF-8 text or CSV, has no rows, or a row is not a node id and ``columns``
            numbers in ``[0, MAX_VIRTUAL_S]``.
    """
    name = f"{what} {clip(path, 200)}"
    shape = {1: "node,seconds", 2: "node,start_s,end_s"}.get(
        columns, f"node,{','.join(['seconds'] * columns)}"
    )
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name} cannot be read: {exc.strerror or exc}.") from None
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0  # a spreadsheet's
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        raise ConfigError(
            f"{name} is not UTF-8 text (byte 0x{raw[at]:02x} at offset {at}); save it as a "
            f"UTF-8 CSV file of {shape} rows."
        ) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    out: dict[str, list[tuple[float, ...]]] = {}
    first = True
    try:
        for row in reader:
            line = reader.line_num
            if not row:
                continue  # a blank line
            values = _numbers(row[1:])
            if first and not values:  # no numbers (None), or no cells but the first
                first = False
                continue  # the header
            first = False
            node = row[0].strip()
            ok = values is not None and all(0 <= v <= MAX_VIRTUAL_S for v in values)
            if len(row) != columns + 1 or not ok or not node:
                raise ConfigError(
                    f"{name}, line {line}: expected {shape} (a node id and numbers in [0, "
                    f"{MAX_VIRTUAL_S:.0e}]), got {clip(','.join(row))}."
                )
            assert values is not None
            out.setdefault(node, []).append(values)
    except csv.Error as exc:
        why = shorten(" ".join(str(exc).split()), 100)
        raise ConfigError(f"{name}, line {reader.line_num}: not CSV ({why}).") from None
    if not out:
        raise ConfigError(f"{name} has no rows; it needs {shape} rows.")
    return out


def _numbers(cells: Sequence[str]) -> tuple[float, ...] | None:
    """The cells as numbers, or None if one is not a number."""
    try:
        return tuple(float(c) for c in cells)
    except ValueError:
        return None


class TimeModel:
    """The durations of one run (see the module docstring), over node indices into
    ``nodes``."""

    def __init__(self, time: TimeConfig, *, run_seed: int, nodes: Sequence[str]) -> None:
        """Bind ``[time]`` to ``run_seed`` and the node order.

        Raises:
            ConfigError: ``[time]`` names a node that is not in ``nodes``; a trace is
                unreadable (:func:`read_trace`), has rows of a node not in ``nodes``, or
                (the compute trace) misses a node or has a step that, times the node's
                speed factor, is past :data:`~fedcore.config.MAX_VIRTUAL_S`.
        """
        self.time = time
        self.nodes = tuple(nodes)
        n = len(self.nodes)
        self.n = n
        index = {v: i for i, v in enumerate(self.nodes)}
        self._index = index
        self._key = keyed.make_key("fedcore.time", run_seed, time.seed)
        self._words = keyed.string_ids(self.nodes, "cpu")
        named = set(time.speeds)
        for per_edge in (time.edge_latency_s, time.edge_bandwidth_mb_s):
            named |= {v.strip() for edge in per_edge for v in edge.split("->")}
        unknown = sorted(named - set(index))
        if unknown:
            raise ConfigError(
                f"[time] names nodes that are not in the graph: {', '.join(unknown)}."
            )
        speed = torch.ones(n, dtype=_F64)
        slow = round(time.slow_fraction * n)
        if slow:  # exactly that share: the peers of the smallest draws
            draws = keyed.uniform_tensor(self._key, _SLOW, self._words)
            speed[torch.argsort(draws)[:slow]] = time.slow_factor
        for node, factor in time.speeds.items():
            speed[index[node]] = float(factor)
        self.speed = speed
        """``[N]`` float64: each peer's compute time multiplier."""
        self._trace: tuple[torch.Tensor, torch.Tensor] | None = None
        if time.compute_trace:
            rows = read_trace(time.compute_trace, 1, "time.compute_trace")
            _only_graph_nodes("time.compute_trace", time.compute_trace, rows, index)
            absent = [v for v in self.nodes if v not in rows]
            if absent:
                raise ConfigError(
                    f"time.compute_trace {clip(time.compute_trace, 200)} has no rows of "
                    f"{_some(absent)}; it needs every node's step times."
                )
            width = max(len(rows[v]) for v in self.nodes)
            table = torch.zeros(n, width, dtype=_F64)
            lengths = torch.zeros(n, dtype=torch.int64)
            for i, v in enumerate(self.nodes):
                seconds = [r[0] for r in rows[v]]
                table[i, : len(seconds)] = torch.tensor(seconds, dtype=_F64)
                lengths[i] = len(seconds)
            longest = table.amax(dim=1) * speed
            worst = int(torch.argmax(longest))
            if not float(longest[worst]) <= MAX_VIRTUAL_S:
                raise ConfigError(
                    f"time.compute_trace {clip(time.compute_trace, 200)}: {self.nodes[worst]}'s "
                    f"step of {float(table[worst].max()):.3g} s x its speed factor "
                    f"{float(speed[worst]):.3g} is past the {MAX_VIRTUAL_S:.0e} s a virtual "
                    "clock may reach (fedcore.config.MAX_VIRTUAL_S); lower the step time or "
                    "the factor."
                )
            self._trace = (table, lengths)
        self._windows: torch.Tensor | None = None  # [N, W, 2] off windows of the trace
        if time.availability_trace:
            rows = read_trace(time.availability_trace, 2, "time.availability_trace")
            _only_graph_nodes("time.availability_trace", time.availability_trace, rows, index)
            merged = {v: _merge([(a, b) for a, b in rows[v] if b > a]) for v in rows}
            width = max((len(w) for w in merged.values()), default=0)
            windows = torch.full((n, max(width, 1), 2), math.inf, dtype=_F64)
            for v, spans in merged.items():
                if spans:
                    windows[index[v], : len(spans)] = torch.tensor(spans, dtype=_F64)
            self._windows = windows
        # Alternating on/off periods: each node's current on period [start, end) and index.
        self._cycle = torch.zeros(n, dtype=torch.int64)
        self._on_start = torch.zeros(n, dtype=_F64)
        self._off_start = torch.zeros(n, dtype=_F64)  # the end of the period before
        self._on_end = self._period(_ON, torch.arange(n), self._cycle) if time.on_s > 0 else None
        edge_tables = (time.edge_latency_s, time.edge_bandwidth_mb_s)
        self._edges = [self._edge_table(t) for t in edge_tables]

    @property
    def timed(self) -> bool:
        """Whether any duration can be non-zero."""
        return self.time.active

    def clock_costs(
        self,
        *,
        rounds: int,
        steps: int,
        phases: int,
        message_bytes: int,
        deadline_s: float | None = None,
        delay_s: float = 0.0,
    ) -> list[ClockCost]:
        """What the run adds to its peers' clocks at most, every draw at its mean, over
        ``rounds`` rounds of ``steps`` local steps and ``phases`` phases of messages of at
        most ``message_bytes`` (:func:`fedcore.config.check_clock_horizon` refuses a sum
        past :data:`~fedcore.config.MAX_VIRTUAL_S`).

        A round takes at most: the longest off period, the slowest peer's steps, and per
        phase the longest latency plus the largest message over the slowest link plus the
        fault plan's ``delay_s`` (deadline mode: or ``deadline_s``, if longer: a receiver
        waits no longer, but may wait that long for a message that never comes). An
        availability trace's latest window end is a moment the clock may jump to.

        The keys' shares are :meth:`~fedcore.config.TimeConfig.clock_shares` at the speed
        factor of the run's slowest peer; this adds what only the set-up knows: the compute
        trace's longest step, ``delay_s``, the deadline and the availability trace."""
        t = self.time
        speed = float(self.speed.max()) if self.n else 1.0  # the run's slowest peer
        compute, link, off = t.clock_shares(
            rounds=rounds,
            local_steps=steps,
            phases=phases,
            message_bytes=message_bytes,
            speed=speed,
        )
        if self._trace is not None:
            table, _ = self._trace
            longest = float((table.amax(dim=1) * self.speed).max())
            work = f"{counted(rounds, 'round')} x {counted(steps, 'local step')}"
            compute.append(
                ClockCost(
                    "time.compute_trace",
                    t.compute_trace,
                    safe_product(rounds, steps, longest),
                    f"{work} x the trace's longest step ({longest:.3g} s, speed factor included)",
                )
            )
        each = counted(rounds, "round") + (f" x {counted(phases, 'phase')}" if phases != 1 else "")
        if delay_s > 0:
            link.append(
                ClockCost(
                    "faults.delay_s",
                    delay_s,
                    safe_product(rounds, phases, delay_s),
                    f"{each} x a delay of {delay_s:.3g} s",
                )
            )
        waits = safe_product(rounds, phases, deadline_s) if deadline_s is not None else 0.0
        if deadline_s is not None and not waits <= sum((c.seconds for c in link), 0.0):
            link = [
                ClockCost(
                    "transport.deadline_s",
                    deadline_s,
                    waits,
                    f"{each} x a deadline of {deadline_s:.3g} s (deadline mode)",
                )
            ]
        costs = [*compute, *link, *off]
        if self._windows is not None:
            ends = self._windows[..., 1]
            latest = float(ends[torch.isfinite(ends)].max()) if bool(ends.isfinite().any()) else 0
            costs.append(
                ClockCost(
                    "time.availability_trace",
                    t.availability_trace,
                    latest,
                    f"its latest off window, ending at {latest:.3g} s,",
                )
            )
        return costs

    def _edge_table(self, table: Mapping[str, float]) -> tuple[torch.Tensor, torch.Tensor] | None:
        pairs = ((k.split("->"), float(v)) for k, v in table.items())
        items = sorted(
            (self._index[s.strip()] * self.n + self._index[r.strip()], v) for (s, r), v in pairs
        )
        if not items:
            return None
        codes = torch.tensor([c for c, _ in items], dtype=torch.int64)
        return codes, torch.tensor([v for _, v in items], dtype=_F64)

    def _per_edge(
        self, which: int, default: float, src: torch.Tensor, dst: torch.Tensor
    ) -> torch.Tensor:
        out = torch.full(src.shape, default, dtype=_F64)
        table = self._edges[which]
        if table is None or src.numel() == 0:
            return out
        codes, values = table
        edges = src.to(torch.int64) * self.n + dst.to(torch.int64)
        at = torch.searchsorted(codes, edges).clamp_(max=len(codes) - 1)
        return torch.where(codes[at] == edges, values[at], out)

    # --- durations ------------------------------------------------------------------------

    def step_seconds(self, nodes: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """``[B]`` float64: the seconds of step ``steps[b]`` (each peer's own count of the
        local steps it took) of the peer ``nodes[b]``."""
        nodes = nodes.to(torch.int64)
        steps = steps.to(torch.int64)
        if self._trace is not None:
            table, lengths = self._trace
            at = torch.remainder(steps, lengths[nodes])
            return table[nodes, at] * self.speed[nodes]
        base = torch.full(nodes.shape, self.time.step_s, dtype=_F64) * self.speed[nodes]
        kind = self.time.compute
        if kind == "fixed" or self.time.step_s == 0:
            return base
        words = self._words[nodes]
        if kind == "lognormal":
            s = self.time.sigma
            z = keyed.gaussian_tensor(self._key, _COMPUTE, words, steps)
            return base * torch.exp(z * s - 0.5 * s * s)
        # Pareto of mean 1: x_m u^(-1/alpha), x_m = (alpha - 1) / alpha, u in (0, 1].
        a = self.time.alpha
        u = 1.0 - keyed.uniform_tensor(self._key, _COMPUTE, words, steps)
        return base * ((a - 1.0) / a) * torch.pow(u, -1.0 / a)

    def compute_seconds(self, nodes: torch.Tensor, first: torch.Tensor, count: int) -> torch.Tensor:
        """``[B]`` float64: the seconds of ``count`` local steps of each peer, from its step
        ``first[b]`` on."""
        total = torch.zeros(nodes.shape, dtype=_F64)
        for k in range(count):
            total += self.step_seconds(nodes, first + k)
        return total

    def transfer_seconds(
        self, src: torch.Tensor, dst: torch.Tensor, nbytes: torch.Tensor
    ) -> torch.Tensor:
        """``[E]`` float64: each message's latency plus ``nbytes`` over its bandwidth."""
        t = self.time
        if self._edges[0] is None and self._edges[1] is None:  # the same on every link
            if t.bandwidth_mb_s > 0:
                seconds = nbytes.to(_F64) / (t.bandwidth_mb_s * _MIB)
                return seconds.add_(t.latency_s) if t.latency_s else seconds
            return torch.full(src.shape, t.latency_s, dtype=_F64)
        latency = self._per_edge(0, t.latency_s, src, dst)
        bandwidth = self._per_edge(1, t.bandwidth_mb_s, src, dst)
        seconds = nbytes.to(_F64) / (bandwidth * _MIB)
        return latency + torch.where(bandwidth > 0, seconds, 0.0)

    def available_from(self, nodes: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """``[B]`` float64: the first moment ``>= at[b]`` at which peer ``nodes[b]`` is on
        (each peer at most once a call).

        On/off periods are kept per peer as they are reached; a peer asked about an earlier
        moment than before starts over from its first period (so the answers are a pure
        function of the arguments)."""
        at = at.to(_F64)
        if self._windows is not None:
            windows = self._windows[nodes.to(torch.int64)]
            for w in range(windows.shape[1]):  # sorted, merged: one pass
                inside = (windows[:, w, 0] <= at) & (at < windows[:, w, 1])
                at = torch.where(inside, windows[:, w, 1], at)
            return at
        if self._on_end is None:
            return at
        nodes = nodes.to(torch.int64)
        back = at < self._off_start[nodes]
        if bool(back.any()):  # asked about the past: that peer starts over
            again = nodes[back]
            self._cycle[again] = 0
            self._on_start[again] = 0.0
            self._off_start[again] = 0.0
            self._on_end[again] = self._period(_ON, again, self._cycle[again])
        chunk = 1
        while True:
            end = self._on_end[nodes]  # the end of the current on period
            behind = at >= end
            if not bool(behind.any()):
                break
            self._advance(nodes[behind], at[behind], chunk)
            chunk = min(2 * chunk, _MOST_PERIODS)
        return torch.maximum(at, self._on_start[nodes])

    def _advance(self, nodes: torch.Tensor, at: torch.Tensor, chunk: int) -> None:
        """Step each peer ``nodes[b]`` (behind ``at[b]``) on by up to ``chunk`` off/on
        periods: until its on period ends after ``at[b]``, or ``chunk`` periods on.

        The moments are the running sums of one peer's durations, in the order the one by
        one steps add them (``start = end + off``, ``end = start + on``): a cumulative sum
        along a row adds in that order, so a peer lands on the same bits in one call of
        ``chunk`` periods as in ``chunk`` calls of one (``tests/test_timing.py``)."""
        on_end = self._on_end
        assert on_end is not None  # on/off periods configured (available_from's check)
        moving, where = torch.unique(nodes, return_inverse=True)
        goal = torch.full(moving.shape, -math.inf, dtype=_F64)
        goal.scatter_reduce_(0, where, at, reduce="amax")  # a peer asked twice: the later
        k = self._cycle[moving].unsqueeze(1) + torch.arange(chunk)  # [m, chunk]
        peers = moving.unsqueeze(1).expand_as(k)
        durations = torch.stack(
            [self._period(_OFF, peers, k), self._period(_ON, peers, k + 1)], dim=2
        ).reshape(len(moving), 2 * chunk)
        moments = torch.cumsum(torch.cat([on_end[moving].unsqueeze(1), durations], 1), 1)
        ends = moments[:, 2::2]  # the end of the on period after each step
        ahead = goal.unsqueeze(1) < ends
        step = torch.where(ahead.any(dim=1), ahead.to(torch.int8).argmax(dim=1), chunk - 1)
        rows = torch.arange(len(moving))
        self._off_start[moving] = moments[rows, 2 * step]
        self._on_start[moving] = moments[rows, 2 * step + 1]
        on_end[moving] = moments[rows, 2 * step + 2]
        self._cycle[moving] = self._cycle[moving] + 1 + step

    def _period(self, kind: int, nodes: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Exponential on (``kind`` ``_ON``) or off durations of the peers' ``k``-th period."""
        mean = self.time.on_s if kind == _ON else self.time.off_s
        u = keyed.uniform_tensor(self._key, kind, self._words[nodes], k)
        return -mean * torch.log1p(-u)


def _some(names: Sequence[str], *, quote: bool = False) -> str:
    """Up to five ``names``, each cut short (``quote``: as ``repr``, for names a file
    holds), and how many there are if more."""
    shown = ", ".join(clip(v, 40) if quote else shorten(v, 40) for v in names[:5])
    return shown + (f" ... ({len(names)} in all)" if len(names) > 5 else "")


def _only_graph_nodes(
    key: str, path: str, rows: Mapping[str, object], index: Mapping[str, int]
) -> None:
    """Refuse a trace with rows of a node that is not in the graph (a typo, or the trace
    of another network)."""
    extra = sorted(v for v in rows if v not in index)
    if extra:
        raise ConfigError(
            f"{key} {clip(path, 200)} has rows of nodes that are not in the graph: "
            f"{_some(extra, quote=True)}; give it rows of the graph's nodes only."
        )


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class PhaseTraffic(NamedTuple):
    """One phase's messages of a round, as :meth:`RoundClock.advance` reads them.

    ``src``, ``dst``, ``nbytes``: every message the algorithm could send (``[M]``);
    ``sent``: those that went on the wire (active, sender up, not lost by the fault plan);
    ``expected``: those their receiver waits for (active, both ends up, not announced as
    lost). A message expected but not sent is one lost silently (``faults.announce =
    false``); ``delay``: the fault plan's extra seconds of each message (or ``None``).
    """

    src: torch.Tensor
    dst: torch.Tensor
    nbytes: torch.Tensor
    sent: torch.Tensor
    expected: torch.Tensor
    delay: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class RoundTimes:
    """A round's clock: every peer's ``start``, ``compute`` and ``end`` seconds (``[N]``
    float64) and, per phase, which messages were late (``[M]`` bool)."""

    round: int
    start: torch.Tensor
    compute: torch.Tensor
    end: torch.Tensor
    late: tuple[torch.Tensor, ...]


class RoundClock:
    """The virtual clock of a synchronous run (see the module docstring)."""

    def __init__(
        self, model: TimeModel, *, steps: int = 1, deadline_s: float | None = None
    ) -> None:
        """Every peer at time 0; ``steps`` local steps a round; ``deadline_s``: deadline
        mode's per-phase wait (``None``: strict mode, a peer waits for every expected
        message)."""
        self.model = model
        self.steps = steps
        self.deadline_s = deadline_s
        n = model.n
        self.clock = torch.zeros(n, dtype=_F64)
        """``[N]``: each peer's time at the end of the last round advanced."""
        self.busy = torch.zeros(n, dtype=_F64)
        """``[N]``: each peer's seconds of computing so far."""
        self.taken = torch.zeros(n, dtype=torch.int64)
        """``[N]``: each peer's local steps so far (its step counter of the draws)."""
        self.round = 0
        """The next round to advance."""
        self._all = torch.arange(n)

    def advance(
        self, t: int, up: torch.Tensor, training: torch.Tensor, phases: Sequence[PhaseTraffic]
    ) -> RoundTimes:
        """Advance every peer through round ``t`` (``up`` and ``training``: ``[N]`` bool)."""
        if t != self.round:
            raise ValueError(f"the clock is at round {self.round}, not {t}")
        up = up.cpu()
        training = training.cpu() & up
        start = self.clock
        model = self.model
        compute = torch.zeros_like(start)
        ready = start.clone()
        rows = torch.nonzero(training).squeeze(1)
        if rows.numel():
            if model.timed:
                began = model.available_from(rows, start[rows])
                compute[rows] = model.compute_seconds(rows, self.taken[rows], self.steps)
                ready[rows] = began + compute[rows]
            self.taken[rows] += self.steps
        late_masks: list[torch.Tensor] = []
        deadline = self.deadline_s
        for phase in phases:
            src, dst = phase.src.cpu().to(torch.int64), phase.dst.cpu().to(torch.int64)
            sent, expected = phase.sent.cpu(), phase.expected.cpu()
            wire = model.transfer_seconds(src, dst, phase.nbytes.cpu())
            arrival = ready.index_select(0, src) + wire
            if phase.delay is not None:
                arrival = arrival + phase.delay.cpu()
            heard = sent & expected
            if deadline is None:
                late = torch.zeros_like(sent)
                waited = heard
            else:
                limit = ready + deadline
                late = heard & (arrival > limit.index_select(0, dst))
                waited = heard & ~late
            until = ready.clone()
            if bool(waited.all()):  # every message (the usual round): no selection
                until.scatter_reduce_(0, dst, arrival, "amax")
            elif bool(waited.any()):
                # Messages not waited for arrive at once: they change no maximum.
                until.scatter_reduce_(0, dst, torch.where(waited, arrival, 0.0), "amax")
            if deadline is not None:
                short = expected & ~waited  # a receiver without an expected message
                if bool(short.any()):
                    stuck = torch.zeros_like(up)
                    stuck[dst[short]] = True
                    until = torch.where(stuck, torch.maximum(until, limit), until)
            ready = torch.where(up, until, ready)
            late_masks.append(late)
        if not bool(up.all()) and bool(up.any()):
            ready = torch.where(up, ready, torch.maximum(ready, ready[up].max()))
        self.clock = ready
        self.busy = self.busy + compute
        self.round = t + 1
        return RoundTimes(t, start, compute, ready, tuple(late_masks))
