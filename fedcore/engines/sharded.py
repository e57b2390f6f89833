"""The vectorized engine sharded over torch.distributed ranks: each rank holds a share of
the peers' stacked rows and exchanges only the rows its neighbours need.

Design (the first slice; :func:`refusal` says what it does not run yet):

* **Rows.** Rank ``r`` of ``R`` holds a sorted list of global rows, ``shards[r]``, placed
  by ``simulate.partition`` (:func:`fedcore.engines.partition.place`): contiguous blocks
  of graph order, or a balanced partition of the graph that cuts few edges (grown by
  breadth-first search, or METIS), each rank computing the same one from the same graph.
  Its state is the rule's state of those rows only (``B = len(shards[r])``), in global
  order, built and stepped by the same :class:`~fedcore.algorithms.rule.Rule` the
  one-process engine runs with ``B = N``; the rows' ids, data (``own``), sample counts
  and :attr:`~fedcore.algorithms.rule.Rows.index` are those global rows'. Nothing below
  reads that a rank's rows are contiguous: the gathers put each rank's rows back at their
  global places on rank 0.
* **Halo.** Every rank reads the whole graph (the same file, the same seed) and derives the
  same plan (:class:`Halo`): for each destination rank, the sorted unique rows of this
  rank that have an out-edge into that rank's rows. Each phase, the rows a rule sends
  (its :class:`~fedcore.algorithms.rule.Send`: tensors and scalars, every dtype packed as
  bytes into one ``uint8`` row) go out in one ``all_to_all_single`` with those split sizes:
  each boundary row once per destination rank, never once per edge. What comes back,
  appended below the rank's own rows, is the *extended stack*: the receiver's in-neighbour
  table (:class:`~fedcore.engines.stacked_graph.StackedGraph`'s ``nbr``, its rows of this
  rank) is re-indexed into it.
* **Per-edge state** (robust push-sum's totals, RPS's blocks; not run yet) would travel the
  same way: a rule of pattern ``"edges"`` sends one row per out-edge, so the halo plan
  becomes one of cut edges (each cut edge's row once, to its receiver's rank), and a
  receiver's in-edges index into the extended stack as the slots do here.
* **Order of sums, and why R does not matter.** A receiver's inbox is its row of the
  global neighbour table: its in-neighbours in sorted-id order, padded to the whole graph's
  largest in-degree, exactly the slots the one-process engine builds. The rule adds them
  slot by slot (``gossip``, push-sum's ``mix``) with the same elementwise operations on
  the same operands: a sender's row arrives bit for bit (raw bytes, a lossless codec), and
  push-sum's share ``x_j * W_ji`` is formed from the same two values. Each row's result is
  thus a function of its own inputs in a fixed order, whatever rank holds it; the
  gradients are batch-invariant per row (:mod:`fedcore.gradients`). So R = 1, 2, 4 give the
  one-process engine's parameters, bit for bit (``tests/engines/test_sharded.py``).
* **Figures.** Traffic of a static graph with no faults is the same every round: rank 0
  counts it once from the graph (as the one-process engine does). Each round the ranks'
  losses are gathered on rank 0, and the models on evaluation rounds and at the end; rank 0
  writes the run's files (:mod:`fedcore.simulation.ranks`), and its summary says how the
  peers were placed: the ``partition`` that ran, the ``cut_fraction`` of edges whose ends
  are on different ranks, and the ``halo_bytes_per_round`` that crossed ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from fedcore.algorithms.rule import Rows, Rule, Send, SenderRows, Slot, is_rule
from fedcore.config import Config
from fedcore.engines.batched import batched_form, raise_bad
from fedcore.engines.partition import (
    METIS_MISSING,
    cut_fraction,
    halo_rows,
    metis_available,
    place,
)
from fedcore.engines.ranks import Ranks, exchange, gather_rows
from fedcore.engines.stacked_graph import stack_graph
from fedcore.engines.vectorized import RoundFigures, _Counter, stacked_batches
from fedcore.errors import AlgorithmError, ConfigError, ProtocolError
from fedcore.setup.prepare import RunSetup
from fedcore.setup.virtual import row_codec
from fedcore.stacked_training import StackedObjective

__all__ = [
    "SHARDED_ALGORITHMS",
    "Halo",
    "ShardedNetwork",
    "config_refusal",
    "is_eval_round",
    "plan_halo",
    "setup_refusal",
]

SHARDED_ALGORITHMS = ("central", "choco", "deepsqueeze", "dog", "dol", "dpsgd", "local", "ops")
"""The algorithms a sharded run runs: the synchronous rules whose peers send one message to
every out-neighbour (pattern ``"neighbours"``, or ``"none"``), each held equal to one
process by ``tests/engines/test_sharded.py``. The server family, RPS and robust push-sum
(state per edge) wait for later slices; the asynchronous ones run on the event engine."""

_NOT_FINITE = (
    "the messages of node {node} in round {round} were rejected: a tensor holds "
    "non-finite values (the run diverged; strict mode stops here). Lower algorithm.lr."
)
"""What a receiving node says of a diverged sender (as the one-process engine says)."""


def config_refusal(config: Config) -> str | None:
    """Why a sharded run cannot run ``config``, as far as the config tells (one clause),
    or None: checked before any rank starts."""
    algorithm = config.algorithm
    if config.simulate.engine == "messages":
        return (
            "simulate.engine = 'messages' runs every peer in one process; ranks shard the "
            "vectorized engine (simulate.engine = 'auto')"
        )
    if config.simulate.device != "cpu":
        device = config.simulate.device
        return f"simulate.device = {device!r}: ranks run on the CPU (gloo) for now"
    if algorithm.name not in SHARDED_ALGORITHMS:
        return (
            f"algorithm {algorithm.name!r} is not sharded yet (ranks run "
            f"{', '.join(SHARDED_ALGORITHMS)})"
        )
    if algorithm.options.get("robust"):
        return "robust push-sum keeps state per edge, which ranks do not exchange yet"
    codec, dtype = config.compression.codec, config.model.dtype
    if not (codec == "raw" or (codec == "fp32" and dtype == "float32")):
        return (
            f"compression.codec = {codec!r} on a {dtype} model changes what is sent; ranks "
            "send rows as they are (fp32 on float32 models, or raw) for now"
        )
    if config.faults.active:
        return "a fault plan is not sharded yet (ranks run with no faults)"
    if config.time.active or config.transport.mode != "strict":
        return "virtual time ([time], deadline mode) is not sharded yet"
    if config.run.checkpoint_every:
        return "checkpoints of a sharded run are not written yet (set run.checkpoint_every = 0)"
    if config.run.local_steps != 1:
        return "run.local_steps > 1 is not sharded yet"
    if config.data.stream:
        return "an online data stream (data.stream) is not sharded yet"
    if config.simulate.partition == "metis" and not metis_available():
        return METIS_MISSING
    return None


def setup_refusal(setup: RunSetup) -> str | None:
    """Why a sharded run cannot run ``setup`` beyond what the config tells (one clause),
    or None: checked by every rank before it joins the others."""
    algorithm = setup.algorithm
    why = config_refusal(setup.config)
    if why is not None:
        return why
    if setup.graph.period != 1:
        return "a schedule of graphs (time-varying topology) is not sharded yet"
    if not is_rule(algorithm):
        return f"algorithm {algorithm.name!r} has no batched form"
    rule = cast(Rule, algorithm)
    if (
        rule.pattern not in ("neighbours", "none")
        or rule.server is not None
        or rule.robust
        or rule.trains is not None
    ):
        return f"algorithm {rule.name!r} is not sharded yet"
    if setup.optimizer() is not None:
        return "a node optimizer ([optimizer]) is not sharded yet"
    if setup.source is not None:
        return "an online data source is not sharded yet"
    return None


@dataclass(frozen=True, eq=False)
class Halo:
    """What one rank sends and receives each phase (see the module docstring).

    Attributes:
        send_rows: Local row indices to send, grouped by destination rank in rank order,
            each group the sorted unique rows some peer of that rank listens to.
        send_counts: Rows per destination rank.
        recv_rows: Global row indices received, grouped by source rank in rank order,
            each group sorted (what the source's ``send_rows`` to this rank are).
        recv_counts: Rows per source rank.
    """

    send_rows: torch.Tensor
    send_counts: list[int]
    recv_rows: torch.Tensor
    recv_counts: list[int]


def plan_halo(
    src: np.ndarray[Any, Any],
    dst: np.ndarray[Any, Any],
    parts: Sequence[np.ndarray[Any, Any]],
    rank: int,
) -> Halo:
    """The :class:`Halo` of ``rank`` for the edges ``src -> dst`` (global rows) when rank
    ``r`` holds the sorted global rows ``parts[r]``; every rank computes every other's the
    same way."""
    n = sum(int(p.size) for p in parts)
    owner = np.empty(n, dtype=np.int64)
    for r, rows in enumerate(parts):
        owner[rows] = r
    owner_src, owner_dst = owner[src], owner[dst]
    cut = owner_src != owner_dst
    mine = parts[rank]
    send: list[np.ndarray[Any, Any]] = []
    recv: list[np.ndarray[Any, Any]] = []
    for q in range(len(parts)):
        out = cut & (owner_src == rank) & (owner_dst == q)
        send.append(np.searchsorted(mine, np.unique(src[out])))  # local rows
        into = cut & (owner_src == q) & (owner_dst == rank)
        recv.append(np.unique(src[into]))
    return Halo(
        torch.from_numpy(np.concatenate(send).astype(np.int64)),
        [int(s.size) for s in send],
        torch.from_numpy(np.concatenate(recv).astype(np.int64)),
        [int(r.size) for r in recv],
    )


_Layout = list[tuple[str, str, torch.dtype, tuple[int, ...], int]]
"""How :func:`_pack` laid out a send's rows: (kind, name, dtype, row shape, bytes) each."""


def _pack(send: Send, rows: torch.Tensor) -> tuple[torch.Tensor, _Layout]:
    """The rows ``rows`` of every tensor and scalar of ``send`` as one ``[len(rows), bytes]``
    uint8 tensor (bit for bit), and how to unpack it."""
    parts: list[torch.Tensor] = []
    layout: _Layout = []
    for kind, values in (("tensor", send.tensors), ("scalar", send.scalars)):
        for name, value in values.items():
            picked = value.index_select(0, rows).contiguous()
            per_row = int(np.prod(value.shape[1:], dtype=np.int64))
            raw = picked.reshape(picked.shape[0], per_row).view(torch.uint8)
            parts.append(raw)
            layout.append((kind, name, value.dtype, tuple(value.shape[1:]), raw.shape[1]))
    packed = torch.cat(parts, dim=1) if parts else torch.zeros((rows.numel(), 0), dtype=torch.uint8)
    return packed, layout


def _unpack(
    packed: torch.Tensor, layout: _Layout
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, torch.Tensor] = {}
    at = 0
    m = packed.shape[0]
    for kind, name, dtype, shape, width in layout:
        raw = packed[:, at : at + width].contiguous()
        at += width
        value = raw.view(dtype).reshape(m, *shape)
        (tensors if kind == "tensor" else scalars)[name] = value
    return tensors, scalars


class ShardedNetwork:
    """This rank's block of the peers of ``setup`` (see the module docstring); rank 0 also
    answers what a run's figures need (:meth:`run_round`'s figures, :meth:`model`).

    Raises:
        ConfigError: :func:`setup_refusal` names a reason.
    """

    def __init__(self, setup: RunSetup, ranks: Ranks) -> None:
        """Build this rank's rows, its halo plan and its slots of the neighbour table."""
        why = setup_refusal(setup)
        if why is not None:
            raise ConfigError(f"a sharded run cannot run this config: {why}.")
        self.setup = setup
        self.ranks = ranks
        self.device = torch.device("cpu")
        self.nodes = setup.graph.nodes
        self.n = len(self.nodes)
        graph = stack_graph(setup.graph.at(0), device=self.device)
        src, dst = graph.src.numpy(), graph.dst.numpy()
        self.placement = place(setup.config.simulate.partition, self.n, src, dst, ranks.world)
        self.shards = self.placement.rows
        """Per rank, its sorted global rows (:mod:`fedcore.engines.partition`)."""
        rows = self.shards[ranks.rank]
        self.mine = torch.from_numpy(rows)
        """This rank's global rows: local row ``i`` is node ``nodes[mine[i]]``."""
        self.b = int(rows.size)
        self.local_nodes = tuple(self.nodes[i] for i in rows.tolist())
        self.start = setup.start.to(self.device)
        self.d = int(self.start.numel())
        self.dtype = self.start.dtype
        self.codec = row_codec(setup)
        self.form = batched_form(
            setup.algorithm, codec=self.codec.name, itemsize=self.start.element_size()
        )
        self.rule = self.form.rule
        self.halo = plan_halo(src, dst, self.shards, ranks.rank)
        # Global row -> row of the extended stack (own rows, then the halo's).
        where = torch.full((self.n,), -1, dtype=torch.long)
        where[self.mine] = torch.arange(self.b)
        where[self.halo.recv_rows] = self.b + torch.arange(self.halo.recv_rows.numel())
        mine = self.mine
        self.nbr = where[graph.nbr[mine]]  # [B, K]: padding points at the row itself
        assert bool((self.nbr >= 0).all()), "an in-neighbour outside the halo"
        self.slot_weight = graph.slots(graph.weight)[mine]  # [B, K] float64, padding 0
        self.arrived = graph.slots(torch.ones_like(graph.src, dtype=torch.bool))[mine]
        self.self_weight = graph.self_weight[mine]
        self.in_degree = torch.bincount(graph.dst, minlength=self.n)[mine]
        held = np.asarray([len(p) for p in setup.parts], dtype=np.float64)
        self.samples = torch.from_numpy(held[rows])
        self.state = self.rule.init(self.start.unsqueeze(0).repeat(self.b, 1))
        self.objective = StackedObjective(setup.objective, self.device, setup.evaluator)
        self.batches = stacked_batches(setup, self.device)  # every node's, read for ours
        self.own = np.zeros(self.n, dtype=np.bool_)
        self.own[rows] = True
        self.round = 0
        self.widths: list[int] = []
        """Bytes of one packed row in each phase of the last round (the halo's rows)."""
        self.full = _Counter(self.n, self.device)  # the traffic of a round, on rank 0
        self.cut_fraction = 0.0
        """Rank 0: the share of the graph's edges whose ends are on different ranks."""
        self.halo_rows = 0
        """Rank 0: rows that cross ranks in one exchange, all ranks together."""
        if ranks.rank == 0:
            for p in range(self.rule.phases):
                self.full.traffic(self.form.messages(p, graph, self._size, self.d), None)
            owner = self.placement.owner
            self.cut_fraction = cut_fraction(src, dst, owner)
            self.halo_rows = halo_rows(src, dst, owner, ranks.world)
        self.last = self.start.unsqueeze(0).repeat(self.n, 1) if ranks.rank == 0 else None
        """Rank 0: the models of the last gather (what a failed run's summary holds)."""

    @property
    def halo_bytes_per_round(self) -> int:
        """Rank 0: bytes that crossed ranks in the last round: each boundary row once per
        destination rank, times the packed row's bytes, summed over the phases."""
        return self.halo_rows * sum(self.widths)

    def _size(self, n: int) -> int:
        return self.codec.nbytes(n, self.dtype)

    def check(self) -> None:
        """Nothing deferred: every check of a CPU rank is read at once."""

    def fault_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """No fault plan: nothing missing, nothing lost."""
        return {}, {}

    def model(self) -> torch.Tensor | None:
        """Every node's model, gathered on rank 0 (``[N, d]``); ``None`` on the others.
        A collective: every rank calls it at the same point of the run."""
        full = gather_rows(self.ranks, self.rule.model(self.state), self.shards)
        if full is not None:
            self.last = full
        return full

    def _rows(self, t: int, lr: float) -> Rows:
        nodes = self.local_nodes

        def fail(bad: torch.Tensor, why: str) -> None:
            raise_bad(bad, why, nodes, t, AlgorithmError)

        return Rows(
            round=t,
            lr=lr,
            self_weight=self.self_weight,
            fail=fail,
            in_degree=self.in_degree,
            n=self.n,
            ids=nodes,
            nodes=self.nodes,
            samples=self.samples,
            codec=self.codec.name,
            index=self.mine,
        )

    def _inbox(self, send: Send, t: int) -> list[Slot]:
        """This block's slots of the phase whose messages are ``send``: its rows and the
        halo's, exchanged once (see the module docstring)."""
        if send.to is not None or send.shared:
            raise AlgorithmError(f"{self.rule.name!r}: a send the sharded engine does not run.")
        for value in send.tensors.values():  # as a receiver checks what it decodes
            bad = ~torch.isfinite(value.reshape(value.shape[0], -1).sum(dim=1))
            if bool(bad.any()):
                raise_bad(bad, _NOT_FINITE, self.local_nodes, t, ProtocolError)
        halo = self.halo
        packed, layout = _pack(send, halo.send_rows)
        self.widths.append(int(packed.shape[1]))
        got = exchange(self.ranks, packed, halo.send_counts, halo.recv_counts)
        far_tensors, far_scalars = _unpack(got, layout)
        tensors = {k: torch.cat([v, far_tensors[k]]) for k, v in send.tensors.items()}
        scalars = {k: torch.cat([v, far_scalars[k]]) for k, v in send.scalars.items()}
        slots = []
        for k in range(self.nbr.shape[1]):
            at = self.nbr[:, k]
            w = self.slot_weight[:, k]
            if send.weighted:  # push-sum: the share W_ji x_j, formed as the sender forms it
                got_t: Mapping[str, torch.Tensor] = {
                    name: value.index_select(0, at) * w.to(value.dtype).unsqueeze(1)
                    for name, value in tensors.items()
                }
                got_s = {name: value.index_select(0, at) * w for name, value in scalars.items()}
            else:
                got_t = SenderRows(tensors, at)
                got_s = {name: value.index_select(0, at) for name, value in scalars.items()}
            slots.append(Slot(got_t, got_s, w, self.arrived[:, k]))
        return slots

    def run_round(self) -> RoundFigures | None:
        """Run round ``self.round`` for this block; rank 0 returns the round's figures
        (the others ``None``). A collective: every rank runs every round."""
        t = self.round
        self.widths = []
        lr = self.setup.options.lr_at(t)
        params = self.rule.model(self.state)
        _, x, y, mask = self.batches.next(self.own)
        losses, grad = self.objective.loss_and_grad(params, x, y, mask)
        rows = self._rows(t, lr)
        state, send = self.rule.step(self.state, grad, rows)
        for phase in range(self.rule.phases):
            inbox = [] if send is None or self.rule.pattern == "none" else self._inbox(send, t)
            state, send = self.rule.mix(state, phase, inbox, rows)
        self.state = state
        loss = gather_rows(self.ranks, losses.to(torch.float64), self.shards)
        self.round = t + 1
        if loss is None:
            return None
        figures = _Counter(self.n, self.device)
        figures.add(self.full)
        up = torch.ones(self.n, dtype=torch.bool)
        idle = torch.zeros(self.n, dtype=torch.bool)
        return figures.done(t, up, loss, idle)


def is_eval_round(config: Config, t: int) -> bool:
    """Whether round ``t`` ends with an evaluation (as the run's observer says), so every
    rank gathers the models there."""
    rounds, every = config.run.rounds, config.run.eval_every
    return (t + 1) % every == 0 or t + 1 == rounds
