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
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedcore import certs
from fedcore.config import Config, load_config
from fedcore.deploy.compose import write_compose
from fedcore.deploy.summarize import summarize
from fedcore.deploy.swarm import HOST_LABEL, write_stack
from fedcore.simulation.simulate import simulate
from tests import dockerd
from tests.dockerd import Daemon

# One xdist group: the module-scoped daemon and image are one worker's.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(900), pytest.mark.xdist_group("docker")]

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
    # Rounds take milliseconds once every peer is up: enough of them that the crash at
    # round 12 lands well before the end (with 60, a fast machine finished first).
    "run.rounds=300",
    "run.eval_every=100",
    "run.checkpoint_every=5",
    "transport.mode=deadline",
    # 1 s: a loaded machine must not make the healthy rounds miss messages too.
    "transport.deadline_s=1.0",
    "simulate.engine=messages",
]
_INTERNAL = "networks:\n  default:\n    internal: true\n"


@pytest.fixture(scope="module")
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    mine = [i for i in request.session.items if i.get_closest_marker("docker")]
    if os.environ.get("PYTEST_XDIST_WORKER") and not all(
        i.nodeid.endswith("@docker") for i in mine
    ):
        # Each worker would stop the one daemon when its share of the tests ends.
        pytest.fail(
            "pytest-xdist did not group the docker tests on one worker (--dist=loadgroup "
            "needs pytest<9 with pytest-xdist 3.8); run them with -n 0"
        )
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
        assert pid > 0, "n1's container is not running"  # (never os.kill(0): our own group)
        assert not (folder / "nodes" / "n1" / "node.json").exists(), "n1 finished already"
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
    assert rounds == list(range(300))  # every round once: those after the checkpoint re-ran
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
    began = time.monotonic()
    phases: dict[str, float] = {}

    def mark(phase: str) -> None:
        phases[phase] = round(time.monotonic() - began - sum(phases.values()), 1)

    daemon.run("swarm", "init", "--advertise-addr", "127.0.0.1", "--listen-addr", "127.0.0.1:2377")
    try:
        node = daemon.run("info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
        daemon.run("node", "update", "--label-add", f"{HOST_LABEL}=h1", node)
        write_stack(config, folder, image=image, placement=dict.fromkeys(NODES, "h1"))
        mark("swarm init")
        # --resolve-image never: the image is local; do not ask a registry for its digest.
        deploy = ["stack", "deploy", "--resolve-image", "never", "-c", "docker-stack.yml", stack]
        daemon.run(*deploy, cwd=folder)
        mark("deploy")

        def exited() -> list[str]:
            return _exited(daemon, f"com.docker.stack.namespace={stack}")

        def logs() -> str:
            return "\n".join(
                daemon.run("service", "logs", f"{stack}_{n}", check=False).stderr for n in NODES
            )

        _wait_for("4 TLS peers finishing in the swarm", lambda: len(exited()) >= 4, 300, logs)
        states = exited()
        mark("run")
        gathered = daemon.command(["sh", "gather.sh", stack], cwd=folder).stdout
        daemon.run("stack", "rm", stack)
        _wait_for(
            "the stack's containers and network going",
            lambda: not daemon.lines("ps", "-aq") and not _networks(daemon, stack),
            120,
            lambda: "",
        )
        mark("gather and stack rm")
        for n in NODES:
            daemon.run("volume", "rm", f"{stack}_{n}-out")
    finally:
        daemon.run("stack", "rm", stack, check=False)
        daemon.run("swarm", "leave", "--force", check=False)
        # The bridge that swarm made for its overlay networks' way out stays after leaving.
        daemon.run("network", "rm", "docker_gwbridge", check=False)
        mark("leave")
        print(f"swarm test phases (s): {phases}")
    assert all("Exited (0)" in s for s in states), states
    assert "4 peer folder(s) gathered" in gathered
    summary = summarize(folder)
    assert summary["status"] == "completed"
    assert summary["params_sha256"] == expected["params_sha256"]


def _pod_container_args(pod: dict[str, Any], files: Path, volume: str) -> list[str]:
    """``docker run`` options that give a container what the kubelet gives ``pod``'s
    container: its user, read-only root, environment, working directory, and its volumes
    (ConfigMap keys and Secret items as read-only files under ``files``, the claim ``out``
    as the named volume ``volume``, an emptyDir as a tmpfs)."""
    spec = pod["spec"]
    (container,) = spec["containers"]
    security = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    args = ["--user", f"{security['runAsUser']}:{security['runAsGroup']}"]
    if security.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if security.get("capabilities", {}).get("drop") == ["ALL"]:
        args += ["--cap-drop", "ALL"]
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    for item in container.get("env", []):
        args += ["--env", f"{item['name']}={item['value']}"]
    args += ["--workdir", container["workingDir"]]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        source = volumes.get(mount["name"])
        target = mount["mountPath"]
        if source is None:  # the StatefulSet's volume claim template
            args += ["--volume", f"{volume}:{target}"]
        elif "emptyDir" in source:
            args += ["--tmpfs", f"{target}:uid={security['runAsUser']}"]
        else:
            folder = files / mount["name"]
            path = folder / mount["subPath"] if "subPath" in mount else folder
            args += ["--volume", f"{path}:{target}:ro"]
    return args


def _materialize(objects: list[dict[str, Any]], pod: dict[str, Any], files: Path) -> None:
    """Write the ConfigMap's keys and the pod's Secret's items where the kubelet would
    project them, owned by the pod's user, with the Secret's mode."""
    import base64

    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    spec = pod["spec"]
    uid, gid = spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]
    for volume in spec["volumes"]:
        folder = files / volume["name"]
        if "configMap" in volume:
            data = by_name["ConfigMap", volume["configMap"]["name"]]["data"]
            entries = {key: (text.encode(), 0o644) for key, text in data.items()}
        elif "secret" in volume:
            secret = volume["secret"]
            data = by_name["Secret", secret["secretName"]]["data"]
            entries = {
                item["path"]: (base64.b64decode(data[item["key"]]), secret["defaultMode"])
                for item in secret["items"]
            }
        else:
            continue
        folder.mkdir(parents=True)
        for name, (content, mode) in entries.items():
            path = folder / name
            path.write_bytes(content)
            os.chmod(path, mode)
            os.chown(path, uid, gid)


def test_k8s_pods_run_in_the_image_as_their_manifests_say(
    daemon: Daemon, image: str, tls_run: tuple[Config, dict[str, Any]], tmp_path: Path
) -> None:
    """No cluster here; the next best thing: each StatefulSet's pod runs in the real image
    as a container configured from its manifest (its user, read-only root, env, ConfigMap
    and Secret files, volume claim, wrapper command), reachable under its pod DNS name on
    an internal network, and the run equals ``simulate``; the readiness probe, run in the
    container, passes once the peer is done."""
    import yaml

    from fedcore.deploy.k8s import write_k8s

    config, expected = tls_run
    folder = tmp_path / "k8s"
    write_k8s(config, folder, image=image)
    objects = [
        doc
        for path in sorted((folder / "k8s").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
    ]
    service = next(o for o in objects if o["kind"] == "Service")
    sets = [o for o in objects if o["kind"] == "StatefulSet"]
    assert sorted(s["metadata"]["name"] for s in sets) == NODES
    network = f"fck8s-{uuid.uuid4().hex[:8]}"
    daemon.run("network", "create", "--internal", network)
    daemon.created.append(("networks", network))
    containers: dict[str, str] = {}
    try:
        for sts in sets:
            node = sts["metadata"]["name"]
            pod = sts["spec"]["template"]
            (container,) = pod["spec"]["containers"]
            files = tmp_path / "pods" / node
            _materialize(objects, pod, files)
            meta = sts["metadata"]
            dns = f"{node}-0.{service['metadata']['name']}.{meta['namespace']}.svc.cluster.local"
            assert sts["spec"]["serviceName"] == service["metadata"]["name"]
            volume = f"{network}-{node}-out"
            daemon.created.append(("volumes", volume))
            name = f"{network}-{node}"
            run = [
                "run", "--detach", "--name", name, "--hostname", f"{node}-0",
                "--network", network, "--network-alias", dns,
                *_pod_container_args(pod, files, volume),
                "--entrypoint", container["command"][0], image,
                *container["command"][1:], *container["args"],
            ]  # fmt: skip
            daemon.run(*run)
            containers[node] = name

        def done() -> bool:
            return all(
                daemon.run(
                    "exec", c, "test", "-e", "/fedcore/out/node.json", check=False
                ).returncode
                == 0
                for c in containers.values()
            )

        def logs() -> str:
            return "\n".join(daemon.run("logs", c, check=False).stderr for c in containers.values())

        _wait_for("4 pods' peers finishing", done, 240, logs)
        probe = sets[0]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        ready = daemon.run("exec", containers["n0"], *probe["exec"]["command"], check=False)
        for node, c in containers.items():
            (folder / "nodes" / node).mkdir(parents=True, exist_ok=True)
            daemon.run("cp", f"{c}:/fedcore/out/.", str(folder / "nodes" / node))
        states = [
            daemon.run("inspect", "-f", "{{.State.Status}}", c).stdout for c in containers.values()
        ]
    finally:
        for c in containers.values():
            daemon.run("rm", "--force", c, check=False)
        for kind, name in list(daemon.created):
            if kind == "volumes" and name.startswith(network):
                daemon.run("volume", "rm", name, check=False)
        daemon.run("network", "rm", network, check=False)
    assert ready.returncode == 0, ready.stderr
    assert all(s.strip() == "running" for s in states), states  # the wrapper idles when done
    summary = summarize(folder)
    assert summary["status"] == "completed"
    assert summary["params_sha256"] == expected["params_sha256"]
