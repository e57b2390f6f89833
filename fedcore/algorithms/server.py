"""The server family on a star trust graph: FedAvg (FedAvgM, FedAdam).

A parameter server is one more peer: the ``star`` graph (``topology.kind = "star"``) has
workers ``n0 .. n{N-1}`` and a server (``topology.server``) with edges both ways to every
worker. The server holds no data and never trains (its ``trains`` is false, so its node
computes no gradient); the model it holds is the global model, which is what a run's
"average model" figures report. Every round has two phases: workers to the server (phase
0), the server to workers (phase 1). Each rule below names its paper.

**FedAvg** (McMahan, Moore, Ramage, Hampson, Aguera y Arcas, AISTATS 2017)::

    S_t  = the seeded sample of round t: m = max(1, round(C N)) workers    # every peer alike
    worker k in S_t:  K local steps from its model (run.local_steps; the node's optimizer),
                      send (x_k, n_k) to the server                          # phase 0
    server:           xbar = sum_k n_k x_k / sum_k n_k over what arrived     # float64 sum
                      x <- xbar                           (server_optimizer "sgd", lr 1)
                      x <- x - opt(x - xbar)              (FedAvgM / FedAdam otherwise)
                      send x to every worker of S_{t+1}                       # phase 1
    worker k in S_{t+1}: x_k <- x

``n_k`` is the worker's number of training examples. The sample is a pure function of
``(seed, t)`` (the run seed), so every peer on every transport computes the same one and
nobody waits for a worker that was not sampled. ``sampler`` says how it is drawn:
``"sha256"`` (the default): a SHA-256 key per worker, the m smallest (O(N) a round);
``"floyd"``: Floyd's algorithm over m keyed draws of :mod:`fedcore.counter_random`
(:func:`sample_indices`: O(m) a round, what a population of millions needs).

**Between rounds** a worker that is not sampled does nothing: no gradient, no message,
its model unchanged. A worker holds the global model from the round before each round it
is sampled in (the server sends it only to the next round's sample); otherwise its model is
the one it last trained or last received, which is what its per-node figures measure.

**Lost messages** (a fault plan, deadline mode): the server averages the models that
arrived (weights renormalised over them); if none arrived, the global model stays. A
worker whose global model did not arrive trains from the model it holds. Nothing else
depends on a message, so no state can disagree between peers.

**With a node optimizer** (``[optimizer]``), a worker's local steps (and its last, the
algorithm's step) use its direction ``u`` where plain SGD uses ``lr * g``; the optimizer
state stays at the worker across the rounds it is not sampled in. The *server* optimizer
(``server_optimizer``: ``sgd``, ``momentum`` or ``adam``, with ``server_lr``) is separate:
it acts on the averaged difference ``x - xbar`` (Reddi et al., ICLR 2021).

**Robust aggregation** (``aggregator``, :mod:`fedcore.algorithms.aggregators`): the
server's ``xbar`` is the aggregator's value of the models that arrived instead of their
weighted mean (Krum, Multi-Krum, trimmed mean, median, geometric median, centered
clipping; bucketing or NNM first), and the server step above applies to it as it is. The
default ``"mean"`` is the weighted mean above, the same code and bits. A round whose
arrivals are too few for the aggregator's ``f`` keeps the global model (as when none
arrived) and is counted in :attr:`FedAvgRule.short_rounds`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from fedcore import registry
from fedcore.algorithms.aggregators import make_aggregator
from fedcore.algorithms.base import model_schema
from fedcore.algorithms.optim import Optimizer, keep_rows, make_optimizer
from fedcore.algorithms.rule import Gathered, Rows, Rule, Send
from fedcore.counter_random import MASK64, hash64_tensor, make_key
from fedcore.errors import ConfigError
from fedcore.messages import MessageSchema, ScalarSpec

logger = logging.getLogger(__name__)

__all__ = [
    "SAMPLERS",
    "FedAvg",
    "FedAvgRule",
    "FedAvgState",
    "cohort_size",
    "sample_indices",
    "sample_workers",
]

SAMPLERS = ("sha256", "floyd")
"""What ``algorithm.sampler`` may name (see the module docstring)."""

SERVER_OPTIMIZERS = registry.OPTIMIZERS.tagged("server")
"""What ``algorithm.server_optimizer`` may name."""

_SAMPLES = ScalarSpec(0.0, 2.0**53, "a worker's count of training examples")


def cohort_size(n: int, fraction: float) -> int:
    """How many of ``n`` workers a round samples: ``max(1, round(fraction * n))``, at most
    ``n``."""
    return max(1, min(n, round(fraction * n)))


def sample_indices(n: int, m: int, seed: int, t: int) -> list[int]:
    """``m`` distinct worker indices of ``0 .. n-1`` for round ``t``, ascending: Floyd's
    algorithm (each ``j`` of ``n-m .. n-1`` draws ``r`` uniform in ``0 .. j`` and takes
    ``r``, or ``j`` where ``r`` is taken already) over the keyed words ``hash64(key(seed),
    t, j)``. O(m) work and memory a round, a pure function of ``(n, m, seed, t)``."""
    if m >= n:
        return list(range(n))
    key = make_key("fedcore.fedavg.sample", seed)
    js = torch.arange(n - m, n, dtype=torch.int64)
    words = hash64_tensor(key, t, js).tolist()
    chosen: set[int] = set()
    for j, word in zip(js.tolist(), words, strict=True):
        r = (word & MASK64) % (j + 1)
        chosen.add(j if r in chosen else r)
    return sorted(chosen)


def sample_workers(
    workers: tuple[str, ...], fraction: float, seed: int, t: int, sampler: str = "sha256"
) -> set[str]:
    """The workers of round ``t``: ``m = max(1, round(fraction * N))`` of them, a pure
    function (every peer gets the same). ``sampler``: ``"sha256"``, the m whose SHA-256 key
    of ``(seed, t, id)`` is smallest; ``"floyd"``, those at :func:`sample_indices`."""
    m = cohort_size(len(workers), fraction)
    if sampler == "floyd":
        return {workers[i] for i in sample_indices(len(workers), m, seed, t)}
    if m >= len(workers):
        return set(workers)

    def key(worker: str) -> bytes:
        return hashlib.sha256(f"fedavg:{seed}:{t}:{worker}".encode()).digest()

    return set(sorted(workers, key=key)[:m])


class FedAvgState(NamedTuple):
    """Each row's model (a worker's own, or the server's global model) and the server
    optimizer's state over the rows (``None`` until the first server step)."""

    x: torch.Tensor
    server_opt: Any = None


class FedAvgRule(Rule):
    """FedAvg with client sampling and local steps (see the module docstring), one rule
    for every engine: the server is one more row, which holds no data.

    Args:
        server: The server's node id (``topology.server``).
        fraction: The fraction C of the workers sampled each round, in (0, 1].
        seed: The seed of the sample (the run seed).
        server_optimizer: ``"sgd"`` (plain FedAvg at ``server_lr = 1``), ``"momentum"``
            (FedAvgM) or ``"adam"`` (FedAdam), on the averaged difference.
        server_lr: The server optimizer's step size.
        server_momentum: ``momentum``'s coefficient.
        sampler: How the round's workers are drawn: ``"sha256"`` or ``"floyd"`` (see the
            module docstring).
        aggregator: What the server makes of the models that arrived: ``"mean"`` (the
            weighted mean) or a robust rule of :mod:`fedcore.algorithms.aggregators`.
        f, m, trim, bucket, nnm, iterations, tau, tolerance, nu: The aggregator's options
            (``None``: not set; each aggregator takes its own,
            :data:`~fedcore.algorithms.aggregators.OPTIONS`).
    """

    name = "fedavg"
    mixing = "star"
    phases = 2
    pattern = "chosen"

    def __init__(
        self,
        server: str = "server",
        fraction: float = 1.0,
        seed: int = 0,
        server_optimizer: str = "sgd",
        server_lr: float = 1.0,
        server_momentum: float = 0.9,
        sampler: str = "sha256",
        aggregator: str = "mean",
        f: int | None = None,
        m: int | None = None,
        trim: int | None = None,
        bucket: int | None = None,
        nnm: bool | None = None,
        iterations: int | None = None,
        tau: float | None = None,
        tolerance: float | None = None,
        nu: float | None = None,
    ) -> None:
        """Check the options."""
        if sampler not in SAMPLERS:
            hint = registry.did_you_mean(str(sampler), SAMPLERS)
            raise ConfigError(
                f"algorithm.sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}"
                + (f"; {hint}" if hint else ".")
            )
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ConfigError(f"algorithm.fraction must be a number, got {fraction!r}.")
        if not 0 < fraction <= 1:
            raise ConfigError(f"algorithm.fraction must be in (0, 1], got {fraction}.")
        if server_optimizer not in SERVER_OPTIMIZERS:
            hint = registry.did_you_mean(server_optimizer, SERVER_OPTIMIZERS)
            raise ConfigError(
                f"algorithm.server_optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}, "
                f"got {server_optimizer!r}" + (f"; {hint}" if hint else ".")
            )
        if isinstance(server_lr, bool) or not isinstance(server_lr, int | float):
            raise ConfigError(f"algorithm.server_lr must be a number, got {server_lr!r}.")
        if not 0 <= server_lr < float("inf"):
            raise ConfigError(f"algorithm.server_lr must be finite and >= 0, got {server_lr}.")
        self.server: str = server
        self.fraction = float(fraction)
        self.seed = int(seed)
        self.server_optimizer = server_optimizer
        self.server_lr = float(server_lr)
        self.sampler = sampler
        options: dict[str, Any] = {}
        if server_optimizer == "momentum":
            options["momentum"] = server_momentum
        self._opt: Optimizer | None = (
            None
            if server_optimizer == "sgd" and self.server_lr == 1.0
            else make_optimizer(server_optimizer, **options)
        )
        self.aggregator = make_aggregator(
            aggregator,
            seed=self.seed,
            f=f,
            m=m,
            trim=trim,
            bucket=bucket,
            nnm=nnm,
            iterations=iterations,
            tau=tau,
            tolerance=tolerance,
            nu=nu,
        )
        self.short_rounds = 0
        """Rounds whose arrived models were too few for the aggregator (the server kept
        its model), counted here; the 1st, 2nd, 4th, 8th ... logged (a warning: the run
        summary's ``warnings``, with the count so far)."""
        self._samples: dict[tuple[int, int], tuple[tuple[str, ...], set[str]]] = {}
        self._masks: dict[tuple[tuple[str, ...], int], torch.Tensor] = {}

    def check_workers(self, workers: int) -> None:
        """Refuse a run of ``workers`` workers whose cohort is too small for the
        aggregator's ``f`` (at set-up, when the config is known).

        Raises:
            ConfigError: in one line, what the aggregator needs.
        """
        k = cohort_size(workers, self.fraction)
        self.aggregator.check(
            k, f"a cohort of {k}: algorithm.fraction = {self.fraction} of {workers} workers"
        )

    # -- who does what ---------------------------------------------------------------------

    def sample(self, nodes: tuple[str, ...], t: int) -> set[str]:
        """The workers sampled in round ``t`` (cached: the last few rounds)."""
        key = (id(nodes), t)  # the run's node tuple; checked to be that very tuple below
        cached = self._samples.get(key)
        if cached is not None and cached[0] is nodes:
            return cached[1]
        if len(self._samples) > 8:
            self._samples.clear()
        workers = tuple(v for v in nodes if v != self.server)
        chosen = sample_workers(workers, self.fraction, self.seed, t, self.sampler)
        self._samples[key] = (nodes, chosen)
        return chosen

    def _sampled(self, rows: Rows, t: int) -> torch.Tensor:
        """``[B]`` bool: the rows that are workers sampled in round ``t``."""
        key = (rows.ids, t)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) > 8:
                self._masks.clear()
            chosen = self.sample(rows.nodes, t)
            mask = self._masks[key] = torch.tensor(
                [v in chosen for v in rows.ids], dtype=torch.bool, device=rows.samples.device
            )
        return mask

    def _server_row(self, rows: Rows) -> torch.Tensor:
        key = (rows.ids, -1)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = torch.tensor(
                [v == self.server for v in rows.ids], dtype=torch.bool, device=rows.samples.device
            )
        return mask

    def trains(self, rows: Rows) -> torch.Tensor:
        """``[B]`` bool: the rows that take local steps this round (sampled workers)."""
        return self._sampled(rows, rows.round)

    def talks(self, phase: int, rows: Rows) -> tuple[set[str], set[str]]:
        """Phase 0: the round's sample to the server; phase 1: the server to the next
        round's sample."""
        if phase == 0:
            return self.sample(rows.nodes, rows.round), {self.server}
        return {self.server}, self.sample(rows.nodes, rows.round + 1)

    # -- the rule --------------------------------------------------------------------------

    def init(self, params: torch.Tensor) -> FedAvgState:
        """Every row starts from ``params`` (the server's global model too)."""
        return FedAvgState(params.clone(), None)

    def model(self, state: FedAvgState) -> torch.Tensor:
        """The workers' models and the server's global model."""
        return state.x

    def step(self, state: FedAvgState, grad: torch.Tensor, rows: Rows) -> tuple[FedAvgState, Send]:
        """A sampled worker's last local step, and its model and example count for the
        server (only sampled workers send: :meth:`talks`)."""
        training = self.trains(rows)
        x = _where_rows(
            training.unsqueeze(1),
            state.x,
            lambda r: state.x - rows.lr * grad if r is None else state.x[r] - rows.lr * grad[r],
        )
        samples = rows.samples.clamp(min=1.0)
        return FedAvgState(x, state.server_opt), Send({"x": x}, {"samples": samples})

    def schema(self, phase: int) -> MessageSchema:
        """Phase 0: a worker's model ``"x"`` and its example count ``"samples"``; phase 1:
        the global model ``"x"``."""
        if phase == 0:
            return model_schema("x", samples=_SAMPLES)
        return model_schema("x")

    def mix(
        self, state: FedAvgState, phase: int, inbox: Gathered, rows: Rows
    ) -> tuple[FedAvgState, Send | None]:
        """Phase 0 at the server: the weighted average of what arrived (float64, in sorted
        worker order), the server step, and the global model for the next round's sample.
        Phase 1 at a worker: take the global model if it arrived."""
        heard = inbox.heard().unsqueeze(1)
        if phase == 1:
            x = _where_rows(heard, state.x, lambda rows: inbox.total("x", rows=rows))
            return FedAvgState(x, state.server_opt), None
        x, opt = state.x, state.server_opt
        if self.aggregator.robust:
            average, heard = self._robust(x, inbox, heard, rows.round)
        else:
            weight = inbox.scalar_total("samples").clamp(min=1.0).unsqueeze(1)

            def mean(rows: torch.Tensor | None) -> torch.Tensor:
                total = inbox.total("x", weight="samples", dtype=torch.float64, rows=rows)
                return (total / (weight if rows is None else weight[rows])).to(x.dtype)

            average = _where_rows(heard, x, mean)
        if self._opt is None:
            x = average
        elif bool(heard.any()):
            before = opt if opt is not None else self._opt.init(x)
            u, after = self._opt.update(x - average, before, x, self.server_lr)
            x = torch.where(heard, x - u, x)
            opt = keep_rows(heard.squeeze(1), after, before)
        return FedAvgState(x, opt), Send({"x": x})

    def _robust(
        self, x: torch.Tensor, inbox: Gathered, heard: torch.Tensor, t: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(the aggregate of each row that heard (the others' x), [B, 1] the rows it
        replaced)``: the aggregator over each row's arrived models in graph order of their
        senders (whatever order an engine lists them in); a row whose arrivals are too few
        keeps its model (counted, :attr:`short_rounds`)."""
        out = x.clone()
        took = heard.clone()
        values: torch.Tensor | None = None
        for r in heard.squeeze(1).nonzero().squeeze(1).tolist():
            picked = (inbox.dst == r).nonzero().squeeze(1)
            senders = None
            if inbox.src is not None:
                senders, order = torch.sort(inbox.src[picked], stable=True)
                picked = picked[order]
            why = self.aggregator.short(int(picked.numel()))
            if why is not None:
                took[r] = False
                self.short_rounds += 1
                if self.short_rounds & (self.short_rounds - 1) == 0:  # 1, 2, 4, 8, ...
                    logger.warning(
                        "round %d: the server kept its model (%d such round(s) so far): %s",
                        t,
                        self.short_rounds,
                        why,
                    )
                continue
            if values is None:
                values = inbox.tensors["x"]
            points = values.index_select(0, picked)
            out[r] = self.aggregator(points, x[r], t, senders).to(x.dtype)
        return out, took


FedAvg = FedAvgRule


def _where_rows(
    selected: torch.Tensor,
    x: torch.Tensor,
    value: Callable[[torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """``torch.where(selected, value(None), x)`` (``selected`` ``[B, 1]`` bool: the rows
    that heard, or that train), without a pass over the whole stack for the select:
    ``value(rows)`` is those rows of ``value(None)``, the same bits. Few rows selected (a
    server's one row among its workers'): ``x`` with those rows computed; most (the
    workers): every row computed, and the others put back from ``x``."""
    mask = selected.squeeze(1)
    rows = mask.nonzero().squeeze(1)
    if rows.numel() == mask.numel():
        return value(None)
    if 2 * rows.numel() <= mask.numel():
        out = x.clone()
        if rows.numel():
            out[rows] = value(rows)
        return out
    out = value(None)
    others = (~mask).nonzero().squeeze(1)
    out[others] = x[others]
    return out
