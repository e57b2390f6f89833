"""What a Byzantine peer sends: each attack as plain tensor math over ``B`` rows.

Sender attacks take the honest value ``v`` a peer would send; targeted attacks take the
values the target's honest in-neighbours send it in the same phase, as ``K`` slots of
``[B, ...]`` rows with a ``[B]`` mask each (a slot's value counts where its mask is true).
Means and deviations are taken in float64, slot after slot in the order given (sorted
sender order on every engine), with square roots from :mod:`fedcore.counter_random`, so a
row gets the same bits whichever engine computes it and however many rows it computes at
once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import torch

from fedcore.counter_random import gaussian_tensor, sqrt_tensor

__all__ = [
    "alie",
    "alie_z",
    "dissensus",
    "gaussian",
    "honest_moments",
    "ipm",
    "scaled",
    "signflip",
]

_WIDE = torch.float64


def signflip(v: torch.Tensor, scale: float) -> torch.Tensor:
    """``-scale * v``."""
    return v * -scale


def scaled(v: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * v``."""
    return v * scale


def gaussian(v: torch.Tensor, sigma: float, key: torch.Tensor) -> torch.Tensor:
    """``v + sigma * N(0, I)``: ``key`` ``[B]`` int64, one keyed hash a row (its sender,
    round and phase), absorbed with each value's place, so the noise is a pure function of
    them (the same for every receiver and on every engine)."""
    places = torch.arange(v[0].numel(), device=v.device).view(1, *v.shape[1:])
    noise = gaussian_tensor(key.view(-1, *([1] * (v.dim() - 1))), places)
    return (v.to(_WIDE) + noise * sigma).to(v.dtype)


def honest_moments(
    values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mean, sd, count)`` of the values whose mask is true, per row and coordinate:
    ``mean`` and ``sd`` (population deviation, ``1/c``) float64 ``[B, ...]``, ``count``
    ``[B]`` long; a row with no value has mean and deviation 0."""
    first = values[0]
    total = torch.zeros(first.shape, dtype=_WIDE, device=first.device)
    count = torch.zeros(first.shape[0], dtype=torch.long, device=first.device)
    for v, m in zip(values, masks, strict=True):
        total += _rows(m, v) * v.to(_WIDE)
        count += m.long()
    c = _rows(count.clamp(min=1), first).to(_WIDE)
    mean = total / c
    square = torch.zeros_like(total)
    for v, m in zip(values, masks, strict=True):
        d = v.to(_WIDE) - mean
        square += _rows(m, v) * d * d
    return mean, sqrt_tensor(square / c), count


def alie(mean: torch.Tensor, sd: torch.Tensor, z: float) -> torch.Tensor:
    """A little is enough (Baruch, Baruch and Goldberg, NeurIPS 2019): ``mean - z * sd``,
    per coordinate: far enough to steer, close enough to pass a robust aggregator."""
    return mean - sd * z


def alie_z(n: int, f: int) -> float:
    """The paper's ``z_max`` for ``n`` peers of which ``f`` lie: the largest ``z`` for
    which ``s = floor(n / 2 + 1) - f`` honest values still lie beyond ``mean - z * sd``
    under a normal law, ``Phi^-1((n - s) / n)``; 0 where that is not above one half."""
    s = math.floor(n / 2 + 1) - f
    share = (n - s) / n if n > 0 else 0.0
    if not 0.5 < share < 1.0:
        return 0.0
    return NormalDist().inv_cdf(share)


def ipm(mean: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Inner-product manipulation (Xie, Koyejo and Gupta, UAI 2020): ``-epsilon * mean``,
    a value whose inner product with the honest mean is negative."""
    return mean * -epsilon


def dissensus(
    own: torch.Tensor,
    values: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    liar_weight: torch.Tensor,
    push: float,
) -> torch.Tensor:
    """Dissensus (He, Karimireddy and Jaggi 2022): what each Byzantine in-neighbour of a
    target sends so that the target's gossip step becomes ``(1 - push)`` times its honest
    one: ``own - push * sum_k W_ik (v_k - own) / sum_b W_ib`` over the honest slots
    ``k`` (masks) and the Byzantine weight ``liar_weight`` ``[B]`` (rows with none: own)."""
    pull = torch.zeros(own.shape, dtype=_WIDE, device=own.device)
    mine = own.to(_WIDE)
    for v, w, m in zip(values, weights, masks, strict=True):
        pull += _rows(w.to(_WIDE) * m.to(_WIDE), v) * (v.to(_WIDE) - mine)
    share = _rows(torch.where(liar_weight > 0, liar_weight.to(_WIDE), 1.0), own)
    return mine - pull * push / share


def _rows(per_row: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B]`` values shaped to broadcast over ``like``'s ``[B, ...]``."""
    return per_row.view(-1, *([1] * (like.dim() - 1)))
