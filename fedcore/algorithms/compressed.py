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

A peer keeps its copies of the neighbours' ``xhat_j`` as one weighted sum (the paper's
memory-efficient form, see :class:`CHOCORule`), which needs the same weights every round:
CHOCO runs on a fixed graph. It assumes every message arrives: a lost ``q_j`` leaves this
node's copy of ``xhat_j`` behind for good (the replicas diverge), so fault plans are
refused.

With a node optimizer (``[optimizer]``), its direction ``u``, from the gradient at ``x``,
replaces ``lr * g`` in ``x_half``; what is compressed and sent is unchanged (the model,
or its difference to the public copy), and so are both invariants.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fedcore.algorithms.base import RoundContext, model_schema
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, pull, received, spent
from fedcore.compression import Codec, RawCodec
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.messages import EncodedTensor, MessageSchema

__all__ = [
    "CHOCO",
    "CHOCORule",
    "CHOCOState",
    "DeepSqueeze",
    "DeepSqueezeRule",
    "DeepSqueezeState",
    "compress",
]

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


class DeepSqueezeRule(Rule):
    """DeepSqueeze (see the module docstring); ``eta`` is the consensus step."""

    name = "deepsqueeze"
    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"

    def __init__(self, eta: float = 0.2) -> None:
        """``eta`` in (0, 1]: 0.1-0.2 suits 1-bit codecs (the analysis of DeepSqueeze,
        Tang et al. 2019, asks for a small enough consensus step)."""
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
        return DeepSqueezeState(x, state.delta, spent(state.c)), None


DeepSqueeze = DeepSqueezeRule


class CHOCOState(NamedTuple):
    """Models ``x``, own public copies ``xhat``, the weighted sums ``s`` of the public
    copies this peer holds (its own included), and this round's own ``q`` (``[B, d]``
    each; ``q`` is ``[B, 0]`` between rounds)."""

    x: torch.Tensor
    xhat: torch.Tensor
    s: torch.Tensor
    q: torch.Tensor


class CHOCORule(Rule):
    """CHOCO-SGD (see the module docstring); ``gamma`` is the consensus step.

    The copies of the neighbours' ``xhat_j`` are kept as one weighted sum per peer,
    ``s_i = W_ii xhat_i + sum_j W_ji xhat_j`` (the paper's memory-efficient form: ``d``
    values a peer instead of one copy per neighbour), so ``sum_j W_ji (xhat_j - xhat_i) =
    s_i - xhat_i`` as the weights of a peer sum to 1. That needs the same weights every
    round: CHOCO runs on a fixed graph (a schedule is refused), with every message
    delivered (fault plans are refused).
    """

    name = "choco"
    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"
    fixed_graph = True
    """The engines refuse a schedule (the weighted sums need the same weights)."""
    needs_every_message = True
    """A lost message leaves a receiver's sum behind for good: fault plans are refused."""

    def __init__(self, gamma: float = 0.5) -> None:
        """``gamma`` in (0, 1]; smaller for coarser codecs and smaller spectral gaps."""
        _check_step(self.name, gamma, "gamma")
        self.gamma = gamma

    def init(self, params: torch.Tensor) -> CHOCOState:
        """Public copies start at zero, as in the paper."""
        zeros = torch.zeros_like(params)
        return CHOCOState(
            params.clone(), zeros, zeros.clone(), params.new_zeros((params.shape[0], 0))
        )

    def model(self, state: CHOCOState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def step(self, state: CHOCOState, grad: torch.Tensor, rows: Rows) -> tuple[CHOCOState, Send]:
        """Gradient step; ``q = C(x_half - xhat)``, ``xhat += q``; send ``q``."""
        x_half = state.x - rows.lr * grad
        q = rows.compress(x_half - state.xhat)
        return CHOCOState(x_half, state.xhat + q, state.s, q), Send({"q": q})

    def schema(self, phase: int) -> MessageSchema:
        """The neighbour's compressed difference ``"q"``, nothing else."""
        return model_schema("q")

    def mix(
        self, state: CHOCOState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[CHOCOState, None]:
        """``s += W_ii q + sum_j W_ji q_j``, then ``x = x_half + gamma (s - xhat)``."""
        s = state.s + rows.self_weight.to(state.q.dtype).unsqueeze(1) * state.q
        s = received(s, inbox, "q")
        x = state.x + self.gamma * (s - state.xhat)
        return CHOCOState(x, state.xhat, s, spent(state.q)), None


CHOCO = CHOCORule
