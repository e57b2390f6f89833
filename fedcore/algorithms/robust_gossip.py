"""Byzantine-robust gossip: D-PSGD whose mix bounds what a lying in-neighbour can do.

Each rule here is D-PSGD (:mod:`fedcore.algorithms.dpsgd`, combine-then-adapt: the gradient
at the peer's own pre-mix model, the mix over the neighbours' pre-step models, then the
step) with the weighted average replaced by a robust aggregate of what arrived::

    g   = grad f_i(x_i);  send x_i to every neighbour
    x_i = AGG_i(x_i, {x_j : j an in-neighbour whose message arrived}) - lr * g

**clippedgossip**: self-centered clipping (He, Karimireddy and Jaggi, "Byzantine-Robust
Decentralized Learning via ClippedGossip", arXiv 2202.01545, 2022)::

    AGG_i = x_i + sum_j W_ji clip(x_j - x_i, tau_i),   clip(z, tau) = z min(1, tau / ||z||)

A neighbour moves ``x_i`` by at most ``W_ji tau_i`` however far it lies, and one that is
within ``tau_i`` counts exactly as in D-PSGD. Guarantee (the paper's Theorem): with ``tau_i``
set from the expected distances to the honest neighbours, the honest peers converge to an
``O(delta_max zeta^2 / gamma^2)`` neighbourhood of a stationary point for non-convex
objectives, ``delta_max`` the largest weight of Byzantine in-neighbours at an honest peer,
``gamma`` the spectral gap of the honest subgraph and ``zeta^2`` the heterogeneity, as long
as ``delta_max`` is small against ``gamma^2``; with no attacker and no clipping it is
D-PSGD. The theoretical radius needs to know who is honest, so the radius is either fixed
(``tau``) or adaptive (the default): ``tau_i`` is the ``(clipped + 1)``-th largest distance
``||x_j - x_i||`` over the arrived neighbours (the smallest of them when fewer arrived), so
the ``clipped`` farthest (default 1, as in the authors' experiment code) are clipped to the
next one's distance and no other neighbour is clipped (so it bounds at most ``clipped``
lying neighbours: with more, one of them sets the radius). A missing message contributes
nothing and its weight goes to the peer itself (as D-PSGD). It is computed in D-PSGD's form,
``(W_ii + sum_j W_ji (1 - s_j)) x_i + sum_j W_ji s_j x_j`` with ``s_j = min(1, tau_i /
||x_j - x_i||)``, so with no neighbour clipped it is D-PSGD's mix bit for bit.

**trimmed-gossip**: the coordinate-wise trimmed mean (Yin, Chen, Ramchandran and Bartlett,
"Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates", ICML 2018),
over the peer's own value and the arrived neighbours' values (``c`` of them): per
coordinate, drop the ``trim`` = f smallest and f largest and average the rest. Guarantee:
with at most f lying in-neighbours, every coordinate stays within the [min, max] of the
honest values the peer holds (its own included). **median-gossip**: the coordinate-wise
median of the same values (the mean of the two middle ones for an even count); with fewer
than half of the values lying, every coordinate stays within the honest values' range.
Both weigh every value alike (the graph's mixing weights are not used), as the robust
decentralized baselines of the ClippedGossip paper do; a missing message is left out (it
shrinks ``c``). A peer with too few values to trim (``c <= 2 f``) keeps its own value: the
rule sees no graph when it is built, so it cannot refuse a graph whose in-degree is too
small (give every honest peer at least ``2 f`` in-neighbours). Cost: per round a sort of
the ``c`` values of each coordinate (a sorting network of elementwise min and max over the
model, :func:`sorting_network`), ``c`` copies of the model a peer.

**Bucketing** (``bucket = s`` on both; Karimireddy, He and Jaggi, "Byzantine-Robust
Learning on Heterogeneous Datasets via Bucketing", ICLR 2022): the ``c`` values are first
shuffled by a keyed permutation, cut into ``ceil(c / s)`` buckets of ``s`` (the last one
smaller) and each bucket averaged; the trimmed mean or median is taken over the bucket
means. It lowers the variance of the honest inputs the aggregate sees (heterogeneous data)
at the cost of letting each lying value spoil a bucket. The permutation is a pure function
of ``(seed, round, the peer's index, each value's slot)``
(:mod:`fedcore.counter_random`), so every engine draws the same one; ``seed`` is the
peer's key (default 0).

Every engine runs each as one :class:`~fedcore.algorithms.rule.Rule` (mixing
``"doubly-stochastic"``: an undirected graph, as D-PSGD).
"""

from __future__ import annotations

import functools
import math

import torch

from fedcore.algorithms.dpsgd import DPSGDRule, DPSGDState
from fedcore.algorithms.rule import Rows, Slot, add_slot, spent
from fedcore.counter_random import hash64_tensor, make_key
from fedcore.errors import ConfigError
from fedcore.gradients.blas import one_thread, row_reduce

__all__ = ["ClippedGossip", "MedianGossip", "TrimmedGossip", "sorting_network"]

_TOTAL = torch.float64


def _count(name: str, key: str, value: object, least: int) -> int:
    """``value`` as a whole number of at least ``least``, or a one-line refusal."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(
            f"algorithm {name!r}: {key} = {repr(value)[:60]} is invalid: it must be a whole "
            f"number >= {least}, such as algorithm.{key} = {max(least, 1)}."
        )
    return value


def _radius(name: str, tau: object) -> float:
    number = isinstance(tau, int | float) and not isinstance(tau, bool)
    if not number or not math.isfinite(float(tau)) or float(tau) <= 0:  # type: ignore[arg-type]
        raise ConfigError(
            f"algorithm {name!r}: tau = {repr(tau)[:60]} is invalid: the clipping radius "
            "must be a finite number > 0, such as algorithm.tau = 1.0 (leave it out for "
            "the adaptive radius)."
        )
    return float(tau)  # type: ignore[arg-type]


def _distance(slot: Slot, x: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64: ``||x_j - x_i||`` of each row, the same bits on one row and on many
    (a CPU row at least torch's grain long is reduced alone on one thread, as a peer's)."""
    z = slot.tensors["x"] - x
    if z.device.type != "cpu":
        out: torch.Tensor = torch.linalg.vector_norm(z, dim=1, dtype=_TOTAL)
        return out
    # On the CPU in the model's dtype (a float64 pass costs ~20x), a row whose squares
    # overflow it (a far outlier) again in float64, where no float32 value overflows.
    norms = row_reduce(z, int(z.shape[1]), lambda t: torch.linalg.vector_norm(t, dim=-1))
    far = torch.isinf(norms)
    out = norms.to(_TOTAL)
    if bool(far.any()):
        with one_thread():
            for r in torch.nonzero(far).squeeze(1).tolist():
                out[r] = torch.linalg.vector_norm(z[r], dtype=_TOTAL)
    return out


class ClippedGossip(DPSGDRule):
    """Self-centered clipping, ClippedGossip (see the module docstring)."""

    name = "clippedgossip"

    def __init__(self, tau: float | None = None, clipped: int | None = None) -> None:
        """``tau``: a fixed clipping radius (> 0); left out, the adaptive radius, which
        clips the ``clipped`` (default 1) farthest arrived neighbours."""
        if tau is not None and clipped is not None:
            raise ConfigError(
                f"algorithm {self.name!r}: tau fixes the radius and clipped sets the adaptive "
                "one; give one of them."
            )
        self.tau = None if tau is None else _radius(self.name, tau)
        self.clipped = 1 if clipped is None else _count(self.name, "clipped", clipped, 0)

    def mix(
        self, state: DPSGDState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[DPSGDState, None]:
        """Clip each arrived neighbour's difference to the radius, mix as D-PSGD, step."""
        x = state.x
        distances = [_distance(slot, x) for slot in inbox]
        tau = self._radii(distances, inbox, rows)
        total = rows.self_weight
        coefs = []
        for slot, distance in zip(inbox, distances, strict=True):
            share = torch.where(distance > tau, tau / distance, 1.0)  # s_j = min(1, tau/d)
            total = total + torch.where(slot.arrived, slot.weight * (1.0 - share), slot.weight)
            coefs.append(torch.where(slot.arrived, slot.weight * share, 0.0))
        out = x * total.to(x.dtype).unsqueeze(1)
        for slot, coef in zip(inbox, coefs, strict=True):
            add_slot(out, slot, "x", coef.to(x.dtype).unsqueeze(1))
        out.sub_(state.pending)
        return DPSGDState(out, spent(state.pending)), None

    def _radii(self, distances: list[torch.Tensor], inbox: list[Slot], rows: Rows) -> torch.Tensor:
        """``[B]`` float64: each row's radius ``tau_i``."""
        if self.tau is not None or not inbox:
            tau = 1.0 if self.tau is None else self.tau
            return torch.full((rows.b,), tau, dtype=_TOTAL, device=rows.self_weight.device)
        arrived = torch.stack([slot.arrived for slot in inbox], dim=1)
        table = torch.where(arrived, torch.stack(distances, dim=1), -math.inf)
        ranked = table.sort(dim=1, descending=True).values  # arrived first, largest first
        heard = arrived.sum(dim=1)
        at = torch.minimum(heard - 1, torch.full_like(heard, self.clipped)).clamp(min=0)
        return ranked.gather(1, at.unsqueeze(1)).squeeze(1)


class TrimmedGossip(DPSGDRule):
    """Coordinate-wise trimmed mean over in-neighbours, optionally bucketed (see the module
    docstring)."""

    name = "trimmed-gossip"

    def __init__(self, trim: int = 1, bucket: int = 1, seed: int = 0) -> None:
        """``trim``: values dropped at each end per coordinate; ``bucket``: values averaged
        a bucket first (1: no bucketing); ``seed``: the key of the bucket shuffle."""
        self.trim = _count(self.name, "trim", trim, 0)
        self.bucket = _count(self.name, "bucket", bucket, 1)
        self.seed = _seed(self.name, seed)

    def mix(
        self, state: DPSGDState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[DPSGDState, None]:
        """The trimmed mean of the peer's value and what arrived, then the step."""
        values, valid = _values(state.x, inbox, self.bucket, self.seed, rows)
        out = _trimmed_mean(values, valid, self.trim, state.x)
        return _stepped(out, state), None


class MedianGossip(DPSGDRule):
    """Coordinate-wise median over in-neighbours, optionally bucketed (see the module
    docstring)."""

    name = "median-gossip"

    def __init__(self, bucket: int = 1, seed: int = 0) -> None:
        """``bucket``: values averaged a bucket first (1: no bucketing); ``seed``: the key
        of the bucket shuffle."""
        self.bucket = _count(self.name, "bucket", bucket, 1)
        self.seed = _seed(self.name, seed)

    def mix(
        self, state: DPSGDState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[DPSGDState, None]:
        """The median of the peer's value and what arrived, then the step."""
        values, valid = _values(state.x, inbox, self.bucket, self.seed, rows)
        return _stepped(_median(values, valid), state), None


def _seed(name: str, seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(
            f"algorithm {name!r}: seed = {repr(seed)[:60]} is invalid: the key of the bucket "
            "shuffle must be a whole number, such as algorithm.seed = 1."
        )
    return seed


def _stepped(out: torch.Tensor, state: DPSGDState) -> DPSGDState:
    """``out - lr g`` (``+ 0.0`` first: a -0.0 that a tie in a sort may have put where
    another engine put +0.0 becomes +0.0 on both)."""
    out = out + 0.0
    out.sub_(state.pending)
    return DPSGDState(out, spent(state.pending))


def _values(
    x: torch.Tensor, inbox: list[Slot], bucket: int, seed: int, rows: Rows
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``(M values [B, d], [B, M] bool valid)``: the peer's own value then each slot's
    (``M = K + 1``), valid where it arrived; bucketed into ``ceil(M / s)`` bucket means
    if ``bucket = s > 1``."""
    values = [x, *(slot.tensors["x"] for slot in inbox)]
    valid = torch.stack(
        [torch.ones_like(rows.self_weight, dtype=torch.bool)] + [slot.arrived for slot in inbox],
        dim=1,
    )
    if bucket > 1 and len(values) > 1:
        return _buckets(values, valid, bucket, make_key("fedcore.bucketing", seed), rows)
    return values, valid


def _buckets(
    values: list[torch.Tensor], valid: torch.Tensor, s: int, key: int, rows: Rows
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each row's valid values shuffled by ``hash64(key, round, index, slot)`` (a pure
    function of the row and slot, so each engine draws the same) and averaged ``s`` at a
    time in that order; the means are clamped into their bucket's [min, max] (a bucket of
    equal values gives that value)."""
    m = len(values)
    stack = torch.stack(values, dim=1)
    slots = torch.arange(m, device=stack.device)
    words = hash64_tensor(key, rows.round, rows.index.unsqueeze(1), slots.unsqueeze(0))
    order = words.argsort(dim=1, stable=True)
    order = order.gather(1, (~valid.gather(1, order)).to(torch.int8).argsort(dim=1, stable=True))
    count = valid.sum(dim=1)

    def item(at: int) -> torch.Tensor:
        index = order[:, at].view(-1, 1, 1).expand(-1, 1, stack.shape[2])
        return stack.gather(1, index).squeeze(1)

    means = []
    for start in range(0, m, s):
        first = item(start)
        total, low, high = first, first, first
        for at in range(start + 1, min(start + s, m)):
            take = (at < count).unsqueeze(1)
            v = item(at)
            total = torch.where(take, total + v, total)
            low = torch.where(take, torch.minimum(low, v), low)
            high = torch.where(take, torch.maximum(high, v), high)
        size = (count - start).clamp(min=1, max=s).unsqueeze(1)
        means.append(torch.clamp(total / size.to(total.dtype), low, high))
    ready = torch.arange(0, m, s, device=stack.device).unsqueeze(0) < count.unsqueeze(1)
    return means, ready


@functools.cache
def sorting_network(n: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort on ``n`` inputs (Knuth, TAOCP 5.3.4): the comparators
    ``(i, j)``, ``i < j``, that leave ``min`` at ``i`` and ``max`` at ``j``; the network of
    the next power of two without the comparators that touch an input beyond ``n`` (which
    would hold +inf and never move)."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return tuple(pairs)


def _sorted(
    values: list[torch.Tensor], valid: torch.Tensor
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``(the values sorted per coordinate, the invalid ones last as +inf; [B] long count
    of valid ones)``: a sorting network of elementwise min and max, in place on copies
    (some ``M log^2 M / 4`` passes over ``[B, d]``; a torch sort along the short axis of a
    stack is several times slower)."""
    ranked = [
        v.clone() if k == 0 else torch.where(valid[:, k].unsqueeze(1), v, math.inf)
        for k, v in enumerate(values)
    ]
    spare = torch.empty_like(ranked[0])
    for i, j in sorting_network(len(ranked)):
        a, b = ranked[i], ranked[j]
        torch.minimum(a, b, out=spare)
        torch.maximum(a, b, out=b)
        ranked[i], spare = spare, a
    return ranked, valid.sum(dim=1)


def _at(ranked: list[torch.Tensor], where: torch.Tensor) -> torch.Tensor:
    """``[B, d]``: each row's value at position ``where [B]`` of ``ranked``."""
    out = ranked[0]
    for at in range(1, len(ranked)):
        out = torch.where((where == at).unsqueeze(1), ranked[at], out)
    return out


def _trimmed_mean(
    values: list[torch.Tensor], valid: torch.Tensor, f: int, own: torch.Tensor
) -> torch.Tensor:
    """Per coordinate, the mean of the valid values without the ``f`` smallest and ``f``
    largest (summed in sorted order, then clamped into the kept values' range, so that it
    never leaves it by a rounding); a row with ``count <= 2 f`` keeps ``own``."""
    most = int(valid.sum(dim=1).max())
    if 2 * f >= most:
        return own.clone()  # no row has enough values
    ranked, count = _sorted(values, valid)
    kept = count - 2 * f
    total = ranked[f].clone()
    for at in range(f + 1, most - f):  # beyond it no row keeps a value
        take = at < count - f
        if bool(take.all()):
            total.add_(ranked[at])
        else:
            total = torch.where(take.unsqueeze(1), total + ranked[at], total)
    mean = total.div_(kept.clamp(min=1).unsqueeze(1).to(total.dtype))
    mean = torch.clamp(mean, ranked[f], _at(ranked, count - f - 1))
    return torch.where((kept > 0).unsqueeze(1), mean, own)


def _median(values: list[torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """Per coordinate, the median of the valid values (every row has one: its own)."""
    ranked, count = _sorted(values, valid)
    low, high = _at(ranked, (count - 1) // 2), _at(ranked, count // 2)
    return torch.where(low == high, low, low * 0.5 + high * 0.5)
