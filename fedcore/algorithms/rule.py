"""One update rule for every engine: an algorithm written once over a leading peer axis.

A :class:`Rule` is the extension point for algorithms. It is sans-I/O math over ``B``
stacked peers: every tensor of its state, its gradients and its messages has a leading
axis of ``B`` rows. A gRPC peer and the message engine run it with ``B = 1`` (through
:class:`NodeRule`, which speaks the node's per-message :class:`~fedcore.algorithms.base.
Algorithm` protocol); the vectorized engine runs it with ``B = N``, every peer at once
(through :class:`BatchedRule`). One implementation, so the engines agree by construction.

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
The registry (:data:`fedcore.algorithms.ALGORITHMS`) holds a :class:`NodeRule` around each
built-in rule; ``algorithm.name = "pkg.module:factory"`` loads a user's.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from fedcore.algorithms.base import RoundContext, check_phase
from fedcore.compression import RawCodec
from fedcore.errors import AlgorithmError
from fedcore.messages import EncodedTensor, MessageSchema, Payload

__all__ = [
    "EdgeInbox",
    "Edges",
    "Gathered",
    "NodeRule",
    "Rows",
    "Rule",
    "Send",
    "SenderRows",
    "Slot",
    "add_slot",
    "declare_rule",
    "gossip",
    "is_rule",
    "lossless",
    "per_peer",
    "pull",
    "received",
    "schema_of",
    "spent",
    "widths_of",
]

_TOTAL = torch.float64

_RAW = RawCodec()

_YES = torch.ones(1, dtype=torch.bool)
_NO = torch.zeros(1, dtype=torch.bool)
"""A peer's slot arrived or not (read only)."""


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
class Rule(Protocol):
    """An algorithm written once over ``B`` stacked peers (see the module docstring).

    A rule says it is one by subclassing this class (``class MyRule(Rule):``): fedcore
    runs an object as a rule only when its class declares it so (:func:`is_rule`), never
    because it happens to have these attributes. The built-in rules are declared by their
    registry entries (:func:`declare_rule`).

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

    def mix(self, state: Any, phase: int, inbox: list[Slot], rows: Rows) -> tuple[Any, Send | None]:
        """Take in ``inbox``; the new state and the next phase's messages."""
        ...

    def schema(self, phase: int) -> MessageSchema:
        """Exactly what a message of ``phase`` holds (a rule may take ``rows`` as a second
        argument, for bounds that depend on the network size or the round).

        Optional methods: ``trains(rows)`` and ``talks(phase, rows)`` (pattern
        ``"chosen"``), ``lossless(phase, rows)``, ``local_step(state, grad, rows)``,
        ``accept(...)``, and ``widths(phase, rows)`` (pattern ``"edges"``: each edge's
        message length, :func:`widths_of`)."""
        ...


def schema_of(rule: Any, phase: int, rows: Rows) -> MessageSchema:
    """``rule.schema(phase, rows)``, or ``rule.schema(phase)`` for a rule that takes no rows."""
    kind = type(rule)
    takes = _TAKES_ROWS.get(kind)
    if takes is None:  # read once per rule class
        try:
            takes = len(inspect.signature(rule.schema).parameters) >= 2  # phase, rows
        except (TypeError, ValueError):
            takes = False
        _TAKES_ROWS[kind] = takes
    schema: MessageSchema = rule.schema(phase, rows) if takes else rule.schema(phase)
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

_DECLARED: set[type] = set()
"""Built-in rule classes, declared by :func:`declare_rule` (their registry entries)."""

_IS_RULE: dict[type, bool] = {}
"""Class -> whether it is declared a rule (read once per class)."""


def declare_rule(kind: type) -> type:
    """Declare ``kind`` (and its subclasses) an update rule without subclassing
    :class:`Rule`: what the registry does for the built-in rules (:func:`per_peer`).
    Returns ``kind``, so it also reads as a class decorator."""
    _DECLARED.add(kind)
    _IS_RULE.clear()
    return kind


def is_rule(obj: object) -> bool:
    """Whether ``obj`` is declared a :class:`Rule`: its class subclasses :class:`Rule` or a
    built-in rule (:func:`declare_rule`). Declared, never guessed from attributes: an
    object that hands unknown attributes on to another (``__getattr__``) has them all, and
    is still whatever its own class says (a per-message algorithm, say)."""
    kind = type(obj)
    known = _IS_RULE.get(kind)
    if known is None:
        known = any(c is Rule or c in _DECLARED for c in kind.__mro__)
        _IS_RULE[kind] = known
    return known


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


# -- a rule on one peer: the node's per-message protocol -------------------------------


class NodeRule:
    """A :class:`Rule` run by one peer (``B = 1``), as the node's per-message
    :class:`~fedcore.algorithms.base.Algorithm`: dict inboxes become slots in sorted
    sender order, a :class:`Send` becomes one payload for every out-neighbour.

    Attributes:
        rule: The rule.
    """

    def __init__(self, rule: Any) -> None:
        """Wrap ``rule``."""
        if isinstance(rule, NodeRule):
            raise AlgorithmError(f"{rule!r} is already a rule on one peer; wrap its .rule.")
        missing = [a for a in RULE_MEMBERS if not hasattr(rule, a)]
        if missing:  # the caller wrapping it says it is a rule; this names what it lacks
            raise AlgorithmError(
                f"{rule!r} is not an update rule: it lacks {', '.join(missing)} of "
                "fedcore.algorithms.rule.Rule."
            )
        self.rule = rule
        self.name: str = rule.name
        self.mixing: str = rule.mixing
        self.phases: int = int(rule.phases)
        self._encoded: dict[int, Any] = {}  # id of a compressed tensor -> its encoding(s)
        self._zeros: dict[tuple[int, ...], torch.Tensor] = {}
        self._contexts: OrderedDict[int, tuple[RoundContext, Rows]] = OrderedDict()
        self._weights: dict[float, torch.Tensor] = {}
        self._known: dict[tuple[float, int, float], tuple[torch.Tensor, ...]] = {}
        self._senders: dict[int, tuple[Mapping[str, float], list[tuple[str, float, Any]]]] = {}
        self._positions: tuple[Any, dict[str, int]] = (None, {})  # node list, id -> index
        self._index: dict[int, torch.Tensor] = {}  # a node's index in it, as [1] long
        self._widths: dict[tuple[int, int], tuple[Rows, dict[str, MessageSchema]]] = {}
        accept = getattr(rule, "accept", None)
        if accept is not None:
            self.accept = accept
        if getattr(rule, "trains", None) is not None:
            self.trains = self._trains

    def __getattr__(self, name: str) -> Any:
        """The rule's own options (``eta``, ``gamma``, ...) read through the adapter."""
        if name == "rule":
            raise AttributeError(name)
        return getattr(self.rule, name)

    def __repr__(self) -> str:
        return f"NodeRule({self.rule!r})"

    def _trains(self, ctx: RoundContext) -> bool:
        """Whether this peer computes a gradient this round (the rule's ``trains``)."""
        return bool(self.rule.trains(self._rows(ctx))[0])

    def _talks(self, phase: int, ctx: RoundContext) -> tuple[Any, Any]:
        """``(senders, receivers)`` of ``phase`` (pattern ``"chosen"``)."""
        senders, receivers = self.rule.talks(phase, self._rows(ctx))
        return senders, receivers

    def _rows(self, ctx: RoundContext) -> Rows:
        """The rule's view of ``ctx`` (one per round context: a node asks many times)."""
        cached = self._contexts.get(id(ctx))
        if cached is not None and cached[0] is ctx:
            return cached[1]
        rows = self._make_rows(ctx)
        self._contexts[id(ctx)] = (ctx, rows)
        # The newest few per node of the process (a node asks for a round's context from
        # its step to its last mix, while the other nodes start theirs): oldest out first.
        while len(self._contexts) > 64 + 2 * len(ctx.nodes):
            self._contexts.popitem(last=False)
        return rows

    def _make_rows(self, ctx: RoundContext) -> Rows:
        codec = ctx.codec

        def compress(
            v: torch.Tensor,
            where: torch.Tensor | None,
            owners: torch.Tensor | None,
            width: torch.Tensor | None,
        ) -> torch.Tensor:
            if codec is None:
                return v.clone()
            if owners is None:  # the peer's one row
                if where is not None and not bool(where[0]):
                    return v.clone()
                if width is not None:  # its first values only
                    w = int(width[0])
                    encoded = codec.encode(v[0, :w])
                    decoded = v.clone()
                    decoded[0, :w] = codec.decode(encoded)
                else:
                    encoded = codec.encode(v[0])
                    decoded = codec.decode(encoded).unsqueeze(0)
                self._encoded[id(decoded)] = encoded
                return decoded
            out = v.clone()  # one row per out-edge, encoded in edge order
            each: list[EncodedTensor | None] = [None] * v.shape[0]
            for e in range(v.shape[0]):
                if where is None or bool(where[e]):
                    encoded = each[e] = codec.encode(v[e])
                    out[e] = codec.decode(encoded)
            self._encoded[id(out)] = each
            return out

        def fail(bad: torch.Tensor, why: str) -> None:
            if bool(bad[0]):
                raise AlgorithmError(why.format(node=repr(ctx.node), round=ctx.round))

        key = (ctx.self_weight, len(ctx.in_weights), float(ctx.samples))
        known = self._known.get(key)
        if known is None:  # a few distinct ones a run: made once (read only)
            if len(self._known) > 256:
                self._known.clear()
            known = self._known[key] = (
                torch.tensor([ctx.self_weight], dtype=_TOTAL),
                torch.tensor([len(ctx.in_weights)]),
                torch.tensor([float(ctx.samples)], dtype=_TOTAL),
            )
        if self._positions[0] is not ctx.nodes:  # one node list a run: indexed once
            self._positions = (ctx.nodes, {v: i for i, v in enumerate(ctx.nodes)})
        positions = self._positions[1]
        at = positions.get(ctx.node, -1)
        index = self._index.get(at)
        if index is None:
            index = self._index[at] = torch.tensor([at])
        return Rows(
            round=ctx.round,
            lr=ctx.lr,
            self_weight=known[0],
            compress=compress,
            fail=fail,
            in_degree=known[1],
            n=len(ctx.nodes),
            deadline=ctx.deadline,
            ids=(ctx.node,),
            nodes=tuple(ctx.nodes),
            samples=known[2],
            edges=_edges_of(ctx, positions) if self.rule.pattern == "edges" else None,
            codec="" if codec is None else codec.name,
            index=index,
        )

    def init(self, params: torch.Tensor) -> Any:
        """The rule's state of one row."""
        return self.rule.init(params.unsqueeze(0))

    def model(self, state: Any) -> torch.Tensor:
        """The row's model."""
        out: torch.Tensor = self.rule.model(state)[0]
        return out

    def _outbox(self, send: Send | None, ctx: RoundContext, phase: int) -> dict[str, Payload]:
        if send is None or not ctx.out_weights or (send.to is not None and not bool(send.to[0])):
            self._encoded.clear()
            return {}
        receivers: Any = ctx.out_weights
        if self.rule.pattern == "chosen":
            senders, chosen = self._talks(phase, ctx)
            if ctx.node not in senders:
                self._encoded.clear()
                return {}
            receivers = [j for j in ctx.out_weights if j in chosen]
        if self.rule.pattern == "edges":
            edge_outbox = self._edge_payloads(send, ctx, phase)
            self._encoded.clear()
            return edge_outbox
        if send.weighted:  # one payload per distinct share, in receiver order
            by_weight: dict[float, Payload] = {}
            outbox: dict[str, Payload] = {}
            for dst, w in ctx.out_weights.items():
                payload = by_weight.get(w)
                if payload is None:
                    payload = by_weight[w] = Payload(
                        {name: value[0] * w for name, value in send.tensors.items()},
                        {name: float(value[0]) * w for name, value in send.scalars.items()},
                    )
                outbox[dst] = payload
            self._encoded.clear()
            return outbox
        tensors: dict[str, torch.Tensor | EncodedTensor] = {}
        raw = lossless(self.rule, phase, self._rows(ctx))
        for name, value in send.tensors.items():
            encoded = _RAW.encode(value[0]) if raw else self._encoded.get(id(value))
            tensors[name] = encoded if encoded is not None else value[0]
        scalars = {name: float(value[0]) for name, value in send.scalars.items()}
        self._encoded.clear()
        payload = Payload(tensors, scalars)
        return dict.fromkeys(receivers, payload)

    def _edge_payloads(self, send: Send, ctx: RoundContext, phase: int) -> dict[str, Payload]:
        """One payload per out-edge of this round: row ``e`` of the send's tensors goes to
        the receiver of out-edge ``e`` (the union's out-neighbours in sorted order), its
        first ``width`` values if the rule says ``widths`` (none where that is 0); a
        shared send's one row goes to every receiver, as one payload if it can."""
        position = {j: e for e, j in enumerate(_out_union(ctx))}
        widths = widths_of(self.rule, phase, self._rows(ctx)) if send.tensors else None
        outbox: dict[str, Payload] = {}
        last: tuple[Payload, int | None] | None = None  # a shared send's payload, its width
        for dst in ctx.out_weights:
            e = position[dst]
            w = None if widths is None else int(widths[0][e])
            if w == 0:
                continue
            if last is not None and w == last[1]:
                outbox[dst] = last[0]  # the same message: encoded once
                continue
            row = 0 if send.shared else e
            tensors: dict[str, torch.Tensor | EncodedTensor] = {}
            for name, value in send.tensors.items():
                each = self._encoded.get(id(value))
                encoded = None if each is None else each if send.shared else each[e]
                tensors[name] = (
                    encoded if encoded is not None else value[row] if w is None else value[row, :w]
                )
            scalars = {name: float(value[row]) for name, value in send.scalars.items()}
            outbox[dst] = Payload(tensors, scalars)
            if send.shared:
                last = (outbox[dst], w)
        return outbox

    @staticmethod
    def _edge_inbox(
        inbox: Mapping[str, Payload],
        senders: tuple[str, ...],
        schema: MessageSchema,
        model: torch.Tensor,
        ragged: bool,
    ) -> EdgeInbox:
        """The dict inbox as one message per in-edge of the union (``senders``, sorted);
        an edge with no message holds zeros, and a ``ragged`` message (a rule's
        ``widths``) fills the first values of its row."""
        tensors: dict[str, torch.Tensor] = {}
        for name, shape in schema.tensors.items():
            size = tuple(model.shape[1:]) if shape is None else shape
            out = model.new_zeros((len(senders), *size))
            for e, j in enumerate(senders):
                payload = inbox.get(j)
                if payload is not None:
                    value = payload.tensor(name)
                    if ragged:
                        out[e, : value.numel()] = value
                    else:
                        out[e] = value
            tensors[name] = out
        scalars = {
            name: torch.tensor(
                [float(inbox[j].scalars[name]) if j in inbox else 0.0 for j in senders],
                dtype=_TOTAL,
            )
            for name in schema.scalars
        }
        arrived = torch.tensor([j in inbox for j in senders], dtype=torch.bool)
        return EdgeInbox(tensors, scalars, arrived)

    def step(self, state: Any, grad: torch.Tensor, ctx: RoundContext) -> tuple[Any, Any]:
        """The rule's step on one row; its send as one payload for every out-neighbour."""
        state, send = self.rule.step(state, grad[None], self._rows(ctx))
        return state, self._outbox(send, ctx, 0)

    def local_step(self, state: Any, grad: torch.Tensor, ctx: Any) -> Any:
        """A local step between communications (``run.local_steps``)."""
        own = getattr(self.rule, "local_step", None)
        if own is not None:
            return own(state, grad.unsqueeze(0), self._rows(ctx))
        return state._replace(x=state.x - ctx.lr * grad.unsqueeze(0))

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Every in-neighbour (pattern ``"neighbours"``), or those the rule's ``talks``
        names as senders of ``phase`` if it names this peer a receiver (``"chosen"``)."""
        if self.rule.pattern == "edges":
            widths = self._in_widths(phase, ctx)
            if widths is not None:  # none from a sender whose edge carries nothing
                return tuple(j for j in ctx.in_weights if j in widths)
        if self.rule.pattern in ("neighbours", "edges"):
            return tuple(ctx.in_weights)
        if self.rule.pattern == "chosen":
            senders, receivers = self._talks(phase, ctx)
            if ctx.node in receivers:
                return tuple(sorted(j for j in ctx.in_weights if j in senders))
        return ()

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """The rule's schema of ``phase`` (for a sender that sends this peer something)."""
        if self.rule.pattern == "none":
            raise AlgorithmError(f"{self.name!r} sends no messages; {sender!r} sent one.")
        check_phase(self.name, phase, self.phases)
        if self.rule.pattern == "chosen":  # membership: one check a message
            senders, receivers = self._talks(phase, ctx)
            if sender not in senders or ctx.node not in receivers:
                raise AlgorithmError(
                    f"{sender!r} sends {ctx.node!r} nothing in phase {phase} of round {ctx.round}."
                )
        if _TAKES_ROWS.get(type(self.rule)) is False:  # asked once a message: no rows needed
            schema: MessageSchema = self.rule.schema(phase)
            return schema
        widths = self._in_widths(phase, ctx) if self.rule.pattern == "edges" else None
        if widths is None:
            return schema_of(self.rule, phase, self._rows(ctx))
        sized = widths.get(sender)
        if sized is None:
            raise AlgorithmError(
                f"{sender!r} sends {ctx.node!r} nothing in phase {phase} of round {ctx.round}."
            )
        return sized

    def _in_widths(self, phase: int, ctx: RoundContext) -> dict[str, MessageSchema] | None:
        """Sender -> its message of ``phase``, its tensors of the width the rule's ``widths``
        gives (only senders of a message), made once per round context and phase (a peer
        asks once a message); ``None``: the rule says no widths."""
        if getattr(self.rule, "widths", None) is None:
            return None
        rows = self._rows(ctx)
        key = (id(rows), phase)
        cached = self._widths.get(key)
        if cached is not None and cached[0] is rows:
            return cached[1]
        widths = widths_of(self.rule, phase, rows)
        assert widths is not None
        schema = schema_of(self.rule, phase, rows)
        shaped: dict[int, MessageSchema] = {}
        by_sender: dict[str, MessageSchema] = {}
        for sender, w in zip(_in_union(ctx), widths[1].tolist(), strict=True):
            if w > 0:
                if w not in shaped:
                    tensors = dict.fromkeys(schema.tensors, (w,))
                    shaped[w] = MessageSchema(tensors=tensors, scalars=schema.scalars)
                by_sender[sender] = shaped[w]
        if len(self._widths) > 4 * len(self._contexts) + 8:
            self._widths.clear()
        self._widths[key] = (rows, by_sender)
        return by_sender

    def _zero(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        zero = self._zeros.get(shape)
        if zero is None or zero.dtype != dtype:
            zero = self._zeros[shape] = torch.zeros((1, *shape), dtype=dtype)
        return zero

    def mix(self, state: Any, phase: int, inbox: Mapping[str, Payload], ctx: RoundContext) -> Any:
        """The rule's mix of one row, over slots in sorted sender order."""
        rows = self._rows(ctx)
        if self.rule.pattern == "chosen":
            model = self.rule.model(state)
            chosen = _gathered(inbox, schema_of(self.rule, phase, rows), model)
            state, send = self.rule.mix(state, phase, chosen, rows)
            return state, self._outbox(send, ctx, phase + 1)
        if self.rule.pattern == "edges":
            edge_schema = schema_of(self.rule, phase, rows)
            model = self.rule.model(state)
            ragged = getattr(self.rule, "widths", None) is not None
            edge_inbox = self._edge_inbox(inbox, _in_union(ctx), edge_schema, model, ragged)
            state, send = self.rule.mix(state, phase, edge_inbox, rows)
            return state, self._outbox(send, ctx, phase + 1)
        slots: list[Slot] = []
        for sender, w, weight in self._in_neighbours(ctx.in_weights):
            payload = inbox.get(sender)
            if payload is not None:
                tensors: dict[str, torch.Tensor] = {}
                for n, value in payload.tensors.items():
                    row = value if isinstance(value, torch.Tensor) else payload.tensor(n)
                    tensors[n] = row[None]  # unsqueeze(0), a little cheaper
                scalars = (
                    {n: torch.tensor([v], dtype=_TOTAL) for n, v in payload.scalars.items()}
                    if payload.scalars
                    else {}
                )
                slots.append(Slot(tensors, scalars, weight, _YES, (w, True)))
                continue
            x = self.rule.model(state)
            schema = schema_of(self.rule, phase, rows) if self.rule.pattern != "none" else None
            names = schema.tensors if schema is not None else {}
            tensors = {
                n: self._zero(tuple(x.shape[1:]) if s is None else s, x.dtype)
                for n, s in names.items()
            }
            scalars = {n: torch.zeros(1, dtype=_TOTAL) for n in (schema.scalars if schema else ())}
            slots.append(Slot(tensors, scalars, weight, _NO, (w, False)))
        state, send = self.rule.mix(state, phase, slots, rows)
        return state, self._outbox(send, ctx, phase + 1)

    def _in_neighbours(self, in_weights: Mapping[str, float]) -> list[tuple[str, float, Any]]:
        """``(sender, W_ji, W_ji as a [1] float64 tensor)`` in sorted sender order, made
        once per in-weights mapping (a node keeps one per graph of its schedule)."""
        cached = self._senders.get(id(in_weights))
        if cached is not None and cached[0] is in_weights:
            return cached[1]
        listed: list[tuple[str, float, Any]] = []
        for sender in sorted(in_weights):
            w = in_weights[sender]
            weight = self._weights.get(w)
            if weight is None:  # a few distinct weights a run: made once
                if len(self._weights) > 256:
                    self._weights.clear()
                weight = self._weights[w] = torch.tensor([w], dtype=_TOTAL)
            listed.append((sender, w, weight))
        if len(self._senders) > 256:
            self._senders.clear()
        self._senders[id(in_weights)] = (in_weights, listed)
        return listed


def _out_union(ctx: RoundContext) -> tuple[str, ...]:
    """The peer's out-neighbours over the run's graphs, sorted (this round's if the
    context does not say)."""
    return ctx.out_union or tuple(sorted(ctx.out_weights))


def _in_union(ctx: RoundContext) -> tuple[str, ...]:
    """The peer's in-neighbours over the run's graphs, sorted."""
    return ctx.in_union or tuple(sorted(ctx.in_weights))


def _edges_of(ctx: RoundContext, positions: Mapping[str, int]) -> Edges:
    """The one peer's :class:`Edges` in round ``ctx`` (``positions``: node id -> index in
    ``ctx.nodes``)."""
    outs, ins = _out_union(ctx), _in_union(ctx)
    return Edges(
        out_row=torch.zeros(len(outs), dtype=torch.long),
        out_weight=torch.tensor([ctx.out_weights.get(j, 0.0) for j in outs], dtype=_TOTAL),
        out_live=torch.tensor([j in ctx.out_weights for j in outs], dtype=torch.bool),
        in_row=torch.zeros(len(ins), dtype=torch.long),
        in_weight=torch.tensor([ctx.in_weights.get(j, 0.0) for j in ins], dtype=_TOTAL),
        in_live=torch.tensor([j in ctx.in_weights for j in ins], dtype=torch.bool),
        out_peer=torch.tensor([positions.get(j, -1) for j in outs], dtype=torch.long),
        in_peer=torch.tensor([positions.get(j, -1) for j in ins], dtype=torch.long),
        b=1,
    )


def _gathered(inbox: Mapping[str, Payload], schema: MessageSchema, model: torch.Tensor) -> Gathered:
    """A peer's dict inbox as one list, in sorted sender order, every message to row 0
    (an empty inbox holds empty tensors of the schema's shapes)."""
    senders = sorted(inbox)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in schema.tensors.items():
        if senders:
            tensors[name] = torch.stack([inbox[j].tensor(name) for j in senders])
        else:
            size = tuple(model.shape[1:]) if shape is None else shape
            tensors[name] = model.new_zeros((0, *size))
    scalars = {
        name: torch.tensor([float(inbox[j].scalars[name]) for j in senders], dtype=_TOTAL)
        for name in schema.scalars
    }
    return Gathered(tensors, scalars, torch.zeros(len(senders), dtype=torch.long), 1)


def per_peer(rule: Callable[..., Any]) -> Callable[..., NodeRule]:
    """A factory of ``rule``'s form on one peer: ``per_peer(DPSGDRule)(**options)`` is
    ``NodeRule(DPSGDRule(**options))``, with the rule's signature and docstring (the
    registry reads a factory's options from its signature)."""

    if isinstance(rule, type):
        declare_rule(rule)  # its registry entry declares it a rule

    def make(*args: Any, **kwargs: Any) -> NodeRule:
        return NodeRule(rule(*args, **kwargs))

    name = getattr(rule, "__name__", "rule").removesuffix("Rule")
    make.__name__ = make.__qualname__ = name
    make.__doc__ = rule.__doc__
    make.__signature__ = inspect.signature(rule)  # type: ignore[attr-defined]
    make.rule = rule  # type: ignore[attr-defined]
    for attribute in ("name", "mixing", "phases"):  # read by the registry's users
        if hasattr(rule, attribute):
            setattr(make, attribute, getattr(rule, attribute))
    return make
