"""The vectorized engine sharded over torch.distributed ranks: each rank holds a share of
the peers' stacked rows and exchanges only the rows its neighbours need.

Design (:func:`setup_refusal` says what it does not run yet):

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
  (its :class:`~fedcore.algorithms.rule.Send`: tensors and scalars, each row as bytes,
  see **Codecs**) go out in one ``all_to_all_single`` with those split sizes:
  each boundary row once per destination rank, never once per edge. What comes back,
  appended below the rank's own rows, is the *extended stack*: the receiver's in-neighbour
  table (:class:`~fedcore.engines.stacked_graph.StackedGraph`'s ``nbr``, its rows of this
  rank) is re-indexed into it.
* **Overlap** (:mod:`fedcore.engines.shard_overlap`): a one-phase rule's exchange is
  started, every row mixed while the boundary rows travel (a remote slot standing in as
  not arrived), then the boundary rows mixed again with their real slots; the interior
  rows' results are final after the first mix. The bits are those of one mix after the
  exchange.
* **Schedules.** A time-varying topology (a schedule of ``P`` graphs, round ``t`` on the
  graph of ``t % P``) keeps one placement for the whole run, computed from the union of
  the period's edges, and has one plan a graph (:mod:`fedcore.engines.shard_plan`): its
  halo with its own split sizes per rank, the re-indexed neighbour table (padded to that
  graph's largest in-degree, as one process pads it), slot weights, in-degrees, self
  weights, its traffic and its fault plan's edges. Each round uses the plan of
  ``t % P`` (:meth:`ShardedNetwork._use`).
* **Per-edge state** (pattern ``"edges"``: robust push-sum's totals, RPS's blocks;
  :mod:`fedcore.engines.shard_edges`). A rank's :attr:`~fedcore.algorithms.rule.Rows.edges`
  are the out- and in-edges of its rows in the one-process engine's edge order, and the
  rule's state per edge is theirs: it never moves. A send of one message per out-edge
  crosses as a halo of cut edges (each cut edge's message once, to its receiver's rank,
  of the edge's width where the rule says ``widths``); a shared send (one message a
  sender) as the row halo above. A receiver's in-edges index the extended stack of
  messages (its own out-edges', the received ones) as the slots do here, and a crashed
  row's edges keep their state, as one process keeps them.
* **A server and its workers** (pattern ``"chosen"``, :mod:`fedcore.engines.shard_server`):
  only the round's messages that arrive cross ranks, each sender's row once per rank of its
  receivers, into one process's ``Gathered`` inbox; rows that do not train read no batch.
* **Order of sums, and why R does not matter.** A receiver's inbox is its row of the
  global neighbour table: its in-neighbours in sorted-id order, padded to the whole graph's
  largest in-degree, exactly the slots the one-process engine builds. The rule adds them
  slot by slot (``gossip``, push-sum's ``mix``) with the same elementwise operations on
  the same operands: a sender's row arrives bit for bit (what its codec decodes), and
  push-sum's share ``x_j * W_ji`` is formed from the same two values. Each row's result is
  thus a function of its own inputs in a fixed order, whatever rank holds it; the
  gradients are batch-invariant per row (:mod:`fedcore.gradients`). So R = 1, 2, 4 give the
  one-process engine's parameters, bit for bit (``tests/engines/test_sharded.py``).
* **Codecs.** The sending rank round-trips its own rows through each peer's own codec
  (a stochastic codec draws from the generator of the row's global peer, whatever rank
  holds it); each boundary row crosses ranks *encoded* and is decoded on the receiving
  rank into the same values (:mod:`fedcore.engines.shard_codecs`, push-sum's shares
  there too). The summary's ``halo_bytes`` adds up what every rank sent.
* **Faults.** The fault plan is a keyed hash of ``(round, phase, edge)``: each rank asks it
  about the edges of its rows (:mod:`fedcore.engines.shard_faults`); a crashed row takes
  no step, reads no batch, encodes nothing and keeps its state.
* **Virtual time** (``[time]``, deadline mode: :mod:`fedcore.engines.shard_time`). The
  clock is a function of the whole graph's traffic: every rank advances the same clock
  over every edge (``O(edges)`` a round on every rank) and its rows' in-edges' late
  messages are missing, counted as a fault plan's; every rank's checkpoint holds it.
* **Before the exchange** (:mod:`fedcore.engines.shard_local`): a node optimizer's
  direction and ``run.local_steps`` are each row's own, as on one process; so are an
  online source's batches (``data.stream``: :mod:`fedcore.engines.shard_streams`).
* **Figures.** Traffic of a static graph with no faults is the same every round: rank 0
  counts it once from the graph (as the one-process engine does; a schedule: once a
  graph of its period). With faults (or late messages) each rank counts its rows' figures,
  from their out- and in-edges, and they travel to rank 0 with the rows' losses (the per-edge
  fault tables once, at the end: :meth:`ShardedNetwork.finish`). Each round the ranks'
  losses are gathered on rank 0, and every peer's model at the end (the summary's
  ``params_sha256``); rank 0 writes the run's files (:mod:`fedcore.simulation.ranks`).
* **Evaluation** (:meth:`ShardedNetwork.evaluate`): each rank evaluates its own rows (of
  the ``run.eval_peers`` sample, its share) in batched passes, all ranks at once; the
  average model comes from the ranks' exact column sums, added up on every rank (one
  all-reduce of integers: the same sums in any order), and rank 0 gathers two figures a
  peer (its accuracy, its distance to the mean) to make the record, in node order. No
  model travels: one process and any R give the same record, bit for bit
  (:mod:`fedcore.engines.stacked_eval`). Rank 0's summary also says how the peers were
  placed: the ``partition`` that ran, the ``cut_fraction`` of edges whose ends are on
  different ranks (a schedule: of the edges of one period's rounds, an edge counted in each
  round that uses it), and the ``halo_bytes_per_round`` that crossed ranks (the mean over
  the rounds run).
* **Checkpoints.** Everything a rank's next round reads is its own: its rows' rule state
  (its edges' too), their places in their data, their codecs' generators, its fault counts
  per in-edge, its halo bytes, torch's generator, the virtual clock.
  :meth:`ShardedNetwork.state_dict` holds them (:mod:`fedcore.engines.shard_state`); each
  rank writes its own file every ``run.checkpoint_every`` rounds, rank 0 a manifest once
  all are written, and ``--resume`` loads each rank's file of the manifest's round on the
  same R ranks (the same blocks):
  :mod:`fedcore.simulation.rank_checkpoints`; on another number of ranks each new rank
  reads the rows it now holds from the old ranks' files (:mod:`fedcore.engines.shard_reshard`).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import torch

from fedcore.algorithms.rule import Rows, Rule, Send, Slot, is_rule
from fedcore.config import Config
from fedcore.engines.batched import batched_form, raise_bad
from fedcore.engines.partition import place
from fedcore.engines.ranks import Ranks, add_everywhere, gather_rows, largest_everywhere
from fedcore.engines.shard_batches import RankBatches
from fedcore.engines.shard_digests import gathered_digests, start_digests
from fedcore.engines.shard_edges import ShardEdges
from fedcore.engines.shard_faults import (
    RowCounts,
    ShardFaults,
    pack_counts,
    reduce_total,
    unpack_counts,
)
from fedcore.engines.shard_local import step_lr, train_rows
from fedcore.engines.shard_overlap import mix_overlapped, slots_of
from fedcore.engines.shard_plan import (
    GraphPlan,
    Halo,
    placement_figures,
    plan_graph,
    plan_halo,
    union_edges,
)
from fedcore.engines.shard_refusal import EDGE_ALGORITHMS, SHARDED_ALGORITHMS, config_refusal
from fedcore.engines.shard_server import ShardServer
from fedcore.engines.shard_state import load_rank_state, rank_state
from fedcore.engines.shard_streams import RowStreams
from fedcore.engines.shard_time import ShardTime, masks_of, plan_faults_and_time
from fedcore.engines.stacked_eval import record_of, row_figures_of, sample_of
from fedcore.engines.stacked_graph import EdgeUnion, stack_graph
from fedcore.engines.vectorized import (
    RoundFigures,
    _Counter,
    node_records_mode,
)
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.evaluation import column_sums, mean_of_sums, sum_extremes, sum_window
from fedcore.metrics import ParamDigests
from fedcore.setup.engine_checks import EngineInputs, vectorized_refusal
from fedcore.setup.prepare import RunSetup
from fedcore.setup.virtual import row_codec
from fedcore.stacked_training import StackedObjective

__all__ = [
    "EDGE_ALGORITHMS",
    "SHARDED_ALGORITHMS",
    "Halo",
    "ShardedNetwork",
    "config_refusal",
    "is_eval_round",
    "plan_halo",
    "setup_refusal",
]


def setup_refusal(setup: RunSetup) -> str | None:
    """Why a sharded run cannot run ``setup`` beyond what the config tells (one clause),
    or None: checked by every rank before it joins the others."""
    algorithm = setup.algorithm
    why = config_refusal(setup.config)
    if why is not None:
        return why
    if not is_rule(algorithm):
        return f"algorithm {algorithm.name!r} has no batched form"
    rule = cast(Rule, algorithm)
    server = rule.pattern != "chosen" and (rule.server is not None or rule.trains is not None)
    if rule.pattern not in ("neighbours", "none", "edges", "chosen") or server:
        return f"algorithm {rule.name!r} is not sharded yet"
    why = vectorized_refusal(EngineInputs.of(setup.config), algorithm)
    if why is not None:  # what one process refuses (RPS with a stochastic codec)
        return why
    return None


class ShardedNetwork(ShardEdges, ShardServer):
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
        # One graph a round of the period (a static graph: one); one placement for all. A
        # rule of pattern "edges" numbers the edges of a schedule's graphs as one process.
        trust = [setup.graph.at(t) for t in range(self.period)]
        per_edge = cast(Rule, setup.algorithm).pattern == "edges"
        union = EdgeUnion.of(trust) if per_edge and len(trust) > 1 else None
        graphs = [stack_graph(g, union=union, device=self.device) for g in trust]
        src, dst = union_edges(graphs)
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
        self.plans = [plan_graph(g, self.shards, ranks.rank) for g in graphs]
        """This rank's :class:`GraphPlan` of each graph of the period (round ``t`` runs
        that of ``t % period``: :meth:`_use` makes it the current one)."""
        self.state = self.rule.init(self.start.unsqueeze(0).repeat(self.b, 1))
        self._plan_edges(graphs, per_edge)  # a rule of pattern "edges" (after init: widths)
        self._use(0)
        held = np.asarray([len(p) for p in setup.parts], dtype=np.float64)
        if setup.source is not None:  # an online stream: no examples held (as one process)
            held = np.zeros(self.n, dtype=np.float64)
        self.samples = torch.from_numpy(held[rows])
        self.optimizer = setup.optimizer()
        self.opt_state = (
            self.optimizer.init(self.rule.model(self.state)) if self.optimizer else None
        )
        self.local_steps = setup.options.local_steps
        self.objective = StackedObjective(setup.objective, self.device, setup.evaluator)
        self.batches: RankBatches | RowStreams = (  # our rows' alone
            RankBatches(setup, self.device, rows)
            if setup.source is None
            else RowStreams(setup.source, rows, self.n)
        )
        self.own = np.zeros(self.n, dtype=np.bool_)
        self.own[rows] = True
        self.round = 0
        self.fulls = [_Counter(self.n, self.device) for _ in graphs]
        """Rank 0: the traffic of a round of each graph of the period (every message)."""
        self.cut_fraction = 0.0
        """Rank 0: the share of the graph's edges whose ends are on different ranks (a
        schedule: of the edges of one period's rounds, :func:`placement_figures`)."""
        self.halo_rows = 0.0
        """Rank 0: rows that cross ranks in one exchange, all ranks together (a schedule:
        the mean over its period's rounds)."""
        if ranks.rank == 0:
            for i, (full, g) in enumerate(zip(self.fulls, graphs, strict=True)):
                for p in range(self.rule.phases):
                    sends = self._sends(i, p)
                    full.traffic(self.form.messages(p, g, self._size, self.d), sends)
            figures = placement_figures(graphs, self.placement.owner, ranks.world)
            self.cut_fraction, self.halo_rows = figures
        self._last: ParamDigests | None = None
        """Rank 0: the digests of the last :meth:`digests` (``None``: the start models)."""
        # Faults and codecs: the global row of each local row (its codec's owner), the
        # fault plan asked for this block's in-edges, and which rounds' records list faults.
        self.local_of = torch.full((self.n,), -1, dtype=torch.long)
        self.local_of[self.mine] = torch.arange(self.b)
        self.faults: ShardFaults | None
        self.time: ShardTime | None  # virtual time: every rank's clock of the whole graph
        self.faults, self.time = plan_faults_and_time(self, graphs)
        self.records = node_records_mode(setup.config, self.n)
        self.wire: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """The round's encoded rows (``[B, width]`` uint8) of each tensor the codec
        encoded, by the decoded tensor's id (kept with it, so the id stays its own)."""
        self.halo_bytes = 0
        """Bytes this rank sent other ranks in halo exchanges (what codecs shrink)."""
        self.halo_total: int | None = None
        """Rank 0, after :meth:`finish`: the halo bytes of every rank, added up."""

    @property
    def period(self) -> int:
        """Rounds after which the graphs repeat (1: a static graph)."""
        return self.setup.graph.period

    def _use(self, slot: int) -> None:
        """Make the plan of graph ``slot`` of the period the current one: the halo, the
        inbox slots, their weights, the self weights and in-degrees the round reads."""
        plan: GraphPlan = self.plans[slot]
        self.graph, self.halo, self.nbr = plan.graph, plan.halo, plan.nbr
        self.slot_weight, self.arrived = plan.slot_weight, plan.arrived
        self.self_weight, self.in_degree = plan.self_weight, plan.in_degree
        self._use_edges(slot)

    @property
    def halo_bytes_per_round(self) -> int:
        """Rank 0, after :meth:`finish`: the bytes that crossed ranks a round, all ranks
        together, their mean over the rounds run (the same every round of a static graph
        but where a crashed peer's rows cross as values)."""
        if self.halo_total is None or self.round == 0:
            return 0
        return self.halo_total // self.round

    def _size(self, n: int) -> int:
        return self.codec.nbytes(n, self.dtype)

    def check(self) -> None:
        """Nothing deferred: every check of a CPU rank is read at once."""

    def fault_counts(self) -> tuple[dict[str, int], dict[str, int]] | None:
        """``(missing per edge, lost per edge)`` of the run so far, keyed
        ``"sender->receiver"``, as the summary's ``faults`` tables: on rank 0 (``None`` on
        the others). With a fault plan a collective (every rank calls it once, at the
        end); without one nothing is missing or lost."""
        if self.faults is None:
            return ({}, {}) if self.ranks.rank == 0 else None
        return self.faults.tables(self.ranks, self.nodes)

    def finish(self) -> tuple[dict[str, int], dict[str, int], int] | None:
        """The end of a run (a collective: every rank calls it once, after the last
        :meth:`digests`): on rank 0 the fault tables (:meth:`fault_counts`) and the bytes
        every rank sent in halo exchanges (:attr:`halo_bytes`, added up); ``None`` on the
        others.

        Raises:
            PeerUnavailableError: a collective failed.
        """
        tables = self.fault_counts()
        sent = reduce_total(self.ranks, self.halo_bytes)
        if tables is None or sent is None:
            return None
        self.halo_total = sent
        return tables[0], tables[1], sent

    def model(self) -> torch.Tensor | None:
        """Every node's model, gathered on rank 0 (``[N, d]``); ``None`` on the others.
        A collective: every rank calls it at the same point of the run."""
        return gather_rows(self.ranks, self.rule.model(self.state), self.shards)

    def digests(self) -> ParamDigests | None:
        """The summary's digests of every node's model, made on rank 0 without gathering
        every model there (``None`` on the others; :mod:`fedcore.engines.shard_digests`).
        A collective: every rank calls it at the same point of the run.

        Raises:
            PeerUnavailableError: a gather failed.
        """
        made = gathered_digests(self.ranks, self.rule.model(self.state), self.shards, self.nodes)
        if made is not None:
            self._last = made
        return made

    @property
    def last(self) -> ParamDigests:
        """Rank 0: the digests of the last :meth:`digests` (before any, of the start
        models): what a failed run's summary holds (no collective)."""
        if self._last is None:
            self._last = start_digests(self.start, self.nodes)
        return self._last

    def evaluate(self) -> dict[str, Any] | None:
        """The evaluation record of every peer's current model on rank 0 (``None`` on the
        others), each rank evaluating its own peers (see the module docstring). A
        collective: every rank calls it on the same evaluation rounds.

        Raises:
            PeerUnavailableError: a collective failed.
        """
        params = self.rule.model(self.state)
        if self.setup.algorithm.server in self.nodes:  # the server's model is the average
            return self._evaluate_server(params, self.nodes.index(self.setup.algorithm.server))
        extremes = sum_extremes(params)  # one window of limbs for every rank's sums
        largest_everywhere(self.ranks, extremes, "an evaluation's sum window")
        window = sum_window(extremes, params.dtype)
        sums = column_sums(params, window)
        add_everywhere(self.ranks, sums, "an evaluation's sums")
        mean = mean_of_sums(sums, self.n, params.dtype, window[0])
        sample = sample_of(self.setup, self.n)
        pick = None
        if sample is not None:  # this rank's share of the sample, as local rows (sorted)
            local = self.local_of[sample]
            pick = local[local >= 0]
        acc, norms = row_figures_of(
            self.setup, self.objective, self.local_nodes, params, mean, pick
        )
        figures = gather_rows(self.ranks, torch.stack([acc, norms], dim=1), self.shards)
        if figures is None:
            return None
        acc_all, norms_all = figures[:, 0].contiguous(), figures[:, 1].contiguous()
        return record_of(self.setup, self.nodes, mean.to(params.dtype), acc_all, norms_all, sample)

    def _rows(self, t: int, lr: float, up: torch.Tensor, compressed: set[int]) -> Rows:
        """What the rule reads of round ``t`` for this block: ``up`` (``[B]`` bool) says
        which rows run it; ``rows.compress`` encodes the up rows (their own codecs, owned
        by their global rows) and notes the tensors it made in ``compressed``."""
        nodes = self.local_nodes

        def fail(bad: torch.Tensor, why: str) -> None:
            raise_bad(bad & up, why, nodes, t, AlgorithmError)

        def compress(
            v: torch.Tensor,
            where: torch.Tensor | None,
            owners: torch.Tensor | None,
            width: torch.Tensor | None,
        ) -> torch.Tensor:
            if self.edge_plans:  # messages per edge, or rows of their edges' width
                out = self._encode_edges(v, up, t, owners, width, where)
            elif owners is not None or width is not None:
                raise AlgorithmError(f"{self.rule.name!r}: a send the sharded engine does not run.")
            else:  # only the rows that send (``where``) draw from their codecs
                out = self._roundtrip(v, up if where is None else up & where, t)
            compressed.add(id(out))
            return out

        return Rows(
            round=t,
            lr=lr,
            self_weight=self.self_weight,
            compress=compress,
            fail=fail,
            in_degree=self.in_degree,
            n=self.n,
            ids=nodes,
            nodes=self.nodes,
            samples=self.samples,
            codec=self.codec.name,
            index=self.mine,
            edges=self.edge_plan.edges if self.edge_plans else None,
        )

    def _inbox(
        self,
        send: Send,
        t: int,
        up_all: torch.Tensor,
        arrived: torch.Tensor,
        compressed: set[int],
    ) -> list[Slot]:
        """This block's slots of the phase whose messages are ``send``: its rows and the
        halo's, decoded as receivers decode them and exchanged once (see the module
        docstring): each row as its codec encoded it, or as it is where it goes as values
        (:mod:`fedcore.engines.halo_rows`). ``up_all`` (``[N]`` bool) says which senders
        are up, ``arrived`` (``[B, K]`` bool) which slots' messages arrived."""
        up = up_all[self.mine]
        if send.to is not None or send.shared:
            raise AlgorithmError(f"{self.rule.name!r}: a send the sharded engine does not run.")
        halo = self.halo
        far_up = up_all[halo.recv_rows]
        counts = (halo.send_counts, halo.recv_counts)
        if send.weighted and not self.codec.lossless(self.dtype):
            return self._shares(send, t, up_all, arrived)
        decoded = {
            name: value if id(value) in compressed else self._roundtrip(value, up, t)
            for name, value in send.tensors.items()
        }
        far_t, far_s = self._exchange_start(
            decoded, send.scalars, halo.send_rows, counts, up, far_up
        )()
        tensors = {k: torch.cat([v, far_t[k]]) for k, v in decoded.items()}
        scalars = {k: torch.cat([v, far_s[k]]) for k, v in send.scalars.items()}
        return slots_of(tensors, scalars, send.weighted, self.nbr, self.slot_weight, arrived)

    def _gradients(
        self, params: torch.Tensor, up: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This block's losses (float64, NaN for a crashed row) and gradients (0 for a
        crashed row) of its next batches: a crashed row reads no batch."""
        if bool(up.all()):
            _, x, y, mask = self.batches.next(self.own)
            losses, grad = self.objective.loss_and_grad(params, x, y, mask)
            return losses.to(torch.float64), grad
        reading = self.own.copy()
        reading[self.mine[~up].numpy()] = False
        rows, x, y, mask = self.batches.next(reading)
        loss = torch.full((self.b,), math.nan, dtype=torch.float64)
        grad = torch.zeros_like(params)
        local = self.local_of[rows]
        if local.numel():
            losses, grads = self.objective.loss_and_grad(params[local], x, y, mask)
            loss[local] = losses.to(torch.float64)
            grad[local] = grads
        return loss, grad

    def run_round(self) -> RoundFigures | None:
        """Run round ``self.round`` for this block; rank 0 returns the round's figures
        (the others ``None``). A collective: every rank runs every round."""
        t = self.round
        self._use(t % self.period)  # a schedule's graph of this round
        lr = self.setup.options.lr_at(t)
        faults = self.faults
        up_all = torch.ones(self.n, dtype=torch.bool) if faults is None else faults.up(t)
        up = up_all[self.mine]
        tick = None if self.time is None else self.time.advance(t, up_all)
        training, idle = self._training(t, up_all)  # the others read no batch
        loss, grad = train_rows(self, t, lr, training)  # the optimizer, the local steps
        compressed: set[int] = set()
        self.wire, self.edge_wire, self.round_sent = {}, {}, []
        rows = self._rows(t, step_lr(self, lr), up, compressed)
        counts = RowCounts(self.b)
        state, send = self.rule.step(self.state, grad, rows)
        for phase in range(self.rule.phases):
            if self.chosen:  # the round's messages only
                chosen = self._gathered(send, phase, t, up_all, counts, compressed)
                state, send = self.rule.mix(state, phase, chosen, rows)
                continue
            arrived = self.edge_arrived[phase] if self.edge_plans else self.arrived
            if faults is not None:
                arrived = faults.arrived(t, phase, up_all, counts, *masks_of(tick, phase))
            inbox: Any = []
            if self.edge_plans:
                inbox = self._edge_inbox(send, phase, t, up_all, arrived, compressed, rows)
            elif send is not None and self.rule.pattern != "none":
                mixed = mix_overlapped(self, state, send, t, up_all, arrived, compressed, rows)
                if mixed is not None:  # the exchange overlapped with a first mix
                    state, send = mixed, None
                    continue
                inbox = self._inbox(send, t, up_all, arrived, compressed)
            state, send = self.rule.mix(state, phase, inbox, rows)
        self.state = self._kept(up, state)  # a crashed row's (and its edges') as it was
        self.wire, self.edge_wire = {}, {}  # the round's encoded rows, sent
        self.round = t + 1
        if faults is None:
            loss_all = gather_rows(self.ranks, loss, self.shards)
            if loss_all is None:
                return None
            times = None if tick is None else tick.times
            return self._round_traffic(t).done(t, up_all, loss_all, idle, times)
        # The rows' counts travel with their losses: one gather, as without faults.
        gathered = gather_rows(self.ranks, pack_counts(loss, counts), self.shards)
        if gathered is None:
            return None
        loss_all, counter = unpack_counts(gathered, self.device)
        if self.records == "all" or (
            self.records == "eval" and is_eval_round(self.setup.config, t)
        ):
            sent = self.round_sent if self.chosen else None
            faults.lost_everywhere(t, up_all, counter, sent, *masks_of(tick))
        return counter.done(t, up_all, loss_all, idle, None if tick is None else tick.times)

    def state_dict(self) -> dict[str, Any]:
        """This rank's checkpoint: everything :meth:`load_state_dict` needs to run its
        next round exactly (:func:`~fedcore.engines.shard_state.rank_state`)."""
        return rank_state(self)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of this rank of the same run.

        Raises:
            ConfigError: it is of other rows or another layout (one line).
        """
        load_rank_state(self, saved)


def is_eval_round(config: Config, t: int) -> bool:
    """Whether round ``t`` ends with an evaluation (as the run's observer says), so every
    rank evaluates its peers there (:meth:`ShardedNetwork.evaluate`)."""
    rounds, every = config.run.rounds, config.run.eval_every
    return (t + 1) % every == 0 or t + 1 == rounds
