"""Gradient tracking: each peer mixes its model and a tracker of the peers' average
gradient, so that with a constant step the peers reach the optimum of the *sum* of their
losses, where D-PSGD and push-sum SGD stop at a floor that grows with how their data
differ.

Both rules take, at round ``t``, the gradient ``g_t = grad f_i(x_t)`` and keep the last one:

    y_t     = ybar_t + g_t - g_{t-1}          (the tracker; y_0 = g_0)
    send      v = x_t - lr y_t  and  y_t
    x_{t+1} = sum_j R_ij v_j                   (R row-stochastic)
    ybar_{t+1} = sum_j C_ij y_j                (C column-stochastic)

* ``dsgt`` (DSGT: Pu and Nedic, "Distributed stochastic gradient tracking methods", Math.
  Prog. 2021; the adapt-then-combine form of Xu et al. and Di Lorenzo and Scutari's NEXT):
  ``R = C = W``, the doubly stochastic gossip weights of an undirected graph.
* ``push-pull`` (Push-Pull / AB: Pu, Shi, Xu and Nedic, "Push-pull gradient methods for
  distributed optimization in networks", IEEE TAC 2021; Xin and Khan's AB): on any strongly
  connected digraph, ``R_ij = 1 / (in-degree_i + 1)`` over a peer's in-neighbours and itself
  (what it pulls: computed from its own in-neighbours alone) and ``C_ij = 1 /
  (out-degree_j + 1)`` (what ``j`` pushes: push-sum's shares, from the sender's own
  out-neighbours alone).

Invariant: since ``C`` is column-stochastic, ``sum_i y_i = sum_i g_i`` (the latest
gradients) after every round in which every message arrives; with a constant step both
rules converge linearly to the minimiser of ``sum_i f_i`` for strongly convex losses.

A lost message: its model's share goes to the receiver itself (``R``'s row stays
stochastic), and its tracker share is lost, so the sum invariant breaks by it: the rules
are exact only over reliable links (``faults.drop`` runs, but the bias returns).

With a node optimizer the tracked quantity is the optimizer's direction (the gradient's
place in the update); ``run.local_steps > 1`` is refused (the tracker needs the gradient at
every model it sends).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, gossip, received
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema

__all__ = ["DSGT", "PushPull", "TrackingState"]

_TOTAL = torch.float64


class TrackingState(NamedTuple):
    """``B`` peers' models ``x``, the mixed trackers ``ybar`` (``C y`` of the last round)
    and their last gradients ``g`` (all ``[B, d]``; ``g`` and ``ybar`` zero before the
    first step, so ``y_0 = g_0``)."""

    x: torch.Tensor
    ybar: torch.Tensor
    g: torch.Tensor


class _TrackingRule(Rule):
    """The gradient-tracking update (module docstring); a subclass says what ``R`` is."""

    phases = 1
    pattern = "neighbours"

    def init(self, params: torch.Tensor) -> TrackingState:
        """Start from ``params``, the tracker at zero."""
        zero = torch.zeros_like(params)
        return TrackingState(params.clone(), zero, zero.clone())

    def model(self, state: TrackingState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def local_step(self, state: TrackingState, grad: torch.Tensor, rows: Rows) -> TrackingState:
        """Refused: the tracker needs the gradient at every model it sends.

        Raises:
            AlgorithmError: always.
        """
        raise AlgorithmError(
            f"{self.name!r} tracks the gradient at every model it sends: set run.local_steps = 1."
        )

    def step(
        self, state: TrackingState, grad: torch.Tensor, rows: Rows
    ) -> tuple[TrackingState, Send]:
        """Complete the tracker with the new gradient; send ``x - lr y`` and ``y``."""
        y = state.ybar + grad - state.g
        v = state.x - rows.lr * y
        return TrackingState(state.x, y, grad), Send({"v": v, "y": y})

    def schema(self, phase: int) -> MessageSchema:
        """The step's model ``"v"`` and the tracker ``"y"``."""
        return model_schema("v", "y")

    def mix(
        self, state: TrackingState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[TrackingState, None]:
        """``x <- R v`` (a missing model's share to the peer itself), ``ybar <- C y`` (a
        missing tracker's share lost)."""
        y = state.ybar  # this round's tracker, kept by step
        v = state.x - rows.lr * y
        x = self._pull(v, inbox, rows)
        ybar = received(y * rows.self_weight.to(y.dtype).unsqueeze(1), inbox, "y")
        return TrackingState(x, ybar, state.g), None

    def _pull(self, v: torch.Tensor, inbox: list[Slot], rows: Rows) -> torch.Tensor:
        """``sum_j R_ij v_j`` over what arrived."""
        return gossip(v, rows.self_weight, inbox, "v")


class DSGTRule(_TrackingRule):
    """DSGT on an undirected graph: ``R = C = W`` (see the module docstring)."""

    name = "dsgt"
    mixing = "doubly-stochastic"


class PushPullRule(_TrackingRule):
    """Push-Pull (AB) on a digraph: ``R`` from each peer's in-degree, ``C`` push-sum's
    shares (see the module docstring)."""

    name = "push-pull"
    mixing = "push-sum"

    def _pull(self, v: torch.Tensor, inbox: list[Slot], rows: Rows) -> torch.Tensor:
        """``R_ij = 1 / (in-degree_i + 1)``: each peer's own, uniform over what it hears
        and itself (a missing in-neighbour's share to itself)."""
        r = 1.0 / (rows.in_degree.to(_TOTAL) + 1.0)
        pulled = [  # a padding slot (weight 0, the vectorized engine's) stays 0
            Slot(s.tensors, s.scalars, torch.where(s.weight > 0, r, 0.0), s.arrived, None, s.sender)
            for s in inbox
        ]
        return gossip(v, r, pulled, "v")


DSGT = DSGTRule
PushPull = PushPullRule
