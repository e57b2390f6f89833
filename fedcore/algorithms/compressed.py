"""Compressed gossip: DeepSqueeze and CHOCO-SGD.

Both send what the node's codec (``RoundContext.codec``) makes of a vector, and both keep
locally exactly the value the receivers decode, so no information is lost that the
algorithm does not account for. Both need a symmetric graph with doubly stochastic weights.

**DeepSqueeze** (Tang, Lian, Qiu, Yuan, Zhang, Zhang, Liu, arXiv 1907.07346):
error-compensated compression of the *full model*, adapt-then-combine::

    x_half = x - lr * g
    v      = x_half + delta            # error compensation
    c      = C(v);  delta = v - c      # the error is remembered, never lost
    send c to every neighbour
    x      = x_half + eta * (sum_j W_ji c_j + W_ii c - c)

The mix uses the node's *own compressed* ``c``, so the mean moves exactly by the mean
gradient step whatever the codec (invariant I-DS-2). A missing neighbour's ``c_j`` is
replaced by the node's own ``c`` (its weight moves to the self term).

**CHOCO-SGD** (Koloskova, Stich, Jaggi, ICML 2019): compressed *differences* to public
copies ``xhat`` that every neighbour keeps identically::

    x_half   = x - lr * g
    q        = C(x_half - xhat_i);  xhat_i += q;  send q
    xhat_j  += q_j   for every neighbour j that sent
    x        = x_half + gamma * sum_j W_ji (xhat_j - xhat_i)

CHOCO assumes every message arrives: a lost ``q_j`` leaves this node's copy of ``xhat_j``
behind for good (the replicas diverge), so use it in strict mode.

With a node optimizer (``[optimizer]``), its direction ``u``, from the gradient at ``x``,
replaces ``lr * g`` in ``x_half``; what is compressed and sent is unchanged (the model,
or its difference to the public copy), and so are both invariants.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import torch

from fedcore.algorithms.base import Inbox, Outbox, RoundContext, check_phase, model_schema
from fedcore.algorithms.rule import Rows, Send, Slot, per_peer, pull
from fedcore.compression import Codec, RawCodec
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.messages import EncodedTensor, MessageSchema, Payload

__all__ = ["CHOCO", "CHOCOState", "DeepSqueeze", "DeepSqueezeRule", "DeepSqueezeState", "compress"]

_LOSSLESS = RawCodec()


def compress(
    codec: Codec | None, v: torch.Tensor, ctx: RoundContext
) -> tuple[EncodedTensor, torch.Tensor]:
    """``(encoded, decoded)``: what goes on the wire and exactly what receivers will decode.

    Raises:
        AlgorithmError: ``v`` is no longer finite (the run diverged), naming node and round.
    """
    if not math.isfinite(float(v.sum())):
        raise AlgorithmError(
            f"node {ctx.node} diverged at round {ctx.round}: the vector to compress is not "
            "finite. Lower algorithm.lr or the consensus step, or use a codec with a smaller "
            "error (unbiased codecs with few levels, such as qsgd with 2 bits, have a variance "
            "that error feedback can amplify)."
        )
    c = codec if codec is not None else _LOSSLESS
    encoded = c.encode(v)
    return encoded, c.decode(encoded)


def _check_step(name: str, value: object, key: str) -> None:
    """Refuse a step that is not a number in (0, 1]: a string, a bool, NaN, 0 or above 1."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not 0 < value <= 1:  # type: ignore[operator]
        raise ConfigError(
            f"algorithm {name!r}: {key} = {repr(value)[:60]} is invalid: it must be a number "
            f"in (0, 1], such as algorithm.{key} = 0.2."
        )


class DeepSqueezeState(NamedTuple):
    """Models ``x``, compression errors ``delta`` and this round's own compressed ``c``
    (``[B, d]`` each; ``c`` is ``[B, 0]`` between rounds)."""

    x: torch.Tensor
    delta: torch.Tensor
    c: torch.Tensor


class DeepSqueezeRule:
    """DeepSqueeze (see the module docstring); ``eta`` is the consensus step."""

    name = "deepsqueeze"
    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"

    def __init__(self, eta: float = 0.2) -> None:
        """``eta`` in (0, 1]: 0.1-0.2 suits 1-bit codecs (reference/algorithms.md)."""
        _check_step(self.name, eta, "eta")
        self.eta = eta

    def init(self, params: torch.Tensor) -> DeepSqueezeState:
        """Start from ``params`` with no compression error."""
        return DeepSqueezeState(
            params.clone(), torch.zeros_like(params), params.new_zeros((params.shape[0], 0))
        )

    def model(self, state: DeepSqueezeState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def step(
        self, state: DeepSqueezeState, grad: torch.Tensor, rows: Rows
    ) -> tuple[DeepSqueezeState, Send]:
        """Gradient step, error-compensated compression of the model, send ``C(v)``."""
        x_half = state.x - rows.lr * grad
        v = x_half + state.delta
        c = rows.compress(v)
        return DeepSqueezeState(x_half, v - c, c), Send({"c": c})

    def schema(self, phase: int) -> MessageSchema:
        """The neighbour's compressed model ``"c"``, nothing else."""
        return model_schema("c")

    def mix(
        self, state: DeepSqueezeState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[DeepSqueezeState, None]:
        """``x = x_half + eta * sum_j W_ji (c_j - c)``; a missing ``c_j`` counts as ``c``."""
        x = state.x + self.eta * pull(state.c, inbox, "c")
        return DeepSqueezeState(x, state.delta, state.c[:, :0]), None


DeepSqueeze = per_peer(DeepSqueezeRule)


class CHOCOState(NamedTuple):
    """Model ``x``, own public copy ``xhat``, and the copies of the neighbours' ``xhat``."""

    x: torch.Tensor
    xhat: torch.Tensor
    neighbours: Mapping[str, torch.Tensor]


class CHOCO:
    """CHOCO-SGD (see the module docstring); ``gamma`` is the consensus step."""

    name = "choco"
    mixing = "doubly-stochastic"
    phases = 1

    def __init__(self, gamma: float = 0.5) -> None:
        """``gamma`` in (0, 1]; smaller for coarser codecs and smaller spectral gaps."""
        _check_step(self.name, gamma, "gamma")
        self.gamma = gamma

    def init(self, params: torch.Tensor) -> CHOCOState:
        """Public copies start at zero, as in the paper."""
        return CHOCOState(params.clone(), torch.zeros_like(params), {})

    def model(self, state: CHOCOState) -> torch.Tensor:
        """The model ``x``."""
        return state.x

    def step(
        self, state: CHOCOState, grad: torch.Tensor, ctx: RoundContext
    ) -> tuple[CHOCOState, Outbox]:
        """Gradient step; compress the difference to the public copy; update that copy."""
        x_half = state.x - ctx.lr * grad
        encoded, q = compress(ctx.codec, x_half - state.xhat, ctx)
        xhat = state.xhat + q
        payload = Payload({"q": encoded})
        outbox = dict.fromkeys(ctx.out_weights, payload)
        return CHOCOState(x_half, xhat, state.neighbours), outbox

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Every neighbour."""
        return tuple(ctx.in_weights)

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """The neighbour's compressed difference ``"q"``, nothing else."""
        check_phase(self.name, phase)
        return model_schema("q")

    def mix(
        self, state: CHOCOState, phase: int, inbox: Inbox, ctx: RoundContext
    ) -> tuple[CHOCOState, Outbox]:
        """Update the neighbours' copies with what arrived, then the consensus step."""
        copies = dict(state.neighbours)
        for sender, payload in inbox.items():
            previous = copies.get(sender)
            q = payload.tensor("q")
            copies[sender] = q.clone() if previous is None else previous + q
        pull = torch.zeros_like(state.x)
        for j, w in ctx.in_weights.items():
            copy = copies.get(j)
            pull.add_(
                (copy if copy is not None else torch.zeros_like(state.x)) - state.xhat, alpha=w
            )
        x = state.x + self.gamma * pull
        return CHOCOState(x, state.xhat, copies), {}
