"""A sharded rank's side of a rule whose pattern is ``"edges"`` (state and messages per
edge: RPS's blocks, robust push-sum's running totals), a part of
:class:`~fedcore.engines.sharded.ShardedNetwork` (:class:`ShardEdges`).

The one-process engine numbers the edges of every graph of a run once (the union's
out-edges grouped by sender, in-edges grouped by receiver, each in sorted-id order:
:class:`~fedcore.engines.batched.BatchedRule`'s union). A rank keeps the out-edges of its
rows and the in-edges of its rows, in that same order (its rows are sorted global rows):
their :class:`~fedcore.algorithms.rule.Edges` are the rule's :attr:`Rows.edges`, and the
rule's state per edge (``edge_fields``) is that of those edges only. Nothing per edge ever
moves: a sender keeps its out-edges' state, a receiver its in-edges'. What crosses ranks is
a phase's messages (:class:`EdgePlan`, one a graph of a schedule's period):

* a send of one message per out-edge: each *cut* edge's message once, to its receiver's
  rank (the live edges of the graph whose ends are on different ranks, grouped by
  destination rank, in the union's order); a receiver's in-edges index the *extended
  stack* of messages: its rows' out-edges' own, then the received ones, then a row of
  zeros (an in-edge the round's graph does not hold);
* a shared send (one message a sender, the same on every out-edge: RPS's averages): each
  boundary row once per destination rank, the graph's row halo
  (:class:`~fedcore.engines.shard_plan.Halo`), and the in-edges index the stack of rows.

Each message crosses as its codec encoded it, of its edge's width where the rule says
``widths`` (only the first ``width`` values of a message are sent: RPS's blocks): a
message that is not sent (a crashed sender, an edge of width 0) crosses as nothing and
reads zeros, which no rule reads (it did not arrive). Both ends know which messages are
sent and how long each is (the fault plan's crashes, the rule's widths), so the bytes of
every destination rank are one block of one ``all_to_all_single``: part after part (tensor
or scalar), message after message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore.algorithms.rule import EdgeInbox, Edges, Rows, Rule, Send, widths_of
from fedcore.compression.batched import RowCodec
from fedcore.compression.rowwire import decode_rows, wire_width
from fedcore.engines.batched import BatchedRule
from fedcore.engines.partition import Placement
from fedcore.engines.ranks import exchange
from fedcore.engines.shard_codecs import ShardCodecs
from fedcore.engines.shard_faults import keep_up
from fedcore.engines.shard_plan import GraphPlan, Halo
from fedcore.engines.stacked_graph import StackedGraph
from fedcore.errors import AlgorithmError

__all__ = ["EdgePlan", "ShardEdges", "keep_edges", "plan_edges"]

_TOTAL = torch.float64


@dataclass(frozen=True, eq=False)
class EdgePlan:
    """What one graph of the run asks of a rank whose rule's pattern is ``"edges"`` (see
    the module docstring).

    Attributes:
        edges: The :class:`Edges` of the rank's rows in this graph (local rows; peers as
            global indices).
        send: ``[S]`` local out-edges whose messages go to other ranks, grouped by
            destination rank; ``send_counts`` per rank.
        recv_counts: Messages received per source rank (``[R]`` in all).
        recv_sender: ``[R]`` the global sender of each received message.
        recv_in: ``[R]`` the local in-edge each received message is for.
        at: ``[Ei]`` each in-edge's row of the extended stack of messages (the local
            out-edges', the received ones, a row of zeros).
        at_row: ``[Ei]`` each in-edge's row of the extended stack of rows (a shared send:
            the local rows, the halo's, a row of zeros).
        row_in: ``[H]`` a local in-edge from each halo row (its message's width).
        graph_edge: ``[Ei]`` each in-edge's edge in the graph (``E``: not in it).
    """

    edges: Edges
    send: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    recv_sender: torch.Tensor
    recv_in: torch.Tensor
    at: torch.Tensor
    at_row: torch.Tensor
    row_in: torch.Tensor
    graph_edge: torch.Tensor


def plan_edges(
    union: Any, graph: StackedGraph, owner: torch.Tensor, mine: torch.Tensor, rank: int, halo: Halo
) -> EdgePlan:
    """The :class:`EdgePlan` of ``graph`` for ``rank`` holding the sorted global rows
    ``mine``, where ``owner`` (``[N]`` long) is each row's rank, ``union`` the run's edges
    (the one-process engine's, :meth:`~fedcore.engines.batched.BatchedRule.use_graphs`)
    and ``halo`` the graph's row halo of ``rank``; every rank computes every other's the
    same way."""
    n, b = graph.n, int(mine.numel())
    world = len(halo.send_counts)
    every = union.edges(graph)  # the whole graph's edges, this graph's weights
    src_rank, dst_rank = owner[union.out_row], owner[union.out_peer]
    out_mine = torch.nonzero(src_rank == rank).squeeze(1)
    in_mine = torch.nonzero(owner[union.in_row] == rank).squeeze(1)
    local_of = torch.full((n,), -1, dtype=torch.long)
    local_of[mine] = torch.arange(b)
    edges = Edges(
        local_of[union.out_row[out_mine]],
        every.out_weight[out_mine],
        every.out_live[out_mine],
        local_of[union.in_row[in_mine]],
        every.in_weight[in_mine],
        every.in_live[in_mine],
        union.out_peer[out_mine],
        union.in_peer[in_mine],
        b,
    )
    count = int(union.out_row.numel())
    out_local = torch.full((count,), -1, dtype=torch.long)
    out_local[out_mine] = torch.arange(out_mine.numel())
    cut = every.out_live & (src_rank != dst_rank)
    send, recv = [], []
    for q in range(world):
        send.append(out_local[torch.nonzero(cut & (src_rank == rank) & (dst_rank == q)).squeeze(1)])
        recv.append(torch.nonzero(cut & (src_rank == q) & (dst_rank == rank)).squeeze(1))
    got = torch.cat(recv)
    # Each in-edge's message: its out-edge's own (a local sender), a received one, or zeros.
    stack = out_local.clone()
    stack[got] = out_mine.numel() + torch.arange(got.numel())
    at = stack[union.in_to_out[in_mine]]
    at = torch.where(at < 0, out_mine.numel() + got.numel(), at)
    out_to_in = torch.empty_like(union.in_to_out)
    out_to_in[union.in_to_out] = torch.arange(count)
    in_local = torch.full((count,), -1, dtype=torch.long)
    in_local[in_mine] = torch.arange(in_mine.numel())
    # Shared sends: each in-edge reads its sender's row (local, the halo's, or zeros).
    h = int(halo.recv_rows.numel())
    where = torch.full((n,), -1, dtype=torch.long)
    where[mine] = torch.arange(b)
    where[halo.recv_rows] = b + torch.arange(h)
    at_row = where[union.in_peer[in_mine]]
    at_row = torch.where(at_row < 0, b + h, at_row)
    row_in = torch.full((h,), -1, dtype=torch.long)
    from_halo = torch.nonzero((at_row >= b) & (at_row < b + h)).squeeze(1)
    row_in[at_row[from_halo] - b] = from_halo
    _, at_in = union.positions(graph)
    edge_of = torch.full((int(union.in_row.numel()),), graph.edges, dtype=torch.long)
    edge_of[at_in] = torch.arange(graph.edges)
    return EdgePlan(
        edges=edges,
        send=torch.cat(send),
        send_counts=[int(s.numel()) for s in send],
        recv_counts=[int(r.numel()) for r in recv],
        recv_sender=union.out_row[got],
        recv_in=in_local[out_to_in[got]],
        at=at,
        at_row=at_row,
        row_in=row_in,
        graph_edge=edge_of[in_mine],
    )


def keep_edges(up: torch.Tensor, rule: Rule, edges: Edges, new: Any, old: Any) -> Any:
    """``new`` with the per-edge fields of ``rule`` (``edge_fields``) of a crashed row's
    edges as they were in ``old`` (its out-edges by sender, its in-edges by receiver), as
    the one-process engine keeps them."""
    fields: Mapping[str, str] = rule.edge_fields
    if not fields or bool(up.all()):
        return new
    kept = {}
    for name, side in fields.items():
        a, b = getattr(new, name), getattr(old, name)
        if b.shape != a.shape:  # the edges' state starts at the first step
            b = torch.zeros_like(a)
        rows = edges.out_row if side == "out" else edges.in_row
        mask = up[rows].reshape(-1, *([1] * (a.dim() - 1)))
        kept[name] = torch.where(mask, a, b)
    return new._replace(**kept)


def _row_bytes(value: torch.Tensor) -> torch.Tensor:
    """``[m, ...]`` values as ``[m, bytes]`` uint8, bit for bit."""
    m = value.shape[0]
    per = int(np.prod(value.shape[1:], dtype=np.int64)) * value.element_size()
    return value.contiguous().reshape(-1).view(torch.uint8).reshape(m, per)


def _prefix(buf: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``[m, w]`` mask of each row's first ``lengths`` entries."""
    return torch.arange(buf.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)


@dataclass(frozen=True)
class _Part:
    """A tensor or scalar of a send as it crosses: name, dtype, row shape, whether the
    codec encodes it (its row form; else its values cross)."""

    scalar: bool
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    encoded: bool

    @property
    def n(self) -> int:
        """Values a message holds at most."""
        return int(np.prod(self.shape, dtype=np.int64))

    def lengths(
        self, codec: RowCodec, sent: torch.Tensor, width: torch.Tensor | None
    ) -> torch.Tensor:
        """``[m]`` the bytes of each message (0 where not sent), of its ``width`` values."""
        w = torch.full_like(sent, self.n, dtype=torch.long)
        if width is not None and not self.scalar:
            w = width
        if not self.encoded:
            out = w * self.dtype.itemsize
        else:
            out = torch.zeros_like(w)
            for v in torch.unique(w[sent]).tolist():
                size = wire_width(codec, int(v), self.dtype)
                assert size is not None
                out[w == v] = size
        return torch.where(sent, out, 0)


class ShardEdges(ShardCodecs):
    """The per-edge side of a rank (see the module docstring), beside its codecs'; the
    network it is part of sets the attributes."""

    rule: Rule
    state: Any
    form: BatchedRule
    nodes: tuple[str, ...]
    placement: Placement
    plans: list[GraphPlan]
    edge_plan: EdgePlan
    edge_arrived: list[torch.Tensor]
    edge_wire: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

    def _plan_edges(self, graphs: Sequence[StackedGraph], per_edge: bool) -> None:
        """Plan the graphs of the period for a rule of pattern ``"edges"`` (``per_edge``;
        else plan nothing): :attr:`edge_plans` and :attr:`active`."""
        self.edge_plans: list[EdgePlan] = []
        """Pattern ``"edges"``: this rank's :class:`EdgePlan` of each graph of the period."""
        self.active: list[torch.Tensor | None] = []
        """Per graph and phase: the messages the rule sends at all (``None``: every
        edge's), as one process masks them (a rule's ``widths`` fixed by the graph)."""
        self.edge_wire = {}
        """The round's encoded messages of each tensor sent per edge (or shared), by the
        decoded tensor's id: ``(decoded, [m, bytes] uint8, [m] bytes of each)``."""
        if not per_edge:
            return
        self.form.use_graphs(graphs)
        owner = torch.from_numpy(self.placement.owner)
        rank = self.ranks.rank
        self.edge_plans = [
            plan_edges(self.form.union, g, owner, self.mine, rank, p.halo)
            for g, p in zip(graphs, self.plans, strict=True)
        ]
        phases = range(self.rule.phases)
        self.active = [self.form.active(p, 0, g, self.nodes) for g in graphs for p in phases]

    def _sends(self, slot: int, phase: int) -> torch.Tensor | None:
        """The messages of ``phase`` of graph ``slot`` the rule sends at all (``None``:
        every edge's)."""
        return self.active[slot * self.rule.phases + phase] if self.active else None

    def _use_edges(self, slot: int) -> None:
        """Make the edge plan of graph ``slot`` the current one (if any), and each phase's
        in-edges whose messages arrive when nothing is lost."""
        if not self.edge_plans:
            return
        self.edge_plan = self.edge_plans[slot]
        self.edge_arrived = []
        for phase in range(self.rule.phases):
            sends = self._sends(slot, phase)
            count = self.plans[slot].graph.edges
            every = torch.ones(count, dtype=torch.bool) if sends is None else sends
            padded = torch.cat([every, every.new_zeros(1)])
            self.edge_arrived.append(padded[self.edge_plan.graph_edge])

    def _inbox_edges(
        self, graphs: Sequence[StackedGraph]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None] | None]:
        """What the fault plan of this rank reads of each graph (:class:`ShardFaults`'s
        ``slot_edges`` and ``active``): the edges of its rows' inbox slots, or of its
        rows' in-edges (pattern ``"edges"``), and the messages sent at all."""
        if not self.edge_plans:
            return [g.slot_edge[self.mine] for g in graphs], None
        return [p.graph_edge for p in self.edge_plans], self.active

    def _kept(self, up: torch.Tensor, new: Any) -> Any:
        """``new`` state for the up rows (``up``: ``[B]`` bool) and their edges, the
        current one's for a crashed row and its edges (:func:`keep_edges`)."""
        if self.edge_plans:
            new = keep_edges(up, self.rule, self.edge_plan.edges, new, self.state)
        return keep_up(up, new, self.state, skip=set(self.rule.edge_fields))

    def _encode_edges(
        self,
        values: torch.Tensor,
        up: torch.Tensor,
        t: int,
        owners: torch.Tensor | None,
        width: torch.Tensor | None,
        where: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """What receivers decode of ``values`` (one message a row, row ``r`` sent by the
        local row ``owners[r]``, default row ``r``): the rows ``where`` (default: all)
        whose senders are ``up`` (``[B]`` bool) through their senders' codecs, of their
        ``width`` first values (one codec call per width, as one process calls it); each
        row's encoded bytes are kept for the exchange (:attr:`edge_wire`)."""
        m = values.shape[0]
        owners = torch.arange(m) if owners is None else owners
        sending = up[owners] if where is None else up[owners] & where
        if width is None:
            out = self._roundtrip(values, sending, t, owners)
            kept = self.wire.pop(id(out), None)
            if kept is not None:
                lengths = torch.where(sending, kept[1].shape[1], 0)
                self.edge_wire[id(out)] = (out, kept[1], lengths)
            return out
        out = values.clone()
        groups = []
        for w in torch.unique(width[sending]).tolist():
            if w <= 0:
                continue
            picked = torch.nonzero(sending & (width == w)).squeeze(1)
            part = values[picked, :w].contiguous()
            every = torch.ones_like(picked, dtype=torch.bool)
            decoded = self._roundtrip(part, every, t, owners[picked])
            out[picked, :w] = decoded
            kept = self.wire.pop(id(decoded), None)
            if kept is not None:
                groups.append((picked, kept[1]))
        if wire_width(self.codec, 1, values.dtype) is not None:  # sent encoded (maybe none)
            widest = max((g[1].shape[1] for g in groups), default=0)
            buf = torch.zeros(m, widest, dtype=torch.uint8)
            lengths = torch.zeros(m, dtype=torch.long)
            for picked, encoded in groups:
                buf[picked, : encoded.shape[1]] = encoded
                lengths[picked] = encoded.shape[1]
            self.edge_wire[id(out)] = (out, buf, lengths)
        return out

    def _parts(
        self, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, torch.Tensor]
    ) -> list[_Part]:
        """How each tensor and scalar of a send crosses (encoded where the codec has a row
        form for its dtype), in one order on every rank."""
        parts = []
        for name, value in tensors.items():
            encoded = wire_width(self.codec, 1, value.dtype) is not None
            parts.append(_Part(False, name, value.dtype, tuple(value.shape[1:]), encoded))
        for name, value in scalars.items():
            parts.append(_Part(True, name, value.dtype, tuple(value.shape[1:]), False))
        return parts

    def _swap_edges(
        self,
        parts: list[_Part],
        sources: Mapping[str, torch.Tensor],
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[int]],
        into: tuple[torch.Tensor, torch.Tensor | None, list[int]],
    ) -> dict[str, torch.Tensor]:
        """One exchange of messages: ``out`` = ``(rows of sources to send, whether each
        is sent, its width, counts per destination rank)``; ``into`` = ``(whether each
        received message was sent, its width, counts per source rank)``. Returns the
        received values of every part (zeros where not sent)."""
        rows, sent, width, counts = out
        pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
        for p in parts:
            value = sources[p.name]
            lengths = p.lengths(self.codec, sent, width)
            if p.encoded:
                kept = self.edge_wire.get(id(value))
                if kept is None and not bool(sent.any()):  # nothing to encode: no messages
                    kept = (value, torch.zeros(value.shape[0], 0, dtype=torch.uint8), lengths)
                if kept is None or not torch.equal(torch.where(sent, kept[2][rows], 0), lengths):
                    raise AlgorithmError(
                        f"{self.rule.name!r}: a send the sharded engine does not run."
                    )
                buf = kept[1].index_select(0, rows)
            else:
                buf = _row_bytes(value.index_select(0, rows))
            pieces.append((buf, lengths))
        flat: list[torch.Tensor] = [torch.zeros(0, dtype=torch.uint8)]
        sizes, at = [], 0
        for c in counts:
            size = 0
            for buf, lengths in pieces:
                b, ln = buf[at : at + c], lengths[at : at + c]
                flat.append(b[_prefix(b, ln)])
                size += int(ln.sum())
            sizes.append(size)
            at += c
        far_sent, far_width, far_counts = into
        far_lengths = [p.lengths(self.codec, far_sent, far_width) for p in parts]
        coming, at = [], 0
        for c in far_counts:
            coming.append(sum(int(ln[at : at + c].sum()) for ln in far_lengths))
            at += c
        got = exchange(self.ranks, torch.cat(flat), sizes, coming)
        self.halo_bytes += sum(sizes)
        r = far_sent.numel()
        bufs = [torch.zeros(r, int(ln.max()) if r else 0, dtype=torch.uint8) for ln in far_lengths]
        pos, at = 0, 0
        for c in far_counts:
            for buf, ln in zip(bufs, far_lengths, strict=True):
                sub, lens = buf[at : at + c], ln[at : at + c]
                size = int(lens.sum())
                sub[_prefix(sub, lens)] = got[pos : pos + size]
                pos += size
            at += c
        received: dict[str, torch.Tensor] = {}
        for p, buf, ln in zip(parts, bufs, far_lengths, strict=True):
            value = torch.zeros(r, p.n, dtype=p.dtype)
            w = torch.full((r,), p.n, dtype=torch.long)
            if far_width is not None and not p.scalar:
                w = far_width
            for v in torch.unique(w[far_sent]).tolist():
                if v <= 0:
                    continue
                picked = torch.nonzero(far_sent & (w == v)).squeeze(1)
                size = int(ln[picked[0]])
                raw = buf[picked, :size].clone()
                if p.encoded:
                    value[picked, :v] = decode_rows(self.codec, raw, int(v), p.dtype)
                else:
                    value[picked, :v] = raw.reshape(-1).view(p.dtype).reshape(-1, int(v))
            received[p.name] = value.reshape(r, *p.shape)
        return received

    def _edge_inbox(
        self,
        send: Send | None,
        phase: int,
        t: int,
        up_all: torch.Tensor,
        arrived: torch.Tensor,
        compressed: set[int],
        rows: Rows,
    ) -> EdgeInbox:
        """What arrived on every in-edge of this rank's rows in ``phase``: the message its
        sender sent on that edge, decoded as the one-process engine decodes it, the cut
        edges' (or, a shared send, the boundary rows') exchanged once (see the module
        docstring). ``arrived``: ``[Ei]`` bool."""
        if send is None:
            return EdgeInbox({}, {}, arrived)
        if send.to is not None or send.weighted:
            raise AlgorithmError(f"{self.rule.name!r}: a send the sharded engine does not run.")
        plan, edges = self.edge_plan, self.edge_plan.edges
        up = up_all[self.mine]
        widths = widths_of(self.rule, phase, rows)
        width, width_in = (None, None) if widths is None else widths
        sent = edges.out_live & up[edges.out_row]
        if width is not None:
            sent &= width > 0
        owners = edges.out_row
        if send.shared:  # one message a sender: its row, of its edges' width
            senders = torch.zeros(self.b, dtype=torch.bool)
            senders[edges.out_row[sent]] = True
            owners = torch.arange(self.b)
            if width is not None:
                width = torch.zeros(self.b, dtype=torch.long).index_copy_(0, edges.out_row, width)
            sent = senders
        decoded = {
            name: value
            if id(value) in compressed
            else self._encode_edges(value, up, t, owners, width, sent)
            for name, value in send.tensors.items()
        }
        parts = self._parts(decoded, send.scalars)
        sources = {**decoded, **send.scalars}
        if send.shared:
            rows_out, counts = self.halo.send_rows, (self.halo.send_counts, self.halo.recv_counts)
            far_sent = up_all[self.halo.recv_rows]
            far_width = None
            if width_in is not None:
                far_width = width_in[plan.row_in]
                far_sent &= far_width > 0
            at = plan.at_row
        else:
            rows_out, counts = plan.send, (plan.send_counts, plan.recv_counts)
            far_sent = up_all[plan.recv_sender]
            far_width = None
            if width_in is not None:
                far_width = width_in[plan.recv_in]
                far_sent &= far_width > 0
            at = plan.at
        far = self._swap_edges(
            parts,
            sources,
            (rows_out, sent[rows_out], None if width is None else width[rows_out], counts[0]),
            (far_sent, far_width, counts[1]),
        )

        def stacked(value: torch.Tensor, name: str) -> torch.Tensor:
            pad = value.new_zeros((1, *value.shape[1:]))
            return torch.cat([value, far[name].to(value.dtype), pad]).index_select(0, at)

        tensors = {name: stacked(value, name) for name, value in decoded.items()}
        scalars = {name: stacked(value, name).to(_TOTAL) for name, value in send.scalars.items()}
        return EdgeInbox(tensors, scalars, arrived)
