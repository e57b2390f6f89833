"""``fedcore compose --swarm``: a Docker Swarm stack of a run, one service per peer.

:func:`write_stack` validates the config (the same checks as ``launch``) and writes a folder
for ``docker stack deploy``::

    DIR/docker-stack.yml   one service per node: service name = hostname = node id
    DIR/config.toml        the effective config, rewritten for the containers (a swarm config)
    DIR/roster.json        node id -> "<service>:<port>" (a swarm config)
    DIR/certs/             ca.crt and each node's <id>.crt / <id>.key (swarm secrets), with TLS
    DIR/topology/<file>    the graph file, when the graph comes from one (a swarm config)
    DIR/gather.sh          after the run, on each host: copy its peers' results to nodes/<id>/

How it differs from a compose deployment (:mod:`fedcore.deploy.compose`), and why:

- **Nothing is bind-mounted.** A service may run on any host of the swarm, where this folder
  is not. The config, the roster and the graph are swarm *configs* and the certificates and
  keys swarm *secrets*: ``docker stack deploy`` reads them here once and the managers keep
  them (secrets encrypted in their Raft log); a task gets only ``ca.crt`` and its own pair,
  in memory (tmpfs), under ``/fedcore/certs``, readable by the image's user only
  (the key with mode 0400). Never ``ca.key``.
- **Results live in a named volume per peer** (``<id>-out`` at ``/fedcore/out``), on the host
  that runs it, so a restarted task on that host resumes from its checkpoints (``--resume``).
  ``gather.sh STACK`` copies each peer's folder out of its newest container into
  ``nodes/<id>/``; with the folders of every host in one ``nodes/``, ``fedcore summarize .``
  merges them as for compose.
- **One encrypted overlay network** (``peers``: IPsec between hosts), internal: peers talk to
  each other by service name and to nothing outside the swarm. No port is published.
- **deploy:** one replica; ``restart_policy`` on failure (a crashed peer comes back and
  resumes; one that finished, exit 0, stays done); with ``placement`` (node id -> host label
  value), a placement constraint ``node.labels.fedcore.host == <value>`` pins the peer to the
  hosts labelled so (``docker node update --label-add fedcore.host=<value> <host>``).
- The image's own user (uid 1000) runs the peer; the image must exist on every host (built
  there, loaded with ``docker load``, or pulled from a registry: ``image``).

The health check is ``fedcore health`` against the peer's own gRPC health service, as in
compose. Secrets and configs of a deployed stack cannot change: to deploy new certificates
or a new config, ``docker stack rm`` first.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fedcore
from fedcore.config import Config, dumps_toml
from fedcore.deploy.compose import (
    _CERTS,
    _CONFIG,
    _GRAPHS,
    _HEALTH,
    _OUT,
    _ROSTER,
    CONTAINER_ROOT,
    DEFAULT_IMAGE,
    DEFAULT_PORT,
    _container_config,
    _copy,
    _tls_files,
    check_image_and_port,
    health_args,
    peer_args,
    service_ids,
)
from fedcore.deploy.yamlout import dumps_yaml
from fedcore.errors import ConfigError
from fedcore.ids import child_path, clip

__all__ = ["HOST_LABEL", "IMAGE_UID", "stack_document", "write_stack"]

logger = logging.getLogger(__name__)

HOST_LABEL = "fedcore.host"
"""The swarm node label that ``placement`` pins peers by."""
IMAGE_UID = "1000"
"""The image's user ``fedcore`` (nodes/Dockerfile): owner of the mounted secrets."""
NETWORK = "peers"
# A swarm routes a service's name to its task only once the task is healthy (with a health
# check), so peers reach each other only after the first passing check: check every 10 s, not
# compose's 30 s (measured: 4 peers connected 25 s after serving with 30 s). A check is
# `fedcore health`, about 0.3 s of CPU.
_SWARM_HEALTH = {**_HEALTH, "interval": "10s", "start_period": "120s"}
_SECRET_MODE = 0o400
_PUBLIC_MODE = 0o444


def _secret_name(file: str) -> str:
    """``ca.crt`` -> ``ca-crt``, ``n0.key`` -> ``n0-key`` (swarm names: no dots needed)."""
    return file.replace(".", "-")


def _check_placement(placement: Mapping[str, str], nodes: list[str]) -> None:
    unknown = [n for n in placement if n not in nodes]
    if unknown:
        raise ConfigError(
            f"--place: {clip(unknown[0], 40)} is not a node of the graph; its nodes are "
            f"{', '.join(nodes)}."
        )
    for node, value in placement.items():
        # A label value in a constraint: keep it to what needs no quoting anywhere.
        if not value or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in value):
            raise ConfigError(
                f"--place {node}={clip(value, 40)}: a host label value is letters, digits, "
                "'-', '_' and '.' (e.g. host-a)."
            )


def stack_document(
    config: Config,
    nodes: list[str],
    *,
    image: str = DEFAULT_IMAGE,
    port: int = DEFAULT_PORT,
    placement: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The stack file: one service per node, the network, configs, secrets and volumes."""
    tls = config.transport.tls_dir is not None
    placement = placement or {}
    configs: dict[str, Any] = {
        "config": {"file": "./config.toml"},
        "roster": {"file": "./roster.json"},
    }
    if config.topology.file:
        name = Path(config.topology.file).name
        configs["topology"] = {"file": f"./{_GRAPHS}/{name}"}
    secrets: dict[str, Any] = {}
    if tls:
        for file in ["ca.crt"] + [f"{n}.{ext}" for n in nodes for ext in ("crt", "key")]:
            secrets[_secret_name(file)] = {"file": f"./certs/{file}"}
    services: dict[str, Any] = {}
    for n in nodes:
        mounted: list[dict[str, Any]] = [
            {"source": "config", "target": _CONFIG, "mode": _PUBLIC_MODE},
            {"source": "roster", "target": _ROSTER, "mode": _PUBLIC_MODE},
        ]
        if config.topology.file:
            target = f"{CONTAINER_ROOT}/{_GRAPHS}/{Path(config.topology.file).name}"
            mounted.append({"source": "topology", "target": target, "mode": _PUBLIC_MODE})
        service: dict[str, Any] = {
            "image": image,
            "hostname": n,
            "working_dir": CONTAINER_ROOT,
            "environment": {"HOME": "/tmp", "PYTHONUNBUFFERED": "1"},
            "entrypoint": ["fedcore"],
            "command": peer_args(n, port),
            "networks": [NETWORK],
            "volumes": [f"{n}-out:{_OUT}"],
            "configs": mounted,
        }
        if tls:
            service["secrets"] = [
                {
                    "source": _secret_name(file),
                    "target": f"{_CERTS}/{file}",
                    "uid": IMAGE_UID,
                    "gid": IMAGE_UID,
                    "mode": _SECRET_MODE if file.endswith(".key") else _PUBLIC_MODE,
                }
                for file in ("ca.crt", f"{n}.crt", f"{n}.key")
            ]
        service["healthcheck"] = {"test": ["CMD", *health_args(n, port)], **_SWARM_HEALTH}
        deploy: dict[str, Any] = {
            "replicas": 1,
            "restart_policy": {"condition": "on-failure", "delay": "2s", "window": "30s"},
        }
        if n in placement:
            deploy["placement"] = {"constraints": [f"node.labels.{HOST_LABEL} == {placement[n]}"]}
        service["deploy"] = deploy
        services[n] = service
    document: dict[str, Any] = {
        "version": "3.8",
        "services": services,
        "networks": {
            NETWORK: {"driver": "overlay", "internal": True, "driver_opts": {"encrypted": "true"}}
        },
        "volumes": {f"{n}-out": {} for n in nodes},
        "configs": configs,
    }
    if secrets:
        document["secrets"] = secrets
    return document


def _gather_script(nodes: list[str]) -> str:
    ids = " ".join(shlex.quote(n) for n in nodes)
    return f"""#!/bin/sh
# Generated by `fedcore compose --swarm` (fedcore {fedcore.__version__}).
# After the run, on every host of the swarm: copy the results of each peer whose newest
# container is on this host into nodes/<id>/ beside this script. Then bring every host's nodes/
# folders together beside config.toml and run: fedcore summarize .
# Usage: sh gather.sh [STACK]   (STACK: the name given to docker stack deploy; default fedcore)
set -eu
cd "$(dirname "$0")"
stack="${{1:-fedcore}}"
found=0
for id in {ids}; do
    # Not in a pipeline: a docker that fails (no daemon, no permission) stops the script.
    containers=$(docker ps -a -q --filter "label=com.docker.swarm.service.name=${{stack}}_${{id}}")
    container=$(printf '%s\\n' "$containers" | head -n 1)
    [ -n "$container" ] || continue
    rm -rf "nodes/$id"
    mkdir -p "nodes/$id"
    docker cp "$container:{_OUT}/." "nodes/$id/"
    found=$((found + 1))
    echo "gathered $id"
done
echo "$found peer folder(s) gathered on this host into nodes/"
"""


def write_stack(
    config: Config,
    out: str | Path,
    *,
    image: str = DEFAULT_IMAGE,
    port: int = DEFAULT_PORT,
    placement: Mapping[str, str] | None = None,
) -> Path:
    """Write a Docker Swarm stack of ``config`` into ``out``; return the stack file.

    Args:
        config: The experiment; its run plan is checked here (graph, weights, the cheap
            checks), without loading its data or building its model.
        out: The folder to write (created).
        image: The image of every service (it must exist on every host of the swarm).
        port: The port every peer listens on, on the overlay network.
        placement: Node id -> value of the host label ``fedcore.host`` to pin it to.

    Raises:
        ConfigError: an invalid config, a node id that is not a valid service name, missing
            certificate files, a bad port, image or placement.
        TopologyError: an invalid graph (as the run plan checks it).
    """
    check_image_and_port(image, port)
    ids = service_ids(config)
    _check_placement(placement or {}, ids)
    certs = _tls_files(config, ids, ids)
    graph_file = Path(config.topology.file) if config.topology.file else None
    document = stack_document(config, ids, image=image, port=port, placement=placement)

    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    if graph_file is not None:
        _copy(graph_file, target / _GRAPHS / graph_file.name)
    for name, src in certs.items():
        _copy(src, child_path(target / "certs", name, ConfigError), private=name.endswith(".key"))
    (target / "nodes").mkdir(exist_ok=True)
    (target / "config.toml").write_text(dumps_toml(_container_config(config)), encoding="utf-8")
    roster = {n: f"{n}:{port}" for n in ids}
    (target / "roster.json").write_text(json.dumps(roster, indent=2) + "\n", encoding="utf-8")
    gather = target / "gather.sh"
    gather.write_text(_gather_script(ids), encoding="utf-8")
    os.chmod(gather, 0o755)
    header = (
        f"# Generated by `fedcore compose --swarm` (fedcore {fedcore.__version__}): one "
        f"service per peer, {len(ids)}.\n"
        f"# Image {image} must exist on every host. Deploy from this folder, on a manager:\n"
        "#   docker stack deploy -c docker-stack.yml fedcore\n"
        "# Afterwards, on every host: sh gather.sh fedcore; then, with all nodes/ folders "
        "here: fedcore summarize .\n"
    )
    path = target / "docker-stack.yml"
    path.write_text(header + dumps_yaml(document), encoding="utf-8")
    logger.info("wrote %s with %d services", path, len(ids))
    return path
