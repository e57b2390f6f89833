"""``fedcore deploy --target NAME``: the files of a deployment, written by a deployment
target of :data:`fedcore.registry.DEPLOY_TARGETS` (a built-in one, or a plug-in's)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedcore.cli.common import CONFIG, DEPLOY, SET, VERBOSE, HelpFormatter
from fedcore.errors import ConfigError, FedcoreError
from fedcore.ids import error_text

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore deploy`` to ``sub``."""
    dep = sub.add_parser(
        "deploy",
        parents=[CONFIG, DEPLOY, SET, VERBOSE],
        formatter_class=HelpFormatter,
        help="write a deployment with a deployment target ({targets}; or a plug-in's)",
        description="Write the files of a deployment of the config under DIR with the "
        "deployment target NAME: a built-in one (compose, k8s: their own subcommands take "
        "every option) or one an installed package declares under the entry-point group "
        "fedcore.deploy_targets.",
    )
    dep.add_argument(
        "--target",
        required=True,
        metavar="NAME",
        help=(
            "the deployment target: {targets} (a plug-in adds its own to these: "
            "fedcore.deploy_targets)"
        ),
    )
    dep.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore import registry
    from fedcore.config import load_config

    targets = registry.DEPLOY_TARGETS
    if args.target not in targets:
        raise ConfigError(f"--target: {targets.unknown(args.target)}.")
    config = load_config(args.config, args.overrides)
    write = targets.load(args.target)
    what = f"deployment target {args.target!r} ({targets.entry(args.target).target})"
    try:
        written = write(config, args.out, image=args.image, port=args.port)
    except FedcoreError:
        raise
    except Exception as exc:  # a plug-in's writer can raise anything
        raise ConfigError(
            f"{what} failed: {error_text(exc)}; fix it (fedcore -v shows the traceback)."
        ) from exc
    if not isinstance(written, (str, Path)):
        raise ConfigError(
            f"{what} returned {type(written).__name__}, not the path it wrote (a Path)."
        )
    print(f"wrote {written}")
    return 0
