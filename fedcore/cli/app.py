"""The parser of every subcommand, and :func:`main`: logging, dispatch, and errors as one
line with an exit status."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import tomllib
import traceback
from collections.abc import Callable, Sequence

from fedcore import __version__
from fedcore.cli import (
    certs,
    compose,
    deploy,
    health,
    k8s,
    launch,
    node,
    plot,
    simulate,
    summarize,
    sweep,
    topology,
)
from fedcore.cli.common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    EXIT_USER_CODE,
    VERBOSE_HELP,
    HelpFormatter,
)
from fedcore.errors import FedcoreError, UserCodeError
from fedcore.ids import first_line

__all__ = ["main"]

SUBCOMMANDS = (
    simulate,
    sweep,
    launch,
    node,
    compose,
    k8s,
    deploy,
    summarize,
    certs,
    health,
    topology,
    plot,
)
"""In the order ``fedcore --help`` lists them; each adds its parser and handler."""


_WRITE_ERRORS = frozenset(
    getattr(errno, name)
    for name in ("EEXIST", "EROFS", "ENOSPC", "EDQUOT", "EFBIG", "ENOTEMPTY")
    if hasattr(errno, name)
)
"""OSError numbers only writing gives (an OSError with another may be a read's)."""

EXIT_STATUSES = (
    f"exit status: 0 done; {EXIT_USAGE} invalid input (config, names, files, paths); "
    f"{EXIT_RUNTIME} a run that failed on its way; {EXIT_USER_CODE} your own algorithm's code "
    "failed (the traceback is in the run's error.log); 130 interrupted"
)
"""What ``fedcore --help`` says of exit statuses."""


def parser() -> argparse.ArgumentParser:
    """The ``fedcore`` parser: each subcommand's parser sets ``handler``."""
    top = argparse.ArgumentParser(
        prog="fedcore",
        description="Decentralized learning over directed trust graphs.",
        epilog=EXIT_STATUSES,
        formatter_class=HelpFormatter,  # fills in the deployment targets when help is shown
    )
    top.add_argument("--version", action="version", version=f"fedcore {__version__}")
    top.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.add(sub)
    return top


def _error_line(exc: BaseException, verbose: int) -> str:
    """One line for ``exc``: its message's first line, and a pointer to ``-v`` when a
    traceback (of code that raised inside a user's factory, torch ...) stands behind it."""
    text = first_line(str(exc)) or type(exc).__name__
    if isinstance(exc, UserCodeError) and exc.log is not None:
        return text  # it says where its traceback is
    cause = exc.__cause__
    foreign = cause is not None and not isinstance(
        cause,
        FedcoreError | OSError | UnicodeError | tomllib.TOMLDecodeError | json.JSONDecodeError,
    )
    if foreign and not verbose:
        text += " (add -v to see the traceback)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    top = parser()
    args = top.parse_args(argv)
    # What a subcommand that starts copies of itself passes on (simulate --ranks).
    args.argv = list(sys.argv[1:] if argv is None else argv)
    verbose = args.verbose + getattr(args, "sub_verbose", 0)
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    # -v and -vv are about fedcore; other libraries (matplotlib's font search, grpc)
    # speak at DEBUG only from -vvv.
    logging.basicConfig(
        level=logging.DEBUG if verbose >= 3 else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    ours = logging.getLogger("fedcore")
    before = ours.level
    ours.setLevel(level)
    try:
        return _dispatch(args, verbose)
    finally:
        ours.setLevel(before)  # main() called in-process (tests) leaves logging as it was


def _dispatch(args: argparse.Namespace, verbose: int) -> int:
    # Let "pkg.module:factory" names resolve against the working directory, as
    # `python -m` would; the console script otherwise only sees its own folder.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except FedcoreError as exc:
        if verbose:
            traceback.print_exception(exc, file=sys.stderr)
        print(f"fedcore: error: {_error_line(exc, verbose)}", file=sys.stderr)
        if isinstance(exc, UserCodeError):
            return EXIT_USER_CODE
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_RUNTIME
    except MemoryError as exc:  # a size no bound caught: say so, without a traceback
        if verbose:
            traceback.print_exception(exc, file=sys.stderr)
        print(
            "fedcore: error: out of memory; use a smaller model, fewer nodes, smaller batches "
            "or fewer rounds.",
            file=sys.stderr,
        )
        return EXIT_RUNTIME
    except OSError as exc:  # a path that cannot be read or written
        where = f" {exc.filename!r}" if exc.filename else ""
        what = "write" if exc.errno in _WRITE_ERRORS else "read or write"
        print(f"fedcore: error: cannot {what}{where}: {exc.strerror or exc}.", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        print(f"fedcore: interrupted {exc}".rstrip(), file=sys.stderr)
        return 130
