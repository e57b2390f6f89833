"""The vectorized engine of ``fedcore simulate``: every node's round at once.

The message engine (:mod:`fedcore.setup.prepare`) runs one asyncio :class:`~fedcore.node.
Node` per peer, each encoding, routing, decoding and validating message objects: the
reference, and exactly what gRPC peers do. This engine holds every node's state stacked
along a leading node dimension and applies each round to all nodes at once:

* parameters as one ``[N, d]`` tensor; each algorithm's extra state stacked the same way
  (:mod:`fedcore.engines.batched`); mixing slot by slot of a padded in-neighbour table
  built from the same weighted communication graph (one per round of a schedule);
* gradients of all nodes in one ``vmap`` call (:class:`~fedcore.stacked_training.StackedObjective`)
  on batches drawn exactly as each node's stream draws them;
* codecs round-tripping many messages at once, bit for bit as the per-message codec
  (:class:`~fedcore.compression.batched.RowCodec`), so bytes and compression ratios are
  the message engine's;
* faults as per-round masks of the run's :class:`~fedcore.faults.FaultPlan` (crashed
  nodes, lost edges): the one source of fault decisions, whose rows the message engine's
  nodes and gRPC peers read.

It models strict mode with an announced fault plan: every message arrives unless the plan
lost it, which every peer knows. Deadline mode (wall-clock waits), unannounced faults and
algorithms without a batched form run on the message engine; :func:`unsupported` says why.
Results are the same ``summary.json`` and ``metrics.jsonl`` as the message engine's, with
``"engine": "vectorized"``.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.nn import functional

from fedcore.algorithms.base import local_step
from fedcore.algorithms.optim import keep_rows
from fedcore.config import AUTO_RECORDS_NODES, Config
from fedcore.data import StackedBatches
from fedcore.engines.batched import BatchRound, Messages, batched_form, raise_bad
from fedcore.engines.clock import SharedClock, phase_traffic
from fedcore.engines.stacked_eval import evaluate_rows
from fedcore.engines.stacked_graph import EdgeUnion, StackedGraph, stack_graph
from fedcore.errors import CompressionError, ConfigError
from fedcore.gradients import model_input
from fedcore.metrics import JsonlWriter
from fedcore.node import RoundRecord
from fedcore.privacy.dpsgd import peer_words
from fedcore.progress import Progress
from fedcore.runtime import physical_memory
from fedcore.setup import checkpoint
from fedcore.setup.engine_checks import EngineInputs, vectorized_refusal
from fedcore.setup.plan import size_text
from fedcore.setup.prepare import RunSetup
from fedcore.setup.virtual import row_codec
from fedcore.stacked_training import StackedObjective
from fedcore.timing import RoundTimes

__all__ = ["VectorizedNetwork", "node_records_mode", "resolve_device", "unsupported"]

logger = logging.getLogger(__name__)

_FLUSH_EVERY = 64
"""Rounds whose per-round figures stay on the device before they are read back at once."""


def resolve_device(name: str) -> torch.device:
    """``simulate.device`` as a torch device.

    Raises:
        ConfigError: CUDA was asked for and torch sees no GPU.
    """
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"simulate.device = {name!r}, but torch sees no CUDA device here (torch "
            f"{torch.__version__}); use simulate.device = 'cpu'."
        )
    return torch.device(name)


def node_records_mode(config: Config, nodes: int) -> str:
    """``simulate.node_records`` with ``"auto"`` resolved by the number of nodes."""
    mode = config.simulate.node_records
    if mode == "auto":
        return "all" if nodes <= AUTO_RECORDS_NODES else "eval"
    return mode


def unsupported(setup: RunSetup) -> str | None:
    """Why the vectorized engine cannot run ``setup`` (one short clause), or None."""
    config = setup.config
    virtual = isinstance(setup.clock, SharedClock) and setup.clock.deadline
    if config.transport.mode == "deadline" and not virtual:
        return "deadline mode waits on wall-clock deadlines, which only the message engine models"
    if config.faults.active and not config.faults.announce and not virtual:
        return "faults.announce = false loses messages silently, which needs deadline mode"
    # What the config tells (the cheap checks refuse the same before any work).
    why = vectorized_refusal(EngineInputs.of(config), setup.algorithm)
    return why if why is not None else memory_shortfall(setup)


@dataclass(slots=True)
class _Phase:
    """One phase's messages in one graph slot, and their running fault counts."""

    messages: Messages
    missing: torch.Tensor  # per message: rounds it was missing at an up receiver
    dropped: torch.Tensor  # per message: rounds the plan lost it at an up sender
    full: _Counter  # the traffic counts when every message arrives


@dataclass(frozen=True, slots=True)
class RoundFigures:
    """What one round did, network-wide, as device tensors (read back in batches)."""

    round: int
    up: torch.Tensor
    loss: torch.Tensor  # [N] float64, NaN for crashed nodes
    sent: torch.Tensor  # [N] messages that went
    bytes_sent: torch.Tensor
    received: torch.Tensor
    bytes_received: torch.Tensor
    missing: torch.Tensor  # [N] at the receiver
    dropped: torch.Tensor  # [N] at the sender
    fp32: torch.Tensor
    missing_senders: torch.Tensor  # [N] bool: some message of the sender was missing
    idle: torch.Tensor  # [N] bool: up, but the algorithm had it compute no gradient
    late: torch.Tensor  # [N] at the receiver: past the virtual deadline
    vtime: torch.Tensor  # [N] float64: the virtual clock at the round's end (NaN: none)
    compute: torch.Tensor  # [N] float64: virtual seconds computing
    lost: tuple[tuple[Messages, torch.Tensor, bool], ...] = ()  # per phase: lost (or late)


class VectorizedNetwork:
    """Every node of ``setup`` as stacked tensors on ``device`` (see the module docstring).

    Raises:
        ConfigError: :func:`unsupported` names a reason (the stacked state would not fit
            in memory, say), or the device is unusable.
    """

    def __init__(self, setup: RunSetup, *, device: torch.device) -> None:
        """Build the stacked graphs, state, batches and codec."""
        reason = unsupported(setup)
        if reason is not None:
            raise ConfigError(f"the vectorized engine cannot run this config: {reason}.")
        self.setup = setup
        self.device = device
        self.nodes = setup.graph.nodes
        self.n = len(self.nodes)
        graphs = [setup.graph.at(t) for t in range(setup.graph.period)]
        union = EdgeUnion.of(graphs)  # one graph: its own edges, in its own order
        self.start = setup.start.to(device)
        self.d = int(self.start.numel())
        self.dtype = self.start.dtype
        self.codec = row_codec(setup)
        self.form = batched_form(
            setup.algorithm, codec=self.codec.name, itemsize=self.start.element_size()
        )
        held = [0 if setup.source is not None else len(p) for p in setup.parts]
        self.form.samples = torch.tensor(held, dtype=torch.float64, device=device)  # Rows.samples
        if len(graphs) > 1:  # a schedule: robust push-sum's totals are the union's edges
            short = memory_shortfall(setup, edges=len(union))
            if short is not None:
                raise ConfigError(f"the vectorized engine cannot run this config: {short}.")
        self.graphs = [
            stack_graph(g, union=union if len(graphs) > 1 else None, device=device) for g in graphs
        ]
        self.form.use_graphs(self.graphs)
        self.state = self.form.init(self.start.unsqueeze(0).repeat(self.n, 1))
        self.optimizer = setup.optimizer()
        self.opt_state: Any = (
            self.optimizer.init(self.form.model(self.state)) if self.optimizer else None
        )
        self.phases: list[list[_Phase]] = [
            [self._phase(p, g) for p in range(self.form.phases)] for g in self.graphs
        ]
        self.objective = StackedObjective(setup.objective, device, setup.evaluator)
        self._privacy = None if setup.privacy is None else setup.privacy.dpsgd()
        # DP-SGD's noise coordinate of each node (only a private run needs it).
        self._peers = None if self._privacy is None else peer_words(self.nodes, device)
        if self.objective.mode == "module":
            # Every run says it (its summary's warnings list it); a sweep says it once.
            logger.warning(
                "vectorized engine: torch.func cannot map this model; its gradients are "
                "computed one module per node (%s)",
                self.objective.why,
            )
        if setup.source is not None:
            self.batches: StackedBatches | None = None
            self._batched_source = callable(getattr(setup.source, "batches", None))
            # Per-node streams only for a source that cannot give a whole round at once.
            self.streams = (
                [] if self._batched_source else [setup.source.stream(i) for i in range(self.n)]
            )
        else:
            self.batches = self._stacked_batches()
        self._checks: list[tuple[int, torch.Tensor, str, type[Exception]]] = []
        self.read = np.zeros(self.n, dtype=np.int64)  # batches each node read (online streams)
        self.round = 0
        self.plan = setup.faults
        clock = setup.clock
        assert clock is None or isinstance(clock, SharedClock)  # a simulation's (virtual_clock)
        self.clock = clock

    def _stacked_batches(self) -> StackedBatches | None:
        """Every node's batches (a subclass that draws them otherwise returns None and
        draws them in its own :meth:`_data`)."""
        return stacked_batches(self.setup, self.device)

    def _size(self, n: int) -> int:
        """Bytes one encoded tensor of ``n`` values puts on the wire."""
        return self.codec.nbytes(n, self.dtype)

    def _phase(self, phase: int, graph: StackedGraph) -> _Phase:
        messages = self.form.messages(phase, graph, self._size, self.d)
        zeros = torch.zeros_like(messages.src)
        full = _Counter(self.n, self.device)
        full.traffic(messages, None)
        return _Phase(messages, zeros, zeros.clone(), full)

    def model(self) -> torch.Tensor:
        """``[N, d]``: every node's current model."""
        return self.form.model(self.state)

    def evaluate(self) -> dict[str, Any]:
        """The evaluation record of every node's current model (:func:`evaluate_stacked`)."""
        return evaluate_stacked(self, self.model())

    def up(self, t: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Host bool array: the nodes that run round ``t`` (the fault plan's not down)."""
        if self.plan is None:
            return np.ones(self.n, dtype=np.bool_)
        up: np.ndarray[Any, np.dtype[np.bool_]] = (~self.plan.down_mask(t)).numpy()
        return up

    def _data(
        self, t: int, up: np.ndarray[Any, np.dtype[np.bool_]]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Each up node's batch of round ``t`` as ``(rows, x, y, mask)`` groups (see
        :meth:`~fedcore.data.StackedBatches.next`)."""
        if self.batches is not None:
            return [self.batches.next(up)]
        source = self.setup.source
        rows = np.nonzero(up)[0]
        positions = self.read[rows]
        groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        if self._batched_source and rows.size == self.n and (positions == positions[0]).all():
            # Every node at the same position: one call for all (the source's fast path).
            x, y = source.batches(int(positions[0]), device=self.device)  # type: ignore[union-attr]
            groups.append((torch.arange(self.n, device=self.device), x, y, None))
        elif self._batched_source:
            for pos in np.unique(positions).tolist():
                nodes = torch.from_numpy(rows[positions == pos]).to(self.device)
                x, y = source.batches(int(pos), nodes, device=self.device)  # type: ignore[union-attr]
                groups.append((nodes, x, y, None))
        else:
            parts = [self.streams[i].next_batch() for i in rows.tolist()]
            x = torch.stack([p[0] for p in parts]).to(self.device)
            y = torch.stack([p[1] for p in parts]).to(self.device)
            groups.append((torch.from_numpy(rows).to(self.device), x, y, None))
        self.read[rows] += 1
        return groups

    def _loss_and_grad(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        rows: torch.Tensor | None,
        t: int,
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' losses and gradients at local step ``k`` of round ``t``: DP-SGD's
        private ones in a private run (``rows``: which nodes, None: every one), as each
        node computes them alone (:mod:`fedcore.privacy.dpsgd`)."""
        if self._privacy is None or self._peers is None:
            return self.objective.loss_and_grad(params, x, y, mask)
        peers = self._peers if rows is None else self._peers[rows]
        return self._privacy.loss_and_grad(self.objective.rows, params, x, y, peers, t, k, mask)

    def run_round(self) -> RoundFigures:
        """Run round ``self.round`` for every node; return what it did."""
        t = self.round
        up_np = self.up(t)
        up = torch.from_numpy(up_np).to(self.device)
        slot = t % len(self.graphs)
        graph = self.graphs[slot]
        lr = self.setup.options.lr_at(t)
        step_lr = lr if self.optimizer is None else 1.0  # with an optimizer, the step is u
        steps = self.setup.options.local_steps
        local = BatchRound(
            round=t,
            lr=step_lr,
            graph=graph,
            up=up,
            arrived=(),
            codec=self.codec,
            nodes=self.nodes,
            everyone_up=bool(up_np.all()),
        )
        # The nodes that compute a gradient: the up ones, less those the algorithm idles
        # (the server family's server and unsampled workers, as a Node's ``trains`` says).
        trains = self._trains(t)
        training_np = up_np if trains is None else up_np & trains.cpu().numpy()
        training = up if trains is None else up & trains
        idle = up & ~training
        every = bool(training_np.all())
        loss_sum: torch.Tensor | None = None
        for k in range(steps):  # as a Node does: the last step is the algorithm's own
            params = self.model()
            groups = self._data(t, training_np)
            if every and len(groups) == 1 and groups[0][0].numel() == self.n:
                # Every node in one group, in order: no gather of the parameters and no
                # scatter of the gradients (each would be a copy of the whole stack).
                _, x, y, mask = groups[0]
                losses, grad = self._loss_and_grad(params, x, y, mask, None, t, k)
                loss = losses.to(torch.float64)
            else:
                loss = torch.full((self.n,), math.nan, dtype=torch.float64, device=self.device)
                grad = torch.zeros_like(params)
                for rows, x, y, mask in groups:
                    losses, grads = self._loss_and_grad(params[rows], x, y, mask, rows, t, k)
                    loss[rows] = losses.to(torch.float64)
                    grad[rows] = grads
            if self.optimizer is not None:
                u, opt_state = self.optimizer.update(grad, self.opt_state, params, lr)
                self.opt_state = (
                    opt_state if every else keep_rows(training, opt_state, self.opt_state)
                )
                grad = u if every else torch.where(training.unsqueeze(1), u, 0.0)
            if steps > 1:
                loss_sum = loss if loss_sum is None else loss_sum + loss
            if k + 1 < steps:
                self.state = local_step(self.form, self.state, grad, local)
        if loss_sum is not None:
            loss = loss_sum / steps
        arrived: list[torch.Tensor] = []
        phases = self.phases[slot]
        figures = _Counter(self.n, self.device)
        actives: list[torch.Tensor | None] = []
        by_round = self.form.by_round
        sent: list[tuple[Messages, torch.Tensor | None, torch.Tensor | None]] = []
        for p, phase in enumerate(phases):
            m = phase.messages
            if by_round:  # the sizes of this round's messages
                m = self.form.messages(p, graph, self._size, self.d, round=t)
            active = self._active(p, t, graph)
            actives.append(active)
            lost = None
            if self.plan is not None:
                lost = self.plan.lost_mask(m.src, m.dst, t, p)
                if active is not None:
                    lost = lost & active
            sent.append((m, active, lost))
        times = None
        if self.clock is not None:  # every phase's times first: a late message is missing
            traffic = [phase_traffic(self.plan, *entry, up, t, p) for p, entry in enumerate(sent)]
            times = self.clock.advance(t, up, training, traffic)
        for p, (phase, (m, active, lost)) in enumerate(zip(phases, sent, strict=True)):
            if lost is None:
                ok = torch.ones_like(m.src, dtype=torch.bool) if active is None else active
            else:
                ok = ~lost if active is None else active & ~lost
                phase.dropped += lost & up[m.src]
                phase.missing += lost & up[m.dst]
                figures.faults(m, lost & up[m.src], lost & up[m.dst])
            late = None if times is None else times.late[p].to(self.device)
            if late is not None and bool(late.any()):
                phase.missing += late
                figures.faults(m, torch.zeros_like(late), late, late=True)
                figures.traffic(m, ok, received=ok & ~late)
                ok = ok & ~late
            elif lost is None and active is None and not by_round:
                figures.add(phase.full)  # the same every round: counted once
            else:
                figures.traffic(m, ok)
            arrived.append(ok)
        ctx = BatchRound(
            round=t,
            lr=step_lr,
            graph=graph,
            up=up,
            arrived=arrived,
            codec=self.codec,
            nodes=self.nodes,
            every_message=self.plan is None and not any(a is not None for a in actives),
            everyone_up=bool(up_np.all()),
            defer_checks=self.device.type != "cpu",
            active=actives,
        )
        try:
            self.state = self.form.round(self.state, grad, ctx)
        except CompressionError:
            self.check()  # a deferred check that failed first says more than the codec
            raise
        self._checks.extend((t, *check) for check in ctx.deferred)
        self.round = t + 1
        return figures.done(t, up, loss, idle, times)

    def _trains(self, t: int) -> torch.Tensor | None:
        """``[N]`` bool: the nodes the algorithm has compute a gradient in round ``t``."""
        return self.form.trains(t, self.nodes, self.device)

    def _active(self, phase: int, t: int, graph: StackedGraph) -> torch.Tensor | None:
        """``[M]`` bool: the messages of ``phase`` sent in round ``t`` (``None``: all)."""
        mask: torch.Tensor | None = self.form.active(phase, t, graph, self.nodes)
        return mask

    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`load_state_dict` needs to continue from this round exactly (for
        a checkpoint; call :meth:`check` first): the stacked state, where every node is in
        its data, the codec's generators and the fault counts so far, as CPU tensors."""
        generators = self.codec.generators  # empty for a codec that draws nothing
        return {
            "round": self.round,
            "state": checkpoint.to_tree(self.state),
            "optimizer": checkpoint.to_tree(self.opt_state),
            "read": torch.from_numpy(self.read.copy()),
            "batches": self.batches.state_dict() if self.batches is not None else None,
            "codec": [g.get_state() for g in generators] if generators else None,
            "faults": [
                [[ph.missing.cpu(), ph.dropped.cpu()] for ph in phases] for phases in self.phases
            ],
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` of a network built from the same setup."""
        self.round = int(saved["round"])
        state = checkpoint.restore_state(saved["state"], self.state, "the network", self.form.name)
        self.state = checkpoint.to_device(state, self.device)
        self.opt_state = checkpoint.to_device(
            checkpoint.from_tree(saved.get("optimizer")), self.device
        )
        self.read[:] = saved["read"].numpy()
        if self.batches is not None:
            self.batches.load_state_dict(saved["batches"])
        for i, stream in enumerate(self.streams if self.batches is None else []):
            for _ in range(int(self.read[i])):  # a stream is a function of the seed
                stream.next_batch()
        for g, state in zip(self.codec.generators, saved["codec"] or [], strict=True):
            g.set_state(state)
        for phases, counts in zip(self.phases, saved["faults"], strict=True):
            for phase, (missing, dropped) in zip(phases, counts, strict=True):
                phase.missing.copy_(missing)
                phase.dropped.copy_(dropped)

    def check(self) -> None:
        """Read back the deferred checks of the rounds run so far (see
        :meth:`BatchRound.check`); raise the first that failed.

        Raises:
            AlgorithmError, ProtocolError: a check failed (naming the node and round).
        """
        checks, self._checks = self._checks, []
        for t, bad, why, error in checks:
            raise_bad(bad, why, self.nodes, t, error)

    def fault_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """``(missing per edge, lost per edge)``, keyed ``"sender->receiver"``, as the
        summary's ``faults`` tables (only edges with a count)."""
        missing: dict[str, int] = {}
        dropped: dict[str, int] = {}
        for phases in self.phases:
            for phase in phases:
                src, dst = phase.messages.src.cpu().tolist(), phase.messages.dst.cpu().tolist()
                for table, counts in ((missing, phase.missing), (dropped, phase.dropped)):
                    for e in torch.nonzero(counts).flatten().cpu().tolist():
                        key = f"{self.nodes[src[e]]}->{self.nodes[dst[e]]}"
                        table[key] = table.get(key, 0) + int(counts[e])
        return missing, dropped


def stacked_batches(
    setup: RunSetup, device: torch.device, rows: Sequence[int] | None = None
) -> StackedBatches:
    """Every node's batches of ``setup``, drawn as each node's stream draws them; of the
    nodes ``rows`` only (a sharded rank's, in that order: row ``i`` of the stack is node
    ``rows[i]``, with that node's own part and seed), where given."""
    config = setup.config
    at = range(len(setup.parts)) if rows is None else rows
    # A node that holds no data (the server family's server) never trains, so it never
    # reads: a stand-in part of one example keeps the stacked batches simple.
    parts = [p if len(p) else np.zeros(1, dtype=np.int64) for p in (setup.parts[i] for i in at)]
    return StackedBatches(
        setup.dataset.x_train,
        setup.dataset.y_train,
        parts,
        batch_size=config.data.batch_size,
        seeds=[config.run.seed * 1_000_003 + i for i in at],
        order=config.data.order,
        device=device,
    )


class _Counter:
    """Per-node counts of one round, accumulated on the device."""

    def __init__(self, n: int, device: torch.device) -> None:
        z = torch.zeros(n, dtype=torch.long, device=device)
        self.n = n
        self.sent, self.bytes_sent, self.received, self.bytes_received = z, z, z, z
        self.missing, self.dropped, self.fp32, self.late = z, z, z, z
        self.missing_senders = torch.zeros(n, dtype=torch.bool, device=device)
        self.lost: list[tuple[Messages, torch.Tensor, bool]] = []

    def _count(self, index: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return torch.bincount(index, weights=weight, minlength=self.n).to(torch.long)

    def traffic(
        self, m: Messages, ok: torch.Tensor | None, received: torch.Tensor | None = None
    ) -> None:
        """Count the messages ``ok`` marks as delivered (``None``: all of them), of which
        ``received`` (default: the same) reached their receiver in time."""
        okl = torch.ones_like(m.src) if ok is None else ok.to(torch.long)
        inl = okl if received is None else received.to(torch.long)
        self.sent = self.sent + self._count(m.src, okl.to(torch.float64))
        self.bytes_sent = self.bytes_sent + self._count(m.src, (m.nbytes * okl).to(torch.float64))
        self.fp32 = self.fp32 + self._count(m.src, (m.fp32 * okl).to(torch.float64))
        self.received = self.received + self._count(m.dst, inl.to(torch.float64))
        self.bytes_received = self.bytes_received + self._count(
            m.dst, (m.nbytes * inl).to(torch.float64)
        )

    def add(self, counts: _Counter) -> None:
        """Add the traffic counts of another counter."""
        self.sent = self.sent + counts.sent
        self.bytes_sent = self.bytes_sent + counts.bytes_sent
        self.fp32 = self.fp32 + counts.fp32
        self.received = self.received + counts.received
        self.bytes_received = self.bytes_received + counts.bytes_received

    def faults(
        self, m: Messages, dropped: torch.Tensor, missing: torch.Tensor, *, late: bool = False
    ) -> None:
        """Count lost messages (``late``: messages past the virtual deadline, missing at
        their receiver but sent)."""
        self.lost.append((m, dropped | missing, late))
        self.dropped = self.dropped + self._count(m.src, dropped.to(torch.float64))
        self.missing = self.missing + self._count(m.dst, missing.to(torch.float64))
        if late:
            self.late = self.late + self._count(m.dst, missing.to(torch.float64))
        self.missing_senders = self.missing_senders | (
            self._count(m.src, missing.to(torch.float64)) > 0
        )

    def done(
        self,
        t: int,
        up: torch.Tensor,
        loss: torch.Tensor,
        idle: torch.Tensor,
        times: RoundTimes | None = None,
    ) -> RoundFigures:
        if times is None:
            vtime = compute = torch.full(
                (self.n,), math.nan, dtype=torch.float64, device=self.late.device
            )
        else:
            vtime, compute = times.end, times.compute
        return RoundFigures(
            late=self.late,
            vtime=vtime,
            compute=compute,
            round=t,
            up=up,
            loss=loss,
            sent=self.sent,
            bytes_sent=self.bytes_sent,
            received=self.received,
            bytes_received=self.bytes_received,
            missing=self.missing,
            dropped=self.dropped,
            fp32=self.fp32,
            missing_senders=self.missing_senders,
            idle=idle,
            lost=tuple(self.lost),
        )


STATE_COPIES = 6
"""Copies of the ``[N, d]`` stack a vectorized round holds at its peak, besides the
activations: the parameters, an algorithm's state and step, the gradient, and the round's
temporaries (measured: about 3 stacks over the state for ``femnist-cnn``; 14 for the MLP at
10,000 peers, activations included: ``benchmarks/README.md``)."""

ACTIVATION_COPIES = 3
"""Copies of a batch's saved activations a gradient pass holds: those autograd keeps, their
gradients in the backward pass, and the forward's temporaries."""

PEER_OVERHEAD = 4 << 10
"""Bytes a peer of the vectorized engine holds besides its rows: its stacked graph rows and
per-edge tensors, per-node figures (3.3 KiB measured for logreg at 10,000 peers)."""


def saved_bytes_per_example(setup: RunSetup) -> int:
    """What one training example makes the model keep for its backward pass (the tensors
    autograd saves, less the parameters), measured on two examples of the run's data: the
    activations that grow with the batch and the peers."""
    objective = setup.evaluator
    module = copy.deepcopy(objective.module)  # its running statistics stay the evaluator's
    module.train()
    params = {p.data_ptr() for p in module.parameters()}
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        if t.data_ptr() not in params:
            saved += t.numel() * t.element_size()
        return t

    x, y = setup.dataset.x_train[:2], setup.dataset.y_train[:2]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        functional.cross_entropy(module(model_input(x, objective.dtype)), y)
    return -(-saved // max(1, len(y)))


def memory_need(setup: RunSetup, *, edges: int | None = None) -> int:
    """Bytes the vectorized engine needs for ``setup``: per peer, :data:`STATE_COPIES` of its
    row and :data:`PEER_OVERHEAD`, and :data:`ACTIVATION_COPIES` of a batch's activations
    (:func:`saved_bytes_per_example`) for every peer at once, or for one where the gradients
    are one module per peer (mode ``module``); robust push-sum adds two float64 totals an
    edge (``edges``: the graphs' union, default the graph's edges). An upper bound of the
    measured peaks (``benchmarks/README.md``, models.py): 171 MiB a peer for femnist-cnn
    (116 measured), 223 for resnet20 (149)."""
    n = len(setup.graph.nodes)
    row = setup.start.numel() * setup.start.element_size()
    active = ACTIVATION_COPIES * setup.config.data.batch_size * saved_bytes_per_example(setup)
    at_once = 1 if setup.evaluator.rows.mode == "module" else n
    need = n * (STATE_COPIES * row + PEER_OVERHEAD) + at_once * active
    if setup.algorithm.robust:
        count = edges if edges is not None else len(setup.graph.union().index_edges()[0])
        need += 2 * count * setup.start.numel() * 8 * 2  # float64 totals at both ends, a copy
    return need


def memory_shortfall(setup: RunSetup, *, edges: int | None = None) -> str | None:
    """Why the vectorized engine's state would not fit this machine's memory (one clause),
    or None."""
    memory = physical_memory()
    if memory is None:
        return None
    need = memory_need(setup, edges=edges)
    if need <= memory:
        return None
    d = setup.start.numel()
    robust = " (robust push-sum adds two float64 totals an edge)" if setup.algorithm.robust else ""
    return (
        f"{len(setup.graph.nodes)} stacked peers of a {d:,}-parameter model need about "
        f"{size_text(need)}{robust}, more than this machine's {size_text(memory)}"
    )


def evaluate_stacked(net: VectorizedNetwork, params: torch.Tensor) -> dict[str, Any]:
    """:func:`~fedcore.metrics.evaluate_models` of every row of ``params`` at once: the
    average model's loss and accuracy, every node's accuracy (of the ``run.eval_peers``
    sample), the consensus distance (:mod:`fedcore.engines.stacked_eval`)."""
    return evaluate_rows(net.setup, net.objective, net.nodes, params)


_COLUMNS = (
    "up",
    "loss",
    "sent",
    "bytes_sent",
    "received",
    "bytes_received",
    "missing",
    "dropped",
    "fp32",
    "missing_senders",
    "idle",
    "late",
    "vtime",
    "compute",
)


class Flusher:
    """Reads round figures back in batches and accounts them into a run's observer."""

    def __init__(
        self,
        net: VectorizedNetwork,
        *,
        observer: Any,
        writer: JsonlWriter | None,
        records: str,
        progress: Progress | None,
    ) -> None:
        """Account into ``observer`` (a :class:`~fedcore.simulation.observer.RunObserver`:
        its totals, losses, missing and down tables, rounds and evaluations)."""
        self.net = net
        self.observer = observer
        self.writer = writer
        self.records = records
        self.progress = progress
        self.pending: list[RoundFigures] = []
        self.last_loss: float | None = None
        self.began = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """What the flusher carries from round to round (for a checkpoint; flush first)."""
        return {"loss": self.last_loss}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        self.last_loss = saved["loss"]

    def add(self, figures: RoundFigures) -> None:
        """Keep a round's figures; read them back on evaluation rounds and every
        ``_FLUSH_EVERY`` rounds (evaluating the models on evaluation rounds)."""
        self.pending.append(figures)
        t = figures.round
        is_eval = self.observer.is_eval_round(t)
        if is_eval or len(self.pending) >= _FLUSH_EVERY:
            self.flush()
            if is_eval:
                self.observer.add_eval(t, self.last_loss, self.net.evaluate())
            if self.progress is not None:
                self.progress.update(
                    t + 1, loss=self.last_loss, accuracy=self.observer.last_accuracy
                )

    def flush(self) -> None:
        """Read back every pending round and account it."""
        self.net.check()
        # Taken off the queue first: a flush stopped half-way (Ctrl-C) and retried never
        # accounts a round twice.
        pending, self.pending = self.pending, []
        if not pending:
            return
        obs = self.observer
        nodes = self.net.nodes
        stacked = {key: torch.stack([getattr(f, key) for f in pending]).cpu() for key in _COLUMNS}
        now = time.perf_counter()
        wall = (now - self.began) / len(pending)
        self.began = now
        for k, f in enumerate(pending):
            t = f.round
            up = stacked["up"][k]
            values = stacked["loss"][k]
            trained = up & ~stacked["idle"][k]  # an idle node's loss is no loss
            live = values[trained].tolist()
            if self.writer is not None and (
                self.records == "all" or (self.records == "eval" and obs.is_eval_round(t))
            ):
                lr = self.net.setup.options.lr_at(t)
                lists = _fault_lists(f, up, nodes)
                row = {key: stacked[key][k].tolist() for key in _COLUMNS}  # read once a round
                for i, node in enumerate(nodes):
                    record = _node_record(node, t, i, lr, wall, row)
                    if i in lists and not record.down:
                        missing, dropped_in, dropped_out = lists[i]
                        record = replace(
                            record,
                            missing=tuple(missing),
                            dropped_in=tuple(dropped_in),
                            dropped_out=tuple(dropped_out),
                        )
                    self.writer.write(record.to_json())
            vtimes = stacked["vtime"][k]
            timed = not bool(torch.isnan(vtimes[0]))
            self.last_loss = obs.end_round(
                t,
                live,
                sent=int(stacked["sent"][k].sum()),
                bytes_sent=int(stacked["bytes_sent"][k].sum()),
                missing=int(stacked["missing"][k].sum()),
                dropped=int(stacked["dropped"][k].sum()),
                vtime=float(vtimes.max()) if timed else None,
            )

            # Accounted once the round is complete: a run stopped before counts none of it.
            for key, column in (
                ("messages_sent", "sent"),
                ("bytes_sent", "bytes_sent"),
                ("messages_received", "received"),
                ("messages_missing", "missing"),
                ("messages_dropped", "dropped"),
                ("messages_late", "late"),
                ("fp32_bytes_sent", "fp32"),
            ):
                obs.totals[key] += int(stacked[column][k].sum())
            for i in torch.nonzero(stacked["missing_senders"][k]).flatten().tolist():
                obs.missing.setdefault(nodes[i], set()).add(t)
            for i in torch.nonzero(~up).flatten().tolist():
                obs.down.setdefault(nodes[i], []).append(t)
            obs.add_losses(values, trained)
        compute = stacked["compute"]
        if not bool(torch.isnan(compute[0, 0])):  # virtual time: the seconds each computed
            # Added round by round, as the message engine's records add up.
            busy = torch.tensor([obs.busy.get(node, 0.0) for node in nodes], dtype=torch.float64)
            for row in compute:
                busy += row
            obs.busy.update(zip(nodes, busy.tolist(), strict=True))


def _fault_lists(
    figures: RoundFigures, up: torch.Tensor, nodes: tuple[str, ...]
) -> dict[int, tuple[list[str], list[str], list[str]]]:
    """Node index -> (senders missing at it, those the fault plan lost, receivers it lost
    messages to) in one round, phase by phase, each in node order (what a node record
    lists); a late message is missing, not lost."""
    lists: dict[int, tuple[list[str], list[str], list[str]]] = {}
    for messages, lost, late in figures.lost:
        src, dst = messages.src.cpu(), messages.dst.cpu()
        hit = torch.nonzero(lost.cpu()).flatten()
        pairs = sorted(zip(src[hit].tolist(), dst[hit].tolist(), strict=True))
        for u, v in sorted(pairs, key=lambda p: (p[1], p[0])):
            if up[v]:
                entry = lists.setdefault(v, ([], [], []))
                entry[0].append(nodes[u])
                if not late:
                    entry[1].append(nodes[u])
        for u, v in pairs:
            if up[u] and not late:
                lists.setdefault(u, ([], [], []))[2].append(nodes[v])
    return lists


def _node_record(
    node: str, t: int, i: int, lr: float, wall: float, row: Mapping[str, list[Any]]
) -> RoundRecord:
    """Node ``i``'s record of round ``t`` from ``row``, the round's :data:`_COLUMNS` as
    lists."""
    vtime = float(row["vtime"][i])
    if not row["up"][i]:
        down = RoundRecord.down_round(node, t, lr=lr, wall_s=wall)
        return down if math.isnan(vtime) else replace(down, vtime=vtime)
    return RoundRecord(
        messages_late=int(row["late"][i]),
        vtime=None if math.isnan(vtime) else vtime,
        compute_s=float(row["compute"][i]),
        node=node,
        round=t,
        loss=float(row["loss"][i]),
        lr=lr,
        messages_sent=int(row["sent"][i]),
        bytes_sent=int(row["bytes_sent"][i]),
        messages_received=int(row["received"][i]),
        bytes_received=int(row["bytes_received"][i]),
        messages_missing=int(row["missing"][i]),
        messages_rejected=0,
        missing=(),
        wall_s=wall,
        messages_dropped=int(row["dropped"][i]),
        fp32_bytes_sent=int(row["fp32"][i]),
        idle=bool(row["idle"][i]),
    )
