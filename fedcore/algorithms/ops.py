"""Online Push-Sum (OPS): online learning over one-way trust graphs, optionally robust.

He, Tan, Tang, Qiu, Liu, "Central Server Free Federated Learning over Single-sided
Trust Social Networks" (arXiv 1910.04956). Each node keeps a push-sum numerator ``x``,
a weight ``omega`` (initially 1) and predicts with the de-biased ``z = x / omega``.
Per round, with ``W_ij`` the share node ``i`` pushes to out-neighbour ``j``
(``sum_j W_ij = 1``, self included)::

    g        = grad f_i(z_i)                 # gradient at the de-biased point
    x_half_i = x_i - lr * g                  # the step acts on the numerator
    send (W_ij * x_half_i, W_ij * omega_i) to every out-neighbour j
    x_i      = W_ii * x_half_i + sum_k (received x shares)
    omega_i  = W_ii * omega_i  + sum_k (received omega shares)

Mass is conserved (``sum_i omega_i = n``, ``sum_i x_i`` moves only by the gradient
steps) as long as every message arrives. A lost message loses its mass: plain
push-sum then no longer reaches the true average. Works on any strongly connected digraph
with self-loops, and on a time-varying schedule (the weights of each round's graph are
used, and each round's inbox holds only that round's messages).

**Robust push-sum** (``robust=True``; reference/algorithms.md section 10, after
Hadjicostis, Vaidya and Dominguez-Garcia's running sums). Node ``i`` also keeps, per
out-edge ``i -> j``, the running totals ``sigma_ij`` of every x- and omega-share it ever
pushed on that edge, and per in-edge ``k -> i`` the last totals ``rho_ki`` it applied
(both start at 0, an edge's when it is first used)::

    x_half_i = x_i - lr * g
    sigma_ij += (W_ij * x_half_i, W_ij * omega_i); send sigma_ij to j   # every out-edge
    x_i, omega_i = what i did not push (W_ii * x_half_i, W_ii * omega_i)
    for each total sigma_ki that arrived:                               # any subset
        x_i += sigma_ki.x - rho_ki.x;  omega_i += sigma_ki.omega - rho_ki.omega
        rho_ki = sigma_ki

A lost message is harmless: the next total that gets through on the same edge carries
its mass. ``sum_i x_i + sum_edges (sigma - rho)`` is conserved (I-RPSUM-1; mass is only
ever in flight), and with ``lr = 0`` every ``z_i`` reaches the exact initial average under
independent message loss (I-RPSUM-2). An edge that is absent in a round (time-varying
graph) simply adds nothing to its totals; they wait for the edge to come back.

Precision of robust push-sum. The totals grow linearly with the rounds, so the bookkeeping
keeps rounding errors from growing with them:

* The sender keeps ``sigma`` in float64 and keeps at home exactly what its totals did not
  grow by (``x_half - sum_j (sigma_new - sigma_old)``, equal to ``W_ii * x_half`` up to
  rounding), so its own arithmetic neither creates nor loses mass, whatever the totals'
  size; the receiver applies differences of totals in float64, then rounds once into ``x``.
  Conservation therefore holds to the rounding of ``x`` itself: float64 rounding for a
  float64 model, float32 rounding (about ``1e-7`` relative per round, a random walk, as
  in plain OPS) for a float32 model. What does grow is the rounding of each share into its
  float64 total, ``~1e-16 |sigma|``: it perturbs the mixing (never the mass), so z errors
  of a few ``1e-12`` remain after 10,000 rounds.
* On the wire, the x-total travels in the model's dtype (the node checks every tensor's
  shape and dtype) as a tensor ``"x"``, plus, unless the wire carries float64 exactly
  (a float64 model with no codec or the ``raw`` codec), a low-order tensor ``"x_lo"``
  holding ``sigma - x`` as the receiver decodes ``x``. The receiver applies ``x + x_lo`` in
  float64, which matches ``sigma`` to about ``u**2 * |sigma|`` (``u`` the wire's unit
  roundoff: ``2**-24`` for float32, so ``~4e-15 |sigma|``). Sending only ``x`` would leave
  ``u * |sigma|`` of each edge's mass in flight, an error that grows with the rounds
  (a float32 z error of 3e-4 after 10,000 rounds, against 3e-7 with ``x_lo``). Robust mode
  thus sends two tensors per message for float32 models (twice plain OPS's bytes). When
  the node has a codec (``ctx.codec``), both tensors are encoded here, so the low part
  corrects exactly what the receivers decode (the default ``fp32`` codec on a float64
  model then gives float64-like totals); lossy codecs (qsgd, sign, top-k, rand-k) are a
  poor fit, since their error on a growing total grows with it: use ``raw`` or a cast codec.
* The omega-total travels as the scalar ``"omega"`` (scalars are float64 on the wire).
* No round number travels: the node delivers only the current round's messages. A total
  older than the one already applied on an edge (a smaller omega-total; omega-totals only
  grow) is ignored, so a replayed or reordered message cannot apply mass twice.

**A node whose in-neighbours all went silent** (deadline mode: they died, or a partition
cut them off) receives no share, and push-sum would have it give away
``1 - W_ii`` of its weight every round with nothing coming back: its weight decays
geometrically, the unscaled step ``lr * g / omega_i`` on ``z_i`` grows without bound and the
weight finally underflows to 0. So a node that heard from none of its expected in-neighbours
for ``ISOLATED_AFTER`` rounds in a row *holds*: it pushes nothing (its out-neighbours see
its message missing, as for any lost message) and keeps all of its mass, mixing with self
weight 1, and steps on its de-biased model at rate ``lr`` (``x -= lr * omega * g``, local
SGD on ``z``) whatever ``step_scale`` says. The first share that arrives ends the hold:
the node pushes again from the next round. Holding never creates mass, so the bounds below
stay true. Plain and robust OPS alike; with every message delivered it never happens. Only
in deadline mode (``RoundContext.deadline``), where receivers go on without a missing
message: in strict mode they would wait for the holding node's message for good, and a
strict node can only go silent through losses a fault plan announced.

**What a receiver accepts** (:meth:`OPS.message_schema`): exactly the tensor ``"x"``
(robust: and ``"x_lo"`` unless the wire carries float64) and the scalar ``"omega"``. The
network's total push-sum mass is ``n`` (one per node) and messages only ever lose some, so
no weight, and no share of one, exceeds ``n``: plain OPS refuses an omega outside
``(0, n]``. A robust omega-total grows by at most ``n`` a round, so it lies in
``(0, n (t + 1)]`` at round ``t``; and a total smaller than the last one applied on its edge
went backwards, which no honest sender's does (:meth:`OPS.accept` refuses it; a sender
restarted from an older checkpoint sends such totals until its own catch up, and those are
refused in the same way, which costs nothing: the next total that gets through carries
the mass). A small relative tolerance covers rounding.

**Step scaling** (``step_scale="omega"``, plain and robust alike). The step becomes
``x_half_i = x_i - lr * omega_i * g``, a step of ``lr`` on ``z_i = x_i / omega_i``,
instead of the paper's ``x_i - lr * g``, which moves ``z_i`` by ``lr * g / omega_i``. This
is fedcore's stabilization choice, not the paper's rule: under message loss a node whose
in-messages are lost several rounds in a row can see ``omega_i`` fall to ~1e-4, and the
unscaled step then throws its model far off (section 10 of reference/algorithms.md: one
seed collapsed to 46% accuracy at lr 0.3; scaled, 96.4% at 30% loss against 96.5% with no
loss). The price: ``sum_i x_i`` then moves by ``lr * sum_i omega_i * g_i``, so a fixed point
minimises the omega-weighted objective ``sum_i omega_i f_i``. Where the weights settle away
from 1 (a directed, non-regular graph) that is the Perron-weighted objective, not the plain
average of the ``f_i``: on a quadratic over ``social:8`` the nodes meet at the
Perron-weighted optimum, 0.2 away from the uniform one (tests/algorithms/
test_robust_push_sum.py). On regular digraphs (ring, exponential) the two coincide.

**With a node optimizer** (``[optimizer]``, :mod:`fedcore.algorithms.optim`): the
gradient is taken at ``z_i`` and the optimizer's direction ``u_i`` replaces ``lr * g`` on
the numerator (``x_half_i = x_i - u_i``, or ``x_i - omega_i * u_i`` with
``step_scale = "omega"``), as SGP does; the optimizer state stays at the node, so the mass
invariants hold unchanged and with ``u = 0`` (``lr = 0``) every ``z_i`` still reaches the
exact initial average.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from fedcore.algorithms.base import Inbox, Outbox, RoundContext, check_phase, model_schema
from fedcore.algorithms.rule import NodeRule, Rows, Send, Slot
from fedcore.compression import Codec
from fedcore.errors import AlgorithmError, ConfigError, ProtocolError
from fedcore.messages import EncodedTensor, MessageSchema, Payload, ScalarSpec

__all__ = [
    "ISOLATED_AFTER",
    "OPS",
    "STEP_SCALES",
    "EdgeTotal",
    "PushSumRule",
    "PushSumState",
    "RobustOPS",
    "RobustOPSState",
    "absorb_totals",
    "gradient_step",
    "push_totals",
    "read_total",
    "total_payload",
]

STEP_SCALES = ("none", "omega")
"""Values of OPS's ``step_scale`` option."""

_TOTAL = torch.float64
"""The dtype running totals are kept in."""

ISOLATED_AFTER = 8
"""Rounds in a row with no share from any expected in-neighbour after which a node holds
(see the module docstring). At 30% independent loss a node with one in-neighbour hears
nothing for 8 rounds in a row about once in 15,000 rounds; a dead neighbour, at once."""

_SLACK = 1 + 1e-9
"""Relative tolerance of the weight bounds (rounding of the weights themselves)."""


class EdgeTotal(NamedTuple):
    """Running totals of one edge: every x-share (float64) and omega-share pushed on it."""

    x: torch.Tensor
    omega: float


class RobustOPSState(NamedTuple):
    """Robust push-sum state.

    Attributes:
        x: Push-sum numerator, in the model's dtype.
        omega: Push-sum weight.
        sent: Out-neighbour -> the totals pushed on that edge so far (``sigma``).
        seen: In-neighbour -> the last totals applied from that edge (``rho``).
        silent: Rounds in a row with no total from any expected in-neighbour.
    """

    x: torch.Tensor
    omega: float
    sent: Mapping[str, EdgeTotal]
    seen: Mapping[str, EdgeTotal]
    silent: int = 0


@functools.lru_cache(maxsize=16)
def _share_schema(n: float) -> MessageSchema:
    """Plain push-sum's message: ``"x"`` and a share ``"omega"`` in ``(0, n]``."""
    return model_schema(
        "x", omega=ScalarSpec(0.0, n * _SLACK, f"a share of a push-sum weight of {n} nodes")
    )


def _holds(silent: int, ctx: RoundContext) -> bool:
    """Whether the node holds this round: deadline mode, and silent long enough."""
    return ctx.deadline and silent >= ISOLATED_AFTER


def _silent_after(silent: int, inbox: Inbox, ctx: RoundContext) -> int:
    """The new count of silent rounds: reset by any share, raised when none came although
    some in-neighbour was expected, unchanged in a round with no in-neighbours."""
    if inbox:
        return 0
    return silent + 1 if ctx.in_weights else silent


def gradient_step(
    x: torch.Tensor, omega: float, grad: torch.Tensor, lr: float, step_scale: str = "none"
) -> torch.Tensor:
    """The numerator after the local step: ``x - lr * g``, or ``x - lr * omega * g``.

    Args:
        x: Push-sum numerator.
        omega: Push-sum weight.
        grad: Gradient at ``z = x / omega``.
        lr: Step size.
        step_scale: ``"none"`` (the paper's rule) or ``"omega"`` (a step of ``lr`` on ``z``).
    """
    if step_scale == "omega":
        return x - (lr * omega) * grad
    return x - lr * grad


def push_totals(
    x: torch.Tensor, omega: float, sent: Mapping[str, EdgeTotal], out_weights: Mapping[str, float]
) -> tuple[torch.Tensor, float, dict[str, EdgeTotal]]:
    """Add this round's shares to the running totals of the out-edges.

    Args:
        x: Numerator after the local step.
        omega: Push-sum weight.
        sent: Out-neighbour -> totals so far (edges used for the first time start at 0).
        out_weights: This round's out-neighbour -> share.

    Returns:
        ``(x_kept, omega_kept, totals)``: what the node keeps (``x`` minus exactly what the
        float64 totals grew by, in ``x``'s dtype; ``W_ii * x`` up to rounding, as push-sum
        weights sum to 1) and every edge's totals (unchanged for edges absent this round).
    """
    x64 = x.to(_TOTAL)
    pushed_x: torch.Tensor | None = None
    pushed_omega = 0.0
    totals = dict(sent)
    for dst, w in out_weights.items():
        old = totals.get(dst)
        if old is None:
            new = EdgeTotal(w * x64, w * omega)
            delta_x, delta_omega = new.x, new.omega
        else:
            new = EdgeTotal(old.x + w * x64, old.omega + w * omega)
            # What the edge really carries more than before (exact by Sterbenz's lemma once
            # the total is large), so rounding inside the total never creates or loses mass.
            delta_x, delta_omega = new.x - old.x, new.omega - old.omega
        pushed_x = delta_x if pushed_x is None else pushed_x + delta_x
        pushed_omega += delta_omega
        totals[dst] = new
    kept = x if pushed_x is None else (x64 - pushed_x).to(x.dtype)
    return kept, omega - pushed_omega, totals


def _wire_is_float64(dtype: torch.dtype, codec: Codec | None) -> bool:
    return dtype == torch.float64 and (codec is None or codec.name == "raw")


def total_payload(total: EdgeTotal, dtype: torch.dtype, codec: Codec | None = None) -> Payload:
    """The message carrying one edge's totals, in the model's dtype.

    ``"x"`` is the x-total in ``dtype``; unless the wire carries float64 exactly,
    ``"x_lo"`` is the remainder ``total - x`` as receivers decode ``x``, so that
    ``x + x_lo`` (see :func:`read_total`) matches the total to about ``u**2 * |total|``.
    With a ``codec`` both tensors are encoded here, so the remainder is taken against
    exactly what receivers decode.

    Args:
        total: The edge's totals (x-total in float64).
        dtype: The model's dtype (what receivers accept).
        codec: The node's codec, or ``None`` for tensors sent as they are.
    """
    hi = total.x.to(dtype)
    tensors: dict[str, torch.Tensor | EncodedTensor] = {}
    if codec is None:
        tensors["x"] = hi
        decoded_hi = hi
    else:
        encoded = codec.encode(hi)
        tensors["x"] = encoded
        decoded_hi = codec.decode(encoded)
    if not _wire_is_float64(dtype, codec):
        lo = (total.x - decoded_hi.to(_TOTAL)).to(dtype)
        tensors["x_lo"] = lo if codec is None else codec.encode(lo)
    return Payload(tensors, {"omega": total.omega})


def read_total(sender: str, payload: Payload) -> EdgeTotal:
    """The totals a received payload carries, x-total in float64 (``x + x_lo``).

    Raises:
        AlgorithmError: the payload lacks ``"x"`` or ``"omega"``.
    """
    try:
        x = payload.tensor("x").to(_TOTAL, copy=True)
        omega = float(payload.scalars["omega"])
    except KeyError as exc:
        raise AlgorithmError(f"robust push-sum message from {sender!r} lacks {exc}.") from None
    if "x_lo" in payload.tensors:
        x = x + payload.tensor("x_lo").to(_TOTAL)
    return EdgeTotal(x, omega)


def absorb_totals(
    x: torch.Tensor, omega: float, seen: Mapping[str, EdgeTotal], inbox: Inbox
) -> tuple[torch.Tensor, float, dict[str, EdgeTotal]]:
    """Add what each arrived total carries beyond the last one applied on its edge.

    Differences are summed in float64 (sorted-sender order) and rounded into ``x``'s dtype
    once. A total older than the one already applied (smaller omega-total) is ignored.
    Inbox tensors are only read.

    Returns:
        ``(x, omega, seen)``: the new numerator, weight and last-applied totals.
    """
    gained: torch.Tensor | None = None
    gained_omega = 0.0
    new_seen = dict(seen)
    for sender, payload in inbox.items():
        total = read_total(sender, payload)
        last = new_seen.get(sender)
        if last is None:
            delta_x, delta_omega = total.x, total.omega
        elif total.omega >= last.omega:
            delta_x, delta_omega = total.x - last.x, total.omega - last.omega
        else:
            continue  # a stale (replayed or reordered) total: its mass is already in
        gained = delta_x if gained is None else gained + delta_x
        gained_omega += delta_omega
        new_seen[sender] = total
    if gained is None:
        return x, omega, new_seen
    return (x.to(_TOTAL) + gained).to(x.dtype), omega + gained_omega, new_seen


class RobustOPS:
    """Robust Online Push-Sum, per peer (see the module docstring for the update rules).

    Its running totals per edge are still kept twice: here per peer and in
    :class:`~fedcore.algorithms.batched.BatchedOPS` for the vectorized engine (a rule's
    :class:`~fedcore.algorithms.rule.Send` cannot yet say one message per out-edge); plain
    OPS is the one rule :class:`PushSumRule`.

    Args:
        robust: Must be true (plain push-sum is :class:`PushSumRule`).
        step_scale: ``"none"`` for the paper's step ``x -= lr * g``, ``"omega"`` for
            ``x -= lr * omega * g`` (a step of ``lr`` on ``z``; fedcore's stabilization
            under message loss, for plain and robust OPS alike).

    Raises:
        ConfigError: ``robust`` is not a bool or ``step_scale`` is unknown.
    """

    name = "ops"
    mixing = "push-sum"
    phases = 1

    def __init__(self, robust: bool = True, step_scale: str = "none") -> None:
        """Check and keep the options."""
        _check_options(robust, step_scale)
        if not robust:
            raise ConfigError("RobustOPS is robust push-sum; plain push-sum is PushSumRule.")
        self.robust = True
        self.step_scale = step_scale
        self._dtype: torch.dtype | None = None  # the model's, learnt by init()

    def __repr__(self) -> str:
        """Show the options."""
        return f"RobustOPS(robust={self.robust}, step_scale={self.step_scale!r})"

    def init(self, params: torch.Tensor) -> RobustOPSState:
        """Start from ``x = params`` and ``omega = 1`` (so ``z = params``), no totals."""
        self._dtype = params.dtype
        return RobustOPSState(params.clone(), 1.0, {}, {})

    def model(self, state: RobustOPSState) -> torch.Tensor:
        """The de-biased model ``z = x / omega``."""
        return state.x / state.omega

    def _robust_state(self, state: Any) -> RobustOPSState:
        if not isinstance(state, RobustOPSState):
            raise AlgorithmError(
                f"robust OPS was handed a {type(state).__name__}; build the state with "
                "init() of the same OPS(robust=True)."
            )
        return state

    def local_step(
        self, state: RobustOPSState, grad: torch.Tensor, ctx: RoundContext
    ) -> RobustOPSState:
        """A local step between communications: the round's step on the numerator (with
        the round's step scale), nothing pushed; the weight and the totals stay."""
        scale = "omega" if _holds(state.silent, ctx) else self.step_scale
        return state._replace(x=gradient_step(state.x, state.omega, grad, ctx.lr, scale))

    def step(
        self, state: RobustOPSState, grad: torch.Tensor, ctx: RoundContext
    ) -> tuple[RobustOPSState, Outbox]:
        """Gradient step on the numerator, then push the running totals: the state comes
        back reduced to the node's own share (the rest is in the totals). A holding node
        (silent in-neighbours) steps on ``z`` and sends nothing.
        """
        robust = self._robust_state(state)
        holding = _holds(state.silent, ctx)
        scale = "omega" if holding else self.step_scale
        x_half = gradient_step(state.x, state.omega, grad, ctx.lr, scale)
        if holding:
            return robust._replace(x=x_half), {}
        x, omega, sent = push_totals(x_half, robust.omega, robust.sent, ctx.out_weights)
        out = {dst: total_payload(sent[dst], x.dtype, ctx.codec) for dst in ctx.out_weights}
        return RobustOPSState(x, omega, sent, robust.seen, robust.silent), out

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Every in-neighbour of this round's graph."""
        return tuple(ctx.in_weights)

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """``"x"`` (and ``"x_lo"`` unless the wire carries float64) and ``"omega"``, a
        total in ``(0, n (t + 1)]`` at round ``t``."""
        check_phase(self.name, phase)
        n = len(ctx.nodes) if ctx.nodes else math.inf
        if self._dtype is None:
            raise AlgorithmError("OPS does not know the model's dtype yet: call init() first.")
        total = ScalarSpec(
            0.0,
            n * (ctx.round + 1) * _SLACK,
            f"an omega-total grows by at most the {n} nodes' mass a round",
        )
        if _wire_is_float64(self._dtype, ctx.codec):
            return model_schema("x", omega=total)
        return model_schema("x", "x_lo", omega=total)

    def accept(
        self,
        state: RobustOPSState,
        phase: int,
        sender: str,
        payload: Payload,
        ctx: RoundContext,
    ) -> None:
        """Refuse an omega-total smaller than the last one applied on its edge.

        Raises:
            ProtocolError: the total went backwards.
        """
        if not isinstance(state, RobustOPSState):
            return
        last = state.seen.get(sender)
        omega = float(payload.scalars["omega"])
        if last is not None and omega < last.omega:
            raise ProtocolError(
                f"its omega-total {omega!r} is smaller than the {last.omega!r} already applied "
                "on that edge (running totals never go backwards)."
            )

    def mix(
        self, state: RobustOPSState, phase: int, inbox: Inbox, ctx: RoundContext
    ) -> tuple[RobustOPSState, Outbox]:
        """Add what the arrived totals carry beyond the last applied (a missing one waits
        for the next total on its edge)."""
        silent = _silent_after(state.silent, inbox, ctx)
        robust = self._robust_state(state)
        x, omega, seen = absorb_totals(robust.x, robust.omega, robust.seen, inbox)
        new = RobustOPSState(x, omega, robust.sent, seen, silent)
        if not omega > 0.0:  # only reachable with a zero self weight or underflow
            raise AlgorithmError(
                f"node {ctx.node}: push-sum weight is {omega} after round {ctx.round}; "
                f"it must stay positive (self weight {ctx.self_weight}, {len(inbox)} shares "
                "received). Give every node a positive self weight."
            )
        return new, {}


def _check_options(robust: object, step_scale: object) -> None:
    if not isinstance(robust, bool):
        raise ConfigError(f"algorithm.robust for 'ops' must be true or false, not {robust!r}.")
    if step_scale not in STEP_SCALES:
        raise ConfigError(
            f"algorithm.step_scale for 'ops' is {step_scale!r}; use one of "
            f"{', '.join(repr(s) for s in STEP_SCALES)} ('omega' scales the step by the "
            "push-sum weight, a step of lr on the de-biased model)."
        )


class PushSumState(NamedTuple):
    """``B`` peers' push-sum numerators ``x [B, d]``, weights ``omega [B]`` (float64) and
    rounds in a row with no share from any expected in-neighbour (``silent [B]``)."""

    x: torch.Tensor
    omega: torch.Tensor
    silent: torch.Tensor


class PushSumRule:
    """Plain Online Push-Sum, one rule for every engine (the module docstring states the
    update, the hold rule of a silent peer and the step scale).

    Args:
        step_scale: ``"none"`` (the paper's ``x -= lr * g``) or ``"omega"``
            (``x -= lr * omega * g``, a step of ``lr`` on ``z``).
    """

    name = "ops"
    mixing = "push-sum"
    phases = 1
    pattern = "neighbours"
    robust = False

    def __init__(self, step_scale: str = "none") -> None:
        """Check and keep the option."""
        _check_options(False, step_scale)
        self.step_scale = step_scale

    def __repr__(self) -> str:
        """Show the option."""
        return f"PushSumRule(step_scale={self.step_scale!r})"

    def init(self, params: torch.Tensor) -> PushSumState:
        """``x = params``, ``omega = 1`` (so ``z = params``)."""
        b = params.shape[0]
        return PushSumState(
            params.clone(),
            torch.ones(b, dtype=_TOTAL, device=params.device),
            torch.zeros(b, dtype=torch.long, device=params.device),
        )

    def model(self, state: PushSumState) -> torch.Tensor:
        """The de-biased models ``z = x / omega``."""
        x: torch.Tensor = state.x / state.omega.to(state.x.dtype).unsqueeze(1)
        return x

    def _holding(self, state: PushSumState, rows: Rows) -> torch.Tensor | None:
        """Rows that hold this round (deadline mode, silent long enough), or None."""
        if not rows.deadline:
            return None
        holding = state.silent >= ISOLATED_AFTER
        return holding if bool(holding.any()) else None

    def _step(
        self, state: PushSumState, grad: torch.Tensor, rows: Rows, holding: torch.Tensor | None
    ) -> torch.Tensor:
        x = state.x
        if self.step_scale == "none" and holding is None:
            return x - rows.lr * grad
        scaled = rows.lr * state.omega
        if self.step_scale == "none":  # only the holding rows step on z
            scaled = torch.where(holding, scaled, torch.full_like(scaled, rows.lr))  # type: ignore[arg-type]
        return x - scaled.to(x.dtype).unsqueeze(1) * grad

    def local_step(self, state: PushSumState, grad: torch.Tensor, rows: Rows) -> PushSumState:
        """A local step between communications: the round's step on the numerator, nothing
        pushed; the weights stay."""
        return state._replace(x=self._step(state, grad, rows, self._holding(state, rows)))

    def step(
        self, state: PushSumState, grad: torch.Tensor, rows: Rows
    ) -> tuple[PushSumState, Send]:
        """Gradient step on the numerator, then push each out-neighbour its share; a
        holding peer pushes nothing."""
        holding = self._holding(state, rows)
        x_half = self._step(state, grad, rows, holding)
        send = Send(
            {"x": x_half},
            {"omega": state.omega},
            weighted=True,
            to=None if holding is None else ~holding,
        )
        return state._replace(x=x_half), send

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """``"x"`` and the share ``"omega"`` in ``(0, n]``."""
        return _share_schema(rows.n or math.inf)

    def mix(
        self, state: PushSumState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[PushSumState, None]:
        """Keep the own share, add the shares that arrived (a missing one is lost mass)."""
        holding = self._holding(state, rows)
        own = rows.self_weight
        if holding is not None:  # it pushed nothing: all of its mass is still its own
            own = torch.where(holding, torch.ones_like(own), own)
        dtype = state.x.dtype
        x = state.x * own.to(dtype).unsqueeze(1)
        omega = state.omega * own
        heard = torch.zeros_like(state.silent, dtype=torch.bool)
        for slot in inbox:
            x.addcmul_(slot.tensors["x"], slot.arrived.to(dtype).unsqueeze(1))
            omega = omega + torch.where(slot.arrived, slot.scalars["omega"], 0.0)
            heard = heard | slot.arrived
        expected = rows.in_degree > 0
        silent = torch.where(heard, 0, torch.where(expected, state.silent + 1, state.silent))
        rows.check(
            ~(omega > 0),
            "node {node}: its push-sum weight is no longer positive after round {round}; it "
            "must stay positive. Give every node a positive self weight.",
        )
        return PushSumState(x, omega, silent), None


def OPS(robust: bool = False, step_scale: str = "none") -> Any:
    """Online Push-Sum: ``robust = false`` is the rule :class:`PushSumRule`, ``robust = true``
    the running-totals form :class:`RobustOPS` (two separate rules behind one name).

    Raises:
        ConfigError: ``robust`` is not a bool or ``step_scale`` is unknown.
    """
    _check_options(robust, step_scale)
    if robust:
        return RobustOPS(robust=True, step_scale=step_scale)
    return NodeRule(PushSumRule(step_scale))


OPS.name = "ops"  # type: ignore[attr-defined]
OPS.mixing = "push-sum"  # type: ignore[attr-defined]
OPS.phases = 1  # type: ignore[attr-defined]
