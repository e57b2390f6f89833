"""An asynchronous peer over a real transport: no lockstep (:class:`AsyncPeer`).

``fedcore node`` and ``fedcore launch`` run the asynchronous algorithms with one of these a
peer instead of a :class:`~fedcore.node.Node`: each peer computes and pushes at its own
pace and takes whatever has arrived (:meth:`~fedcore.transport.base.AsyncTransport.take`,
each sender's newest message: a flooding sender holds one message at its receiver, and a
message no newer than one already taken is stale, dropped and counted late). It runs its
rule by the rule's pattern and row functions
(:class:`~fedcore.algorithms.asynchronous.AsynchronousRule`, on one row), as the event
engine's rows do; ``[time]`` slows it on purpose (its pace and paced sends), so a launch
shows the straggler effect for real. A message's ``round`` is its sender's count of
computations (the staleness the receivers see).

* ``"push"``: every computation steps and pushes running sums of ``(x, w)`` shares
  (float64, raw) to the out-neighbours; it applies what arrived between computations.
  Each peer runs ``run.rounds`` computations and stops; messages to a peer that stopped
  are dropped (its mass stays with it).
* ``"upload"``: a worker runs ``run.rounds`` computations of ``run.local_steps`` steps,
  each from the last model the server sent it, uploads what the rule uploads with the
  version it started from, and waits for the server's answer at most
  ``transport.deadline_s`` (then it goes on from its own model). The server answers every
  upload with its current model and version; it records a round for every ``W`` uploads
  and stops after ``run.rounds`` of them, or when no upload came for
  ``transport.strict_timeout_s``.
* ``"pair"``: each computation ends with an averaging: the peer sends its model to its
  partner (phase 0) and, on the partner's reply (phase 1: the partner's model before it
  averaged), both hold the pair's mean; then the stale step. A background task answers
  the partners' requests while the peer computes (its compute time is a sleep under
  ``[time]``), so a slow peer still averages promptly; a reply that does not come within
  ``transport.deadline_s`` skips the averaging. A peer that finished its rounds goes on
  answering while its partners ask (until ``transport.deadline_s`` without a request).
  Atomic in the sense of AD-PSGD's implementation only as far as one event loop goes: a
  peer's answer and its own averaging never interleave, but a model can change between a
  request and its reply.

**What it refuses.** Every message is checked before any arithmetic
(:meth:`AsyncPeer.validate`, which the gRPC servicer calls on arrival, and again where a
message is taken, since the state moved on): exactly what the rule's messages carry
(tensor ``x`` of the right shape, dtype and finite values; the declared scalars and
phases); a round below the run's (a server's answer: below ``(run.rounds + 1) W``, its
uploads); then, against this peer's state, the rules' own checks
(:mod:`fedcore.algorithms.asynchronous`: a running sum's weight, at most ``(round + 1) N``
here; an upload's version, no newer than the version the server last sent that worker;
an answer's version; a result that would not be finite) and AD-PSGD's partners: a request
only from a sender whose partner this peer is in that round, a reply only from this
peer's partner of a round it asked in. A refused message is counted
(``stats.messages_rejected``: the servicer's refusals, and those where a message is taken,
with one log line) and changes nothing; the peer goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from fedcore import counter_random as keyed
from fedcore.algorithms.asynchronous import (
    AsynchronousRule,
    ServerState,
    answer_version,
    whole_number,
)
from fedcore.compression import Codec, RawCodec
from fedcore.errors import (
    CompressionError,
    OutOfWindowError,
    PeerUnavailableError,
    ProtocolError,
    TransportError,
)
from fedcore.ids import clip, shorten
from fedcore.messages import EncodedTensor, Message
from fedcore.models import Objective
from fedcore.node.intake import names
from fedcore.node.pace import Pace
from fedcore.node.records import RoundRecord, counted, traffic
from fedcore.node.schedule import NodeOptions
from fedcore.streams import Batches
from fedcore.topology import Topology
from fedcore.transport.base import AsyncTransport

__all__ = ["AsyncPeer"]

logger = logging.getLogger(__name__)

_RAW = RawCodec()


class AsyncPeer:
    """One asynchronous peer (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        *,
        algorithm: Any,
        graph: Topology,
        objective: Objective,
        stream: Batches,
        transport: AsyncTransport,
        options: NodeOptions,
        params: torch.Tensor,
        codec: Codec,
        shares: dict[str, float],
        pace: Pace | None = None,
        observer: Callable[[Any, RoundRecord], None] | None = None,
    ) -> None:
        """A peer of ``algorithm`` starting from ``params``; ``shares``: each worker's
        examples over the workers' mean (the server weighs uploads by them; how many
        workers there are is the server's round, in uploads)."""
        self.id = node_id
        self.algorithm = algorithm  # an AsynchronousRule; its pattern's row functions
        rule: AsynchronousRule = algorithm
        self.pattern = rule.pattern
        self.carries = rule.carries
        self.graph = graph.at(0)
        self.objective = objective
        self.stream = stream
        self.transport = transport
        self.options = options
        self.codec = codec
        self.shares = shares
        self.workers = len(shares)
        self.pace = pace
        self.observer = observer
        self.round = 0
        self.x = params.clone()
        self.w = 1.0
        self.d = int(params.numel())
        self._dtype = params.dtype
        self.server = rule.server
        self.ins = tuple(sorted(self.graph.in_weights(node_id)))
        self._sums: dict[str, torch.Tensor] = {}  # push-sum: running sums per out-neighbour
        self._applied: dict[str, torch.Tensor] = {}  # and the last applied per in-neighbour
        self.version = 0
        self._told: dict[str, int] = {}  # the server: the newest version sent each worker
        self._asked = 0.0  # AD-PSGD: when a partner last asked this peer
        self.partners = tuple(sorted(self.graph.out_weights(node_id)))
        transport.keep_newest()

    def model(self) -> torch.Tensor:
        """The parameters this peer predicts with."""
        model: torch.Tensor = self.algorithm.model(self.x.unsqueeze(0), torch.tensor([self.w]))
        return model[0]

    # --- validation (the gRPC servicer calls it on arrival) -------------------------------

    def validate(self, message: Message) -> torch.Tensor:
        """Refuse a message that is not what the algorithm sends, or that this peer's own
        state makes impossible (see the module docstring); return its decoded tensor
        (push-sum: the float64 running sum and weight), so that where a message is taken
        it is checked again and decoded once.

        Raises:
            OutOfWindowError: a round no honest sender reaches.
            ProtocolError: a wrong tensor name, shape, dtype or a value out of range.
        """
        value = self._intake(message)
        if self.pattern == "push":
            self._admit(message.sender, message.round, value)
        elif self.pattern == "pair":
            self._check_pair(message)
        elif self.id == self.server:
            self._upload_version(message)
        else:
            answer_version(self.version, message.round, message.scalars["version"])
        return value

    def _intake(self, message: Message) -> torch.Tensor:
        """:meth:`validate`'s checks of the message alone, before this peer's state: its
        decoded tensor."""
        x = message.tensors.get("x")
        if set(message.tensors) != {"x"} or x is None:
            raise ProtocolError(
                f"an asynchronous message holds tensor 'x' only, got {names(message.tensors)}."
            )
        wanted = self.carries.scalars
        if set(message.scalars) != wanted:
            raise ProtocolError(
                f"its scalars are {names(message.scalars)}; {self.algorithm.name!r} sends "
                f"{names(wanted)}."
            )
        phases = self.carries.phases
        if message.phase not in phases:
            raise ProtocolError(
                f"phase {message.phase} is not a phase of {self.algorithm.name!r} {phases}."
            )
        last = self._last_round(message.sender)
        if not 0 <= message.round <= last:
            raise OutOfWindowError(
                f"a message for round {message.round} from {clip(message.sender)} is past "
                f"round {last}, the last its sender has in this run."
            )
        if self.carries.raw:  # a running sum: checked whole against the state (_admit)
            return self._decode(x, torch.float64, (self.d + 1,))
        value = self._decode(x, self._dtype, (self.d,))
        if not bool(torch.isfinite(value).all()):
            raise ProtocolError("a model or update holds non-finite values.")
        return value

    def _last_round(self, sender: str) -> int:
        """The last round ``sender`` sends in: a computation's (``run.rounds - 1``), or the
        server's upload count (it answers every upload; it stops after ``run.rounds``
        rounds of ``W``, the last batch taken whole)."""
        rounds = self.options.rounds if self.options.rounds > 0 else 1 << 40  # 0: unknown
        if sender == self.server:
            return (rounds + 1) * max(self.workers, 1) - 1
        return rounds - 1

    def _admit(self, sender: str, round: int, sums: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Push-sum: the ``x`` and ``w`` this peer holds once it takes ``sums`` (the rule's
        ``receive``), refusing a running sum this edge's applied one rules out, one whose
        weight exceeds ``(round + 1) N`` (each of its ``round + 1`` pushes carries a share
        of a weight at most ``N``, the network's mass; a margin for rounding) and one that
        takes ``x`` beyond its dtype's range."""
        applied = self._applied.get(sender)
        before = torch.zeros_like(sums) if applied is None else applied
        most = (round + 1) * len(self.graph.nodes) * (1 + 1e-6)
        try:
            x, w = self.algorithm.receive(
                self.x.unsqueeze(0),
                torch.tensor([self.w], dtype=torch.float64),
                (sums[: self.d].unsqueeze(0), sums[self.d :]),
                (before[: self.d].unsqueeze(0), before[self.d :]),
                most,
            )
        except ProtocolError as exc:
            raise ProtocolError(f"from {clip(sender)}, round {round}: {exc}") from exc
        return x[0], float(w[0])

    def _check_pair(self, message: Message) -> None:
        """AD-PSGD: a request (phase 0) only from a sender whose partner this peer is in
        the request's round; a reply (phase 1) only from this peer's partner in a round it
        has asked in (its current one or earlier)."""
        sender, k = message.sender, message.round
        if message.phase == 0:
            if self._partner(sender, k) != self.id:
                raise ProtocolError(
                    f"{clip(sender)} asks this peer for round {k}, in which its partner is "
                    f"{clip(self._partner(sender, k))}."
                )
            return
        if k > self.round or self._partner(self.id, k) != sender:
            raise ProtocolError(
                f"a reply from {clip(sender)} for round {k}: this peer is in round "
                f"{self.round} and its partner in round {k} is {clip(self._partner(self.id, k))}."
            )

    def _partner(self, node: str, k: int) -> str | None:
        """AD-PSGD: ``node``'s partner in its round ``k`` (uniform among its neighbours by
        the keyed hash of the run, the node and ``k``; every peer computes the same)."""
        partners = sorted(self.graph.out_weights(node))
        if not partners:
            return None
        key = keyed.hash64(keyed.string_id(self.options.run_id), keyed.string_id(node))
        return partners[keyed.hash64(key, k) % len(partners)]

    def _upload_version(self, message: Message) -> None:
        """The server: an upload's version, no newer than its own nor than the version it
        last sent that worker (whose version came from the server's answers)."""
        told = min(self.version, self._told.get(message.sender, 0))
        why = f"the newest version this server sent {clip(message.sender)}"
        whole_number("version", message.scalars["version"], 0, told, why)

    def _refuse(self, message: Message, exc: Exception) -> None:
        """Count and log a message refused where it is taken (the state moved on since it
        arrived); nothing of it is used."""
        self.transport.stats.messages_rejected += 1
        logger.warning(
            "%s: refused the round %d phase %d message from %s: %s",
            self.id,
            message.round,
            message.phase,
            clip(message.sender),
            shorten(str(exc), 300),
        )

    def _decode(
        self, encoded: EncodedTensor, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> torch.Tensor:
        codec = _RAW if self.carries.raw else self.codec
        try:
            value = codec.decode(encoded)
        except CompressionError as exc:
            raise ProtocolError(f"the tensor cannot be decoded: {exc}") from exc
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise ProtocolError(
                f"expected a {dtype} tensor of shape {shape}, got {value.dtype} "
                f"{tuple(value.shape)}."
            )
        return value

    # --- the run ---------------------------------------------------------------------------

    async def run(self, rounds: int) -> None:
        """Run this peer's part of the run."""
        if self.id == self.server:
            await self._serve(rounds)
            return
        answering = None
        if self.pattern == "pair":
            answering = asyncio.create_task(self._answer())
        try:
            while self.round < rounds:
                await self._compute_and_push()
            if answering is not None:  # partners still running may still ask
                while time.monotonic() - self._asked < self.options.deadline_s:
                    await asyncio.sleep(0.05)
        finally:
            if answering is not None:
                answering.cancel()

    async def _compute_and_push(self) -> None:
        """One computation: its steps (the rule's ``step``; AD-PSGD's stale one after its
        averaging), then what its pattern sends and takes."""
        k = self.round
        began = time.perf_counter()
        before = traffic(self.transport.stats)
        if self.pace is not None:
            await self.pace.available()
        computing = time.perf_counter()
        steps = self.options.local_steps if self.server is not None else 1
        losses = []
        start = self.x.clone()
        lr = self.options.lr_at(k)
        for _ in range(steps):
            x, y = self.stream.next_batch()
            loss, grad = self.objective.loss_and_grad(self.model().clone(), x, y)  # as read
            losses.append(loss)
            if self.pattern != "pair":
                self.x = self._step(grad, lr)
        if self.pace is not None:
            await self.pace.computed(time.perf_counter() - computing)
        if self.pattern == "pair":
            await self._pair(k)
            self.x = self._step(grad, lr)
        elif self.pattern == "push":
            await self._push(k)
            self._absorb()
        else:
            await self._upload(k, start)
        self.round = k + 1
        self._record(k, math.fsum(losses) / len(losses), began, before)

    def _step(self, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """The rule's step of this peer's ``x`` with ``grad``."""
        w = torch.tensor([self.w], dtype=torch.float64)
        x: torch.Tensor = self.algorithm.step(self.x.unsqueeze(0), w, grad.unsqueeze(0), lr)
        return x[0]

    async def _pair(self, k: int) -> None:
        """AD-PSGD: average with a partner (uniform among the neighbours by the keyed hash
        of the run, the node and ``k``): send it this model, take its reply (its model
        before it averaged), average; no reply within ``transport.deadline_s``: none."""
        if not self.partners:
            return
        partner = self._partner(self.id, k)  # the one its partner's check expects
        assert partner is not None
        if not await self._send(partner, k, self.x, {}):
            return  # the partner is gone
        deadline = time.monotonic() + self.options.deadline_s
        while time.monotonic() < deadline:
            reply = self.transport.take({partner}, phase=1).get(partner)
            if reply is not None and reply.round == k:
                try:
                    self.x = self.algorithm.pair(self.x, self.validate(reply))
                except (CompressionError, ProtocolError) as exc:
                    self._refuse(reply, exc)  # as a lost reply: no averaging
                return
            await asyncio.sleep(0.002)
        logger.debug("%s: no reply from %s (round %d); no averaging", self.id, partner, k)

    async def _answer(self) -> None:
        """AD-PSGD: answer every request, while this peer computes too: reply with this
        model, then take the pair's average (a peer in one averaging at a time: the
        event loop runs one answer, or one of its own averagings, at once)."""
        while True:
            for sender, message in sorted(self.transport.take(self.partners, phase=0).items()):
                self._asked = time.monotonic()
                mine = self.x
                try:
                    self.x = self.algorithm.pair(mine, self.validate(message))
                except (CompressionError, ProtocolError) as exc:
                    self._refuse(message, exc)  # no reply: the partner goes on alone
                    continue
                await self._send(sender, message.round, mine, {}, phase=1)
            await asyncio.sleep(0.002)

    async def _send(
        self,
        receiver: str,
        k: int,
        tensor: torch.Tensor,
        scalars: dict[str, float],
        *,
        phase: int = 0,
    ) -> bool:
        # Push-sum's running sums go raw (float64, lossless); models and updates through
        # the run's codec.
        codec = _RAW if self.carries.raw else self.codec
        encoded = codec.encode(tensor)
        message = Message(
            run=self.options.run_id,
            round=k,
            phase=phase,
            sender=self.id,
            receiver=receiver,
            tensors={"x": encoded},
            scalars=scalars,
            nbytes=encoded.nbytes + 8 * len(scalars),
        )
        try:
            await self.transport.send(message)
        except (PeerUnavailableError, TransportError) as exc:  # it stopped, or is gone
            logger.debug("%s: no message to %s (round %d): %s", self.id, receiver, k, exc)
            return False
        return True

    async def _push(self, k: int) -> None:
        g, rule = self.graph, self.algorithm
        w = torch.tensor([self.w], dtype=torch.float64)
        mass = rule.mass(self.x.unsqueeze(0), w)[0]
        for receiver, share in sorted(g.out_weights(self.id).items()):
            total = self._sums.get(receiver, torch.zeros(self.d + 1, dtype=torch.float64))
            self._sums[receiver] = total = total + share * mass
            await self._send(receiver, k, total, {})
        own = torch.tensor([g.self_weight(self.id)], dtype=torch.float64)
        # The weight goes in as a float32 tensor: what it keeps is rounded to float32 first
        # (the event engine's weights stay float64).
        x, kept = rule.push(self.x.unsqueeze(0), torch.tensor([self.w]), own)
        self.x, self.w = x[0], float(kept[0])

    def _absorb(self) -> None:
        """Apply the running sums that arrived (the newest of each in-neighbour)."""
        for sender, message in sorted(self.transport.take(self.ins).items()):
            try:  # decoded and checked against the state once, here
                sums = self._intake(message)
                self.x, self.w = self._admit(sender, message.round, sums)
            except (CompressionError, ProtocolError) as exc:
                self._refuse(message, exc)  # its mass comes with the sender's next sum
                continue
            self._applied[sender] = sums

    async def _upload(self, k: int, start: torch.Tensor) -> None:
        """A worker of the server family: upload, then take the server's answer."""
        server = self.server
        assert server is not None
        sent = self.algorithm.upload(start, self.x)
        await self._send(server, k, sent, {"version": float(self.version)})
        if await self.transport.wait_any(self.options.deadline_s):
            answer = self.transport.take({server}).get(server)
            if answer is not None:
                try:
                    model = self.validate(answer)  # its version checked too
                except (CompressionError, ProtocolError) as exc:
                    self._refuse(answer, exc)  # as no answer: on from its own model
                    return
                self.x, self.version = model, int(answer.scalars["version"])

    async def _serve(self, rounds: int) -> None:
        """The server: each upload taken by the rule, and answered with the server's model
        and version; a round every ``workers`` uploads."""
        state = ServerState(self.x)
        uploads = 0
        began = time.perf_counter()
        stats = self.transport.stats
        before = traffic(stats)
        ins = set(self.ins)
        while self.round < rounds:
            wait = self.options.strict_timeout_s
            if not await self.transport.wait_any(wait):
                logger.warning("%s: no upload for %g s; stopping", self.id, wait)
                break
            for worker, message in sorted(self.transport.take(ins).items()):
                try:
                    value = self.validate(message)  # the version against what it was told, too
                    version = message.scalars["version"]
                    share = self.shares[worker]
                    state = self.algorithm.receive(state, value, version, share, self.workers)
                except (CompressionError, ProtocolError) as exc:
                    self._refuse(message, exc)  # no answer: the worker goes on alone
                    continue
                self.x, self.version = state.x, state.version
                self._told[worker] = self.version  # before the send: its next upload may
                # arrive while the send is still being acknowledged
                await self._send(worker, uploads, self.x, {"version": float(self.version)})
                uploads += 1
                if uploads % self.workers == 0 and self.round < rounds:
                    self._record(self.round, math.nan, began, before, idle=True)
                    self.round += 1
                    began = time.perf_counter()
                    before = traffic(stats)

    def _record(
        self,
        k: int,
        loss: float,
        began: float,
        before: tuple[int, ...],
        *,
        idle: bool = False,
    ) -> None:
        record = RoundRecord(
            node=self.id,
            round=k,
            loss=loss,
            lr=self.options.lr_at(k),
            messages_missing=0,
            missing=(),
            wall_s=time.perf_counter() - began,
            idle=idle,
            **counted(self.transport.stats, before),
        )
        if self.observer is not None:
            self.observer(self, record)
