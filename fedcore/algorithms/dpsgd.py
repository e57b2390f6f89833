"""D-PSGD: decentralized parallel SGD with gossip averaging.

Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform
Centralized Algorithms?" (NeurIPS 2017). Combine-then-adapt: the gradient is taken at
the node's own pre-mix model, and the mix uses the neighbours' pre-step models::

    g   = grad f_i(x_i)
    send x_i to every neighbour
    x_i = sum_j W_ji x_j - lr * g            (W symmetric, doubly stochastic)

Because W is doubly stochastic, the mean moves exactly by the mean gradient step
(invariant I-DOG-1). A missing neighbour (deadline mode, a lost message, a crashed peer)
is replaced by the node's own value: its weight moves to the self weight, which keeps the
row a convex combination.

With a node optimizer (``[optimizer]``), its direction ``u_i``, computed from the gradient
at ``x_i``, replaces ``lr * g``: the mean then moves exactly by the mean of the ``u_i``.

One :class:`~fedcore.algorithms.rule.Rule` over a leading peer axis serves every engine.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, gossip, spent
from fedcore.messages import MessageSchema

__all__ = ["DPSGD", "DPSGDRule", "DPSGDState"]


class DPSGDState(NamedTuple):
    """The models ``x [B, d]`` and the gradient steps waiting for the mix (``[B, d]``
    between step and mix, ``[B, 0]`` between rounds)."""

    x: torch.Tensor
    pending: torch.Tensor


class DPSGDRule(Rule):
    """D-PSGD, combine-then-adapt (see the module docstring)."""

    name = "dpsgd"
    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"

    def init(self, params: torch.Tensor) -> DPSGDState:
        """Start from ``params``."""
        return DPSGDState(params.clone(), params.new_zeros((params.shape[0], 0)))

    def model(self, state: DPSGDState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def step(self, state: DPSGDState, grad: torch.Tensor, rows: Rows) -> tuple[DPSGDState, Send]:
        """Send the pre-step model; keep the gradient step for the mix."""
        return DPSGDState(state.x, rows.lr * grad), Send({"x": state.x})

    def schema(self, phase: int) -> MessageSchema:
        """The neighbour's model ``"x"``, nothing else."""
        return model_schema("x")

    def mix(
        self, state: DPSGDState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[DPSGDState, None]:
        """Average with the neighbours' pre-step models, then apply the gradient step."""
        x = gossip(state.x, rows.self_weight, inbox)
        x.sub_(state.pending)
        return DPSGDState(x, spent(state.pending)), None


DPSGD = DPSGDRule
