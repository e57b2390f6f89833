"""Momentum gossip: gossip averaging (D-PSGD, combine-then-adapt) with local heavy-ball
momentum, written once as a fedcore update rule, outside the package.

Each peer ``i`` keeps its model ``x_i`` and a momentum buffer ``m_i``. With doubly
stochastic weights ``W`` (symmetric graph, Metropolis-Hastings) and the gradient ``g_i``
taken at its own model, one round is::

    m_i = beta * m_i + g_i                    (heavy ball, kept locally)
    send x_i to every neighbour
    x_i = sum_j W_ji x_j - lr * m_i           (average the pre-step models, then step)

This is D-PSGD (Lian et al., "Can Decentralized Algorithms Outperform Centralized
Algorithms?", NeurIPS 2017) with Polyak's heavy-ball momentum kept locally by each peer: the
decentralized momentum SGD (DSGDm) that decentralized deep-learning papers use as their
momentum baseline (e.g. Lin, Karimireddy, Stich, Jaggi, "Quasi-Global Momentum", ICML 2021).
With ``beta = 0`` it is D-PSGD, bit for bit. The mean model moves by the mean of the
``lr * m_i``, because ``W`` is doubly stochastic. A message that does not arrive counts as the
peer's own model (its weight moves to the self weight), as in fedcore's ``dpsgd``.

Every tensor has a leading axis of ``B`` rows, one per peer: ``B = 1`` on a gRPC peer and
in the message engine, ``B = N`` (every peer at once) in the vectorized engine. Use it with
``algorithm.name = "momentum_gossip:MomentumGossip"`` and ``algorithm.beta`` (see
``run.toml`` here and "Write your own algorithm" in ``docs/writing-your-own.md``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, gossip
from fedcore.errors import ConfigError
from fedcore.messages import MessageSchema


class MomentumState(NamedTuple):
    """The rule's state, every field ``[B, ...]``: the models ``x [B, d]``, the momentum
    buffers ``momentum [B, d]``, and the steps waiting for the mix (``pending``: ``[B, d]``
    between step and mix, ``[B, 0]`` between rounds)."""

    x: torch.Tensor
    momentum: torch.Tensor
    pending: torch.Tensor


class MomentumGossip(Rule):  # subclassing Rule declares it an update rule
    """Gossip averaging with local heavy-ball momentum (see the module docstring)."""

    name = "momentum-gossip"  # names runs and checkpoints
    mixing = "doubly-stochastic"  # the weights it needs: symmetric, doubly stochastic
    phases = 1  # communication phases a round
    pattern = "neighbours"  # sends to every neighbour of the graph

    def __init__(self, beta: float = 0.9) -> None:
        """``beta`` in [0, 1): the momentum (``algorithm.beta`` in the config)."""
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not 0 <= beta < 1:
            raise ConfigError(f"algorithm.beta = {beta!r} must be a number in [0, 1), e.g. 0.9.")
        self.beta = float(beta)

    def init(self, params: torch.Tensor) -> MomentumState:
        """Start from ``params [B, d]`` with no momentum."""
        empty = params.new_zeros((params.shape[0], 0))
        return MomentumState(params.clone(), torch.zeros_like(params), empty)

    def model(self, state: MomentumState) -> torch.Tensor:
        """The models the peers predict with and take their gradients at."""
        return state.x

    def step(
        self, state: MomentumState, grad: torch.Tensor, rows: Rows
    ) -> tuple[MomentumState, Send]:
        """Update the momentum, keep the step for the mix, send the pre-step models."""
        momentum = self.beta * state.momentum + grad
        pending = rows.lr * momentum
        return MomentumState(state.x, momentum, pending), Send({"x": state.x})

    def schema(self, phase: int) -> MessageSchema:
        """A message holds one model-shaped tensor, ``"x"``; receivers refuse anything else."""
        return model_schema("x")

    def mix(
        self, state: MomentumState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[MomentumState, None]:
        """Average with the neighbours' models that arrived, then apply the step."""
        x = gossip(state.x, rows.self_weight, inbox) - state.pending
        return MomentumState(x, state.momentum, state.pending[:, :0]), None

    def local_step(self, state: MomentumState, grad: torch.Tensor, rows: Rows) -> MomentumState:
        """A step between communications (``run.local_steps > 1``), with the momentum."""
        momentum = self.beta * state.momentum + grad
        return MomentumState(state.x - rows.lr * momentum, momentum, state.pending)
