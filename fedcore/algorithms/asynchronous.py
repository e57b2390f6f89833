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

**What a receiver checks.** Every value a peer sends is checked against the receiver's own
state before any arithmetic, here in the rules, so the event engine and the real peers
(:mod:`fedcore.node.asynchronous`, which calls the same checks on arrival too) refuse the
same messages: a :class:`~fedcore.errors.ProtocolError` naming the value, the receiver's
state unchanged. An upload's version is a whole number no newer than the server's own
(:meth:`FedBuff.receive`, :meth:`FedAsync.receive`); a server's answer's version is no
older than the worker's and no newer than the answer's upload count allows
(:func:`answer_version`); a running sum's weight is no smaller than the one applied from
that edge (running sums only grow; :meth:`AsyncPushSum.admit`); and a step whose result
would not be finite in the model's dtype (an average, a mix, a server step) is refused
rather than taken. Finite values of the right form are trusted, as the synchronous
algorithms trust them (:mod:`fedcore.algorithms.base`).

**A rule's pattern.** The event engine and the real peer run a rule by what it declares
(a subclass of :class:`AsynchronousRule`), never by which rule it is: its :data:`Pattern`
(who talks to whom and when), whether it has a ``server``, what its messages carry
(:class:`Carries`), the parameters a peer predicts with (``model``) and the step a
computation ends with (``step``); then its pattern's row functions:

* ``"pair"`` (:class:`ADPSGD`): when a computation ends, the peer averages with one partner
  (a request, phase 0, and its reply, phase 1; received: ``pair``, batched in the engine:
  ``average_pairs``), then takes its computed step (``step``, stale).
* ``"push"`` (:class:`AsyncPushSum`): when a computation ends, the peer takes its computed
  step (``step``), adds shares of its ``mass`` to the running sums of its out-edges and
  keeps its own share (``push``); received: a running sum, checked (``admit``) and added
  (``receive``; batched in the engine: ``receive_rows``).
* ``"upload"`` (:class:`FedBuff`, :class:`FedAsync`): when a worker's local steps
  (``step``) end it uploads ``upload(start, end)`` with the version it started from; the
  server's ``receive`` takes the upload received and answers with its model and version
  (checked at the worker: :func:`answer_version`).
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import torch

from fedcore.errors import ConfigError, ProtocolError

__all__ = [
    "ADPSGD",
    "AsyncPushSum",
    "AsynchronousRule",
    "Carries",
    "FedAsync",
    "FedBuff",
    "Pattern",
    "ServerState",
    "answer_version",
    "example_shares",
    "is_asynchronous",
    "staleness",
    "whole_number",
]


Pattern = Literal["pair", "push", "upload"]
"""Who talks to whom, and when (see the module docstring)."""


class Carries(NamedTuple):
    """What an asynchronous rule's message holds besides its one tensor ``"x"``."""

    phases: tuple[int, ...] = (0,)
    """The phases its messages go in (AD-PSGD: a request 0 and a reply 1)."""
    scalars: frozenset[str] = frozenset()
    """Exactly the scalars each message holds."""
    raw: bool = False
    """``x`` is a float64 running sum of ``d`` values and a weight, sent raw (lossless);
    otherwise a model or an update of ``d`` values in the model's dtype, through the
    run's codec."""


class AsynchronousRule:
    """What the event engine and the real peer ask of an asynchronous rule; the row
    functions of its :attr:`pattern` are named in the module docstring.

    A rule says it is one by subclassing this class: fedcore runs an algorithm without
    rounds only when its class declares it so (:func:`is_asynchronous`), never because it
    happens to have these attributes.
    """

    name: str
    mixing: str
    phases = 1
    asynchronous = True
    pattern: Pattern
    server: str | None = None
    """The server's node id (pattern ``"upload"``), or None."""
    carries = Carries()

    def model(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``[B, d]``: the parameters each row predicts with and takes its gradient at
        (``x``: ``[B, d]``; ``w``: ``[B]`` float64, each row's push-sum weight, 1 for the
        other patterns)."""
        raise NotImplementedError

    def step(self, x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """``[B, d]``: each row's step with its gradient ``grad`` at its model: what a
        computation ends with (AD-PSGD's after its averaging; the upload pattern's each
        local step)."""
        raise NotImplementedError


def is_asynchronous(algorithm: Any) -> bool:
    """Whether ``algorithm`` runs without rounds (on the event engine): whether its class
    declares it an :class:`AsynchronousRule`."""
    return isinstance(algorithm, AsynchronousRule)


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


def whole_number(name: str, value: float, low: int, high: int, why: str) -> int:
    """``value`` (a scalar a peer sent) as an int, if it is a whole number in ``[low,
    high]``.

    Raises:
        ProtocolError: NaN, infinite, fractional, or outside ``[low, high]`` (``why``: why
            the bounds hold, for the message).
    """
    if not (
        isinstance(value, int | float)
        and math.isfinite(value)
        and value == math.floor(value)
        and low <= value <= high
    ):
        raise ProtocolError(
            f"scalar {name!r} is {value!r}; it must be a whole number in [{low}, {high}] ({why})."
        )
    return int(value)


def _finite(what: str, value: torch.Tensor, shape: tuple[int, ...] | None = None) -> None:
    """Refuse a tensor of another shape, or one holding a value that is not finite (NaN,
    infinite, or beyond its dtype's range: a float32 conversion of a huge float64)."""
    if shape is not None and tuple(value.shape) != shape:
        raise ProtocolError(f"{what} has shape {tuple(value.shape)}; expected {shape}.")
    if not bool(torch.isfinite(value).all()):
        raise ProtocolError(f"{what} is not finite; the receiver keeps its state.")


def answer_version(own: int, round: int, version: float) -> int:
    """The version a server's answer carries, checked at the worker: no older than the
    worker's own ``own`` (the server's versions only grow, and the worker's came from it)
    and at most ``round + 1`` (the answer to the server's ``round``-th upload, counted from
    0: every upload starts at most one new version).

    Raises:
        ProtocolError: a version outside ``[own, round + 1]`` or not a whole number.
    """
    why = "no older than this worker's, at most one new version an upload"
    return whole_number("version", version, own, max(own, round + 1), why)


class ADPSGD(AsynchronousRule):
    """AD-PSGD (see the module docstring); a symmetric graph (doubly-stochastic mixing
    checks it), whose weights it does not use: the partner is uniform among the
    neighbours."""

    name = "adpsgd"
    mixing = "doubly-stochastic"
    pattern: Pattern = "pair"
    carries = Carries(phases=(0, 1))

    @staticmethod
    def model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Each row's model is ``x`` (``w`` unused)."""
        return x

    @staticmethod
    def step(x: torch.Tensor, w: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """The (stale) gradient step, ``x - lr g`` (``w`` unused)."""
        return x - lr * grad

    @staticmethod
    def average(x_i: torch.Tensor, x_j: torch.Tensor) -> torch.Tensor:
        """The pair's average, ``[B, d]`` (both ends take it)."""
        return (x_i + x_j) * 0.5

    @staticmethod
    def pair(x_i: torch.Tensor, x_j: torch.Tensor) -> torch.Tensor:
        """The pair's average of one peer's ``[d]`` model and the model a partner sent
        (a request or a reply), checked before either end takes it.

        Raises:
            ProtocolError: a partner's model of another shape, or an average that is not
                finite (non-finite values, or huge ones whose sum overflows).
        """
        _finite("the partner's model", x_j, tuple(x_i.shape))
        mean = ADPSGD.average(x_i, x_j)
        _finite("the pair's average", mean)
        return mean

    @staticmethod
    def average_pairs(x: torch.Tensor, first: list[int], second: list[int]) -> torch.Tensor:
        """Average the pairs ``(first[k], second[k])`` of the rows of ``x`` in place, as if
        one after another in ``k`` order (each averaging atomic), batched: pair ``k`` goes
        in the layer after the last one holding either of its peers, so a layer's pairs
        share no peer and every peer's averagings keep their order (bit-identical to the
        sequential loop: the average is elementwise). A pair whose average is not finite
        is refused, as :meth:`pair` refuses it: both rows stay. Returns ``[K]`` bool: the
        pairs averaged."""
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
        kept = torch.ones(len(first), dtype=torch.bool)
        for pairs in layers:
            pick = torch.tensor(pairs, dtype=torch.int64)
            a, b = a_all[pick], b_all[pick]
            mean = ADPSGD.average(x[a], x[b])
            ok = torch.isfinite(mean).all(dim=1)
            if not bool(ok.all()):
                kept[pick[~ok]] = False
                a, b, mean = a[ok], b[ok], mean[ok]
            x[a] = mean
            x[b] = mean
        return kept


class AsyncPushSum(AsynchronousRule):
    """Asynchronous gradient-push with running sums (see the module docstring)."""

    name = "async-push-sum"
    mixing = "push-sum"
    pattern: Pattern = "push"
    carries = Carries(raw=True)

    @staticmethod
    def debiased(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``z = x / w`` of each row (``w``: ``[B]`` float64)."""
        return x / w.to(x.dtype).unsqueeze(1)

    model = debiased

    @staticmethod
    def mass(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``[B, d + 1]`` float64: each row's ``(x, w)``, whose shares the running sums add."""
        return torch.cat([x.to(torch.float64), w.to(torch.float64).reshape(-1, 1)], dim=1)

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
    def admit(
        sums: torch.Tensor, applied: torch.Tensor, most: float | torch.Tensor = math.inf
    ) -> torch.Tensor:
        """``[B]`` bool: which running sums ``[B, d + 1]`` (float64, the weight last) a
        receiver may apply beyond the ones it applied from the same edges: finite, a
        weight no smaller than the applied one (a running sum only grows: every push adds
        a positive share of a positive weight) and at most ``most`` (the real peer: the
        sender's pushes so far times the network's mass ``N``, the most any weight
        holds), and a finite difference."""
        gain = sums - applied
        weight = sums[:, -1]
        return (
            torch.isfinite(sums).all(dim=1)
            & torch.isfinite(gain).all(dim=1)
            & (gain[:, -1] >= 0)
            & (weight <= most)
        )

    @staticmethod
    def receive(
        x: torch.Tensor,
        w: torch.Tensor,
        sums: tuple[torch.Tensor, torch.Tensor],
        applied: tuple[torch.Tensor, torch.Tensor],
        most: float = math.inf,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the mass a running sum carries beyond the one applied before (``x``,
        ``sums[0]``, ``applied[0]``: ``[B, d]``; ``w`` and the weights: ``[B]``), in
        ``x``'s dtype; ``most``: :meth:`admit`'s bound on a weight.

        Raises:
            ProtocolError: a running sum :meth:`admit` refuses, or a result that is not
                finite in ``x``'s dtype (the receiver keeps ``x`` and ``w``).
        """
        full = torch.cat([sums[0].to(torch.float64), sums[1].reshape(-1, 1)], dim=1)
        before = torch.cat([applied[0].to(torch.float64), applied[1].reshape(-1, 1)], dim=1)
        ok = AsyncPushSum.admit(full, before, most)
        if not bool(ok.all()):
            row = int(torch.nonzero(~ok)[0, 0])  # the first refused
            bound = "" if math.isinf(most) else f", or above {most:g}"
            raise ProtocolError(
                f"a running sum is not finite, or its weight ({float(full[row, -1])!r}) is "
                f"below the one already applied from that edge ({float(before[row, -1])!r}: a "
                f"running sum only grows){bound}."
            )
        new_x = (x.to(torch.float64) + (sums[0] - applied[0])).to(x.dtype)
        new_w = w + (sums[1] - applied[1])
        _finite("the sum of a running sum and this peer's x", new_x)
        _finite("the sum of a running weight and this peer's w", new_w)
        if not bool((new_w > 0).all()):
            raise ProtocolError("a running sum would leave this peer a weight <= 0.")
        return new_x, new_w

    @staticmethod
    def receive_rows(
        x: torch.Tensor, w: torch.Tensor, dst: torch.Tensor, gain: torch.Tensor
    ) -> torch.Tensor:
        """Add running sums' gains beyond the ones applied (``[K, d + 1]`` float64, each
        admitted: :meth:`admit`) to the rows ``dst [K]`` of ``x [N, d]`` and ``w [N]``, in
        place, those into one row summed in ``x``'s dtype (the event engine: a tick's
        arrivals at once). A receiver whose ``x`` or ``w`` would not be finite, or whose
        ``w`` would not be positive, refuses every gain into it and keeps both, as
        :meth:`receive` refuses one. Returns ``[K]`` bool: the gains taken."""
        d = x.shape[1]
        rows = torch.unique(dst)
        x_before, w_before = x[rows].clone(), w[rows].clone()
        x.index_add_(0, dst, gain[:, :d].to(x.dtype))
        w.index_add_(0, dst, gain[:, d])
        fine = torch.isfinite(x[rows]).all(dim=1) & torch.isfinite(w[rows])
        fine &= w[rows] > 0
        if bool(fine.all()):
            return torch.ones(dst.shape, dtype=torch.bool)
        bad = rows[~fine]
        x[bad], w[bad] = x_before[~fine], w_before[~fine]
        return ~torch.isin(dst, bad)


class ServerState(NamedTuple):
    """The server family's server: its model, its version, and FedBuff's buffer (the
    weighted sum of the updates it holds, float64, and how many)."""

    x: torch.Tensor
    version: int = 0
    total: torch.Tensor | None = None
    held: int = 0


class FedBuff(AsynchronousRule):
    """FedBuff (see the module docstring).

    Args:
        server: The server's node id (``topology.server``).
        buffer: Updates the server aggregates at once (``K``); 0: every worker's.
        server_lr: The server's step on the buffered mean.
    """

    name = "fedbuff"
    mixing = "star"
    pattern: Pattern = "upload"
    carries = Carries(scalars=frozenset({"version"}))
    model = staticmethod(ADPSGD.model)
    step = staticmethod(ADPSGD.step)  # a local step

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
        self, state: ServerState, update: torch.Tensor, version: float, share: float, workers: int
    ) -> ServerState:
        """One upload at the server, of a worker that started from ``version``: buffered
        with weight ``s(tau) * share`` (``tau``: the versions since; ``share``: the
        worker's examples over the workers' mean), and once the buffer holds ``buffer``
        (0: ``workers``) of them, the step ``x - server_lr * total / count`` and a new
        version.

        Raises:
            ProtocolError: a version that is not a whole number in ``[0, state.version]``
                (:func:`staleness`), an update of another shape or not finite, or one whose
                step alone, ``x - server_lr * weighted``, leaves the model's dtype's range,
                or one that fills the buffer and whose step on it is not finite (a float64
                model's buffer sum can overflow). ``state`` is unchanged.
        """
        tau = staleness(state, version)
        _finite("the update", update, tuple(state.x.shape))
        weighted = (self.weight(tau) * share) * update.to(torch.float64)
        alone = state.x.to(torch.float64) - self.server_lr * weighted
        if not bool((alone.abs() <= torch.finfo(state.x.dtype).max).all()):
            raise ProtocolError(
                "the update would take the server's model beyond its dtype's range; the "
                "server keeps its state."
            )
        total = weighted if state.total is None else state.total + weighted
        held = state.held + 1
        if held < (self.buffer or workers):
            return state._replace(total=total, held=held)
        x = (state.x.to(torch.float64) - (self.server_lr / held) * total).to(state.x.dtype)
        # Each step alone stayed in range, but a float64 model's buffer sum can overflow.
        _finite("the server's step on its buffer", x)
        return ServerState(x, state.version + 1)


class FedAsync(AsynchronousRule):
    """FedAsync (see the module docstring).

    Args:
        server: The server's node id (``topology.server``).
        alpha: The mixing weight of a fresh update, in (0, 1].
        staleness_power: ``a`` >= 0 of the polynomial staleness weight.
    """

    name = "fedasync"
    mixing = "star"
    pattern: Pattern = "upload"
    carries = Carries(scalars=frozenset({"version"}))
    model = staticmethod(ADPSGD.model)
    step = staticmethod(ADPSGD.step)  # a local step

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
        self, state: ServerState, model: torch.Tensor, version: float, share: float, workers: int
    ) -> ServerState:
        """One upload at the server, of a worker that started from ``version``: ``(1 - a) x
        + a x_worker``, ``a = alpha (1 + tau)^-staleness_power``, and a new version
        (``share`` and ``workers`` unused: FedAsync weighs by staleness alone).

        Raises:
            ProtocolError: a version that is not a whole number in ``[0, state.version]``
                (:func:`staleness`), a model of another shape or not finite, or a mix that
                is not finite. ``state`` is unchanged.
        """
        tau = staleness(state, version)
        _finite("the worker's model", model, tuple(state.x.shape))
        a = float(self.alpha * (1.0 + tau) ** -self.power)
        x = (1.0 - a) * state.x + a * model
        _finite("the mix of the worker's model", x)
        return ServerState(x, state.version + 1)


def staleness(state: ServerState, version: float) -> int:
    """``tau``: the server's versions since the one an upload started from, ``version``
    (what the worker sent), checked first: a whole number from 0 to the server's own (a
    worker's version came from the server; one ahead of it, or fractional, is no
    worker's).

    Raises:
        ProtocolError: any other ``version``.
    """
    why = f"the versions this server ({state.version}) has made so far"
    return state.version - whole_number("version", version, 0, state.version, why)


def example_shares(parts: Any, workers: torch.Tensor) -> torch.Tensor:
    """``[N]`` float64: each worker's examples over the workers' mean (0 for a server):
    FedBuff weighs an update by it, as FedAvg weighs a worker's model (1 for equal parts)."""
    held = torch.tensor([float(len(p)) for p in parts], dtype=torch.float64) * workers
    return held * int(workers.sum()) / held.sum().clamp(min=1.0)
