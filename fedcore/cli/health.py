"""``fedcore health``: whether a peer serves, through its gRPC health service."""

from __future__ import annotations

import argparse

from fedcore.cli.common import EXIT_RUNTIME, VERBOSE
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore health`` to ``sub``."""
    hea = sub.add_parser(
        "health",
        parents=[VERBOSE],
        help="check that a peer is serving (exit 0) through its gRPC health service",
        description="Ask the peer at HOST:PORT whether it serves. With a config whose "
        "[transport.tls] is set, it connects with the certificate of --id and expects the "
        "peer to present that node's certificate (for a container's own health check).",
    )
    hea.add_argument("address", metavar="HOST:PORT")
    hea.add_argument("--config", help="experiment TOML (for [transport.tls])")
    hea.add_argument("--id", dest="node_id", help="node id (needed with TLS)")
    hea.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")

    hea.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from fedcore.certs import load_tls
    from fedcore.transport.grpc.channel import probe_health

    tls = None
    if args.node_id is not None:
        check_node_id(args.node_id, "--id", ConfigError)
    if args.config:
        from fedcore.config import load_config

        tls_dir = load_config(args.config).transport.tls_dir
        if tls_dir is not None:
            if not args.node_id:
                raise ConfigError("health over TLS needs --id (whose certificate to use).")
            tls = load_tls(tls_dir, args.node_id)
    status = asyncio.run(
        probe_health(args.address, tls=tls, peer=args.node_id or "", timeout_s=args.timeout)
    )
    print(status)
    return 0 if status == "SERVING" else EXIT_RUNTIME
