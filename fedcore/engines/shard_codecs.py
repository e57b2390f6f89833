"""The codec side of a sharded rank's halo (:class:`ShardCodecs`, a part of
:class:`~fedcore.engines.sharded.ShardedNetwork`): its rows through their own codecs, the
encoded rows across ranks, push-sum's shares.

A sending rank round-trips its own rows with each peer's own codec (a stochastic codec
draws from the generator of the row's global peer, so a row's draws do not depend on which
rank holds it: :class:`~fedcore.compression.batched.RowCodec` keeps one generator a peer),
keeps their encoded bytes, and sends those across ranks; the receiving rank decodes them
into the same values (:mod:`fedcore.engines.halo_rows`). Push-sum encodes one share per
sender and distinct out-weight (the one-process engine's units, in its order): with a codec
that changes values, those shares cross ranks instead of rows
(:class:`~fedcore.engines.halo_rows.Shares`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from fedcore.algorithms.rule import Send, Slot
from fedcore.compression.batched import RowCodec
from fedcore.engines.batched import _share_units, raise_bad
from fedcore.engines.halo_rows import Shares, encode_sent, plan_shares, swap_rows_start
from fedcore.engines.ranks import Ranks
from fedcore.engines.stacked_graph import StackedGraph
from fedcore.errors import ProtocolError

__all__ = ["NOT_FINITE", "ShardCodecs"]

NOT_FINITE = (
    "the messages of node {node} in round {round} were rejected: a tensor holds "
    "non-finite values (the run diverged; strict mode stops here). Lower algorithm.lr."
)
"""What a receiving node says of a diverged sender (as the one-process engine says)."""


class ShardCodecs:
    """The codec side of a rank's halo; the network it is part of sets the attributes."""

    codec: RowCodec
    ranks: Ranks
    graph: StackedGraph
    n: int
    b: int
    mine: torch.Tensor
    local_nodes: tuple[str, ...]
    halo: Any
    nbr: torch.Tensor
    slot_weight: torch.Tensor
    wire: dict[int, tuple[torch.Tensor, torch.Tensor]]
    halo_bytes: int

    def _roundtrip(
        self, values: torch.Tensor, sending: torch.Tensor, t: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """What receivers decode of the messages ``values``, one a row, row ``r`` sent by
        the local row ``rows[r]`` (default: row ``r``): the rows ``sending`` (``[m]`` bool)
        go through their senders' codecs (each drawing from its global row's generator, as
        the one-process engine's rows do), the others come back as they are (a crashed
        peer encodes nothing). Where the codec has a row form, the encoded rows are kept
        for the halo (:attr:`wire`). A decoded message that is not finite stops the run
        as a strict receiver does."""
        m = values.shape[0]
        owner = torch.arange(m) if rows is None else rows
        out, encoded = encode_sent(self.codec, values, sending, self.mine[owner])
        if encoded is not None:
            self.wire[id(out)] = (out, encoded)
        flat = out.reshape(m, -1)
        # A row whose sum is finite holds only finite values: the exact test runs only on
        # rows whose sum is not (an overflow of large finite values), as one process does.
        suspect = ~torch.isfinite(flat.sum(dim=1)) & sending
        if bool(suspect.any()):
            bad = suspect & ~torch.isfinite(flat).all(dim=1)
            senders = torch.zeros(self.b, dtype=torch.bool)
            senders[owner[bad]] = True
            raise_bad(senders, NOT_FINITE, self.local_nodes, t, ProtocolError)
        return out

    def _units(self) -> Shares:
        """Push-sum's units on this rank (:class:`~fedcore.engines.halo_rows.Shares`) of
        the current graph, made at the first need (kept with the graph: a schedule's
        graphs have their own)."""
        shares: Shares | None = self.graph.cache.get("shard_shares")
        if shares is None:
            halo = self.halo
            shares = plan_shares(
                _share_units(self.graph),
                self.mine,
                halo.send_rows,
                halo.send_counts,
                halo.recv_rows,
                halo.recv_counts,
                self.graph.slot_edge[self.mine],
                self.n,
            )
            self.graph.cache["shard_shares"] = shares
        return shares

    def _exchange_start(
        self,
        tensors: Mapping[str, torch.Tensor],
        scalars: Mapping[str, torch.Tensor],
        rows: torch.Tensor,
        counts: tuple[list[int], list[int]],
        up: torch.Tensor,
        far_up: torch.Tensor,
    ) -> Callable[[], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
        """One halo exchange, started: the messages ``rows`` of ``tensors`` and ``scalars``
        (blocks of ``counts[0]`` per destination rank; their senders ``up[rows]``) go out
        now, each as its codec encoded it (:mod:`fedcore.engines.halo_rows`); the returned
        function waits for what comes back (blocks of ``counts[1]`` per source rank, from
        senders ``far_up``) and decodes it."""
        encoded = {name: self.wire[id(v)][1] for name, v in tensors.items() if id(v) in self.wire}
        parts = (tensors, encoded, scalars)
        finish = swap_rows_start(self.ranks, self.codec, parts, rows, counts, up, far_up)

        def done() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
            far_t, far_s, sent = finish()
            self.halo_bytes += sent
            return far_t, far_s

        return done

    def _shares(
        self, send: Send, t: int, up_all: torch.Tensor, arrived: torch.Tensor
    ) -> list[Slot]:
        """Push-sum's slots when a codec encodes the shares: each sender forms and encodes
        one share a distinct out-weight (a unit, in the one-process engine's order), the
        units of boundary senders cross ranks, encoded; the scalars go with the rows."""
        up = up_all[self.mine]
        halo, plan = self.halo, self._units()
        shares = {
            name: self._roundtrip(
                value.index_select(0, plan.sender) * plan.weight.to(value.dtype).unsqueeze(1),
                up[plan.sender],
                t,
                plan.sender,
            )
            for name, value in send.tensors.items()
        }
        far_t, _ = self._exchange_start(
            shares,
            {},
            plan.send,
            (plan.send_counts, plan.recv_counts),
            up[plan.sender],
            up_all[plan.recv_sender],
        )()
        far_up = up_all[halo.recv_rows]
        counts = (halo.send_counts, halo.recv_counts)
        _, far_s = self._exchange_start({}, send.scalars, halo.send_rows, counts, up, far_up)()
        units = {
            k: torch.cat([v, far_t[k], v.new_zeros((1, *v.shape[1:]))]) for k, v in shares.items()
        }
        scalars = {k: torch.cat([v, far_s[k]]) for k, v in send.scalars.items()}
        slots = []
        for k in range(self.nbr.shape[1]):
            at, w = self.nbr[:, k], self.slot_weight[:, k]
            got_t = {name: value.index_select(0, plan.slot[:, k]) for name, value in units.items()}
            got_s = {name: value.index_select(0, at) * w for name, value in scalars.items()}
            slots.append(Slot(got_t, got_s, w, arrived[:, k]))
        return slots
