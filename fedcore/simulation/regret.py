"""Regret of a finished run: the losses the nodes suffered against the best comparators.

After a run, :func:`regret_curve` replays every node's stream (streams are functions of
the seed, so the batches are exactly those the nodes saw) and, at each evaluation round
``e``, compares the losses suffered in rounds ``0..e`` (``RoundRecord.loss``: the loss at
the node's model *before* its update) with

* the best single model in hindsight for the whole network's stream up to ``e``
  (:func:`fedcore.metrics.minimize`, warm-started from the previous round's solution):
  the static regret, computed for convex models only (``logreg``); and
* the stream's own comparator ``x*_t`` where it has one (``SyntheticDrift``, with a
  ``logreg`` model of its two classes): the dynamic regret.

Rounds in which a node was down (fault injection, a dead peer) count for neither side.
See :mod:`fedcore.metrics` for the definitions.

A run computes its curve as it goes, with :class:`RegretTracker`: at each evaluation the
rounds since the last one are accounted once (their suffered losses summed, their batches
replayed into the history, the dynamic comparator's losses summed), and only the static
comparator, which needs every batch so far, is solved again (warm-started). For a
two-class ``logreg`` the hindsight problem is the binary logistic regression of the logit
difference (the same minimum: the multinomial loss depends only on the difference), solved
by Newton's method on its ``features + 1`` parameters with a backtracking line search, in
chunks of samples; other models keep L-BFGS (:func:`fedcore.metrics.minimize`).
:func:`regret_curve` is the same curve computed after the run, all at once.
"""

from __future__ import annotations

import copy
import functools
import math
import operator
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.nn import functional
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from fedcore.config import CONVEX_MODELS
from fedcore.metrics import dynamic_regret, minimize, static_regret
from fedcore.setup.prepare import RunSetup

__all__ = ["CONVEX_MODELS", "RegretTracker", "applies", "regret_curve"]

MAX_ITER = 500
"""L-BFGS evaluations per hindsight problem (separable data has no minimum: the loss only
tends to 0, and the regret then approaches the suffered loss)."""


class _History:
    """Every node's batch of every round, concatenated in round order, with per-sample
    weights (1 / batch size: each node-round counts once) and each round's offset."""

    def __init__(self, setup: RunSetup, rounds: int, active: list[list[bool]]) -> None:
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        ws: list[torch.Tensor] = []
        self.offsets = [0]
        batches = getattr(setup.source, "batches", None)
        if callable(batches) and all(all(row) for row in active):
            # Every node read the batch of every round: a whole round in one call.
            for t in range(rounds):
                x, y = batches(t)
                size = y.numel()
                xs.append(x.to(torch.float64).reshape(size, -1))
                ys.append(y.reshape(-1))
                ws.append(torch.full((size,), 1.0 / y.shape[1], dtype=torch.float64))
                self.offsets.append(self.offsets[-1] + size)
            self._join(xs, ys, ws)
            return
        streams = [setup.stream(i) for i in range(len(setup.graph.nodes))]
        for t in range(rounds):
            size = 0
            for i, stream in enumerate(streams):
                if active[i][t]:  # a down node read no batch that round
                    x, y = stream.next_batch()
                    xs.append(x.to(torch.float64).reshape(len(y), -1))
                    ys.append(y)
                    ws.append(torch.full((len(y),), 1.0 / len(y), dtype=torch.float64))
                    size += len(y)
            self.offsets.append(self.offsets[-1] + size)
        self._join(xs, ys, ws)

    def _join(self, xs: list[torch.Tensor], ys: list[torch.Tensor], ws: list[torch.Tensor]) -> None:
        self.x = torch.cat(xs) if xs else torch.zeros(0, 1, dtype=torch.float64)
        self.y = torch.cat(ys) if ys else torch.zeros(0, dtype=torch.int64)
        self.w = torch.cat(ws) if ws else torch.zeros(0, dtype=torch.float64)

    def span(self, t0: int, t1: int) -> slice:
        """The samples of rounds ``t0..t1-1``."""
        return slice(self.offsets[t0], self.offsets[t1])


def applies(setup: RunSetup) -> bool:
    """Whether a regret is defined for this run (a convex model, or a known comparator)."""
    return setup.config.model.name in CONVEX_MODELS


def regret_curve(
    setup: RunSetup,
    losses_by_node: Mapping[str, Sequence[float | None]],
    eval_rounds: Sequence[int],
) -> list[dict[str, Any]]:
    """Static and dynamic regret at every round of ``eval_rounds`` (see the module doc).

    ``losses_by_node[node][t]`` is the loss node suffered in round ``t`` (None: it was
    down; a diverged node's NaN makes the regret NaN, as it should). Returns one record per
    evaluation round: ``round``, ``suffered`` (sum of the
    losses suffered so far), ``average_loss``, ``static_regret`` and ``dynamic_regret``
    (``None`` where not defined) and their averages over node-rounds.
    """
    nodes = setup.graph.nodes
    rounds = max(eval_rounds) + 1
    active = [[True] * rounds for _ in nodes]
    suffered = [0.0] * rounds
    count = [0] * rounds
    for i, node in enumerate(nodes):
        for t, loss in enumerate(losses_by_node[node][:rounds]):
            if loss is None:
                active[i][t] = False
            else:
                suffered[t] += loss
                count[t] += 1
    convex = setup.config.model.name in CONVEX_MODELS
    comparator = getattr(setup.source, "comparator", None)
    two_class_logreg = convex and setup.dataset.num_classes == 2
    history = _History(setup, rounds, active)
    module = copy.deepcopy(setup.evaluator.module).to(torch.float64)

    def losses(params: torch.Tensor, t0: int, t1: int) -> tuple[float, torch.Tensor]:
        """Sum over rounds ``t0..t1-1`` and nodes of the batch-mean loss, and its gradient."""
        vector_to_parameters(params, module.parameters())
        part = history.span(t0, t1)
        x, y, w = history.x[part], history.y[part], history.w[part]
        if not len(y):
            return 0.0, torch.zeros_like(params)
        total = (functional.cross_entropy(module(x), y, reduction="none") * w).sum()
        grads = torch.autograd.grad(total, list(module.parameters()))
        return float(total.detach()), torch.cat([g.reshape(-1) for g in grads]).detach()

    def round_value(params: torch.Tensor, t: int) -> float:
        """Sum over nodes of round ``t``'s batch-mean loss at ``params``."""
        with torch.no_grad():
            vector_to_parameters(params, module.parameters())
            part = history.span(t, t + 1)
            x, y, w = history.x[part], history.y[part], history.w[part]
            if not len(y):
                return 0.0
            return float((functional.cross_entropy(module(x), y, reduction="none") * w).sum())

    out: list[dict[str, Any]] = []
    best = parameters_to_vector(module.parameters()).detach()
    total_suffered, total_count, comparator_total, done = 0.0, 0, 0.0, 0
    for e in sorted(eval_rounds):
        for t in range(done, e + 1):
            total_suffered += suffered[t]
            total_count += count[t]
            if comparator is not None and two_class_logreg:
                comparator_total += round_value(_as_logreg(comparator(t), module), t)
        done = e + 1
        record: dict[str, Any] = {
            "kind": "regret",
            "round": e,
            "suffered": total_suffered,
            "average_loss": total_suffered / max(1, total_count),
            "static_regret": None,
            "dynamic_regret": None,
        }
        if convex:
            best, minimum, _ = minimize(
                functools.partial(losses, t0=0, t1=e + 1), best, max_iter=MAX_ITER
            )
            record["static_regret"] = static_regret(total_suffered, minimum)
        if comparator is not None and two_class_logreg:
            record["dynamic_regret"] = dynamic_regret(total_suffered, comparator_total)
        for key in ("static_regret", "dynamic_regret"):
            value = record[key]
            record[f"average_{key}"] = None if value is None else value / max(1, total_count)
        out.append(record)
    return out


def _as_logreg(w: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """Two-class logistic regression parameters whose logit difference is ``w . a``."""
    weight, bias = (p for p in module.parameters())
    rows = torch.zeros_like(weight)
    rows[1] = w.to(rows.dtype)
    return torch.cat([rows.reshape(-1), torch.zeros_like(bias)])


NEWTON_MAX_ITER = 100
"""Newton iterations per hindsight problem (a few from a warm start; separable data, whose
loss only tends to 0, stops here)."""

NEWTON_TOL = 1e-12
"""Newton stops when its decrement (the predicted decrease, an estimate of the gap to the
minimum) is below this fraction of the minimum's magnitude (at least 1)."""

REPLAY_KEPT_BYTES = 64 << 20
"""Copies of the rounds a run draws that a source which can keep them keeps until the
next evaluation replays them (:meth:`fedcore.streams.SyntheticDrift.keep_rounds`): at
10,000 peers of one example of 10 features, 480 KB a round, so 50 rounds between
evaluations are drawn once."""

_SAMPLE_CHUNK = 1 << 15
"""Samples a Newton pass takes at a time (bounds its temporaries: a few MB)."""


class _Replay:
    """The batches nodes read, replayed round by round into growing sample tensors (the
    incremental form of :class:`_History`)."""

    def __init__(self, setup: RunSetup) -> None:
        self.setup = setup
        self.n = len(setup.graph.nodes)
        self.rounds = 0
        self.offsets = [0]
        self._x: list[torch.Tensor] = []
        self._y: list[torch.Tensor] = []
        self._w: list[torch.Tensor] = []
        self.x = torch.zeros(0, 1, dtype=torch.float64)
        self.y = torch.zeros(0, dtype=torch.int64)
        self.w = torch.zeros(0, dtype=torch.float64)
        batches = getattr(setup.source, "batches", None)
        self._batches = batches if callable(batches) else None
        keep = getattr(setup.source, "keep_rounds", None)
        if callable(keep):  # the rounds the run draws, kept until they are replayed here
            keep(REPLAY_KEPT_BYTES)
        self._read = torch.zeros(self.n, dtype=torch.int64)  # batches each node read
        self._streams: list[Any] | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def add(self, active: Sequence[bool] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Round ``self.rounds``: the batches of the ``active`` nodes (None: all); returns
        the round's samples ``(x, y, w)``."""
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        ws: list[torch.Tensor] = []
        if self._batches is not None:
            nodes = (
                torch.arange(self.n)
                if active is None
                else torch.tensor([i for i, a in enumerate(active) if a], dtype=torch.int64)
            )
            positions = self._read[nodes]
            groups: list[tuple[int, torch.Tensor | None]]
            if len(nodes) == self.n and bool((positions == positions[0]).all()):
                groups = [(int(positions[0]), None)]  # every node at one position: one call
            else:
                groups = [(int(p), nodes[positions == p]) for p in torch.unique(positions)]
            for pos, which in groups:
                x, y = self._batches(pos) if which is None else self._batches(pos, which)
                size = y.numel()
                xs.append(x.to(torch.float64).reshape(size, -1))
                ys.append(y.reshape(-1))
                ws.append(torch.full((size,), 1.0 / max(1, y.shape[1]), dtype=torch.float64))
            self._read[nodes] += 1
        else:
            if self._streams is None:
                self._streams = [self.setup.stream(i) for i in range(self.n)]
            for i, stream in enumerate(self._streams):
                if active is None or active[i]:  # a down node read no batch that round
                    x, y = stream.next_batch()
                    xs.append(x.to(torch.float64).reshape(len(y), -1))
                    ys.append(y)
                    ws.append(torch.full((len(y),), 1.0 / len(y), dtype=torch.float64))
        width = xs[0].shape[1] if xs else 1
        x = torch.cat(xs) if xs else torch.zeros(0, width, dtype=torch.float64)
        y = torch.cat(ys) if ys else torch.zeros(0, dtype=torch.int64)
        w = torch.cat(ws) if ws else torch.zeros(0, dtype=torch.float64)
        self._x.append(x)
        self._y.append(y)
        self._w.append(w)
        self.offsets.append(self.offsets[-1] + len(y))
        self.rounds += 1
        return x, y, w

    def join(self) -> None:
        """Make :attr:`x`, :attr:`y`, :attr:`w` every sample replayed so far: views of
        buffers that grow by doubling, so each sample is copied a bounded number of times
        however many evaluations there are."""
        if not self._x:
            return
        size = len(self.y)
        total = size + sum(len(y) for y in self._y)
        if self._buffers is None or total > len(self._buffers[1]):
            capacity = max(total, 2 * (0 if self._buffers is None else len(self._buffers[1])))
            width = self._x[0].shape[1]
            bx = torch.empty(capacity, width, dtype=torch.float64)
            by = torch.empty(capacity, dtype=torch.int64)
            bw = torch.empty(capacity, dtype=torch.float64)
            bx[:size], by[:size], bw[:size] = self.x, self.y, self.w
            self._buffers = (bx, by, bw)
        bx, by, bw = self._buffers
        at = size
        for x, y, w in zip(self._x, self._y, self._w, strict=True):
            bx[at : at + len(y)], by[at : at + len(y)], bw[at : at + len(y)] = x, y, w
            at += len(y)
        self.x, self.y, self.w = bx[:total], by[:total], bw[:total]
        self._x, self._y, self._w = [], [], []

    def span(self, t0: int, t1: int) -> slice:
        """The samples of rounds ``t0..t1-1``."""
        return slice(self.offsets[t0], self.offsets[t1])


def _binary_parts(
    v: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, *, hessian: bool
) -> tuple[float, torch.Tensor, torch.Tensor | None]:
    """Value, gradient and (``hessian``) Hessian of ``sum_i w_i (log(1 + e^m_i) - y_i m_i)``,
    ``m = x . v[:-1] + v[-1]``, over the samples in chunks."""
    f = x.shape[1]
    value = torch.zeros((), dtype=torch.float64)
    grad = torch.zeros(f + 1, dtype=torch.float64)
    h = torch.zeros(f + 1, f + 1, dtype=torch.float64) if hessian else None
    weight, bias = v[:f], v[f]
    for start in range(0, len(y), _SAMPLE_CHUNK):
        part = slice(start, start + _SAMPLE_CHUNK)
        xc, yc, wc = x[part], y[part].to(torch.float64), w[part]
        m = torch.mv(xc, weight) + bias
        value += (wc * (torch.logaddexp(m, torch.zeros_like(m)) - yc * m)).sum()
        p = torch.sigmoid(m)
        r = wc * (p - yc)
        grad[:f] += torch.mv(xc.t(), r)
        grad[f] += r.sum()
        if h is not None:
            s = wc * p * (1 - p)
            xs = xc * s.unsqueeze(1)
            h[:f, :f] += xc.t() @ xs
            col = xs.sum(dim=0)
            h[:f, f] += col
            h[f, :f] += col
            h[f, f] += s.sum()
    return float(value), grad, h


def _binary_newton(
    x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, start: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """The minimizer (from ``start``) and minimum of the weighted binary logistic loss
    (:func:`_binary_parts`): Newton's method with a backtracking (Armijo) line search."""
    v = start.clone()
    value, grad, h = _binary_parts(v, x, y, w, hessian=True)
    eye = torch.eye(len(v), dtype=torch.float64)
    for _ in range(NEWTON_MAX_ITER):
        if not math.isfinite(value) or h is None:
            break
        ridge = 1e-12 * max(1.0, float(h.diagonal().abs().max()))  # separable data: H -> 0
        step = torch.linalg.solve(h + ridge * eye, grad)
        decrement = float(grad @ step)
        if not decrement > NEWTON_TOL * max(1.0, abs(value)):
            break
        t = 1.0
        while True:  # the full step almost always passes: its Hessian is taken with it
            trial = v - t * step
            parts = _binary_parts(trial, x, y, w, hessian=t == 1.0)
            if parts[0] <= value - 0.25 * t * decrement or t < 1e-10:
                break
            t /= 2
        if not parts[0] < value:
            break
        v = trial
        value, grad, h = parts if parts[2] is not None else _binary_parts(v, x, y, w, hessian=True)
    return v, value


class RegretTracker:
    """The regret curve of a run, computed at each evaluation from the rounds since the
    last (see the module docstring); :meth:`update` reads the run's observer.

    Its records equal :func:`regret_curve`'s for the same run: the suffered losses bit for
    bit (the same additions in the same order), the dynamic comparator's within float64
    rounding (the same per-round sums; a round with nodes down may list their samples in
    another order), the static regret within the hindsight solvers' tolerances. The same
    inputs give the same bits, wherever and whenever it is computed (``fedcore launch``
    computes it after the run).
    """

    def __init__(self, setup: RunSetup) -> None:
        """A curve for ``setup`` (:func:`applies` must hold)."""
        self.setup = setup
        self.nodes = tuple(setup.graph.nodes)
        config = setup.config
        self.convex = config.model.name in CONVEX_MODELS
        self.comparator = getattr(setup.source, "comparator", None)
        self.two_class_logreg = self.convex and setup.dataset.num_classes == 2
        self.records: list[dict[str, Any]] = []
        self.seconds = 0.0  # spent in update, all told
        self.done = 0  # rounds accounted
        self.total_suffered = 0.0
        self.total_count = 0
        self.comparator_total = 0.0
        self._replay = _Replay(setup)
        self._module = copy.deepcopy(setup.evaluator.module).to(torch.float64)
        # Solved from the run's initial model, whenever the tracker is made (the evaluator
        # holds whichever model it evaluated last).
        with torch.no_grad():
            vector_to_parameters(setup.start.to(torch.float64), self._module.parameters())
        self._best = parameters_to_vector(self._module.parameters()).detach()
        weight, bias = (p.detach() for p in self._module.parameters())
        # The binary problem's start: the initial model's logit difference.
        self._best_binary = (
            torch.cat([(weight[1] - weight[0]).reshape(-1), (bias[1] - bias[0]).reshape(1)])
            if self.two_class_logreg and weight.dim() == 2
            else None
        )

    def update(
        self, losses: Mapping[str, Sequence[float | None]], eval_rounds: Sequence[int]
    ) -> list[dict[str, Any]]:
        """Records for every round of ``eval_rounds`` not yet done (in order), each from the
        rounds up to it of ``losses`` (``losses[node][t]``: as :func:`regret_curve`'s,
        complete up to the last of ``eval_rounds``); returns every record so far."""
        began = time.perf_counter()
        for e in sorted(eval_rounds):
            if self.records and e <= self.records[-1]["round"]:
                continue
            self._advance(losses, e + 1)
            self.records.append(self._record(e))
        self.seconds += time.perf_counter() - began
        return self.records

    def _advance(self, losses: Mapping[str, Sequence[float | None]], rounds: int) -> None:
        """Account rounds ``done..rounds-1``: sums in node order, batches replayed."""
        if rounds <= self.done:
            return
        rows = [losses[node][self.done : rounds] for node in self.nodes]
        for offset, column in enumerate(zip(*rows, strict=True)):
            t = self.done + offset
            active: list[bool] | None = None
            if None in column:  # some node was down: its loss and batch do not count
                active = [loss is not None for loss in column]
                column = tuple(loss for loss in column if loss is not None)
            # In node order, one addition at a time from 0.0, as regret_curve adds them
            # (sum() of floats compensates its rounding from Python 3.12 on).
            suffered = float(functools.reduce(operator.add, column, 0.0))
            count = len(column)
            x, y, w = self._replay.add(active)
            self.total_suffered += suffered
            self.total_count += count
            if self.comparator is not None and self.two_class_logreg and len(y):
                params = _as_logreg(self.comparator(t), self._module)
                self.comparator_total += self._round_value(params, x, y, w)
        self.done = rounds
        self._replay.join()

    def _round_value(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ) -> float:
        """Sum over nodes of one round's batch-mean loss at ``params`` (its samples)."""
        with torch.no_grad():
            vector_to_parameters(params, self._module.parameters())
            logits = self._module(x)
            return float((functional.cross_entropy(logits, y, reduction="none") * w).sum())

    def _static_minimum(self) -> float:
        """``min_x`` of the losses of every round so far (warm-started)."""
        replay = self._replay
        if not len(replay.y):
            return 0.0
        if self._best_binary is not None:
            self._best_binary, minimum = _binary_newton(
                replay.x, replay.y, replay.w, self._best_binary
            )
            return minimum
        module = self._module

        def losses(params: torch.Tensor) -> tuple[float, torch.Tensor]:
            vector_to_parameters(params, module.parameters())
            total = (
                functional.cross_entropy(module(replay.x), replay.y, reduction="none") * replay.w
            ).sum()
            grads = torch.autograd.grad(total, list(module.parameters()))
            return float(total.detach()), torch.cat([g.reshape(-1) for g in grads]).detach()

        self._best, minimum, _ = minimize(losses, self._best, max_iter=MAX_ITER)
        return minimum

    def _record(self, e: int) -> dict[str, Any]:
        record: dict[str, Any] = {
            "kind": "regret",
            "round": e,
            "suffered": self.total_suffered,
            "average_loss": self.total_suffered / max(1, self.total_count),
            "static_regret": None,
            "dynamic_regret": None,
        }
        if self.convex:
            record["static_regret"] = static_regret(self.total_suffered, self._static_minimum())
        if self.comparator is not None and self.two_class_logreg:
            record["dynamic_regret"] = dynamic_regret(self.total_suffered, self.comparator_total)
        for key in ("static_regret", "dynamic_regret"):
            value = record[key]
            record[f"average_{key}"] = None if value is None else value / max(1, self.total_count)
        return record
