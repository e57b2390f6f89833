"""The round loop of one peer (:class:`Node`): the only place that knows both asyncio and
algorithms. See :mod:`fedcore.node` for what a round does and the two waiting modes, and
:mod:`fedcore.node.arrivals` for the policy that carries them out."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from fedcore.algorithms.base import (
    Algorithm,
    Outbox,
    RoundContext,
    SamplesTrainers,
    local_step,
    unions,
)
from fedcore.algorithms.optim import Optimizer
from fedcore.compression import Codec, RawCodec
from fedcore.errors import (
    CompressionError,
    MessageRefusedError,
    PeerUnavailableError,
    ProtocolError,
    TransportTimeoutError,
)
from fedcore.faults import FaultPlan
from fedcore.messages import EncodedTensor, Message, Payload
from fedcore.models import Objective
from fedcore.node.arrivals import Arrivals, Tally, VirtualClock
from fedcore.node.intake import DecodeCache, MessageIntake
from fedcore.node.pace import Pace
from fedcore.node.records import RoundRecord, traffic
from fedcore.node.rule import per_node
from fedcore.node.schedule import NodeOptions
from fedcore.privacy.dpsgd import DPSGD, PeerDP, peer_words
from fedcore.streams import Batches
from fedcore.topology import Topology
from fedcore.transport.base import Transport

__all__ = ["Node"]

logger = logging.getLogger("fedcore.node")


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a send task's outcome as seen (the node reads it when it accounts for it)."""
    if not task.cancelled():
        task.exception()


class Node:
    """One peer: its algorithm state, data, model and transport endpoint.

    Args:
        node_id: This node's id in ``graph``.
        algorithm: The algorithm (shared by all nodes; it is stateless).
        graph: The communication topology with the algorithm's mixing weights.
        objective: The model as a function of flat parameters (this node's own).
        stream: This node's minibatches.
        transport: This node's endpoint.
        options: Run id, step size, waiting mode.
        params: Initial flat parameters (default: the objective's initial ones).
        codec: Codec for outgoing tensors (incoming ones name their own).
        optimizer: The node optimizer (:mod:`fedcore.algorithms.optim`): the algorithm
            steps by its direction ``u`` where it stepped by ``lr * g`` (its step gets
            ``u`` as the gradient and a step size of 1). ``None``: plain SGD.
        observer: Called with ``(node, record)`` after every round.
        decode_cache: Shared by the nodes of one process to decode each payload once.
        faults: The run's fault plan (``None``: no faults), which the node asks whether it
            is crashed in a round, which of its messages were lost and which it must not
            wait for. ``transport`` loses them on the wire: wrap it in a
            :class:`~fedcore.transport.faults.FaultyTransport` of the same plan.
    """

    def __init__(
        self,
        node_id: str,
        *,
        algorithm: Any,
        graph: Topology,
        objective: Objective,
        stream: Batches,
        transport: Transport,
        options: NodeOptions,
        params: torch.Tensor | None = None,
        codec: Codec | None = None,
        optimizer: Optimizer | None = None,
        observer: Callable[[Node, RoundRecord], None] | None = None,
        decode_cache: DecodeCache | None = None,
        faults: FaultPlan | None = None,
        clock: VirtualClock | None = None,
        pace: Pace | None = None,
        privacy: DPSGD | PeerDP | None = None,
    ) -> None:
        """Initialise the algorithm state from ``params``. ``clock``: a simulation's virtual
        clock; the node then waits for exactly the messages the fault plan did not lose
        and leaves out those the clock says came after the deadline (no wall-clock waits):
        its :class:`~fedcore.node.arrivals.Arrivals` policy (:attr:`arrivals`) is chosen
        here from ``options``, ``faults`` and ``clock``. ``algorithm``: a rule runs through
        its one-peer adapter (:func:`per_node`). ``privacy``: the run's DP-SGD, which
        then computes every gradient (:mod:`fedcore.privacy.dpsgd`)."""
        self.id = node_id
        self.algorithm: Algorithm = per_node(algorithm)
        algorithm = self.algorithm
        self.graph = graph
        self.objective = objective
        self.privacy = privacy
        self._peer = peer_words([node_id]) if privacy is not None else None
        self.stream = stream
        self.transport = transport
        self.options = options
        self.codec: Codec = codec or RawCodec()
        self.observer = observer
        start = objective.initial_params() if params is None else params
        self.state: Any = algorithm.init(start)
        self.optimizer = optimizer
        self.opt_state: Any = optimizer.init(algorithm.model(self.state)) if optimizer else None
        self._shape = tuple(start.shape)
        self._dtype = start.dtype
        self.round = 0
        self.batches_read = 0  # from the stream (a crashed round reads none); for checkpoints
        self._contexts: dict[int, tuple[float, dict[str, float], dict[str, float]]] = {}
        self.faults = faults
        self.clock = clock
        # What it checks of every message it receives (its servicer too), and what it
        # makes of each phase's arrivals.
        self.intake = MessageIntake(
            node_id,
            algorithm=algorithm,
            graph=graph,
            run_id=options.run_id,
            drift=options.round_window,
            codec=self.codec,
            like=start,
            decode_cache=decode_cache,
        )
        self.arrivals = Arrivals.of(node_id, options, faults, clock)
        self.pace = pace  # a real peer slowed on purpose ([time] without a virtual clock)
        self._unreachable: set[str] = set()  # peers whose last send failed (logged once)
        # Deadline mode: the send on its way to each receiver (task, message, its fp32
        # size, 0 if the fault plan lost it).
        self._sending: dict[str, tuple[asyncio.Task[None], Message, int]] = {}
        # Whether this node trains in a round (the server family: the server never does, a
        # worker only when sampled); None: always. An idle node's step gets a zero gradient.
        self._trains = algorithm.trains if isinstance(algorithm, SamplesTrainers) else None
        self._examples = int(getattr(stream, "examples", 0))
        self._unions: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._refused: set[str] = set()  # receivers whose refusal was logged

    def model(self) -> torch.Tensor:
        """The parameters this node currently predicts with."""
        return self.algorithm.model(self.state)

    def validate(self, message: Message) -> None:
        """Check ``message`` as this node would before mixing it (for a transport's
        servicer): its round within :meth:`round_window`, then everything
        :meth:`MessageIntake.validate <fedcore.node.intake.MessageIntake.validate>` checks.

        Raises:
            OutOfWindowError: a round beyond :meth:`round_window` of this node's.
            ProtocolError: a message this node would not mix.
        """
        self.intake.check_window(message, self.round)
        self.intake.validate(message, self.state, self._context(message.round))

    def round_window(self, sender: str) -> int:
        """How many rounds ahead of this node's a message from ``sender`` may be
        (:meth:`MessageIntake.round_window <fedcore.node.intake.MessageIntake.round_window>`)."""
        return self.intake.round_window(sender)

    def _context(self, t: int) -> RoundContext:
        slot = t % self.graph.period
        weights = self._contexts.get(slot)
        if weights is None:
            g = self.graph.at(t)
            weights = (g.self_weight(self.id), g.out_weights(self.id), g.in_weights(self.id))
            self._contexts[slot] = weights
        if self._unions is None:  # the neighbours over every round of the graphs
            self._unions = unions(self.graph, self.id)
        return RoundContext(
            node=self.id,
            round=t,
            lr=self.options.lr_at(t),
            self_weight=weights[0],
            out_weights=weights[1],
            in_weights=weights[2],
            nodes=self.graph.nodes,
            codec=self.codec,
            deadline=self.options.mode == "deadline",
            samples=self._examples,
            out_union=self._unions[0],
            in_union=self._unions[1],
        )

    async def run(self, rounds: int) -> None:
        """Run rounds ``self.round .. rounds - 1``, then let the last messages arrive."""
        while self.round < rounds:
            await self.run_round()
        await self.finish_sending()

    async def run_round(self) -> RoundRecord:
        """Run one round and return its record."""
        t = self.round
        began = time.perf_counter()
        stats = self.transport.stats
        before = traffic(stats)
        ctx = self._context(t)
        faults = self.faults
        if faults is not None and faults.down(self.id, t):
            return self._skip_round(t, ctx.lr, began)
        step_ctx = ctx if self.optimizer is None else dataclasses.replace(ctx, lr=1.0)
        idle = self._trains is not None and not self._trains(ctx)
        losses = [math.nan] if idle else []
        grad = torch.zeros(self._shape, dtype=self._dtype) if idle else None
        if self.pace is not None and not idle:
            await self.pace.available()
        computing = time.perf_counter()
        for k in range(0 if idle else self.options.local_steps):  # the last: the algorithm's
            x, y = self.stream.next_batch()
            self.batches_read += 1
            grad = self._gradient(x, y, ctx, losses, k)
            if k + 1 < self.options.local_steps:
                self.state = local_step(self.algorithm, self.state, grad, step_ctx)
        loss = losses[0] if len(losses) == 1 else math.fsum(losses) / len(losses)
        assert grad is not None
        self.state, outbox = self.algorithm.step(self.state, grad, step_ctx)
        if self.pace is not None and not idle:
            await self.pace.computed(time.perf_counter() - computing)
        # The state keeps what it needs of the gradient (a large model's copy a peer, held
        # through the exchange otherwise).
        del grad
        tally = Tally()
        fp32 = 0
        unreachable: list[str] = []
        dropped_out: list[str] = []
        for phase in range(self.algorithm.phases):
            fp32 += await self._send(outbox, t, phase, unreachable, dropped_out)
            self.arrivals.sent(t, phase, frozenset(outbox))
            expected = self.algorithm.expected_senders(phase, ctx)
            inbox = await self._collect(t, phase, expected, ctx, tally)
            self.state, outbox = self.algorithm.mix(self.state, phase, inbox, step_ctx)
        self.round = t + 1
        vtime, compute_s = (None, 0.0) if self.clock is None else self.clock.node_times(self.id, t)
        record = RoundRecord(
            node=self.id,
            round=t,
            loss=loss,
            lr=ctx.lr,
            messages_sent=stats.messages_sent - before[0],
            bytes_sent=stats.bytes_sent - before[1],
            messages_received=stats.messages_received - before[2] - tally.late,
            bytes_received=stats.bytes_received - before[3] - tally.late_bytes,
            messages_missing=len(tally.missing),
            messages_late=stats.messages_late - before[4] + tally.late,
            messages_rejected=stats.messages_rejected - before[5] + tally.rejected,
            missing=tuple(tally.missing),
            wall_s=time.perf_counter() - began,
            messages_dropped=len(dropped_out),
            dropped_out=tuple(dropped_out),
            dropped_in=tuple(tally.dropped_in),
            fp32_bytes_sent=fp32,
            unreachable=tuple(dict.fromkeys(unreachable)),
            idle=idle,
            vtime=vtime,
            compute_s=compute_s,
        )
        if self.observer is not None:
            self.observer(self, record)
        return record

    def _gradient(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        ctx: RoundContext,
        losses: list[float],
        step: int = 0,
    ) -> torch.Tensor:
        """The gradient (or the node optimizer's direction) of the current model on ``(x,
        y)``; its loss goes to ``losses``. A method of its own so that neither the model it
        was taken at nor the raw gradient outlives it in the round's frame."""
        params = self.algorithm.model(self.state)
        if self.privacy is not None and self._peer is not None:  # local step ``step``
            rows = self.privacy.loss_and_grad(
                self.objective.rows, params[None], x[None], y[None], self._peer, ctx.round, step
            )
            loss, grad = float(rows[0].item()), rows[1][0]
        else:
            loss, grad = self.objective.loss_and_grad(params, x, y)
        losses.append(loss)
        if self.optimizer is not None:
            grad, self.opt_state = self.optimizer.update(grad, self.opt_state, params, ctx.lr)
        return grad

    def _skip_round(self, t: int, lr: float, began: float) -> RoundRecord:
        """A crashed round: no step, no message; the state waits for the node's return."""
        self.round = t + 1
        record = RoundRecord.down_round(self.id, t, lr=lr, wall_s=time.perf_counter() - began)
        if self.clock is not None:
            record = dataclasses.replace(record, vtime=self.clock.node_times(self.id, t)[0])
        if self.observer is not None:
            self.observer(self, record)
        return record

    async def _send(
        self, outbox: Outbox, t: int, phase: int, unreachable: list[str], dropped_out: list[str]
    ) -> int:
        """Encode and send ``outbox``; return the float32 size of the tensors that went.

        The receivers of the messages handed to the transport that the fault plan lost
        (the transport loses them on the wire) go to ``dropped_out``.

        Strict mode sends one message after another and raises on a receiver it cannot
        reach. Deadline mode sends each receiver's message in a task of its own and waits
        for them at most ``deadline_s``: a stalled link (a cut cable holds a call until
        ``transport.call_timeout_s``) then delays neither the other receivers nor the
        round. A receiver whose previous message is still on its way gets none this round
        (messages to one receiver stay in order), and one that cannot be reached is logged
        and added to ``unreachable``; the round goes on.
        """
        encoded: dict[int, tuple[dict[str, EncodedTensor], int]] = {}
        messages: list[tuple[Message, int]] = []
        for dst in sorted(outbox):
            payload = outbox[dst]
            entry = encoded.get(id(payload))
            if entry is None:
                # An algorithm that compressed a tensor itself hands over its EncodedTensor.
                tensors = {
                    k: v if isinstance(v, EncodedTensor) else self.codec.encode(v)
                    for k, v in payload.tensors.items()
                }
                size = sum(e.nbytes for e in tensors.values()) + 8 * len(payload.scalars)
                entry = encoded[id(payload)] = (tensors, size)
            message = Message(
                run=self.options.run_id,
                round=t,
                phase=phase,
                sender=self.id,
                receiver=dst,
                tensors=entry[0],
                scalars=payload.scalars,
                nbytes=entry[1],
            )
            messages.append((message, sum(4 * math.prod(e.shape) for e in entry[0].values())))
        if self.arrivals.send_wait_s is None:
            fp32 = 0
            for message, size in messages:
                went = self._went(message, size, dropped_out)
                await self.transport.send(message)
                fp32 += went
            return fp32
        # Sends that ended since the last round first: an ended task is replaced below.
        fp32 = self._harvest(t, unreachable)
        started = []
        for message, size in messages:
            dst = message.receiver
            if dst in self._sending:  # its previous message is still on its way
                logger.debug("%s: still sending to %s; none for it in round %d", self.id, dst, t)
                unreachable.append(dst)
                continue
            went = self._went(message, size, dropped_out)
            task = asyncio.create_task(self.transport.send(message))
            task.add_done_callback(_retrieve)
            self._sending[dst] = (task, message, went)
            started.append(task)
        if started:
            await asyncio.wait(started, timeout=self.arrivals.send_wait_s)
        return fp32 + self._harvest(t, unreachable)

    def _went(self, message: Message, fp32: int, dropped_out: list[str]) -> int:
        """``fp32`` unless the fault plan lost ``message``: then nothing went, and its
        receiver goes to ``dropped_out`` (asked of the plan once a message)."""
        coords = (message.sender, message.receiver, message.round, message.phase)
        if self.faults is None or self.faults.lost(*coords) is None:
            return fp32
        dropped_out.append(message.receiver)
        return 0

    def _cannot_reach(self, dst: str, t: int, why: object, unreachable: list[str]) -> None:
        if dst not in self._unreachable:
            logger.warning("%s: cannot reach %s (round %d): %s", self.id, dst, t, why)
        self._unreachable.add(dst)
        unreachable.append(dst)

    def _harvest(self, t: int, unreachable: list[str]) -> int:
        """Account for the deadline-mode sends that ended (in this round or since)."""
        fp32 = 0
        for dst, (task, _, went) in list(self._sending.items()):
            if not task.done():
                continue
            del self._sending[dst]
            exc = task.exception()
            if exc is None:
                self._unreachable.discard(dst)
                self._refused.discard(dst)
                fp32 += went
            elif isinstance(exc, PeerUnavailableError | TransportTimeoutError):
                self._cannot_reach(dst, t, exc, unreachable)
            elif isinstance(exc, MessageRefusedError):
                # Deadline mode goes on without that message, as if it was lost.
                if dst not in self._refused:
                    logger.warning("%s: %s refused a message (round %d): %s", self.id, dst, t, exc)
                self._refused.add(dst)
                unreachable.append(dst)
            else:
                raise exc
        return fp32

    async def finish_sending(self) -> None:
        """Wait for the deadline-mode sends still on their way (each bounded by the
        transport's call timeout); a run's last messages must not be cut off."""
        tasks = [task for task, _, _ in self._sending.values()]
        if tasks:
            await asyncio.wait(tasks)
        self._harvest(self.round, [])

    async def _collect(
        self, t: int, phase: int, expected: tuple[str, ...], ctx: RoundContext, tally: Tally
    ) -> dict[str, Payload]:
        """The decoded inbox of ``(t, phase)`` as the node's arrivals policy has it: the
        expected senders it waits for, collected from the transport, checked by the intake;
        what came to ``tally``."""
        arrivals = self.arrivals
        not_coming = await arrivals.not_coming(t, phase, expected, tally)
        awaited = [s for s in expected if s not in not_coming] if not_coming else expected
        messages = await self.transport.collect(t, phase, awaited, arrivals.timeout)
        inbox: dict[str, Payload] = {}
        sizes: dict[str, int] = {}
        for sender in sorted(messages):
            try:
                inbox[sender] = self.intake.payload(messages[sender], self.state, ctx)
                sizes[sender] = messages[sender].nbytes
            except (CompressionError, ProtocolError) as exc:
                arrivals.rejected(t, phase, sender, exc, tally)
        arrivals.settle(t, phase, expected, not_coming, inbox, sizes, tally)
        return inbox
