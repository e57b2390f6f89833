"""Deployments run for real: peer containers under docker-compose and a Docker Swarm stack.

The module starts (or reuses) a Docker daemon (:mod:`tests.dockerd`), makes the base image
from Debian packages and builds the peer image from ``nodes/Dockerfile`` with no network in
the build (``scripts/docker_image.py``: debootstrap, a folder of wheels, ``docker build
--network none``), all in the background from the moment these tests are collected; they
run last. Then:

- a ``fedcore compose`` deployment of 4 peers, strict mode, mutual TLS, runs with
  ``docker-compose up`` and ``fedcore summarize`` gives ``simulate``'s ``params_sha256``;
- a deadline-mode deployment with checkpoints loses one peer's container mid-run (its main
  process killed with SIGKILL, as a crash or the OOM killer would), ``restart: on-failure``
  brings it back with ``--resume``, the run completes, the summary records the gap (the
  messages its neighbours missed), and accuracy is within 1 point of an uninterrupted run;
- a ``fedcore compose --swarm`` stack of the same 4 TLS peers, deployed with ``docker stack
  deploy`` on a single-node swarm started here, gives the same ``params_sha256``;
- afterwards no container, volume, network or image is left, and a daemon started here is
  stopped by its PID and its folder removed (checked).

Every network here is one the test creates, and internal (no route out of it): the compose
file's default network is made internal by an override file, the stack's overlay network is
internal as written.

Why not ``docker kill``: Docker treats a container stopped by ``docker kill`` (or ``docker
stop``) as stopped by hand, and a restart policy never restarts it (seen here with Docker
20.10). A crash is the process dying on its own; SIGKILL to it from the host is that.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedcore import certs
from fedcore.config import Config, load_config
from fedcore.runners.compose import write_compose
from fedcore.runners.launch import summarize
from fedcore.runners.simulate import simulate
from fedcore.runners.stack import HOST_LABEL, write_stack
from tests import dockerd
from tests.dockerd import Daemon

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

NODES = ["n0", "n1", "n2", "n3"]
STRICT = [
    "topology.kind=ring",
    "topology.nodes=4",
    "run.rounds=20",
    "run.eval_every=10",
    "simulate.engine=messages",
]
DEADLINE = [
    "algorithm.name=dpsgd",
    "topology.kind=ring",
    "topology.nodes=3",
    "run.rounds=60",
    "run.eval_every=10",
    "run.checkpoint_every=5",
    "transport.mode=deadline",
    # 1 s: a loaded machine must not make the healthy rounds miss messages too.
    "transport.deadline_s=1.0",
    "simulate.engine=messages",
]
_INTERNAL = "networks:\n  default:\n    internal: true\n"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d, _, _ = dockerd.prepared()
    yield d
    for kind, name in d.created:
        if kind == "images":
            d.run("image", "rm", "--force", name, check=False)
    d.run("image", "prune", "--force", check=False)  # dangling build layers
    left = d.leftovers()
    problems = d.stop()
    assert not left, f"left on the Docker daemon: {left}"
    assert not problems, problems


@pytest.fixture(scope="module")
def image(daemon: Daemon) -> str:
    """The peer image, built offline on a base made from Debian packages (in the
    background while the rest of the suite ran: :func:`tests.dockerd.prepare`)."""
    _, tag, seconds = dockerd.prepared()
    print(f"docker: daemon and images ready after {seconds:.0f} s")
    return tag


@pytest.fixture(scope="module")
def tls_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, dict[str, Any]]:
    """The 4-peer strict TLS run and its ``simulate`` summary (the expected result)."""
    folder = tmp_path_factory.mktemp("tls")
    certs.init_certs(NODES, folder / "certs")
    config = load_config(None, [*STRICT, f'transport.tls.dir="{folder / "certs"}"'])
    expected = simulate(config, out_dir=folder / "sim", show_progress=False)
    return config, expected


def _compose(daemon: Daemon, folder: Path, *args: str, timeout: float = 300) -> str:
    argv = [
        "docker-compose", "--project-name", folder.name, "-f", "docker-compose.yml",
        "-f", "internal.yml", *args,
    ]  # fmt: skip
    return daemon.command(argv, cwd=folder, timeout=timeout).stdout


def _wait_for(what: str, done: Any, timeout: float, logs: Any) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s. Logs:\n{logs()[-6000:]}")
        time.sleep(0.5)


def _exited(daemon: Daemon, label: str) -> list[str]:
    """``NAME STATUS`` of the exited containers with ``label``."""
    return daemon.lines(
        "ps", "-a", "--filter", f"label={label}", "--filter", "status=exited",
        "--format", "{{.Names}} {{.Status}}",
    )  # fmt: skip


def _networks(daemon: Daemon, prefix: str) -> list[str]:
    return [
        n for n in daemon.lines("network", "ls", "--format", "{{.Name}}") if n.startswith(prefix)
    ]


def _finished(folder: Path, nodes: list[str]) -> bool:
    return all((folder / "nodes" / n / "node.json").exists() for n in nodes)


def _up(daemon: Daemon, config: Config, folder: Path, image: str) -> None:
    write_compose(config, folder, image=image, build_context=False)
    (folder / "internal.yml").write_text(_INTERNAL, encoding="utf-8")
    _compose(daemon, folder, "up", "--detach", "--no-build")


def test_compose_tls_deployment_equals_simulate(
    daemon: Daemon, image: str, tls_run: tuple[Config, dict[str, Any]], tmp_path: Path
) -> None:
    config, expected = tls_run
    folder = tmp_path / "fctls"
    _up(daemon, config, folder, image)
    try:
        _wait_for(
            "4 TLS peers finishing under docker-compose",
            lambda: len(_exited(daemon, f"com.docker.compose.project={folder.name}")) == 4,
            240,
            lambda: _compose(daemon, folder, "logs", "--no-color"),
        )
        states = _exited(daemon, f"com.docker.compose.project={folder.name}")
    finally:
        _compose(daemon, folder, "down", "--volumes", "--timeout", "5")
    summary = summarize(folder)
    assert summary["status"] == "completed"
    assert summary["params_sha256"] == expected["params_sha256"]
    assert summary["final"]["avg_model_accuracy"] == expected["final"]["avg_model_accuracy"]
    assert len(states) == 4 and all("Exited (0)" in s for s in states), states


def test_compose_peer_crash_restarts_and_resumes(
    daemon: Daemon, image: str, tmp_path: Path
) -> None:
    config = load_config(None, DEADLINE)
    folder = tmp_path / "fcdead"
    nodes = ["n0", "n1", "n2"]
    _up(daemon, config, folder, image)
    container = f"{folder.name}_n1_1"
    try:
        metrics = folder / "nodes" / "n1" / "metrics.jsonl"
        _wait_for(
            "n1 reaching round 12",
            lambda: metrics.exists() and metrics.read_text(encoding="utf-8").count("\n") >= 12,
            180,
            lambda: _compose(daemon, folder, "logs", "--no-color"),
        )
        pid = int(daemon.run("inspect", "--format", "{{.State.Pid}}", container).stdout)
        os.kill(pid, signal.SIGKILL)  # the peer crashes; its container exits with 137
        _wait_for(
            "the run finishing after n1's restart",
            lambda: _finished(folder, nodes),
            240,
            lambda: _compose(daemon, folder, "logs", "--no-color"),
        )
        restarts = int(daemon.run("inspect", "--format", "{{.RestartCount}}", container).stdout)
        log = daemon.run("logs", container).stderr
    finally:
        _compose(daemon, folder, "down", "--volumes", "--timeout", "5")
    assert restarts == 1
    assert "resumed from the checkpoint of round" in log
    rounds = [
        json.loads(line)["round"]
        for line in (folder / "nodes" / "n1" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rounds == list(range(60))  # every round once: those after the checkpoint re-ran
    summary = summarize(folder)
    assert summary["status"] == "completed"
    missing = summary["faults"]["missing_per_edge"]
    assert missing.get("n1->n0", 0) > 0 and missing.get("n1->n2", 0) > 0, missing  # the gap
    baseline = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    accuracy = summary["final"]["avg_model_accuracy"]
    assert abs(accuracy - baseline["final"]["avg_model_accuracy"]) <= 0.01


def test_swarm_stack_equals_simulate(
    daemon: Daemon, image: str, tls_run: tuple[Config, dict[str, Any]], tmp_path: Path
) -> None:
    if not daemon.started:
        pytest.skip("the swarm test runs only on a Docker daemon it started itself")
    config, expected = tls_run
    folder = tmp_path / "stack"
    stack = "fcstack"
    daemon.run("swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377")
    try:
        node = daemon.run("info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
        daemon.run("node", "update", "--label-add", f"{HOST_LABEL}=h1", node)
        write_stack(config, folder, image=image, placement=dict.fromkeys(NODES, "h1"))
        daemon.run("stack", "deploy", "--compose-file", "docker-stack.yml", stack, cwd=folder)

        def exited() -> list[str]:
            return _exited(daemon, f"com.docker.stack.namespace={stack}")

        def logs() -> str:
            return "\n".join(
                daemon.run("service", "logs", f"{stack}_{n}", check=False).stderr for n in NODES
            )

        _wait_for("4 TLS peers finishing in the swarm", lambda: len(exited()) >= 4, 300, logs)
        states = exited()
        gathered = daemon.command(["sh", "gather.sh", stack], cwd=folder).stdout
        daemon.run("stack", "rm", stack)
        _wait_for(
            "the stack's containers and network going",
            lambda: not daemon.lines("ps", "-aq") and not _networks(daemon, stack),
            120,
            lambda: "",
        )
        for n in NODES:
            daemon.run("volume", "rm", f"{stack}_{n}-out")
    finally:
        daemon.run("stack", "rm", stack, check=False)
        daemon.run("swarm", "leave", "--force", check=False)
        # The bridge that swarm made for its overlay networks' way out stays after leaving.
        daemon.run("network", "rm", "docker_gwbridge", check=False)
    assert all("Exited (0)" in s for s in states), states
    assert "4 peer folder(s) gathered" in gathered
    summary = summarize(folder)
    assert summary["status"] == "completed"
    assert summary["params_sha256"] == expected["params_sha256"]
