"""``fedcore summarize``: the results of a run whose peers ran elsewhere."""

from __future__ import annotations

import argparse

from fedcore.cli.common import VERBOSE, print_table

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore summarize`` to ``sub``."""
    summ = sub.add_parser(
        "summarize",
        parents=[VERBOSE],
        help="merge the peer folders of a run that ran elsewhere into its results",
        description="Read RUN_DIR/nodes/<id>/ (each peer's --out folder: compose volumes, "
        "or folders copied from several hosts) and write the same metrics.jsonl, "
        "summary.json and curves.png as `launch`. A peer that did not finish counts as "
        "down from its last record.",
    )
    summ.add_argument("run_dir", metavar="RUN_DIR")
    summ.add_argument("--config", help="experiment TOML (default: RUN_DIR/config.toml)")
    summ.add_argument(
        "-q", "--quiet", action="store_true", help="no table, no warnings (summary.json lists them)"
    )

    summ.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.deploy.summarize import summarize

    config = load_config(args.config) if args.config else None
    summary = summarize(args.run_dir, config, quiet=args.quiet)
    if not args.quiet:
        print_table(summary)
    return 0
