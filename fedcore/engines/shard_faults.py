"""A sharded rank's side of the fault plan and of a round's traffic figures.

The one-process vectorized engine (:mod:`fedcore.engines.vectorized`) asks the run's
:class:`~fedcore.faults.FaultPlan` every round which nodes are down and which messages of
every edge are lost, and counts each phase's traffic and faults per node from those masks.
The plan is a keyed hash of ``(round, phase, edge)``, so a rank asks it the same questions
of the edges of its own rows (their in- and out-edges) and gets the same answers:

* :meth:`ShardFaults.arrived`: which slots of its rows' inboxes arrive this phase (the
  in-edge's message not lost: no drop, no partition, neither end down);
* the phase's figures of its own rows, counted as the one-process engine counts them:
  what a row sent (messages, bytes, fp32 bytes), lost as an up sender (dropped) or lost to
  an up receiver (a missing sender), from its out-edges, and what it received or missed
  as an up receiver, from its in-edges (:class:`RowCounts`). A rank's rows' counts travel
  with their losses in the round's one gather to rank 0 (:func:`pack_counts`), so faults
  add no collective to a round;
* per in-edge, the rounds its message was missing or dropped (the summary's ``faults``
  tables), added up on rank 0 once, at the end (:meth:`ShardFaults.tables`).

The per-node lists of a round's records (which senders were missing at a node) need every
lost edge: rank 0 asks the plan for them itself in the rounds whose records it writes
(:meth:`ShardFaults.lost_everywhere`), as the one-process engine does every round.
"""

from __future__ import annotations

from typing import Any

import torch

from fedcore.engines.batched import Messages
from fedcore.engines.ranks import Ranks, reduce_to_first
from fedcore.engines.vectorized import _Counter
from fedcore.faults import FaultPlan

__all__ = [
    "RowCounts",
    "ShardFaults",
    "keep_up",
    "pack_counts",
    "reduce_total",
    "unpack_counts",
]

_FIELDS = (
    "sent",
    "bytes_sent",
    "fp32",
    "received",
    "bytes_received",
    "missing",
    "dropped",
    "missing_senders",
)
"""The per-node counts of a :class:`_Counter`, in the order :class:`RowCounts` holds them."""


class RowCounts:
    """One round's counts of a rank's ``b`` rows, ``[b, 8]`` integers in the order of
    :data:`_FIELDS` (``missing_senders``: how many of a row's messages were missing at an
    up receiver)."""

    def __init__(self, b: int) -> None:
        """Zero counts for ``b`` rows."""
        self.values = torch.zeros(b, len(_FIELDS), dtype=torch.long)

    def add(self, name: str, rows: torch.Tensor, amounts: torch.Tensor) -> None:
        """Add ``amounts[e]`` to row ``rows[e]``'s count ``name``."""
        column = _FIELDS.index(name)
        self.values[:, column].index_add_(0, rows, amounts.to(torch.long))


def pack_counts(loss: torch.Tensor, counts: RowCounts) -> torch.Tensor:
    """``[b, 9]`` float64: each row's loss, then its counts' bits (exact, whatever their
    size), to gather on rank 0 in one go (:func:`unpack_counts`)."""
    return torch.cat([loss.unsqueeze(1), counts.values.view(torch.float64)], dim=1)


def unpack_counts(packed: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, _Counter]:
    """Every node's loss and the round's :class:`_Counter` from the gathered
    :func:`pack_counts` rows (``[N, 9]``)."""
    values = packed[:, 1:].contiguous().view(torch.long)
    counter = _Counter(packed.shape[0], device)
    for column, name in enumerate(_FIELDS):
        value = values[:, column].to(device)
        setattr(counter, name, value > 0 if name == "missing_senders" else value)
    return packed[:, 0].contiguous(), counter


def keep_up(up: torch.Tensor, new: Any, old: Any, skip: set[str] | None = None) -> Any:
    """``new`` for the up rows (``up``: ``[B]`` bool), ``old`` for the crashed ones, field
    by field of a rule's state (a crashed peer keeps its state), as the one-process engine
    keeps its crashed nodes'; the fields named in ``skip`` (state per edge) as in ``new``."""
    if bool(up.all()):
        return new
    b = up.shape[0]
    return type(new)(
        *(
            torch.where(up.reshape(-1, *([1] * (a.dim() - 1))), a, o)
            if isinstance(a, torch.Tensor)
            and a.dim() > 0
            and a.shape[0] == b
            and not (skip and name in skip)
            else a
            for name, a, o in zip(new._fields, new, old, strict=True)
        )
    )


def reduce_total(ranks: Ranks, value: int) -> int | None:
    """Every rank's ``value`` added up on rank 0 (``None`` on the others): one ``reduce``.

    Raises:
        PeerUnavailableError: the reduce failed.
    """
    total = torch.tensor([value], dtype=torch.long)
    if not reduce_to_first(ranks, total, "the reduce of a total"):
        return None
    return int(total[0])


class ShardFaults:
    """The fault plan ``plan`` asked for the in-edges of this rank's rows (see the module
    docstring).

    Args:
        plan: The run's fault plan.
        messages: Per graph of the period (one for a static graph) and phase, graph by
            graph, every message of the graph (the one-process engine's
            :class:`Messages`, one per edge in the graph's edge order).
        own: ``[N]`` bool: the rows this rank holds.
        local_of: ``[N]`` long: each row's place among this rank's rows (-1: not held).
        slot_edges: Per graph of the period, ``[B, K]`` long: the edge of each slot of
            this rank's rows' inboxes (the graph's ``slot_edge`` rows of this rank;
            ``E``: padding); a rule of pattern ``"edges"``: ``[Ei]``, the edge of each
            in-edge of this rank's rows (``E``: not in that graph).
        active: Per entry of ``messages``, the messages the rule sends at all (``None``:
            every one; RPS sends nothing on an edge of width 0), as one process masks them.
    """

    def __init__(
        self,
        plan: FaultPlan,
        messages: list[Messages],
        own: torch.Tensor,
        local_of: torch.Tensor,
        slot_edges: list[torch.Tensor],
        active: list[torch.Tensor | None] | None = None,
    ) -> None:
        """Index the in-edges of ``own`` in every phase of every graph."""
        self.plan = plan
        self.messages = messages
        self.period = len(slot_edges)
        self.phases = len(messages) // self.period
        self.n = int(own.numel())
        self.local_of = local_of
        # Per graph and phase (entry ``graph * phases + phase``):
        self.outward: list[Messages] = []  # the out-edges' messages
        self.inward: list[Messages] = []
        self.edges: list[torch.Tensor] = []  # the in-edges' indices
        self.slots: list[torch.Tensor] = []  # [B, K] positions among them
        self.missing: list[torch.Tensor] = []  # per in-edge: rounds missing
        self.dropped: list[torch.Tensor] = []  # per in-edge: rounds dropped
        self.active = active or [None] * len(messages)
        self.active_out: list[torch.Tensor] = []  # the out-edges' messages sent at all
        self.active_in: list[torch.Tensor] = []
        self.out_edges: list[torch.Tensor] = []  # the out-edges' indices
        for i, m in enumerate(messages):
            edges = torch.nonzero(own[m.dst]).squeeze(1)
            self.edges.append(edges)
            self.inward.append(Messages(*(part[edges] for part in m)))
            out = torch.nonzero(own[m.src]).squeeze(1)
            self.out_edges.append(out)
            self.outward.append(Messages(*(part[out] for part in m)))
            sends = self.active[i]
            every = torch.ones_like(m.src, dtype=torch.bool) if sends is None else sends
            self.active_out.append(every[out])
            self.active_in.append(every[edges])
            at = torch.full((m.src.numel() + 1,), edges.numel(), dtype=torch.long)
            at[edges] = torch.arange(edges.numel())
            self.slots.append(at[slot_edges[i // self.phases]])
            self.missing.append(torch.zeros(edges.numel(), dtype=torch.long))
            self.dropped.append(torch.zeros(edges.numel(), dtype=torch.long))

    def _entry(self, t: int, phase: int) -> int:
        """The entry of round ``t``'s graph and ``phase`` (round ``t`` runs the graph of
        ``t % period``)."""
        return (t % self.period) * self.phases + phase

    def up(self, t: int) -> torch.Tensor:
        """``[N]`` bool: the nodes that run round ``t`` (every rank knows every node's)."""
        return ~self.plan.down_mask(t)

    def arrived(self, t: int, phase: int, up: torch.Tensor, counts: RowCounts) -> torch.Tensor:
        """``[B, K]`` bool: the slots of this rank's inboxes whose message of ``phase``
        arrives in round ``t``; adds the phase's figures of this rank's rows to ``counts``
        (its in-edges' and out-edges', see the module docstring) and the in-edges' to the
        per-edge tables, as the one-process engine counts them."""
        at = self._entry(t, phase)
        m = (self.outward[at], self.inward[at])
        _, ok = self._count(t, phase, up, counts, m, (self.active_out[at], self.active_in[at]))
        return torch.cat([ok, ok.new_zeros(1)])[self.slots[at]]

    def chosen(
        self,
        t: int,
        phase: int,
        up: torch.Tensor,
        counts: RowCounts,
        m: Messages,
        sends: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A rule that chooses who talks (pattern ``"chosen"``): ``(arrived, arrived)`` of
        this rank's out-edges and in-edges (:attr:`out_edges`, :attr:`edges`) in ``phase``
        of round ``t``, whose messages ``m`` (every edge's, of this round's sizes) are sent
        where ``sends`` says; counted as :meth:`arrived` counts."""
        at = self._entry(t, phase)
        out, edges = self.out_edges[at], self.edges[at]
        both = (Messages(*(p[out] for p in m)), Messages(*(p[edges] for p in m)))
        return self._count(t, phase, up, counts, both, (sends[out], sends[edges]))

    def _count(
        self,
        t: int,
        phase: int,
        up: torch.Tensor,
        counts: RowCounts,
        m: tuple[Messages, Messages],
        sends: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether the messages ``m`` (this rank's out-edges', in-edges') of ``phase`` sent
        where ``sends`` says arrive in round ``t``; their figures into ``counts`` and the
        per-edge tables."""
        at = self._entry(t, phase)
        out, into = m
        gone = self.plan.lost_mask(out.src, out.dst, t, phase) & sends[0]
        ok_out = ~gone & sends[0]
        ok = ok_out.to(torch.long)
        senders = self.local_of[out.src]
        counts.add("sent", senders, ok)
        counts.add("bytes_sent", senders, out.nbytes * ok)
        counts.add("fp32", senders, out.fp32 * ok)
        counts.add("dropped", senders, gone & up[out.src])
        counts.add("missing_senders", senders, gone & up[out.dst])
        gone = self.plan.lost_mask(into.src, into.dst, t, phase) & sends[1]
        ok_in = ~gone & sends[1]
        dropped, missing = gone & up[into.src], gone & up[into.dst]
        self.dropped[at] += dropped
        self.missing[at] += missing
        receivers = self.local_of[into.dst]
        counts.add("received", receivers, ok_in)
        counts.add("bytes_received", receivers, into.nbytes * ok_in)
        counts.add("missing", receivers, missing)
        return ok_out, ok_in

    def lost_everywhere(
        self,
        t: int,
        up: torch.Tensor,
        counter: _Counter,
        sent: list[tuple[Messages, torch.Tensor]] | None = None,
    ) -> None:
        """Put every phase's lost messages of round ``t`` (all edges of its graph) into
        ``counter``'s ``lost``, as the one-process engine lists them for the node records
        (rank 0, in the rounds whose records it writes); ``sent``: per phase, the round's
        messages and which are sent (a rule that chooses who talks)."""
        for phase in range(self.phases):
            at = self._entry(t, phase)
            m, sends = self.messages[at], self.active[at]
            if sent is not None:
                m, sends = sent[phase]
            gone = self.plan.lost_mask(m.src, m.dst, t, phase)
            if sends is not None:
                gone = gone & sends
            counter.lost.append((m, (gone & up[m.src]) | (gone & up[m.dst]), False))

    def tables(
        self, ranks: Ranks, nodes: tuple[str, ...]
    ) -> tuple[dict[str, int], dict[str, int]] | None:
        """``(missing per edge, lost per edge)`` of the whole run, keyed
        ``"sender->receiver"`` (only edges with a count), on rank 0 (``None`` on the
        others): every rank's in-edges' counts added up in one ``reduce``. A collective.

        Raises:
            PeerUnavailableError: the reduce failed.
        """
        parts = [torch.zeros(2, 0, dtype=torch.long)]
        for m, edges, missing, dropped in zip(
            self.messages, self.edges, self.missing, self.dropped, strict=True
        ):
            counts = torch.zeros(2, m.src.numel(), dtype=torch.long)
            parts.append(counts.index_copy_(1, edges, torch.stack([missing, dropped])))
        full = torch.cat(parts, dim=1)
        if not reduce_to_first(ranks, full, "the reduce of the fault tables"):
            return None
        missing_table: dict[str, int] = {}
        dropped_table: dict[str, int] = {}
        at = 0
        for m in self.messages:
            src, dst = m.src.tolist(), m.dst.tolist()
            counts = full[:, at : at + len(src)]
            at += len(src)
            for table, column in ((missing_table, counts[0]), (dropped_table, counts[1])):
                for e in torch.nonzero(column).flatten().tolist():
                    key = f"{nodes[src[e]]}->{nodes[dst[e]]}"
                    table[key] = table.get(key, 0) + int(column[e])
        return missing_table, dropped_table
