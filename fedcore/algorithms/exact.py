"""Exact Diffusion: the optimum of the sum on an undirected graph with a constant step,
one tensor per edge a round.

Yuan, Ying, Zhao and Sayed, "Exact diffusion for distributed optimization and learning",
IEEE TSP 2019 (Part I: the algorithm; Part II: its linear convergence and a wider stability
range than EXTRA's). Adapt, correct, combine, with ``Wbar = (I + W) / 2`` and ``W`` the
doubly stochastic gossip weights::

    psi_{t+1} = x_t - lr g(x_t)               (adapt; psi_0 = x_0)
    phi_{t+1} = psi_{t+1} + x_t - psi_t       (correct)
    send        phi_{t+1}
    x_{t+1}   = sum_j Wbar_ij phi_j           (combine)

In ``x`` alone: ``x_{t+1} = Wbar (2 x_t - x_{t-1} - lr (g_t - g_{t-1}))``, which is NIDS
(Li, Shi and Yan, IEEE TSP 2019) with one step for every peer: NIDS lets each peer take
its own step ``lr_i`` (its mixing ``I - c diag(lr) (I - W)``), and with equal steps and
``c = 1 / (2 lr)`` it is this recursion. Its step bound is gradient descent's own,
independent of the graph (Li and Yan's analysis of NIDS), where EXTRA's (Shi et al. 2015) is
smaller and depends on the graph's weights.

Invariant: ``Wbar`` is doubly stochastic, so ``sum_i (x_i - psi_i)`` is kept by every round
in which every message arrives, and it starts at 0: the peers' mean moves exactly as
centralized gradient descent on the mean loss, ``mean x_{t+1} = mean x_t - lr mean g_t``.
A fixed point is a consensus (``phi = x``, ``x = Wbar x``), and the invariant makes it the
point where the gradients sum to zero: the minimiser of ``sum_i f_i``, with a constant step.

A lost message (``faults.drop``, a crashed or late peer): its share goes to the receiver
itself, as D-PSGD does, so each row of the mix stays stochastic but its column no longer
sums to one. The sum ``sum_i (x_i - psi_i)`` then moves by ``Wbar_ij (phi_i - phi_j)``: the
peers still reach a consensus, but at the point where ``lr sum_i g_i`` equals what the lost
shares moved, not the optimum (what a loss moves shrinks as the peers agree): exactness
holds over reliable links only. A lossy codec likewise mixes ``C(phi_j)`` for ``phi_j``.

With a node optimizer its direction takes the gradient's place. ``run.local_steps > 1`` is
refused: the correction ``x_t - psi_t`` holds one gradient step, and with several the fixed
point is no longer the optimum of the sum (local drift).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, gossip, spent
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema

__all__ = ["ExactDiffusion", "ExactDiffusionRule", "ExactDiffusionState"]


class ExactDiffusionState(NamedTuple):
    """``B`` peers' models ``x``, their last adapted models ``psi`` (``x_0`` at the start)
    and the corrected models ``phi`` waiting for the mix (``[B, d]`` between step and mix,
    ``[B, 0]`` between rounds)."""

    x: torch.Tensor
    psi: torch.Tensor
    phi: torch.Tensor


class ExactDiffusionRule(Rule):
    """Exact Diffusion, adapt-correct-combine (see the module docstring)."""

    name = "exact-diffusion"
    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"

    def init(self, params: torch.Tensor) -> ExactDiffusionState:
        """Start from ``params`` with ``psi_0 = x_0`` (no correction in the first round)."""
        return ExactDiffusionState(
            params.clone(), params.clone(), params.new_zeros((params.shape[0], 0))
        )

    def model(self, state: ExactDiffusionState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def local_step(
        self, state: ExactDiffusionState, grad: torch.Tensor, rows: Rows
    ) -> ExactDiffusionState:
        """Refused: the correction holds exactly one gradient step.

        Raises:
            AlgorithmError: always.
        """
        raise AlgorithmError(
            f"{self.name!r} corrects by the one gradient step of the last round: "
            "set run.local_steps = 1."
        )

    def step(
        self, state: ExactDiffusionState, grad: torch.Tensor, rows: Rows
    ) -> tuple[ExactDiffusionState, Send]:
        """Adapt and correct; send ``phi = psi_new + x - psi``."""
        psi = state.x - rows.lr * grad
        phi = psi + (state.x - state.psi)
        return ExactDiffusionState(state.x, psi, phi), Send({"phi": phi})

    def schema(self, phase: int) -> MessageSchema:
        """The corrected model ``"phi"``, nothing else."""
        return model_schema("phi")

    def mix(
        self, state: ExactDiffusionState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[ExactDiffusionState, None]:
        """``x <- Wbar phi``, ``Wbar = (I + W) / 2``: half of each ``W_ji`` from ``j`` and
        the rest to the peer itself (a missing share to the peer itself too)."""
        half = [
            Slot(
                s.tensors,
                s.scalars,
                s.weight * 0.5,
                s.arrived,
                None if s.one is None else (s.one[0] * 0.5, s.one[1]),
                s.sender,
            )
            for s in inbox
        ]
        own = (rows.self_weight + 1.0) * 0.5
        x = gossip(state.phi, own, half, "phi")
        return ExactDiffusionState(x, state.psi, spent(state.phi)), None


ExactDiffusion = ExactDiffusionRule
