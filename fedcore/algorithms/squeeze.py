"""Two-pass error-compensated compression on a star: DoubleSqueeze and APMSqueeze.

Both belong to the server family (:mod:`fedcore.algorithms.server`): a ``star`` trust
graph of workers and a server (``topology.server``) that holds no data and never trains
(its ``trains`` is false, so its node passes a zero gradient). Every round has two phases:
workers to the server (phase 0), the server to every worker (phase 1). Every node, the
server included, holds the model; the server's is the global model. Everything that is
compressed goes through the node's codec (``RoundContext.codec``, ``compression.codec``)
inside the algorithm, which keeps exactly the value receivers decode, so the error
memories account for every bit the codec drops. Each rule below names its paper; the
star and its two phases are :mod:`fedcore.algorithms.server`'s.

**DoubleSqueeze** (Tang, Lian, Yu, Zhang, Liu, ICML 2019)::

    worker i:  v_i = lr g_i + delta_i;  send C[v_i];  delta_i <- v_i - C[v_i]     # phase 0
    server:    v = mean over arrived of C[v_i] + delta_s
               send C[v] to every worker;  delta_s <- v - C[v]                    # phase 1
    everyone:  x <- x - C[v]                       (the server too: the global model)

The step size sits inside ``v_i`` (the memories are in units of model steps), so with
the identity codec (``fp32`` for float32 models, ``raw``) the memories stay zero and every
node takes ``x <- x - lr * mean_i g_i``: parameter-server SGD, step by step. With a node
optimizer (``[optimizer]``) its direction ``u`` replaces ``lr g_i``. ``error_feedback =
false`` keeps no memories (plain two-pass compression, ``v_i = lr g_i``, ``v = mean
C[v_i]``): the baseline the paper compares against.

**APMSqueeze** (Tang, Gan, Rajbhandari, Lian, Liu, He, Zhang, arXiv 2008.11343): Adam
during ``precondition_rounds`` full-precision rounds, then momentum SGD preconditioned by
the frozen second moment, with DoubleSqueeze's two-pass compression of the momentum::

    t < T (T = precondition_rounds):  worker i sends g_i at full precision ("raw")
        server: gbar = mean over arrived of g_i
                m <- b1 m + (1 - b1) gbar;  v <- b2 v + (1 - b2) gbar^2
                x <- x - lr (m / (1 - b1^(t+1))) / (sqrt(v / (1 - b2^(t+1))) + eps)
                send (x, m, v) at full precision;  every worker adopts them
    t >= T:  v frozen (vhat = v / (1 - b2^T))
        worker i: m_i = b1 m + (1 - b1) g_i;  mhat_i = C[m_i + delta_i]
                  delta_i <- m_i + delta_i - mhat_i;  send mhat_i
        server:   u = mean over arrived of mhat_i + deltabar;  mbar = C[u]
                  deltabar <- u - mbar;  send mbar
        everyone: m <- mbar;  x <- x - lr (mbar / (1 - b1^(t+1))) / (sqrt(vhat) + eps)

Adam's bias corrections use the round index, the same on every node. With the identity
codec the compressed rounds are momentum SGD preconditioned by the frozen ``vhat``. The
warm-up messages bypass the node's codec: the algorithm encodes them itself with the
lossless ``raw`` codec (the node sends an already encoded tensor as it is, and receivers
decode it by the codec it names), so every node holds the same Adam moments. The warm-up
broadcast carries the server's model and moments (three model-sized tensors, during the
``T`` warm-up rounds only) rather than ``gbar``, so a worker that misses one rejoins
exactly at the next: what it needs is the last one, which holds the ``v`` that is
frozen. APMSqueeze is itself the optimizer: a node optimizer (``[optimizer]`` other than
plain SGD) is refused, as its direction would stand in for the gradient; the step size is
the round's ``algorithm.lr``. A coordinate whose frozen ``vhat`` is 0 (an input never active in the
warm-up) steps by ``lr * mbar / eps``, and one whose ``vhat`` is tiny amplifies the
codec's error there: harmless with codecs that keep zeros (``qsgd``, ``topk``) on such
inputs, large with ``sign``, which sends every coordinate; raise ``algorithm.eps`` then.

**Lost messages** (a fault plan, deadline mode): the server averages what arrived (over
the arrived count; with nothing arrived the mean is zero, so DoubleSqueeze's server still
sends ``C[delta_s]`` and APMSqueeze's ``C[deltabar]``).
A worker whose message was lost has that round's contribution lost with it (it cannot
know); its memory already holds ``v_i - C[v_i]``. A worker that misses the broadcast
keeps its model (APMSqueeze: and its own ``m_i`` in place of ``mbar``) and lags the
global model by that step for good: the broadcasts are steps, not models. (APMSqueeze's
warm-up broadcasts are the server's state, so there a worker catches up at the next one;
a worker that misses the *last* warm-up broadcast keeps its own older ``v`` for good, and
a coordinate that is 0 in it but not in ``mbar`` steps by ``lr * mbar / eps``: such a
worker can diverge, and the run stops with an AlgorithmError naming it; the warm-up needs
reliable links, as in the paper.) No state disagrees otherwise, and the error memories
stay consistent whatever is lost: each side's memory depends only on what that side
itself compressed, so on each worker and on the server ``sum of sent values + current
memory == sum of intended values`` holds every round. With nothing arrived at the server
in warm-up, its Adam step uses a zero gradient.

Both take one step a round (``run.local_steps = 1``): the compressed value is that round's
step. Both are rules (:mod:`fedcore.algorithms.rule`): the server is one more row, which
holds no data, so both run on every engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from fedcore.algorithms.base import model_schema
from fedcore.algorithms.rule import Gathered, Rows, Rule, Send
from fedcore.compression import RawCodec
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.messages import MessageSchema

__all__ = [
    "APMSqueeze",
    "APMSqueezeRule",
    "APMSqueezeState",
    "DoubleSqueeze",
    "DoubleSqueezeRule",
    "DoubleSqueezeState",
]

_RAW = RawCodec()


class DoubleSqueezeState(NamedTuple):
    """The model ``x`` and the error memory ``delta`` (a worker's ``delta_i``, the
    server's ``delta_s``)."""

    x: torch.Tensor
    delta: torch.Tensor


class APMSqueezeState(NamedTuple):
    """The model ``x``, the shared first moment ``m`` (a worker's own ``m_i`` between its
    step and the broadcast), the second moment ``v`` (frozen after the warm-up) and the
    error memory ``delta`` (``delta_i``, or the server's ``deltabar``)."""

    x: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor
    delta: torch.Tensor


def _one_step(name: str) -> AlgorithmError:
    return AlgorithmError(
        f"algorithm {name!r} compresses one step a round: set run.local_steps = 1."
    )


class _StarRule(Rule):
    """Who sends what to whom on the star (shared by both rules): the server is one more
    row, which holds no data."""

    mixing = "star"
    phases = 2
    pattern = "chosen"
    server: str

    def __init__(self, server: str) -> None:
        self._rows: dict[tuple[str, ...], torch.Tensor] = {}
        self.server = server

    def _server_row(self, rows: Rows) -> torch.Tensor:
        """``[B]`` bool: the server's row."""
        mask = self._rows.get(rows.ids)
        if mask is None:
            if len(self._rows) > 4:
                self._rows.clear()
            mask = self._rows[rows.ids] = torch.tensor(
                [v == self.server for v in rows.ids], dtype=torch.bool, device=rows.samples.device
            )
        return mask

    def trains(self, rows: Rows) -> torch.Tensor:
        """Every worker trains every round; the server never does."""
        return ~self._server_row(rows)

    def talks(self, phase: int, rows: Rows) -> tuple[Any, Any]:
        """Phase 0: every worker to the server; phase 1: the server to every worker."""
        workers = _Others(self.server)
        if phase == 0:
            return workers, {self.server}
        return {self.server}, workers


def _mean(inbox: Gathered, name: str, like: torch.Tensor) -> torch.Tensor:
    """Per row, the mean of tensor ``name`` over what arrived (float64 sum, one message
    after another); zero where nothing did."""
    count = torch.bincount(inbox.dst, minlength=inbox.b).to(torch.float64).clamp(min=1.0)
    return (inbox.total(name, dtype=torch.float64) / count.unsqueeze(1)).to(like.dtype)


def _check_server(name: str, server: object) -> str:
    if not isinstance(server, str) or not server:
        raise ConfigError(f"algorithm {name!r}: server must be a node id, got {server!r}.")
    return server


class DoubleSqueezeRule(_StarRule):
    """DoubleSqueeze (see the module docstring), one rule for every engine: the server is
    one more row, which holds no data.

    Args:
        server: The server's node id (``topology.server``).
        error_feedback: Keep the error memories (false: plain two-pass compression).
    """

    name = "doublesqueeze"

    def __init__(self, server: str = "server", error_feedback: bool = True) -> None:
        """Check the options."""
        super().__init__(_check_server(self.name, server))
        if not isinstance(error_feedback, bool):
            raise ConfigError(
                f"algorithm.error_feedback must be true or false, got {error_feedback!r}."
            )
        self.error_feedback = error_feedback

    def init(self, params: torch.Tensor) -> DoubleSqueezeState:
        """Every row starts from ``params`` with no compression error."""
        return DoubleSqueezeState(params.clone(), torch.zeros_like(params))

    def model(self, state: DoubleSqueezeState) -> torch.Tensor:
        """The workers' models and the server's global model."""
        return state.x

    def local_step(self, state: DoubleSqueezeState, grad: torch.Tensor, rows: Rows) -> Any:
        """Refused: the compressed value is the round's one step."""
        raise _one_step(self.name)

    def schema(self, phase: int) -> MessageSchema:
        """A compressed step ``"c"`` in either phase, nothing else."""
        return model_schema("c")

    def _squeeze(
        self, v: torch.Tensor, where: torch.Tensor, rows: Rows
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(C[v], new memory)`` on the rows ``where`` says: ``C[v]`` is exactly what
        receivers decode."""
        c = rows.compress(v, where)
        delta = v - c if self.error_feedback else torch.zeros_like(v)
        return c, delta

    def step(
        self, state: DoubleSqueezeState, grad: torch.Tensor, rows: Rows
    ) -> tuple[DoubleSqueezeState, Send]:
        """Each worker compresses its error-compensated step for the server (the server's
        row sends nothing in phase 0: :meth:`talks`)."""
        workers = ~self._server_row(rows)
        v = rows.lr * grad + state.delta if self.error_feedback else rows.lr * grad
        c, delta = self._squeeze(v, workers, rows)
        delta = torch.where(workers.unsqueeze(1), delta, state.delta)
        return DoubleSqueezeState(state.x, delta), Send({"c": c})

    def mix(
        self, state: DoubleSqueezeState, phase: int, inbox: Gathered, rows: Rows
    ) -> tuple[DoubleSqueezeState, Send | None]:
        """Phase 0 at the server: average what arrived (float64), compensate, compress,
        step, broadcast. Phase 1 at a worker: step by the broadcast if it arrived."""
        heard = inbox.heard().unsqueeze(1)
        if phase == 1:
            x = torch.where(heard, state.x - inbox.total("c"), state.x)
            return DoubleSqueezeState(x, state.delta), None
        server = self._server_row(rows)
        mean = _mean(inbox, "c", state.x)
        v = mean + state.delta if self.error_feedback else mean
        c, delta = self._squeeze(v, server, rows)
        on = server.unsqueeze(1)
        x = torch.where(on, state.x - c, state.x)
        delta = torch.where(on, delta, state.delta)
        return DoubleSqueezeState(x, delta), Send({"c": c})


class _Others:
    """Every node id but one (a set-like view: ``v in others``)."""

    def __init__(self, but: str) -> None:
        self.but = but

    def __contains__(self, node: object) -> bool:
        return node != self.but


DoubleSqueeze = DoubleSqueezeRule


def _check_betas(betas: object) -> tuple[float, float]:
    ok = (
        isinstance(betas, Sequence)
        and not isinstance(betas, str)
        and len(betas) == 2
        and all(isinstance(b, int | float) and not isinstance(b, bool) for b in betas)
        and all(0 <= b < 1 for b in betas)
    )
    if not ok:
        raise ConfigError(
            f"algorithm.betas must be two numbers in [0, 1), e.g. [0.9, 0.999], got {betas!r}."
        )
    assert isinstance(betas, Sequence)
    return float(betas[0]), float(betas[1])


class APMSqueezeRule(_StarRule):
    """APMSqueeze (see the module docstring), one rule for every engine.

    Args:
        server: The server's node id (``topology.server``).
        precondition_rounds: Full-precision Adam rounds ``T`` before ``v`` is frozen (>= 1).
        betas: Adam's ``(b1, b2)``.
        eps: Adam's ``eps`` (> 0).
    """

    name = "apmsqueeze"
    is_optimizer = True
    """Adam, then momentum on the frozen second moment: no node optimizer besides."""

    def __init__(
        self,
        server: str = "server",
        precondition_rounds: int = 10,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        """Check the options."""
        super().__init__(_check_server(self.name, server))
        if (
            isinstance(precondition_rounds, bool)
            or not isinstance(precondition_rounds, int)
            or precondition_rounds < 1
        ):
            raise ConfigError(
                "algorithm.precondition_rounds must be a whole number >= 1 (the full-precision "
                f"Adam rounds that estimate the frozen second moment), got {precondition_rounds!r}."
            )
        self.precondition_rounds = precondition_rounds
        self.betas = _check_betas(betas)
        number = isinstance(eps, int | float) and not isinstance(eps, bool)
        if not number or not 0 < eps < math.inf:
            raise ConfigError(f"algorithm.eps must be a finite number > 0, got {eps!r}.")
        self.eps = float(eps)

    def warming_up(self, t: int) -> bool:
        """Whether round ``t`` is a full-precision Adam round."""
        return t < self.precondition_rounds

    def init(self, params: torch.Tensor) -> APMSqueezeState:
        """Every row starts from ``params`` with zero moments and no compression error."""
        zero = torch.zeros_like(params)
        return APMSqueezeState(params.clone(), zero, zero.clone(), zero.clone())

    def model(self, state: APMSqueezeState) -> torch.Tensor:
        """The workers' models and the server's global model."""
        return state.x

    def local_step(self, state: APMSqueezeState, grad: torch.Tensor, rows: Rows) -> Any:
        """Refused: the compressed momentum is the round's one step."""
        raise _one_step(self.name)

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """Warm-up: a worker's gradient ``"g"``, the server's ``"m"``, ``"v"`` and ``"x"``.
        Afterwards a compressed momentum ``"m"`` in either phase."""
        if not self.warming_up(rows.round):
            return model_schema("m")
        return model_schema("g") if phase == 0 else model_schema("m", "v", "x")

    def lossless(self, phase: int, rows: Rows) -> bool:
        """The warm-up's messages go as they are (``raw``), whatever the peers' codec."""
        return self.warming_up(rows.round)

    def step(
        self, state: APMSqueezeState, grad: torch.Tensor, rows: Rows
    ) -> tuple[APMSqueezeState, Send]:
        """A worker sends its gradient at full precision (warm-up) or its compressed,
        error-compensated momentum (the server's row sends nothing in phase 0)."""
        if self.warming_up(rows.round):
            return state, Send({"g": grad})
        workers = ~self._server_row(rows)
        b1 = self.betas[0]
        m = b1 * state.m + (1 - b1) * grad
        u = m + state.delta
        mhat = rows.compress(u, workers)
        on = workers.unsqueeze(1)
        new = state._replace(
            m=torch.where(on, m, state.m), delta=torch.where(on, u - mhat, state.delta)
        )
        return new, Send({"m": mhat})

    def _descend(
        self, x: torch.Tensor, m: torch.Tensor, v: torch.Tensor, rows: Rows
    ) -> torch.Tensor:
        """``x - lr (m / (1 - b1^(t+1))) / (sqrt(vhat) + eps)``."""
        b1, b2 = self.betas
        steps = min(rows.round + 1, self.precondition_rounds)
        mh = m / (1 - b1 ** (rows.round + 1))
        vh = v / (1 - b2**steps)
        return x - rows.lr * mh / (vh.sqrt() + self.eps)

    def mix(
        self, state: APMSqueezeState, phase: int, inbox: Gathered, rows: Rows
    ) -> tuple[APMSqueezeState, Send | None]:
        """Phase 0 at the server: average what arrived; warm-up: Adam, then broadcast the
        model and moments; afterwards compress, step and broadcast ``mbar``. Phase 1 at a
        worker: adopt the broadcast state (warm-up) or take the same step, if it arrived."""
        warm = self.warming_up(rows.round)
        if phase == 1:
            heard = inbox.heard().unsqueeze(1)
            if warm:
                x, m, v = (inbox.total(k) for k in ("x", "m", "v"))
                return APMSqueezeState(
                    torch.where(heard, x, state.x),
                    torch.where(heard, m, state.m),
                    torch.where(heard, v, state.v),
                    state.delta,
                ), None
            mbar = inbox.total("m")
            x = self._descend(state.x, mbar, state.v, rows)
            return state._replace(
                x=torch.where(heard, x, state.x), m=torch.where(heard, mbar, state.m)
            ), None
        on = self._server_row(rows).unsqueeze(1)
        if warm:
            g = _mean(inbox, "g", state.x)
            b1, b2 = self.betas
            m = b1 * state.m + (1 - b1) * g
            v = b2 * state.v + (1 - b2) * g * g
            x = self._descend(state.x, m, v, rows)
            new = APMSqueezeState(
                torch.where(on, x, state.x),
                torch.where(on, m, state.m),
                torch.where(on, v, state.v),
                state.delta,
            )
            return new, Send({"m": new.m, "v": new.v, "x": new.x})
        u = _mean(inbox, "m", state.x) + state.delta
        mbar = rows.compress(u, on.squeeze(1))
        x = self._descend(state.x, mbar, state.v, rows)
        new = state._replace(
            x=torch.where(on, x, state.x),
            m=torch.where(on, mbar, state.m),
            delta=torch.where(on, u - mbar, state.delta),
        )
        return new, Send({"m": mbar})


APMSqueeze = APMSqueezeRule
