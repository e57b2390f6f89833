"""A sharded rank's side of a rule that chooses who talks (pattern ``"chosen"``: the server
family, FedAvg and its server optimizers, DoubleSqueeze, APMSqueeze), a part of
:class:`~fedcore.engines.sharded.ShardedNetwork` (:class:`ShardServer`).

The server is one more row, held by one rank; the workers' rows are spread over all. Every
rank asks the rule what the one-process engine asks it (:class:`~fedcore.engines.batched.
BatchedRule`): which rows train this round (``trains``: the others read no batch and take
no step, their losses NaN and their peers idle), and which edges of each phase carry a
message (``talks``: the sampled workers to the server, the server to the next round's
sample; the same answer on every rank, a pure function of the seed and the round). The fault
plan then says which of those arrive (:meth:`~fedcore.engines.shard_faults.ShardFaults.
chosen`, each rank of its own rows' edges), and only those cross ranks, each sender's row
once per rank that holds one of its receivers: a sampled worker's to the server's rank,
the server's to each rank of its receivers. Both ends know which (the plan and the sample
are everyone's), so the round's halo is planned on both sides alike (:func:`round_halo`)
and crosses in one ``all_to_all_single``, each row as its codec encoded it (a phase the
rule sends as it is, ``lossless``: as values).

Each receiver's inbox is the one-process engine's :class:`~fedcore.algorithms.rule.Gathered`
list of its rows: the messages that arrived, grouped by receiver, each receiver's in sorted
sender order (the graph's edge order), so its sums add the same values in the same order;
each message names its sender (``src``), as FedAvg's robust aggregators read it.
A sender's codec round-trips its message once when it sends at all (every sender of a
message of the round that is up, as one process encodes it, whether or not the message is
lost), drawing from its own generator.

Figures: without a fault plan rank 0 counts the round's messages from the graph, as one
process does (a round's traffic is the sample's); with one, each rank its own rows'
(:class:`~fedcore.engines.shard_faults.RowCounts`). The evaluation's "average model" is
the server's model (its bits brought to rank 0 in one reduce of integers), the mean and
the per-node figures the workers' alone, as one process evaluates them.
"""

from __future__ import annotations

from typing import Any

import torch

from fedcore.algorithms.rule import Gathered, Send, SenderRows, lossless
from fedcore.engines.batched import BatchedRule, Messages, raise_bad
from fedcore.engines.ranks import (
    Ranks,
    add_everywhere,
    gather_rows,
    largest_everywhere,
    reduce_to_first,
)
from fedcore.engines.shard_codecs import NOT_FINITE, ShardCodecs
from fedcore.engines.shard_faults import RowCounts, ShardFaults
from fedcore.engines.shard_plan import Halo
from fedcore.engines.shard_refusal import SERVER_ALGORITHMS
from fedcore.engines.stacked_eval import record_of, row_figures_of, sample_of
from fedcore.engines.stacked_graph import StackedGraph
from fedcore.engines.vectorized import _Counter
from fedcore.errors import ProtocolError
from fedcore.evaluation import column_sums, mean_of_sums, sum_extremes, sum_window
from fedcore.setup.prepare import RunSetup
from fedcore.stacked_training import StackedObjective

__all__ = ["SERVER_ALGORITHMS", "ShardServer", "round_halo"]

_TOTAL = torch.float64


def round_halo(
    src: torch.Tensor, dst: torch.Tensor, owner: torch.Tensor, mine: torch.Tensor, ranks: Ranks
) -> Halo:
    """The :class:`Halo` of one phase's messages ``src -> dst`` (global rows; the ones that
    arrive, every rank's: both ends know them) of ``rank``, holding the sorted global rows
    ``mine``, where ``owner`` is each row's rank: per destination rank, the sorted unique
    local senders with a receiver there; per source rank, the sorted unique global senders
    with a receiver here."""
    rank = ranks.rank
    src_rank, dst_rank = owner[src], owner[dst]
    cut = src_rank != dst_rank
    send, recv = [], []
    for q in range(ranks.world):
        send.append(torch.unique(src[cut & (src_rank == rank) & (dst_rank == q)]))
        recv.append(torch.unique(src[cut & (src_rank == q) & (dst_rank == rank)]))
    sent = torch.cat(send)
    return Halo(
        torch.searchsorted(mine, sent),
        [int(s.numel()) for s in send],
        torch.cat(recv),
        [int(r.numel()) for r in recv],
    )


class ShardServer(ShardCodecs):
    """The ``"chosen"`` side of a rank (see the module docstring), beside its codecs'; the
    network it is part of sets the attributes."""

    rule: Any
    form: BatchedRule
    graph: StackedGraph
    nodes: tuple[str, ...]
    local_nodes: tuple[str, ...]
    d: int
    dtype: torch.dtype
    local_of: torch.Tensor
    faults: ShardFaults | None
    setup: RunSetup
    objective: StackedObjective
    shards: Any
    placement: Any
    fulls: list[_Counter]
    round_sent: list[tuple[Messages, torch.Tensor]]

    @property
    def chosen(self) -> bool:
        """Whether the rule chooses who talks (pattern ``"chosen"``)."""
        return bool(self.rule.pattern == "chosen")

    def _training(self, t: int, up_all: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(this rank's rows that compute a gradient in round t, [N] the idle peers)``:
        the up rows the rule's ``trains`` names (all: every up row), and the up peers it
        does not (as one process says)."""
        trains = self.form.trains(t, self.nodes, torch.device("cpu"))
        if trains is None:
            return up_all[self.mine], torch.zeros(self.n, dtype=torch.bool)
        return (up_all & trains)[self.mine], up_all & ~trains

    def _gathered(
        self,
        send: Send | None,
        phase: int,
        t: int,
        up_all: torch.Tensor,
        counts: RowCounts,
        compressed: set[int],
    ) -> Gathered:
        """The :class:`Gathered` inbox of this rank's rows in ``phase`` of round ``t``:
        the round's messages that arrive, the remote ones exchanged once (see the module
        docstring); ``counts`` takes the phase's figures of this rank's rows (a fault
        plan)."""
        g = self.graph

        def size(count: int) -> int:
            return self.codec.nbytes(count, self.dtype)

        by_round = t if self.form.by_round else 0
        m = self.form.messages(phase, g, size, self.d, round=by_round)
        sends: torch.Tensor = self.form.active(phase, t, g, self.nodes)
        self.round_sent.append((m, sends))
        own = torch.zeros(self.n, dtype=torch.bool)
        own[self.mine] = True
        out_edges = torch.nonzero(own[g.src]).squeeze(1)
        in_edges = torch.nonzero(own[g.dst]).squeeze(1)
        if self.faults is None:
            ok_out, ok_in = sends[out_edges], sends[in_edges]
        else:  # the fault plan's edges of this rank's rows are those above, in order
            ok_out, ok_in = self.faults.chosen(t, phase, up_all, counts, m, sends)
        arrived_in = in_edges[ok_in]
        dst = self.local_of[g.dst[arrived_in]]
        src = g.src[arrived_in]
        if send is None:
            return Gathered({}, {}, dst, self.b, src)
        # Every message that arrives anywhere, as both ends know it: this rank's sent ones
        # and received ones (a message between two other ranks is no concern of this one).
        edges = torch.cat([out_edges[ok_out], arrived_in])
        owner = torch.from_numpy(self.placement.owner)
        halo = round_halo(g.src[edges], g.dst[edges], owner, self.mine, self.ranks)
        up = up_all[self.mine]
        senders = torch.zeros(self.b, dtype=torch.bool)
        senders[self.local_of[g.src[out_edges[sends[out_edges]]]]] = True
        senders &= up  # as one process: every up sender of the round encodes, once
        raw = lossless(self.rule, phase, self.form._stub(t, self.nodes, torch.device("cpu")))
        decoded = {}
        for name, value in send.tensors.items():
            if id(value) in compressed:
                decoded[name] = value
            elif raw:  # sent as it is (a lossless phase): only checked
                self._finite(value, senders, t)
                decoded[name] = value
            else:
                decoded[name] = self._roundtrip(value, senders, t)
        encoded = torch.full((self.b,), not raw)
        far = torch.full((int(halo.recv_rows.numel()),), not raw)
        counts_ = (halo.send_counts, halo.recv_counts)
        swap = self._exchange_start(decoded, send.scalars, halo.send_rows, counts_, encoded, far)
        far_t, far_s = swap()
        where = torch.full((self.n,), -1, dtype=torch.long)
        where[self.mine] = torch.arange(self.b)
        where[halo.recv_rows] = self.b + torch.arange(halo.recv_rows.numel())
        rows = where[g.src[arrived_in]]
        tensors = {k: torch.cat([v, far_t[k]]) for k, v in decoded.items()}
        scalars = {
            k: torch.cat([v, far_s[k]]).index_select(0, rows).to(_TOTAL)
            for k, v in send.scalars.items()
        }
        return Gathered(SenderRows(tensors, rows), scalars, dst, self.b, src)

    def _finite(self, values: torch.Tensor, sending: torch.Tensor, t: int) -> None:
        """Stop the run as a strict receiver does if a row ``sending`` sends of ``values``
        (as it is) holds a value that is not finite."""
        flat = values.reshape(values.shape[0], -1)
        suspect = ~torch.isfinite(flat.sum(dim=1)) & sending
        if bool(suspect.any()):
            bad = suspect & ~torch.isfinite(flat).all(dim=1)
            raise_bad(bad, NOT_FINITE, self.local_nodes, t, ProtocolError)

    def _round_traffic(self, t: int) -> _Counter:
        """Rank 0, no fault plan: the traffic of round ``t``, every message sent (as one
        process counts it): a rule that chooses who talks, the round's messages; any other,
        those of its graph, the same every period (counted once, :attr:`fulls`)."""
        counter = _Counter(self.n, torch.device("cpu"))
        if not self.chosen:
            counter.add(self.fulls[t % len(self.fulls)])
        for m, sends in self.round_sent:
            counter.traffic(m, sends)
        return counter

    # -- evaluation: the server's model is the "average model" ----------------------------

    def _evaluate_server(self, params: torch.Tensor, server: int) -> dict[str, Any] | None:
        """The evaluation record (rank 0; ``None`` on the others) of a run whose global row
        ``server`` is the server's: its model the average model, the workers' mean and
        figures (their sample of ``run.eval_peers``) the rest, as one process evaluates
        them. A collective."""
        workers = self.mine != server
        rows = params[workers]
        extremes = sum_extremes(rows)
        largest_everywhere(self.ranks, extremes, "an evaluation's sum window")
        window = sum_window(extremes, params.dtype)
        sums = column_sums(rows, window)
        add_everywhere(self.ranks, sums, "an evaluation's sums")
        mean = mean_of_sums(sums, self.n - 1, params.dtype, window[0])
        sample = sample_of(self.setup, self.n - 1)  # places among the workers
        pick = None
        if sample is not None:
            at = torch.full((self.n,), -1, dtype=torch.long)  # global row -> worker row here
            at[self.mine[workers]] = torch.arange(int(workers.sum()))
            picked = at[sample + (sample >= server).long()]
            pick = picked[picked >= 0]
        ids = tuple(v for v, w in zip(self.local_nodes, workers.tolist(), strict=True) if w)
        acc, norms = row_figures_of(self.setup, self.objective, ids, rows, mean, pick)
        figures = torch.full((self.b, 2), float("nan"), dtype=torch.float64)
        figures[workers] = torch.stack([acc, norms], dim=1)
        every = gather_rows(self.ranks, figures, self.shards)
        kind = _INT[params.dtype.itemsize]
        bits = torch.zeros(self.d, dtype=torch.int64)
        if bool((~workers).any()):  # this rank holds the server: its model's bits
            bits += params[~workers][0].contiguous().view(kind).to(torch.int64)
        if not reduce_to_first(self.ranks, bits, "the server's model") or every is None:
            return None
        average = bits.to(kind).view(params.dtype)
        keep = torch.arange(self.n) != server
        names = tuple(v for i, v in enumerate(self.nodes) if i != server)
        acc_all, norms_all = every[keep, 0].contiguous(), every[keep, 1].contiguous()
        return record_of(self.setup, names, average, acc_all, norms_all, sample)


_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
"""An integer type of each float size: a model's bits, as int64, summed exactly (one
rank's, the others' zeros)."""
