"""``fedcore compose``: a docker-compose deployment, or with ``--swarm`` a Swarm stack."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fedcore import registry
from fedcore.cli.common import CONFIG, DEPLOY, SET, VERBOSE
from fedcore.config import DATA_ENV, FOLDER
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id

if TYPE_CHECKING:
    from fedcore.config import Config

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore compose`` to ``sub``."""
    comp = sub.add_parser(
        "compose",
        parents=[CONFIG, DEPLOY, SET, VERBOSE],
        help="write a docker-compose deployment: one container per peer",
        description="Write DIR/docker-compose.yml (one service per node; service name = "
        "hostname = node id), DIR/config.toml, DIR/roster.json and DIR/nodes/<id>/ (each "
        "peer's bind-mounted output folder, which `fedcore summarize DIR` reads afterwards), "
        "plus DIR/certs/ when [transport.tls] is set. Multi-host: --roster gives every "
        "peer's HOST:PORT and --nodes the peers of this host, which publish their ports. "
        "With --swarm: DIR/docker-stack.yml for `docker stack deploy` instead (an encrypted "
        "overlay network, certificates as secrets, config and roster as configs, a volume "
        "per peer, DIR/gather.sh to collect the results).",
    )
    comp.add_argument(
        "--nodes", metavar="ID,ID", help="multi-host: this host's node ids (needs --roster)"
    )
    comp.add_argument(
        "--roster", metavar="FILE", help="multi-host: every peer's HOST:PORT (JSON or TOML)"
    )
    comp.add_argument(
        "--swarm", action="store_true", help="write a Docker Swarm stack (docker-stack.yml)"
    )
    comp.add_argument(
        "--place",
        metavar="ID=HOST[,...]",
        help="--swarm: pin peers to the swarm hosts labelled fedcore.host=HOST",
    )
    comp.add_argument(
        "-q", "--quiet", action="store_true", help="print only the compose file written"
    )

    comp.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore.config import load_config

    config = load_config(args.config, args.overrides)
    from fedcore.deploy.compose import source_root, write_compose

    if args.swarm:
        return _stack(args, config)
    if args.place:
        raise ConfigError("--place pins the services of a swarm stack; it needs --swarm.")
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()] if args.nodes else None
    for n in nodes or ():
        check_node_id(n, "--nodes", ConfigError)
    path = write_compose(
        config, args.out, image=args.image, port=args.port, nodes=nodes, roster=args.roster
    )
    out = path.parent
    print(f"wrote {path} (with config.toml, roster.json and nodes/<id>/ beside it)")
    if args.quiet:
        return 0
    print("next steps:")
    if source_root() is None:
        print(f"  docker build -t {args.image} -f nodes/Dockerfile .   # in a fedcore checkout")
    print(f"  cd {out} && docker-compose up --build   # or: docker compose up --build")
    if args.roster:
        print("  (on every host, with the same config and roster and that host's --nodes)")
        print(f"  copy every host's {out}/nodes/<id>/ into one nodes/ folder, then:")
    print("  fedcore summarize .                     # in that folder, after the run")
    deployment_notes(config, args.image, "container")
    return 0


def _stack(args: argparse.Namespace, config: Config) -> int:
    from fedcore.deploy.swarm import HOST_LABEL, write_stack

    if args.nodes or args.roster:
        raise ConfigError(
            "--nodes and --roster split a compose deployment over hosts by hand; a swarm "
            "stack spans its hosts itself (pin peers with --place ID=HOST instead)."
        )
    placement: dict[str, str] = {}
    for item in (args.place or "").split(","):
        if not item.strip():
            continue
        node, sep, host = (part.strip() for part in item.partition("="))
        if not sep:
            raise ConfigError(f"--place {item.strip()!r} is not ID=HOST (e.g. n0=host-a).")
        if node in placement:
            raise ConfigError(f"--place names {node} twice.")
        placement[node] = host
    path = write_stack(config, args.out, image=args.image, port=args.port, placement=placement)
    print(f"wrote {path} (with config.toml, roster.json and gather.sh beside it)")
    if args.quiet:
        return 0
    print("next steps:")
    print(f"  make image {args.image} available on every host (docker build / docker load)")
    if placement:
        hosts = sorted(set(placement.values()))
        print(
            f"  label the hosts: docker node update --label-add {HOST_LABEL}=HOST NODE"
            f"   (HOST in {', '.join(hosts)})"
        )
    print(f"  cd {path.parent} && docker stack deploy -c docker-stack.yml fedcore   # a manager")
    print(
        "  after the run, on every host: sh gather.sh fedcore; then, with every host's "
        "nodes/<id>/ here: fedcore summarize ."
    )
    deployment_notes(config, args.image, "peer")
    return 0


def deployment_notes(config: Config, image: str, unit: str) -> None:
    """The notes every deployment writer prints after its next steps: that a restarted
    ``unit`` (container, peer, pod) starts again from round 0 without checkpoints, and
    that the image must import the user's code (:func:`user_code_note`)."""
    if config.run.checkpoint_every == 0:
        print(
            f"note: run.checkpoint_every = 0, so a restarted {unit} starts again from round 0; "
            "set it (--set run.checkpoint_every=25) to resume from checkpoints."
        )
    user_code_note(config, image)
    data_files_note(config, image)


def data_files_note(config: Config, image: str) -> None:
    """Say where the peers in ``image`` read a dataset that comes from files
    (``data.root``, or ``"folder:PATH"``): inside each of them, not on this machine."""
    data = config.data
    if data.stream:
        return
    if data.dataset.startswith(FOLDER):
        where = data.dataset[len(FOLDER) :]
        fix = "mount it there (a volume)"
    elif (
        data.dataset in registry.DATASETS and "files" in registry.DATASETS.entry(data.dataset).tags
    ):
        where = data.root or f"${DATA_ENV} (else ~/.cache/fedcore/data)"
        fix = "mount the folder there (a volume), or set data.root to where it is mounted"
    else:
        return
    print(
        f"note: data.dataset = {data.dataset!r} is read from files at {where} inside each "
        f"peer of image {image}: {fix}."
    )


def user_code_note(config: Config, image: str) -> None:
    """Say that the peers' image must import the users' code the config names by import
    path (``algorithm.name``, ``model.name``, ``data.dataset``, ``data.stream``)."""
    named = [
        f"{key} = {value!r}"
        for key, value in (
            ("algorithm.name", config.algorithm.name),
            ("model.name", config.model.name),
            ("data.dataset", config.data.dataset),
            ("data.stream", config.data.stream),
        )
        if ":" in value and not (key == "data.dataset" and value.startswith(FOLDER))
    ]
    if named:
        print(
            f"note: the peers in image {image} must import your code too ({'; '.join(named)}): "
            "install it in the image, or copy it to a folder on the image's PYTHONPATH."
        )
