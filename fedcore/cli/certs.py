"""``fedcore certs init``: a CA and a key and certificate per node, for mutual TLS."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcore.cli.common import VERBOSE
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore certs`` to ``sub``."""
    certs = sub.add_parser("certs", help="certificates for mutual TLS between peers")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    init = certs_sub.add_parser(
        "init",
        parents=[VERBOSE],
        help="make a CA and one key and certificate per node",
        description="Write DIR/ca.crt, DIR/ca.key and, per node, DIR/<id>.crt (the node id as "
        "its subject alternative name) and DIR/<id>.key. A DIR that has a CA keeps it, and "
        "only nodes without a good certificate (none, expired, or not this CA's) get one. "
        "Point [transport.tls] dir at DIR; give each host ca.crt and only its own nodes' "
        "files, never ca.key.",
    )
    init.add_argument("--nodes", nargs="+", metavar="ID", help="node ids")
    init.add_argument("--config", help="take the node ids from this experiment's graph")
    init.add_argument("--out", required=True, help="certificate folder")
    init.add_argument("--days", type=int, default=365, help="validity (default 365)")
    init.add_argument(
        "--force",
        action="store_true",
        help="a new CA, and every certificate in DIR issued anew",
    )
    init.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")

    init.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore.certs import init_certs

    nodes: list[str] = list(args.nodes or [])
    for n in nodes:
        check_node_id(n, "--nodes", ConfigError)
    if args.config:
        from fedcore.config import load_config
        from fedcore.setup.graph import build_topology, with_rounds

        config = load_config(args.config)
        nodes += build_topology(with_rounds(config.topology, config.run.rounds)).nodes
    if not nodes:
        raise ConfigError("certs init needs --nodes ID... or --config FILE.")
    written = init_certs(nodes, args.out, days=args.days, force=args.force)
    issued = sorted({p.stem for p in written if p.suffix == ".crt" and p.stem != "ca"})
    if args.quiet:
        return 0
    print(
        f"{args.out}: {len(issued)} node certificate(s) issued"
        + (f" ({', '.join(issued)})" if issued else " (all existed)")
        + ("; a new CA" if any(p.name == "ca.crt" for p in written) else "")
        + f". Keep {Path(args.out) / 'ca.key'} off the peers."
    )
    return 0
