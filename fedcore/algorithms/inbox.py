"""What a rule's inbox holds, and the helpers rules mix it with.

A :class:`~fedcore.algorithms.rule.Rule`'s ``mix`` gets, by its ``pattern``, a list of
:class:`Slot` (one per in-neighbour), a :class:`Gathered` list of the messages that arrived,
or an :class:`EdgeInbox` (one message per in-edge of its :class:`Edges`). Received tensors
may be :class:`SenderRows`: rows of the senders' stack, read where they are. The helpers
:func:`gossip`, :func:`pull`, :func:`received`, :func:`add_slot` and :func:`spent` are what
the built-in rules mix with; every name here is importable from
:mod:`fedcore.algorithms.rule` too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "ROW_BY_ROW",
    "EdgeInbox",
    "Edges",
    "Gathered",
    "SenderRows",
    "Slot",
    "add_slot",
    "gossip",
    "pull",
    "received",
    "spent",
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
        sender: ``[B]`` long: who sent it, as an index into
            :attr:`~fedcore.algorithms.rule.Rows.nodes` (any index in a padding slot);
            ``None`` where the engine does not say.
    """

    tensors: Mapping[str, torch.Tensor]
    scalars: Mapping[str, torch.Tensor]
    weight: torch.Tensor
    arrived: torch.Tensor
    one: tuple[float, bool] | None = None
    sender: torch.Tensor | None = None


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
        src: ``[M]`` long: who sent message ``m``, as an index into
            :attr:`~fedcore.algorithms.rule.Rows.nodes`; ``None`` where the engine does
            not say.
    """

    tensors: Mapping[str, torch.Tensor]
    scalars: Mapping[str, torch.Tensor]
    dst: torch.Tensor
    b: int
    src: torch.Tensor | None = None

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
