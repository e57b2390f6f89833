"""One update rule for every engine: an algorithm written once over a leading peer axis.

A :class:`Rule` is the extension point for algorithms. It is sans-I/O math over ``B``
stacked peers: every tensor of its state, its gradients and its messages has a leading
axis of ``B`` rows. Each engine owns its adapter: a gRPC peer and the message engine run
it with ``B = 1`` (through :class:`fedcore.node.rule.NodeRule`, which speaks the node's
per-message :class:`~fedcore.algorithms.base.Algorithm` protocol); the vectorized engine
runs it with ``B = N``, every peer at once (through
:class:`fedcore.engines.batched.BatchedRule`). One implementation, so the engines agree by
construction.

Per round, with :class:`Rows` saying what the ``B`` peers know:

1. ``step(state, grad, rows)`` takes the local step and returns the new state and what each
   row sends in phase 0, a :class:`Send`: named ``[B, ...]`` tensors and ``[B]`` scalars,
   the same content to every receiver of the phase.
2. For each phase ``p``: ``mix(state, p, inbox, rows)`` gets the inbox, one :class:`Slot`
   per in-neighbour (in sorted sender order, as every engine orders them): the sender's
   tensors and scalars as ``[B, ...]`` rows, the mixing weight ``W_ji`` and whether the
   message arrived. It returns the new state and the next phase's :class:`Send` (``None``
   after the last phase, or when nothing is sent).

A message that did not arrive (lost, late, from a crashed peer) is a legal input: its slot
says ``arrived = False`` and its values must not be read (they are zeros on a peer and
stale on the vectorized engine; multiply by a 0/1 coefficient built from ``arrived``, as
:func:`gossip` does). A crashed peer runs nothing: the vectorized engine keeps its rows of
the state as they were, so a rule never needs to know.

Who sends to whom: ``pattern`` names it, and with it the inbox a rule gets:
``"neighbours"`` (every edge of the round's communication graph, the weights of ``mixing``;
a :class:`Slot` per in-neighbour), ``"chosen"`` (``talks(phase, rows)`` names each phase's
senders and receivers; what arrived as one :class:`Gathered` list), ``"edges"`` (one
message per edge, state per edge of the run's graphs: :class:`Edges`, an
:class:`EdgeInbox`; an optional ``widths(phase, rows)`` gives each edge's message its own
length, :func:`widths_of`) or ``"none"``. The message schema (tensor
names, scalars and the values they may take) comes from ``schema(phase)``; every receiver
checks each message against it before the rule sees it, and the vectorized engine counts
traffic from it (``nbytes`` of the model-shaped tensors plus 8 bytes a scalar), so both
engines report the same bytes.

Compression: the node's codec encodes every tensor of a :class:`Send`, unless the rule's
optional ``lossless(phase, rows)`` says the phase's tensors go as they are (``raw``). A
rule that must know exactly what receivers decode (error feedback: DeepSqueeze, CHOCO)
calls ``rows.compress(v)``, which returns the decoded ``C(v)``; sending that same tensor sends the
already-encoded bytes, not a second encoding.

Writing one: subclass :class:`Rule` (the declaration that makes an object a rule); see
``examples/user_algorithm/`` and "Write your own algorithm" in ``docs/writing-your-own.md``.
The registry (:data:`fedcore.algorithms.ALGORITHMS`) holds each built-in rule;
``algorithm.name = "pkg.module:factory"`` loads a user's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import torch

from fedcore.algorithms.base import Traits
from fedcore.algorithms.inbox import (
    EdgeInbox,
    Edges,
    Gathered,
    SenderRows,
    Slot,
    add_slot,
    gossip,
    pull,
    received,
    spent,
)
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema

__all__ = [
    "EdgeInbox",
    "Edges",
    "Gathered",
    "Rows",
    "Rule",
    "Send",
    "SenderRows",
    "Slot",
    "add_slot",
    "gossip",
    "is_rule",
    "lossless",
    "pull",
    "received",
    "schema_of",
    "schema_takes_rows",
    "spent",
    "widths_of",
]

_TOTAL = torch.float64


@dataclass(frozen=True, eq=False)
class Send:
    """What each of ``B`` peers sends in one phase: the same to every receiver, or (a rule
    whose pattern is ``"edges"``) one message per out-edge.

    Attributes:
        tensors: Name -> ``[B, *model shape]`` rows, or ``[Eo, ...]`` per out-edge of
            :attr:`Rows.edges` (pattern ``"edges"``; only this round's edges are sent). A
            row of ``rows.compress`` output is sent as it was encoded.
        scalars: Name -> ``[B]`` values (float64 on the wire).
        weighted: Each receiver ``j`` gets every tensor and scalar times the share
            ``W_ij`` the sender pushes to it (push-sum); one message per distinct share,
            so a sender encodes each once.
        to: ``[B]`` bool: the rows that send at all (``None``: every row). A row that
            sends nothing is a missing message at its receivers; only deadline mode
            allows it (a peer of a strict run must send every expected message).
        shared: Pattern ``"edges"``: the tensors are ``[B, ...]`` rows, and each row's is
            the message on every one of its out-edges (encoded once).
    """

    tensors: Mapping[str, torch.Tensor]
    scalars: Mapping[str, torch.Tensor] = field(default_factory=dict)
    weighted: bool = False
    to: torch.Tensor | None = None
    shared: bool = False


Compress = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None], torch.Tensor
]
"""An engine's codec round trip: ``(v, where, owners, width)``, ``owners`` the row of each
row of ``v`` (``None``: row ``i`` is peer row ``i``), ``width`` how many leading values of
each row make its message (``None``: all)."""


class Rows:
    """What ``B`` peers know about one round (the rule's context).

    Attributes:
        round: Round index.
        lr: The factor of ``grad`` in the local step (1.0 with a node optimizer, whose
            direction then comes as ``grad``).
        self_weight: ``[B]`` float64: ``W_ii``.
        in_degree: ``[B]`` long: in-neighbours of this round's graph.
        b: Number of rows.
        n: Peers in the network (0: unknown; bounds in message schemas).
        deadline: Receivers go on without a missing message (deadline mode).
        ids: The node ids of the rows (``b`` of them; empty where unknown).
        nodes: Every node of the network, in graph order.
        samples: ``[B]`` float64: each peer's number of training examples (0 for a stream
            with no fixed size, or a peer that holds no data).
        edges: The rows' edges over the run's graphs (pattern ``"edges"``; else ``None``).
        codec: The peers' codec name (``""``: tensors are sent as they are).
        index: ``[B]`` long: each row's index in :attr:`nodes`.
    """

    def __init__(
        self,
        *,
        round: int,
        lr: float,
        self_weight: torch.Tensor,
        compress: Compress | None = None,
        fail: Callable[[torch.Tensor, str], None] | None = None,
        in_degree: torch.Tensor | None = None,
        n: int = 0,
        deadline: bool = False,
        ids: tuple[str, ...] = (),
        nodes: tuple[str, ...] = (),
        samples: torch.Tensor | None = None,
        edges: Edges | None = None,
        codec: str = "",
        index: torch.Tensor | None = None,
    ) -> None:
        """An engine builds this; a rule only reads it. ``compress`` (default: lossless)
        and ``fail`` (default: raise :class:`~fedcore.errors.AlgorithmError` naming the
        first bad row) are the engine's (a unit test may leave them out)."""
        self.round = round
        self.lr = lr
        self.self_weight = self_weight
        self.b = int(self_weight.shape[0])
        device = self_weight.device
        self.in_degree = (
            in_degree
            if in_degree is not None
            else torch.zeros(self.b, dtype=torch.long, device=device)
        )
        self.n = n
        self.deadline = deadline
        self.ids = ids
        self.nodes = nodes
        self.samples = (
            samples if samples is not None else torch.zeros(self.b, dtype=_TOTAL, device=device)
        )
        self.edges = edges
        self.codec = codec
        self.index = index if index is not None else torch.arange(self.b, device=device)
        self._compress = compress or _lossless
        self._fail = fail or _fail_first

    def compress(
        self,
        v: torch.Tensor,
        where: torch.Tensor | None = None,
        width: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``C(v)`` per row with each peer's codec: exactly what receivers will decode of
        it. ``where`` (``[B]`` bool) limits it to the peers that send it (the others' rows
        come back as they are, and their codecs draw nothing). ``width`` (``[B]`` long, for
        ``v [B, w]``) sends only each row's first ``width`` values (a rule's ``widths``);
        the rest come back as they are. A compressed row that is not finite stops the run
        (the peer diverged). With a lossless codec the result may be ``v`` itself: read it,
        never update it in place.

        Raises:
            AlgorithmError: a row of ``v`` is not finite.
        """
        bad = ~torch.isfinite(v.reshape(v.shape[0], -1).sum(dim=1))
        self.check(bad if where is None else bad & where, _DIVERGED)
        return self._compress(v, where, None, width)

    def compress_edges(self, v: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
        """``C(v)`` of one row per out-edge (``v [Eo, ...]``, pattern ``"edges"``), each
        encoded by the edge's sender's codec, in edge order; ``where`` (``[Eo]`` bool)
        limits it to the edges that carry it.

        Raises:
            AlgorithmError: a row of ``v`` is not finite.
        """
        edges = self.edges
        if edges is None:
            raise AlgorithmError("compress_edges needs a rule whose pattern is 'edges'.")
        bad = ~torch.isfinite(v.reshape(v.shape[0], -1).sum(dim=1))
        if where is not None:
            bad = bad & where
        self.check(edges.out_total(bad.to(_TOTAL)) > 0, _DIVERGED)
        return self._compress(v, where, edges.out_row, None)

    def check(self, bad: torch.Tensor, why: str) -> None:
        """Stop the run if a row of ``bad`` (``[B]`` bool) is set; ``why`` is formatted
        with ``node`` and ``round``.

        Raises:
            AlgorithmError: some row is bad (the vectorized engine on a GPU raises later).
        """
        self._fail(bad, why)


_DIVERGED = (
    "node {node} diverged at round {round}: the vector to compress is not finite. "
    "Lower algorithm.lr or the consensus step, or use a codec with a smaller error."
)


def _lossless(
    v: torch.Tensor,
    where: torch.Tensor | None,
    owners: torch.Tensor | None,
    width: torch.Tensor | None,
) -> torch.Tensor:
    return v.clone()


def _fail_first(bad: torch.Tensor, why: str) -> None:
    if bool(bad.any()):
        first = int(torch.nonzero(bad)[0])
        raise AlgorithmError(why.format(node=f"row {first}", round="?"))


@runtime_checkable
class Rule(Traits, Protocol):
    """An algorithm written once over ``B`` stacked peers (see the module docstring).

    A rule says it is one by subclassing this class (``class MyRule(Rule):``): fedcore
    runs an object as a rule only when its class declares it so (:func:`is_rule`), never
    because it happens to have these attributes. What a caller needs to know about it
    (a server, robust totals, a fixed graph, ...) are its
    :class:`~fedcore.algorithms.base.Traits`, class attributes it inherits with their
    defaults and sets where they differ.

    Attributes:
        name: Registry name.
        mixing: The weights it needs on the trust graph (as
            :class:`~fedcore.algorithms.base.Algorithm`'s ``mixing``).
        phases: Communication phases a round.
        pattern: Who sends to whom: ``"neighbours"`` (every edge, an inbox of slots),
            ``"chosen"`` (``talks(phase, rows)`` names the senders and receivers of each
            phase among the graph's edges; a :class:`Gathered` inbox), ``"edges"`` (a
            message per out-edge; :attr:`Rows.edges`, an :class:`EdgeInbox`) or ``"none"``.
    """

    name: str
    mixing: str
    phases: int
    pattern: str

    def init(self, params: torch.Tensor) -> Any:
        """The state of ``B`` peers starting from ``params [B, d]``: a NamedTuple of
        tensors with a leading ``B`` axis."""
        ...

    def model(self, state: Any) -> torch.Tensor:
        """``[B, d]``: the parameters each peer predicts with and takes its gradient at."""
        ...

    def step(self, state: Any, grad: torch.Tensor, rows: Rows) -> tuple[Any, Send | None]:
        """The local step with ``grad [B, d]``; the new state and phase 0's messages."""
        ...

    def mix(self, state: Any, phase: int, inbox: Any, rows: Rows) -> tuple[Any, Send | None]:
        """Take in ``inbox`` (by :attr:`pattern`: a list of :class:`Slot`, a
        :class:`Gathered` or an :class:`EdgeInbox`); the new state and the next phase's
        messages."""
        ...

    schema: Callable[..., MessageSchema]
    """``schema(phase)``: exactly what a message of ``phase`` holds (a rule may take
    ``rows`` as a second argument, for bounds that depend on the network size or the
    round: :func:`schema_of`)."""

    # -- optional hooks: a rule defines the ones it offers (as methods); ``None``: not
    # offered, and every engine does what it does without one. Read as plain attributes.

    trains: Callable[[Rows], torch.Tensor] | None = None
    """``trains(rows)``: ``[B]`` bool, the rows that compute a gradient this round (the
    server family); ``None``: every row trains."""
    talks: Callable[[int, Rows], tuple[Any, Any]] | None = None
    """``talks(phase, rows)``: ``(senders, receivers)`` of ``phase`` among the graph's edges
    (pattern ``"chosen"``, which needs it)."""
    lossless: Callable[[int, Rows], bool] | None = None
    """``lossless(phase, rows)``: whether ``phase``'s tensors go as they are (``raw``),
    whatever the codec (:func:`~fedcore.algorithms.rule.lossless`); ``None``: never."""
    local_step: Callable[[Any, torch.Tensor, Rows], Any] | None = None
    """``local_step(state, grad, rows)``: one local step between communications
    (``run.local_steps``); ``None``: ``x <- x - rows.lr * grad``."""
    accept: Callable[[Any, int, str, Any, Any], None] | None = None
    """``accept(state, phase, sender, payload, ctx)``: raise
    :class:`~fedcore.errors.ProtocolError` for a well-formed message ``state`` makes
    impossible (a peer's check, :class:`~fedcore.algorithms.base.AcceptsMessages`);
    ``None``: every well-formed message is possible."""
    widths: Callable[[int, Rows], tuple[torch.Tensor, torch.Tensor]] | None = None
    """``widths(phase, rows)`` (pattern ``"edges"``): each edge's message length
    (:func:`widths_of`); ``None``: every message holds the schema's shapes."""
    edge_fields: Mapping[str, str] = MappingProxyType({})
    """Pattern ``"edges"``: state field -> ``"out"`` or ``"in"``, the fields of the state
    kept per out- or in-edge (a crashed peer's edges keep theirs); other fields are per
    row."""


def schema_takes_rows(rule: Any) -> bool:
    """Whether ``rule.schema`` takes ``rows`` as well as ``phase`` (read once per class)."""
    kind = type(rule)
    takes = _TAKES_ROWS.get(kind)
    if takes is None:
        try:
            takes = len(inspect.signature(rule.schema).parameters) >= 2  # phase, rows
        except (TypeError, ValueError):
            takes = False
        _TAKES_ROWS[kind] = takes
    return takes


def schema_of(rule: Any, phase: int, rows: Rows) -> MessageSchema:
    """``rule.schema(phase, rows)``, or ``rule.schema(phase)`` for a rule that takes no rows."""
    schema: MessageSchema = (
        rule.schema(phase, rows) if schema_takes_rows(rule) else rule.schema(phase)
    )
    return schema


_TAKES_ROWS: dict[type, bool] = {}
"""Rule class -> whether its ``schema`` takes ``rows``."""


def lossless(rule: Any, phase: int, rows: Rows) -> bool:
    """Whether the tensors a rule sends in ``phase`` go as they are (``raw``), whatever the
    peers' codec (its optional ``lossless(phase, rows)``; APMSqueeze's warm-up)."""
    says = rule.lossless
    return bool(says(phase, rows)) if says is not None else False


def widths_of(rule: Any, phase: int, rows: Rows) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A rule's messages of ``phase`` edge by edge (its optional ``widths(phase, rows)``,
    pattern ``"edges"``): ``(out [Eo], in [Ei])`` long, how many leading values of each
    ``(w,)`` tensor of the schema the message on that edge holds, 0 where no message goes
    (RPS's blocks). ``None``: every message holds the schema's shapes."""
    says = rule.widths
    if says is None:
        return None
    out, into = says(phase, rows)
    return out, into


RULE_MEMBERS = ("name", "mixing", "phases", "init", "model", "step", "mix", "schema", "pattern")
"""What every rule has (the optional methods aside)."""


def is_rule(obj: object) -> bool:
    """Whether ``obj`` is declared a :class:`Rule`: its class subclasses :class:`Rule` (as
    every built-in rule does). Declared, never guessed from attributes: an
    object that hands unknown attributes on to another (``__getattr__``) has them all, and
    is still whatever its own class says (a per-message algorithm, say)."""
    return Rule in type(obj).__mro__
