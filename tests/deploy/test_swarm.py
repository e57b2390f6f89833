"""``fedcore compose --swarm`` (:mod:`fedcore.deploy.swarm`): the stack file, the folder
beside it and ``gather.sh``, checked without a swarm.

What a real swarm makes of the stack is tests/deploy/test_docker.py's business. Here: the services
match the graph, nothing is bind-mounted, the certificates travel as secrets (a peer gets
``ca.crt`` and its own pair, never ``ca.key``), the config, roster and graph as configs;
``docker stack config`` (no daemon needed) accepts the file, skipped where the docker CLI
is missing; ``gather.sh`` runs against a stand-in ``docker``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedcore.certs import init_certs
from fedcore.config import Config, load_config
from fedcore.deploy.compose import DEFAULT_IMAGE
from fedcore.deploy.swarm import stack_document, write_stack
from fedcore.setup.prepare import prepare_run
from tests.clitools import cli, one_line_error

REPO = Path(__file__).resolve().parents[2]
SMALL_SET = ["topology.kind=ring", "topology.nodes=4"]  # load_config overrides
SMALL = [arg for item in SMALL_SET for arg in ("--set", item)]  # the same on the command line
IDS = ["n0", "n1", "n2", "n3"]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths (topologies/) resolve against the repository root."""
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real certificate folder for n0..n3 (`fedcore certs init`), made once."""
    folder = tmp_path_factory.mktemp("pki")
    init_certs(IDS, folder)
    return folder


def read_stack(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((out / "docker-stack.yml").read_text(encoding="utf-8"))
    return doc


def file_of(out: Path, entry: dict[str, Any]) -> Path:
    """The file a top-level config or secret names: relative, inside ``out``."""
    name: str = entry["file"]
    assert name.startswith("./"), name
    path = (out / name).resolve()
    assert path.is_relative_to(out.resolve()), name
    assert path.is_file(), name
    return path


def check_stack(
    out: Path,
    config: Config,
    *,
    port: int = 7000,
    image: str = DEFAULT_IMAGE,
    placement: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Check DIR's stack against the graph and the files beside it; return the document."""
    ids = list(prepare_run(config).graph.nodes)
    doc = read_stack(out)
    assert doc == stack_document(config, ids, image=image, port=port, placement=placement)
    services = doc["services"]
    assert sorted(services) == sorted(ids)
    tls = config.transport.tls_dir is not None
    graph = config.topology.file

    # The folder: roster by service name, the files every config and secret names.
    roster = json.loads((out / "roster.json").read_text(encoding="utf-8"))
    assert roster == {n: f"{n}:{port}" for n in ids}
    expected_configs = {"config": "./config.toml", "roster": "./roster.json"}
    if graph:
        expected_configs["topology"] = f"./topology/{Path(graph).name}"
    assert {k: v["file"] for k, v in doc["configs"].items()} == expected_configs
    for entry in doc["configs"].values():
        file_of(out, entry)
    if tls:
        names = ["ca.crt", *(f"{n}.{ext}" for n in ids for ext in ("crt", "key"))]
        assert {k: v["file"] for k, v in doc["secrets"].items()} == {
            name.replace(".", "-"): f"./certs/{name}" for name in names
        }
        assert config.transport.tls_dir is not None
        for entry in doc["secrets"].values():
            path = file_of(out, entry)
            assert path.read_bytes() == (config.transport.tls_dir / path.name).read_bytes()
        assert sorted(p.name for p in (out / "certs").iterdir()) == sorted(names)
    else:
        assert "secrets" not in doc
        assert not (out / "certs").exists()
    assert not list(out.rglob("ca.key"))

    # The network: one encrypted overlay, internal; a named volume per peer, no driver
    # options (a local volume with o=bind would be a bind mount in disguise).
    assert doc["networks"] == {
        "peers": {"driver": "overlay", "internal": True, "driver_opts": {"encrypted": "true"}}
    }
    assert doc["volumes"] == {f"{n}-out": {} for n in ids}

    for n in ids:
        service = services[n]
        assert service["image"] == image
        assert service["hostname"] == n
        assert service["working_dir"] == "/fedcore"
        assert service["entrypoint"] == ["fedcore"]
        assert service["command"] == [
            "node", "--config", "/fedcore/config.toml", "--id", n,
            "--roster", "/fedcore/roster.json", "--listen", f"0.0.0.0:{port}",
            "--out", "/fedcore/out", "--resume",
        ]  # fmt: skip
        assert service["networks"] == ["peers"]
        # Nothing from the host: only the peer's own named volume.
        assert service["volumes"] == [f"{n}-out:/fedcore/out"]
        for key in ("ports", "user", "build", "restart", "privileged", "network_mode"):
            assert key not in service, (n, key)
        mounted = {c["target"]: (c["source"], c["mode"]) for c in service["configs"]}
        expected = {
            "/fedcore/config.toml": ("config", 0o444),
            "/fedcore/roster.json": ("roster", 0o444),
        }
        if graph:
            expected[f"/fedcore/topology/{Path(graph).name}"] = ("topology", 0o444)
        assert mounted == expected
        if tls:
            secrets = {
                s["target"]: (s["source"], s["uid"], s["gid"], s["mode"])
                for s in service["secrets"]
            }
            assert secrets == {
                "/fedcore/certs/ca.crt": ("ca-crt", "1000", "1000", 0o444),
                f"/fedcore/certs/{n}.crt": (f"{n}-crt", "1000", "1000", 0o444),
                f"/fedcore/certs/{n}.key": (f"{n}-key", "1000", "1000", 0o400),
            }
        else:
            assert "secrets" not in service
        health = service["healthcheck"]
        assert health["test"] == [
            "CMD", "fedcore", "health", f"127.0.0.1:{port}",
            "--config", "/fedcore/config.toml", "--id", n,
        ]  # fmt: skip
        deploy = service["deploy"]
        assert deploy["replicas"] == 1
        assert deploy["restart_policy"]["condition"] == "on-failure"
        if placement and n in placement:
            assert deploy["placement"] == {
                "constraints": [f"node.labels.fedcore.host == {placement[n]}"]
            }
        else:
            assert "placement" not in deploy

    # The containers' config is the same run (same fingerprint: the peers accept each other).
    inside = load_config(out / "config.toml")
    if tls:
        assert inside.transport.tls == {"dir": "/fedcore/certs"}
    if graph:
        # Relative to the working directory: /fedcore in a container, DIR on the host.
        written = tomllib.loads((out / "config.toml").read_text(encoding="utf-8"))
        assert written["topology"]["file"] == f"topology/{Path(graph).name}"
        assert Path(inside.topology.file) == (out / "topology" / Path(graph).name).resolve()
        assert Path(inside.topology.file).read_bytes() == Path(graph).read_bytes()
        here = Path.cwd()
        os.chdir(out)
        try:
            assert prepare_run(inside).graph == prepare_run(config).graph
            inside_id = prepare_run(inside).run_id
        finally:
            os.chdir(here)
    else:
        inside_id = prepare_run(inside).run_id
    assert inside_id == prepare_run(config).run_id
    return doc


# --- what docker makes of the file (no daemon needed) -----------------------------------------


def _docker_exe() -> str:
    exe = shutil.which("docker")
    if exe is None:
        pytest.skip("the docker CLI is not on PATH (`docker stack config` validates offline)")
    probe = subprocess.run(
        [exe, "stack", "config", "--help"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0 or "--compose-file" not in probe.stdout:
        pytest.skip("this docker CLI has no `docker stack config` (Docker 20.10+)")
    return exe


def stack_config(path: Path) -> dict[str, Any]:
    """``docker stack config -c PATH``, offline: validate the file against the compose
    schema; return docker's normalized reading of it (relative paths made absolute)."""
    exe = _docker_exe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    env["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"  # prove no daemon is asked
    done = subprocess.run(
        [exe, "stack", "config", "-c", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
    )
    assert done.returncode == 0, f"docker stack config rejects {path}:\n{done.stderr}"
    doc: dict[str, Any] = yaml.safe_load(done.stdout)
    return doc


def check_with_docker(out: Path) -> None:
    ours = read_stack(out)
    theirs = stack_config(out / "docker-stack.yml")
    assert sorted(theirs["services"]) == sorted(ours["services"])
    for n, service in theirs["services"].items():
        # docker's reading: a named volume, not a bind mount.
        assert service["volumes"] == [
            {"type": "volume", "source": f"{n}-out", "target": "/fedcore/out"}
        ]
        for key in ("image", "hostname", "entrypoint", "command", "working_dir", "deploy"):
            assert service[key] == ours["services"][n][key], (n, key)
        assert service["healthcheck"]["test"] == ours["services"][n]["healthcheck"]["test"]
        assert service["configs"] == ours["services"][n]["configs"]
        assert service.get("secrets") == ours["services"][n].get("secrets")
        assert set(service["networks"]) == {"peers"}
    assert theirs["networks"] == ours["networks"]
    assert set(theirs["volumes"]) == set(ours["volumes"])
    for kind in ("configs", "secrets"):
        for name, entry in ours.get(kind, {}).items():
            assert Path(theirs[kind][name]["file"]) == (out / entry["file"]).resolve()


# --- scenarios ---------------------------------------------------------------------------------


def plain(tmp_path: Path, pki: Path) -> tuple[Config, dict[str, Any]]:
    return load_config(None, SMALL_SET), {"placement": {"n0": "host-a", "n2": "host.b_2"}}


def tls(tmp_path: Path, pki: Path) -> tuple[Config, dict[str, Any]]:
    config = load_config(None, [*SMALL_SET, f"transport.tls.dir={pki}"])
    return config, {"port": 7443, "image": "registry.example:5000/fc:1"}


def graph_file(tmp_path: Path, pki: Path) -> tuple[Config, dict[str, Any]]:
    config = load_config(None, ["topology.file=topologies/ring-8.json", "algorithm.name=dpsgd"])
    return config, {"placement": {f"n{i}": "a" if i < 4 else "b" for i in range(8)}}


SCENARIOS = {"plain": plain, "tls": tls, "graph-file": graph_file}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stack_folder(tmp_path: Path, pki: Path, scenario: str) -> None:
    config, options = SCENARIOS[scenario](tmp_path, pki)
    out = tmp_path / "deploy"
    path = write_stack(config, out, **options)
    assert path == out / "docker-stack.yml"
    doc = check_stack(out, config, **options)
    assert len(doc["services"]) == (8 if scenario == "graph-file" else 4)
    assert (out / "nodes").is_dir()
    assert not (out / "docker-compose.yml").exists()
    if scenario == "tls":
        for n in IDS:
            key = out / "certs" / f"{n}.key"
            assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # The header says how to deploy; everything after it is the document.
    head = path.read_text(encoding="utf-8").split("\nversion:", 1)[0]
    assert "docker stack deploy -c docker-stack.yml fedcore" in head
    assert all(line.startswith("#") for line in head.splitlines())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_docker_stack_config_accepts_it(tmp_path: Path, pki: Path, scenario: str) -> None:
    config, options = SCENARIOS[scenario](tmp_path, pki)
    out = tmp_path / "deploy"
    write_stack(config, out, **options)
    check_with_docker(out)


def test_regenerating_keeps_gathered_results(tmp_path: Path) -> None:
    config = load_config(None, SMALL_SET)
    out = tmp_path / "deploy"
    write_stack(config, out)
    (out / "nodes" / "n0").mkdir()
    (out / "nodes" / "n0" / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    write_stack(config, out, port=7100, placement={"n1": "x"})
    assert (out / "nodes" / "n0" / "metrics.jsonl").exists()
    check_stack(out, config, port=7100, placement={"n1": "x"})


# --- gather.sh -----------------------------------------------------------------------------------

STUB_DOCKER = r"""#!/bin/sh
# A stand-in for docker: `ps` answers from $STUB/ps/<service name>, `cp` copies from
# $STUB/containers/<container id><path>; every call is logged to $STUB/calls.
echo "$*" >> "$STUB/calls"
case "$1" in
ps)
    if [ -e "$STUB/fail" ]; then
        echo "Cannot connect to the Docker daemon" >&2
        exit 1
    fi
    for arg in "$@"; do
        case "$arg" in
        label=com.docker.swarm.service.name=*) service=${arg#*service.name=} ;;
        esac
    done
    if [ -f "$STUB/ps/$service" ]; then cat "$STUB/ps/$service"; fi
    ;;
cp)
    container=${2%%:*}
    path=${2#*:}
    cp -R "$STUB/containers/$container$path" "$3"
    ;;
*)
    echo "stub docker: unexpected $1" >&2
    exit 1
    ;;
esac
"""


def stub_docker(tmp_path: Path, running: dict[str, list[str]]) -> tuple[Path, dict[str, str]]:
    """A ``docker`` on PATH that knows the containers ``running`` (service -> container ids,
    newest first), each with a file ``metrics.jsonl`` naming it in /fedcore/out."""
    stub = tmp_path / "stub"
    (stub / "bin").mkdir(parents=True)
    (stub / "ps").mkdir()
    exe = stub / "bin" / "docker"
    exe.write_text(STUB_DOCKER, encoding="utf-8")
    exe.chmod(0o755)
    for service, containers in running.items():
        (stub / "ps" / service).write_text("".join(f"{c}\n" for c in containers))
        for c in containers:
            folder = stub / "containers" / c / "fedcore" / "out"
            (folder / "models").mkdir(parents=True)
            (folder / "metrics.jsonl").write_text(f'{{"container": "{c}"}}\n')
            (folder / "models" / "final.pt").write_bytes(c.encode())
    env = dict(os.environ, STUB=str(stub), PATH=f"{stub / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return stub, env


def test_gather_script_is_posix_sh_and_names_every_node(tmp_path: Path) -> None:
    config = load_config(None, ["topology.file=topologies/ring-8.json"])
    out = tmp_path / "deploy"
    write_stack(config, out)
    gather = out / "gather.sh"
    assert gather.stat().st_mode & 0o111 == 0o111
    text = gather.read_text(encoding="utf-8")
    assert text.startswith("#!/bin/sh\n")
    assert "set -eu" in text
    loop = re.search(r"^for id in (.*); do$", text, re.MULTILINE)
    assert loop is not None
    assert loop.group(1).split() == [f"n{i}" for i in range(8)]
    for shell in ("sh", "dash", "bash"):
        exe = shutil.which(shell)
        if exe is None:
            continue
        argv = [exe, "--posix", "-n"] if shell == "bash" else [exe, "-n"]
        done = subprocess.run([*argv, str(gather)], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (shell, done.stderr)


def test_gather_copies_the_newest_container_of_each_peer_here(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    write_stack(load_config(None, SMALL_SET), out)
    # n0 restarted once (two containers, newest first); n2 runs here; n1 and n3 elsewhere.
    stub, env = stub_docker(tmp_path, {"exp_n0": ["c0new", "c0old"], "exp_n2": ["c2"]})
    (out / "nodes" / "n0").mkdir()
    (out / "nodes" / "n0" / "stale.txt").write_text("from an earlier gather\n")
    (out / "nodes" / "n1").mkdir()
    (out / "nodes" / "n1" / "metrics.jsonl").write_text("gathered on another host\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        ["sh", str(out / "gather.sh"), "exp"],
        capture_output=True,
        text=True,
        env=env,
        cwd=elsewhere,  # the script works in its own folder
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "gathered n0" in done.stdout and "gathered n2" in done.stdout
    assert "gathered n1" not in done.stdout and "gathered n3" not in done.stdout
    assert "2 peer folder(s)" in done.stdout
    nodes = out / "nodes"
    assert sorted(p.name for p in nodes.iterdir()) == ["n0", "n1", "n2"]
    assert sorted(p.name for p in (nodes / "n0").iterdir()) == ["metrics.jsonl", "models"]
    assert "c0new" in (nodes / "n0" / "metrics.jsonl").read_text()
    assert (nodes / "n0" / "models" / "final.pt").read_bytes() == b"c0new"
    assert (nodes / "n2" / "models" / "final.pt").read_bytes() == b"c2"
    assert (nodes / "n1" / "metrics.jsonl").read_text() == "gathered on another host\n"
    assert not list(elsewhere.iterdir())
    calls = (stub / "calls").read_text().splitlines()
    asked = [c for c in calls if c.startswith("ps ")]
    assert asked == [f"ps -a -q --filter label=com.docker.swarm.service.name=exp_{n}" for n in IDS]
    assert [c for c in calls if c.startswith("cp ")] == [
        "cp c0new:/fedcore/out/. nodes/n0/",
        "cp c2:/fedcore/out/. nodes/n2/",
    ]


def test_gather_defaults_to_the_stack_fedcore_and_stops_when_docker_fails(
    tmp_path: Path,
) -> None:
    out = tmp_path / "deploy"
    write_stack(load_config(None, SMALL_SET), out)
    stub, env = stub_docker(tmp_path, {"fedcore_n3": ["c3"]})
    done = subprocess.run(
        ["sh", "gather.sh"], capture_output=True, text=True, env=env, cwd=out, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "1 peer folder(s)" in done.stdout
    assert (out / "nodes" / "n3" / "models" / "final.pt").read_bytes() == b"c3"
    # No daemon (or no permission): an error, not "0 peer folder(s) gathered".
    (stub / "fail").touch()
    done = subprocess.run(
        ["sh", "gather.sh"], capture_output=True, text=True, env=env, cwd=out, timeout=30
    )
    assert done.returncode != 0
    assert "Cannot connect" in done.stderr
    assert "gathered" not in done.stdout


# --- the command line ---------------------------------------------------------------------------


def test_cli_swarm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deploy"
    argv = ["compose", "--swarm", "--out", str(out), *SMALL, "--port", "7500"]
    argv += ["--image", "me/fc:1", "--place", " n0=host-a, n1 = host-b,,n3=host-a"]
    status, printed, err = cli(capsys, *argv)
    assert status == 0, err
    assert printed.startswith(f"wrote {out / 'docker-stack.yml'}")
    steps = printed.splitlines()[1:]
    assert steps[0] == "next steps:"
    text = "\n".join(steps)
    assert "me/fc:1" in text and "every host" in text
    assert "docker node update --label-add fedcore.host=HOST" in text
    assert "host-a, host-b" in text
    assert f"cd {out} && docker stack deploy -c docker-stack.yml fedcore" in text
    assert "sh gather.sh fedcore" in text and "fedcore summarize ." in text
    assert "checkpoint_every" in text  # 0 by default: a restarted peer starts again
    assert "docker-compose" not in text
    placement = {"n0": "host-a", "n1": "host-b", "n3": "host-a"}
    check_stack(out, load_config(None, SMALL_SET), port=7500, image="me/fc:1", placement=placement)
    assert not (out / "docker-compose.yml").exists()


def test_cli_swarm_quiet_without_placement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deploy"
    every = ["--set", "run.checkpoint_every=5"]
    status, printed, err = cli(capsys, "compose", "--swarm", "--out", str(out), *SMALL, *every)
    assert status == 0, err
    assert "label-add" not in printed and "checkpoint_every" not in printed
    status, printed, err = cli(capsys, "compose", "--swarm", "-q", "--out", str(out), *SMALL)
    assert status == 0, err
    assert printed.splitlines() == [
        f"wrote {out / 'docker-stack.yml'} (with config.toml, roster.json and gather.sh beside it)"
    ]


def bad_graph(tmp_path: Path, bad: str) -> str:
    ids = ["n0", bad, "n2"]
    graph = tmp_path / f"graph-{len(list(tmp_path.glob('graph-*')))}.json"
    edges = [[a, b] for a, b in zip(ids, ids[1:] + ids[:1], strict=True)]
    graph.write_text(json.dumps({"name": "t", "directed": False, "nodes": ids, "edges": edges}))
    return str(graph)


CLI_ERRORS: dict[str, tuple[list[str], list[str]]] = {
    # name: (arguments after `compose --out DIR`, needles of the one-line error)
    "place-without-swarm": (["--place", "n0=a"], ["needs --swarm"]),
    "nodes": (["--swarm", "--nodes", "n0"], ["--nodes and --roster", "--place"]),
    "roster": (["--swarm", "--roster", "{roster}"], ["--nodes and --roster"]),
    "unknown-node": (["--swarm", "--place", "n0=a,n9=b"], ["'n9' is not a node of the graph"]),
    "label-space": (["--swarm", "--place", "n0=host a"], ["host label value"]),
    "label-empty": (["--swarm", "--place", "n0="], ["host label value"]),
    "label-quote": (["--swarm", "--place", 'n0=a"b'], ["host label value"]),
    "label-unicode": (["--swarm", "--place", "n0=hôte"], ["host label value"]),
    "label-equals": (["--swarm", "--place", "n0=a=b"], ["host label value"]),
    "no-equals": (["--swarm", "--place", "n0=a,n1"], ["'n1' is not ID=HOST"]),
    "twice": (["--swarm", "--place", "n0=a,n0=b"], ["n0 twice"]),
    "port-zero": (["--swarm", "--port", "0"], ["--port 0"]),
    "port-high": (["--swarm", "--port", "70000"], ["--port 70000"]),
    "image-space": (["--swarm", "--image", "fed core"], ["--image"]),
    "image-empty": (["--swarm", "--image", ""], ["--image"]),
    "uppercase-id": (["--swarm", "--set", "topology.file={Alice}"], ["Alice", "hostname"]),
    "underscore-id": (["--swarm", "--set", "topology.file={n_1}"], ["n_1", "hostname"]),
    "dotted-id": (["--swarm", "--set", "topology.file={n.1}"], ["n.1", "hostname"]),
    "no-certs": (
        ["--swarm", "--set", "transport.tls.dir={certs}"],
        ["n0.key", "fedcore certs init --nodes n0 n1 n2 n3"],
    ),
}


@pytest.mark.parametrize("case", CLI_ERRORS)
def test_cli_errors_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    args, needles = CLI_ERRORS[case]
    roster = tmp_path / "roster.json"
    roster.write_text(json.dumps({n: f"10.0.0.1:{7000 + i}" for i, n in enumerate(IDS)}))
    certs = tmp_path / "pki"
    certs.mkdir()
    init_certs(["n0"], certs)
    (certs / "n0.key").unlink()  # ca.crt and n0.crt only
    values = {"roster": str(roster), "certs": str(certs)}
    for bad in ("Alice", "n_1", "n.1"):
        values[bad] = bad_graph(tmp_path, bad)
    args = [re.sub(r"\{([^}]+)\}", lambda m: values[m.group(1)], a) for a in args]
    out = tmp_path / "d"
    one_line_error(capsys, ["compose", "--out", str(out), *SMALL, *args], *needles)
    assert not out.exists()
