"""D-PSGD: decentralized parallel SGD with gossip averaging.

Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform
Centralized Algorithms?" (NeurIPS 2017). Combine-then-adapt: the gradient is taken at
the node's own pre-mix model, and the mix uses the neighbours' pre-step models::

    g   = grad f_i(x_i)
    send x_i to every neighbour
    x_i = sum_j W_ji x_j - lr * g            (W symmetric, doubly stochastic)

Because W is doubly stochastic, the mean moves exactly by the mean gradient step
(invariant I-DOG-1). A missing neighbour (deadline mode) is replaced by the node's own
value: its weight moves to the self weight, which keeps the row a convex combination.

With a node optimizer (``[optimizer]``), its direction ``u_i``, computed from the gradient
at ``x_i``, replaces ``lr * g``: the mean then moves exactly by the mean of the ``u_i``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from fedcore.algorithms.base import Inbox, Outbox, RoundContext, check_phase, model_schema
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema, Payload

__all__ = ["DPSGD", "DPSGDState", "gossip_mix"]


class DPSGDState(NamedTuple):
    """The model ``x`` and the gradient step waiting for the mix (``None`` between rounds)."""

    x: torch.Tensor
    pending_step: torch.Tensor | None


def gossip_mix(
    x: torch.Tensor, self_weight: float, in_weights: Mapping[str, float], inbox: Inbox
) -> torch.Tensor:
    """``self_weight * x + sum_j W_ji x_j`` over what arrived; a missing j's weight goes to self."""
    own = self_weight
    if len(inbox) != len(in_weights):
        own += sum(w for j, w in in_weights.items() if j not in inbox)
    out = x * own
    for sender, payload in inbox.items():
        w = in_weights.get(sender)
        if w is None:
            raise AlgorithmError(f"gossip message from {sender!r}, which is not an in-neighbour.")
        out.add_(payload.tensor("x"), alpha=w)
    return out


class DPSGD:
    """D-PSGD, combine-then-adapt (see the module docstring)."""

    name = "dpsgd"
    mixing = "doubly-stochastic"
    phases = 1

    def init(self, params: torch.Tensor) -> DPSGDState:
        """Start from ``params``."""
        return DPSGDState(params.clone(), None)

    def model(self, state: DPSGDState) -> torch.Tensor:
        """The model ``x``."""
        return state.x

    def step(
        self, state: DPSGDState, grad: torch.Tensor, ctx: RoundContext
    ) -> tuple[DPSGDState, Outbox]:
        """Send the pre-step model; remember the gradient step for the mix."""
        payload = Payload({"x": state.x})
        return DPSGDState(state.x, ctx.lr * grad), dict.fromkeys(ctx.out_weights, payload)

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Every neighbour."""
        return tuple(ctx.in_weights)

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """The neighbour's model ``"x"``, nothing else."""
        check_phase(self.name, phase)
        return model_schema("x")

    def mix(
        self, state: DPSGDState, phase: int, inbox: Inbox, ctx: RoundContext
    ) -> tuple[DPSGDState, Outbox]:
        """Average with the neighbours' pre-step models, then apply the gradient step."""
        x = gossip_mix(state.x, ctx.self_weight, ctx.in_weights, inbox)
        if state.pending_step is not None:
            x.sub_(state.pending_step)
        return DPSGDState(x, None), {}
