"""The node: one peer's round loop, the only place that knows asyncio and algorithms.

Per round a node evaluates the loss and gradient at its algorithm's model on its next
minibatch, lets the algorithm step, encodes and sends the outgoing payloads, collects
each phase's inbox from the transport, decodes and validates it, and lets the
algorithm mix. It records one :class:`RoundRecord` per round.

Two waiting modes:

* ``strict``: wait for every expected sender; if one is still missing after
  ``strict_timeout_s``, fail with :class:`~fedcore.errors.TransportTimeoutError`
  naming who is missing. A message that arrives but fails validation fails the round
  at once with :class:`~fedcore.errors.ProtocolError` naming the sender and the reason:
  a strict run never proceeds without an in-neighbour.
* ``deadline``: wait at most ``deadline_s`` per phase, then proceed with what arrived;
  the rest count as missing (and, if they come later, as late). A message that fails
  validation (undecodable bytes, wrong shape or dtype, non-finite values, another run)
  is logged, counted as rejected and treated as missing; the node keeps going. So is a
  message this node sent that its receiver refused: it is logged once per receiver and
  recorded with the round's unreachable receivers.

Validation (:meth:`Node.validate`, which the gRPC servicer calls before it answers, and
the node itself at collect time): the message belongs to this run; its phase is one of the
algorithm's and it holds exactly what the algorithm's ``message_schema`` says for that phase
and sender (tensor names, shapes and the model's dtype; scalar names and their allowed
values); its bytes decode under their codec to finite values; the algorithm's ``accept``
finds it possible given the node's state (a running total never goes backwards). And its
round is within the window :meth:`Node.round_window` states: a message for a round further
ahead than any honest sender can be is refused (:class:`~fedcore.errors.OutOfWindowError`)
and changes nothing, so one message cannot make the node skip a sender for the rest of the
run; one for a round already collected is late (counted, dropped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from fedcore.algorithms.base import Algorithm, Outbox, RoundContext, local_step, unions
from fedcore.algorithms.optim import Optimizer
from fedcore.compression import Codec, RawCodec, get_codec
from fedcore.config import LR_SCHEDULES, MODES
from fedcore.errors import (
    AlgorithmError,
    CompressionError,
    ConfigError,
    MessageRefusedError,
    OutOfWindowError,
    PeerUnavailableError,
    ProtocolError,
    TransportTimeoutError,
)
from fedcore.faults import FaultPlan
from fedcore.ids import clip
from fedcore.messages import EncodedTensor, Message, MessageSchema, Payload
from fedcore.models import Objective
from fedcore.streams import Batches
from fedcore.topology import Topology
from fedcore.transport.base import Transport

__all__ = ["DecodeCache", "Node", "NodeOptions", "RoundRecord", "lr_at"]


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a send task's outcome as seen (the node reads it when it accounts for it)."""
    if not task.cancelled():
        task.exception()


logger = logging.getLogger(__name__)


def lr_at(
    lr: float,
    schedule: str,
    round: int,
    *,
    rounds: int = 0,
    warmup: int = 0,
    power: float = 1.0,
) -> float:
    """Step size of ``round`` (0-based) of a run of ``rounds``.

    The first ``warmup`` rounds rise linearly to ``lr`` (``lr (t + 1) / warmup``); then,
    over the ``rounds - warmup`` rounds after it (``s`` of ``S``): ``constant``, ``sqrt``
    (``lr / sqrt(s + 1)``), ``cosine`` (``lr (1 + cos(pi s / S)) / 2``) or ``poly``
    (``lr (1 - s / S) ** power``). ``cosine`` and ``poly`` need ``rounds``.
    """
    if round < warmup:
        return lr * (round + 1) / warmup
    s = round - warmup
    if schedule == "constant":
        return lr
    if schedule == "sqrt":
        return lr / math.sqrt(s + 1)
    if schedule in ("cosine", "poly"):
        span = rounds - warmup
        if span <= 0:
            raise ConfigError(
                f"algorithm.lr_schedule {schedule!r} needs the run's rounds beyond the warm-up."
            )
        left = max(0.0, 1.0 - s / span)
        if schedule == "cosine":
            return lr * (1.0 + math.cos(math.pi * (1.0 - left))) / 2.0
        return float(lr * left**power)
    raise ConfigError(f"unknown algorithm.lr_schedule {schedule!r}; use one of {LR_SCHEDULES}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeOptions:
    """How a node runs its rounds.

    Attributes:
        run_id: Fingerprint of the run, stamped on every message.
        lr: Base step size.
        lr_schedule: ``"constant"``, ``"sqrt"``, ``"cosine"`` or ``"poly"`` (see
            :func:`lr_at`), after ``warmup_rounds`` of linear warm-up.
        rounds: The run's rounds (what ``cosine`` and ``poly`` decay over).
        warmup_rounds: Rounds of linear warm-up.
        lr_power: ``poly``'s power.
        local_steps: Optimizer steps a round (``run.local_steps``), the last one the
            algorithm's own step; the record's loss is their mean.
        mode: ``"strict"`` or ``"deadline"``.
        deadline_s: Per-phase wait in deadline mode.
        strict_timeout_s: Upper bound of a strict-mode wait before failing.
        round_window: Rounds a sender may be ahead of this node beyond what strict
            lock-step allows (peers drift apart in deadline mode and under a fault plan; a
            restarted peer is behind its neighbours). See :meth:`Node.round_window`.
    """

    run_id: str
    lr: float
    lr_schedule: str = "constant"
    rounds: int = 0
    warmup_rounds: int = 0
    lr_power: float = 1.0
    local_steps: int = 1
    mode: str = "strict"
    deadline_s: float = 5.0
    strict_timeout_s: float = 300.0
    round_window: int = 0

    def __post_init__(self) -> None:
        """Reject unknown modes and schedules early."""
        if self.mode not in MODES:
            raise ConfigError(f"unknown transport.mode {self.mode!r}; use one of {MODES}.")
        self.lr_at(0)

    def lr_at(self, t: int) -> float:
        """The step size of round ``t`` (:func:`lr_at` with these options)."""
        return lr_at(
            self.lr,
            self.lr_schedule,
            t,
            rounds=self.rounds,
            warmup=self.warmup_rounds,
            power=self.lr_power,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRecord:
    """What one node did in one round (one line of ``metrics.jsonl``)."""

    node: str
    round: int
    loss: float
    lr: float
    messages_sent: int
    bytes_sent: int
    messages_received: int
    bytes_received: int
    messages_missing: int
    messages_late: int
    messages_rejected: int
    missing: tuple[str, ...]
    wall_s: float
    messages_dropped: int = 0
    """Messages this node sent that fault injection lost."""
    dropped_out: tuple[str, ...] = ()
    """Receivers of those lost messages (one entry per message)."""
    dropped_in: tuple[str, ...] = ()
    """Senders whose message to this node fault injection lost (announced; also missing)."""
    fp32_bytes_sent: int = 0
    """What the tensors sent would have taken as float32 (for compression ratios)."""
    down: bool = False
    """This node was crashed (fault injection) and skipped the round; ``loss`` is NaN."""
    unreachable: tuple[str, ...] = ()
    """Receivers a send failed to (deadline mode only: a dead or unreachable peer)."""
    idle: bool = False
    """The node took no training step this round (a server, or a worker the round did not
    sample: its algorithm's ``trains`` said no); ``loss`` is NaN. Written only when set."""

    def to_json(self) -> dict[str, Any]:
        """The record as one ``metrics.jsonl`` line (``kind = "node"``; strict JSON)."""
        line = asdict(self)
        if not self.idle:
            del line["idle"]
        for key in ("missing", "dropped_out", "dropped_in", "unreachable"):
            line[key] = list(line[key])
        if math.isnan(self.loss):
            line["loss"] = None
        line["kind"] = "node"
        return line

    @classmethod
    def down_round(cls, node: str, round: int, *, lr: float, wall_s: float) -> RoundRecord:
        """The record of a round a crashed or dead node did not run (``loss`` NaN)."""
        return cls(
            node=node,
            round=round,
            loss=math.nan,
            lr=lr,
            messages_sent=0,
            bytes_sent=0,
            messages_received=0,
            bytes_received=0,
            messages_missing=0,
            messages_late=0,
            messages_rejected=0,
            missing=(),
            wall_s=wall_s,
            down=True,
        )

    @classmethod
    def from_json(cls, line: dict[str, Any]) -> RoundRecord:
        """The record of a line written by :meth:`to_json`."""
        raw = {k: v for k, v in line.items() if k != "kind"}
        for key in ("missing", "dropped_out", "dropped_in", "unreachable"):
            raw[key] = tuple(raw.get(key, ()))
        if raw["loss"] is None:
            raw["loss"] = math.nan
        return cls(**raw)


class DecodeCache:
    """Decoded, validated tensors shared by all receivers of one in-process payload.

    In one process, a payload a sender pushes to several out-neighbours is one
    :class:`EncodedTensor` object; decoding and checking its bytes once for every receiver
    saves most of the receive cost of a simulation. Each entry holds the encoded tensor
    itself, so its ``id`` cannot be reused while the entry lives; entries more than two
    rounds older than the newest are dropped. Receivers get the same tensor, which is why
    algorithms must treat inbox tensors as read-only.
    """

    def __init__(self) -> None:
        """Start empty."""
        self._rounds: dict[int, dict[int, tuple[EncodedTensor, torch.Tensor]]] = {}

    def get(self, round: int, encoded: EncodedTensor) -> torch.Tensor | None:
        """The tensor decoded from this very object in ``round``, if any."""
        entry = self._rounds.get(round, {}).get(id(encoded))
        return entry[1] if entry is not None and entry[0] is encoded else None

    def put(self, round: int, encoded: EncodedTensor, tensor: torch.Tensor) -> None:
        """Remember ``tensor`` as the decoding of ``encoded``."""
        entries = self._rounds.get(round)
        if entries is None:
            entries = self._rounds[round] = {}
            for old in [r for r in self._rounds if r < round - 2]:
                del self._rounds[old]
        entries[id(encoded)] = (encoded, tensor)


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
        algorithm: Algorithm,
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
    ) -> None:
        """Initialise the algorithm state from ``params``."""
        self.id = node_id
        self.algorithm = algorithm
        self.graph = graph
        self.objective = objective
        self.stream = stream
        self.transport = transport
        self.options = options
        self.codec: Codec = codec or RawCodec()
        self.observer = observer
        self.decode_cache = decode_cache
        start = objective.initial_params() if params is None else params
        self.state: Any = algorithm.init(start)
        self.optimizer = optimizer
        self.opt_state: Any = optimizer.init(algorithm.model(self.state)) if optimizer else None
        # Every tensor a peer sends must look like our parameters.
        self._shape = tuple(start.shape)
        self._dtype = start.dtype
        self._dtype_name = str(start.dtype).removeprefix("torch.")
        self.round = 0
        self.batches_read = 0  # from the stream (a crashed round reads none); for checkpoints
        self._contexts: dict[int, tuple[float, dict[str, float], dict[str, float]]] = {}
        self.faults = faults
        self._unreachable: set[str] = set()  # peers whose last send failed (logged once)
        # Deadline mode: the send on its way to each receiver (task, message, its fp32
        # size, 0 if the fault plan lost it).
        self._sending: dict[str, tuple[asyncio.Task[None], Message, int]] = {}
        # What each phase's message holds, and (optionally) what the state makes impossible.
        self._schema = getattr(algorithm, "message_schema", None)
        self._accept = getattr(algorithm, "accept", None)
        # Whether this node trains in a round (the server family: the server never does, a
        # worker only when sampled); None: always. An idle node's step gets a zero gradient.
        self._trains = getattr(algorithm, "trains", None)
        self._examples = int(getattr(stream, "examples", 0))
        self._leads: dict[str, int] | None = None
        self._unions: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._refused: set[str] = set()  # receivers whose refusal was logged

    def model(self) -> torch.Tensor:
        """The parameters this node currently predicts with."""
        return self.algorithm.model(self.state)

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
        before = (
            stats.messages_sent,
            stats.bytes_sent,
            stats.messages_received,
            stats.bytes_received,
            stats.messages_late,
            stats.messages_rejected,
        )
        ctx = self._context(t)
        faults = self.faults
        if faults is not None and faults.down(self.id, t):
            return self._skip_round(t, ctx.lr, began)
        step_ctx = ctx if self.optimizer is None else dataclasses.replace(ctx, lr=1.0)
        idle = self._trains is not None and not self._trains(ctx)
        losses = [math.nan] if idle else []
        grad = torch.zeros(self._shape, dtype=self._dtype) if idle else None
        for k in range(0 if idle else self.options.local_steps):  # the last: the algorithm's
            x, y = self.stream.next_batch()
            self.batches_read += 1
            params = self.algorithm.model(self.state)
            loss, grad = self.objective.loss_and_grad(params, x, y)
            losses.append(loss)
            if self.optimizer is not None:
                grad, self.opt_state = self.optimizer.update(grad, self.opt_state, params, ctx.lr)
            if k + 1 < self.options.local_steps:
                self.state = local_step(self.algorithm, self.state, grad, step_ctx)
        loss = losses[0] if len(losses) == 1 else math.fsum(losses) / len(losses)
        assert grad is not None
        self.state, outbox = self.algorithm.step(self.state, grad, step_ctx)
        missing: list[str] = []
        dropped_in: list[str] = []
        rejected = [0]
        fp32 = 0
        unreachable: list[str] = []
        dropped_out: list[str] = []
        for phase in range(self.algorithm.phases):
            fp32 += await self._send(outbox, t, phase, unreachable, dropped_out)
            expected = self.algorithm.expected_senders(phase, ctx)
            lost = [] if faults is None else faults.announced_lost(self.id, t, phase, expected)
            dropped_in.extend(lost)
            inbox = await self._collect(t, phase, expected, lost, ctx, missing, rejected)
            self.state, outbox = self.algorithm.mix(self.state, phase, inbox, step_ctx)
        self.round = t + 1
        record = RoundRecord(
            node=self.id,
            round=t,
            loss=loss,
            lr=ctx.lr,
            messages_sent=stats.messages_sent - before[0],
            bytes_sent=stats.bytes_sent - before[1],
            messages_received=stats.messages_received - before[2],
            bytes_received=stats.bytes_received - before[3],
            messages_missing=len(missing),
            messages_late=stats.messages_late - before[4],
            messages_rejected=stats.messages_rejected - before[5] + rejected[0],
            missing=tuple(missing),
            wall_s=time.perf_counter() - began,
            messages_dropped=len(dropped_out),
            dropped_out=tuple(dropped_out),
            dropped_in=tuple(dropped_in),
            fp32_bytes_sent=fp32,
            unreachable=tuple(dict.fromkeys(unreachable)),
            idle=idle,
        )
        if self.observer is not None:
            self.observer(self, record)
        return record

    def _skip_round(self, t: int, lr: float, began: float) -> RoundRecord:
        """A crashed round: no step, no message; the state waits for the node's return."""
        self.round = t + 1
        record = RoundRecord.down_round(self.id, t, lr=lr, wall_s=time.perf_counter() - began)
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
        if self.options.mode == "strict":
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
            await asyncio.wait(started, timeout=self.options.deadline_s)
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
        self,
        t: int,
        phase: int,
        expected: tuple[str, ...],
        lost: list[str],
        ctx: RoundContext,
        missing: list[str],
        rejected: list[int],
    ) -> dict[str, Payload]:
        """The decoded inbox; ``lost``: senders fault injection lost (not waited for)."""
        strict = self.options.mode == "strict"
        timeout = self.options.strict_timeout_s if strict else self.options.deadline_s
        awaited = [s for s in expected if s not in lost] if lost else expected
        messages = await self.transport.collect(t, phase, awaited, timeout)
        inbox: dict[str, Payload] = {}
        for sender in sorted(messages):
            try:
                inbox[sender] = self._checked(messages[sender], ctx)
            except (CompressionError, ProtocolError) as exc:
                if strict:
                    raise ProtocolError(
                        f"node {self.id!r}, round {t} phase {phase}: the message from "
                        f"{sender!r} was rejected: {exc} (strict mode stops here; deadline "
                        "mode would proceed without it)."
                    ) from exc
                rejected[0] += 1
                logger.warning("%s: rejected round %d message from %s: %s", self.id, t, sender, exc)
        absent = [s for s in expected if s not in inbox]
        if strict and any(s not in lost for s in absent):
            absent_alive = [s for s in absent if s not in lost]
            raise TransportTimeoutError(
                f"node {self.id!r}, round {t} phase {phase}: no valid message from "
                f"{', '.join(absent_alive)} within {timeout:g} s (strict mode). Check that those "
                "peers are running, or use transport.mode = 'deadline' to proceed without them."
            )
        missing.extend(absent)
        return inbox

    def validate(self, message: Message) -> None:
        """Check ``message`` as this node would before mixing it (for a transport's servicer).

        Raises:
            OutOfWindowError: a round beyond :meth:`round_window` of this node's.
            ProtocolError: another run, a phase or content the algorithm does not send
                (names, shapes, dtypes, scalars out of range), undecodable bytes,
                non-finite values, or a message the algorithm's state makes impossible.
        """
        window = self.round_window(message.sender)
        if message.round > self.round + window:
            raise OutOfWindowError(
                f"a message for round {message.round} from {clip(message.sender)} is more "
                f"than {window} rounds ahead of this peer's round {self.round}; no honest "
                "peer gets that far ahead (transport.round_window)."
            )
        try:
            self._checked(message, self._context(message.round))
        except CompressionError as exc:
            raise ProtocolError(str(exc)) from exc

    def round_window(self, sender: str) -> int:
        """How many rounds ahead of this node's a message from ``sender`` may be.

        In strict mode a sender is at most ``d`` rounds ahead of this node, ``d`` the length
        of the shortest path from this node to the sender in the communication graph: the
        sender could not have finished round ``t - 1`` without messages that depend on this
        node's round ``t - d``. (On a time-varying schedule, ``d`` is taken as
        ``n * period``.) ``options.round_window`` adds the drift of deadline mode and of a
        fault plan (:func:`fedcore.setup.prepare.round_drift`). One more round covers a
        message that arrives while this node is between two rounds.
        """
        if self._leads is None:
            # A schedule takes the default, n * period, for every sender.
            static = self.graph.period == 1
            self._leads = self.graph.at(0).hops_from(self.id) if static else {}
        lead = self._leads.get(sender, len(self.graph.nodes) * self.graph.period)
        return lead + 1 + self.options.round_window

    def _checked(self, message: Message, ctx: RoundContext) -> Payload:
        """The decoded payload of ``message`` after every check (see :meth:`validate`)."""
        payload = self._decode(message, ctx)
        if self._accept is not None:
            self._accept(self.state, message.phase, message.sender, payload, ctx)
        return payload

    def _schema_of(self, message: Message, ctx: RoundContext) -> MessageSchema | None:
        """The algorithm's schema of ``message``'s phase and sender (``None``: none declared)."""
        if not 0 <= message.phase < self.algorithm.phases:
            raise ProtocolError(
                f"phase {message.phase} is not a phase of {self.algorithm.name!r} "
                f"(it has {self.algorithm.phases})."
            )
        if self._schema is None:
            return None
        try:
            schema: MessageSchema = self._schema(message.phase, message.sender, ctx)
        except AlgorithmError as exc:  # a phase or sender the algorithm does not expect
            raise ProtocolError(str(exc)) from exc
        for kind, got, want in (
            ("tensors", message.tensors.keys(), schema.tensors.keys()),
            ("scalars", message.scalars.keys(), schema.scalars.keys()),
        ):
            if got != want:  # key views compare as sets
                raise ProtocolError(
                    f"its {kind} are {_names(set(got))}; {self.algorithm.name!r} sends exactly "
                    f"{_names(set(want))} in phase {message.phase}."
                )
        return schema

    def _decode(self, message: Message, ctx: RoundContext) -> Payload:
        if message.run != self.options.run_id:
            raise ProtocolError(
                f"message of run {message.run[:12]} does not belong to this run "
                f"({self.options.run_id[:12]})."
            )
        schema = self._schema_of(message, ctx)
        tensors: dict[str, torch.Tensor] = {}
        cache = self.decode_cache
        for name, enc in message.tensors.items():
            declared = schema.tensors[name] if schema is not None else None
            shape = self._shape if declared is None else declared
            # The header first: a stranger's absurd shape must not cost a decode.
            if tuple(enc.shape) != shape or enc.dtype != self._dtype_name:
                raise ProtocolError(
                    f"tensor {clip(name)} has shape {clip(tuple(enc.shape))} and dtype "
                    f"{clip(enc.dtype)}; expected {shape} and {self._dtype_name}."
                )
            tensor = cache.get(message.round, enc) if cache is not None else None
            if tensor is None:
                tensor = self.codec_for(enc).decode(enc)
                # Fast path: a finite sum means finite values; only a non-finite sum (NaN,
                # inf, or an overflow of huge finite values) needs the element-wise check.
                if not math.isfinite(float(tensor.sum())) and not bool(
                    torch.isfinite(tensor).all()
                ):
                    raise ProtocolError(f"tensor {clip(name)} holds non-finite values.")
                if cache is not None:
                    cache.put(message.round, enc, tensor)
            if tuple(tensor.shape) != shape or tensor.dtype != self._dtype:
                raise ProtocolError(
                    f"tensor {clip(name)} has shape {tuple(tensor.shape)} and dtype {enc.dtype}; "
                    f"expected {shape} and {self._dtype}."
                )
            tensors[name] = tensor
        for name, value in message.scalars.items():
            spec = schema.scalars[name] if schema is not None else None
            problem = spec.problem(value) if spec is not None else None
            if spec is None and not math.isfinite(value):
                problem = f"is not finite ({value})"
            if problem is not None:
                raise ProtocolError(f"scalar {clip(name)} {problem}.")
        return Payload(tensors, message.scalars)

    def codec_for(self, encoded: EncodedTensor) -> Codec:
        """The codec that decodes ``encoded`` (the node's own, or the registry's)."""
        if encoded.codec == self.codec.name:
            return self.codec
        return get_codec(encoded.codec)


def _names(names: set[str]) -> str:
    """``'a', 'b'`` (sorted, each clipped; at most 8), or ``none``."""
    if not names:
        return "none"
    shown = [clip(n, 40) for n in sorted(names)[:8]]
    more = f" (+{len(names) - 8} more)" if len(names) > 8 else ""
    return ", ".join(shown) + more
