"""Compressed gossip: DeepSqueeze, CHOCO-SGD and BEER.

All three send what the node's codec (``RoundContext.codec``) makes of a vector, and keep
locally exactly the value the receivers decode, so no information is lost that the
algorithm does not account for. All need a symmetric graph with doubly stochastic weights.

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

**BEER** (Zhao, Li, Li, Richtarik, Chi, NeurIPS 2022): gradient tracking with CHOCO's
compressed differences for *both* the model ``x`` and the tracker ``v`` of the peers'
average gradient; public copies ``xhat`` and ``vhat`` that every neighbour keeps
identically. With ``g`` the gradient at this round's ``x`` and ``g_old`` the last one::

    v        = v_mixed + g - g_old               # v_mixed = 0 and g_old = 0 at first
    qx       = C(x - xhat);  xhat_i += qx        # send qx and qv
    qv       = C(v - vhat);  vhat_i += qv
    x        = x + gamma * sum_j W_ji (xhat_j - xhat_i) - lr * v
    v_mixed  = v + gamma * sum_j W_ji (vhat_j - vhat_i)

This is the paper's Algorithm 1 (``X <- X + gamma H (W - I) - eta V``, ``H <- H + C(X -
H)``, ``V <- V + gamma G (W - I) + grad F(X_new) - grad F(X_old)``, ``G <- G + C(V - G)``)
with the surrogates ``H``, ``G`` started at the first round's ``C(x_0)`` and ``C(v_0)``
rather than at zero, so that the first round already mixes. As ``W`` is doubly stochastic,
``sum_i v_mixed_i = sum_i g_i`` (the latest gradients) after every round, whatever the
codec; with a contractive codec (top-k, scaled sign) and a small enough ``gamma`` and
``lr``, the peers reach the optimum of the sum with a constant step where CHOCO keeps a
bias under heterogeneous data. Like CHOCO, it keeps its copies of the neighbours' public
values as weighted sums (a fixed graph) and needs every message: a lost ``qx`` or ``qv``
leaves the receiver's copy behind for good (its model's consensus drifts, and its tracker
sum breaks), so fault plans are refused. ``run.local_steps > 1`` is refused (the tracker
needs the gradient at every model it compresses).

With a node optimizer (``[optimizer]``), its direction ``u``, from the gradient at ``x``,
replaces ``lr * g`` in ``x_half``; what is compressed and sent is unchanged (the model,
or its difference to the public copy), and so are both invariants. BEER tracks the
direction in the gradient's place (as ``dsgt`` does).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from fedcore.algorithms.base import RoundContext, model_schema
from fedcore.algorithms.robust_tracking import one_step_refused
from fedcore.algorithms.rule import Rows, Rule, Send, Slot, pull, received, spent
from fedcore.compression import Codec, RawCodec
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.messages import EncodedTensor, MessageSchema

__all__ = [
    "BEER",
    "CHOCO",
    "BEERRule",
    "BEERState",
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


class _PublicCopiesRule(Rule):
    """What CHOCO and BEER share: compressed differences to public copies whose
    neighbours' values each peer keeps as weighted sums (one fixed graph, every message
    delivered), and the consensus step ``gamma``."""

    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"
    fixed_graph = True
    """The engines refuse a schedule (the weighted sums need the same weights)."""
    needs_every_message = True
    """A lost message leaves a receiver's sums behind for good: fault plans are refused."""

    def __init__(self, gamma: float = 0.5) -> None:
        """``gamma`` in (0, 1]; smaller for coarser codecs and smaller spectral gaps."""
        _check_step(self.name, gamma, "gamma")
        self.gamma = gamma


class CHOCORule(_PublicCopiesRule):
    """CHOCO-SGD (see the module docstring); ``gamma`` is the consensus step.

    The copies of the neighbours' ``xhat_j`` are kept as one weighted sum per peer,
    ``s_i = W_ii xhat_i + sum_j W_ji xhat_j`` (the paper's memory-efficient form: ``d``
    values a peer instead of one copy per neighbour), so ``sum_j W_ji (xhat_j - xhat_i) =
    s_i - xhat_i`` as the weights of a peer sum to 1. That needs the same weights every
    round: CHOCO runs on a fixed graph (a schedule is refused), with every message
    delivered (fault plans are refused).
    """

    name = "choco"

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
        s = _copies(state.s, state.q, inbox, "q", rows)
        x = state.x + self.gamma * (s - state.xhat)
        return CHOCOState(x, state.xhat, s, spent(state.q)), None


CHOCO = CHOCORule


def _copies(
    s: torch.Tensor, q: torch.Tensor, inbox: list[Slot], key: str, rows: Rows
) -> torch.Tensor:
    """The weighted sums of public copies after this round's differences: ``s + W_ii q +
    sum_j W_ji q_j`` (``q`` a peer's own, ``q_j`` the neighbours' tensor ``key``)."""
    return received(s + rows.self_weight.to(q.dtype).unsqueeze(1) * q, inbox, key)


class BEERState(NamedTuple):
    """Models ``x``, own public copies ``xhat`` and the weighted sums ``sx`` of the public
    copies this peer holds; the tracker ``v`` (after the mix: ``v_mixed``), its public copy
    ``vhat`` and sums ``sv``; the last gradient ``g``; this round's own ``qx`` and ``qv``
    (``[B, d]`` each; ``qx``, ``qv`` are ``[B, 0]`` between rounds)."""

    x: torch.Tensor
    xhat: torch.Tensor
    sx: torch.Tensor
    v: torch.Tensor
    vhat: torch.Tensor
    sv: torch.Tensor
    g: torch.Tensor
    qx: torch.Tensor
    qv: torch.Tensor


class BEERRule(_PublicCopiesRule):
    """BEER (see the module docstring); ``gamma`` is the consensus step of both the model
    and the tracker. The copies of the neighbours' public values are kept as CHOCO keeps
    them (:class:`CHOCORule`): a fixed graph, every message delivered."""

    name = "beer"

    def init(self, params: torch.Tensor) -> BEERState:
        """Public copies, tracker and last gradient start at zero (so ``v_0 = g_0``)."""
        zeros = torch.zeros_like(params)
        none = params.new_zeros((params.shape[0], 0))
        z = [zeros.clone() for _ in range(5)]
        return BEERState(params.clone(), zeros, z[0], z[1], z[2], z[3], z[4], none, none)

    def model(self, state: BEERState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def local_step(self, state: BEERState, grad: torch.Tensor, rows: Rows) -> BEERState:
        """Refused: the tracker needs the gradient at every model it compresses.

        Raises:
            AlgorithmError: always.
        """
        raise one_step_refused(self.name)

    def step(self, state: BEERState, grad: torch.Tensor, rows: Rows) -> tuple[BEERState, Send]:
        """Complete the tracker with the new gradient; ``qx = C(x - xhat)``, ``qv = C(v -
        vhat)``, both public copies advanced; send ``qx`` and ``qv``."""
        v = state.v + grad - state.g
        qx = rows.compress(state.x - state.xhat)
        qv = rows.compress(v - state.vhat)
        new = BEERState(
            state.x, state.xhat + qx, state.sx, v, state.vhat + qv, state.sv, grad, qx, qv
        )
        return new, Send({"qx": qx, "qv": qv})

    def schema(self, phase: int) -> MessageSchema:
        """The neighbour's compressed differences ``"qx"`` (model) and ``"qv"`` (tracker)."""
        return model_schema("qx", "qv")

    def mix(
        self, state: BEERState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[BEERState, None]:
        """Both sums take in the differences, then ``x += gamma (sx - xhat) - lr v`` and
        ``v += gamma (sv - vhat)``."""
        sx = _copies(state.sx, state.qx, inbox, "qx", rows)
        sv = _copies(state.sv, state.qv, inbox, "qv", rows)
        x = state.x + self.gamma * (sx - state.xhat) - rows.lr * state.v
        v = state.v + self.gamma * (sv - state.vhat)
        new = BEERState(
            x, state.xhat, sx, v, state.vhat, sv, state.g, spent(state.qx), spent(state.qv)
        )
        return new, None


BEER = BEERRule
