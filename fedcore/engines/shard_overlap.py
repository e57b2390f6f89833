"""The halo exchange overlapped with the mix: a sharded rank starts the exchange, mixes
every row while the boundary rows travel (gloo's own thread), each remote slot standing in
as a message that did not arrive, then waits and mixes again only its *boundary* rows
(those with an in-neighbour on another rank), whose results replace the stand-ins. The
*interior* rows (every in-neighbour on this rank) are final after the first mix. A rank
that reaches the exchange before the others so spends the wait on work rather than idle,
and pays for it a second mix of its boundary rows only.

Why the bits do not change: a rule's mix is a function of each row's own state, its own
inbox slots (in the same sorted-sender order) and its own row of the context
(:class:`~fedcore.algorithms.rule.Rows`), the same premise that makes R ranks equal one
process (:mod:`fedcore.engines.sharded`). An interior row's slots are the same in the
first mix as in a mix after the exchange; a boundary row is mixed again with its real
slots, as a batch of its own.

It runs where that premise is visible to the engine: a one-phase rule (its mix sends
nothing after) of pattern ``"neighbours"``, a send to every out-neighbour, not push-sum's
encoded shares (:meth:`~fedcore.engines.shard_codecs.ShardCodecs._shares`), on a plan
whose boundary rows are at most :data:`MOST_BOUNDARY` of the rank's. A mix that stops
the run (a check that fails), asks for a codec round trip, or returns a state whose
fields are not rows as its input's were is run again on every row at once after the
exchange, as without the overlap (nothing drawn, the same error).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fedcore.algorithms.rule import Rows, Rule, Send, SenderRows, Slot
from fedcore.compression.batched import RowCodec

__all__ = ["OVERLAP", "Overlapping", "mix_overlapped", "slots_of"]

OVERLAP = True
"""Whether sharded rounds overlap the exchange with the interior rows' mix (a benchmark
turns it off to measure the gain; the bits are the same either way)."""


class Overlapping(Protocol):
    """What :func:`mix_overlapped` reads of a rank's block
    (:class:`~fedcore.engines.sharded.ShardedNetwork`)."""

    rule: Rule
    codec: RowCodec
    b: int
    mine: torch.Tensor
    halo: Any
    nbr: torch.Tensor
    slot_weight: torch.Tensor
    dtype: torch.dtype

    def _roundtrip(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """:meth:`~fedcore.engines.shard_codecs.ShardCodecs._roundtrip`."""
        ...

    def _exchange_start(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`~fedcore.engines.shard_codecs.ShardCodecs._exchange_start`."""
        ...


class _Unsplit(Exception):
    """The mix asked for what a group of rows cannot give alone (a codec round trip)."""


def slots_of(
    tensors: Mapping[str, torch.Tensor],
    scalars: Mapping[str, torch.Tensor],
    weighted: bool,
    nbr: torch.Tensor,
    slot_weight: torch.Tensor,
    arrived: torch.Tensor,
) -> list[Slot]:
    """The inbox slots of rows whose slot ``k`` reads row ``nbr[:, k]`` of the stack
    ``tensors``/``scalars`` with weight ``slot_weight[:, k]``; push-sum (``weighted``)
    gets the share ``W_ji x_j``, formed as its sender forms it."""
    slots = []
    for k in range(nbr.shape[1]):
        at = nbr[:, k]
        w = slot_weight[:, k]
        if weighted:
            got_t: Mapping[str, torch.Tensor] = {
                name: value.index_select(0, at) * w.to(value.dtype).unsqueeze(1)
                for name, value in tensors.items()
            }
            got_s = {name: value.index_select(0, at) * w for name, value in scalars.items()}
        else:
            got_t = SenderRows(tensors, at)
            got_s = {name: value.index_select(0, at) for name, value in scalars.items()}
        slots.append(Slot(got_t, got_s, w, arrived[:, k]))
    return slots


def can_overlap(net: Overlapping, send: Send) -> bool:
    """Whether this phase's mix may overlap the exchange (see the module docstring)."""
    rule = net.rule
    return (
        OVERLAP
        and rule.phases == 1
        and rule.pattern == "neighbours"
        and send.to is None
        and not send.shared
        and not (send.weighted and not net.codec.lossless(net.dtype))
    )


MOST_BOUNDARY = 0.5
"""The largest share of a rank's rows that may be boundary rows for the exchange to be
overlapped (each is mixed twice)."""


@dataclass(frozen=True, eq=False)
class _Split:
    """A plan's rows for the overlap: ``outer`` the boundary rows (local), ``first`` the
    neighbour table of the first mix (a remote slot reads the row itself)."""

    outer: torch.Tensor
    local: torch.Tensor
    first: torch.Tensor
    ids: tuple[str, ...]


def _split(net: Overlapping, ids: tuple[str, ...]) -> _Split | None:
    """The current plan's :class:`_Split`, or None where it has no boundary or interior
    row, or too many boundary rows (kept with the neighbour table: a schedule's graphs
    have their own)."""
    cache: dict[int, tuple[torch.Tensor, _Split | None]] = net.__dict__.setdefault(
        "_overlap_split", {}
    )
    held = cache.get(id(net.nbr))
    if held is not None and held[0] is net.nbr:
        return held[1]
    local = net.nbr < net.b
    outer = (~local.all(dim=1)).nonzero().squeeze(1)
    split = None
    if 0 < outer.numel() < net.b and outer.numel() <= MOST_BOUNDARY * net.b:
        own = torch.arange(net.b).unsqueeze(1).expand_as(net.nbr)
        first = torch.where(local, net.nbr, own)
        picked = tuple(ids[i] for i in outer.tolist()) if ids else ()
        split = _Split(outer, local, first, picked)
    cache[id(net.nbr)] = (net.nbr, split)
    return split


def mix_overlapped(
    net: Overlapping,
    state: Any,
    send: Send,
    t: int,
    up_all: torch.Tensor,
    arrived: torch.Tensor,
    compressed: set[int],
    rows: Rows,
) -> Any | None:
    """The state after the one phase's mix of every row, the exchange overlapped with a
    first mix; None where it cannot overlap (the caller mixes as usual)."""
    split = _split(net, rows.ids) if can_overlap(net, send) else None
    if split is None:
        return None
    up = up_all[net.mine]
    halo = net.halo
    decoded = {
        name: value if id(value) in compressed else net._roundtrip(value, up, t)
        for name, value in send.tensors.items()
    }
    counts = (halo.send_counts, halo.recv_counts)
    finish = net._exchange_start(
        decoded, send.scalars, halo.send_rows, counts, up, up_all[halo.recv_rows]
    )
    first = None
    try:  # every row on this rank's own rows; a remote slot stands in as not arrived
        inbox = slots_of(
            decoded,
            send.scalars,
            send.weighted,
            split.first,
            net.slot_weight,
            arrived & split.local,
        )
        first = net.rule.mix(state, 0, inbox, _guarded(rows))[0]
    except _Unsplit:
        pass
    far_t, far_s = finish()
    tensors = {k: torch.cat([v, far_t[k]]) for k, v in decoded.items()}
    scalars = {k: torch.cat([v, far_s[k]]) for k, v in send.scalars.items()}
    if first is not None:
        outer = split.outer
        try:
            inbox = slots_of(
                tensors,
                scalars,
                send.weighted,
                net.nbr[outer],
                net.slot_weight[outer],
                arrived[outer],
            )
            sub = _sub(rows, outer, split.ids)
            second = net.rule.mix(_rows_of(state, outer, net.b), 0, inbox, sub)[0]
            merged = _merge(state, net.b, first, outer, second)
            if merged is not None:
                return merged
        except _Unsplit:
            pass
    inbox = slots_of(tensors, scalars, send.weighted, net.nbr, net.slot_weight, arrived)
    return net.rule.mix(state, 0, inbox, rows)[0]


def _is_rows(value: Any, b: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == b


def _rows_of(state: Any, idx: torch.Tensor, b: int) -> Any:
    """The rows ``idx`` of every field of ``state`` that is a row per peer."""
    return type(state)(*(f.index_select(0, idx) if _is_rows(f, b) else f for f in state))


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def _merge(state: Any, b: int, first: Any, outer: torch.Tensor, second: Any) -> Any | None:
    """``first`` with the rows ``outer`` of every row field replaced by ``second``'s, or
    None where a field is not rows in both as it was in ``state``."""
    m = outer.numel()
    fields = []
    for old, a, c in zip(state, first, second, strict=True):
        if not _is_rows(old, b):
            if _is_rows(a, b) or _is_rows(c, m):
                return None
            fields.append(a)
            continue
        if not (_is_rows(a, b) and _is_rows(c, m)):
            return None
        if a.shape[1:] != c.shape[1:] or a.dtype != c.dtype:
            return None
        if any(_shares_memory(a, f) for f in state if isinstance(f, torch.Tensor)):
            a = a.clone()  # the mix handed back an input field: never write into it
        a[outer] = c
        fields.append(a)
    return type(state)(*fields)


def _not_split(*_: Any) -> Any:
    """A check that fails, or a codec round trip, in a mix of the overlap: the mix after
    the exchange runs instead (a stand-in slot may fail a check the real one passes, and
    that mix says the real error)."""
    raise _Unsplit


def _guarded(rows: Rows) -> Rows:
    """``rows`` whose checks and codec round trips stop the overlap, not the run."""
    return _with(rows, None, rows.ids)


def _sub(rows: Rows, idx: torch.Tensor, ids: tuple[str, ...]) -> Rows:
    """The context of the rows ``idx`` of ``rows`` (their ids ``ids``), guarded as
    :func:`_guarded`'s."""
    return _with(rows, idx, ids)


def _with(rows: Rows, idx: torch.Tensor | None, ids: tuple[str, ...]) -> Rows:
    def fail(bad: torch.Tensor, why: str) -> None:
        if bool(bad.any()):
            raise _Unsplit

    def pick(v: torch.Tensor) -> torch.Tensor:
        return v if idx is None else v[idx]

    return Rows(
        round=rows.round,
        lr=rows.lr,
        self_weight=pick(rows.self_weight),
        compress=_not_split,
        fail=fail,
        in_degree=pick(rows.in_degree),
        n=rows.n,
        deadline=rows.deadline,
        ids=ids,
        nodes=rows.nodes,
        samples=pick(rows.samples),
        edges=rows.edges,
        codec=rows.codec,
        index=pick(rows.index),
    )
