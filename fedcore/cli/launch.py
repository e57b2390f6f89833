"""``fedcore launch``: every peer as its own process over gRPC on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fedcore.cli.common import (
    RUN,
    SET,
    THREADS,
    VERBOSE,
    print_table,
    refuse_beside_resume,
    start_run,
    tracking_overrides,
)

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore launch`` to ``sub``."""
    lau = sub.add_parser(
        "launch",
        parents=[RUN, SET, THREADS, VERBOSE],
        help="run every peer as its own process over gRPC on 127.0.0.1",
        description="Start one `fedcore node` process per peer of CONFIG on this machine "
        "(or one per K peers, --peers-per-process), supervise them, and write the same "
        "results folder as `simulate`.",
    )
    lau.add_argument(
        "--peers-per-process",
        type=int,
        default=None,
        metavar="K",
        help="peers each process hosts (default 1): ceil(N/K) processes, each one torch "
        "(about 350 MB) and one event loop, every peer still its own gRPC server, port and "
        "nodes/<id>/ folder; the same results. Process logs go to procs/<i>.log",
    )
    lau.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the stopped launch in RUN_DIR: every peer restarts from its "
        "checkpoint (run.checkpoint_every) of the newest round all of them have; it ends "
        "as the uninterrupted launch would",
    )
    lau.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.resume is not None:
        return _resume(args)
    from fedcore.config import load_config

    overrides = [*args.overrides, *tracking_overrides(args)]
    if args.name is not None:
        overrides.append(f"run.name={json.dumps(args.name)}")
    config = load_config(args.config, overrides)
    # SIGTERM to the launcher stops its peers too (as Ctrl-C does), rather than orphaning them.
    start_run(args.threads)
    from fedcore.deploy.launch import launch

    summary = launch(
        config,
        out_dir=args.out,
        show_progress=not args.quiet,
        threads=args.threads,
        force=args.force,
        overrides=overrides,
        peers_per_process=1 if args.peers_per_process is None else args.peers_per_process,
    )
    return _show(args, summary)


def _resume(args: argparse.Namespace) -> int:
    refuse_beside_resume(args, "launch")
    start_run(args.threads)
    from fedcore.deploy.launch import resume_launch

    summary = resume_launch(
        args.resume,
        show_progress=not args.quiet,
        threads=args.threads,
        peers_per_process=args.peers_per_process,
    )
    return _show(args, summary)


def _show(args: argparse.Namespace, summary: dict[str, Any]) -> int:
    if args.quiet:
        print(f"results: {summary['out_dir']}")
    else:
        print_table(summary)
    return 0
