"""``fedcore k8s``: every generated manifest validates against the Kubernetes schemas offline,
each pod's identity, mounts and probes are what its node needs, and the pods' commands, run
as local processes with the generated roster, make the same run as ``simulate``.

No cluster runs here. The schemas are those kubernetes-validate ships (strict: unknown fields
are errors), for :data:`K8S_VERSION` and for the newest version it has.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import kubernetes_validate
import pytest
import yaml

from fedcore.certs import cert_node_ids, init_certs, load_tls
from fedcore.cli import main
from fedcore.config import Config, load_config
from fedcore.deploy import k8s
from fedcore.deploy.k8s import write_k8s
from fedcore.deploy.k8s_statefulset import PEER_WRAPPER, PROBE_WRAPPER, Resources
from fedcore.deploy.launch import free_ports
from fedcore.errors import ConfigError, TopologyError
from fedcore.ids import id_problem
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30"
"""The Kubernetes version the manifests target (its schemas); the newest shipped is checked too."""
VERSIONS = sorted({K8S_VERSION, kubernetes_validate.latest_version()})
SMALL_SET = ["topology.kind=ring", "topology.nodes=4"]
IDS = ["n0", "n1", "n2", "n3"]
SHORT_RUN = [
    *SMALL_SET,
    "run.rounds=6",
    "run.eval_every=3",
    "run.checkpoint_every=2",
    "data.batch_size=16",
    "simulate.engine=messages",  # the engine whose runs gRPC peers equal bit for bit
]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths (topologies/) resolve against the repository root."""
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real certificates (``fedcore certs init``) for n0..n3."""
    folder = tmp_path_factory.mktemp("pki")
    init_certs(IDS, folder)
    return folder


# --- reading and validating what was written --------------------------------------------------


def manifests(out: Path) -> dict[str, dict[str, Any]]:
    """File name in DIR/k8s -> its one document, each validated against the schemas."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((out / "k8s").glob("*.yaml")):
        documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        assert len(documents) == 1, path
        found[path.name] = documents[0]
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(documents[0], version, strict=True)
            except kubernetes_validate.ValidationError as exc:  # its text holds the schema
                pytest.fail(f"{path.name} is invalid for Kubernetes {version}: {exc.message}")
    return found


def by_kind(docs: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """metadata.name -> object, for the objects of ``kind``."""
    return {d["metadata"]["name"]: d for d in docs.values() if d["kind"] == kind}


def container(sts: dict[str, Any]) -> dict[str, Any]:
    (only,) = sts["spec"]["template"]["spec"]["containers"]
    return only  # type: ignore[no-any-return]


def volumes(sts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = sts["spec"]
    found = {v["name"]: v for v in spec["template"]["spec"].get("volumes", [])}
    for claim in spec.get("volumeClaimTemplates", []):
        assert claim["metadata"]["name"] not in found
        found[claim["metadata"]["name"]] = {"claim": claim}
    return found


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?")


def check_deployment(
    out: Path,
    config: Config,
    *,
    name: str = "fedcore",
    namespace: str = "default",
    port: int = 7000,
) -> dict[str, dict[str, Any]]:
    """Check DIR against the graph: identities, mounts, probes, claims; return the manifests."""
    docs = manifests(out)
    ids = list(prepare_run(config).graph.nodes)
    tls = config.transport.tls_dir is not None
    assert sorted(by_kind(docs, "StatefulSet")) == sorted(ids)
    expected = {"configmap.yaml", "service.yaml", *(f"statefulset-{n}.yaml" for n in ids)}
    assert set(docs) == expected | ({f"secret-{n}.yaml" for n in ids} if tls else set())
    for doc in docs.values():  # names and labels the API server accepts (not in the schemas)
        meta = doc["metadata"]
        assert meta["namespace"] == namespace
        assert len(meta["name"]) <= 253 and re.fullmatch(r"[a-z0-9.-]+", meta["name"])
        assert all(LABEL_VALUE.fullmatch(v) and len(v) <= 63 for v in meta["labels"].values())

    # kustomization.yaml lists every manifest; the ConfigMap and DIR hold the same files.
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(f"k8s/{f}" for f in docs)
    (configmap,) = by_kind(docs, "ConfigMap").values()
    data = configmap["data"]
    assert data["config.toml"] == (out / "config.toml").read_text(encoding="utf-8")
    assert data["roster.json"] == (out / "roster.json").read_text(encoding="utf-8")
    inside = tomllib.loads(data["config.toml"])
    assert (inside["transport"].get("tls") or None) == ({"dir": "certs"} if tls else None)
    roster = json.loads(data["roster.json"])
    assert sorted(roster) == sorted(ids)

    # The headless Service selects every pod of the run and publishes them before they are ready.
    (service,) = by_kind(docs, "Service").values()
    assert service["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [
        {"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"}
    ]

    secrets = by_kind(docs, "Secret")
    mounted_secrets: list[str] = []
    for n, sts in by_kind(docs, "StatefulSet").items():
        spec = sts["spec"]
        pod = spec["template"]
        labels = pod["metadata"]["labels"]
        # Identity: StatefulSet n -> its one pod n-0 -> n-0.<service>.<ns>.svc DNS -> roster.
        assert spec["replicas"] == 1 and spec["serviceName"] == name
        assert DNS_LABEL.fullmatch(f"{n}-0") and len(f"{n}-{'x' * 10}") <= 63
        assert roster[n] == f"{n}-0.{name}.{namespace}.svc.cluster.local:{port}"
        assert roster[n].rpartition(":")[0] == k8s.pod_dns_name(n, name=name, namespace=namespace)
        assert all(labels[k] == v for k, v in spec["selector"]["matchLabels"].items())
        assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
        others = [s for m, s in by_kind(docs, "StatefulSet").items() if m != n]
        for other in others:  # no StatefulSet selects another's pod
            theirs = other["spec"]["template"]["metadata"]["labels"]
            assert any(theirs.get(k) != v for k, v in spec["selector"]["matchLabels"].items())

        c = container(sts)
        argv = c["args"]
        assert c["command"] == ["/bin/sh", "-c", PEER_WRAPPER, "peer"]
        assert argv[:2] == ["fedcore", "node"] and "--resume" in argv
        assert option(argv, "--id") == n
        assert option(argv, "--config") == "/fedcore/config.toml"
        assert option(argv, "--roster") == "/fedcore/roster.json"
        assert option(argv, "--out") == "/fedcore/out"
        assert option(argv, "--listen") == f"0.0.0.0:{port}"
        assert c["ports"] == [{"name": "grpc", "containerPort": port, "protocol": "TCP"}]
        assert c["workingDir"] == "/fedcore"
        assert {"name": "HOME", "value": "/tmp"} in c["env"]

        # Probes: `fedcore health` of this node on its own port, unless it finished.
        health = ["fedcore", "health", f"127.0.0.1:{port}", "--config", "/fedcore/config.toml"]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c[kind]["exec"]["command"]
            assert probe == ["/bin/sh", "-c", PROBE_WRAPPER, "probe", *health, "--id", n], kind

        # Mounts: the config and roster read-only, its own claim at /fedcore/out, and with TLS
        # its own Secret, only ca.crt and its own pair.
        vols = volumes(sts)
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert all(m["name"] in vols for m in mounts.values())
        for path, key in (
            ("/fedcore/config.toml", "config.toml"),
            ("/fedcore/roster.json", "roster.json"),
        ):
            assert mounts[path]["readOnly"] is True and mounts[path]["subPath"] == key
            assert vols[mounts[path]["name"]]["configMap"]["name"] == configmap["metadata"]["name"]
        claim = vols[mounts["/fedcore/out"]["name"]]["claim"]
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
        assert "emptyDir" in vols[mounts["/tmp"]["name"]]
        secret_volumes = [v for v in vols.values() if "secret" in v]
        if not tls:
            assert not secret_volumes and "/fedcore/certs" not in mounts
            continue
        (volume,) = secret_volumes
        own = ["ca.crt", f"{n}.crt", f"{n}.key"]
        assert mounts["/fedcore/certs"]["name"] == volume["name"]
        assert mounts["/fedcore/certs"]["readOnly"] is True
        assert [i["key"] for i in volume["secret"]["items"]] == own
        secret = secrets[volume["secret"]["secretName"]]
        mounted_secrets.append(secret["metadata"]["name"])
        assert sorted(secret["data"]) == sorted(own)
        # ... whose certificate names this node (the name the peers verify).
        assert cert_node_ids(base64.b64decode(secret["data"][f"{n}.crt"])) == [n]

        pod_security = pod["spec"]["securityContext"]
        assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] == 1000
        assert pod_security["fsGroup"] == 1000
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
    if tls:  # each Secret goes into exactly one pod; the CA's key into none
        assert sorted(mounted_secrets) == sorted(secrets)
        ca_key = (config.transport.tls_dir / "ca.key").read_bytes()  # type: ignore[operator]
        for path in [*(out / "k8s").iterdir(), *out.glob("*.*")]:
            text = path.read_text(encoding="utf-8")
            assert "ca.key" not in text
            assert base64.b64encode(ca_key).decode() not in text
            assert ca_key.decode() not in text
        for n in ids:
            assert (out / "k8s" / f"secret-{n}.yaml").stat().st_mode & 0o077 == 0
    return docs


# --- scenarios ----------------------------------------------------------------------------------


def test_default_config_sixteen_nodes(tmp_path: Path) -> None:
    config = load_config()
    out = tmp_path / "deploy"
    assert write_k8s(config, out) == out / "k8s"
    docs = check_deployment(out, config)
    assert len(by_kind(docs, "StatefulSet")) == 16
    # The pods' config is the same run: same fingerprint, so their peers accept each other.
    inside = load_config(out / "config.toml")
    assert prepare_run(inside).run_id == prepare_run(config).run_id
    c = container(docs["statefulset-n0.yaml"])
    assert c["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "2Gi"},
    }
    assert option(c["args"], "--threads") == "1"


def test_tls_secrets_are_per_node(tmp_path: Path, pki: Path) -> None:
    config = load_config(None, [*SMALL_SET, f"transport.tls.dir={pki}"])
    out = tmp_path / "deploy"
    write_k8s(config, out, name="exp1", namespace="lab")
    docs = check_deployment(out, config, name="exp1", namespace="lab")
    assert sorted(by_kind(docs, "Secret")) == [f"exp1-{n}-tls" for n in IDS]
    # The Secret's files are the node's own, byte for byte.
    secret = docs["secret-n2.yaml"]["data"]
    for name in ("ca.crt", "n2.crt", "n2.key"):
        assert base64.b64decode(secret[name]) == (pki / name).read_bytes()


def test_graph_file_and_options(tmp_path: Path) -> None:
    config = load_config(None, ["topology.file=topologies/ring-8.json", "algorithm.name=dpsgd"])
    out = tmp_path / "deploy"
    resources = Resources(
        cpu="2500m", memory="3Gi", cpu_limit="3", memory_limit=None, storage="5Gi",
        storage_class="fast-ssd",
    )  # fmt: skip
    write_k8s(config, out, port=7100, image="registry.example/fc:1", resources=resources)
    docs = check_deployment(out, config, port=7100)
    data = docs["configmap.yaml"]["data"]
    graph = (REPO / "topologies" / "ring-8.json").read_text(encoding="utf-8")
    assert data["topology-ring-8.json"] == graph
    assert (out / "topology" / "ring-8.json").read_text(encoding="utf-8") == graph
    assert tomllib.loads(data["config.toml"])["topology"]["file"] == "topology/ring-8.json"
    sts = docs["statefulset-n3.yaml"]
    c = container(sts)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/fedcore/topology/ring-8.json"]["subPath"] == "topology-ring-8.json"
    assert c["image"] == "registry.example/fc:1" and c["imagePullPolicy"] == "IfNotPresent"
    assert c["resources"] == {"requests": {"cpu": "2500m", "memory": "3Gi"}, "limits": {"cpu": "3"}}
    assert option(c["args"], "--threads") == "2"
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"] == {"requests": {"storage": "5Gi"}}
    assert claim["storageClassName"] == "fast-ssd"
    # On the host the same config names DIR/topology: `fedcore summarize DIR` finds the graph.
    inside = load_config(out / "config.toml")
    assert Path(inside.topology.file) == (out / "topology" / "ring-8.json").resolve()
    assert prepare_run(inside).graph == prepare_run(config).graph


def test_regenerating_keeps_results_and_drops_former_nodes(tmp_path: Path) -> None:
    out = tmp_path / "deploy"
    write_k8s(load_config(None, ["topology.kind=ring", "topology.nodes=6"]), out)
    (out / "nodes" / "n0").mkdir(parents=True)
    (out / "nodes" / "n0" / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    (out / "k8s" / "notes.yaml").write_text("# mine\n", encoding="utf-8")
    config = load_config(None, SMALL_SET)
    write_k8s(config, out)
    assert (out / "nodes" / "n0" / "metrics.jsonl").exists()
    assert not (out / "k8s" / "statefulset-n5.yaml").exists()
    (out / "k8s" / "notes.yaml").unlink()  # not ours: kept
    check_deployment(out, config)


@pytest.mark.parametrize("bad", ["Alice", "n_1", "n.1", "x" * 53, "-n1"])
def test_node_ids_that_cannot_name_a_statefulset_are_refused(tmp_path: Path, bad: str) -> None:
    ids = ["n0", bad, "n2"]
    graph = tmp_path / "graph.json"
    graph.write_text(
        json.dumps(
            {
                "name": "t",
                "directed": False,
                "nodes": ids,
                "edges": [[a, b] for a, b in zip(ids, ids[1:] + ids[:1], strict=True)],
            }
        ),
        encoding="utf-8",
    )
    config = load_config(None, [f"topology.file={graph}"])
    error = ConfigError if id_problem(bad) is None else TopologyError
    with pytest.raises(error, match=re.escape(repr(bad)[:30])):
        write_k8s(config, tmp_path / "deploy")
    assert not (tmp_path / "deploy").exists()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"port": 0}, "--port"),
        ({"image": "fed core"}, "--image"),
        ({"namespace": "Lab"}, "--namespace"),
        ({"name": "1run"}, "--name"),
        ({"cluster_domain": "bad_domain"}, "--cluster-domain"),
        ({"resources": Resources(cpu="1GB")}, "--cpu '1GB'"),
        ({"resources": Resources(memory="0")}, "--memory"),
        ({"resources": Resources(storage="-1Gi")}, "--storage"),
        ({"resources": Resources(memory="3Gi", memory_limit="2Gi")}, "--memory-limit"),
        ({"resources": Resources(cpu="2", cpu_limit="1500m")}, "--cpu-limit"),
        ({"resources": Resources(storage_class="Fast SSD")}, "--storage-class"),
    ],
)
def test_bad_options_are_refused(tmp_path: Path, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        write_k8s(load_config(None, SMALL_SET), tmp_path / "deploy", **options)
    assert not (tmp_path / "deploy").exists()


def test_missing_or_foreign_certificates_are_refused(tmp_path: Path, pki: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    for f in pki.iterdir():
        if f.name != "n2.key":
            (certs / f.name).write_bytes(f.read_bytes())
    config = load_config(None, [*SMALL_SET, f"transport.tls.dir={certs}"])
    with pytest.raises(ConfigError, match=r"n2\.key.*fedcore certs init --nodes n0 n1 n2 n3"):
        write_k8s(config, tmp_path / "a")
    # n1's certificate under n2's name: the peers would refuse it, so it is refused here.
    (certs / "n2.crt").write_bytes((pki / "n1.crt").read_bytes())
    (certs / "n2.key").write_bytes((pki / "n1.key").read_bytes())
    with pytest.raises(ConfigError, match=r"n2\.crt names \['n1'\], not 'n2'"):
        write_k8s(config, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_cli_k8s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deploy"
    argv = ["k8s", "--out", str(out), "--set", "topology.nodes=4", "--namespace", "lab"]
    status = main([*argv, "--cpu", "500m", "--memory-limit", "0", "--storage", "2Gi"])
    printed, err = capsys.readouterr()
    assert status == 0, err
    for needle in ("kubectl create namespace lab", f"kubectl apply -k {out}", "gather.sh"):
        assert needle in printed
    docs = check_deployment(out, load_config(None, ["topology.nodes=4"]), namespace="lab")
    assert container(docs["statefulset-n1.yaml"])["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"}
    }
    assert main([*argv, "-q"]) == 0
    assert capsys.readouterr()[0].count("\n") == 1


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["k8s", "--out", str(tmp_path / "d"), "--memory", "1GB"])
    printed, err = capsys.readouterr()
    assert status == 2 and "Traceback" not in printed + err
    assert err.count("\n") == 1 and err.startswith("fedcore: error: --memory '1GB'")


# --- the container's wrapper and probe scripts, as processes ---------------------------------


def in_pod(text: str, root: Path) -> str:
    """``text`` with the pod's absolute paths (/fedcore..., /tmp) moved under ``root``."""
    return re.sub(r"(?<![\w./-])(/fedcore|/tmp)(?=/|\b|$)", lambda m: f"{root}{m.group(1)}", text)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts, each in its own session; what is left is killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def wrapper(
    root: Path, processes: list[subprocess.Popen[bytes]], *cmd: str
) -> subprocess.Popen[bytes]:
    (root / "fedcore" / "out").mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["/bin/sh", "-c", in_pod(PEER_WRAPPER, root), "peer", *cmd],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    processes.append(proc)
    return proc


def test_wrapper_runs_the_peer_once_then_idles(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    done = tmp_path / "fedcore" / "out" / "node.json"
    marker = tmp_path / "ran"
    peer = ["/bin/sh", "-c", f"echo ran >> {marker}; echo '{{}}' > {done}"]
    for attempt in (1, 2):  # the second time (a restarted pod) it finds node.json and idles
        proc = wrapper(tmp_path, processes, *peer)
        assert proc.stdout is not None
        assert b"run is done" in proc.stdout.readline()
        time.sleep(0.2)
        assert proc.poll() is None  # stays up for gather.sh
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert marker.read_text(encoding="utf-8") == "ran\n", attempt


def test_wrapper_exits_with_a_failed_peer_and_forwards_sigterm(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    failed = wrapper(tmp_path, processes, "/bin/sh", "-c", "exit 3")
    assert failed.wait(timeout=10) == 3  # the pod restarts, and --resume continues
    running = wrapper(tmp_path, processes, "sleep", "60")
    time.sleep(0.3)
    started = time.monotonic()
    running.send_signal(signal.SIGTERM)
    assert running.wait(timeout=10) == 128 + signal.SIGTERM  # the peer got it and stopped
    assert time.monotonic() - started < 5
    assert not (tmp_path / "fedcore" / "out" / "node.json").exists()


def test_probe_passes_for_a_finished_peer_else_runs_the_check(tmp_path: Path) -> None:
    script = in_pod(PROBE_WRAPPER, tmp_path)
    assert subprocess.run(["/bin/sh", "-c", script, "probe", "false"]).returncode == 1
    (tmp_path / "fedcore" / "out").mkdir(parents=True)
    (tmp_path / "fedcore" / "out" / "node.json").write_text("{}\n", encoding="utf-8")
    assert subprocess.run(["/bin/sh", "-c", script, "probe", "false"]).returncode == 0


# --- the pods' commands as processes: a real run -----------------------------------------------


def materialize(
    docs: dict[str, dict[str, Any]], node: str, root: Path, roster_text: str
) -> dict[str, Any]:
    """Lay out node's pod file system under ``root`` from its manifests (ConfigMap keys and
    Secret items at their mount paths, an empty folder for its claim and the emptyDir), with
    ``roster_text`` for roster.json; return its container."""
    sts = docs[f"statefulset-{node}.yaml"]
    c = container(sts)
    vols = volumes(sts)
    sources = {
        d["metadata"]["name"]: d for d in docs.values() if d["kind"] in ("ConfigMap", "Secret")
    }
    for mount in c["volumeMounts"]:
        target = Path(in_pod(mount["mountPath"], root))
        volume = vols[mount["name"]]
        if "configMap" in volume or "secret" in volume:
            ref = volume.get("configMap", {}).get("name") or volume["secret"]["secretName"]
            source = sources[ref]
            if source["kind"] == "Secret":
                files = {k: base64.b64decode(v) for k, v in source["data"].items()}
            else:
                files = {k: v.encode() for k, v in source["data"].items()}
                files["roster.json"] = roster_text.encode()
            if "subPath" in mount:
                chosen = {"": files[mount["subPath"]]}
            else:
                items = (volume.get("secret") or volume["configMap"]).get("items")
                chosen = {i["path"]: files[i["key"]] for i in items} if items else files
            for path, data in chosen.items():
                file = target / path if path else target
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_bytes(data)
        else:  # the claim (a new, empty volume) or the emptyDir
            assert "claim" in volume or "emptyDir" in volume
            target.mkdir(parents=True, exist_ok=True)
    return c


def shims(folder: Path, pods: dict[str, Path]) -> Path:
    """``fedcore`` (this Python's) and a ``kubectl`` whose ``exec POD -c peer -- CMD`` runs CMD
    with the paths of that pod's folder; return the folder to put first on PATH."""
    folder.mkdir()
    (folder / "fedcore").write_text(f'#!/bin/sh\nexec {sys.executable} -m fedcore "$@"\n')
    roots = "".join(f"  {pod}) root={shlex.quote(str(root))} ;;\n" for pod, root in pods.items())
    (folder / "kubectl").write_text(
        "#!/bin/sh\n"
        '[ "$1 $2 $3" = "--namespace default exec" ] || { echo "kubectl: $*" >&2; exit 2; }\n'
        "pod=$4\nshift 4\n"
        '[ "$1 $2 $3" = "-c peer --" ] || { echo "kubectl: $*" >&2; exit 2; }\n'
        "shift 3\n"
        f'case "$pod" in\n{roots}  *) echo "no pod $pod" >&2; exit 1 ;;\nesac\n'
        'for arg; do\n  shift\n  case "$arg" in /fedcore*) arg="$root$arg" ;; esac\n'
        '  set -- "$@" "$arg"\ndone\nexec "$@"\n'
    )
    for shim in ("fedcore", "kubectl"):
        (folder / shim).chmod(0o755)
    return folder


def wait_for(
    predicate: Callable[[], bool],
    what: str,
    procs: dict[str, subprocess.Popen[bytes]],
    limit: float,
) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        assert not dead, f"waiting for {what}: pods exited {dead}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.grpc
def test_pods_commands_run_the_same_run_as_simulate(
    tmp_path: Path, pki: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Each pod's command and args from its StatefulSet, run as a process on a file system laid
    out from its ConfigMap and Secret, with the generated roster whose host names alone are
    swapped for 127.0.0.1 and free ports; then gather.sh (with a stand-in kubectl) and
    summarize. Mutual TLS on: each peer proves its node id with its own Secret's certificate."""
    config = load_config(None, [*SHORT_RUN, f"transport.tls.dir={pki}"])
    out = tmp_path / "deploy"
    write_k8s(config, out)
    docs = check_deployment(out, config)
    roster_text = docs["configmap.yaml"]["data"]["roster.json"]
    ports = dict(zip(IDS, free_ports(len(IDS)), strict=True))
    for n, port in ports.items():
        entry = f'"{n}-0.fedcore.default.svc.cluster.local:7000"'
        assert roster_text.count(entry) == 1
        roster_text = roster_text.replace(entry, f'"127.0.0.1:{port}"')

    pods = {n: tmp_path / "pods" / n for n in IDS}
    bin_dir = shims(tmp_path / "bin", {f"{n}-0": root for n, root in pods.items()})
    procs: dict[str, subprocess.Popen[bytes]] = {}
    probes: dict[str, list[str]] = {}
    logs: list[IO[bytes]] = []

    def start(n: str) -> None:
        root = pods[n]
        c = materialize(docs, n, root, roster_text)
        argv = [in_pod(a, root) for a in c["command"] + c["args"]]
        argv[argv.index("--listen") + 1] = f"0.0.0.0:{ports[n]}"
        probe = [in_pod(a, root) for a in c["readinessProbe"]["exec"]["command"]]
        probes[n] = [a.replace("127.0.0.1:7000", f"127.0.0.1:{ports[n]}") for a in probe]
        env = {**os.environ, **{e["name"]: in_pod(e["value"], root) for e in c["env"]}}
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        log = open(root / "pod.log", "wb")  # noqa: SIM115 (closed at the end of the test)
        logs.append(log)
        proc = subprocess.Popen(
            argv, cwd=in_pod(c["workingDir"], root), env=env, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip
        processes.append(proc)
        procs[n] = proc

    def pod_log(n: str) -> str:
        return (pods[n] / "pod.log").read_text(errors="replace")

    def stage(n: str) -> str:
        try:
            status = json.loads((pods[n] / "fedcore" / "out" / "status.json").read_text())
        except (OSError, ValueError):
            return ""
        return str(status.get("stage", ""))

    graph = prepare_run(config).graph
    held = min(v for u, v in graph.at(0).edges() if u == "n0" and v != "n0")
    try:
        # All but one peer n0 sends to: n0 serves while it waits for that one (strict mode),
        # and its readiness probe says so; then the last one.
        for n in IDS:
            if n != held:
                start(n)
        wait_for(lambda: stage("n0") == "connecting", "n0 to serve", procs, 60)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        ready = subprocess.run(probes["n0"], env=env, capture_output=True, timeout=60)
        assert ready.returncode == 0 and b"SERVING" in ready.stdout, ready
        assert stage("n0") == "connecting"  # it was still waiting for `held`
        start(held)
        # Every peer finishes, and its wrapper stays up (idle) for gather.sh.
        wait_for(lambda: all("run is done" in pod_log(n) for n in IDS), "the run", procs, 180)
        assert all((pods[n] / "fedcore" / "out" / "node.json").exists() for n in IDS)
        # A finished peer passes its probes without a server.
        assert subprocess.run(probes["n1"], env=env, timeout=30).returncode == 0

        # gather.sh copies; its last step, `fedcore summarize .`, runs in this process below
        # (FEDCORE=true makes it a no-op there), which spares the test a torch import.
        gathered = subprocess.run(
            [str(out / "gather.sh")], env={**env, "FEDCORE": "true"}, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert gathered.returncode == 0, gathered.stderr
        assert "has not finished" not in gathered.stderr
        assert gathered.stdout.count("gather.sh: ") == len(IDS)
    finally:  # SIGTERM, as a pod's deletion sends; an idle wrapper exits 0
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        statuses = {n: proc.wait(timeout=60) for n, proc in procs.items()}
        for log in logs:
            log.close()
    for n, status in statuses.items():
        assert status == 0, f"{n} exited {status}:\n{pod_log(n)[-3000:]}"
    assert "n2: connected; running from round 0" in pod_log("n2")

    for n in IDS:  # gather.sh copied each pod's /fedcore/out into DIR/nodes/<id>/
        assert (out / "nodes" / n / "node.json").read_bytes() == (
            pods[n] / "fedcore" / "out" / "node.json"
        ).read_bytes()
    assert main(["summarize", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    expected = simulate(config, out_dir=tmp_path / "sim", show_progress=False)
    assert summary["transport"] == "grpc" and summary["rounds"] == 6
    assert summary["params_sha256"] == expected["params_sha256"]
    assert summary["traffic"]["messages_sent"] == expected["traffic"]["messages_sent"] > 0
    assert summary["final"]["avg_model_accuracy"] == expected["final"]["avg_model_accuracy"]
    # The certificates the peers used are the Secrets' (load_tls checked names and CA).
    for n in IDS:
        assert load_tls(pods[n] / "fedcore" / "certs", n).cert == (pki / f"{n}.crt").read_bytes()
