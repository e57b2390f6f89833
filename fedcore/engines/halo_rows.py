"""The bytes of a sharded rank's halo rows: each sent row as its codec encoded it.

A phase's :class:`~fedcore.algorithms.rule.Send` holds, per tensor, what receivers decode
(the sending rank round-trips its own rows with their own codecs). What crosses ranks is
each boundary row's *encoded* tensors (:mod:`fedcore.compression.rowwire`: the sign bits
and scale, the top-k indices and values, ...), which the receiving rank decodes into the
very same values, and its scalars as they are. Two kinds of rows go as values instead:
every row of a lossless codec (its values are its bytes) or of a codec with no row form
(``fp8``, ``s2fp8``, ``float``: their decoded values, four or eight bytes a value), and the
rows of a crashed sender, which encodes nothing and whose rows the one-process engine reads
as they are. Every rank knows which senders are down (the fault plan), so rows have one of
two widths, known to both ends: the message goes as one flat byte buffer whose blocks per
rank both ends compute (:meth:`Layout.widths`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedcore.compression.batched import RowCodec
from fedcore.compression.rowwire import decode_rows, encode_rows, wire_width
from fedcore.engines.ranks import Ranks, exchange_start

__all__ = [
    "Layout",
    "Shares",
    "block_sums",
    "encode_sent",
    "layout_of",
    "pack_rows",
    "plan_shares",
    "swap_rows_start",
    "unpack_rows",
]


@dataclass(frozen=True)
class _Part:
    """One tensor or scalar of a send: its name, dtype, row shape, values per row, and
    the bytes of an encoded row (``None``: sent as values)."""

    scalar: bool
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    n: int
    encoded: int | None

    @property
    def raw(self) -> int:
        """Bytes of a row as values."""
        return self.n * self.dtype.itemsize


@dataclass(frozen=True)
class Layout:
    """How the rows of one send go on the wire (see the module docstring)."""

    parts: tuple[_Part, ...]

    @property
    def width_up(self) -> int:
        """Bytes of an up sender's row: encoded tensors (where a codec encodes), scalars."""
        return sum(p.raw if p.encoded is None else p.encoded for p in self.parts)

    @property
    def width_down(self) -> int:
        """Bytes of a crashed sender's row: every tensor and scalar as values."""
        return sum(p.raw for p in self.parts)

    def widths(self, up: torch.Tensor) -> torch.Tensor:
        """``[m]`` long: the bytes of rows whose senders are ``up`` (``[m]`` bool)."""
        return torch.where(up, self.width_up, self.width_down).to(torch.long)


def layout_of(
    tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, torch.Tensor], codec: RowCodec
) -> Layout:
    """The :class:`Layout` of a send's ``tensors`` (what receivers decode; encoded where
    ``codec`` has a row form for them) and ``scalars``."""
    parts = []
    for name, value in tensors.items():
        n = int(np.prod(value.shape[1:], dtype=np.int64))
        width = wire_width(codec, n, value.dtype)
        parts.append(_Part(False, name, value.dtype, tuple(value.shape[1:]), n, width))
    for name, value in scalars.items():
        n = int(np.prod(value.shape[1:], dtype=np.int64))
        parts.append(_Part(True, name, value.dtype, tuple(value.shape[1:]), n, None))
    return Layout(tuple(parts))


def _values(value: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """The rows ``rows`` of ``value`` as ``[len(rows), bytes]`` uint8 (bit for bit)."""
    picked = value.index_select(0, rows).contiguous()
    return picked.reshape(-1).view(torch.uint8).reshape(rows.numel(), n * value.element_size())


def pack_rows(
    layout: Layout,
    tensors: Mapping[str, torch.Tensor],
    encoded: Mapping[str, torch.Tensor],
    scalars: Mapping[str, torch.Tensor],
    rows: torch.Tensor,
    up: torch.Tensor,
) -> torch.Tensor:
    """The local rows ``rows`` as one flat ``uint8`` buffer, row after row, each of
    :meth:`Layout.widths` bytes.

    Args:
        layout: The send's layout (:func:`layout_of`).
        tensors: Name -> ``[B, ...]`` decoded rows (a crashed sender's: as they are).
        encoded: Name -> ``[B, width]`` encoded bytes of each row (the tensors a codec
            encodes; only up rows are read).
        scalars: Name -> ``[B, ...]`` scalars.
        rows: ``[m]`` local rows to send, in order.
        up: ``[B]`` bool: whose senders are up.
    """
    is_up = up[rows]
    blocks: dict[bool, torch.Tensor] = {}
    for alive in (True, False):
        picked = rows[is_up == alive]
        if picked.numel() == 0:
            continue
        parts = []
        for p in layout.parts:
            if p.encoded is not None and alive:
                parts.append(encoded[p.name].index_select(0, picked))
            else:
                source = scalars if p.scalar else tensors
                parts.append(_values(source[p.name], picked, p.n))
        empty = torch.zeros(picked.numel(), 0, dtype=torch.uint8)
        blocks[alive] = torch.cat(parts, dim=1) if parts else empty
    if len(blocks) < 2:  # every sender up (or every one down): the rows in order
        return (
            next(iter(blocks.values())).reshape(-1) if blocks else torch.zeros(0, dtype=torch.uint8)
        )
    # Up and crashed senders' rows of two widths, interleaved in order.
    at = {True: 0, False: 0}
    pieces = []
    for alive in is_up.tolist():
        pieces.append(blocks[alive][at[alive]])
        at[alive] += 1
    return torch.cat(pieces)


def unpack_rows(
    layout: Layout, flat: torch.Tensor, up: torch.Tensor, codec: RowCodec
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(tensors, scalars)`` of the rows in ``flat`` (:func:`pack_rows`' buffer), whose
    senders are ``up`` (``[m]`` bool): each tensor decoded as its receivers decode it."""
    m = up.numel()
    widths = layout.widths(up)
    starts = (torch.cumsum(widths, 0) - widths).tolist()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, torch.Tensor] = {}
    for p in layout.parts:
        (scalars if p.scalar else tensors)[p.name] = torch.empty(m, *p.shape, dtype=p.dtype)
    uniform = bool(up.all()) or not bool(up.any())
    for alive in (True, False):
        where = torch.nonzero(up == alive).squeeze(1)
        if where.numel() == 0:
            continue
        width = layout.width_up if alive else layout.width_down
        if uniform:  # the rows in order, of one width
            block = flat.reshape(m, width)
        else:
            block = torch.stack([flat[starts[i] : starts[i] + width] for i in where.tolist()])
        at = 0
        for p in layout.parts:
            size = p.encoded if p.encoded is not None and alive else p.raw
            raw = block[:, at : at + size].clone()  # its own storage: aligned for any dtype
            at += size
            if p.encoded is not None and alive:
                value = decode_rows(codec, raw, p.n, p.dtype)
            else:
                value = raw.reshape(-1).view(p.dtype)
            out = scalars if p.scalar else tensors
            out[p.name][where] = value.reshape(where.numel(), *p.shape)
    return tensors, scalars


def encode_sent(
    codec: RowCodec, values: torch.Tensor, sending: torch.Tensor, owners: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(decoded, encoded)`` of the messages ``values`` (one a row, row ``r`` sent by node
    ``owners[r]``): the rows ``sending`` (``[m]`` bool) go through their senders' codecs
    (each drawing from its owner's generator), the others come back as they are (a crashed
    peer encodes nothing). ``encoded``: ``[m, width]`` bytes of the sent rows, where the
    codec has a row form (else ``None``); a lossless codec returns ``values`` itself."""
    m = values.shape[0]
    if codec.lossless(values.dtype):
        return values, None
    picked = torch.nonzero(sending).squeeze(1)
    out = values.clone()
    width = wire_width(codec, int(values[0].numel()), values.dtype) if m else None
    if width is None:
        if picked.numel():
            out[picked] = codec.roundtrip(values[picked], owners[picked])
        return out, None
    encoded = torch.zeros(m, width, dtype=torch.uint8)
    out[picked], encoded[picked] = encode_rows(codec, values[picked], owners[picked])
    return out, encoded


_Rows = Mapping[str, torch.Tensor]


Swapped = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]


def swap_rows_start(
    ranks: Ranks,
    codec: RowCodec,
    parts: tuple[
        Mapping[str, torch.Tensor], Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]
    ],
    rows: torch.Tensor,
    counts: tuple[list[int], list[int]],
    up: torch.Tensor,
    far_up: torch.Tensor,
) -> Callable[[], Swapped]:
    """One halo exchange, started: the messages ``rows`` of ``parts`` (``(tensors, their
    encoded bytes, scalars)`` as :func:`pack_rows` takes them; blocks of ``counts[0]`` rows
    per destination rank, sent by ``up[rows]``) are packed and on their way; the returned
    function waits for what comes back (blocks of ``counts[1]`` per source rank, from
    senders ``far_up``) and returns it decoded, ``(tensors, scalars)``, with the bytes sent.

    Raises:
        PeerUnavailableError: the exchange failed (raised by either call).
    """
    tensors, encoded, scalars = parts
    layout = layout_of(tensors, scalars, codec)
    flat = pack_rows(layout, tensors, encoded, scalars, rows, up)
    sent = block_sums(layout.widths(up[rows]), counts[0])
    coming = block_sums(layout.widths(far_up), counts[1])
    pending = exchange_start(ranks, flat, sent, coming)

    def finish() -> Swapped:
        far_tensors, far_scalars = unpack_rows(layout, pending(), far_up, codec)
        return far_tensors, far_scalars, int(flat.numel())

    return finish


@dataclass(frozen=True, eq=False)
class Shares:
    """Push-sum's messages on one rank when a codec encodes them: a sender encodes one
    share ``W_ij x_i`` per distinct out-weight (a *unit*, as the one-process engine's
    :func:`~fedcore.engines.batched._share_units`), so units, not rows, cross ranks: every
    unit of each boundary sender, to each rank its halo row goes to.

    Attributes:
        sender: ``[U]`` the local row of each of this rank's units (global unit order:
            each sender's in its encoding order).
        weight: ``[U]`` float64: each unit's weight.
        send: Positions among this rank's units to send, grouped by destination rank
            (each halo row's units, in halo order); ``send_counts`` per rank.
        recv_sender: ``[V]`` the global sender of each received unit, grouped by source
            rank; ``recv_counts`` per rank.
        slot: ``[B, K]`` each inbox slot's unit among this rank's units, then the received
            ones, then one row of zeros (padding).
    """

    sender: torch.Tensor
    weight: torch.Tensor
    send: torch.Tensor
    send_counts: list[int]
    recv_sender: torch.Tensor
    recv_counts: list[int]
    slot: torch.Tensor


def _units_of(start: torch.Tensor, count: torch.Tensor, senders: torch.Tensor) -> torch.Tensor:
    """The global ids of every unit of ``senders``, sender after sender (units are numbered
    sender by sender: ``start[j]`` on, ``count[j]`` of them)."""
    c = count[senders]
    first = torch.repeat_interleave(start[senders], c)
    within = torch.arange(int(c.sum())) - torch.repeat_interleave(torch.cumsum(c, 0) - c, c)
    return first + within


def block_sums(values: torch.Tensor, counts: list[int]) -> list[int]:
    """The sums of ``values`` over consecutive blocks of ``counts`` (the bytes or units
    per rank of rows grouped by rank)."""
    ends = torch.cumsum(torch.as_tensor(counts, dtype=torch.long), 0)
    total = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(values, 0)])
    return torch.diff(total[ends], prepend=total[:1]).tolist()


def plan_shares(
    units: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    mine: torch.Tensor,
    send_rows: torch.Tensor,
    send_counts: list[int],
    recv_rows: torch.Tensor,
    recv_counts: list[int],
    slot_edge: torch.Tensor,
    n: int,
) -> Shares:
    """The :class:`Shares` of a rank holding the global rows ``mine``, whose halo sends
    its local rows ``send_rows`` and receives the global rows ``recv_rows`` (blocks of
    ``send_counts``, ``recv_counts`` per rank), and whose inbox slots read the edges
    ``slot_edge`` (``[B, K]``, ``E``: padding), of ``n`` nodes. ``units``: ``(unit of
    each edge, sender of each unit, weight of each unit)`` of the whole graph."""
    unit_of_edge, unit_sender, unit_weight = units
    count = torch.bincount(unit_sender, minlength=n)
    start = torch.cumsum(count, 0) - count
    own = torch.zeros(n, dtype=torch.bool)
    own[mine] = True
    local_of = torch.full((n,), -1, dtype=torch.long)
    local_of[mine] = torch.arange(mine.numel())
    local_ids = torch.nonzero(own[unit_sender]).squeeze(1)
    at = torch.full((unit_sender.numel(),), -1, dtype=torch.long)
    at[local_ids] = torch.arange(local_ids.numel())
    sent = _units_of(start, count, mine[send_rows])
    got = _units_of(start, count, recv_rows)
    place = torch.full((unit_sender.numel(),), -1, dtype=torch.long)
    place[local_ids] = torch.arange(local_ids.numel())
    place[got] = local_ids.numel() + torch.arange(got.numel())
    pad = local_ids.numel() + got.numel()  # the row of zeros
    edge_unit = torch.cat([place[unit_of_edge], torch.tensor([pad])])
    slot = edge_unit[slot_edge]
    assert bool((slot >= 0).all()), "a slot's unit outside the halo"
    return Shares(
        sender=local_of[unit_sender[local_ids]],
        weight=unit_weight[local_ids],
        send=at[sent],
        send_counts=block_sums(count[mine[send_rows]], send_counts),
        recv_sender=unit_sender[got],
        recv_counts=block_sums(count[recv_rows], recv_counts),
        slot=slot,
    )
