"""Node optimizers: the direction ``u`` a node steps by, where plain SGD steps by ``lr * g``.

Each optimizer is a pair of pure functions with explicit state, in the spirit of optax:
``init(params) -> state`` and ``update(grad, state, params, lr) -> (u, state)``. A node
applies ``x <- x - u`` wherever its algorithm applied ``x <- x - lr * g`` (for push-sum the
gradient is taken at the de-biased ``z`` and ``u`` goes on the numerator, as SGP does).
The state (momentum, Adam moments, step count) is the node's own: it is never sent, and it
is a NamedTuple of tensors so checkpoints carry it (:mod:`fedcore.setup.checkpoint`).

The same functions take one node's flat parameters ``[d]`` or every node's stacked
``[N, d]``: norms and every other reduction run over the last axis only, per layer, and
every counter in the state is a tensor with one entry per node (shape ``[..., 1]``), so
nodes that missed rounds (crashed) keep their own step counts. Adam's bias corrections
use the running products ``beta ** t`` kept in the state (float64, one multiplication a
step), never a ``pow``, so one node alone and the same node among stacked ones compute
the same bits.

Per-layer rules (LARS, LAMB) use the model's parameter segments: ``(name, offset, numel)``
triples covering the flat vector; without them the whole vector is one layer.

Update rules (below): momentum and Adam/AdamW as usual; LARS after You, Gitman and
Ginsburg, "Large Batch Training of Convolutional Networks" (2017); LAMB after You, Li,
Reddi et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 Minutes"
(ICLR 2020), its Algorithm 2. The warm-up and batch-size scaling that go with them
(:mod:`fedcore.node.schedule`, ``algorithm.lr_scaling``) follow LEGW (You et al.,
"Large-Batch Training for LSTM and Beyond", SC 2019).

- ``sgd``: ``u = lr (g + wd x)``; with ``weight_decay = 0`` exactly ``lr * g``.
- ``momentum``: ``b <- mu b + g + wd x``; heavy ball ``u = lr b``, Nesterov
  ``u = lr (g + wd x + mu b)``. ``mu = 0`` is ``sgd``, bit for bit.
- ``adam``: L2 decay folded into the gradient, then ``m``, ``v`` with bias correction,
  ``u = lr mh / (sqrt(vh) + eps)``. ``adamw``: decoupled, ``u = lr (mh / (sqrt(vh) + eps)
  + wd x)``.
- ``lars``: per layer ``lam = eta ||x|| / (||g|| + wd ||x||)`` (1 where either norm is 0),
  ``b <- mu b + lr lam (g + wd x)``, ``u = b``.
- ``lamb``: ``r = mh / (sqrt(vh) + eps) + wd x``; per layer ``u = lr phi(||x||) / ||r|| r``
  with ``phi(z) = min(z, trust_clip)`` (no clip when ``trust_clip`` is 0), and a trust ratio
  of 1 where ``||x||`` or ``||r||`` is 0.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from fedcore import registry
from fedcore.errors import ConfigError

__all__ = [
    "OPTIMIZERS",
    "AdamState",
    "MomentumState",
    "NoState",
    "Optimizer",
    "Segment",
    "keep_rows",
    "make_optimizer",
]

Segment = tuple[str, int, int]
"""One layer of the flat parameter vector: ``(name, offset, numel)``."""


class NoState(NamedTuple):
    """The state of a stateless optimizer (``sgd``): only the steps taken (``[..., 1]``
    int64)."""

    step: torch.Tensor


class MomentumState(NamedTuple):
    """``momentum`` and ``lars``: the steps taken and the velocity ``b`` (like the
    parameters)."""

    step: torch.Tensor
    velocity: torch.Tensor


class AdamState(NamedTuple):
    """``adam``, ``adamw`` and ``lamb``: the steps taken, first and second moments, and
    ``(beta1 ** t, beta2 ** t)`` (``[..., 2]`` float64) for the bias corrections."""

    step: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor
    powers: torch.Tensor


def _steps(params: torch.Tensor) -> torch.Tensor:
    """A zero step count per node of ``params`` (``[..., 1]``)."""
    return torch.zeros((*params.shape[:-1], 1), dtype=torch.int64, device=params.device)


def keep_rows(up: torch.Tensor, new: Any, old: Any) -> Any:
    """The state ``new`` for the nodes set in ``up`` (``[N]`` bool), ``old`` for the others
    (crashed nodes take no step): field by field of a stacked optimizer state."""
    fields = []
    for a, b in zip(new, old, strict=True):
        mask = up.reshape(-1, *([1] * (a.dim() - 1)))
        fields.append(torch.where(mask, a, b))
    return type(new)(*fields)


Update = Callable[[torch.Tensor, Any, torch.Tensor, float], tuple[torch.Tensor, Any]]


@dataclass(frozen=True, slots=True)
class Optimizer:
    """A node optimizer: ``init(params)`` and ``update(grad, state, params, lr)``.

    Attributes:
        name: The registry name.
        init: The state before the first step, for parameters shaped like ``params``.
        update: ``(u, state)``: the direction to subtract from the parameters, and the
            next state.
    """

    name: str
    init: Callable[[torch.Tensor], Any]
    update: Update


def _layers(segments: Sequence[Segment] | None, d: int) -> list[slice]:
    """The layers as slices of the last axis (the whole vector without segments).

    Raises:
        ConfigError: the segments do not tile ``[0, d)`` in order.
    """
    if not segments:
        return [slice(0, d)]
    out: list[slice] = []
    at = 0
    for name, offset, numel in segments:
        if offset != at or numel <= 0:
            raise ConfigError(
                f"parameter segment {name!r} at {offset} (+{numel}) does not follow the "
                f"previous one, which ends at {at}."
            )
        out.append(slice(offset, offset + numel))
        at = offset + numel
    if at != d:
        raise ConfigError(f"the parameter segments cover {at} of {d} parameters.")
    return out


def _norm(x: torch.Tensor) -> torch.Tensor:
    """The Euclidean norm over the last axis, kept as an axis (for broadcasting)."""
    norm: torch.Tensor = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return norm


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, and 1 wherever either is 0 (a layer with no weights or no step)."""
    ok = (num > 0) & (den > 0)
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.ones_like(num))


def sgd(*, weight_decay: float = 0.0) -> Optimizer:
    """Plain SGD (today's step): ``u = lr (g + wd x)``."""

    def init(params: torch.Tensor) -> NoState:
        return NoState(_steps(params))

    def update(
        grad: torch.Tensor, state: NoState, params: torch.Tensor, lr: float
    ) -> tuple[torch.Tensor, NoState]:
        g = grad + weight_decay * params if weight_decay else grad
        return lr * g, NoState(state.step + 1)

    return Optimizer("sgd", init, update)


def momentum(
    *, momentum: float = 0.9, nesterov: bool = False, weight_decay: float = 0.0
) -> Optimizer:
    """Heavy-ball or Nesterov momentum with L2 decay folded into the gradient."""

    def init(params: torch.Tensor) -> MomentumState:
        return MomentumState(_steps(params), torch.zeros_like(params))

    def update(
        grad: torch.Tensor, state: MomentumState, params: torch.Tensor, lr: float
    ) -> tuple[torch.Tensor, MomentumState]:
        g = grad + weight_decay * params if weight_decay else grad
        b = momentum * state.velocity + g
        u = lr * (g + momentum * b) if nesterov else lr * b
        return u, MomentumState(state.step + 1, b)

    return Optimizer("momentum", init, update)


def _moments(
    g: torch.Tensor, state: AdamState, betas: tuple[float, float], eps: float
) -> tuple[torch.Tensor, AdamState]:
    """Adam's bias-corrected ``mh / (sqrt(vh) + eps)`` and the next moments."""
    b1, b2 = betas
    m = b1 * state.m + (1 - b1) * g
    v = b2 * state.v + (1 - b2) * g * g
    powers = state.powers * torch.tensor(betas, dtype=torch.float64, device=g.device)
    bias = (1 - powers).to(g.dtype)
    mh = m / bias[..., :1]
    vh = v / bias[..., 1:]
    return mh / (vh.sqrt() + eps), AdamState(state.step + 1, m, v, powers)


def _adam_state(params: torch.Tensor) -> AdamState:
    """Adam's state before the first step: zero moments, ``beta ** 0 = 1``."""
    steps = _steps(params)
    powers = torch.ones((*steps.shape[:-1], 2), dtype=torch.float64, device=params.device)
    return AdamState(steps, torch.zeros_like(params), torch.zeros_like(params), powers)


def adam(
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> Optimizer:
    """Adam (L2 decay in the gradient) or, with ``decoupled``, AdamW."""

    def init(params: torch.Tensor) -> AdamState:
        return _adam_state(params)

    def update(
        grad: torch.Tensor, state: AdamState, params: torch.Tensor, lr: float
    ) -> tuple[torch.Tensor, AdamState]:
        g = grad + weight_decay * params if weight_decay and not decoupled else grad
        r, state = _moments(g, state, betas, eps)
        if weight_decay and decoupled:
            r = r + weight_decay * params
        return lr * r, state

    return Optimizer("adamw" if decoupled else "adam", init, update)


def lars(
    *,
    eta: float = 0.001,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    segments: Sequence[Segment] | None = None,
) -> Optimizer:
    """LARS: a local rate per layer from the ratio of its weight and gradient norms."""

    def init(params: torch.Tensor) -> MomentumState:
        _layers(segments, params.shape[-1])  # refuse bad segments before the first step
        return MomentumState(_steps(params), torch.zeros_like(params))

    def update(
        grad: torch.Tensor, state: MomentumState, params: torch.Tensor, lr: float
    ) -> tuple[torch.Tensor, MomentumState]:
        b = torch.empty_like(state.velocity)
        for layer in _layers(segments, params.shape[-1]):
            x, g = params[..., layer], grad[..., layer]
            wn = _norm(x)
            lam = _ratio(eta * wn, _norm(g) + weight_decay * wn)
            b[..., layer] = momentum * state.velocity[..., layer] + lr * lam * (
                g + weight_decay * x
            )
        return b, MomentumState(state.step + 1, b)

    return Optimizer("lars", init, update)


def lamb(
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    trust_clip: float = 0.0,
    segments: Sequence[Segment] | None = None,
) -> Optimizer:
    """LAMB: Adam's direction, rescaled per layer to the layer's weight norm."""

    def init(params: torch.Tensor) -> AdamState:
        _layers(segments, params.shape[-1])
        return _adam_state(params)

    def update(
        grad: torch.Tensor, state: AdamState, params: torch.Tensor, lr: float
    ) -> tuple[torch.Tensor, AdamState]:
        r, state = _moments(grad, state, betas, eps)
        if weight_decay:
            r = r + weight_decay * params
        u = torch.empty_like(r)
        for layer in _layers(segments, params.shape[-1]):
            wn = _norm(params[..., layer])
            if trust_clip > 0:
                wn = wn.clamp(max=trust_clip)
            u[..., layer] = lr * _ratio(wn, _norm(r[..., layer])) * r[..., layer]
        return u, state

    return Optimizer("lamb", init, update)


def adamw(**options: Any) -> Optimizer:
    """AdamW: :func:`adam` with the weight decay decoupled from the gradient."""
    return adam(decoupled=True, **options)


OPTIMIZERS: dict[str, Callable[..., Optimizer]] = registry.OPTIMIZERS.factories()
"""Name -> factory taking the optimizer's options as keywords
(:data:`fedcore.registry.OPTIMIZERS`)."""

_PER_LAYER = registry.OPTIMIZERS.tagged("per-layer")


def make_optimizer(
    name: str, *, segments: Sequence[Segment] | None = None, **options: Any
) -> Optimizer:
    """The optimizer ``name`` with ``options`` (``segments`` for the per-layer ones).

    Raises:
        ConfigError: an unknown name, an option it does not take, or a value out of range.
    """
    factory = OPTIMIZERS.get(name)
    if factory is None:
        raise ConfigError(registry.OPTIMIZERS.unknown(name) + ".")
    for key, value in options.items():
        number = isinstance(value, float | int) and not isinstance(value, bool)
        if number and (not math.isfinite(value) or value < 0):
            raise ConfigError(f"optimizer.{key} must be a finite number >= 0, got {value}.")
    if "betas" in options and not all(0 <= b < 1 for b in options["betas"]):
        raise ConfigError(f"optimizer.betas must each be in [0, 1), got {options['betas']}.")
    accepted = set(inspect.signature(adam if name == "adamw" else factory).parameters)
    accepted -= {"decoupled", "segments"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(
            f"optimizer {name!r} has no option {', '.join(unknown)}; its options are "
            f"{', '.join(sorted(accepted)) or 'none'}."
        )
    if name in _PER_LAYER:
        options["segments"] = segments
    return factory(**options)
