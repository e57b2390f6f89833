"""The ``fedcore`` command line: the only place that configures logging.

Subcommands::

    fedcore simulate [CONFIG.toml] [--out DIR] [--set KEY=VALUE ...] [--quiet]
    fedcore launch [CONFIG.toml] [--out DIR] [--set KEY=VALUE ...] [--quiet]
    fedcore node --config FILE --id ID --roster FILE [--listen HOST:PORT] [--out DIR]
    fedcore topology show SPEC|FILE
    fedcore plot RUN_DIR... --out FILE.png

Errors become one line on stderr, never a traceback: exit status 2 for invalid input (bad
config, unknown name, invalid graph file, an output path that cannot be written) and 1 for
a run that fails on its way (a strict-mode peer that never answered).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedcore import __version__
from fedcore.errors import ConfigError, FedcoreError

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_RUNTIME = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedcore",
        description="Decentralized learning over directed trust graphs.",
    )
    parser.add_argument("--version", action="version", version=f"fedcore {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "simulate",
        help="run every peer in this process",
        description="Run every peer of CONFIG in this process (default: the built-in run, "
        "OPS on a 16-node directed social trust graph with digits).",
    )
    lau = sub.add_parser(
        "launch",
        help="run every peer as its own process over gRPC on 127.0.0.1",
        description="Start one `fedcore node` process per peer of CONFIG on this machine, "
        "supervise them, and write the same results folder as `simulate`.",
    )
    for p in (sim, lau):
        p.add_argument("config", nargs="?", help="experiment TOML (default: built-in)")
        p.add_argument("--out", help="results folder (default: runs/<name>-<timestamp>)")
        _set_option(p)
        p.add_argument("-q", "--quiet", action="store_true", help="no progress or table")
        _threads_option(p)

    node = sub.add_parser(
        "node",
        help="run one peer over gRPC",
        description="Run one peer of a run: serve its in-neighbours, connect to its "
        "out-neighbours as the roster says, and train. The roster maps node ids to "
        "HOST:PORT (JSON object, or TOML [peers] table).",
    )
    node.add_argument("--config", required=True, help="experiment TOML (every peer the same)")
    node.add_argument("--id", required=True, dest="node_id", help="this peer's node id")
    node.add_argument("--roster", required=True, help="node id -> HOST:PORT file")
    node.add_argument("--listen", help="HOST:PORT to serve on (default: the roster's entry)")
    node.add_argument("--out", help="this peer's folder (default: runs/node-<id>)")
    node.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest good checkpoint in <out>/checkpoints (run.checkpoint_every)",
    )
    _set_option(node)
    _threads_option(node)

    topo = sub.add_parser("topology", help="inspect trust graphs")
    topo_sub = topo.add_subparsers(dest="topology_command", required=True, metavar="ACTION")
    show = topo_sub.add_parser(
        "show",
        help="print nodes, edges, connectivity, degrees, spectral gap",
        description="SPEC is KIND:NODES[:key=value,...] (e.g. ring:8, torus:4x4, social:32, "
        "erdos-renyi:20:p=0.2,seed=1) or a graph file (.json, .graphml, .edgelist).",
    )
    show.add_argument("spec", metavar="SPEC|FILE")

    plot = sub.add_parser("plot", help="plot loss and accuracy of runs")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR")
    plot.add_argument("--out", required=True, help="PNG file to write")
    return parser


def _print_table(summary: dict[str, Any]) -> None:
    final = summary.get("final", {})
    traffic = summary.get("traffic", {})
    rows = [
        ("algorithm", summary["algorithm"]),
        (
            "topology",
            f"{summary['topology']['name']} (gap {summary['topology']['spectral_gap']:.3f})",
        ),
        ("nodes x rounds", f"{summary['nodes']} x {summary['rounds']}"),
        ("avg-model accuracy", f"{final.get('avg_model_accuracy', float('nan')):.4f}"),
        ("mean node accuracy", f"{final.get('mean_node_accuracy', float('nan')):.4f}"),
        ("min node accuracy", f"{final.get('min_node_accuracy', float('nan')):.4f}"),
        ("consensus distance", f"{final.get('consensus_distance', float('nan')):.4g}"),
        ("average loss", f"{final.get('average_loss', float('nan')):.4f}"),
        ("bytes / node / round", f"{traffic.get('bytes_per_node_per_round', 0):.0f}"),
        (
            "messages missing",
            f"{traffic.get('messages_missing', 0)} (the fault plan lost "
            f"{traffic.get('messages_dropped', 0)} at their senders)",
        ),
        ("wall time", f"{summary['wall_seconds']:.1f} s"),
        ("results", summary.get("out_dir", "")),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def _set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key by dotted path, e.g. --set algorithm.name=dpsgd",
    )


def _threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: many small models gain nothing from more)",
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _set_threads(threads: int) -> None:
    import torch

    if threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}.")
    torch.set_num_threads(threads)


def _simulate(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.runners.simulate import simulate

    _set_threads(args.threads)
    config = load_config(args.config, args.overrides)
    summary = simulate(config, out_dir=args.out, show_progress=not args.quiet)
    if not args.quiet:
        _print_table(summary)
    return 0


def _launch(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.runners.launch import launch

    _set_threads(args.threads)
    # SIGTERM to the launcher stops its peers too (as Ctrl-C does), rather than orphaning them.
    signal.signal(signal.SIGTERM, _interrupt)
    config = load_config(args.config, args.overrides)
    summary = launch(config, out_dir=args.out, show_progress=not args.quiet, threads=args.threads)
    if not args.quiet:
        _print_table(summary)
    return 0


def _node(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.runners.peer import load_roster, run_peer_main, tune_malloc

    _set_threads(args.threads)
    tune_malloc()
    config = load_config(args.config, args.overrides)
    roster = load_roster(args.roster)
    out = Path(args.out) if args.out else Path("runs") / f"node-{args.node_id}"
    return run_peer_main(
        config, args.node_id, roster, out=out, listen=args.listen, resume=args.resume
    )


def _topology_show(args: argparse.Namespace) -> int:
    from fedcore import topology
    from fedcore.topology.io import SUFFIXES as FILE_SUFFIXES

    spec: str = args.spec
    path = Path(spec)
    looks_like_file = path.exists() or path.suffix in FILE_SUFFIXES
    # A missing graph file is reported by load() as such, not as a bad spec.
    graph = topology.load(path) if looks_like_file else topology.parse_spec(spec)
    print(topology.describe(graph))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from fedcore.plotting import plot_runs

    out = plot_runs([Path(r) for r in args.runs], Path(args.out))
    print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    level = (
        logging.WARNING
        if args.verbose == 0
        else logging.INFO
        if args.verbose == 1
        else logging.DEBUG
    )
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # Let "pkg.module:factory" names resolve against the working directory, as
    # `python -m` would; the console script otherwise only sees its own folder.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    handlers = {
        "simulate": _simulate,
        "launch": _launch,
        "node": _node,
        "topology": _topology_show,
        "plot": _plot,
    }
    try:
        return handlers[args.command](args)
    except FedcoreError as exc:
        print(f"fedcore: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_RUNTIME
    except OSError as exc:  # an output path that cannot be written
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"fedcore: error: cannot write{where}: {exc.strerror or exc}.", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fedcore: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
