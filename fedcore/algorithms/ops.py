"""Online Push-Sum (OPS): online learning over one-way trust graphs.

He, Tan, Tang, Qiu, Liu, "Central Server Free Federated Learning over Single-sided
Trust Social Networks" (arXiv 1910.04956). Each node keeps a push-sum numerator ``x``,
a weight ``omega`` (initially 1) and predicts with the de-biased ``z = x / omega``.
Per round, with ``W_ij`` the share node ``i`` pushes to out-neighbour ``j``
(``sum_j W_ij = 1``, self included)::

    g        = grad f_i(z_i)                 # gradient at the de-biased point
    x_half_i = x_i - lr * g                  # the step acts on the numerator
    send (W_ij * x_half_i, W_ij * omega_i) to every out-neighbour j
    x_i      = W_ii * x_half_i + sum_k (received x shares)
    omega_i  = W_ii * omega_i  + sum_k (received omega shares)

Mass is conserved (``sum_i omega_i = n``, ``sum_i x_i`` moves only by the gradient
steps) as long as every message arrives. A lost message loses its mass: plain
push-sum then no longer reaches the true average (a robust variant with running sums
is the fix). Works on any strongly connected digraph with self-loops, and on a
time-varying schedule (the weights of each round's graph are used, and each round's
inbox holds only that round's messages).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.base import Inbox, Outbox, RoundContext
from fedcore.errors import AlgorithmError
from fedcore.messages import Payload

__all__ = ["OPS", "OPSState", "push_shares", "push_sum_mix"]


class OPSState(NamedTuple):
    """Push-sum numerator ``x`` and weight ``omega``."""

    x: torch.Tensor
    omega: float


def push_shares(x: torch.Tensor, omega: float, out_weights: dict[str, float]) -> Outbox:
    """One payload per out-neighbour with its share of ``(x, omega)``.

    Neighbours with the same weight share one payload object, so the node encodes it once.
    """
    by_weight: dict[float, Payload] = {}
    outbox: dict[str, Payload] = {}
    for dst, w in out_weights.items():
        payload = by_weight.get(w)
        if payload is None:
            payload = Payload({"x": x * w}, {"omega": omega * w})
            by_weight[w] = payload
        outbox[dst] = payload
    return outbox


def push_sum_mix(
    x: torch.Tensor, omega: float, self_weight: float, inbox: Inbox
) -> tuple[torch.Tensor, float]:
    """Keep the own share and add every received share, in inbox (sorted-sender) order."""
    new_x = x * self_weight
    new_omega = omega * self_weight
    for sender, payload in inbox.items():
        try:
            new_x.add_(payload.tensor("x"))
            new_omega += float(payload.scalars["omega"])
        except KeyError as exc:
            raise AlgorithmError(f"push-sum message from {sender!r} lacks {exc}.") from None
    return new_x, new_omega


class OPS:
    """Online Push-Sum (see the module docstring for the update rule)."""

    name = "ops"
    mixing = "push-sum"
    phases = 1

    def init(self, params: torch.Tensor) -> OPSState:
        """Start from ``x = params`` and ``omega = 1`` (so ``z = params``)."""
        return OPSState(params.clone(), 1.0)

    def model(self, state: OPSState) -> torch.Tensor:
        """The de-biased model ``z = x / omega``."""
        return state.x / state.omega

    def step(
        self, state: OPSState, grad: torch.Tensor, ctx: RoundContext
    ) -> tuple[OPSState, Outbox]:
        """Gradient step on the numerator, then push shares to out-neighbours."""
        x_half = state.x - ctx.lr * grad
        outbox = push_shares(x_half, state.omega, dict(ctx.out_weights))
        return OPSState(x_half, state.omega), outbox

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Every in-neighbour of this round's graph."""
        return tuple(ctx.in_weights)

    def mix(
        self, state: OPSState, phase: int, inbox: Inbox, ctx: RoundContext
    ) -> tuple[OPSState, Outbox]:
        """Keep the own share and add the received shares (missing ones are lost mass)."""
        x, omega = push_sum_mix(state.x, state.omega, ctx.self_weight, inbox)
        if not omega > 0.0:  # only reachable with a zero self weight or underflow
            raise AlgorithmError(
                f"node {ctx.node}: push-sum weight is {omega} after round {ctx.round}; "
                f"it must stay positive (self weight {ctx.self_weight}, {len(inbox)} shares "
                "received). Give every node a positive self weight."
            )
        return OPSState(x, omega), {}
