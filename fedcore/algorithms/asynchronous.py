"""Asynchronous algorithms: each peer computes and communicates at its own pace.

No round is shared: a peer's computation ends when its compute time says, and what it
does then is one of the rules below, over a leading peer axis (the ``B`` peers whose
computations end together; the event engine, :mod:`fedcore.engines.events`, runs them in
virtual time). Every rule is sans-I/O math over tensors; the engine decides when it runs,
which messages arrive and which are lost.

* :class:`ADPSGD` (Lian, Zhang, Zhang, Liu, "Asynchronous Decentralized Parallel
  Stochastic Gradient Descent", ICML 2018): a worker reads its model ``x_i`` and computes a
  stochastic gradient ``g_i`` on it; when that ends, it averages its model with one
  neighbour ``j`` drawn uniformly by the keyed hash, atomically, ``x_i, x_j <- (x_i +
  x_j) / 2``, then applies the *stale* gradient, ``x_i <- x_i - lr g_i`` (taken at the
  model it read, which the neighbours' averaging has changed since). Staleness: bounded
  by how many averagings reach ``i`` during one computation. A lost exchange (the fault
  plan loses the request or the reply) skips the averaging: the worker applies its
  gradient alone. The pairwise average keeps the network's mean; only the gradients move
  it.
* :class:`AsyncPushSum` (asynchronous gradient-push: Assran and Rabbat, "Asynchronous
  Gradient-Push", IEEE TAC 2021): a peer holds a numerator ``x_i`` and a weight ``w_i``
  and computes its gradient at ``z_i = x_i / w_i``; when that ends it steps by ``lr`` on
  ``z``, ``x_i <- x_i - lr w_i g_i`` (as OPS's ``step_scale = "omega"``: peers that
  compute at different rates hold very different weights, and a step of ``lr`` on the
  numerator would move a peer of small weight by ``lr / w_i``), then keeps ``p_ii`` of
  ``(x_i, w_i)`` and pushes ``p_ji (x_i, w_i)`` to each out-neighbour (column-stochastic
  weights, any strongly connected digraph). Messages carry running sums per edge
  (fedcore's robust push-sum, reference section 10): a receiver adds the difference to
  the last sum it applied from that edge, so a lost message's mass arrives with the next
  one, and one overtaken by a newer one (or older than one applied) is ignored. ``sum_i
  w_i`` plus the mass in flight is ``N`` at every moment.
* :class:`FedBuff` (Nguyen et al., "Federated Learning with Buffered Asynchronous
  Aggregation", AISTATS 2022): a worker downloads the server's model and its version,
  runs ``run.local_steps`` local steps and uploads ``delta = x_start - x_end``; the
  server adds ``s(tau) n_i delta`` to a buffer (``tau``: versions since the worker's
  download, ``s(tau) = 1 / sqrt(1 + tau)``; ``n_i``: the worker's examples over the
  workers' mean, as FedAvg weighs its workers, 1 for equal parts: so FedBuff with every
  worker in the buffer and no staleness is FedAvg) and, once it holds ``buffer`` updates, steps
  ``x <- x - server_lr * (sum / buffer)`` and starts a new version. A lost upload is
  lost (the worker downloads again); a stale one counts less.
* :class:`FedAsync` (Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", 2019),
  FedBuff's baseline: the server mixes each upload as it arrives, ``x <- (1 - a) x + a
  x_worker`` with ``a = alpha * (1 + tau)^-staleness_power``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from fedcore.errors import ConfigError

__all__ = [
    "ADPSGD",
    "AsyncPushSum",
    "FedAsync",
    "FedBuff",
    "ServerState",
    "example_shares",
    "is_asynchronous",
]


def is_asynchronous(algorithm: Any) -> bool:
    """Whether ``algorithm`` runs without rounds (on the event engine)."""
    return bool(getattr(algorithm, "asynchronous", False))


def _number(key: str, value: object, low: float, high: float, *, open_low: bool = True) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (low < value if open_low else low <= value) and value <= high  # type: ignore[operator]
    if not ok:
        bound = "(" if open_low else "["
        raise ConfigError(
            f"algorithm.{key} = {value!r} is invalid: it must be a number in {bound}{low:g}, "
            f"{high:g}]."
        )
    return float(value)  # type: ignore[arg-type]


class ADPSGD:
    """AD-PSGD (see the module docstring); a symmetric graph (doubly-stochastic mixing
    checks it), whose weights it does not use: the partner is uniform among the
    neighbours."""

    name = "adpsgd"
    mixing = "doubly-stochastic"
    phases = 1
    asynchronous = True

    @staticmethod
    def average(x_i: torch.Tensor, x_j: torch.Tensor) -> torch.Tensor:
        """The pair's average, ``[B, d]`` (both ends take it)."""
        return (x_i + x_j) * 0.5

    @staticmethod
    def average_pairs(x: torch.Tensor, first: list[int], second: list[int]) -> None:
        """Average the pairs ``(first[k], second[k])`` of the rows of ``x`` in place, as if
        one after another in ``k`` order (each averaging atomic), batched: pair ``k`` goes
        in the layer after the last one holding either of its peers, so a layer's pairs
        share no peer and every peer's averagings keep their order (bit-identical to the
        sequential loop: the average is elementwise)."""
        layers: list[list[int]] = []
        last: dict[int, int] = {}
        for k, (i, j) in enumerate(zip(first, second, strict=True)):
            if i == j:
                raise ValueError(f"pair {k} averages peer {i} with itself")
            layer = max(last.get(i, -1), last.get(j, -1)) + 1
            if layer == len(layers):
                layers.append([])
            layers[layer].append(k)
            last[i] = last[j] = layer
        a_all = torch.tensor(first, dtype=torch.int64)
        b_all = torch.tensor(second, dtype=torch.int64)
        for pairs in layers:
            pick = torch.tensor(pairs, dtype=torch.int64)
            a, b = a_all[pick], b_all[pick]
            mean = ADPSGD.average(x[a], x[b])
            x[a] = mean
            x[b] = mean

    @staticmethod
    def apply(x: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """The stale gradient step, ``x - lr g``."""
        return x - lr * grad


class AsyncPushSum:
    """Asynchronous gradient-push with running sums (see the module docstring)."""

    name = "async-push-sum"
    mixing = "push-sum"
    phases = 1
    asynchronous = True

    @staticmethod
    def debiased(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``z = x / w`` of each row (``w``: ``[B]`` float64)."""
        return x / w.to(x.dtype).unsqueeze(1)

    @staticmethod
    def step(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """A step of ``lr`` on ``z = x / w``: ``x - lr w g`` (``w``: ``[B]`` float64)."""
        return x - (lr * w).to(x.dtype).unsqueeze(1) * grad

    @staticmethod
    def push(
        x: torch.Tensor, w: torch.Tensor, self_weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What each row keeps of ``(x, w)``: its self weight's share."""
        return x * self_weight.to(x.dtype).unsqueeze(1), w * self_weight

    @staticmethod
    def receive(
        x: torch.Tensor,
        w: torch.Tensor,
        sums: tuple[torch.Tensor, torch.Tensor],
        applied: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the mass a running sum carries beyond the one applied before."""
        return x + (sums[0] - applied[0]), w + (sums[1] - applied[1])


class ServerState(NamedTuple):
    """The server family's server: its model, its version, and FedBuff's buffer (the
    weighted sum of the updates it holds, float64, and how many)."""

    x: torch.Tensor
    version: int = 0
    total: torch.Tensor | None = None
    held: int = 0


class FedBuff:
    """FedBuff (see the module docstring).

    Args:
        server: The server's node id (``topology.server``).
        buffer: Updates the server aggregates at once (``K``); 0: every worker's.
        server_lr: The server's step on the buffered mean.
    """

    name = "fedbuff"
    mixing = "star"
    phases = 1
    asynchronous = True

    def __init__(self, server: str = "server", buffer: int = 10, server_lr: float = 1.0) -> None:
        """Check the options."""
        if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 0:
            raise ConfigError(
                f"algorithm.buffer = {buffer!r} is invalid: it must be a whole number >= 0 "
                "(updates aggregated at once; 0: every worker's)."
            )
        self.server = server
        self.buffer = buffer
        self.server_lr = _number("server_lr", server_lr, 0.0, 1e6)

    @staticmethod
    def upload(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """What a worker sends: its update ``x_start - x_end``."""
        return start - end

    @staticmethod
    def weight(staleness: int) -> float:
        """``s(tau) = 1 / sqrt(1 + tau)``."""
        return 1.0 / math.sqrt(1.0 + staleness)

    def receive(
        self, state: ServerState, update: torch.Tensor, staleness: int, share: float, workers: int
    ) -> ServerState:
        """One upload at the server: buffered with weight ``s(tau) * share`` (``share``:
        the worker's examples over the workers' mean), and once the buffer holds
        ``buffer`` (0: ``workers``) of them, the step ``x - server_lr * total / count`` and
        a new version."""
        weighted = (self.weight(staleness) * share) * update.to(torch.float64)
        total = weighted if state.total is None else state.total + weighted
        held = state.held + 1
        if held < (self.buffer or workers):
            return state._replace(total=total, held=held)
        x = state.x.to(torch.float64) - (self.server_lr / held) * total
        return ServerState(x.to(state.x.dtype), state.version + 1)


class FedAsync:
    """FedAsync (see the module docstring).

    Args:
        server: The server's node id (``topology.server``).
        alpha: The mixing weight of a fresh update, in (0, 1].
        staleness_power: ``a`` >= 0 of the polynomial staleness weight.
    """

    name = "fedasync"
    mixing = "star"
    phases = 1
    asynchronous = True

    def __init__(
        self, server: str = "server", alpha: float = 0.6, staleness_power: float = 0.5
    ) -> None:
        """Check the options."""
        self.server = server
        self.alpha = _number("alpha", alpha, 0.0, 1.0)
        self.power = _number("staleness_power", staleness_power, 0.0, 100.0, open_low=False)

    @staticmethod
    def upload(start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """What a worker sends: its model ``x_end``."""
        return end

    def receive(
        self, state: ServerState, model: torch.Tensor, staleness: int, share: float, workers: int
    ) -> ServerState:
        """One upload at the server: ``(1 - a) x + a x_worker``, ``a = alpha (1 +
        tau)^-staleness_power``, and a new version (``share`` and ``workers`` unused:
        FedAsync weighs by staleness alone)."""
        a = float(self.alpha * (1.0 + staleness) ** -self.power)
        return ServerState((1.0 - a) * state.x + a * model, state.version + 1)


def example_shares(parts: Any, workers: torch.Tensor) -> torch.Tensor:
    """``[N]`` float64: each worker's examples over the workers' mean (0 for a server):
    FedBuff weighs an update by it, as FedAvg weighs a worker's model (1 for equal parts)."""
    held = torch.tensor([float(len(p)) for p in parts], dtype=torch.float64) * workers
    return held * int(workers.sum()) / held.sum().clamp(min=1.0)
