"""Online streams: data that arrives round by round, for online learning and regret.

In online learning each node suffers a loss on each new batch *before* it learns from it,
and the measure is regret against a comparator (see :mod:`fedcore.metrics`). A node reads
its batches from a stream: any object with ``next_batch() -> (x, y)``.

* Dataset streams (``data.stream = ""``, the default) are :class:`fedcore.data.BatchStream`
  over the node's partition of ``data.dataset``, shuffled or, with ``data.order =
  "sorted"``, in label order (each node sees its classes one after another: a drifting,
  non-iid order).
* ``data.stream = "synthetic"`` is :class:`SyntheticDrift`, the synthetic stream of the DOG
  paper's setting: per node an adversarial component of magnitude ``G``, a stochastic
  component of variance ``sigma^2``, and a comparator that drifts along a path of total
  length ``M`` (``data.adversarial``, ``data.noise``, ``data.drift``).
* ``data.stream = "pkg.module:factory"``: a user source, called as ``factory(nodes=...,
  seed=..., batch_size=..., rounds=...)`` and returning an object with ``dataset`` (a
  :class:`~fedcore.data.Dataset`: its test split evaluates the models, its training split
  probes the model), ``stream(node_index)`` and, optionally, ``comparator(round)``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch

from fedcore.data import Dataset, load_object
from fedcore.errors import DataError, FedcoreError
from fedcore.ids import error_text

__all__ = ["Batches", "OnlineSource", "SyntheticDrift", "load_source"]


class Batches(Protocol):
    """One node's stream."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``(x, y)`` batch."""
        ...


class OnlineSource(Protocol):
    """Where every node's stream comes from."""

    dataset: Dataset

    def stream(self, node: int) -> Batches:
        """A fresh stream for node ``node`` (0-based, graph order); same seed, same batches."""
        ...


class SyntheticDrift:
    """Binary classification whose labelling rule drifts; nodes see adversarial shifts.

    For node ``i`` in round ``t`` (``T`` rounds), each of the ``batch_size`` examples is::

        a = G * v_{i,t} + sigma * xi,   xi ~ N(0, I_d)
        y ~ Bernoulli(sigmoid(w*_t . a))

    ``v_{i,t}`` is a unit vector that depends on the node and the round (deterministic,
    ``v[k] ~ sin(i + 1.7 k + 0.31 t)``, normalized): the adversarial component, of
    magnitude ``G``. ``xi`` is the stochastic component, of variance ``sigma^2`` per
    feature. The comparator ``w*_t`` has norm ``r = 4`` and turns in the plane of the first
    two features by a total angle of ``M / r`` over the run, so its path length
    ``sum_t ||w*_{t+1} - w*_t||`` is ``M`` (up to the chord-arc difference, below 0.1%).
    ``M = 0`` is a fixed comparator. Every batch is a function of ``(seed, i, t)``.

    The test split (``dataset``) is drawn from the last round's distribution, nodes mixed.
    """

    RADIUS = 4.0
    MAX_VALUES = 2**28
    """Most values (examples x features) of one batch or of the test split."""

    def __init__(
        self,
        *,
        nodes: int,
        rounds: int,
        batch_size: int,
        seed: int,
        features: int = 10,
        adversarial: float = 1.0,
        noise: float = 1.0,
        drift: float = 10.0,
        test_size: int = 4000,
    ) -> None:
        """See the class docstring; every size must be positive and every scale >= 0."""
        if features < 2:
            raise DataError(f"data.features must be >= 2 for the synthetic stream, got {features}.")
        for key, value in (("adversarial", adversarial), ("noise", noise), ("drift", drift)):
            if not (math.isfinite(value) and value >= 0):
                raise DataError(f"data.{key} must be a finite value >= 0, got {value}.")
        if adversarial == 0 and noise == 0:
            raise DataError("data.adversarial and data.noise are both 0: every feature is 0.")
        largest = max(batch_size, test_size, 64)
        if features * largest > self.MAX_VALUES:
            raise DataError(
                f"data.features = {features:,} makes {features * largest:,} values in one draw "
                f"of the synthetic stream ({largest:,} examples: the larger of data.batch_size "
                f"and its test split of {test_size:,}), more than the {self.MAX_VALUES:,} "
                "(1 GiB of float32) it draws at once; use fewer features or a smaller "
                "data.batch_size."
            )
        self.nodes, self.rounds, self.batch_size, self.seed = nodes, rounds, batch_size, seed
        self.features, self.adversarial, self.noise, self.drift = (
            features,
            adversarial,
            noise,
            drift,
        )
        x_test, y_test = self._sample_mixed(rounds - 1, test_size, salt=1)
        x_probe, y_probe = self._sample_mixed(0, 64, salt=2)
        self.dataset = Dataset(
            name="synthetic",
            x_train=x_probe,
            y_train=y_probe,
            x_test=x_test,
            y_test=y_test,
            num_classes=2,
        )

    def comparator(self, round: int) -> torch.Tensor:
        """The labelling rule ``w*_t`` of ``round`` (a vector of ``features`` values)."""
        angle = self.drift / self.RADIUS * (round / max(1, self.rounds - 1))
        w = torch.zeros(self.features, dtype=torch.float64)
        w[0], w[1] = self.RADIUS * math.cos(angle), self.RADIUS * math.sin(angle)
        return w

    def direction(self, node: int, round: int) -> torch.Tensor:
        """The adversarial unit vector ``v_{i,t}``."""
        k = torch.arange(self.features, dtype=torch.float64)
        v = torch.sin(node + 1.7 * k + 0.31 * round)
        unit: torch.Tensor = v / torch.linalg.vector_norm(v)
        return unit

    def batch(self, node: int, round: int, size: int | None = None, *, salt: int = 0) -> Any:
        """The batch of ``node`` in ``round`` (float32 features, int64 labels)."""
        size = self.batch_size if size is None else size
        gen = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + node * 7_919 + round * 104_729 + salt * 15_485_863) % (2**63)
        )
        xi = torch.randn(size, self.features, generator=gen, dtype=torch.float64)
        a = self.adversarial * self.direction(node, round) + self.noise * xi
        p = torch.sigmoid(a @ self.comparator(round))
        y = (torch.rand(size, generator=gen, dtype=torch.float64) < p).to(torch.int64)
        return a.to(torch.float32), y

    def _sample_mixed(self, round: int, size: int, *, salt: int) -> tuple[torch.Tensor, ...]:
        per = -(-size // self.nodes)
        parts = [self.batch(i, round, per, salt=salt) for i in range(self.nodes)]
        x = torch.cat([p[0] for p in parts])[:size]
        y = torch.cat([p[1] for p in parts])[:size]
        return x, y

    def stream(self, node: int) -> _SyntheticStream:
        """Node ``node``'s stream, from round 0."""
        return _SyntheticStream(self, node)


class _SyntheticStream:
    def __init__(self, source: SyntheticDrift, node: int) -> None:
        self.source = source
        self.node = node
        self.round = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.source.batch(self.node, self.round)
        self.round += 1
        return x, y


def load_source(
    name: str, *, nodes: int, rounds: int, batch_size: int, seed: int, options: dict[str, Any]
) -> OnlineSource:
    """``"synthetic"`` (with ``options``: features, adversarial, noise, drift) or a user's
    ``"pkg.module:factory"``.

    Raises:
        DataError: an unknown name, a factory that fails, or a result without ``dataset``
            and ``stream``.
    """
    if name == "synthetic":
        return SyntheticDrift(
            nodes=nodes, rounds=rounds, batch_size=batch_size, seed=seed, **options
        )
    if ":" not in name:
        raise DataError(
            f'unknown data.stream {name!r}: use "synthetic", "" (batches of data.dataset) '
            'or "pkg.module:factory".'
        )
    factory = load_object(name, what="stream")
    try:
        source = factory(nodes=nodes, seed=seed, batch_size=batch_size, rounds=rounds)  # type: ignore[operator]
    except FedcoreError:
        raise
    except Exception as exc:
        raise DataError(f"stream factory {name!r} failed: {error_text(exc)}") from exc
    if not isinstance(getattr(source, "dataset", None), Dataset) or not callable(
        getattr(source, "stream", None)
    ):
        raise DataError(
            f"stream factory {name!r} must return an object with a `dataset` (fedcore.data."
            "Dataset) and a `stream(node_index)` method."
        )
    return source  # type: ignore[no-any-return]
