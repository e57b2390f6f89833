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

**What a receiver checks.** Every algorithm declares, per phase and sender, the exact
:class:`~fedcore.messages.MessageSchema` of what it sends (``message_schema``): tensor
names and shapes, scalar names and the values they can take. The node refuses anything
else before the algorithm sees it (strict mode: a :class:`~fedcore.errors.ProtocolError`
naming the sender; deadline mode: the message is counted as rejected and treated as
missing), so ``mix`` only ever gets inboxes of exactly that form. An algorithm whose state
makes some well-formed messages impossible (a running total that went backwards) also
defines ``accept(state, phase, sender, payload, ctx)``, which raises ``ProtocolError``.

What a peer trusts about its in-neighbours, and what it does not: it trusts nothing about
the *form* of a message (names, shapes, dtypes, the phase and round it claims, scalars out
of range, non-finite values: all refused), nor anything the schema can bound (a push-sum
weight is positive and at most the network's total mass). It does trust the *values* of
well-formed model tensors: a certified in-neighbour that sends a finite but wrong model
(a Byzantine peer) is mixed in like any other, as in every algorithm here; robust
aggregation against such peers is a different family of algorithms.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from fedcore.compression import Codec
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema, Payload, ScalarSpec

__all__ = [
    "Algorithm",
    "Inbox",
    "Outbox",
    "RoundContext",
    "check_phase",
    "local_step",
    "model_schema",
    "unions",
]

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
        lr: Step size of this round (after any schedule). An algorithm uses it only as the
            factor of ``grad`` in its local step (``lr * grad``): with a node optimizer
            (:mod:`fedcore.algorithms.optim`) the node passes the optimizer's direction
            ``u`` as ``grad`` and 1.0 here, so every algorithm steps by ``u`` where it
            stepped by ``lr * g``.
        self_weight: Mixing weight of the self-loop.
        out_weights: Out-neighbour -> share of this node's value it receives.
        in_weights: In-neighbour -> share of that neighbour's value this node receives.
        nodes: Every node of the graph, in graph order (for algorithms that address all).
        codec: This node's codec, for algorithms that compress what they send themselves
            (DeepSqueeze, CHOCO); ``None`` means lossless.
        deadline: Receivers go on without a message that does not come (deadline mode),
            so an algorithm may leave one out; in strict mode every expected message must
            be sent.
        samples: This node's number of training examples (0 when its stream has no fixed
            size): FedAvg's averaging weight.
        out_union, in_union: This node's out- and in-neighbours over every round of the
            run's graphs (a schedule's period), sorted: where an algorithm keeps state per
            edge (``()``: unknown, this round's are taken).
    """

    node: str
    round: int
    lr: float
    self_weight: float
    out_weights: Mapping[str, float]
    in_weights: Mapping[str, float]
    nodes: tuple[str, ...] = ()
    codec: Codec | None = None
    deadline: bool = False
    samples: int = 0
    out_union: tuple[str, ...] = ()
    in_union: tuple[str, ...] = ()


def unions(topology: Any, node: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``node``'s out- and in-neighbours over every round of ``topology``'s period, sorted
    (:attr:`RoundContext.out_union` and ``in_union``)."""
    graphs = [topology.at(t) for t in range(topology.period)]
    return (
        tuple(sorted({j for g in graphs for j in g.out_weights(node)})),
        tuple(sorted({j for g in graphs for j in g.in_weights(node)})),
    )


class Traits(Protocol):
    """What a caller needs to know about an algorithm, declared once on its class: typed
    class attributes with these defaults. A rule (a subclass of
    :class:`~fedcore.algorithms.rule.Rule`) inherits them; a per-message object that
    declares none gets the defaults when it is loaded (:func:`with_traits`)."""

    server: str | None = None
    """The node id of the server family's server (``topology.server``); ``None``: no
    server, peers only."""
    robust: bool = False
    """It sends running totals that grow without bound (robust push-sum): no codec whose
    error is relative to them, and float64 totals a graph edge in memory (``edge_totals``
    of the model's size, two unless the rule says more)."""
    fixed_graph: bool = False
    """It runs on one fixed graph: no topology schedule (CHOCO's copies of its
    neighbours' public models)."""
    asynchronous: bool = False
    """No rounds: it runs on the event engine."""
    holds_in_deadline_mode: bool = False
    """It holds a silent peer's pushes in deadline mode, which only the message engine
    models (push-sum)."""
    needs_every_message: bool = False
    """A lost message breaks it for good (CHOCO): no ``[faults]`` losses."""
    is_optimizer: bool = False
    """It is itself the optimizer (APMSqueeze): ``[optimizer]`` stays plain SGD."""


TRAITS = (
    "server",
    "robust",
    "fixed_graph",
    "asynchronous",
    "holds_in_deadline_mode",
    "needs_every_message",
    "is_optimizer",
)
"""The names of :class:`Traits`."""


def with_traits(algorithm: Any) -> Any:
    """``algorithm``, every trait of :class:`Traits` it does not declare set to its
    default (a per-message object of a user's, or one of the asynchronous algorithms);
    a rule has them all already. Returns the same object."""
    for name in TRAITS:
        if not hasattr(algorithm, name):
            setattr(algorithm, name, getattr(Traits, name))
    return algorithm


class Algorithm(Traits, Protocol):
    """A decentralized learning algorithm as a sans-I/O state machine.

    Attributes:
        name: Registry name.
        mixing: The weights it needs on the trust graph: ``"push-sum"`` (each sender's
            out-weights sum to 1; any strongly connected digraph), ``"doubly-stochastic"``
            (symmetric graph, Metropolis-Hastings by default), ``"complete"`` (uniform
            weights over every node, ignoring the trust graph), ``"all-pairs"`` (every
            ordered pair must be a trust edge: RPS) or ``"none"``.
        phases: Communication phases per round.

    ``message_schema`` says exactly what a message of each phase holds; the node checks
    every received message against it. An algorithm a user registers without one gets
    only the generic checks (model-shaped tensors of the model's dtype, finite values).
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

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """Exactly what ``sender`` sends this node in ``phase`` of round ``ctx.round``.

        Raises:
            AlgorithmError: ``sender`` sends this node nothing in ``phase`` (or no such phase).
        """
        ...


@runtime_checkable
class DeclaresMessages(Protocol):
    """An algorithm that says what its messages hold (every built-in one; a user's
    per-message algorithm without it gets only the generic checks)."""

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """See :meth:`Algorithm.message_schema`."""
        ...


@runtime_checkable
class AcceptsMessages(Protocol):
    """An algorithm whose state makes some well-formed messages impossible (robust
    push-sum: a running total never goes backwards)."""

    def accept(
        self, state: Any, phase: int, sender: str, payload: Payload, ctx: RoundContext
    ) -> None:
        """Raise :class:`~fedcore.errors.ProtocolError` if ``payload`` from ``sender``
        cannot be, given ``state``."""
        ...


@runtime_checkable
class SamplesTrainers(Protocol):
    """An algorithm in which a node does not train every round (the server family: the
    server never does, a worker only when sampled); an idle node's step gets a zero
    gradient."""

    def trains(self, ctx: RoundContext) -> bool:
        """Whether this node trains in round ``ctx.round``."""
        ...


def local_step(algorithm: Any, state: Any, grad: torch.Tensor, ctx: Any) -> Any:
    """One local step between communications (``run.local_steps``): the step an algorithm
    takes where its round applies ``lr * grad``, with no message.

    An algorithm that steps anywhere but on its state's ``x`` (push-sum with
    ``step_scale = "omega"``) defines ``local_step(state, grad, ctx)``; for every other the
    step is ``x <- x - ctx.lr * grad``. ``ctx`` is a :class:`RoundContext` (or the batched
    engine's round, whose ``keep`` leaves crashed nodes alone).

    Raises:
        AlgorithmError: the state has no ``x`` and the algorithm no ``local_step``.
    """
    own = getattr(algorithm, "local_step", None)
    if own is not None:
        return own(state, grad, ctx)
    x = getattr(state, "x", None)
    if not isinstance(x, torch.Tensor) or not hasattr(state, "_replace"):
        raise AlgorithmError(
            f"algorithm {getattr(algorithm, 'name', algorithm)!r} cannot take local steps "
            "(run.local_steps > 1): its state has no model x and it defines no local_step."
        )
    stepped = x - ctx.lr * grad
    keep = getattr(ctx, "keep", None)
    return state._replace(x=keep(stepped, x) if keep is not None else stepped)


def check_phase(name: str, phase: int, phases: int = 1) -> None:
    """Raise :class:`~fedcore.errors.AlgorithmError` unless ``0 <= phase < phases``."""
    if not 0 <= phase < phases:
        raise AlgorithmError(
            f"{name} has {phases} phase{'s' if phases > 1 else ''} a round "
            f"({', '.join(map(str, range(phases)))}), not phase {phase}."
        )


@functools.lru_cache(maxsize=256)
def model_schema(*names: str, **scalars: ScalarSpec) -> MessageSchema:
    """A message of model-shaped tensors ``names`` and the given scalars (one object per
    distinct schema: receivers ask for it once per message)."""
    return MessageSchema(tensors=dict.fromkeys(names), scalars=scalars)
