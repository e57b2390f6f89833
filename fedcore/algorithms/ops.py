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

**Robust push-sum** (``robust=True``; a fedcore extension, after Hadjicostis, Vaidya and
Dominguez-Garcia, "Robust distributed average consensus via exchange of running sums",
IEEE TAC 2016). Node ``i`` also keeps, per
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
unscaled step then throws its model far off (measured when robust push-sum came in: one
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
from typing import NamedTuple

import torch

from fedcore.algorithms.base import RoundContext, model_schema
from fedcore.algorithms.rule import EdgeInbox, Edges, Rows, Rule, Send, Slot
from fedcore.errors import AlgorithmError, ConfigError, ProtocolError
from fedcore.messages import MessageSchema, Payload, ScalarSpec

__all__ = [
    "ISOLATED_AFTER",
    "OPS",
    "STEP_SCALES",
    "PushSumRule",
    "PushSumState",
    "RobustOPSState",
    "RobustPushSumRule",
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


@functools.lru_cache(maxsize=16)
def _share_schema(n: float, *names: str) -> MessageSchema:
    """Plain push-sum's message: ``"x"`` (or the tensors ``names``) and a share ``"omega"``
    in ``(0, n]``."""
    return model_schema(
        *(names or ("x",)),
        omega=ScalarSpec(0.0, n * _SLACK, f"a share of a push-sum weight of {n} nodes"),
    )


class RobustOPSState(NamedTuple):
    """Robust push-sum state of ``B`` peers: the push-sum fields of :class:`PushSumState`,
    and running totals per edge of the run's graphs (float64; empty before the first
    step, as every edge's totals start at 0).

    Attributes:
        sent_x, sent_omega: ``[Eo, d]`` and ``[Eo]``: per out-edge, the totals pushed on it
            so far (``sigma``).
        seen_x, seen_omega: ``[Ei, d]`` and ``[Ei]``: per in-edge, the last totals applied
            from it (``rho``).
    """

    x: torch.Tensor
    omega: torch.Tensor
    silent: torch.Tensor
    sent_x: torch.Tensor
    sent_omega: torch.Tensor
    seen_x: torch.Tensor
    seen_omega: torch.Tensor


def _check_options(robust: object, step_scale: object, name: str = "ops") -> None:
    if not isinstance(robust, bool):
        raise ConfigError(f"algorithm.robust for {name!r} must be true or false, not {robust!r}.")
    if step_scale not in STEP_SCALES:
        raise ConfigError(
            f"algorithm.step_scale for {name!r} is {step_scale!r}; use one of "
            f"{', '.join(repr(s) for s in STEP_SCALES)} ('omega' scales the step by the "
            "push-sum weight, a step of lr on the de-biased model)."
        )


class PushSumState(NamedTuple):
    """``B`` peers' push-sum numerators ``x [B, d]``, weights ``omega [B]`` (float64) and
    rounds in a row with no share from any expected in-neighbour (``silent [B]``)."""

    x: torch.Tensor
    omega: torch.Tensor
    silent: torch.Tensor


class PushSumRule(Rule):
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
    holds_in_deadline_mode = True
    """A silent peer holds its pushes in deadline mode (``Send.to``), which only the
    message engine models (:func:`fedcore.engines.vectorized.unsupported`)."""

    def __init__(self, step_scale: str = "none") -> None:
        """Check and keep the option."""
        _check_options(False, step_scale, self.name)
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

    def _own(self, state: PushSumState, rows: Rows) -> torch.Tensor:
        """``[B]`` float64: the share of its own value each row keeps (all of it while it
        holds: it pushed nothing)."""
        holding = self._holding(state, rows)
        own = rows.self_weight
        if holding is not None:
            own = torch.where(holding, torch.ones_like(own), own)
        return own

    def mix(
        self, state: PushSumState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[PushSumState, None]:
        """Keep the own share, add the shares that arrived (a missing one is lost mass)."""
        own = self._own(state, rows)
        dtype = state.x.dtype
        x = state.x * own.to(dtype).unsqueeze(1)
        omega = state.omega * own
        heard = torch.zeros_like(state.silent, dtype=torch.bool)
        for slot in inbox:
            x.addcmul_(slot.tensors["x"], slot.arrived.to(dtype).unsqueeze(1))
            omega = omega + torch.where(slot.arrived, slot.scalars["omega"], 0.0)
            heard = heard | slot.arrived
        return PushSumState(x, omega, _silent_after(state.silent, heard, omega, rows)), None


class RobustPushSumRule(PushSumRule):
    """Robust Online Push-Sum, one rule for every engine: running totals per edge (the
    module docstring states the update, its precision and what a receiver accepts).

    Args:
        step_scale: As :class:`PushSumRule`'s.
    """

    pattern = "edges"
    robust = True
    edge_fields: Mapping[str, str] = {
        "sent_x": "out",
        "sent_omega": "out",
        "seen_x": "in",
        "seen_omega": "in",
    }
    """The state kept per edge (the vectorized engine keeps a crashed peer's)."""

    def __init__(self, step_scale: str = "none") -> None:
        """Check and keep the option."""
        super().__init__(step_scale)
        self._dtype: torch.dtype | None = None  # the model's, learnt by init()

    def __repr__(self) -> str:
        """Show the option."""
        return f"RobustPushSumRule(step_scale={self.step_scale!r})"

    def init(self, params: torch.Tensor) -> RobustOPSState:  # type: ignore[override]
        """``x = params``, ``omega = 1``, no totals yet."""
        self._dtype = params.dtype
        plain = super().init(params)
        edges = params.new_zeros((0, params.shape[1]), dtype=_TOTAL)
        scalars = params.new_zeros(0, dtype=_TOTAL)
        return RobustOPSState(*plain, edges, scalars, edges.clone(), scalars.clone())

    def _wire_is_float64(self, rows: Rows) -> bool:
        return self._dtype == torch.float64 and rows.codec in ("", "raw")

    def step(  # type: ignore[override]
        self, state: RobustOPSState, grad: torch.Tensor, rows: Rows
    ) -> tuple[RobustOPSState, Send]:
        """Gradient step on the numerator, then add each out-edge's share to its totals
        and send them; the peer keeps what its totals did not grow by. A holding peer
        pushes nothing."""
        edges = _edges(rows)
        holding = self._holding(state, rows)  # type: ignore[arg-type]
        x_half = self._step(state, grad, rows, holding)  # type: ignore[arg-type]
        d = x_half.shape[1]
        sent_x, sent_omega = state.sent_x, state.sent_omega
        if sent_omega.shape[0] != edges.out_row.shape[0]:  # the first step: every total 0
            sent_x = x_half.new_zeros((edges.out_row.shape[0], d), dtype=_TOTAL)
            sent_omega = sent_x.new_zeros(edges.out_row.shape[0])
        live = edges.out_live
        if holding is not None:
            live = live & ~holding[edges.out_row]
        x64 = x_half.to(_TOTAL)
        w = edges.out_weight
        new_x = torch.where(live.unsqueeze(1), sent_x + w.unsqueeze(1) * x64[edges.out_row], sent_x)
        new_omega = torch.where(live, sent_omega + w * state.omega[edges.out_row], sent_omega)
        # What the peer keeps: x_half minus exactly what its totals grew by.
        kept = (x64 - edges.out_total(new_x - sent_x)).to(x_half.dtype)
        kept_omega = state.omega - edges.out_total(new_omega - sent_omega)
        # The wire: "x" the total in the model's dtype, "x_lo" what the decoded "x" misses.
        hi = rows.compress_edges(new_x.to(x_half.dtype), live)
        tensors = {"x": hi}
        if not self._wire_is_float64(rows):
            tensors["x_lo"] = rows.compress_edges((new_x - hi.to(_TOTAL)).to(x_half.dtype), live)
        new = RobustOPSState(
            kept, kept_omega, state.silent, new_x, new_omega, state.seen_x, state.seen_omega
        )
        return new, Send(tensors, {"omega": new_omega}, to=None if holding is None else ~holding)

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """``"x"`` (and ``"x_lo"`` unless the wire carries float64) and ``"omega"``, a
        total in ``(0, n (t + 1)]`` at round ``t``."""
        if self._dtype is None:
            raise AlgorithmError("OPS does not know the model's dtype yet: call init() first.")
        n = rows.n or math.inf
        total = ScalarSpec(
            0.0,
            n * (rows.round + 1) * _SLACK,
            f"an omega-total grows by at most the {n} nodes' mass a round",
        )
        if self._wire_is_float64(rows):
            return model_schema("x", omega=total)
        return model_schema("x", "x_lo", omega=total)

    def accept(
        self, state: RobustOPSState, phase: int, sender: str, payload: Payload, ctx: RoundContext
    ) -> None:
        """Refuse an omega-total smaller than the last one applied on its edge.

        Raises:
            ProtocolError: the total went backwards.
        """
        if isinstance(state, RobustOPSState):
            omega = float(payload.scalars["omega"])
            _refuse_backwards(state.seen_omega, "omega-total", sender, omega, ctx)

    def mix(  # type: ignore[override]
        self, state: RobustOPSState, phase: int, inbox: EdgeInbox, rows: Rows
    ) -> tuple[RobustOPSState, None]:
        """Add what each arrived total carries beyond the last one applied on its edge
        (in float64, in sender order, rounded into ``x`` once); a missing total waits for
        the next one on its edge, an older one is ignored."""
        edges = _edges(rows)
        d = state.x.shape[1]
        seen_x, seen_omega = state.seen_x, state.seen_omega
        if seen_omega.shape[0] != edges.in_row.shape[0]:
            seen_x = state.x.new_zeros((edges.in_row.shape[0], d), dtype=_TOTAL)
            seen_omega = seen_x.new_zeros(edges.in_row.shape[0])
        total = inbox.tensors["x"].to(_TOTAL)
        if "x_lo" in inbox.tensors:
            total = total + inbox.tensors["x_lo"].to(_TOTAL)
        omega_total = inbox.scalars["omega"]
        fresh = inbox.arrived & (omega_total >= seen_omega)
        gained = edges.in_total(torch.where(fresh.unsqueeze(1), total - seen_x, 0.0))
        gained_omega = edges.in_total(torch.where(fresh, omega_total - seen_omega, 0.0))
        x = (state.x.to(_TOTAL) + gained).to(state.x.dtype)
        omega = state.omega + gained_omega
        heard = edges.in_total(inbox.arrived.to(_TOTAL)) > 0
        silent = _silent_after(state.silent, heard, omega, rows)
        return RobustOPSState(
            x,
            omega,
            silent,
            state.sent_x,
            state.sent_omega,
            torch.where(fresh.unsqueeze(1), total, seen_x),
            torch.where(fresh, omega_total, seen_omega),
        ), None


def _refuse_backwards(
    seen: torch.Tensor, what: str, sender: str, value: float, ctx: RoundContext
) -> None:
    """Refuse a running total ``value`` from ``sender`` smaller than the last one applied
    on its in-edge (``seen``, per in-edge of the union; empty before the first mix, when
    nothing is refused).

    Raises:
        ProtocolError: the total went backwards.
    """
    senders = ctx.in_union or tuple(sorted(ctx.in_weights))
    if seen.shape[0] != len(senders):
        return
    last = float(seen[senders.index(sender)])
    if value < last:
        raise ProtocolError(
            f"its {what} {value!r} is smaller than the {last!r} already applied on that edge "
            "(running totals never go backwards)."
        )


def _silent_after(
    silent: torch.Tensor, heard: torch.Tensor, omega: torch.Tensor, rows: Rows
) -> torch.Tensor:
    """The rounds in a row with no share from an expected in-neighbour after this one
    (reset by any share, unchanged with no in-neighbour this round); stop the run if a
    push-sum weight is no longer positive."""
    rows.check(
        ~(omega > 0),
        "node {node}: its push-sum weight is no longer positive after round {round}; it "
        "must stay positive. Give every node a positive self weight.",
    )
    expected = rows.in_degree > 0
    return torch.where(heard, 0, torch.where(expected, silent + 1, silent))


def _edges(rows: Rows) -> Edges:
    if rows.edges is None:
        raise AlgorithmError("robust OPS keeps totals per edge: run it with its edges.")
    return rows.edges


def OPS(robust: bool = False, step_scale: str = "none") -> PushSumRule:
    """Online Push-Sum: ``robust = false`` is the rule :class:`PushSumRule`, ``robust = true``
    the running-totals rule :class:`RobustPushSumRule` (two separate rules behind one name).

    Raises:
        ConfigError: ``robust`` is not a bool or ``step_scale`` is unknown.
    """
    _check_options(robust, step_scale)
    if robust:
        return RobustPushSumRule(step_scale)
    return PushSumRule(step_scale)
