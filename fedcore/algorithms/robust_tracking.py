"""Running-sum forms of the gradient-tracking rules (``algorithm.robust = true``): a lost
message no longer breaks the trackers' sum.

In every tracking rule (:mod:`fedcore.algorithms.tracking`) the tracker ``y`` is mixed by a
column-stochastic ``C``, and ``sum_i y_i = sum_i g_i`` (the latest gradients) holds only while
every tracker share arrives: a lost one is lost mass, the sum breaks by it for good, and the
peers settle at a biased point again. The running-sum form (as robust push-sum,
:mod:`fedcore.algorithms.ops`, after Hadjicostis, Vaidya and Dominguez-Garcia) makes a lost
message harmless as long as a later one on the same edge gets through. Peer ``i`` keeps, per
out-edge ``i -> j``, the running total ``sigma_ij`` of every share it ever pushed on it, and
per in-edge ``k -> i`` the last total ``rho_ki`` it applied (both start at 0)::

    sigma_ij += C_ji y_i ; send sigma_ij          # every out-edge of this round
    ybar_i    = what i did not push (C_ii y_i)
    for each total that arrived:  ybar_i += sigma_ki - rho_ki ;  rho_ki = sigma_ki

so ``sum_i ybar_i + sum_edges (sigma - rho) = sum_i y_i``: a dropped message's mass is only in
flight and arrives with the next message on its edge.

* ``dsgt`` and ``push-pull`` with ``robust = true`` (:class:`RobustTrackingRule`): the tracker
  as above; the model ``v = x - lr y`` goes as it is (``R``'s row of a missing one goes to the
  peer itself, as in the plain rules: no mass to lose). Beside them each message carries the
  scalar ``"shares"``, the running total of the weights ``C_ji`` pushed on its edge: it only
  grows, so a total older than the one already applied (a replayed message, a sender restarted
  from an older checkpoint) is refused or ignored, as robust push-sum does with its
  omega-totals.
* ``push-diging`` with ``robust = true`` (:class:`RobustPushDIGingRule`): robust push-sum
  (:class:`~fedcore.algorithms.ops.RobustPushSumRule`, step scale ``"none"``) whose step
  follows the tracker (``u - lr y``), its value ``u`` and weight ``omega`` as running totals,
  and the tracker's totals beside them on the same edges.

Precision and the wire follow robust push-sum's notes: the totals are float64 at both ends,
the sender keeps exactly what its totals did not grow by, and a total travels in the model's
dtype as ``"y"`` plus its low-order part ``"y_lo"`` unless the wire carries float64 exactly
(a float64 model, no codec or ``raw``; on a float32 model under 30% loss the quadratic of
``tests/algorithms/test_tracking.py`` ends 1e-6 from its optimum after 300 rounds and after
3,000 alike: no drift as the totals grow); a codec whose error is relative to the value
(top-k, rand-k) is refused (:attr:`~fedcore.algorithms.base.Traits.robust`). A robust message
thus holds three tensors (``v``, ``y``, ``y_lo``) for Push-Pull and DSGT, four for
Push-DIGing (``x``, ``x_lo``, ``y``, ``y_lo``); the state holds a float64 total per edge and
tensor at both of its ends. These rules keep state per edge: ``pattern = "edges"``, as
robust push-sum; a crashed peer's totals wait with it, and a partition's messages arrive
with the first ones after it. They run on the message and vectorized engines (bit for bit),
in virtual time, on ranks (``--ranks``: each rank keeps its peers' edges, as for robust
push-sum) and as real peers (``fedcore launch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from fedcore.algorithms.base import RoundContext, model_schema
from fedcore.algorithms.ops import (
    _SLACK,
    RobustOPSState,
    RobustPushSumRule,
    _edges,
    _refuse_backwards,
)
from fedcore.algorithms.rule import EdgeInbox, Edges, Rows, Rule, Send
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema, Payload, ScalarSpec

__all__ = [
    "RobustDSGTRule",
    "RobustPushDIGingRule",
    "RobustPushDIGingState",
    "RobustPushPullRule",
    "RobustTrackingRule",
    "RobustTrackingState",
    "one_step_refused",
]

_TOTAL = torch.float64


def one_step_refused(name: str) -> AlgorithmError:
    """Why a tracking rule takes no local steps (``run.local_steps > 1``)."""
    return AlgorithmError(
        f"{name!r} tracks the gradient at every model it sends: set run.local_steps = 1."
    )


# -- running totals, shared by the rules below ------------------------------------------


def _started(totals: torch.Tensor, count: int, like: torch.Tensor) -> torch.Tensor:
    """``totals``, or ``count`` zero totals (float64, ``like``'s trailing shape) before the
    first step, when no edge has any."""
    if totals.shape[0] == count:
        return totals
    return like.new_zeros((count, *like.shape[1:]), dtype=_TOTAL)


def _pushed(
    sent: torch.Tensor, value: torch.Tensor, edges: Edges, live: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(the out-edges' new totals, what each row keeps)``: each live out-edge's total
    grows by its share ``W_ij * value_i``, and the row keeps ``value`` minus exactly what
    its totals grew by (float64; equal to ``W_ii * value`` up to rounding), so its own
    arithmetic neither creates nor loses mass."""
    v64 = value.to(_TOTAL)
    grow = edges.out_weight.unsqueeze(1) * v64[edges.out_row]
    new = torch.where(live.unsqueeze(1), sent + grow, sent)
    return new, v64 - edges.out_total(new - sent)


def _on_wire(
    rows: Rows, name: str, total: torch.Tensor, dtype: torch.dtype, live: torch.Tensor, exact: bool
) -> dict[str, torch.Tensor]:
    """The totals as sent: ``name`` in ``dtype`` and, unless the wire carries float64
    (``exact``), ``name + "_lo"``, what the decoded high part misses."""
    hi = rows.compress_edges(total.to(dtype), live)
    if exact:
        return {name: hi}
    return {name: hi, f"{name}_lo": rows.compress_edges((total - hi.to(_TOTAL)).to(dtype), live)}


def _heard(inbox: EdgeInbox, name: str) -> torch.Tensor:
    """The totals ``name`` as received, float64 (high part plus low part)."""
    total = inbox.tensors[name].to(_TOTAL)
    low = inbox.tensors.get(f"{name}_lo")
    return total if low is None else total + low.to(_TOTAL)


def _applied(
    seen: torch.Tensor, total: torch.Tensor, fresh: torch.Tensor, edges: Edges
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per row, what the fresh totals carry beyond the last ones applied, the in-edges'
    last applied totals after this round)``."""
    where = fresh.unsqueeze(1)
    gained = edges.in_total(torch.where(where, total - seen, 0.0))
    return gained, torch.where(where, total, seen)


# -- DSGT and Push-Pull -----------------------------------------------------------------


class RobustTrackingState(NamedTuple):
    """``B`` peers' models ``x``, the trackers' mixed part ``ybar`` (after a step: what the
    peer kept of its tracker), the last gradients ``g`` (``[B, d]``), and per edge of the
    run's graphs (float64, empty before the first step): ``sent_y [Eo, d]`` and
    ``sent_n [Eo]``, the totals of the tracker shares and of their weights pushed so far,
    ``seen_y [Ei, d]`` and ``seen_n [Ei]``, the last ones applied."""

    x: torch.Tensor
    ybar: torch.Tensor
    g: torch.Tensor
    sent_y: torch.Tensor
    sent_n: torch.Tensor
    seen_y: torch.Tensor
    seen_n: torch.Tensor


class RobustTrackingRule(Rule):
    """The gradient-tracking update with the tracker as running totals per edge (the module
    docstring); a subclass says what ``R`` is."""

    phases = 1
    pattern = "edges"
    robust = True
    edge_fields: Mapping[str, str] = {
        "sent_y": "out",
        "sent_n": "out",
        "seen_y": "in",
        "seen_n": "in",
    }
    """The state kept per edge (the vectorized engine keeps a crashed peer's)."""

    def __init__(self) -> None:
        """No options but ``robust`` itself."""
        self._dtype: torch.dtype | None = None  # the model's, learnt by init()

    def __repr__(self) -> str:
        """The rule and its form."""
        return f"{type(self).__name__}()"

    def init(self, params: torch.Tensor) -> RobustTrackingState:
        """Start from ``params``, the tracker at zero, no totals yet."""
        self._dtype = params.dtype
        zero = torch.zeros_like(params)
        edges = params.new_zeros((0, params.shape[1]), dtype=_TOTAL)
        scalars = params.new_zeros(0, dtype=_TOTAL)
        return RobustTrackingState(
            params.clone(), zero, zero.clone(), edges, scalars, edges.clone(), scalars.clone()
        )

    def model(self, state: RobustTrackingState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def local_step(
        self, state: RobustTrackingState, grad: torch.Tensor, rows: Rows
    ) -> RobustTrackingState:
        """Refused: the tracker needs the gradient at every model it sends.

        Raises:
            AlgorithmError: always.
        """
        raise one_step_refused(self.name)

    def _exact_wire(self, rows: Rows) -> bool:
        return self._dtype == torch.float64 and rows.codec in ("", "raw")

    def step(
        self, state: RobustTrackingState, grad: torch.Tensor, rows: Rows
    ) -> tuple[RobustTrackingState, Send]:
        """Complete the tracker with the new gradient; push its shares onto the out-edges'
        totals and send them with ``v = x - lr y``; keep what was not pushed."""
        edges = _edges(rows)
        y = state.ybar + grad - state.g
        v = state.x - rows.lr * y
        live = edges.out_live
        count = edges.out_row.shape[0]
        sent_y = _started(state.sent_y, count, y)
        sent_n = _started(state.sent_n, count, state.sent_n)
        new_y, kept = _pushed(sent_y, y, edges, live)
        new_n = torch.where(live, sent_n + edges.out_weight, sent_n)
        tensors = {"v": rows.compress_edges(v[edges.out_row], live)}
        tensors.update(_on_wire(rows, "y", new_y, y.dtype, live, self._exact_wire(rows)))
        new = RobustTrackingState(
            v, kept.to(y.dtype), grad, new_y, new_n, state.seen_y, state.seen_n
        )
        return new, Send(tensors, {"shares": new_n})

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """The step's model ``"v"``, the tracker total ``"y"`` (and ``"y_lo"`` unless the
        wire carries float64) and ``"shares"``, a total in ``(0, t + 1]`` at round ``t``."""
        if self._dtype is None:
            raise AlgorithmError(f"{self.name!r} does not know the model's dtype: call init().")
        shares = ScalarSpec(
            0.0, (rows.round + 1) * _SLACK, "a total of shares grows by at most 1 a round"
        )
        if self._exact_wire(rows):
            return model_schema("v", "y", shares=shares)
        return model_schema("v", "y", "y_lo", shares=shares)

    def accept(
        self,
        state: RobustTrackingState,
        phase: int,
        sender: str,
        payload: Payload,
        ctx: RoundContext,
    ) -> None:
        """Refuse a shares-total smaller than the last one applied on its edge.

        Raises:
            ProtocolError: the total went backwards.
        """
        value = float(payload.scalars["shares"])
        _refuse_backwards(state.seen_n, "shares-total", sender, value, ctx)

    def mix(
        self, state: RobustTrackingState, phase: int, inbox: EdgeInbox, rows: Rows
    ) -> tuple[RobustTrackingState, None]:
        """``x <- R v`` over what arrived (a missing model's share to the peer itself);
        add what each fresh tracker total carries beyond the last one applied on its edge
        (a missing one waits for the next on its edge, an older one is ignored)."""
        edges = _edges(rows)
        count = edges.in_row.shape[0]
        seen_y = _started(state.seen_y, count, state.ybar)
        seen_n = _started(state.seen_n, count, state.seen_n)
        shares = inbox.scalars["shares"]
        fresh = inbox.arrived & (shares >= seen_n)
        gained, seen_y = _applied(seen_y, _heard(inbox, "y"), fresh, edges)
        ybar = (state.ybar.to(_TOTAL) + gained).to(state.ybar.dtype)
        x = self._pull(state.x, inbox, rows, edges)
        seen_n = torch.where(fresh, shares, seen_n)
        new = RobustTrackingState(x, ybar, state.g, state.sent_y, state.sent_n, seen_y, seen_n)
        return new, None

    def _weights(self, rows: Rows, edges: Edges) -> tuple[torch.Tensor, torch.Tensor]:
        """``(R_ij per in-edge [Ei], R_ii per row [B])``, float64."""
        raise NotImplementedError

    def _pull(self, v: torch.Tensor, inbox: EdgeInbox, rows: Rows, edges: Edges) -> torch.Tensor:
        """``sum_j R_ij v_j`` over what arrived, a missing one's share to the peer itself."""
        per_edge, own = self._weights(rows, edges)
        got = inbox.arrived & edges.in_live
        own = own + edges.in_total(torch.where(edges.in_live & ~got, per_edge, 0.0))
        coef = per_edge.to(v.dtype).unsqueeze(1)
        pulled = torch.where(got.unsqueeze(1), coef * inbox.tensors["v"], 0.0)
        return edges.in_total(pulled, start=v * own.to(v.dtype).unsqueeze(1))


class RobustDSGTRule(RobustTrackingRule):
    """DSGT with running totals: ``R = C = W`` (see the module docstring)."""

    name = "dsgt"
    mixing = "doubly-stochastic"

    def _weights(self, rows: Rows, edges: Edges) -> tuple[torch.Tensor, torch.Tensor]:
        return edges.in_weight, rows.self_weight


class RobustPushPullRule(RobustTrackingRule):
    """Push-Pull with running totals: ``R_ij = 1 / (in-degree_i + 1)``, ``C`` push-sum's
    shares (see the module docstring)."""

    name = "push-pull"
    mixing = "push-sum"

    def _weights(self, rows: Rows, edges: Edges) -> tuple[torch.Tensor, torch.Tensor]:
        r = 1.0 / (rows.in_degree.to(_TOTAL) + 1.0)
        return torch.where(edges.in_live, r[edges.in_row], 0.0), r


# -- Push-DIGing --------------------------------------------------------------------------


class RobustPushDIGingState(NamedTuple):
    """Robust push-sum's state (:class:`~fedcore.algorithms.ops.RobustOPSState`, its first
    seven fields: ``x`` is Push-DIGing's ``u``), the tracker's kept part ``ybar`` and the
    last gradients ``g`` (``[B, d]``), and the tracker's totals per out-edge ``sent_y`` and
    per in-edge ``seen_y`` (float64)."""

    x: torch.Tensor
    omega: torch.Tensor
    silent: torch.Tensor
    sent_x: torch.Tensor
    sent_omega: torch.Tensor
    seen_x: torch.Tensor
    seen_omega: torch.Tensor
    ybar: torch.Tensor
    g: torch.Tensor
    sent_y: torch.Tensor
    seen_y: torch.Tensor


def _ops(state: RobustPushDIGingState) -> RobustOPSState:
    return RobustOPSState(*state[:7])


class RobustPushDIGingRule(RobustPushSumRule):
    """Push-DIGing with running totals: robust push-sum stepping along the tracker, the
    tracker's totals beside ``u``'s and ``omega``'s (see the module docstring)."""

    name = "push-diging"
    edge_fields: Mapping[str, str] = {
        **RobustPushSumRule.edge_fields,
        "sent_y": "out",
        "seen_y": "in",
    }
    """The state kept per edge (the vectorized engine keeps a crashed peer's)."""
    edge_totals = 4  # sent and seen, of the value u and of the tracker y

    def __init__(self) -> None:
        """The paper's step on the numerator (step scale ``"none"``)."""
        super().__init__("none")

    def __repr__(self) -> str:
        """The rule and its form."""
        return "RobustPushDIGingRule()"

    def init(self, params: torch.Tensor) -> RobustPushDIGingState:  # type: ignore[override]
        """``u = params``, ``omega = 1``, the tracker at zero, no totals yet."""
        zero = torch.zeros_like(params)
        edges = params.new_zeros((0, params.shape[1]), dtype=_TOTAL)
        return RobustPushDIGingState(
            *super().init(params), zero, zero.clone(), edges, edges.clone()
        )

    def local_step(  # type: ignore[override]
        self, state: RobustPushDIGingState, grad: torch.Tensor, rows: Rows
    ) -> RobustPushDIGingState:
        """Refused: the tracker needs the gradient at every model it sends.

        Raises:
            AlgorithmError: always.
        """
        raise one_step_refused(self.name)

    def step(  # type: ignore[override]
        self, state: RobustPushDIGingState, grad: torch.Tensor, rows: Rows
    ) -> tuple[RobustPushDIGingState, Send]:
        """Complete the tracker; robust push-sum's step along it (``u - lr y``) and its
        totals; the tracker's shares onto its own totals on the same edges."""
        y = state.ybar + grad - state.g
        pushed, send = super().step(_ops(state), y, rows)
        edges = _edges(rows)
        holding = self._holding(_ops(state), rows)  # type: ignore[arg-type]
        live = edges.out_live if holding is None else edges.out_live & ~holding[edges.out_row]
        sent_y = _started(state.sent_y, edges.out_row.shape[0], y)
        new_y, kept = _pushed(sent_y, y, edges, live)
        tensors = {**send.tensors}
        tensors.update(_on_wire(rows, "y", new_y, y.dtype, live, self._wire_is_float64(rows)))
        new = RobustPushDIGingState(*pushed, kept.to(y.dtype), grad, new_y, state.seen_y)
        return new, Send(tensors, send.scalars, to=send.to)

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """Robust push-sum's ``"x"``, ``"x_lo"`` and ``"omega"``, and the tracker's total
        ``"y"`` (and ``"y_lo"``: both low parts unless the wire carries float64)."""
        base = super().schema(phase, rows)
        low = () if self._wire_is_float64(rows) else ("y_lo",)
        return model_schema(*base.tensors, "y", *low, **base.scalars)

    def accept(  # type: ignore[override]
        self,
        state: RobustPushDIGingState,
        phase: int,
        sender: str,
        payload: Payload,
        ctx: RoundContext,
    ) -> None:
        """Robust push-sum's: refuse an omega-total smaller than the last one applied.

        Raises:
            ProtocolError: the total went backwards.
        """
        if isinstance(state, RobustPushDIGingState):
            super().accept(_ops(state), phase, sender, payload, ctx)

    def mix(  # type: ignore[override]
        self, state: RobustPushDIGingState, phase: int, inbox: EdgeInbox, rows: Rows
    ) -> tuple[RobustPushDIGingState, None]:
        """Robust push-sum's mix of ``u`` and ``omega``; the tracker's fresh totals (those
        whose omega-total is fresh) added beyond the last ones applied."""
        edges = _edges(rows)
        count = edges.in_row.shape[0]
        seen_omega = _started(state.seen_omega, count, state.seen_omega)
        fresh = inbox.arrived & (inbox.scalars["omega"] >= seen_omega)
        mixed, _ = super().mix(_ops(state), phase, inbox, rows)
        seen_y = _started(state.seen_y, count, state.ybar)
        gained, seen_y = _applied(seen_y, _heard(inbox, "y"), fresh, edges)
        ybar = (state.ybar.to(_TOTAL) + gained).to(state.ybar.dtype)
        return RobustPushDIGingState(*mixed, ybar, state.g, state.sent_y, seen_y), None
