"""Differential privacy: the accountant (:mod:`~fedcore.privacy.accountant`, Opacus's, from
the ``fedcore[dp]`` extra, imported on first use), DP-SGD on each peer
(:mod:`~fedcore.privacy.dpsgd`), user-level DP-FedAvg (:mod:`~fedcore.privacy.dpfedavg`)
and a private run's plan (:mod:`~fedcore.privacy.plan`)."""

from __future__ import annotations

from fedcore.privacy.accountant import (
    ACCOUNTANTS,
    DP_EXTRA,
    Mechanism,
    epsilon,
    last_step_within,
    noise_for,
    require_accountant,
)

__all__ = [
    "ACCOUNTANTS",
    "DP_EXTRA",
    "Mechanism",
    "epsilon",
    "last_step_within",
    "noise_for",
    "require_accountant",
]
