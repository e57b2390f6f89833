"""``fedcore plot``: loss and accuracy of runs, as a picture.

The labels, title and panels are :func:`fedcore.plotting.plot_runs`'s; a folder that does
not exist, or that is not a run, a sweep or a grid, is one line (exit status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcore.cli.common import VERBOSE
from fedcore.errors import ConfigError
from fedcore.ids import clip

PLOT_FORMATS = (".png", ".pdf", ".svg")
"""File types ``fedcore plot --out`` writes (by the name's suffix)."""

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore plot`` to ``sub``."""
    plot = sub.add_parser("plot", parents=[VERBOSE], help="plot loss and accuracy of runs")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR")
    plot.add_argument("--out", required=True, help="picture to write: .png, .pdf or .svg")
    plot.add_argument(
        "--label",
        metavar="KEY",
        help="label each curve by this config key of its run (e.g. algorithm.name; several "
        "joined by commas) instead of by what differs between the runs (a grid folder: by "
        "its grid keys); curves on different engines that would share a label also say "
        "their engine",
    )
    plot.add_argument(
        "--title", help="the figure's title (default: the runs' config name, algorithm and graph)"
    )
    plot.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    plot.add_argument(
        "--log-bytes",
        action="store_true",
        help="a log scale on the bytes-sent axes (the default when the runs' bytes differ "
        "more than 10x)",
    )
    plot.add_argument(
        "--bands",
        action="store_true",
        help="one curve per group of runs that differ only in run.seed: the mean, with a "
        "band of +- one standard deviation",
    )
    plot.add_argument(
        "--time",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="panels of loss and accuracy against virtual seconds (default: when every run "
        "has virtual time, i.e. [time] or deadline mode in fedcore simulate)",
    )
    plot.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore.plotting import plot_runs

    target = Path(args.out)
    if target.suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(
            f"fedcore plot --out {clip(args.out)}: the file name must end in "
            f"{', '.join(PLOT_FORMATS)} (the picture's format), e.g. --out curves.png."
        )
    out = plot_runs(
        [Path(r) for r in args.runs],
        target,
        label=args.label,
        title=args.title,
        log_bytes=True if args.log_bytes else None,  # None: log when bytes differ > 10x
        bands=args.bands,
        time=args.time,
    )
    if not args.quiet:
        print(f"wrote {out}")
    return 0
