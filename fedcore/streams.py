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

from fedcore import counter_random as keyed
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
    """Where every node's stream comes from.

    A source may also offer (a user's need not; callers look for them, as it implements
    this protocol without inheriting from it): ``batches(round)``, every node's batch of a
    round at once as ``[N, b, ...]`` stacks (the vectorized engine and the regret replay
    then skip the per-node streams); ``comparator(round)``, the round's best fixed model
    (the dynamic regret's comparator); ``keep_rounds(nbytes)``, keep the rounds drawn, up
    to ``nbytes``, until the regret replays them (:class:`SyntheticDrift` offers all three).
    """

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
    ``M = 0`` is a fixed comparator. The math is float64; the features are then rounded to
    float32.

    The randomness is counter-based (:mod:`fedcore.counter_random`) rather than a generator's
    stream, so every number is a pure function of its coordinates. With ``key =
    make_key("fedcore.streams.synthetic", seed)`` and ``h = hash64(key, salt, t, i, j)``
    for example ``j`` (``salt``: 0 for the streams, 1 for the test split, 2 for the probe):

    * features ``2p`` and ``2p + 1`` of ``xi`` are the Box–Muller pair ``gaussian_pair(h, p)``;
    * the label is ``y = [w*_t . a > L]`` with ``L = logistic(h, -1) = log(u / (1 - u))``,
      ``u`` uniform: the event ``u < sigmoid(w*_t . a)``, the Bernoulli draw above;
    * the sine of ``v`` is taken as ``sin(i + 1.7 k) cos(0.31 t) + cos(i + 1.7 k) sin(0.31
      t)`` (:func:`fedcore.counter_random.sin_cos_tensor`), so its node-feature part is computed
      once.

    :meth:`batches` draws for any nodes at once, on any device, and :meth:`batch` (one
    node) is its row, so the two agree bit for bit; a round of 10,000 nodes is a few
    hundred tensor operations instead of 10,000 generators.

    The test split (``dataset``) is drawn from the last round's distribution, nodes mixed.
    """

    RADIUS = 4.0
    MAX_VALUES = 2**28
    """Most values (examples x features) of one batch or of the test split."""
    CHUNK_VALUES = 2**20
    """:meth:`batches` draws this many values at a time (bounds its float64 temporaries)."""
    TABLE_VALUES = 2**24
    """Most node-feature values whose sines :meth:`batches` keeps between rounds (their
    sines and cosines: 256 MiB of float64 at the most, for 1,000,000 nodes of 16
    features; recomputing them would double the draw of such a round)."""
    ROUND_VALUES = 2**20
    """Up to this many values in a round (nodes x examples x features), :meth:`batch`
    draws every node's batch of the round at once and keeps the last few rounds: a
    hundred tensor operations cost about the same for one node as for all."""
    ROUNDS_KEPT = 4
    """How many such rounds :meth:`batch` keeps (nodes may be a round or two apart)."""

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
        self._key = keyed.make_key("fedcore.streams.synthetic", seed)
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rounds: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._kept: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._keep_bytes = 0  # see keep_rounds
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
        w = torch.zeros(self.features, dtype=torch.float64, device="cpu")
        w[0], w[1] = self._comparator_plane(round)
        return w

    def _comparator_plane(self, round: int) -> tuple[float, float]:
        """The two nonzero entries of ``w*_t`` (the others are 0)."""
        angle = self.drift / self.RADIUS * (round / max(1, self.rounds - 1))
        return self.RADIUS * math.cos(angle), self.RADIUS * math.sin(angle)

    def direction(self, node: int | torch.Tensor, round: int) -> torch.Tensor:
        """The adversarial unit vector ``v_{i,t}`` (float64): ``[features]`` for one node,
        ``[N, features]`` for an int64 tensor of ``N`` nodes (on its device)."""
        nodes = torch.as_tensor(node, dtype=torch.int64)
        return self._direction(self._angles(nodes.reshape(-1)), round).reshape(
            *nodes.shape, self.features
        )

    def batch(
        self, node: int, round: int, size: int | None = None, *, salt: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of ``node`` in ``round``: ``size`` (default ``batch_size``) examples,
        float32 features ``[size, features]`` and int64 labels ``[size]``.

        Bit for bit row ``node`` of :meth:`batches`, which it calls for every node of a
        small round (and keeps, see ``ROUND_VALUES``); in a large round it draws the one row.
        """
        size = self.batch_size if size is None else size
        if 0 <= node < self.nodes and self.nodes * size * self.features <= self.ROUND_VALUES:
            key = (round, size, salt)
            if key not in self._rounds:
                while len(self._rounds) >= self.ROUNDS_KEPT:
                    del self._rounds[next(iter(self._rounds))]
                self._rounds[key] = self.batches(round, size=size, salt=salt)
            x, y = self._rounds[key]
            return x[node].clone(), y[node].clone()
        x, y = self.batches(round, torch.tensor([node], device="cpu"), size=size, salt=salt)
        return x[0], y[0]

    def keep_rounds(self, nbytes: int) -> None:
        """Keep copies of the most recent whole rounds :meth:`batches` draws on the CPU
        (every node, ``nodes=None``), up to ``nbytes`` in all, and answer a later call for
        one of them with a copy rather than a new draw (the same values). The regret of a
        run (:class:`~fedcore.simulation.regret.RegretTracker`) asks for them again at the
        next evaluation. 0 (the default): keep none."""
        self._keep_bytes = max(0, int(nbytes))
        while self._kept and self._kept_bytes() > self._keep_bytes:
            del self._kept[next(iter(self._kept))]

    def _kept_bytes(self) -> int:
        return sum(x.nbytes + y.nbytes for x, y in self._kept.values())

    def batches(
        self,
        round: int,
        nodes: torch.Tensor | None = None,
        *,
        size: int | None = None,
        salt: int = 0,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every node's batch of ``round`` at once: ``x [N, size, features]`` (float32) and
        ``y [N, size]`` (int64), row ``n`` bit for bit ``batch(nodes[n], round, size)``.

        ``nodes`` (int64, default all ``0 .. nodes-1``) is moved to ``device`` if given;
        the result is on the nodes' device. With ``nodes=None`` the sines of the
        adversarial directions are computed once per device and kept.
        """
        size = self.batch_size if size is None else size
        whole = nodes is None and torch.device(device or "cpu").type == "cpu"
        if whole and (round, size, salt) in self._kept:
            x, y = self._kept[(round, size, salt)]
            return x.clone(), y.clone()
        if nodes is None:
            nodes = torch.arange(self.nodes, dtype=torch.int64, device=device)
            tables = self._all_angles(nodes.device)
        else:
            nodes = nodes.to(device=device, dtype=torch.int64).reshape(-1)
            tables = None
        per_chunk = max(1, self.CHUNK_VALUES // max(1, size * self.features))
        xs, ys = [], []
        for start in range(0, len(nodes), per_chunk):
            part = slice(start, start + per_chunk)
            chunk = nodes[part]
            angles = self._angles(chunk) if tables is None else (tables[0][part], tables[1][part])
            x, y = self._draw(round, chunk, angles, size, salt)
            xs.append(x)
            ys.append(y)
        if whole and self._keep_bytes and xs:
            self._keep((round, size, salt), xs, ys)
        if len(xs) == 1:
            return xs[0], ys[0]
        if not xs:
            empty = torch.empty(0, size, self.features, device=nodes.device)
            return empty, torch.empty(0, size, dtype=torch.int64, device=nodes.device)
        return torch.cat(xs), torch.cat(ys)

    def _keep(
        self, key: tuple[int, int, int], xs: list[torch.Tensor], ys: list[torch.Tensor]
    ) -> None:
        """Keep a copy of a whole round (see :meth:`keep_rounds`), the oldest going first."""
        kept = (torch.cat(xs), torch.cat(ys)) if len(xs) > 1 else (xs[0].clone(), ys[0].clone())
        if kept[0].nbytes + kept[1].nbytes > self._keep_bytes:
            return
        self._kept[key] = kept
        while self._kept_bytes() > self._keep_bytes:
            del self._kept[next(iter(self._kept))]

    def _angles(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``sin, cos`` of ``i + 1.7 k`` for nodes ``[N]`` and features ``k``: ``[N, features]``."""
        k = torch.arange(self.features, dtype=torch.float64, device=nodes.device)
        return keyed.sin_cos_tensor(nodes.to(torch.float64)[:, None] + 1.7 * k)

    def _all_angles(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`_angles` of every node, kept per device (None: too many to keep)."""
        if self.nodes * self.features > self.TABLE_VALUES:
            return None
        if device not in self._tables:
            nodes = torch.arange(self.nodes, dtype=torch.int64, device=device)
            self._tables[device] = self._angles(nodes)
        return self._tables[device]

    def _direction(self, angles: tuple[torch.Tensor, torch.Tensor], round: int) -> torch.Tensor:
        """``v_{i,t}`` ``[N, features]`` from :meth:`_angles`: the angle sum, normalized."""
        device = angles[0].device
        turn = torch.tensor(0.31 * round, dtype=torch.float64, device=device)
        sin_b, cos_b = keyed.sin_cos_tensor(turn)
        v = angles[0] * cos_b
        v += angles[1] * sin_b
        norm = keyed.sqrt_tensor(_sum_last(v * v))
        v /= norm[:, None]
        return v

    def _draw(
        self,
        round: int,
        nodes: torch.Tensor,
        angles: tuple[torch.Tensor, torch.Tensor],
        size: int,
        salt: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batches of ``nodes`` (see the class docstring)."""
        device = nodes.device
        examples = torch.arange(size, dtype=torch.int64, device=device)
        pairs = torch.arange(-(-self.features // 2), dtype=torch.int64, device=device)
        h = keyed.hash64_tensor(self._key, salt, round, nodes[:, None], examples)  # [N, B]
        z0, z1 = keyed.gaussian_pair_tensor(h[..., None], pairs)  # [N, B, P] each
        xi = torch.stack([z0, z1], dim=-1).reshape(len(nodes), size, -1)[..., : self.features]
        a = (self.adversarial * self._direction(angles, round))[:, None, :] + self.noise * xi
        w0, w1 = self._comparator_plane(round)
        margin = a[..., 0] * w0 + a[..., 1] * w1  # w*_t . a: w*_t is 0 beyond two features
        y = (margin > keyed.logistic_tensor(h, -1)).to(torch.int64)
        return a.to(torch.float32), y

    def _sample_mixed(self, round: int, size: int, *, salt: int) -> tuple[torch.Tensor, ...]:
        """``size`` examples: ``per`` from each node in turn, as many nodes as it takes."""
        per = -(-size // self.nodes)
        used = torch.arange(-(-size // per), dtype=torch.int64, device="cpu")
        x, y = self.batches(round, used, size=per, salt=salt)
        return x.reshape(-1, self.features)[:size], y.reshape(-1)[:size]

    def stream(self, node: int) -> _SyntheticStream:
        """Node ``node``'s stream, from round 0."""
        return _SyntheticStream(self, node)


def _sum_last(t: torch.Tensor) -> torch.Tensor:
    """The sum over the last dimension in a fixed pairwise order, whatever the other
    dimensions (a reduction kernel's order may change with the shape): halves added
    elementwise, an odd last element carried, until one is left."""
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        head = t[..., :half] + t[..., half : 2 * half]
        t = torch.cat([head, t[..., 2 * half :]], dim=-1) if t.shape[-1] % 2 else head
    return t[..., 0]


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
