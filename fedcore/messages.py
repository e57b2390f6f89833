"""The plain data types that cross the transport line.

A :class:`Message` is what one node sends another in one phase of one round: its
address ``(run, round, phase, sender, receiver)``, a few named scalars (such as the
push-sum weight) and named tensors already encoded by a codec into the bytes a wire
carries. Messages are immutable snapshots: the bytes are copied out of the sender's
tensors when the message is built, so later in-place updates at the sender can never
leak into what a receiver mixes (a bug of FedML's decentralized simulation, whose
messages were live references that receivers then updated in place).

:class:`Payload` is the decoded, algorithm-facing view of the same content, and
:class:`MessageSchema` the exact content an algorithm sends in one phase: what a receiver
checks every message against before it accepts it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

__all__ = ["EncodedTensor", "Message", "MessageSchema", "Payload", "ScalarSpec"]

_EMPTY: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True, weakref_slot=True)
class EncodedTensor:
    """One tensor as a wire carries it.

    Attributes:
        codec: Name of the codec that produced ``data`` (``"raw"`` is lossless).
        dtype: Torch dtype name of the decoded tensor, e.g. ``"float32"``.
        shape: Shape of the decoded tensor.
        data: The codec's packed bytes: ``bytes`` on the sending side (copied out of the
            tensor), or, in a message a transport received, a ``memoryview`` of that
            message's own receive buffer, which nothing else holds or writes (the ``raw``
            codec decodes it without a copy).
        params: The codec's few scalars (scale, seed, k); empty for ``raw``.
    """

    codec: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    params: Mapping[str, float] = field(default_factory=lambda: _EMPTY)

    @property
    def nbytes(self) -> int:
        """Bytes this tensor puts on the wire: its data plus 8 per codec scalar."""
        return len(self.data) + 8 * len(self.params)


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One message of one phase of one round, from ``sender`` to ``receiver``.

    Attributes:
        run: Fingerprint of the run (config and graph); peers of other runs refuse it.
        round: Round index, from 0.
        phase: Communication phase within the round, from 0.
        sender: Node id of the sender.
        receiver: Node id of the receiver.
        tensors: Named encoded tensors.
        scalars: Named float scalars (carried as float64).
    """

    run: str
    round: int
    phase: int
    sender: str
    receiver: str
    tensors: Mapping[str, EncodedTensor]
    scalars: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    nbytes: int = field(default=-1, repr=False, compare=False)
    """Payload bytes: encoded tensors plus 8 bytes per scalar (headers excluded).

    Computed when not given; a sender that fans one payload out passes it to skip the sum.
    """

    def __post_init__(self) -> None:
        """Count the payload bytes once; messages are immutable."""
        if self.nbytes < 0:
            size = sum(t.nbytes for t in self.tensors.values()) + 8 * len(self.scalars)
            object.__setattr__(self, "nbytes", size)


@dataclass(frozen=True, slots=True)
class Payload:
    """Decoded message content as an algorithm sees it.

    An algorithm returns one ``Payload`` per destination. Returning the *same* object
    for several destinations lets the node encode it once. A tensor the algorithm has
    already encoded itself (to keep exactly what receivers decode) is an
    :class:`EncodedTensor` and is sent as it is; inboxes always hold decoded tensors.
    """

    tensors: Mapping[str, torch.Tensor | EncodedTensor]
    scalars: Mapping[str, float] = field(default_factory=lambda: _EMPTY)

    def tensor(self, name: str) -> torch.Tensor:
        """The decoded tensor ``name`` (inbox payloads hold only decoded tensors).

        Raises:
            KeyError: no tensor of that name.
            TypeError: the tensor is still encoded (only outgoing payloads are).
        """
        value = self.tensors[name]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"payload tensor {name!r} is still encoded.")
        return value


@dataclass(frozen=True, slots=True)
class ScalarSpec:
    """The values a scalar may take: ``low < value <= high`` (``low <= value`` if closed).

    Attributes:
        low: Lower bound.
        high: Upper bound (inclusive).
        why: Why the bounds hold, for the receiver's error message.
        low_closed: Whether ``low`` itself is allowed.
    """

    low: float
    high: float
    why: str = ""
    low_closed: bool = False

    def problem(self, value: float) -> str | None:
        """Why ``value`` is impossible, or ``None`` when it is allowed (finite, in range)."""
        if not math.isfinite(value):
            return f"is not finite ({value})"
        above = value >= self.low if self.low_closed else value > self.low
        if above and value <= self.high:
            return None
        bracket = "[" if self.low_closed else "("
        why = f": {self.why}" if self.why else ""
        return f"is {value!r}, outside {bracket}{self.low:g}, {self.high:g}]{why}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageSchema:
    """Exactly what one phase's message from one sender holds.

    Attributes:
        tensors: Tensor name -> shape; ``None`` means the model's shape. Every tensor has
            the model's dtype. The message holds exactly these tensors, no more, no fewer.
        scalars: Scalar name -> allowed values. Exactly these scalars.
    """

    tensors: Mapping[str, tuple[int, ...] | None]
    scalars: Mapping[str, ScalarSpec] = field(default_factory=lambda: MappingProxyType({}))
