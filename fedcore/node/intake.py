"""Message intake: what a node checks of every message before its algorithm sees it, and
the decoded tensors the receivers of one in-process payload share.

:class:`MessageIntake` is the component of a node that a transport's servicer calls too
(through :meth:`fedcore.node.Node.validate`: :meth:`~MessageIntake.check_window`, then
:meth:`~MessageIntake.validate`): the message
belongs to this run; its phase is one of the algorithm's and it holds exactly what the
algorithm declares for that phase and sender (``message_schema``: tensor names, shapes and
the model's dtype; scalar names and their allowed values); its bytes decode under their
codec to finite values; and the algorithm, if it declares ``accept``
(:class:`~fedcore.algorithms.base.AcceptsMessages`), finds it possible given the node's
state. Its round must lie within the node's window.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Collection
from typing import Any

import torch

from fedcore.algorithms.base import AcceptsMessages, Algorithm, DeclaresMessages, RoundContext
from fedcore.compression import Codec, RawCodec, get_codec
from fedcore.errors import AlgorithmError, CompressionError, OutOfWindowError, ProtocolError
from fedcore.ids import clip
from fedcore.messages import EncodedTensor, Message, MessageSchema, Payload
from fedcore.topology import Topology

__all__ = ["DecodeCache", "MessageIntake", "names"]


class DecodeCache:
    """Decoded, validated tensors shared by all receivers of one in-process payload.

    In one process, a payload a sender pushes to several out-neighbours is one
    :class:`EncodedTensor` object; decoding and checking its bytes once for every receiver
    saves most of the receive cost of a simulation. An entry lasts as long as its encoded
    tensor does (the messages that carry it, until their last receiver collected them),
    and at most two rounds past the newest: it holds the tensor by a weak reference, so
    the decoded copy of a model is not kept for rounds after its receivers mixed it, and
    an ``id`` is never mistaken for a reused one. Receivers get the same tensor, which is
    why algorithms must treat inbox tensors as read-only; a ``raw`` tensor is a view of the
    sender's bytes (:meth:`~fedcore.compression.RawCodec.view`), not a copy.
    """

    def __init__(self) -> None:
        """Start empty."""
        self._rounds: dict[int, dict[int, tuple[weakref.ref[EncodedTensor], torch.Tensor]]] = {}

    def get(self, round: int, encoded: EncodedTensor) -> torch.Tensor | None:
        """The tensor decoded from this very object in ``round``, if any."""
        entry = self._rounds.get(round, {}).get(id(encoded))
        return entry[1] if entry is not None and entry[0]() is encoded else None

    def put(self, round: int, encoded: EncodedTensor, tensor: torch.Tensor) -> None:
        """Remember ``tensor`` as the decoding of ``encoded`` while ``encoded`` lives."""
        entries = self._rounds.get(round)
        if entries is None:
            entries = self._rounds[round] = {}
            for old in [r for r in self._rounds if r < round - 2]:
                del self._rounds[old]
        key = id(encoded)

        def forget(ref: weakref.ref[EncodedTensor]) -> None:
            if entries.get(key, (None,))[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(encoded, forget), tensor)

    def decode(self, codec: Codec, encoded: EncodedTensor) -> torch.Tensor:
        """``codec``'s decoding of ``encoded`` for the cache's receivers, who only read
        it: a ``raw`` tensor views its bytes."""
        return codec.view(encoded) if isinstance(codec, RawCodec) else codec.decode(encoded)


class MessageIntake:
    """The checks and decoding of the messages one node receives: a component its
    :class:`~fedcore.node.Node` holds (``node.intake``), built with everything it checks
    against; what changes every round (the node's round, its algorithm state, its round
    context) comes with each call.

    Args:
        node_id: The receiving node's id in ``graph``.
        algorithm: Its algorithm (a rule through its one-peer adapter); its
            ``message_schema`` and ``accept``, if it declares them, check each message.
        graph: The communication topology (the round window's hop counts).
        run_id: The run every message must belong to.
        drift: Rounds the window grows by beyond the graph's hops
            (``NodeOptions.round_window``: deadline mode's and a fault plan's drift).
        codec: The node's own codec (a message naming another is decoded by the registry's).
        like: A tensor shaped and typed as the node's parameters: every tensor a peer sends
            must look like it, unless the algorithm's schema declares another shape.
        decode_cache: Shared by the nodes of one process to decode each payload once.
    """

    def __init__(
        self,
        node_id: str,
        *,
        algorithm: Algorithm,
        graph: Topology,
        run_id: str,
        drift: int,
        codec: Codec,
        like: torch.Tensor,
        decode_cache: DecodeCache | None = None,
    ) -> None:
        """Take the node's fixed facts; nothing is checked yet."""
        self.node = node_id
        self.algorithm = algorithm
        self.graph = graph
        self.run_id = run_id
        self.drift = drift
        self.codec = codec
        self.decode_cache = decode_cache
        self._shape = tuple(like.shape)
        self._dtype = like.dtype
        self._dtype_name = str(like.dtype).removeprefix("torch.")
        # What each phase's message holds, and (optionally) what the state makes impossible.
        self._schema: Callable[[int, str, RoundContext], MessageSchema] | None = (
            algorithm.message_schema if isinstance(algorithm, DeclaresMessages) else None
        )
        self._accept: Callable[[Any, int, str, Payload, RoundContext], None] | None = (
            algorithm.accept if isinstance(algorithm, AcceptsMessages) else None
        )
        self._leads: dict[str, int] | None = None

    def check_window(self, message: Message, round: int) -> None:
        """Refuse ``message`` if its round lies beyond :meth:`round_window` of ``round``
        (the receiving node's).

        Raises:
            OutOfWindowError: a round no honest sender can have reached yet.
        """
        window = self.round_window(message.sender)
        if message.round > round + window:
            raise OutOfWindowError(
                f"a message for round {message.round} from {clip(message.sender)} is more "
                f"than {window} rounds ahead of this peer's round {round}; no honest "
                "peer gets that far ahead (transport.round_window)."
            )

    def validate(self, message: Message, state: Any, ctx: RoundContext) -> None:
        """Check ``message`` as the node would before mixing it, given its algorithm
        ``state`` and its context of the message's round (for a transport's servicer,
        after :meth:`check_window`).

        Raises:
            ProtocolError: another run, a phase or content the algorithm does not send
                (names, shapes, dtypes, scalars out of range), undecodable bytes,
                non-finite values, or a message the algorithm's state makes impossible.
        """
        try:
            self.payload(message, state, ctx)
        except CompressionError as exc:
            raise ProtocolError(str(exc)) from exc

    def round_window(self, sender: str) -> int:
        """How many rounds ahead of the node's a message from ``sender`` may be.

        In strict mode a sender is at most ``d`` rounds ahead of this node, ``d`` the length
        of the shortest path from this node to the sender in the communication graph: the
        sender could not have finished round ``t - 1`` without messages that depend on this
        node's round ``t - d``. (On a time-varying schedule, ``d`` is taken as
        ``n * period``.) ``drift`` adds the drift of deadline mode and of a fault plan
        (:func:`fedcore.setup.plan.round_drift`). One more round covers a message that
        arrives while this node is between two rounds.
        """
        if self._leads is None:
            # A schedule takes the default, n * period, for every sender.
            static = self.graph.period == 1
            self._leads = self.graph.at(0).hops_from(self.node) if static else {}
        lead = self._leads.get(sender, len(self.graph.nodes) * self.graph.period)
        return lead + 1 + self.drift

    def payload(self, message: Message, state: Any, ctx: RoundContext) -> Payload:
        """The decoded payload of ``message`` after every check (see :meth:`validate`;
        a codec's refusal comes as it is, a :class:`~fedcore.errors.CompressionError`)."""
        payload = self._decode(message, ctx)
        if self._accept is not None:
            self._accept(state, message.phase, message.sender, payload, ctx)
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
                    f"its {kind} are {names(set(got))}; {self.algorithm.name!r} sends exactly "
                    f"{names(set(want))} in phase {message.phase}."
                )
        return schema

    def _decode(self, message: Message, ctx: RoundContext) -> Payload:
        if message.run != self.run_id:
            raise ProtocolError(
                f"message of run {message.run[:12]} does not belong to this run "
                f"({self.run_id[:12]})."
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
                codec = self.codec_for(enc)
                tensor = codec.decode(enc) if cache is None else cache.decode(codec, enc)
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


def names(given: Collection[str]) -> str:
    """``'a', 'b'`` (sorted, each clipped; at most 8), or ``none``: the names a message
    holds, in a refusal."""
    if not given:
        return "none"
    shown = [clip(n, 40) for n in sorted(given)[:8]]
    more = f" (+{len(given) - 8} more)" if len(given) > 8 else ""
    return ", ".join(shown) + more
