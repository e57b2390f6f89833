"""One peer's StatefulSet in ``fedcore k8s``'s manifests: its pod template (the peer's
container, wrapper script, probes, mounts, security context), its volume claim, and the
peer's :class:`Resources` as Kubernetes quantities."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from fedcore.deploy.compose import _CONFIG, _OUT, _ROSTER, CONTAINER_ROOT, health_args, peer_args
from fedcore.errors import ConfigError
from fedcore.ids import clip

__all__ = ["PEER_WRAPPER", "PROBE_WRAPPER", "Resources"]


_DONE = f"{_OUT}/node.json"  # written by a peer at the end of its run
_GRAPHS = "topology"  # relative to the config file: /fedcore/topology in a pod, DIR/topology
_CERTS = "certs"  # relative to the config file, as _GRAPHS
_UID = 1000  # the image's user `fedcore` (nodes/Dockerfile)
_CONTAINER = "peer"


PEER_WRAPPER = f"""\
# Run the peer ("$@": fedcore node ... --resume) unless it finished before, then stay up
# so that gather.sh can copy {_OUT}. A failed peer exits: the pod restarts and resumes.
trap 'exit 143' TERM INT
if [ ! -e {_DONE} ]; then
  "$@" &
  peer=$!
  trap 'kill -TERM "$peer" 2>/dev/null' TERM INT
  while :; do
    wait "$peer"
    status=$?
    kill -0 "$peer" 2>/dev/null || break
  done
  [ "$status" -eq 0 ] || exit "$status"
fi
echo "fedcore: this peer's run is done; results in {_OUT} (gather.sh copies them)"
trap 'kill "$pause" 2>/dev/null; exit 0' TERM INT
while :; do
  sleep 86400 &
  pause=$!
  wait "$pause"
done
"""
"""The container's ``/bin/sh -c`` script; its arguments (``$@``) are the peer's command."""

PROBE_WRAPPER = f'test -e {_DONE} || exec "$@"'
"""The probes' ``/bin/sh -c`` script: a finished peer passes, else ``fedcore health``."""

# Probe timing. `fedcore health` starts a Python process (a second or two) and waits up to
# 5 s for the answer; the startup probe covers imports, the data split and the model build.
_PROBES = {
    "startupProbe": {"periodSeconds": 10, "timeoutSeconds": 20, "failureThreshold": 60},
    "readinessProbe": {"periodSeconds": 30, "timeoutSeconds": 20, "failureThreshold": 2},
    "livenessProbe": {"periodSeconds": 30, "timeoutSeconds": 20, "failureThreshold": 3},
}

# A StatefulSet's name is a DNS label, and its pods carry a label `controller-revision-hash`
# = "<name>-<hash of up to 10 characters>", at most 63 characters: names of at most 52.
_STS_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,50}[a-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


_DOMAIN = re.compile(rf"{_DNS_LABEL.pattern}(?:\.{_DNS_LABEL.pattern})*")


_QUANTITY = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIX = {
    None: Fraction(1), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
    "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30),
    "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}  # fmt: skip


@dataclass(frozen=True)
class Resources:
    """Each peer's resources, as Kubernetes quantities (``"500m"``, ``"2"``, ``"1Gi"``).

    The defaults fit the built-in experiments (a small model, one torch thread): one CPU
    and 1 GiB requested, memory limited to 2 GiB (a peer past it is killed, not the node),
    CPU unlimited (a limit only throttles a peer that could use idle cores), 1 GiB of
    storage for the metrics, models and checkpoints.
    """

    cpu: str = "1"
    memory: str = "1Gi"
    cpu_limit: str | None = None
    memory_limit: str | None = "2Gi"
    storage: str = "1Gi"
    storage_class: str | None = None
    """The volume claims' ``storageClassName`` (None: the cluster's default class)."""

    def check(self) -> None:
        """Raise ConfigError for a value that is not a quantity or a request over its limit."""
        for flag, value in (
            ("--cpu", self.cpu),
            ("--memory", self.memory),
            ("--cpu-limit", self.cpu_limit),
            ("--memory-limit", self.memory_limit),
            ("--storage", self.storage),
        ):
            if value is not None:
                _quantity(flag, value)
        for kind, request, limit in (
            ("cpu", self.cpu, self.cpu_limit),
            ("memory", self.memory, self.memory_limit),
        ):
            if limit is not None and _quantity("", request) > _quantity("", limit):
                raise ConfigError(
                    f"--{kind} {request} is more than --{kind}-limit {limit}; a request "
                    "cannot exceed its limit."
                )
        if self.storage_class is not None and not _DOMAIN.fullmatch(self.storage_class):
            raise ConfigError(
                f"--storage-class {clip(self.storage_class, 40)} is not a storage class name "
                "(lowercase letters, digits, '-' and '.')."
            )

    def threads(self) -> int:
        """Torch intra-op threads for the requested CPU: its whole cores, at least one."""
        return max(1, int(_quantity("--cpu", self.cpu)))

    def spec(self) -> dict[str, dict[str, str]]:
        """The container's ``resources``."""
        limits = {k: v for k, v in (("cpu", self.cpu_limit), ("memory", self.memory_limit)) if v}
        spec = {"requests": {"cpu": self.cpu, "memory": self.memory}}
        if limits:
            spec["limits"] = limits
        return spec


def _quantity(flag: str, text: str) -> Fraction:
    match = _QUANTITY.fullmatch(text)
    value = Fraction(match.group(1)) * _SUFFIX[match.group(2)] if match else Fraction(0)
    if value <= 0:
        raise ConfigError(
            f"{flag} {clip(text, 40)} is not a positive Kubernetes quantity; write e.g. "
            "500m or 2 (CPUs), 512Mi or 4Gi (bytes)."
        )
    return value


def _labels(name: str, node: str | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "fedcore",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "peer",
        "app.kubernetes.io/managed-by": "fedcore-k8s",
    }
    if node is not None:
        labels["fedcore/node"] = node
    return labels


def _meta(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def _probe(node: str, port: int, timing: Mapping[str, int]) -> dict[str, Any]:
    health = health_args(node, port)
    return {"exec": {"command": ["/bin/sh", "-c", PROBE_WRAPPER, "probe", *health]}, **timing}


def _statefulset(
    node: str,
    *,
    name: str,
    namespace: str,
    image: str,
    port: int,
    resources: Resources,
    graph_key: str | None,
    graph_name: str | None,
    tls: bool,
) -> dict[str, Any]:
    labels = _labels(name, node)
    peer = ["fedcore", *peer_args(node, port), "--threads", str(resources.threads())]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": _CONFIG, "subPath": "config.toml", "readOnly": True},
        {"name": "config", "mountPath": _ROSTER, "subPath": "roster.json", "readOnly": True},
    ]
    if graph_key is not None:
        mounts.append(
            {
                "name": "config",
                "mountPath": f"{CONTAINER_ROOT}/{_GRAPHS}/{graph_name}",
                "subPath": graph_key,
                "readOnly": True,
            }
        )
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": f"{name}-config"}}]
    if tls:
        mounts.append(
            {"name": "certs", "mountPath": f"{CONTAINER_ROOT}/{_CERTS}", "readOnly": True}
        )
        files = ["ca.crt", f"{node}.crt", f"{node}.key"]
        volumes.append(
            {
                "name": "certs",
                "secret": {
                    "secretName": f"{name}-{node}-tls",
                    "items": [{"key": f, "path": f} for f in files],
                    "defaultMode": 0o440,
                },
            }
        )
    mounts += [{"name": "out", "mountPath": _OUT}, {"name": "tmp", "mountPath": "/tmp"}]
    volumes.append({"name": "tmp", "emptyDir": {}})
    container = {
        "name": _CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": CONTAINER_ROOT,
        "command": ["/bin/sh", "-c", PEER_WRAPPER, "peer"],
        "args": peer,
        "env": [
            # HOME for caches (matplotlib, torch) on the writable /tmp.
            {"name": "HOME", "value": "/tmp"},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "ports": [{"name": "grpc", "containerPort": port, "protocol": "TCP"}],
        "resources": resources.spec(),
        **{kind: _probe(node, port, timing) for kind, timing in _PROBES.items()},
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": resources.storage}},
    }
    if resources.storage_class is not None:
        claim_spec["storageClassName"] = resources.storage_class
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "fedcore/node")}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(node, namespace, labels),
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain",
                "whenScaled": "Retain",
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": _UID,
                        "runAsGroup": _UID,
                        "fsGroup": _UID,
                        "fsGroupChangePolicy": "OnRootMismatch",
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
            "volumeClaimTemplates": [
                {"metadata": {"name": "out", "labels": _labels(name, node)}, "spec": claim_spec}
            ],
        },
    }
