"""Epidemic learning's schedules: every peer sends to ``degree`` peers drawn afresh each round.

Epidemic learning (de Vos, Farhadkhani, Guerraoui, Kermarrec, Pires and Sharma, NeurIPS
2023) lets each peer send its model to ``s`` random peers a round and average what arrives.
Two forms, two topology kinds, each a :class:`~fedcore.topology.schedule.Schedule` of
``period`` rounds whose round ``t`` is a pure function of the seed and ``t``:

* **EL-Local** (``epidemic-local``): every peer draws its ``s`` out-neighbours on its own,
  uniformly among the ``n - 1`` others, with no coordination; a peer then receives from a
  varying number of peers (``s`` on average). Peer ``i``'s draw in round ``t`` reads the
  words ``hash64(key, t, i, j)`` of the keyed hash (:mod:`fedcore.counter_random`) alone,
  so a real peer computes its own out-neighbours without anyone's help
  (:func:`local_targets`); the graph is one-way.
* **EL-Oracle** (``epidemic-oracle``): every round a fresh random ``s``-regular graph (the
  pairing method of :func:`~fedcore.topology.generators.random_regular`, seeded with the
  word ``hash64(key, t)``), undirected: every peer sends to ``s`` peers and receives from
  the same ``s``. The oracle is this shared draw: every peer makes the whole round's graph
  from the seed, and every peer makes the same one.

Weights are the mixing family's defaults (:func:`~fedcore.topology.weights.prepare`), which
here are EL's rule, a receiver's uniform average over itself and what it receives: on an
``s``-regular graph Metropolis–Hastings gives ``1 / (s + 1)`` to every edge and to the self
loop (doubly stochastic), so the gossip rules (``dpsgd``, ``dsgt``, ...) run EL-Oracle as
the paper does. EL-Local's one-way edges suit the push-sum rules (``ops``, ``dol``,
``push-pull``, ...): each sender gives ``1 / (s + 1)`` to itself and to each of its ``s``
receivers, and a receiver's ratio ``x / w`` is then the uniform average of what it holds
and receives, weighted by the push-sum weights that keep the network's average exact. A
doubly-stochastic rule refuses EL-Local (its in-degrees vary, so no weights are both
uniform and doubly stochastic) in :func:`~fedcore.topology.weights.prepare`'s one line.

Draws are keyed by ``(seed, t)`` alone, not by the period: a schedule of period ``P`` is
the first ``P`` rounds of any longer one of the same seed.
"""

from __future__ import annotations

import random

import numpy as np
import numpy.typing as npt
import torch

from fedcore.config import SEED_LIMIT
from fedcore.config.constants import MAX_ROUNDS
from fedcore.counter_random import hash64, make_key, uniform_tensor
from fedcore.errors import TopologyError
from fedcore.topology.generators import _both_ways, _check_count, _from_index_edges, _pairing
from fedcore.topology.graph import TrustGraph
from fedcore.topology.schedule import Schedule

__all__ = ["epidemic_local", "epidemic_oracle", "local_targets"]

_LOCAL = "fedcore.topology.epidemic-local"
_ORACLE = "fedcore.topology.epidemic-oracle"
_MAX_EDGES = 10**9  # of one period: each a few dozen bytes in a graph, more in an engine


def _check(kind: str, n: int, degree: object, seed: object, period: object) -> tuple[int, int, int]:
    """``(degree, seed, period)`` checked for ``n`` nodes, each refusal one line."""
    if isinstance(degree, bool) or not isinstance(degree, int):
        raise TopologyError(
            f"The degree of an {kind} schedule must be a whole number of peers, not {degree!r}."
        )
    if not 1 <= degree <= n - 1:
        raise TopologyError(
            f"The degree of an {kind} schedule of {n} nodes must be from 1 to {n - 1} (each "
            f"peer sends to that many others a round), not {degree}; set topology.degree."
        )
    seed = _check_count(seed, "seed", minimum=0, maximum=SEED_LIMIT - 1)
    if isinstance(period, bool) or not isinstance(period, int) or not 1 <= period <= MAX_ROUNDS:
        raise TopologyError(
            f"The period of an {kind} schedule (the rounds of fresh graphs before it repeats) "
            f"must be a whole number from 1 to {MAX_ROUNDS:,}, not {period!r}; set "
            "topology.period (0 in a config: the run's rounds)."
        )
    if period * n * degree > _MAX_EDGES:
        raise TopologyError(
            f"An {kind} schedule of {n:,} nodes, degree {degree} and period {period:,} has "
            f"{period * n * degree:,} edges, more than the {_MAX_EDGES:,} one may hold; use a "
            "shorter period (topology.period: the schedule repeats after it)."
        )
    return degree, seed, period


def local_targets(
    n: int, degree: int, *, seed: int, round: int, peers: npt.ArrayLike | None = None
) -> npt.NDArray[np.int64]:
    """EL-Local's out-neighbours in ``round``: row ``r`` holds the ``degree`` distinct
    indices (ascending, never the peer's own) that peer ``peers[r]`` (default: every peer,
    in order) sends to.

    Each peer draws alone, by Floyd's sampling of ``degree`` of the ``n - 1`` others: step
    ``j`` (from ``n - 1 - degree`` to ``n - 2``) draws ``r`` uniform in ``0..j`` from the word
    ``hash64(key, round, peer, j)`` and takes ``r``, or ``j`` where ``r`` is taken already;
    the taken indices skip the peer itself. A peer's row is the same whichever peers are
    asked with it.
    """
    key = make_key(_LOCAL, seed)
    who = torch.arange(n, dtype=torch.int64) if peers is None else torch.as_tensor(peers)
    who = who.to(torch.int64).reshape(-1)
    chosen = torch.empty((who.numel(), degree), dtype=torch.int64)
    for k, j in enumerate(range(n - 1 - degree, n - 1)):
        u = uniform_tensor(key, round, who, j)
        r = torch.floor(u * float(j + 1)).to(torch.int64)
        taken = (chosen[:, :k] == r[:, None]).any(dim=1)
        chosen[:, k] = torch.where(taken, torch.full_like(r, j), r)
    chosen += (chosen >= who[:, None]).to(torch.int64)  # skip the peer itself
    out: npt.NDArray[np.int64] = torch.sort(chosen, dim=1).values.numpy()
    return out


def _local_graph(n: int, degree: int, seed: int, t: int, name: str) -> TrustGraph:
    targets = local_targets(n, degree, seed=seed, round=t)
    src = np.repeat(np.arange(n, dtype=np.int64), degree)
    return _from_index_edges(f"{name}-round{t}", n, src, targets.reshape(-1))


def _oracle_graph(n: int, degree: int, seed: int, t: int, name: str) -> TrustGraph:
    rng = random.Random(hash64(make_key(_ORACLE, seed), t))
    keys = _pairing(n, degree, rng)
    while keys is None:
        keys = _pairing(n, degree, rng)
    src, dst = _both_ways(*np.divmod(keys, n))
    return _from_index_edges(f"{name}-round{t}", n, src, dst)


def epidemic_local(n: int, degree: int, *, seed: int, period: int) -> Schedule:
    """EL-Local: ``period`` rounds in which every peer sends to ``degree`` others of its own
    drawing (:func:`local_targets`); one-way edges, in-degrees vary.

    Raises:
        TopologyError: ``n`` below 2, a degree outside ``1..n - 1``, a bad seed or period.
    """
    n = _check_count(n, "number of epidemic-local nodes")
    degree, seed, period = _check("epidemic-local", n, degree, seed, period)
    name = f"epidemic-local-{n}-s{degree}-seed{seed}"
    graphs = [_local_graph(n, degree, seed, t, name) for t in range(period)]
    return Schedule(graphs, name=name)


def epidemic_oracle(n: int, degree: int, *, seed: int, period: int) -> Schedule:
    """EL-Oracle: ``period`` rounds, each a fresh random ``degree``-regular undirected graph
    (every peer sends to ``degree`` peers and receives from the same ones).

    Raises:
        TopologyError: ``n`` below 2, a degree outside ``1..n - 1``, ``n * degree`` odd (no
            such regular graph exists), a bad seed or period.
    """
    n = _check_count(n, "number of epidemic-oracle nodes")
    degree, seed, period = _check("epidemic-oracle", n, degree, seed, period)
    if n * degree % 2:
        raise TopologyError(
            f"An epidemic-oracle schedule of {n} nodes cannot be {degree}-regular: n * degree "
            "must be even. Use an even degree or node count, or topology.kind = "
            "'epidemic-local'."
        )
    name = f"epidemic-oracle-{n}-s{degree}-seed{seed}"
    graphs = [_oracle_graph(n, degree, seed, t, name) for t in range(period)]
    return Schedule(graphs, name=name)
