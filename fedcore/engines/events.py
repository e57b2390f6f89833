"""The event engine: asynchronous algorithms in virtual time (``fedcore simulate``).

Every peer's state is a row of stacked tensors, as on the vectorized engine, but no round
is shared: each worker computes for the time ``[time]`` gives it
(:class:`~fedcore.timing.TimeModel`: its compute draws, its links' transfer times of the
messages' real encoded sizes, its on/off periods) and acts when its computation ends, by
its algorithm's rule (:mod:`fedcore.algorithms.asynchronous`). Time advances tick by
tick: a tick starts at the earliest pending event and lasts :data:`TICK_SHARE` of a local
step (``time.step_s``; an instant without compute times), and every worker whose
computation ends within it acts together, in node order: one batched gradient call for
the group, one tensor operation per rule step. So an event is handled at most one tick
after its time, and the run is a function of the config (the keyed draws, node order),
the same bits every time.

What a worker does at an event goes by its rule's pattern
(:class:`~fedcore.algorithms.asynchronous.AsynchronousRule`), never by the rule's class:

* ``"pair"``: the worker averages with its partner (drawn by the keyed hash among its
  neighbours; the request and the reply each take the link's transfer time, inside the
  event's time), then applies the gradient it computed when its computation began. Pairs
  of one tick that share a peer are averaged one after another in node order (a peer is
  in one averaging at a time, as AD-PSGD's atomic averaging has it); the gradients follow.
* ``"push"``: the worker steps and pushes running sums to its out-neighbours; each
  message arrives after its transfer time and is applied at the tick it arrives in.
* ``"upload"``: the worker's upload reaches the server (after downloading,
  ``run.local_steps`` local steps and uploading); the server takes it by the rule, and the
  worker downloads the current model and starts again.

The rules check what each message carries against the receiver's state as the real peers
do (:mod:`fedcore.algorithms.asynchronous`): a pair whose average, a running sum whose
sum, or an upload whose step would not be finite (a run that diverges) is refused, the
receiver's state unchanged, and counted in the receiver's ``messages_rejected``; honest
values of a run that does not diverge are never refused.

A fault plan's drops apply (the tick's index is the message's round coordinate): a lost
exchange, push or upload is lost as each rule says. Crashes and partitions are by round,
which an asynchronous run has none of (use ``time.on_s``/``off_s``). For the records, a
*round* is ``W`` computations in all (``W``: the workers), one a worker on average, so
``run.rounds`` and ``run.eval_every`` mean what they mean for the synchronous algorithms
(the same number of gradient steps); a node record's ``vtime`` is the round's end.
Checkpoints are not written for asynchronous runs yet.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore import counter_random as keyed
from fedcore.algorithms.asynchronous import AsynchronousRule, ServerState, example_shares
from fedcore.engines.stacked_graph import stack_graph
from fedcore.engines.vectorized import stacked_batches
from fedcore.errors import ConfigError, ProtocolError
from fedcore.node import RoundRecord
from fedcore.setup.prepare import RunSetup
from fedcore.setup.virtual import row_codec
from fedcore.stacked_training import StackedObjective

__all__ = ["TICK_SHARE", "EventNetwork", "RoundEvents"]

TICK_SHARE = 0.01
"""A tick's length as a share of one local step's mean time (``time.step_s``)."""

_PARTNER = keyed.string_id("partner")
_F64 = torch.float64


@dataclass(frozen=True, slots=True)
class RoundEvents:
    """What happened in one round of an asynchronous run (host values, node order)."""

    round: int
    vtime: float
    loss: list[float]  # mean loss of each node's computations that ended (NaN: none:
    # the node's record says idle, as a synchronous round's unsampled worker's does)
    compute: list[float]
    sent: list[int]
    bytes_sent: list[int]
    received: list[int]
    bytes_received: list[int]
    dropped: list[int]
    events: int
    rejected: list[int]


class EventNetwork:
    """Every peer of an asynchronous ``setup`` as rows, run in virtual time (see the
    module docstring).

    Raises:
        ConfigError: what an asynchronous run cannot do (an online stream, a schedule, a
            node optimizer, crashes or partitions, checkpoints, several local steps for a
            decentralized algorithm).
    """

    def __init__(self, setup: RunSetup) -> None:
        """Build the rows, batches and timing of ``setup``."""
        config = setup.config
        algorithm = setup.algorithm
        name = algorithm.name
        why = _unsupported(setup)
        if why is not None:
            raise ConfigError(f"the asynchronous algorithm {name!r} cannot run this config: {why}.")
        rule = _rule(setup)
        assert rule is not None  # (_unsupported says so)
        self.setup = setup
        self.algorithm: Any = algorithm  # an AsynchronousRule; its pattern's row functions
        self.pattern = rule.pattern
        self.nodes = setup.graph.nodes
        n = self.n = len(self.nodes)
        self.device = torch.device("cpu")
        self.graph = stack_graph(setup.graph.at(0), device=self.device)
        self.timing = setup.time_model()
        self.plan = setup.faults
        self.steps = config.run.local_steps
        self.lr = setup.options.lr
        start = setup.start
        self.x = start.unsqueeze(0).repeat(n, 1)
        self.d = int(start.numel())
        codec = row_codec(setup)
        self.model_bytes = codec.nbytes(self.d, start.dtype)
        self.objective = StackedObjective(setup.objective, self.device, setup.evaluator)
        self.server = None if rule.server is None else self.nodes.index(rule.server)
        self.batches = stacked_batches(setup, self.device)
        workers = torch.ones(n, dtype=torch.bool)
        if self.server is not None:
            workers[self.server] = False
        self.workers = workers
        self.count = int(workers.sum())
        step = config.time.step_s * self.steps
        self.tick = TICK_SHARE * step if config.time.step_s > 0 else 0.0
        self.now = 0.0
        self.ticks = 0
        self.taken = torch.zeros(n, dtype=torch.int64)  # local steps, the draws' coordinate
        self.done = torch.zeros(n, dtype=torch.int64)  # computations ended
        self.ends = torch.full((n,), math.inf, dtype=_F64)  # when each computation ends
        self.pending = torch.zeros_like(self.x)  # the gradient (or update) being computed
        self.pending_loss = torch.full((n,), math.nan, dtype=_F64)
        self.pending_compute = torch.zeros(n, dtype=_F64)
        self.completed = 0
        self.round = 0
        self._key = keyed.make_key("fedcore.events", config.run.seed)
        self._words = keyed.string_ids(self.nodes, "cpu")
        self._reset_round()
        self.w = torch.ones(n, dtype=_F64)  # push-sum's weights (1: the other patterns)
        if self.pattern == "push":
            e = self.graph.src.numel()
            # running sums (x, w) per edge
            self.sums: torch.Tensor = torch.zeros(e, self.d + 1, dtype=_F64)
            self.applied: torch.Tensor = torch.zeros_like(self.sums)
            # the newest message applied per edge
            self.last: torch.Tensor = torch.full((e,), -1, dtype=torch.int64)
            self.flight: list[tuple[float, int, int]] = []  # (arrival, seq, edge)
            self.payloads: dict[int, torch.Tensor] = {}
            self.seq: int = 0
            self.push_bytes: int = int(self.model_bytes) + 8
        if self.pattern == "pair":
            order = torch.argsort(self.graph.src * n + self.graph.dst)
            src, dst = self.graph.src[order], self.graph.dst[order]
            self.nbr_dst = dst
            self.nbr_start = torch.searchsorted(src, torch.arange(n))
            self.degree = torch.bincount(src, minlength=n)
            self._partner_of = torch.zeros(n, dtype=torch.int64)
        # The server family: the server's model, version and buffer; the version each
        # worker downloaded; each worker's examples over the workers' mean.
        self.served = ServerState(self.x[self.server if self.server is not None else 0].clone())
        self.versions = torch.zeros(n, dtype=torch.int64)
        self.share = example_shares(setup.parts, workers)
        self._start(torch.nonzero(workers).squeeze(1), torch.zeros(self.count, dtype=_F64))

    # --- records --------------------------------------------------------------------------

    def _reset_round(self) -> None:
        n = self.n
        self._loss_sum = np.zeros(n)
        self._loss_count = np.zeros(n, dtype=np.int64)
        self._compute = np.zeros(n)
        self._sent = np.zeros(n, dtype=np.int64)
        self._bytes = np.zeros(n, dtype=np.int64)
        self._received = np.zeros(n, dtype=np.int64)
        self._bytes_in = np.zeros(n, dtype=np.int64)
        self._dropped = np.zeros(n, dtype=np.int64)
        self._rejected = np.zeros(n, dtype=np.int64)
        self._events = 0

    def _traffic(self, src: torch.Tensor, dst: torch.Tensor, nbytes: int, ok: torch.Tensor) -> None:
        """Count messages ``src -> dst`` (``ok``: not lost)."""
        s, d, k = src.numpy(), dst.numpy(), ok.numpy()
        np.add.at(self._sent, s[k], 1)
        np.add.at(self._bytes, s[k], nbytes)
        np.add.at(self._received, d[k], 1)
        np.add.at(self._bytes_in, d[k], nbytes)
        np.add.at(self._dropped, s[~k], 1)

    def _lost(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        if self.plan is None:
            return torch.zeros(src.shape, dtype=torch.bool)
        return self.plan.lost_mask(src, dst, self.ticks, 0)

    def records(self, figures: RoundEvents, lr: float) -> list[RoundRecord]:
        """Every node's record of a round."""
        return [
            RoundRecord(
                node=node,
                round=figures.round,
                loss=figures.loss[i],
                lr=lr,
                messages_sent=figures.sent[i],
                bytes_sent=figures.bytes_sent[i],
                messages_received=figures.received[i],
                bytes_received=figures.bytes_received[i],
                messages_missing=0,
                messages_late=0,
                messages_rejected=figures.rejected[i],
                missing=(),
                wall_s=0.0,
                messages_dropped=figures.dropped[i],
                idle=not bool(self.workers[i]) or math.isnan(figures.loss[i]),
                vtime=figures.vtime,
                compute_s=figures.compute[i],
            )
            for i, node in enumerate(self.nodes)
        ]

    # --- the run ----------------------------------------------------------------------------

    def models(self) -> torch.Tensor:
        """``[N, d]``: every node's model (push-sum: its de-biased ``x / w``)."""
        model: torch.Tensor = self.algorithm.model(self.x, self.w)
        return model

    def run_round(self) -> RoundEvents:
        """Handle events until ``W`` more computations ended; the round's figures."""
        goal = (self.round + 1) * self.count
        while self.completed < goal:
            self._tick()
        mean = np.where(
            self._loss_count > 0, self._loss_sum / np.maximum(self._loss_count, 1), np.nan
        )
        figures = RoundEvents(
            round=self.round,
            vtime=self.now,
            loss=mean.tolist(),
            compute=self._compute.tolist(),
            sent=self._sent.tolist(),
            bytes_sent=self._bytes.tolist(),
            received=self._received.tolist(),
            bytes_received=self._bytes_in.tolist(),
            dropped=self._dropped.tolist(),
            events=self._events,
            rejected=self._rejected.tolist(),
        )
        self.round += 1
        self._reset_round()
        return figures

    def _tick(self) -> None:
        """Handle every event of the next tick."""
        first = float(self.ends.min())
        if self.pattern == "push" and self.flight:
            first = min(first, self.flight[0][0])
        if not math.isfinite(first):
            raise ConfigError("no worker can compute: every peer is off for good.")
        end = first + self.tick
        self.now = first
        if self.pattern == "push":
            self._arrivals(end)
        group = torch.nonzero(self.ends <= end).squeeze(1)
        if group.numel():
            times = self.ends[group]
            self.now = float(times.max())
            self._act(group)
            self.done[group] += 1
            self.completed += int(group.numel())
            self._events += int(group.numel())
            g = group.numpy()
            losses = self.pending_loss[group].numpy()
            self._loss_sum[g] += losses
            self._loss_count[g] += 1
            self._compute[g] += self.pending_compute[group].numpy()
            self._start(group, times)
        self.ticks += 1

    def _start(self, rows: torch.Tensor, at: torch.Tensor) -> None:
        """``rows`` begin their next computation at ``at`` (once on): the gradient (or
        the local steps) on the model they read now, and when it ends."""
        timing = self.timing
        began = timing.available_from(rows, at) if timing.timed else at.clone()
        compute = timing.compute_seconds(rows, self.taken[rows], self.steps)
        self.taken[rows] += self.steps
        wire = torch.zeros_like(compute)
        if self.pattern != "upload":  # one gradient at the model read now
            params = self.algorithm.model(self.x[rows], self.w[rows])
            loss, grad = self._gradient(rows, params)
            self.pending[rows] = grad
        if self.pattern == "pair":  # and the exchange with a partner
            partners = self._partners(rows)
            nbytes = torch.full(rows.shape, self.model_bytes)
            there = timing.transfer_seconds(rows, partners, nbytes)
            back = timing.transfer_seconds(partners, rows, nbytes)
            wire = there + back
            self._partner_of[rows] = partners
        elif self.pattern == "upload":  # download, local steps, upload
            server = self.server
            assert server is not None
            self.x[rows] = self.x[server].clone()
            self.versions[rows] = self.served.version
            start = self.x[rows].clone()
            losses = []
            x = start
            for _ in range(self.steps):
                step_loss, grad = self._gradient(rows, x)
                losses.append(step_loss)
                x = self.algorithm.step(x, self.w[rows], grad, self.lr)
            loss = torch.stack(losses).mean(dim=0)
            self.pending[rows] = start  # the model it started from ...
            self.x[rows] = x  # ... and the one it ends with (each rule uploads what it does)
            nbytes = torch.full(rows.shape, self.model_bytes)
            s = torch.full(rows.shape, server)
            wire = timing.transfer_seconds(s, rows, nbytes) + timing.transfer_seconds(
                rows, s, nbytes
            )
        self.pending_loss[rows] = loss
        self.pending_compute[rows] = compute
        self.ends[rows] = began + compute + wire

    def _gradient(
        self, rows: torch.Tensor, params: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's loss and gradient on its next batch, at ``params``."""
        up = np.zeros(self.n, dtype=np.bool_)
        up[rows.numpy()] = True
        got, x, y, mask = self.batches.next(up)
        assert torch.equal(got, rows)  # both in node order
        losses, grads = self.objective.loss_and_grad(params, x, y, mask)
        return losses.to(_F64), grads

    def _partners(self, rows: torch.Tensor) -> torch.Tensor:
        """Each row's AD-PSGD partner: uniform among its neighbours (the keyed hash of the
        node and its count of computations)."""
        u = keyed.uniform_tensor(self._key, _PARTNER, self._words[rows], self.done[rows])
        k = torch.floor(u * self.degree[rows].to(_F64)).to(torch.int64)
        return self.nbr_dst[self.nbr_start[rows] + k]

    def _act(self, group: torch.Tensor) -> None:
        """What ``group`` (node order) does as its computations end, by the pattern."""
        if self.pattern == "pair":
            self._average(group)
            x, w = self.x[group], self.w[group]
            self.x[group] = self.algorithm.step(x, w, self.pending[group], self.lr)
        elif self.pattern == "push":
            self._push(group)
        else:
            self._upload(group)

    def _average(self, group: torch.Tensor) -> None:
        """AD-PSGD's pairwise averages of ``group``, one after another in node order
        (batched in layers of pairs that share no peer: the rule's ``average_pairs``)."""
        partners = self._partner_of[group]
        nbytes = self.model_bytes
        lost = self._lost(group, partners) | self._lost(partners, group)
        self._traffic(group, partners, nbytes, ~lost)
        self._traffic(partners, group, nbytes, ~lost)
        kept = ~lost
        answerers = partners[kept]
        averaged = self.algorithm.average_pairs(self.x, group[kept].tolist(), answerers.tolist())
        # A pair whose average is not finite: the partner refuses the request, as a real
        # peer's answer does (the rule's ``pair``).
        np.add.at(self._rejected, answerers[~averaged].numpy(), 1)

    def _push(self, group: torch.Tensor) -> None:
        """Asynchronous push-sum: step, keep the self share, push running sums."""
        g, rule = self.graph, self.algorithm
        w = self.w[group]
        x = rule.step(self.x[group], w, self.pending[group], self.lr)
        out = torch.nonzero(torch.isin(g.src, group)).squeeze(1)
        self.x[group] = x
        if out.numel():
            src = g.src[out]
            share = g.weight[out].unsqueeze(1)
            self.sums[out] += share * rule.mass(self.x[src], self.w[src])
            lost = self._lost(src, g.dst[out])
            self._traffic(src, g.dst[out], self.push_bytes, ~lost)
            nbytes = torch.full(out.shape, self.push_bytes)
            arrive = self.ends[src] + self.timing.transfer_seconds(src, g.dst[out], nbytes)
            for e, when in zip(out[~lost].tolist(), arrive[~lost].tolist(), strict=True):
                self.seq += 1
                self.payloads[self.seq] = self.sums[e].clone()
                heapq.heappush(self.flight, (when, self.seq, e))
        x_kept, w_kept = rule.push(self.x[group], w, g.self_weight[group])
        self.x[group] = x_kept
        self.w[group] = w_kept

    def _arrivals(self, end: float) -> None:
        """Apply every push-sum message arriving by ``end`` (per edge the newest)."""
        newest: dict[int, int] = {}
        while self.flight and self.flight[0][0] <= end:
            _, seq, e = heapq.heappop(self.flight)
            if seq > newest.get(e, -1):
                if e in newest:
                    del self.payloads[newest[e]]
                newest[e] = seq
            else:
                del self.payloads[seq]
        if not newest:
            return
        edges = torch.tensor(sorted(newest), dtype=torch.int64)
        seqs = torch.tensor([newest[e] for e in edges.tolist()], dtype=torch.int64)
        fresh = seqs > self.last[edges]
        edges, seqs = edges[fresh], seqs[fresh]
        sums = torch.stack([self.payloads.pop(s) for s in seqs.tolist()]) if edges.numel() else None
        for s in [s for e, s in newest.items() if s in self.payloads]:
            del self.payloads[s]
        if sums is None:
            return
        ok = self.algorithm.admit(sums, self.applied[edges])
        if not bool(ok.all()):  # never for honest sums; the receiver refuses them
            np.add.at(self._rejected, self.graph.dst[edges[~ok]].numpy(), 1)
            edges, seqs, sums = edges[ok], seqs[ok], sums[ok]
        dst = self.graph.dst[edges]
        taken = self.algorithm.receive_rows(self.x, self.w, dst, sums - self.applied[edges])
        if not bool(taken.all()):  # a receiver whose sum would not be finite refuses them
            np.add.at(self._rejected, dst[~taken].numpy(), 1)
            edges, seqs, sums = edges[taken], seqs[taken], sums[taken]
        self.applied[edges] = sums
        self.last[edges] = seqs

    def _upload(self, group: torch.Tensor) -> None:
        """The server family: each upload of ``group`` reaches the server, in node order."""
        algorithm = self.algorithm
        server = self.server
        assert server is not None
        s = torch.full(group.shape, server)
        lost = self._lost(group, s)
        self._traffic(group, s, self.model_bytes, ~lost)
        self._traffic(s, group, self.model_bytes, torch.ones_like(lost))  # the downloads
        for k, i in enumerate(group.tolist()):
            if bool(lost[k]):
                continue
            sent = algorithm.upload(self.pending[i], self.x[i])
            share = float(self.share[i])
            version = int(self.versions[i])
            try:
                self.served = algorithm.receive(self.served, sent, version, share, self.count)
            except ProtocolError:  # a step that would not be finite: the server refuses it
                self._rejected[server] += 1
                continue
            self.x[server] = self.served.x

    # --- checks -----------------------------------------------------------------------------

    @property
    def mass(self) -> float:
        """Asynchronous push-sum: ``sum_i w_i`` plus the weight in flight (``N``)."""
        flight = float((self.sums[:, self.d] - self.applied[:, self.d]).sum())
        return float(self.w.sum()) + flight


def _unsupported(setup: RunSetup) -> str | None:
    """Why the event engine cannot run ``setup`` (one clause), or None."""
    config = setup.config
    if setup.source is not None:
        return "online streams (data.stream) run on the synchronous engines only"
    if setup.graph.period > 1:
        return "a time-varying schedule has rounds, which an asynchronous run has none of"
    if setup.optimizer() is not None:
        return "node optimizers (optimizer.name) are for the synchronous algorithms"
    if config.faults.crashes or config.faults.partitions:
        return (
            "faults.crashes and faults.partitions are by round; give peers that come and go "
            "with time.on_s and time.off_s"
        )
    if config.run.checkpoint_every:
        return "checkpoints of asynchronous runs are not written yet; set run.checkpoint_every = 0"
    if config.run.regret:
        return "run.regret counts one loss a node a round"
    rule = _rule(setup)
    if rule is None:
        return f"{type(setup.algorithm).__name__} does not declare itself an AsynchronousRule"
    if config.run.local_steps > 1 and rule.server is None:
        return (
            f"{setup.algorithm.name} takes one gradient step an event; run.local_steps is "
            "for fedbuff and fedasync"
        )
    if config.time.step_s <= 0 and config.time.compute_trace == "":
        return (
            "an asynchronous run needs compute times: set time.step_s (e.g. 0.1), or "
            "time.compute_trace"
        )
    return None


def _rule(setup: RunSetup) -> AsynchronousRule | None:
    """``setup``'s algorithm, if its class declares it an asynchronous rule."""
    algorithm: object = setup.algorithm
    return algorithm if isinstance(algorithm, AsynchronousRule) else None
