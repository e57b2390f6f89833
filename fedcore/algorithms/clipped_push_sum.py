"""Clipped push-sum: Online Push-Sum that bounds what a lying in-neighbour can do, on a
directed graph (a fedcore rule; no library offers a Byzantine-robust push-sum).

Push-sum mixes shares ``(s_j, w_j) = W_ji (x_j, omega_j)`` whose ratio ``s_j / w_j`` is the
sender's de-biased model. A Byzantine sender can lie in the value (a far model) or in the
weight (``inflate``: a large ``w_j`` drags the receiver's de-biased model towards its own
value; ``withhold``: mass lost). The receiver ``i`` checks each arrived share against its
own estimate ``z_i = x_i / omega_i``, in de-biased space:

    z_j  = s_j / w_j                                    (the sender's model)
    z_j' = z_i + clip(z_j - z_i, tau_i)                 clip(v, t) = v min(1, t / ||v||)
    w_j' = clamp(w_j, W_ji / kappa, W_ji kappa)          (a unit of mass: the mean weight)
    share = (w_j' z_j', w_j')  if clipped or clamped, else (s_j, w_j) exactly

    x_i   <- W_ii x_i + sum_j share_x,   omega_i <- W_ii omega_i + sum_j share_w

so a share within the radius and the weight range passes unchanged (honest identical inputs
are untouched, and mass is conserved when nothing is clipped), while a lie moves the
receiver's de-biased model by at most ``w_j' tau_i / omega_i'`` per share, and no share
weighs more than ``kappa`` times a unit of mass's (so a peer's weight stays below about
``kappa`` however the liars inflate theirs). On a digraph whose honest push-sum weights
stray further than ``kappa`` from 1 (a skewed stationary distribution), honest shares are
clamped too: raise ``kappa``. ``tau``: a fixed radius, or ``0`` (the
default) for each receiver's median distance to its arrived shares (the lower median), so
the farther half is clipped to the nearer half's reach.

The guarantee is **empirical**: no theorem bounds push-sum's de-biased error under this rule
on a general digraph (clipping breaks the column-stochastic mass exactly when it acts);
``docs/robustness.md`` reports what it does against the attacks of ``[adversary]``, weight
inflation and withheld mass among them.
"""

from __future__ import annotations

import math

import torch

from fedcore.algorithms.ops import PushSumRule, PushSumState, _silent_after
from fedcore.algorithms.rule import Rows, SenderRows, Slot
from fedcore.errors import ConfigError
from fedcore.gradients import row_reduce

__all__ = ["ClippedPushSum", "ClippedPushSumRule"]

_WIDE = torch.float64
_TINY = 1e-300


class ClippedPushSumRule(PushSumRule):
    """Push-sum with de-biased clipping and clamped share weights (module docstring).

    Args:
        tau: The clipping radius (``> 0``), or ``0`` for each receiver's median distance.
        kappa: How far (a factor, ``>= 1``) a share's weight may stray from ``W_ji``
            (a unit of mass's share) before it is clamped.
        step_scale: As :class:`~fedcore.algorithms.ops.PushSumRule`'s.
    """

    name = "clipped-push-sum"

    def __init__(self, tau: float = 0.0, kappa: float = 4.0, step_scale: str = "none") -> None:
        """Check and keep the options."""
        super().__init__(step_scale)
        for key, value, low in (("tau", tau, 0.0), ("kappa", kappa, 1.0)):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not math.isfinite(value) or value < low:
                raise ConfigError(
                    f"algorithm.{key} for 'clipped-push-sum' must be a finite number >= "
                    f"{low:g}, got {value!r}."
                )
        self.tau = float(tau)
        self.kappa = float(kappa)

    def __repr__(self) -> str:
        """Show the options."""
        return f"ClippedPushSumRule(tau={self.tau}, kappa={self.kappa})"

    def mix(
        self, state: PushSumState, phase: int, inbox: list[Slot], rows: Rows
    ) -> tuple[PushSumState, None]:
        """Keep the own share, add each arrived share clipped and clamped (see the module
        docstring; a missing one is lost mass, as plain push-sum's). Each slot is worked
        on the rows it reached only, row by row the same arithmetic on any engine."""
        holding = self._holding(state, rows)
        own = rows.self_weight
        if holding is not None:
            own = torch.where(holding, torch.ones_like(own), own)
        dtype = state.x.dtype
        z_i = state.x / state.omega.to(dtype).unsqueeze(1)
        views = [self._view(slot, z_i) for slot in inbox]
        radius = self._radius(views, inbox, state.omega.shape[0], state.omega.device)
        x = state.x * own.to(dtype).unsqueeze(1)
        omega = state.omega * own
        ceiling = float(rows.n) if rows.n else math.inf  # a share is at most n
        heard = torch.zeros_like(state.silent, dtype=torch.bool)
        for slot, (at, share, delta, distance) in zip(inbox, views, strict=True):
            if at.numel() == 0:
                continue
            w = slot.scalars["omega"][at]
            ref = slot.weight[at].to(_WIDE)  # W_ji times a unit of mass (the mean weight)
            w_kept = torch.minimum(torch.maximum(w, ref / self.kappa), ref * self.kappa)
            w_kept = w_kept.clamp(max=ceiling)
            r = radius[at]
            factor = torch.where(distance > r, r / distance.clamp(min=_TINY), 1.0)
            reform = (factor < 1) | (w_kept != w)
            z = z_i[at] + delta * factor.to(dtype).unsqueeze(1)
            reformed = z * w_kept.to(dtype).unsqueeze(1)
            x.index_add_(0, at, torch.where(reform.unsqueeze(1), reformed, share))
            omega = omega.index_add(0, at, w_kept)
            heard[at] = True
        return PushSumState(x, omega, _silent_after(state.silent, heard, omega, rows)), None

    @staticmethod
    def _view(
        slot: Slot, z_i: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(at, s_j, z_j - z_i, ||z_j - z_i||)`` over the rows ``at`` that the slot's
        share reached (its weight positive), in the model's dtype (the norm float64)."""
        w = slot.scalars["omega"]
        at = torch.nonzero(slot.arrived & (w > 0)).squeeze(1)
        tensors = slot.tensors
        if isinstance(tensors, SenderRows):  # only the rows it reached, read where they are
            share = tensors.stack("x").index_select(0, tensors.rows("x")[at])
        else:
            share = tensors["x"].index_select(0, at)
        delta = share / w[at].to(share.dtype).unsqueeze(1) - z_i.index_select(0, at)
        length = int(delta.shape[1])
        norm = row_reduce(delta, length, lambda t: torch.linalg.vector_norm(t, dim=-1))
        return at, share, delta, norm.to(_WIDE)

    def _radius(
        self,
        views: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
        inbox: list[Slot],
        b: int,
        device: torch.device,
    ) -> torch.Tensor:
        """``[B]``: ``tau``, or each row's lower median distance to its arrived shares
        (``inf`` for a row that heard nobody)."""
        if self.tau > 0 or not inbox:
            tau = self.tau if self.tau > 0 else math.inf
            return torch.full((b,), tau, dtype=_WIDE, device=device)
        distances = torch.full((b, len(views)), math.inf, dtype=_WIDE, device=device)
        for k, (at, _, _, norm) in enumerate(views):
            distances[at, k] = norm
        ordered = torch.sort(distances, dim=1).values
        count = torch.isfinite(distances).sum(dim=1)
        pick = ((count - 1).clamp(min=0) // 2).unsqueeze(1)
        return ordered.gather(1, pick).squeeze(1)


def ClippedPushSum(
    tau: float = 0.0, kappa: float = 4.0, step_scale: str = "none"
) -> ClippedPushSumRule:
    """Clipped push-sum (:class:`ClippedPushSumRule`)."""
    return ClippedPushSumRule(tau, kappa, step_scale)
