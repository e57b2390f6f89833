"""Robust aggregators of the server family: what FedAvg's server makes of its cohort's models.

FedAvg's server (:mod:`fedcore.algorithms.server`) takes in the ``K`` models of the round's
cohort that arrived, ``[K, d]`` in sorted worker order, and turns them into one model, the
point its server optimizer steps toward. ``algorithm.aggregator`` names how. Sans-I/O torch
math over that ``[K, d]`` tensor, the same on every engine (a peer's server node, the message
engine's, the vectorized and sharded engines' server row, the cohort engine's).

``mean`` (the default) is FedAvg's weighted average ``sum_k n_k x_k / sum_k n_k`` (the
server's own code path, unchanged). The others are robust to ``f`` Byzantine workers of the
cohort (``algorithm.f``) that send arbitrary finite models:

* ``krum``, ``multikrum``: :func:`krum`; ``trimmed-mean``: :func:`trimmed_mean`;
  ``median``: :func:`median`; ``geomed``: :func:`geometric_median`;
  ``centered-clipping``: :func:`centered_clipping`;
* with ``bucket = s`` (:func:`buckets`) or ``nnm = true`` (:func:`nearest_mixing`) first,
  pre-aggregation that lets a rule built for identical honest distributions keep its
  guarantee on heterogeneous (non-IID) ones.

**Weights.** Each robust rule counts every worker once, ignoring its example count
``n_k``: the count is the worker's own claim (up to ``2**53``), so a Byzantine worker
would weigh what it liked. ``mean`` keeps FedAvg's weights.

**Models, not differences.** The rules see the workers' models ``x_k``. Every rule here is
translation-equivariant (``A(x_k + c) = A(x_k) + c``), so this is the same as aggregating
the updates ``x_k - x`` around the server's model ``x``; only centered clipping needs a
centre, which is ``x``. The arithmetic is float64, the result cast back to the model's
dtype (identical models come back equal to themselves). The server hands the models
over in the graph order of their senders, whatever order an engine lists them in, and
every sum adds them in that order; ties (Krum's scores, NNM's distances) go to the
earlier worker. So every engine gets the same bits.

**Cohort size.** Each rule needs enough workers for its ``f`` (:meth:`Aggregator.short`);
FedAvg checks the planned cohort at set-up (a one-line ConfigError). Where fewer arrive in a
round (deadline mode, lost messages), the server keeps its model that round, as if none
had arrived, and counts it (:attr:`~fedcore.algorithms.server.FedAvgRule.short_rounds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fedcore import registry
from fedcore.algorithms.robust_math import (
    buckets,
    centered_clipping,
    geometric_median,
    krum,
    median,
    nearest_mixing,
    squared_distances,
    trimmed_mean,
)
from fedcore.errors import ConfigError

__all__ = [
    "AGGREGATORS",
    "OPTIONS",
    "Aggregator",
    "make_aggregator",
]

_F64 = torch.float64

AGGREGATORS = (
    "mean",
    "krum",
    "multikrum",
    "trimmed-mean",
    "median",
    "geomed",
    "centered-clipping",
)
"""What ``algorithm.aggregator`` may name."""

OPTIONS: dict[str, tuple[str, ...]] = {
    "mean": (),
    "krum": ("f", "bucket", "nnm"),
    "multikrum": ("f", "m", "bucket", "nnm"),
    "trimmed-mean": ("f", "trim", "bucket", "nnm"),
    "median": ("f", "bucket", "nnm"),
    "geomed": ("f", "iterations", "tolerance", "nu", "bucket", "nnm"),
    "centered-clipping": ("f", "iterations", "tau", "bucket", "nnm"),
}
"""The ``[algorithm]`` keys each aggregator takes (any other is refused)."""

_ITERATIONS = {"geomed": 10, "centered-clipping": 1}
"""The default ``iterations``: RFA's few smoothed Weiszfeld steps; centered clipping's one
(Karimireddy et al. find one enough)."""


@dataclass(frozen=True, slots=True)
class Aggregator:
    """``algorithm.aggregator`` and its options, checked (:func:`make_aggregator`).

    Attributes:
        name: One of :data:`AGGREGATORS`.
        f: The Byzantine workers of a cohort it must tolerate.
        m: Multi-Krum's selection (0: ``K - f`` of the ``K`` inputs).
        trim: Trimmed mean's values cut at each end of a coordinate (default ``f``).
        bucket: Workers a bucket (1: no bucketing).
        nnm: Nearest-neighbour mixing first.
        iterations: Weiszfeld steps (``geomed``) or clipping steps (``centered-clipping``).
        tau: Centered clipping's radius.
        tolerance: ``geomed`` stops once an iteration lowers the sum of distances by less
            than this fraction.
        nu: ``geomed``'s smoothing: distances below it count as it.
        seed: The bucketing's seed (the run seed).
    """

    name: str = "mean"
    f: int = 0
    m: int = 0
    trim: int = 0
    bucket: int = 1
    nnm: bool = False
    iterations: int = 1
    tau: float = 0.0
    tolerance: float = 1e-6
    nu: float = 1e-6
    seed: int = 0

    @property
    def robust(self) -> bool:
        """Whether it is a robust rule (anything but ``mean``)."""
        return self.name != "mean"

    def inputs(self, k: int) -> int:
        """How many points the rule itself gets of ``k`` models (``ceil(k / bucket)``)."""
        return -(-k // self.bucket)

    def short(self, k: int) -> str | None:
        """Why ``k`` arrived models are too few for this rule's ``f`` (one clause), or
        ``None``."""
        if not self.robust:
            return None
        n = self.inputs(k)
        f = self.f
        what = f"{n} bucket(s) of {self.bucket}" if self.bucket > 1 else f"{n} model(s)"
        if self.nnm and k <= 2 * f:
            return f"nnm needs more than 2f = {2 * f} models, got {k}"
        if self.name in ("krum", "multikrum"):
            if n <= 2 * f + 2:
                return f"{self.name} needs more than 2f + 2 = {2 * f + 2} inputs, got {what}"
            if self.m > n - f:
                return f"multikrum selects m = {self.m} of at most K - f = {n - f} ({what})"
            return None
        if self.name == "trimmed-mean":
            if n <= 2 * self.trim:
                return f"trimmed-mean cuts 2 x trim = {2 * self.trim} of {what}"
            return None
        if n <= 2 * f:
            return f"{self.name} needs more than 2f = {2 * f} inputs (a majority), got {what}"
        return None

    def check(self, k: int, where: str) -> None:
        """Refuse a planned cohort of ``k`` workers that is too small (``where`` says how
        it is made).

        Raises:
            ConfigError: :meth:`short` says why.
        """
        why = self.short(k)
        if why is not None:
            raise ConfigError(
                f"algorithm.aggregator = {self.name!r}: {why} ({where}). Raise "
                "algorithm.fraction or the workers, or lower algorithm.f (or trim, m, bucket)."
            )

    def __call__(
        self,
        points: torch.Tensor,
        center: torch.Tensor,
        t: int,
        senders: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[d]`` float64: the rule over ``points [K, d]`` (K enough: :meth:`short`), the
        server's model ``center [d]`` (centered clipping's start), in round ``t``;
        ``senders`` (``[K]`` long, each point's sender: bucketing's shuffle keys; ``None``:
        its position)."""
        p = points.to(_F64)
        if self.bucket > 1:
            keys = senders if senders is not None else torch.arange(p.shape[0])
            p = buckets(p, self.bucket, self.seed, t, keys)
        elif self.nnm:
            p = nearest_mixing(p, squared_distances(p), self.f)
        name = self.name
        if name in ("krum", "multikrum"):
            m = 1 if name == "krum" else (self.m or p.shape[0] - self.f)
            return krum(p, squared_distances(p), self.f, m)
        if name == "trimmed-mean":
            return trimmed_mean(p, self.trim)
        if name == "median":
            return median(p)
        if name == "geomed":
            return geometric_median(p, self.iterations, self.tolerance, self.nu)
        if name == "centered-clipping":
            return centered_clipping(p, center.to(_F64), self.tau, self.iterations)
        raise AssertionError(name)  # the mean is the server's own path


def make_aggregator(name: Any, seed: int = 0, **given: Any) -> Aggregator:
    """The checked :class:`Aggregator` ``name`` with the ``[algorithm]`` options ``given``
    (``None``: not set).

    Raises:
        ConfigError: an unknown name, an option the aggregator does not take, or a value
            out of range (one line each).
    """
    if name not in AGGREGATORS:
        hint = registry.did_you_mean(str(name), AGGREGATORS)
        raise ConfigError(
            f"algorithm.aggregator must be one of {', '.join(AGGREGATORS)}, got {name!r}"
            + (f"; {hint}" if hint else ".")
        )
    set_ = {k: v for k, v in given.items() if v is not None}
    takes = OPTIONS[name]
    for key in set_:
        if key not in takes:
            users = [a for a, keys in OPTIONS.items() if key in keys]
            raise ConfigError(
                f"algorithm.{key} is an option of aggregator {' or '.join(map(repr, users))}, "
                f"not of algorithm.aggregator = {name!r}: remove it"
                + (" (bucketing and NNM feed a robust rule)" if name == "mean" else "")
                + "."
            )
    f = _count(set_, "f", 0)
    trim = _count(set_, "trim", f)
    if name == "trimmed-mean" and trim < f:
        raise ConfigError(
            f"algorithm.trim = {trim} is below algorithm.f = {f}: an attacker's value would "
            "stay in; set trim >= f (or leave it out: it is f)."
        )
    bucket = _count(set_, "bucket", 1)
    if bucket < 1:
        raise ConfigError("algorithm.bucket must be at least 1 (1: no bucketing), got 0.")
    nnm = set_.get("nnm", False)
    if not isinstance(nnm, bool):
        raise ConfigError(f"algorithm.nnm must be true or false, got {nnm!r}.")
    if nnm and bucket > 1:
        raise ConfigError(
            "algorithm.bucket and algorithm.nnm are two pre-aggregations: choose one."
        )
    m = _count(set_, "m", 0)
    if "m" in set_ and m < 1:
        raise ConfigError("algorithm.m must be at least 1 (Multi-Krum's selection), got 0.")
    iterations = _count(set_, "iterations", _ITERATIONS.get(name, 1))
    if iterations < 1:
        raise ConfigError("algorithm.iterations must be at least 1, got 0.")
    tau = _positive(set_, "tau", 1.0)
    if name == "centered-clipping" and "tau" not in set_:
        raise ConfigError(
            "algorithm.aggregator = 'centered-clipping' needs algorithm.tau, the clipping "
            "radius in model units (about the norm of an honest round's update)."
        )
    tolerance = _positive(set_, "tolerance", 1e-6, zero=True)
    nu = _positive(set_, "nu", 1e-6)
    return Aggregator(name, f, m, trim, bucket, nnm, iterations, tau, tolerance, nu, int(seed))


def _count(given: dict[str, Any], key: str, default: int) -> int:
    value = given.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"algorithm.{key} must be a whole number >= 0, got {value!r}.")
    return value


def _positive(given: dict[str, Any], key: str, default: float, zero: bool = False) -> float:
    value = given.get(key, default)
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    if bad or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"algorithm.{key} must be a finite number {bound}, got {value!r}.")
    return float(value)
