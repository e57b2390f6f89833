"""Two reference points for every experiment: LOCAL and CENTRAL.

* LOCAL: each node runs SGD on its own data and never communicates. Under label skew
  its per-node accuracy shows what a peer gets alone.
* CENTRAL: every node receives the exact average of all nodes' post-step models each
  round (adapt-then-combine with ``W = 11^T / n``), i.e. minibatch SGD on the union of
  the data. It ignores the trust graph: it is the upper reference, not a deployable
  algorithm. The average is summed in sorted node order and divided by the count, so every
  node that heard everyone holds bit-identical parameters.

With a node optimizer (``[optimizer]``), its direction ``u`` replaces ``lr * g`` in both;
CENTRAL's nodes then each keep their own optimizer state over bit-identical models.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, add_slot
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema

__all__ = ["Central", "CentralRule", "Local", "LocalRule", "ModelOnly", "ModelState"]


class ModelState(NamedTuple):
    """Just the model."""

    x: torch.Tensor


class ModelOnly:
    """State handling shared by algorithms whose state is just the model (per peer, or
    ``[B, d]`` rows of a rule: the same two lines)."""

    phases = 1

    def init(self, params: torch.Tensor) -> ModelState:
        """Start from ``params``."""
        return ModelState(params.clone())

    def model(self, state: ModelState) -> torch.Tensor:
        """The model ``x``."""
        return state.x


class LocalRule(ModelOnly, Rule):
    """Local SGD with no communication (an :class:`~fedcore.algorithms.rule.Rule`)."""

    name = "local"
    mixing = "none"
    pattern = "none"

    def step(self, state: ModelState, grad: torch.Tensor, rows: Rows) -> tuple[ModelState, None]:
        """Plain SGD step; nothing to send."""
        return ModelState(state.x - rows.lr * grad), None

    def schema(self, phase: int) -> MessageSchema:
        """None: LOCAL sends nothing, so every message is refused."""
        raise AlgorithmError("'local' sends no messages.")

    def mix(
        self, state: ModelState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[ModelState, None]:
        """Nothing to mix."""
        return state, None


Local = LocalRule


class CentralRule(ModelOnly, Rule):
    """Exact averaging of all nodes' post-step models every round (an
    :class:`~fedcore.algorithms.rule.Rule` on the complete graph)."""

    name = "central"
    mixing = "complete"
    pattern = "neighbours"

    def __init__(self) -> None:
        """No options."""
        self._ranks: tuple[tuple[str, ...], tuple[str, ...], list[int]] | None = None

    def step(self, state: ModelState, grad: torch.Tensor, rows: Rows) -> tuple[ModelState, Send]:
        """SGD step, then send the result to every other node."""
        x = state.x - rows.lr * grad
        return ModelState(x), Send({"x": x})

    def schema(self, phase: int) -> MessageSchema:
        """The sender's post-step model ``"x"``, nothing else."""
        return model_schema("x")

    def _own_rows(self, rows: Rows) -> list[int]:
        """For each in-neighbour slot ``k`` (and one past the last), the row whose own model
        is summed just before slot ``k``, or -1: a row's own model goes where its id falls
        among all node ids in sorted order (every other node is one slot)."""
        cached = self._ranks
        if cached is not None and cached[0] is rows.ids and cached[1] is rows.nodes:
            return cached[2]
        rank = {v: r for r, v in enumerate(sorted(rows.nodes))}
        own = [-1] * len(rows.nodes)
        for i, v in enumerate(rows.ids):
            own[rank[v]] = i
        self._ranks = (rows.ids, rows.nodes, own)
        return own

    def mix(
        self, state: ModelState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[ModelState, None]:
        """Average the peer's own model and what arrived, summed in sorted node order (so
        every peer that heard everyone holds the same bits). In place on one total: a slot
        that did not arrive adds 0 (its values are finite, as in :func:`gossip`)."""
        x = state.x
        own = self._own_rows(rows)
        total = torch.zeros_like(x)
        count = torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)
        for k, slot in enumerate(inbox):
            if own[k] >= 0:
                total[own[k]].add_(x[own[k]])
            arrived = slot.arrived.unsqueeze(1).to(x.dtype)
            add_slot(total, slot, "x", arrived)
            count.add_(arrived)
        if len(inbox) < len(own) and own[len(inbox)] >= 0:
            total[own[len(inbox)]].add_(x[own[len(inbox)]])
        return ModelState(total.div_(count)), None


Central = CentralRule
