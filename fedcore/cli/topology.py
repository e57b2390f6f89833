"""``fedcore topology show``: a trust graph's nodes, edges, connectivity and spectral gap."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcore.cli.common import VERBOSE

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore topology`` to ``sub``."""
    topo = sub.add_parser("topology", help="inspect trust graphs")
    topo_sub = topo.add_subparsers(dest="topology_command", required=True, metavar="ACTION")
    show = topo_sub.add_parser(
        "show",
        parents=[VERBOSE],
        help="print nodes, edges, connectivity, degrees, spectral gap",
        description="SPEC is KIND:NODES[:key=value,...] (e.g. ring:8, torus:4x4, social:32, "
        "erdos-renyi:20:p=0.2,seed=1) or a graph file (.json, .graphml, .edgelist).",
    )
    show.add_argument("spec", metavar="SPEC|FILE")

    show.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore import topology
    from fedcore.topology.io import SUFFIXES as FILE_SUFFIXES

    spec: str = args.spec
    path = Path(spec)
    looks_like_file = path.exists() or path.suffix in FILE_SUFFIXES
    # A missing graph file is reported by load() as such, not as a bad spec.
    graph = topology.load(path) if looks_like_file else topology.parse_spec(spec)
    print(topology.describe(graph))
    return 0
