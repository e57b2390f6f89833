"""Gradient tracking (DSGT, Push-Pull, Push-DIGing): each peer mixes its model and a
tracker of the peers' average gradient, so that with a constant step the peers reach the
optimum of the *sum* of their losses, where D-PSGD and push-sum SGD stop at a floor that
grows with how their data differ.

DSGT and Push-Pull take, at round ``t``, the gradient ``g_t = grad f_i(x_t)`` and keep the last one:

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

* ``push-diging`` (Push-DIGing: Nedic, Olshevsky and Shi, "Achieving geometric convergence
  for distributed optimization over time-varying graphs", SIAM J. Optim. 2017), push-sum
  with gradient tracking, the directed baseline of Push-Pull: each peer keeps push-sum's
  value ``u`` and weight ``w`` (:class:`~fedcore.algorithms.ops.PushSumRule`, step scale
  ``"none"``) and takes its gradient at the de-biased ``x = u / w``::

      y_t     = ybar_t + g_t - g_{t-1}          (g_t = grad f_i(u_t / w_t); y_0 = g_0)
      u_{t+1} = sum_j C_ij (u_j - lr y_j)
      w_{t+1} = sum_j C_ij w_j
      ybar_{t+1} = sum_j C_ij y_j

  with ``C_ij = 1 / (out-degree_j + 1)``, push-sum's shares, which the sender pushes: OPS
  whose step follows the tracker instead of the gradient, the tracker pushed beside ``u``
  and ``w`` (a message carries the shares ``"x"`` of ``u - lr y`` and ``"y"``, and the
  scalar ``"omega"``, a share of ``w`` in ``(0, n]``).

Invariant: since ``C`` is column-stochastic, ``sum_i y_i = sum_i g_i`` (the latest
gradients) after every round in which every message arrives; with a constant step the
rules converge linearly to the minimiser of ``sum_i f_i`` for strongly convex losses.

A lost message (``faults.drop``, a partition, a crashed peer): in ``dsgt`` and
``push-pull`` its model's share goes to the receiver itself (``R``'s row stays stochastic),
and its tracker share is lost, so the sum invariant breaks by it for good and the bias
returns. In ``push-diging`` the shares of ``u``, ``w`` and ``y`` are all lost: the bias
returns, and the weights shrink round after round, so the step ``lr y / w`` on the
de-biased model grows until the run diverges. ``robust = true`` (each factory below) gives
the running-sum form of each rule (:mod:`fedcore.algorithms.robust_tracking`): a lost
message's mass arrives with the next one on its edge, and the rules stay exact under drops.

With a node optimizer the tracked quantity is the optimizer's direction (the gradient's
place in the update); ``run.local_steps > 1`` is refused (the tracker needs the gradient at
every model it sends).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.ops import PushSumRule, PushSumState, _check_options, _share_schema
from fedcore.algorithms.robust_tracking import (
    RobustDSGTRule,
    RobustPushDIGingRule,
    RobustPushPullRule,
    one_step_refused,
)
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, gossip, received
from fedcore.messages import MessageSchema

__all__ = ["DSGT", "PushDIGing", "PushDIGingState", "PushPull", "TrackingState"]

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
        raise one_step_refused(self.name)

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


class PushDIGingState(NamedTuple):
    """Push-sum's state (:class:`~fedcore.algorithms.ops.PushSumState`: ``x`` is the value
    ``u``), the mixed trackers ``ybar`` and the last gradients ``g`` (``[B, d]``)."""

    x: torch.Tensor
    omega: torch.Tensor
    silent: torch.Tensor
    ybar: torch.Tensor
    g: torch.Tensor


def _pushed(state: PushDIGingState) -> PushSumState:
    return PushSumState(state.x, state.omega, state.silent)


class PushDIGingRule(PushSumRule):
    """Push-DIGing: push-sum (step scale ``"none"``) stepping along the tracker, which is
    pushed with the same shares (see the module docstring)."""

    name = "push-diging"

    def __init__(self) -> None:
        """The paper's step on the value ``u`` (step scale ``"none"``)."""
        super().__init__("none")

    def __repr__(self) -> str:
        """The rule."""
        return "PushDIGingRule()"

    def init(self, params: torch.Tensor) -> PushDIGingState:  # type: ignore[override]
        """``u = params``, ``omega = 1``, the tracker at zero."""
        zero = torch.zeros_like(params)
        return PushDIGingState(*super().init(params), zero, zero.clone())

    def local_step(  # type: ignore[override]
        self, state: PushDIGingState, grad: torch.Tensor, rows: Rows
    ) -> PushDIGingState:
        """Refused: the tracker needs the gradient at every model it sends.

        Raises:
            AlgorithmError: always.
        """
        raise one_step_refused(self.name)

    def step(  # type: ignore[override]
        self, state: PushDIGingState, grad: torch.Tensor, rows: Rows
    ) -> tuple[PushDIGingState, Send]:
        """Complete the tracker with the gradient taken at ``u / omega``; push ``u - lr y``,
        ``omega`` and ``y`` with the push-sum shares."""
        y = state.ybar + grad - state.g
        pushed, send = super().step(_pushed(state), y, rows)
        tensors = {**send.tensors, "y": y}
        out = Send(tensors, send.scalars, weighted=True, to=send.to)
        return PushDIGingState(*pushed, y, grad), out

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """The shares of ``u`` (``"x"``), of the tracker ``"y"`` and of the weight
        ``"omega"`` in ``(0, n]``."""
        return _share_schema(rows.n or math.inf, "x", "y")

    def mix(  # type: ignore[override]
        self, state: PushDIGingState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[PushDIGingState, None]:
        """Push-sum's mix of ``u`` and ``omega``, and the same of the tracker: the own
        share kept, the shares that arrived added (a missing one is lost mass)."""
        mixed, _ = super().mix(_pushed(state), phase, inbox, rows)
        dtype = state.ybar.dtype
        ybar = state.ybar * self._own(_pushed(state), rows).to(dtype).unsqueeze(1)
        for slot in inbox:
            ybar.addcmul_(slot.tensors["y"], slot.arrived.to(dtype).unsqueeze(1))
        return PushDIGingState(*mixed, ybar, state.g), None


def _robust(robust: object, name: str) -> bool:
    """Check ``robust`` (a bool)."""
    _check_options(robust, "none", name)
    return bool(robust)


def DSGT(robust: bool = False) -> Rule:
    """DSGT: ``robust = false`` the rule :class:`DSGTRule`, ``robust = true`` the
    running-totals rule :class:`~fedcore.algorithms.robust_tracking.RobustDSGTRule`.

    Raises:
        ConfigError: ``robust`` is not a bool.
    """
    return RobustDSGTRule() if _robust(robust, "dsgt") else DSGTRule()


def PushPull(robust: bool = False) -> Rule:
    """Push-Pull: ``robust = false`` the rule :class:`PushPullRule`, ``robust = true`` the
    running-totals rule :class:`~fedcore.algorithms.robust_tracking.RobustPushPullRule`.

    Raises:
        ConfigError: ``robust`` is not a bool.
    """
    return RobustPushPullRule() if _robust(robust, "push-pull") else PushPullRule()


def PushDIGing(robust: bool = False) -> Rule:
    """Push-DIGing: ``robust = false`` the rule :class:`PushDIGingRule`, ``robust = true``
    the running-totals rule :class:`~fedcore.algorithms.robust_tracking.RobustPushDIGingRule`.

    Raises:
        ConfigError: ``robust`` is not a bool.
    """
    return RobustPushDIGingRule() if _robust(robust, "push-diging") else PushDIGingRule()
