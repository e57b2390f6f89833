"""Two reference points for every experiment: LOCAL and CENTRAL.

* LOCAL: each node runs SGD on its own data and never communicates. Under label skew
  its per-node accuracy shows what a peer gets alone.
* CENTRAL: every node receives the exact average of all nodes' post-step models each
  round (adapt-then-combine with ``W = 11^T / n``), i.e. minibatch SGD on the union of
  the data. It ignores the trust graph: it is the upper reference, not a deployable
  algorithm. The average is summed in global node order and divided by ``n``, so every
  node holds bit-identical parameters.

With a node optimizer (``[optimizer]``), its direction ``u`` replaces ``lr * g`` in both;
CENTRAL's nodes then each keep their own optimizer state over bit-identical models.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.base import Inbox, Outbox, RoundContext, check_phase, model_schema
from fedcore.algorithms.rule import Rows, Slot, per_peer
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema, Payload

__all__ = ["Central", "Local", "LocalRule", "ModelOnly", "ModelState"]


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


class LocalRule(ModelOnly):
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


Local = per_peer(LocalRule)


class Central(ModelOnly):
    """Exact averaging of all nodes' post-step models every round."""

    name = "central"
    mixing = "complete"

    def step(
        self, state: ModelState, grad: torch.Tensor, ctx: RoundContext
    ) -> tuple[ModelState, Outbox]:
        """SGD step, then send the result to every other node."""
        x = state.x - ctx.lr * grad
        return ModelState(x), dict.fromkeys(ctx.out_weights, Payload({"x": x}))

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Every other node."""
        return tuple(ctx.in_weights)

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """The sender's post-step model ``"x"``, nothing else."""
        check_phase(self.name, phase)
        return model_schema("x")

    def mix(
        self, state: ModelState, phase: int, inbox: Inbox, ctx: RoundContext
    ) -> tuple[ModelState, Outbox]:
        """Average over the node itself and what arrived, summed in global node order."""
        values = dict(inbox.items())
        values[ctx.node] = Payload({"x": state.x})
        order = ctx.nodes or tuple(sorted(values))
        present = [values[n].tensor("x") for n in order if n in values]
        if not present:
            raise AlgorithmError(f"node {ctx.node}: nothing to average at round {ctx.round}.")
        total = torch.zeros_like(state.x)
        for t in present:
            total.add_(t)
        return ModelState(total / len(present)), {}
