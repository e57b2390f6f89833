"""Shared fixtures and the hypothesis profile (deterministic, no deadline on CI)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from tests import dockerd

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


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the tests that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the docker tests last, and start their daemon and image build now, in the
    background (minutes of debootstrap and torch install that the other tests cover)."""
    docker = [item for item in items if item.get_closest_marker("docker")]
    if docker and not config.option.collectonly:
        items[:] = [item for item in items if not item.get_closest_marker("docker")] + docker
        dockerd.prepare()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    dockerd.shutdown()  # a daemon started here that no test stopped (an early -x exit)
