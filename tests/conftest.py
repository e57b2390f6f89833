"""Shared fixtures and the hypothesis profile (deterministic, no deadline on CI)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

from fedcore import plotting
from tests import dockerd

# Many tiny models: intra-op threads only add overhead (and contention on 2 cores).
torch.set_num_threads(1)

# A shell that starts a job in the background without job control (`pytest ... &` in a
# script) leaves SIGINT ignored, and every process the tests start would inherit that: the
# tests that interrupt a run with ctrl-c would then wait for a run that never stops. Take
# Python's own handler back; a child then starts with the default action, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_HANDOFF_KEY = "fedcore_docker_handoff"
_HANDOFF: Path | None = None  # in the xdist controller: where the docker outcome is written


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: the controller prepares docker
        dockerd.receive_from(Path(workerinput[_HANDOFF_KEY]))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """In the xdist controller: tell each worker where the docker hand-off will be."""
    global _HANDOFF
    if _HANDOFF is None:  # a preparation started before pytest, or one of this controller
        _HANDOFF = dockerd.ahead() or (
            Path(tempfile.mkdtemp(prefix="fedcore-docker-handoff-")) / "state.json"
        )
    node.workerinput[_HANDOFF_KEY] = str(_HANDOFF)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """In the xdist controller: a worker's collection (after deselection) holds docker
    tests, so start their daemon and images now, here, in the background."""
    if _HANDOFF is not None and any(i.startswith("tests/deploy/test_docker.py") for i in ids):
        dockerd.publish_to(_HANDOFF)


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the tests that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the docker tests last, and start their daemon and image build now, in the
    background (minutes of debootstrap and torch install that the other tests cover).
    Under xdist the controller starts it instead (above); the docker tests are one
    ``xdist_group``, so one worker runs them all."""
    docker = [item for item in items if item.get_closest_marker("docker")]
    if docker and not config.option.collectonly:
        items[:] = [item for item in items if not item.get_closest_marker("docker")] + docker
        dockerd.prepare()  # does nothing in an xdist worker


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    dockerd.shutdown()  # a daemon started here that no test stopped (an early -x exit)
    if _HANDOFF is not None and dockerd.ahead() != _HANDOFF:  # this controller's folder
        shutil.rmtree(_HANDOFF.parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def _curves_only_where_looked_at(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A finished run draws its ``curves.png`` (``write_results``): about 0.5 s of CPU, most
    of a tiny run's time, in hundreds of runs. A run inside a test marked ``curves`` draws
    it; elsewhere that one picture is left out (``write_results`` logs and goes on when it
    cannot draw, so no other test's outcome depended on it). ``fedcore plot`` and
    ``plot_runs`` called with any option still draw; so do runs in a child process, and a
    module- or session-scoped fixture's runs (set up before this fixture)."""
    if request.node.get_closest_marker("curves") is None:
        draw = plotting.plot_runs

        def plot_runs(run_dirs: Sequence[Path], out: Path, **options: Any) -> Path:
            if options or [Path(d) for d in run_dirs] != [out.parent] or out.name != "curves.png":
                return draw(run_dirs, out, **options)
            return out

        monkeypatch.setattr(plotting, "plot_runs", plot_runs)
    yield
