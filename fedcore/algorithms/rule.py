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
``examples/user_algorithm/`` and the README's "Write your own algorithm".
The registry (:data:`fedcore.algorithms.ALGORITHMS`) holds each built-in rule;
``algorithm.name = "pkg.module:factory"`` loads a user's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from fedcore.algorithms.base import Traits
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

ROW_BY_ROW = 1 << 16
"""Values per row from which :func:`add_slot` adds a slot's rows one by one, each read
where its sender holds it, instead of gathering the slot's ``[B, d]`` copy first (a pass
over the whole stack that a large model pays per slot; below this, one gather and one
batched op beat ``B`` small ops). Either way each row gets the same elementwise op, so
the bits do not depend on it."""


class SenderRows(Mapping[str, torch.Tensor]):
    """Received tensors as rows of the senders' stacked tensors (``values[name][rows[m]]``
    is what message ``m``, or peer ``m`` of a slot, received): gathered into ``[M, ...]``
    only when a rule reads them (so a round never holds every slot's copy at once), or
    added row by row from where they are (:func:`add_slot`, :meth:`Gathered.total`)."""

    def __init__(
        self,
        values: Mapping[str, torch.Tensor],
        rows: torch.Tensor | Mapping[str, torch.Tensor],
    ) -> None:
        """``values``: name -> the senders' ``[N, ...]`` tensor; ``rows``: ``[M]`` long,
        one for every name or one per name."""
        self._values = values
        self._rows = rows
        self._listed: dict[str, list[int]] = {}

    def rows(self, name: str) -> torch.Tensor:
        """``[M]`` long: the row of ``values[name]`` that each message is."""
        return self._rows if isinstance(self._rows, torch.Tensor) else self._rows[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._values[name].index_select(0, self.rows(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def stack(self, name: str) -> torch.Tensor:
        """The senders' ``[N, ...]`` tensor ``name``."""
        return self._values[name]

    def source(self, name: str) -> tuple[torch.Tensor, list[int]]:
        """``(the senders' [N, ...] tensor, the row of each of the M messages)``."""
        return self._values[name], self._rows_listed(name)

    def _rows_listed(self, name: str) -> list[int]:
        listed = self._listed.get(name)
        if listed is None:
            listed = self._listed[name] = self.rows(name).tolist()
        return listed


def _row_by_row(tensors: Mapping[str, torch.Tensor], name: str) -> bool:
    """Whether the rows of ``tensors[name]`` are best added one by one where their senders
    hold them (see :data:`ROW_BY_ROW`)."""
    if not isinstance(tensors, SenderRows):
        return False
    source = tensors.stack(name)
    return source.device.type == "cpu" and source.dim() == 2 and source.shape[1] >= ROW_BY_ROW


def _exact_in(kind: torch.dtype, source: torch.dtype, weights: torch.Tensor | None) -> bool:
    """Whether ``float64 += float32 * w`` is exact in its product for every weight: float32
    values (24-bit significands) times integers below ``2**29`` fit float64's 53 bits, so
    one fused multiply-add rounds as the product-then-sum does."""
    if kind != torch.float64 or source != torch.float32:
        return False
    if weights is None or weights.numel() == 0:
        return True
    return bool((weights == weights.round()).all()) and float(weights.abs().max()) < 2**29


def add_slot(
    out: torch.Tensor,
    slot: Slot,
    name: str,
    coef: torch.Tensor,
    base: torch.Tensor | None = None,
) -> None:
    """``out += (slot.tensors[name] - base) * coef`` in place (``base`` omitted: 0;
    ``coef`` ``[B, 1]``). A large model's slot held as :class:`SenderRows` on the CPU is
    added row by row where each sender holds it (:data:`ROW_BY_ROW`), with the same
    elementwise op per row as the batched one."""
    tensors = slot.tensors
    if _row_by_row(tensors, name):
        assert isinstance(tensors, SenderRows)
        values, rows = tensors.source(name)
        for b, j in enumerate(rows):
            value = values[j] if base is None else values[j] - base[b]
            out[b].addcmul_(value, coef[b])
        return
    value = tensors[name] if base is None else tensors[name] - base
    out.addcmul_(value, coef)


@dataclass(frozen=True, eq=False)
class Slot:
    """One in-neighbour slot of ``B`` peers' inboxes in one phase.

    Attributes:
        tensors: The sender's tensors, decoded, ``[B, ...]`` (read only).
        scalars: The sender's scalars, ``[B]`` float64.
        weight: ``W_ji``, the share of the sender's value this peer receives, ``[B]``
            float64 (0 in a padding slot of a peer with fewer in-neighbours).
        arrived: ``[B]`` bool: the message arrived (never in a padding slot).
        one: On one peer (``B = 1``): ``(W_ji, arrived)`` as Python values, so a helper
            can skip tensor ops on one-element tensors (``None``: read ``weight`` and
            ``arrived``).
    """

    tensors: Mapping[str, torch.Tensor]
    scalars: Mapping[str, torch.Tensor]
    weight: torch.Tensor
    arrived: torch.Tensor
    one: tuple[float, bool] | None = None


@dataclass(frozen=True, eq=False)
class Gathered:
    """The messages that arrived at ``B`` peers in one phase, as one list (the inbox of a
    rule whose ``pattern`` is ``"chosen"``: a peer may hear from many senders, as a server
    from its workers, where a table of padded slots would not scale).

    Messages are grouped by receiver, each receiver's in sorted sender order; only the
    ones that arrived are listed. Reduce them with :meth:`total`, :meth:`scalar_total`
    and :meth:`heard`: each adds a receiver's messages one after another in that order, on
    a peer and on the vectorized engine alike.

    Attributes:
        tensors: Name -> ``[M, ...]``, message ``m``'s decoded tensor.
        scalars: Name -> ``[M]`` float64.
        dst: ``[M]`` long: the row (``0 .. B-1``) that received message ``m``.
        b: Number of rows.
    """

    tensors: Mapping[str, torch.Tensor]
    scalars: Mapping[str, torch.Tensor]
    dst: torch.Tensor
    b: int

    def total(
        self,
        name: str,
        weight: str | None = None,
        dtype: torch.dtype | None = None,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, ...]``: per row, the sum of the tensors ``name`` that arrived, each times
        its scalar ``weight`` if given, summed in ``dtype`` (default: the tensors').

        ``rows`` (``[K]`` long, ascending): only those rows, as ``[K, ...]`` (each the same
        bits as its row of the whole total): a server's row, where no other row heard."""
        tensors = self.tensors
        if _row_by_row(tensors, name):
            # A large model: each message added where its sender holds it, one after
            # another in message order, as index_add_ adds them.
            assert isinstance(tensors, SenderRows)
            source, senders = tensors.source(name)
            kind = dtype or source.dtype
            at = None if rows is None else {r: k for k, r in enumerate(rows.tolist())}
            size = self.b if at is None else len(at)
            out = source.new_zeros((size, *source.shape[1:]), dtype=kind)
            w = None if weight is None else self.scalars[weight].to(kind)
            fused = _exact_in(kind, source.dtype, w)
            for m, (j, r) in enumerate(zip(senders, self.dst.tolist(), strict=True)):
                k = r if at is None else at.get(r)
                if k is None:
                    continue
                if fused:  # a float32 value times an integer is exact in float64
                    out[k].add_(source[j], alpha=1 if w is None else float(w[m]))
                    continue
                value = source[j].to(kind)
                out[k].add_(value if w is None else value * w[m])
            return out
        values = tensors[name]
        dst = self.dst
        b = self.b
        if rows is not None:
            keep = torch.isin(dst, rows)
            values, dst, b = values[keep], torch.searchsorted(rows, dst[keep]), rows.numel()
        kind = dtype or values.dtype
        values = values.to(kind)
        if weight is not None:
            scale = self.scalars[weight] if rows is None else self.scalars[weight][keep]
            values = values * scale.to(kind).reshape(-1, *[1] * (values.dim() - 1))
        out = values.new_zeros((b, *values.shape[1:]))
        return out.index_add_(0, dst, values)

    def scalar_total(self, name: str) -> torch.Tensor:
        """``[B]`` float64: per row, the sum of the scalars ``name`` that arrived."""
        out = torch.zeros(self.b, dtype=_TOTAL, device=self.dst.device)
        return out.index_add_(0, self.dst, self.scalars[name].to(_TOTAL))

    def heard(self) -> torch.Tensor:
        """``[B]`` bool: the rows some message arrived at."""
        out = torch.zeros(self.b, dtype=torch.bool, device=self.dst.device)
        out[self.dst] = True
        return out


@dataclass(frozen=True, eq=False)
class Edges:
    """The edges of ``B`` peers over the union of the run's graphs (every round of a
    schedule), for a rule that keeps state per edge (pattern ``"edges"``): each edge has
    a fixed position for the whole run, whether it is an edge of this round or not.

    Attributes:
        out_row: ``[Eo]`` long: the row that sends on out-edge ``e``; grouped by row, each
            row's receivers in sorted id order.
        out_weight: ``[Eo]`` float64: ``W_ij`` of this round (0 where ``e`` is not an edge
            of this round's graph).
        out_live: ``[Eo]`` bool: ``e`` is an edge of this round's graph.
        in_row: ``[Ei]`` long: the row that receives on in-edge ``e``; grouped by row, each
            row's senders in sorted id order.
        in_weight: ``[Ei]`` float64: ``W_ji`` of this round (0 where not an edge of it).
        in_live: ``[Ei]`` bool.
        out_peer: ``[Eo]`` long: the receiver of out-edge ``e``, as its index in
            :attr:`Rows.nodes`.
        in_peer: ``[Ei]`` long: the sender of in-edge ``e``, as its index in
            :attr:`Rows.nodes`.
        b: Number of rows.
    """

    out_row: torch.Tensor
    out_weight: torch.Tensor
    out_live: torch.Tensor
    in_row: torch.Tensor
    in_weight: torch.Tensor
    in_live: torch.Tensor
    out_peer: torch.Tensor
    in_peer: torch.Tensor
    b: int

    def out_total(self, values: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, ...]``: per row, ``start`` (default 0) plus ``values [Eo, ...]`` over its
        out-edges, added one after another in receiver order (on a peer and on every peer
        alike)."""
        return _added(self.b, self.out_row, values, start)

    def in_total(self, values: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, ...]``: per row, ``start`` (default 0) plus ``values [Ei, ...]`` over its
        in-edges, in sender order."""
        return _added(self.b, self.in_row, values, start)


def _added(
    b: int, rows: torch.Tensor, values: torch.Tensor, start: torch.Tensor | None
) -> torch.Tensor:
    """``start`` (or zeros) ``[b, ...]`` with ``values[e]`` added to row ``rows[e]``, one
    edge after another. On one row, the same additions as one flat ``index_add_`` (a
    ``[E, w]`` one runs a thread team on the CPU even when tiny, whose idle spinning costs a
    peer more CPU than the sum)."""
    out = values.new_zeros((b, *values.shape[1:])) if start is None else start.clone()
    if b == 1 and values.dim() > 1 and values.device.type == "cpu":
        width = out[0].numel()
        key = (values.shape[0], width)
        spread = _SPREAD.get(key)
        if spread is None:
            if len(_SPREAD) > 64:
                _SPREAD.clear()
            spread = _SPREAD[key] = torch.arange(width).repeat(values.shape[0])
        out.view(-1).index_add_(0, spread, values.reshape(-1))
        return out
    return out.index_add_(0, rows, values)


_SPREAD: dict[tuple[int, int], torch.Tensor] = {}
"""(edges, values a row) -> each value's place in the row: a flat sum's index (read only)."""


@dataclass(frozen=True, eq=False)
class EdgeInbox:
    """What arrived on every in-edge of ``B`` peers in one phase (pattern ``"edges"``):
    the message its sender sent on that very edge.

    Attributes:
        tensors: Name -> ``[Ei, ...]`` decoded tensors (not to be read where not arrived).
        scalars: Name -> ``[Ei]`` float64.
        arrived: ``[Ei]`` bool.
    """

    tensors: Mapping[str, torch.Tensor]
    scalars: Mapping[str, torch.Tensor]
    arrived: torch.Tensor


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
    round: :func:`schema_of`).

    Optional methods: ``trains(rows)`` and ``talks(phase, rows)`` (pattern ``"chosen"``),
    ``lossless(phase, rows)``, ``local_step(state, grad, rows)``, ``accept(...)``, and
    ``widths(phase, rows)`` (pattern ``"edges"``: each edge's message length,
    :func:`widths_of`)."""


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
    says = getattr(rule, "lossless", None)
    return bool(says(phase, rows)) if says is not None else False


def widths_of(rule: Any, phase: int, rows: Rows) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A rule's messages of ``phase`` edge by edge (its optional ``widths(phase, rows)``,
    pattern ``"edges"``): ``(out [Eo], in [Ei])`` long, how many leading values of each
    ``(w,)`` tensor of the schema the message on that edge holds, 0 where no message goes
    (RPS's blocks). ``None``: every message holds the schema's shapes."""
    says = getattr(rule, "widths", None)
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


# -- helpers rules share ---------------------------------------------------------------


def spent(buffer: torch.Tensor) -> torch.Tensor:
    """A ``[B, 0]`` stand-in for a ``[B, ...]`` buffer a round used up (the gradient step a
    mix applied, the messages it sent): a new empty tensor, not ``buffer[:, :0]``, a view
    that would keep the whole buffer alive until the next round (a model's copy a peer)."""
    return buffer.new_empty((buffer.shape[0], 0))


def gossip(
    x: torch.Tensor, self_weight: torch.Tensor, inbox: list[Slot], name: str = "x"
) -> torch.Tensor:
    """``W_ii x_i + sum_j W_ji x_j`` over what arrived, slot by slot; a missing ``j``'s
    weight goes to the peer itself (its row stays a convex combination)."""
    table = _one_row(x, self_weight, inbox)
    if table is not None:  # one peer: the same ops on coefficients made once
        own, coefs = table
    else:
        total = self_weight
        for slot in inbox:
            total = total + torch.where(slot.arrived, 0.0, slot.weight)
        own, coefs = total.to(x.dtype).unsqueeze(1), _coefficients(x, inbox)
    out = x * own
    for slot, coef in zip(inbox, coefs, strict=True):
        add_slot(out, slot, name, coef)
    return out


def pull(base: torch.Tensor, inbox: list[Slot], name: str) -> torch.Tensor:
    """``sum_j W_ji (v_j - base)`` over what arrived, slot by slot (a missing ``j`` adds
    nothing, as if it had sent ``base``)."""
    out = torch.zeros_like(base)
    for slot, coef in zip(inbox, _coefficients(base, inbox), strict=True):
        add_slot(out, slot, name, coef, base)
    return out


def received(base: torch.Tensor, inbox: list[Slot], name: str) -> torch.Tensor:
    """``base + sum_j W_ji v_j`` over what arrived, slot by slot (a missing ``j`` adds
    nothing)."""
    out = base.clone()
    for slot, coef in zip(inbox, _coefficients(base, inbox), strict=True):
        add_slot(out, slot, name, coef)
    return out


def _coefficients(x: torch.Tensor, inbox: list[Slot]) -> list[torch.Tensor]:
    """Each slot's ``[B, 1]`` coefficient in ``x``'s dtype: ``W_ji`` if its message arrived,
    else 0 (on one peer, made once per distinct round: :func:`_one_row`)."""
    table = _one_row(x, None, inbox)
    if table is not None:
        return table[1]
    return [torch.where(s.arrived, s.weight, 0.0).to(x.dtype).unsqueeze(1) for s in inbox]


_Coefficients = tuple[torch.Tensor, list[torch.Tensor]]

_ONE_ROW: dict[tuple[Any, ...], _Coefficients] = {}
"""(self weight, dtype, device, each slot's ``one``) -> :func:`_one_row`'s tensors."""


def _one_row(
    x: torch.Tensor, self_weight: torch.Tensor | None, inbox: list[Slot]
) -> _Coefficients | None:
    """On one peer whose slots know their Python values (:attr:`Slot.one`): ``[1, 1]``
    tensors of ``x``'s dtype, the own coefficient (``W_ii`` plus the weights of what did
    not arrive, summed in float64 slot by slot as :func:`gossip`'s tensor path does) and
    each slot's (``W_ji`` if it arrived, else 0), made once per distinct round (read only).
    ``None``: more than one row, or a slot without Python values."""
    if x.dim() != 2 or x.shape[0] != 1 or (self_weight is not None and self_weight.numel() != 1):
        return None
    ones = tuple([slot.one for slot in inbox])
    if None in ones:
        return None
    own = 0.0 if self_weight is None else float(self_weight.item())
    key = (own, x.dtype, x.device, ones)
    table = _ONE_ROW.get(key)
    if table is None:
        for one in ones:
            assert one is not None
            own = own + (0.0 if one[1] else one[0])

        def column(value: float) -> torch.Tensor:
            exact = torch.tensor([[value]], dtype=_TOTAL, device=x.device)
            return exact.to(x.dtype)

        coefs = [column(one[0] if one[1] else 0.0) for one in ones if one is not None]
        if len(_ONE_ROW) >= 4096:  # a few distinct rounds a run: bounded all the same
            _ONE_ROW.clear()
        table = _ONE_ROW[key] = (column(own), coefs)
    return table
