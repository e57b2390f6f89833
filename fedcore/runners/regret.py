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
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.nn import functional
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from fedcore.config import CONVEX_MODELS
from fedcore.metrics import dynamic_regret, minimize, static_regret
from fedcore.runners.network import RunSetup

__all__ = ["CONVEX_MODELS", "applies", "regret_curve"]

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
