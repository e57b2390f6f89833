"""The algorithm protocol: sans-I/O state machines over torch tensors.

An algorithm never touches a transport, a file or an event loop. Per round, the node

1. evaluates the loss and gradient at ``algorithm.model(state)``;
2. calls ``step(state, grad, ctx)``, which applies the local step and returns the
   messages of phase 0 as a mapping ``destination -> Payload``;
3. for each phase ``p`` in ``range(algorithm.phases)``: delivers what arrived from
   ``expected_senders(p, ctx)`` and calls ``mix(state, p, inbox, ctx)``, which returns
   the new state and the messages of phase ``p + 1`` (empty after the last phase).

A missing sender in an inbox (a dropped, late or crashed peer) is a legal input; each
algorithm's docstring says what it does then. Inbox tensors are read-only: in one process
the receivers of a payload share one decoded tensor, so never update them in place.
Inboxes are ordered by sender id, and messages are snapshots, so results do not depend on
the order nodes are processed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fedcore.compression import Codec
from fedcore.messages import Payload

__all__ = ["Algorithm", "Inbox", "Outbox", "RoundContext"]

Outbox = Mapping[str, Payload]
"""Messages to send: destination node id -> payload."""

Inbox = Mapping[str, Payload]
"""Messages that arrived: sender node id -> payload, in sorted sender order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundContext:
    """What a node knows about the current round of its communication graph.

    Attributes:
        node: This node's id.
        round: Round index, from 0.
        lr: Step size of this round (after any schedule).
        self_weight: Mixing weight of the self-loop.
        out_weights: Out-neighbour -> share of this node's value it receives.
        in_weights: In-neighbour -> share of that neighbour's value this node receives.
        nodes: Every node of the graph, in graph order (for algorithms that address all).
        codec: This node's codec, for algorithms that compress what they send themselves
            (DeepSqueeze, CHOCO); ``None`` means lossless.
    """

    node: str
    round: int
    lr: float
    self_weight: float
    out_weights: Mapping[str, float]
    in_weights: Mapping[str, float]
    nodes: tuple[str, ...] = ()
    codec: Codec | None = None


class Algorithm(Protocol):
    """A decentralized learning algorithm as a sans-I/O state machine.

    Attributes:
        name: Registry name.
        mixing: The weights it needs on the trust graph: ``"push-sum"`` (each sender's
            out-weights sum to 1; any strongly connected digraph), ``"doubly-stochastic"``
            (symmetric graph, Metropolis-Hastings by default), ``"complete"`` (uniform
            weights over every node, ignoring the trust graph), ``"all-pairs"`` (every
            ordered pair must be a trust edge: RPS) or ``"none"``.
        phases: Communication phases per round.

    An algorithm whose messages are not model-sized (RPS sends blocks) also defines
    ``message_shape(phase, sender, ctx) -> tuple[int, ...]``; the node checks every
    received tensor against it (against the model's shape otherwise).
    """

    name: str
    mixing: str
    phases: int

    def init(self, params: torch.Tensor) -> Any:
        """Return the initial state for initial parameters ``params``."""
        ...

    def model(self, state: Any) -> torch.Tensor:
        """The parameters the node predicts with and takes its gradient at."""
        ...

    def step(self, state: Any, grad: torch.Tensor, ctx: RoundContext) -> tuple[Any, Outbox]:
        """Apply the local step; return the new state and the phase-0 messages."""
        ...

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Who should send to this node in ``phase`` (sorted)."""
        ...

    def mix(self, state: Any, phase: int, inbox: Inbox, ctx: RoundContext) -> tuple[Any, Outbox]:
        """Incorporate ``inbox``; return the new state and the next phase's messages."""
        ...
