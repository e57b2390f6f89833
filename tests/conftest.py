"""Shared fixtures and the hypothesis profile (deterministic, no deadline on CI)."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings

# Many tiny models: intra-op threads only add overhead (and contention on 2 cores).
torch.set_num_threads(1)

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
