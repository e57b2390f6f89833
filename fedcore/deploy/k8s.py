"""``fedcore k8s``: Kubernetes manifests for a run, one StatefulSet per peer.

:func:`write_k8s` validates the config (the same checks as ``launch`` and ``compose``) and
writes a folder that ``kubectl apply -k DIR`` (or ``kubectl apply -f DIR/k8s/``) deploys::

    DIR/kustomization.yaml        lists DIR/k8s/*.yaml (kubectl apply -k DIR)
    DIR/k8s/service.yaml          the headless Service NAME that names every pod
    DIR/k8s/configmap.yaml        NAME-config: config.toml, roster.json (and the graph file)
    DIR/k8s/secret-<id>.yaml      NAME-<id>-tls: ca.crt, <id>.crt, <id>.key (with TLS; 0600)
    DIR/k8s/statefulset-<id>.yaml the peer <id>: a StatefulSet <id> of one pod, <id>-0
    DIR/gather.sh                 copies each pod's /fedcore/out to DIR/nodes/<id>/, summarizes
    DIR/config.toml, roster.json  the ConfigMap's files, for ``fedcore summarize DIR``
    DIR/topology/<file>           the graph file, when the graph comes from one

Why one StatefulSet per peer, not one StatefulSet of N replicas: a peer's Secret (its
private key) must be mounted into its own pod only, and the pods of one StatefulSet share
one pod template, so they would all mount the same Secrets. One StatefulSet per node
(``replicas: 1``, ``serviceName`` the shared headless Service) keeps what a StatefulSet
gives, a stable network identity and a volume claim that follows the pod across restarts
and rescheduling, and lets each pod template name its own Secret. The node id is the
StatefulSet's name, so:

    pod <id>-0  ->  DNS <id>-0.NAME.NAMESPACE.svc.CLUSTER_DOMAIN  (hostname.subdomain)
                ->  roster entry  "<id>": "<id>-0.NAME.NAMESPACE.svc.CLUSTER_DOMAIN:PORT"
                ->  node id <id>  ->  certificate <id>.crt, whose DNS name is <id>

The DNS name is only how a peer is reached, not what it must prove: the gRPC transport
opens each channel with ``grpc.ssl_target_name_override`` set to the peer's node id
(:func:`fedcore.transport.grpc.channel.open_channel`), so the client checks that the
server's certificate names the node id it meant to reach, whatever DNS name or address
led there; and the server checks that a message's sender is the node its client
certificate names. The certificates from ``fedcore certs init`` therefore need no pod DNS
names, and :func:`write_k8s` checks (:func:`fedcore.certs.load_tls`) that each node's
certificate names it and was signed by the CA before writing its Secret.

The Service publishes not-ready addresses: a peer resolves and connects to its
out-neighbours while they start (strict mode waits for them), before any is ready.

A pod's container (image default ``fedcore:latest``, the image of ``nodes/Dockerfile``;
working directory ``/fedcore``) sees the compose layout: ``/fedcore/config.toml`` and
``/fedcore/roster.json`` (ConfigMap keys, read-only), ``/fedcore/topology/<file>``,
``/fedcore/certs/`` (ca.crt and its own pair from its Secret, never ``ca.key``; mode
0440, group-readable through ``fsGroup``), ``/fedcore/out`` (its volume claim ``out``:
metrics, models, checkpoints) and ``/tmp`` (an emptyDir; ``HOME=/tmp`` for caches, as the
root file system is read-only). The config names the graph file and the certificate folder
relative to itself (``topology/<file>``, ``certs``), which :func:`fedcore.config.load_config`
resolves against the config file's folder: ``/fedcore`` in a pod, ``DIR`` on the host.

The container runs ``fedcore node --config ... --id <id> --roster ... --listen
0.0.0.0:PORT --out /fedcore/out --resume`` (its ``args``) under a small ``/bin/sh``
wrapper (its ``command``, :data:`PEER_WRAPPER`). A StatefulSet's pods always restart
(``restartPolicy: Always`` is the only one allowed), so the wrapper: runs the peer unless
``/fedcore/out/node.json`` says it already finished (a restarted pod must not run a
finished run again); exits with the peer's status when it fails, so the pod restarts and
``--resume`` continues from its newest checkpoint (``run.checkpoint_every``); forwards
SIGTERM to the peer, which stops cleanly; and after a finished run stays up, idle, so that
``gather.sh`` can copy the results out of the running pod (``kubectl exec ... tar``, what
``kubectl cp`` does).

Probes (startup, readiness, liveness) exec ``fedcore health 127.0.0.1:PORT --config
/fedcore/config.toml --id <id>`` (over mutual TLS with the pod's own certificate when TLS
is on), through ``sh -c 'test -e /fedcore/out/node.json || exec "$@"'``, so that a peer
that finished and idles is neither restarted nor reported unready. The startup probe
allows up to ten minutes for imports, the data split and the model build before the
liveness probe takes over.

Pods run as the image's user ``fedcore`` (uid and gid 1000, ``runAsNonRoot``), with
``fsGroup`` 1000 so the volume claim is writable, no privilege escalation, every
capability dropped, the runtime's default seccomp profile, no service account token and no
service links. Resource requests (and limits) come from the options; torch gets as many
intra-op threads (``fedcore node --threads``) as whole cores requested (at least one).

The volume claims stay when a StatefulSet is deleted (``Retain``): they hold the results.
Delete them (``kubectl delete pvc -n NAMESPACE -l app.kubernetes.io/instance=NAME``)
before a new run under the same names, or a peer finds the old ``node.json`` and idles.

No cluster was run to write this: the manifests are validated against the Kubernetes
schemas offline and the pods' commands run as local processes in the tests.

Each peer's StatefulSet, with its :class:`~fedcore.deploy.k8s_statefulset.Resources`, is
built in :mod:`fedcore.deploy.k8s_statefulset`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fedcore
from fedcore.certs import load_tls
from fedcore.config import Config, dumps_toml
from fedcore.deploy.compose import (
    _OUT,
    CONTAINER_ROOT,
    DEFAULT_IMAGE,
    DEFAULT_PORT,
    _container_config,
    _tls_files,
    check_image_and_port,
)
from fedcore.deploy.k8s_statefulset import (
    _CERTS,
    _CONTAINER,
    _DNS_LABEL,
    _DOMAIN,
    _DONE,
    _GRAPHS,
    _STS_NAME,
    Resources,
    _labels,
    _meta,
    _statefulset,
)
from fedcore.deploy.plugins import refuse_registered_here
from fedcore.deploy.yamlout import dumps_yaml
from fedcore.errors import ConfigError
from fedcore.ids import child_path, clip
from fedcore.setup.plan import plan_run

__all__ = [
    "CONTAINER_ROOT",
    "DEFAULT_NAME",
    "DEFAULT_NAMESPACE",
    "k8s_manifests",
    "kubectl_steps",
    "pod_dns_name",
    "write_k8s",
]

logger = logging.getLogger(__name__)

DEFAULT_NAME = "fedcore"
DEFAULT_NAMESPACE = "default"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"


_CONFIGMAP_LIMIT = 1 << 20  # the API server refuses a ConfigMap over 1 MiB


_SERVICE_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,40}[a-z0-9])?")  # DNS-1035, room for suffixes


_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def pod_dns_name(
    node: str,
    *,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
) -> str:
    """The DNS name of peer ``node``'s pod: ``<node>-0.<service>.<namespace>.svc.<domain>``."""
    return f"{node}-0.{name}.{namespace}.svc.{cluster_domain}"


def _check_names(
    nodes: Sequence[str], *, name: str, namespace: str, cluster_domain: str, image: str, port: int
) -> None:
    bad = [n for n in nodes if not _STS_NAME.fullmatch(n)]
    if bad:
        raise ConfigError(
            f"node id {clip(bad[0], 60)} cannot name a Kubernetes StatefulSet and its pod's "
            "host name: a node id here is lowercase letters, digits and '-', starts and ends "
            "with a letter or digit, and has at most 52 characters. Rename it in the graph."
        )
    if not _SERVICE_NAME.fullmatch(name):
        raise ConfigError(
            f"--name {clip(name, 60)} cannot name the Service: lowercase letters, digits and "
            "'-', starting with a letter, at most 42 characters."
        )
    if not _DNS_LABEL.fullmatch(namespace):
        raise ConfigError(
            f"--namespace {clip(namespace, 60)} is not a namespace name: lowercase letters, "
            "digits and '-', at most 63 characters."
        )
    if not _DOMAIN.fullmatch(cluster_domain) or len(cluster_domain) > 200:
        raise ConfigError(
            f"--cluster-domain {clip(cluster_domain, 60)} is not a DNS domain "
            f"(e.g. {DEFAULT_CLUSTER_DOMAIN})."
        )
    check_image_and_port(image, port)


def _pod_config(config: Config) -> dict[str, dict[str, Any]]:
    """The config tables a pod reads: the graph file and certificates relative to it."""
    return _container_config(config, certs=_CERTS)


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def k8s_manifests(
    config: Config,
    *,
    image: str = DEFAULT_IMAGE,
    port: int = DEFAULT_PORT,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    resources: Resources | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every manifest of a run (file name in ``DIR/k8s`` -> object) and its roster.

    Validates first (the config's run plan, names, quantities, certificates; no data);
    see :func:`write_k8s` for the arguments.
    """
    resources = resources or Resources()
    resources.check()
    refuse_registered_here(config, "the pods of a deployment")
    plan = plan_run(config)
    nodes = list(plan.graph.nodes)
    _check_names(
        nodes, name=name, namespace=namespace, cluster_domain=cluster_domain, image=image, port=port
    )
    roster = {
        n: f"{pod_dns_name(n, name=name, namespace=namespace, cluster_domain=cluster_domain)}:"
        f"{port}"
        for n in nodes
    }
    certs = _tls_files(config, nodes, nodes)
    if config.transport.tls_dir is not None:
        for n in nodes:  # each certificate names its node and is the CA's, before writing
            load_tls(config.transport.tls_dir, n)

    data = {
        "config.toml": dumps_toml(_pod_config(config)),
        "roster.json": json.dumps(roster, indent=2) + "\n",
    }
    binary: dict[str, str] = {}
    graph_key = graph_name = None
    if config.topology.file:
        graph = Path(config.topology.file)
        graph_name = graph.name
        graph_key = f"{_GRAPHS}-{graph_name}"
        if not _CONFIG_KEY.fullmatch(graph_key):
            raise ConfigError(
                f"topology.file: {clip(graph_name, 60)} cannot be a ConfigMap key; rename the "
                "file to letters, digits, '-', '_' and '.'."
            )
        content = graph.read_bytes()
        try:
            data[graph_key] = content.decode("utf-8")
        except UnicodeDecodeError:
            binary[graph_key] = _encode(content)
    size = sum(len(v.encode()) for v in data.values()) + sum(len(v) for v in binary.values())
    if size > _CONFIGMAP_LIMIT:
        raise ConfigError(
            f"the ConfigMap would hold {size} bytes (config, roster and graph file), over "
            "Kubernetes' 1 MiB; use a generated topology (topology.kind) instead of a file."
        )
    configmap: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(f"{name}-config", namespace, _labels(name)),
        "data": data,
    }
    if binary:
        configmap["binaryData"] = binary
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, _labels(name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {
                k: v for k, v in _labels(name).items() if k != "app.kubernetes.io/managed-by"
            },
            "ports": [{"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"}],
        },
    }
    manifests: dict[str, dict[str, Any]] = {
        "configmap.yaml": configmap,
        "service.yaml": service,
    }
    for n in nodes:
        if certs:
            manifests[f"secret-{n}.yaml"] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": _meta(f"{name}-{n}-tls", namespace, _labels(name, n)),
                "type": "Opaque",
                "data": {
                    f: _encode(certs[f].read_bytes()) for f in ("ca.crt", f"{n}.crt", f"{n}.key")
                },
            }
        manifests[f"statefulset-{n}.yaml"] = _statefulset(
            n,
            name=name,
            namespace=namespace,
            image=image,
            port=port,
            resources=resources,
            graph_key=graph_key,
            graph_name=graph_name,
            tls=bool(certs),
        )
    return dict(sorted(manifests.items())), roster


def _gather_script(nodes: Sequence[str], namespace: str) -> str:
    ids = " ".join(nodes)
    return f"""\
#!/bin/sh
# Generated by `fedcore k8s` (fedcore {fedcore.__version__}): copy each peer's {_OUT} out of
# its pod into nodes/<id>/ beside this script (kubectl exec ... tar, what kubectl cp does),
# then merge them: fedcore summarize. Run it when the peers are done (kubectl logs POD says
# so); a peer that is not done yet counts as down from its last round.
# NAMESPACE, KUBECTL (e.g. "microk8s kubectl") and FEDCORE override the defaults.
set -eu
cd "$(dirname "$0")"
NAMESPACE="${{NAMESPACE:-{namespace}}}"
KUBECTL="${{KUBECTL:-kubectl}}"
FEDCORE="${{FEDCORE:-fedcore}}"
for node in {ids}; do
  pod="$node-0"
  if ! $KUBECTL --namespace "$NAMESPACE" exec "$pod" -c {_CONTAINER} -- test -e {_DONE}; then
    echo "gather.sh: $node has not finished (no {_DONE} in $pod)" >&2
  fi
  mkdir -p "nodes/$node"
  $KUBECTL --namespace "$NAMESPACE" exec "$pod" -c {_CONTAINER} -- tar cf - -C {_OUT} . \\
    > "nodes/$node.tar"
  tar xf "nodes/$node.tar" -C "nodes/$node"
  rm -f "nodes/$node.tar"
  echo "gather.sh: $pod:{_OUT} -> nodes/$node/"
done
$FEDCORE summarize .
"""


def write_k8s(
    config: Config,
    out: str | Path,
    *,
    image: str = DEFAULT_IMAGE,
    port: int = DEFAULT_PORT,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    resources: Resources | None = None,
) -> Path:
    """Write Kubernetes manifests of ``config`` into ``out``; return ``out/k8s``.

    Args:
        config: The experiment; its run plan is checked here (graph, weights, the cheap
            checks), without loading its data or building its model.
        out: The folder to write (created; gathered ``nodes/`` folders are kept, and
            manifests of nodes no longer in the graph are removed from ``out/k8s``).
        image: Every peer's image (``nodes/Dockerfile``), pulled if not present.
        port: The port every peer listens on.
        name: The headless Service's name, also the prefix of the ConfigMap and Secrets and
            the ``app.kubernetes.io/instance`` label of every object.
        namespace: The namespace of every object (it must exist); part of the pods' DNS
            names in the roster.
        cluster_domain: The cluster's DNS domain (kubelet ``clusterDomain``).
        resources: Each peer's requests, limits and volume size (default: :class:`Resources`).

    Raises:
        ConfigError: an invalid config, a node id that cannot name a StatefulSet, a bad
            name, namespace, port, image or quantity, missing or wrong certificates.
        TopologyError: an invalid graph (as the run plan checks it).
    """
    manifests, roster = k8s_manifests(
        config,
        image=image,
        port=port,
        name=name,
        namespace=namespace,
        cluster_domain=cluster_domain,
        resources=resources,
    )
    nodes = list(roster)
    configmap = manifests["configmap.yaml"]

    # Every check passed: write.
    target = Path(out)
    folder = target / "k8s"
    folder.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Generated by `fedcore k8s` (fedcore {fedcore.__version__}) for {len(nodes)} peers; "
        "apply with: kubectl apply -k DIR (or -f DIR/k8s/)\n"
    )
    for old in folder.glob("*.yaml"):  # a former graph's nodes: not to be applied again
        if old.name not in manifests and re.fullmatch(r"(secret|statefulset)-.+\.yaml", old.name):
            old.unlink()
    for file, document in manifests.items():
        path = folder / file
        text = header + dumps_yaml(document)
        if document["kind"] == "Secret":  # a private key: the owner's eyes only
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            path.write_text(text, encoding="utf-8")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"k8s/{file}" for file in manifests],
    }
    (target / "kustomization.yaml").write_text(header + dumps_yaml(kustomization), encoding="utf-8")
    # The host's copies, for `fedcore summarize DIR` (the same text as the ConfigMap's).
    data = configmap["data"]
    (target / "config.toml").write_text(data["config.toml"], encoding="utf-8")
    (target / "roster.json").write_text(data["roster.json"], encoding="utf-8")
    if config.topology.file:
        graph = Path(config.topology.file)
        copy = child_path(target / _GRAPHS, graph.name, ConfigError)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(graph.read_bytes())
    gather = target / "gather.sh"
    gather.write_text(_gather_script(nodes, namespace), encoding="utf-8")
    gather.chmod(0o755)
    logger.info("wrote %s: %d manifests for %d peers", folder, len(manifests), len(nodes))
    return folder


def kubectl_steps(out: Path, *, name: str, namespace: str, image: str) -> list[str]:
    """The commands to run a written folder, for the CLI to print."""
    where = shlex.quote(str(out))
    steps = [
        f"docker build -t {image} -f nodes/Dockerfile .   # in a fedcore checkout; push it "
        f"where the cluster pulls from (kind: kind load docker-image {image})",
    ]
    if namespace != DEFAULT_NAMESPACE:
        steps.append(f"kubectl create namespace {namespace}   # unless it exists")
    steps += [
        f"kubectl apply -k {where}   # or: kubectl apply -f {where}/k8s/",
        f"kubectl get pods -n {namespace} -l app.kubernetes.io/instance={name} -w",
        f"{where}/gather.sh   # when the peers are done: copies nodes/<id>/, then summarizes",
    ]
    return steps
