"""``fedcore compose``: a docker-compose deployment of a run, one container per peer.

:func:`write_compose` validates the config (the same checks as ``launch``) and writes a
folder that ``docker-compose up`` runs as is::

    DIR/docker-compose.yml   one service per node: service name = hostname = node id
    DIR/config.toml          the effective config, rewritten for the containers
    DIR/roster.json          node id -> "<service>:<port>" (or the --roster given)
    DIR/nodes/<id>/          bind-mounted as that peer's --out: metrics, models, checkpoints
    DIR/topology/<file>      a copy of topology.file, when the graph comes from a file
    DIR/certs/               ca.crt and each node's <id>.crt / <id>.key, when TLS is on

``DIR/nodes/<id>/`` is the layout ``fedcore summarize DIR`` merges after the run. Inside a
container everything lives under ``/fedcore`` (its working directory): the config and
roster read-only, the peer's folder at ``/fedcore/out``, the graph at
``/fedcore/topology/<file>`` (``topology.file`` is rewritten to the relative
``topology/<file>``, so the same config.toml also works on the host from ``DIR``), and a
service mounts only ``ca.crt`` and its own certificate and key (never ``ca.key``) at
``/fedcore/certs`` (``transport.tls.dir``). A peer runs with ``--resume``, so a restarted
container continues from its newest checkpoint (``run.checkpoint_every``). Containers run
as the user who generated the folder, so they can write to the bind-mounted folders.

The image: every service has ``image`` (default ``fedcore:latest``) and, when
:func:`source_root` finds the fedcore source tree (the checkout fedcore runs from, or the
folder ``pip install .`` installed it from), a ``build:`` section with ``nodes/Dockerfile``,
so ``docker-compose up --build`` builds it. Otherwise the image must be built first, in a
checkout: ``docker build -t fedcore:latest -f nodes/Dockerfile .``.

Multi-host runs: ``roster`` gives every peer's real ``HOST:PORT`` and ``nodes`` the peers
of this host; each of those publishes its roster port on the host. Every host writes its
own folder with the same config and roster.

The YAML is written by PyYAML's safe dumper (:mod:`fedcore.deploy.yamlout`), which quotes
every string a YAML 1.1 parser such as docker-compose's would re-read as a number, boolean
or null.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tomllib
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import fedcore
from fedcore.config import Config, config_to_dict, dumps_toml
from fedcore.deploy.plugins import refuse_registered_here
from fedcore.deploy.roster import load_roster
from fedcore.deploy.yamlout import dumps_yaml
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id, child_path, clip
from fedcore.setup.plan import plan_run

__all__ = [
    "CONTAINER_ROOT",
    "DEFAULT_IMAGE",
    "DEFAULT_PORT",
    "compose_document",
    "health_args",
    "installed_from",
    "peer_args",
    "source_root",
    "write_compose",
]

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = "fedcore:latest"
DEFAULT_PORT = 7000
CONTAINER_ROOT = "/fedcore"
"""The working directory of every container; all mounted files live under it."""
_CONFIG = f"{CONTAINER_ROOT}/config.toml"
_ROSTER = f"{CONTAINER_ROOT}/roster.json"
_OUT = f"{CONTAINER_ROOT}/out"
_CERTS = f"{CONTAINER_ROOT}/certs"
_GRAPHS = "topology"  # relative to CONTAINER_ROOT in a container, to DIR on the host
_DOCKERFILE = "nodes/Dockerfile"

# Health probe of each container (`fedcore health`); start_period covers the imports, the
# data split and the model build before the peer serves.
_HEALTH = {"interval": "30s", "timeout": "20s", "retries": 3, "start_period": "60s"}

# A compose service name that is also a hostname other containers can resolve: one DNS
# label (RFC 1123), lowercase so that names cannot collide case-insensitively.
_SERVICE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_LOOPBACK = ("localhost", "127.", "::1", "[::1]", "0.0.0.0")


def source_root() -> Path | None:
    """The fedcore source tree to build the image from (``nodes/Dockerfile``), or None.

    That is the checkout fedcore runs from (an editable install, or the repository root on
    ``sys.path``), else the local folder it was installed from: ``pip install .`` records
    that folder in the distribution's ``direct_url.json`` (PEP 610), so a plain install
    from a checkout still builds the image from it (as that folder is now). None when
    neither is a fedcore source tree (installed from a wheel, an sdist or a URL; the folder
    moved or gone).
    """
    here = Path(fedcore.__file__).resolve().parents[1]
    for root in (here, installed_from()):
        if root is not None and _is_source_tree(root):
            return root
    return None


def installed_from(dist: metadata.Distribution | None = None) -> Path | None:
    """The local folder the running fedcore was pip-installed from, if pip recorded one.

    ``dist`` is the distribution to read (default: the installed ``fedcore``); it counts
    only if its files are the running package (not another copy on ``sys.path``).
    """
    try:
        dist = _own_distribution() if dist is None else dist
        if dist is None:
            return None
        package = Path(str(dist.locate_file("fedcore/__init__.py"))).resolve()
        if package != Path(fedcore.__file__).resolve():
            return None
        return _local_folder(dist.read_text("direct_url.json"))
    except (metadata.PackageNotFoundError, OSError):
        return None


def _own_distribution() -> metadata.Distribution | None:
    """The record of the installed ``fedcore`` that holds the running package: the one in
    the folder the package was imported from (``site-packages``).

    Not :func:`importlib.metadata.distribution`, which takes the first ``fedcore`` record
    on ``sys.path``: run from the checkout it was ``pip install``-ed from, that is the
    ``fedcore.egg-info`` the build leaves in the checkout (the current folder comes first
    on ``sys.path``), which has no ``direct_url.json``.
    """
    site = Path(fedcore.__file__).resolve().parents[1]
    for dist in metadata.distributions(name="fedcore", path=[str(site)]):
        return dist
    return None


def _local_folder(direct_url: str | None) -> Path | None:
    """The folder of a PEP 610 ``direct_url.json`` for a local directory (else None)."""
    try:
        info = json.loads(direct_url or "")
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("dir_info"), dict):
        return None  # an archive (wheel, sdist) or a VCS URL: no folder to build from
    url = info.get("url")
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    return Path(url2pathname(parts.path))


def _is_source_tree(root: Path) -> bool:
    """Whether ``root`` holds what ``nodes/Dockerfile`` builds fedcore from."""
    try:
        with open(root / "pyproject.toml", "rb") as fh:
            name = tomllib.load(fh).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return (
        name == "fedcore"
        and (root / _DOCKERFILE).is_file()
        and (root / "fedcore" / "__init__.py").is_file()
    )


def _check_node_ids(nodes: Sequence[str]) -> None:
    bad = [n for n in nodes if not _SERVICE_NAME.fullmatch(n)]
    if bad:
        raise ConfigError(
            f"node id {clip(bad[0], 40)} cannot be a compose service and hostname: a node id in a "
            "compose deployment is lowercase letters, digits and '-', starts and ends with a "
            "letter or digit, and has at most 63 characters. Rename it in the graph."
        )


def check_image_and_port(image: str, port: int) -> None:
    """Refuse a port that is not one, or an image name with blanks in it."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a port number (1-65535).")
    if not image or any(c.isspace() for c in image):
        raise ConfigError(f"--image {image!r} is not an image name (e.g. {DEFAULT_IMAGE}).")


def service_ids(config: Config) -> list[str]:
    """The node ids of ``config``'s deployment, from its run plan (graph, weights,
    fingerprint and the cheap checks; no data loaded, no model built), each a valid
    compose service name and hostname."""
    refuse_registered_here(config, "the peers of a deployment")
    ids = list(plan_run(config).graph.nodes)
    _check_node_ids(ids)
    return ids


def _port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def _plan_roster(
    nodes: Sequence[str],
    port: int,
    selected: Sequence[str] | None,
    roster: Mapping[str, str] | str | Path | None,
) -> tuple[dict[str, str], list[str], bool]:
    """The roster every peer reads, the nodes to run here, and whether ports are published."""
    if roster is None:
        if selected is not None:
            raise ConfigError(
                "--nodes picks this host's peers of a multi-host run; give every peer's "
                "HOST:PORT with --roster FILE as well (without --roster, every node runs "
                "here and the roster comes from the service names)."
            )
        return {n: f"{n}:{port}" for n in nodes}, list(nodes), False
    given = dict(load_roster(roster) if isinstance(roster, str | Path) else roster)
    missing = [n for n in nodes if n not in given]
    if missing:
        raise ConfigError(
            f"the roster has no address for {', '.join(missing)}; it must name every node of "
            "the graph (this host's and the other hosts')."
        )
    chosen = list(nodes) if selected is None else list(dict.fromkeys(selected))
    if not chosen:
        raise ConfigError("--nodes names no node; give this host's node ids, e.g. n0,n1.")
    for n in chosen:
        check_node_id(n, "--nodes", ConfigError)
    unknown = [n for n in chosen if n not in nodes]
    if unknown:
        raise ConfigError(
            f"--nodes: {', '.join(unknown)} is not a node of the graph; its nodes are "
            f"{', '.join(nodes)}."
        )
    ports: dict[int, str] = {}
    for n in chosen:
        address = given[n]
        host, _, text = address.rpartition(":")
        if host.lower().startswith(_LOOPBACK):
            raise ConfigError(
                f"roster: {n} -> {address!r} is a loopback or unspecified address, which "
                "inside a container is the container itself; give the host's address that "
                "the other peers reach."
            )
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise ConfigError(f"roster: {n} -> {address!r} has no valid port (1-65535).")
        if int(text) in ports:
            raise ConfigError(
                f"roster: {ports[int(text)]} and {n} both use port {text}, but they run on "
                "the same host here (--nodes); give them different ports."
            )
        ports[int(text)] = n
    return given, chosen, True


def _tls_files(config: Config, nodes: Sequence[str], chosen: Sequence[str]) -> dict[str, Path]:
    """Certificate files to copy (name in DIR/certs -> source); empty when TLS is off."""
    folder = config.transport.tls_dir
    if folder is None:
        return {}
    names = ["ca.crt"] + [f"{n}.{ext}" for n in chosen for ext in ("crt", "key")]
    missing = [name for name in names if not child_path(folder, name, ConfigError).is_file()]
    if missing:
        raise ConfigError(
            f"transport.tls: {folder} has no {', '.join(missing)}; make the certificates "
            f"with: fedcore certs init --nodes {' '.join(nodes)} --out {folder}"
        )
    return {name: folder / name for name in names}


def peer_args(node: str, port: int) -> list[str]:
    """``fedcore node ...`` of ``node`` in a container (without the ``fedcore``): the
    mounted config and roster, listening on ``port``, ``/fedcore/out``, ``--resume``."""
    return [
        "node", "--config", _CONFIG, "--id", node, "--roster", _ROSTER,
        "--listen", f"0.0.0.0:{port}", "--out", _OUT, "--resume",
    ]  # fmt: skip


def health_args(node: str, port: int) -> list[str]:
    """The container's health check of ``node``: ``fedcore health`` of its own server."""
    return ["fedcore", "health", f"127.0.0.1:{port}", "--config", _CONFIG, "--id", node]


def compose_document(
    config: Config,
    nodes: Sequence[str],
    *,
    image: str = DEFAULT_IMAGE,
    listen_ports: Mapping[str, int],
    publish: bool = False,
    build_context: str | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The docker-compose document: one service per node of ``nodes``.

    ``listen_ports`` is each node's port in its container; ``publish`` maps it to the same
    port on the host (multi-host runs). ``build_context`` (relative to the compose file, or
    absolute) adds a ``build:`` section with ``nodes/Dockerfile``; ``user`` is ``UID:GID``.
    The services read the roster from ``roster.json`` next to the compose file.
    """
    services: dict[str, Any] = {}
    for n in nodes:
        port = listen_ports[n]
        volumes = [
            f"./config.toml:{_CONFIG}:ro",
            f"./roster.json:{_ROSTER}:ro",
            f"./nodes/{n}:{_OUT}",
        ]
        if config.topology.file:
            volumes.append(f"./{_GRAPHS}:{CONTAINER_ROOT}/{_GRAPHS}:ro")
        if config.transport.tls_dir is not None:
            volumes += [
                f"./certs/{name}:{_CERTS}/{name}:ro" for name in ("ca.crt", f"{n}.crt", f"{n}.key")
            ]
        service: dict[str, Any] = {"image": image}
        if build_context is not None:
            service["build"] = {"context": build_context, "dockerfile": _DOCKERFILE}
        service["hostname"] = n
        if user is not None:
            service["user"] = user
        service["working_dir"] = CONTAINER_ROOT
        # HOME for a user id the image does not know (caches of matplotlib, torch).
        service["environment"] = {"HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
        service["entrypoint"] = ["fedcore"]
        service["command"] = peer_args(n, port)
        service["restart"] = "on-failure"
        service["volumes"] = volumes
        if publish:
            service["ports"] = [f"{port}:{port}"]
        service["healthcheck"] = {"test": ["CMD", *health_args(n, port)], **_HEALTH}
        services[n] = service
    return {"services": services}


def _container_config(config: Config, certs: str = _CERTS) -> dict[str, dict[str, Any]]:
    """The config's tables as a container reads them: the graph file at
    ``topology/<file>`` (relative to the config) and the certificates in ``certs``."""
    tables = config_to_dict(config)
    if config.topology.file:
        tables["topology"]["file"] = f"{_GRAPHS}/{Path(config.topology.file).name}"
    if config.transport.tls_dir is not None:
        tables["transport"]["tls"] = {"dir": certs}
    return tables


def _copy(src: Path, dst: Path, *, private: bool = False) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and dst.samefile(src):
        return
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o600 if private else 0o644)


def _build_context(build_context: str | Path | bool, out: Path) -> str | None:
    if build_context is False:
        return None
    if build_context is True:
        root = source_root()
        if root is None:
            return None
    else:
        root = Path(build_context).resolve()
        if not (root / _DOCKERFILE).is_file():
            raise ConfigError(f"build context {str(root)!r} has no {_DOCKERFILE}.")
    here = out.resolve()
    try:
        # Relative when the two share a folder below the root (e.g. DIR inside the checkout),
        # so the folder can move with its checkout; else absolute.
        if Path(os.path.commonpath([root, here])) != Path(here.anchor):
            return os.path.relpath(root, here)
    except ValueError:  # another drive (Windows): no relative path
        pass
    return str(root)


def write_compose(
    config: Config,
    out: str | Path,
    *,
    image: str = DEFAULT_IMAGE,
    port: int = DEFAULT_PORT,
    nodes: Sequence[str] | None = None,
    roster: Mapping[str, str] | str | Path | None = None,
    build_context: str | Path | bool = True,
) -> Path:
    """Write a docker-compose deployment of ``config`` into ``out``; return the compose file.

    Args:
        config: The experiment; its run plan is checked here (graph, weights, the cheap
            checks), without loading its data or building its model.
        out: The folder to write (created; existing peer folders are kept).
        image: The image of every service.
        port: The port every peer listens on in its container (without ``roster``).
        nodes: With ``roster``: the nodes to run on this host (default: all).
        roster: Every peer's ``HOST:PORT`` (a mapping or a roster file) for a multi-host
            run; without it, every node runs here and the roster is the service names.
        build_context: True: add a ``build:`` section when :func:`source_root` finds a
            source tree (the checkout fedcore runs from or was ``pip install``-ed from);
            a path: that source tree; False: none. Without one, the file's header says to
            build the image first (``docker build -t IMAGE -f nodes/Dockerfile .``).

    Raises:
        ConfigError: an invalid config, a node id that is not a valid service name, a
            roster that misses a node, missing certificate files, a bad port or image.
        TopologyError: an invalid graph (as the run plan checks it).
    """
    check_image_and_port(image, port)
    ids = service_ids(config)
    full_roster, chosen, publish = _plan_roster(ids, port, nodes, roster)
    listen = {n: _port_of(full_roster[n]) if publish else port for n in chosen}
    certs = _tls_files(config, ids, chosen)
    graph_file = Path(config.topology.file) if config.topology.file else None
    target = Path(out)
    context = _build_context(build_context, target)
    document = compose_document(
        config,
        chosen,
        image=image,
        listen_ports=listen,
        publish=publish,
        build_context=context,
        user=f"{os.getuid()}:{os.getgid()}" if hasattr(os, "getuid") else None,
    )

    # Every check passed: write.
    target.mkdir(parents=True, exist_ok=True)
    if graph_file is not None:
        _copy(graph_file, target / _GRAPHS / graph_file.name)
    for name, src in certs.items():
        _copy(src, child_path(target / "certs", name, ConfigError), private=name.endswith(".key"))
    for n in chosen:
        child_path(target / "nodes", n, ConfigError).mkdir(parents=True, exist_ok=True)
    (target / "config.toml").write_text(dumps_toml(_container_config(config)), encoding="utf-8")
    (target / "roster.json").write_text(json.dumps(full_roster, indent=2) + "\n", encoding="utf-8")
    header = (
        f"# Generated by `fedcore compose` (fedcore {fedcore.__version__}): one service per "
        f"peer, {len(chosen)} of {len(ids)}.\n"
    )
    if context is None:
        # No source tree to build from: the image must exist before `up`.
        header += (
            f"# First, in a fedcore checkout: docker build -t {image} -f {_DOCKERFILE} .\n"
            "# Run: docker-compose up   Afterwards: fedcore summarize .  (in this folder)\n"
        )
    else:
        header += (
            "# Run: docker-compose up --build   Afterwards: fedcore summarize .  (in this folder)\n"
        )
    path = target / "docker-compose.yml"
    path.write_text(header + dumps_yaml(document), encoding="utf-8")
    logger.info("wrote %s with %d services", path, len(chosen))
    return path
