"""A sharded rank's side of the fault plan and of a round's traffic figures.

The one-process vectorized engine (:mod:`fedcore.engines.vectorized`) asks the run's
:class:`~fedcore.faults.FaultPlan` every round which nodes are down and which messages of
every edge are lost, and counts each phase's traffic and faults per node from those masks.
The plan is a keyed hash of ``(round, phase, edge)``, so a rank asks it the same questions
of the edges into its own rows (its receivers' in-edges) and gets the same answers:

* :meth:`ShardFaults.arrived`: which slots of its rows' inboxes arrive this phase (the
  in-edge's message not lost: no drop, no partition, neither end down);
* the phase's figures of those in-edges, counted as the one-process engine counts them
  (:class:`~fedcore.engines.vectorized._Counter`: sent, bytes and the fp32 bytes at the
  sender, received at the receiver, a loss as dropped at an up sender and missing at an
  up receiver): every edge is counted by exactly one rank, its receiver's, so the sum of
  the ranks' counts is the one-process count. :func:`reduce_counts` adds them up on rank 0
  (one ``reduce`` of ``[8, N]`` integers a round: exact in any order);
* per in-edge, the rounds its message was missing or dropped (the summary's ``faults``
  tables), added up on rank 0 once, at the end (:meth:`ShardFaults.tables`).

The per-node lists of a round's records (which senders were missing at a node) need every
lost edge: rank 0 asks the plan for them itself in the rounds whose records it writes
(:meth:`ShardFaults.lost_everywhere`), as the one-process engine does every round.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from fedcore.engines.batched import Messages
from fedcore.engines.ranks import Ranks, lost
from fedcore.engines.vectorized import _Counter
from fedcore.faults import FaultPlan

__all__ = ["ShardFaults", "reduce_counts", "reduce_total"]

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
"""The per-node counts of a :class:`_Counter` the ranks add up, in this order."""


def reduce_counts(ranks: Ranks, counter: _Counter) -> _Counter | None:
    """Every rank's ``counter`` added up on rank 0 (``None`` on the others): one ``reduce``
    (a sum of integers, so the order of the additions does not matter).

    Raises:
        PeerUnavailableError: the reduce failed.
    """
    values = [getattr(counter, name).to(torch.long) for name in _FIELDS]
    stacked = torch.stack(values)
    if ranks.world > 1:
        try:
            dist.reduce(stacked, dst=0, op=dist.ReduceOp.SUM)
        except (RuntimeError, ValueError) as exc:
            raise lost(ranks, "the reduce of a round's counts", exc) from exc
        if ranks.rank != 0:
            return None
    total = _Counter(counter.n, counter.sent.device)
    for name, value in zip(_FIELDS, stacked, strict=True):
        setattr(total, name, value > 0 if name == "missing_senders" else value)
    return total


def reduce_total(ranks: Ranks, value: int) -> int | None:
    """Every rank's ``value`` added up on rank 0 (``None`` on the others): one ``reduce``.

    Raises:
        PeerUnavailableError: the reduce failed.
    """
    total = torch.tensor([value], dtype=torch.long)
    if ranks.world > 1:
        try:
            dist.reduce(total, dst=0, op=dist.ReduceOp.SUM)
        except (RuntimeError, ValueError) as exc:
            raise lost(ranks, "the reduce of a total", exc) from exc
        if ranks.rank != 0:
            return None
    return int(total[0])


class ShardFaults:
    """The fault plan ``plan`` asked for the in-edges of this rank's rows (see the module
    docstring).

    Args:
        plan: The run's fault plan.
        messages: Per phase, every message of the graph (the one-process engine's
            :class:`Messages`, one per edge in the graph's edge order).
        own: ``[N]`` bool: the rows this rank holds.
        slot_edge: ``[B, K]`` long: the edge of each slot of this rank's rows' inboxes
            (the graph's ``slot_edge`` rows of this rank; ``E``: padding).
    """

    def __init__(
        self,
        plan: FaultPlan,
        messages: list[Messages],
        own: torch.Tensor,
        slot_edge: torch.Tensor,
    ) -> None:
        """Index the in-edges of ``own`` in every phase."""
        self.plan = plan
        self.messages = messages
        self.n = int(own.numel())
        self.inward: list[Messages] = []
        self.edges: list[torch.Tensor] = []  # per phase, the in-edges' indices
        self.slots: list[torch.Tensor] = []  # per phase, [B, K] positions among them
        self.missing: list[torch.Tensor] = []  # per phase and in-edge: rounds missing
        self.dropped: list[torch.Tensor] = []  # per phase and in-edge: rounds dropped
        for m in messages:
            edges = torch.nonzero(own[m.dst]).squeeze(1)
            self.edges.append(edges)
            self.inward.append(Messages(*(part[edges] for part in m)))
            at = torch.full((m.src.numel() + 1,), edges.numel(), dtype=torch.long)
            at[edges] = torch.arange(edges.numel())
            self.slots.append(at[slot_edge])
            self.missing.append(torch.zeros(edges.numel(), dtype=torch.long))
            self.dropped.append(torch.zeros(edges.numel(), dtype=torch.long))

    def up(self, t: int) -> torch.Tensor:
        """``[N]`` bool: the nodes that run round ``t`` (every rank knows every node's)."""
        return ~self.plan.down_mask(t)

    def arrived(self, t: int, phase: int, up: torch.Tensor, counter: _Counter) -> torch.Tensor:
        """``[B, K]`` bool: the slots of this rank's inboxes whose message of ``phase``
        arrives in round ``t``; counts the phase's traffic and faults of the in-edges into
        ``counter`` and the per-edge tables, as the one-process engine counts them."""
        m = self.inward[phase]
        gone = self.plan.lost_mask(m.src, m.dst, t, phase)
        ok = ~gone
        dropped, missing = gone & up[m.src], gone & up[m.dst]
        self.dropped[phase] += dropped
        self.missing[phase] += missing
        counter.faults(m, dropped, missing)
        counter.traffic(m, ok)
        return torch.cat([ok, ok.new_zeros(1)])[self.slots[phase]]

    def lost_everywhere(self, t: int, up: torch.Tensor, counter: _Counter) -> None:
        """Put every phase's lost messages of round ``t`` (all edges) into ``counter``'s
        ``lost``, as the one-process engine lists them for the node records (rank 0, in
        the rounds whose records it writes)."""
        for phase, m in enumerate(self.messages):
            gone = self.plan.lost_mask(m.src, m.dst, t, phase)
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
        if ranks.world > 1:
            try:
                dist.reduce(full, dst=0, op=dist.ReduceOp.SUM)
            except (RuntimeError, ValueError) as exc:
                raise lost(ranks, "the reduce of the fault tables", exc) from exc
            if ranks.rank != 0:
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
