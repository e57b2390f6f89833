"""The robust aggregators' math over ``K`` points ``[K, d]`` (float64), each rule's paper
and guarantee in its docstring (:mod:`fedcore.algorithms.aggregators` picks and checks
them). Sums over points add them one after another in point order (:func:`mean_rows`), so
a result depends on the points' values and order alone, whatever the engine; ties go to
the earlier point.
"""

from __future__ import annotations

import torch

from fedcore.counter_random import hash64_tensor, make_key

__all__ = [
    "buckets",
    "centered_clipping",
    "geometric_median",
    "krum",
    "mean_rows",
    "median",
    "nearest_mixing",
    "row_norms",
    "squared_distances",
    "trimmed_mean",
]


def mean_rows(p: torch.Tensor, rows: list[int] | None = None) -> torch.Tensor:
    """``[d]``: the mean of the rows of ``p [K, d]`` (or of its ``rows``, at least one),
    added in that order. Identical rows give that row back bit for bit (their sums are
    exact in float64)."""
    picked = list(range(p.shape[0])) if rows is None else rows
    out = p[picked[0]].clone()
    for i in picked[1:]:
        out.add_(p[i])
    return out / len(picked)


def _weighted_rows(p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[d]``: ``sum_i w_i p_i``, in row order (a product then a sum, each rounded)."""
    out = torch.zeros_like(p[0])
    for row, weight in zip(p, w, strict=True):
        out.add_(row * weight)
    return out


def row_norms(p: torch.Tensor) -> torch.Tensor:
    """``[K]``: the Euclidean norm of each row."""
    return (p * p).sum(dim=1).sqrt()


def squared_distances(p: torch.Tensor) -> torch.Tensor:
    """``[K, K]``: ``||p_i - p_j||^2``, each from the differences themselves (never the
    ``|a|^2 + |b|^2 - 2ab`` shortcut, which cancels), so symmetric bit for bit and 0 on the
    diagonal. O(K^2 d) time, O(K^2) memory."""
    return torch.cdist(p, p, compute_mode="donot_use_mm_for_euclid_dist").square()


def krum(p: torch.Tensor, dist: torch.Tensor, f: int, m: int) -> torch.Tensor:
    """Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, NeurIPS 2017).

    Each point's score is the sum of its squared distances (``dist``) to its ``K - f - 2``
    nearest other points; Krum (``m = 1``) returns the point of least score, Multi-Krum
    the mean of the ``m`` of least score (stable: a tie goes to the earlier point).
    Guarantee (``K > 2f + 2``): with at most ``f`` Byzantine points, Krum's choice is
    ``(alpha, f)``-Byzantine resilient: its expectation stays within a cone around the
    honest gradient, its moments bounded by the honest ones (Blanchard et al., Prop. 1),
    so SGD on it converges as on the honest mean. Cost: O(K^2 d).
    """
    k = p.shape[0]
    near = k - f - 2
    others = dist + torch.diag(torch.full((k,), float("inf"), dtype=dist.dtype, device=dist.device))
    nearest = torch.sort(others, dim=1).values[:, :near]
    scores = nearest.sum(dim=1)
    chosen = torch.sort(scores, stable=True).indices[:m]
    if m == 1:
        return p[int(chosen[0])].clone()
    return mean_rows(p, sorted(chosen.tolist()))


def trimmed_mean(p: torch.Tensor, trim: int) -> torch.Tensor:
    """Coordinate-wise trimmed mean (Yin, Chen, Ramchandran, Bartlett, ICML 2018): per
    coordinate, drop the ``trim`` smallest and ``trim`` largest values and average the
    rest. Guarantee: with at most ``f <= trim`` Byzantine points (``K > 2 trim``), every
    coordinate lies within the honest points' [min, max] of that coordinate, and on
    i.i.d. honest gradients the error is of order ``f / (K sqrt(n)) + 1 / sqrt(n K)``
    (n: examples a worker), order-optimal. Cost: O(K d log K)."""
    k = p.shape[0]
    ordered = torch.sort(p, dim=0).values
    return mean_rows(ordered[trim : k - trim])


def median(p: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median (Yin et al., ICML 2018): per coordinate the middle value
    (the mean of the two middle values for an even ``K``). Guarantee: with fewer than
    ``K / 2`` Byzantine points every coordinate lies within the honest points' [min, max]
    of that coordinate (error of order ``f / (K sqrt(n)) + 1 / sqrt(n K)`` on i.i.d.
    honest gradients). Cost: O(K d log K)."""
    k = p.shape[0]
    ordered = torch.sort(p, dim=0).values
    if k % 2:
        return ordered[k // 2].clone()
    return (ordered[k // 2 - 1] + ordered[k // 2]) / 2


def geometric_median(p: torch.Tensor, iterations: int, tolerance: float, nu: float) -> torch.Tensor:
    """The geometric median ``argmin_z sum_i ||p_i - z||`` by the smoothed Weiszfeld
    algorithm of RFA (Pillutla, Kakade, Harchaoui, IEEE TSP 2022)::

        z_0 = mean_i p_i
        z_{r+1} = z_r + sum_i w_i (p_i - z_r),  w_i ∝ 1 / max(nu, ||p_i - z_r||)

    at most ``iterations`` steps, stopping once a step lowers ``sum_i ||p_i - z||`` by
    less than ``tolerance`` times its value (a fixed, deterministic rule). Unweighted:
    RFA weighs by data share, which here is each worker's own claim. Guarantee: breakdown
    point 1/2 (with fewer than ``K / 2`` Byzantine points, ``||z - honest geometric
    median||`` is bounded by a constant times the honest points' spread), and RFA's
    smoothed iterates converge to the ``nu``-smoothed median at rate O(1/r). Cost:
    O(iterations K d)."""
    z = mean_rows(p)
    diff = p - z
    dist = row_norms(diff)
    total = float(dist.sum())
    for _ in range(iterations):
        beta = 1.0 / dist.clamp(min=nu)
        z = z + _weighted_rows(diff, beta / beta.sum())
        diff = p - z
        dist = row_norms(diff)
        after = float(dist.sum())
        if abs(total - after) <= tolerance * after:
            break
        total = after
    return z


def centered_clipping(
    p: torch.Tensor, center: torch.Tensor, tau: float, iterations: int
) -> torch.Tensor:
    """Centered clipping (Karimireddy, He, Jaggi, ICML 2021, "Learning from History for
    Byzantine Robust Optimization")::

        v_0 = center;  v_{l+1} = v_l + (1/K) sum_i clip(p_i - v_l, tau)
        clip(u, tau) = u min(1, tau / ||u||)

    ``center`` is the server's model: the previous round's aggregate under plain FedAvg.
    Each step moves ``v`` by at most ``tau``, so the ``f`` Byzantine points move it by at
    most ``f tau / K`` a step. Guarantee (with worker momentum, ``f / K`` below about
    0.1 and a suitable ``tau``): the aggregate's error is ``O(sqrt(f / K))`` times the
    honest spread, which the paper shows optimal. Cost: O(iterations K d)."""
    v = center.clone()
    k = p.shape[0]
    for _ in range(iterations):
        diff = p - v
        scale = tau / row_norms(diff).clamp(min=tau)  # 1 within the radius
        v = v + _weighted_rows(diff, scale) / k
    return v


def buckets(p: torch.Tensor, size: int, seed: int, t: int, keys: torch.Tensor) -> torch.Tensor:
    """Bucketing (Karimireddy, He, Jaggi, ICLR 2022, "Byzantine-Robust Learning on
    Heterogeneous Datasets via Bucketing"): the points shuffled by round ``t``'s keyed
    permutation (each point's key, its sender's index, hashed under the run seed: a
    worker's place is a pure function of ``(seed, t, worker)``, the same on every
    engine), cut into ``ceil(K / size)`` buckets of ``size`` in that order (the last may be
    smaller), each replaced by its mean. Guarantee: an aggregator robust to ``f`` of the
    buckets on i.i.d. inputs stays robust on heterogeneous ones, its error growing with
    ``size`` times the heterogeneity, when ``f size < K / 2``. Cost: O(K d)."""
    words = hash64_tensor(make_key("fedcore.fedavg.bucket", seed), t, keys.to(torch.int64))
    order = torch.sort(words, stable=True).indices
    ranked = order.tolist()
    return torch.stack([mean_rows(p, ranked[i : i + size]) for i in range(0, len(ranked), size)])


def nearest_mixing(p: torch.Tensor, dist: torch.Tensor, f: int) -> torch.Tensor:
    """Nearest-neighbour mixing, NNM (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot,
    Stephan, AISTATS 2023, "Fixing by Mixing"): each point replaced by the mean of its
    ``K - f`` nearest points (``dist``; itself included; a tie to the earlier point).
    Guarantee: composed with an ``(f, kappa)``-robust rule (Krum, trimmed mean, median,
    geometric median...), the result is ``(f, O(f / K))``-robust, order-optimal under
    heterogeneity. Cost: O(K^2 d)."""
    keep = p.shape[0] - f
    nearest = torch.sort(dist, dim=1, stable=True).indices[:, :keep]
    return torch.stack([mean_rows(p, sorted(row)) for row in nearest.tolist()])
