"""``fedcore node``: one peer (or several in one process) of a run over gRPC."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

from fedcore.cli.common import SET, THREADS, VERBOSE, set_threads
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id, child_path, clip

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore node`` to ``sub``."""
    node = sub.add_parser(
        "node",
        parents=[SET, THREADS, VERBOSE],
        help="run one peer (or several in one process) over gRPC",
        description="Run a peer of a run: serve its in-neighbours, connect to its "
        "out-neighbours as the roster says, and train. The roster maps node ids to "
        "HOST:PORT (JSON object, or TOML [peers] table). With --id a,b,c the process hosts "
        "several peers (one torch, one event loop), each its own server on its roster "
        "address with its own folder: the same run as one process a peer.",
    )
    node.add_argument("--config", required=True, help="experiment TOML (every peer the same)")
    node.add_argument(
        "--id",
        required=True,
        dest="node_id",
        metavar="ID[,ID...]",
        help="this peer's node id, or several, comma-separated, for one process to host",
    )
    node.add_argument("--roster", required=True, help="node id -> HOST:PORT file")
    node.add_argument(
        "--listen",
        metavar="HOST:PORT[,...]",
        help="HOST:PORT to serve on (default: the roster's entry); with several ids, one per "
        "id in the same order",
    )
    node.add_argument(
        "--out",
        help="this peer's folder (default: runs/node-<id>); with several ids, the folder "
        "that holds one <id>/ per peer; '{id}' in it stands for each peer's id",
    )
    node.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest good checkpoint in <out>/checkpoints (run.checkpoint_every)",
    )
    node.add_argument(
        "-q", "--quiet", action="store_true", help="no start-up, progress or results lines"
    )

    node.set_defaults(handler=run)


def _node_ids(text: str) -> list[str]:
    """The ids of ``--id a,b,c``: each a safe name, none twice."""
    ids = [part.strip() for part in text.split(",")]
    for n in ids:
        if not n:
            raise ConfigError(f"--id {clip(text)} has an empty id; give ids separated by commas.")
        check_node_id(n, "--id", ConfigError)
    twice = sorted({n for n in ids if ids.count(n) > 1})
    if twice:
        raise ConfigError(f"--id names {', '.join(map(repr, twice))} more than once.")
    return ids


def _node_outs(out: str | None, ids: list[str]) -> dict[str, Path]:
    """Each peer's folder: ``--out`` with ``{id}`` replaced; else ``--out`` itself (one
    id) or ``--out/<id>`` (several); default ``runs/node-<id>``."""
    if out is None:
        return {n: child_path(Path("runs"), f"node-{n}", ConfigError) for n in ids}
    if "{id}" in out:
        return {n: Path(out.replace("{id}", n)) for n in ids}
    if len(ids) == 1:
        return {ids[0]: Path(out)}
    return {n: child_path(Path(out), n, ConfigError) for n in ids}


def _node_listen(listen: str | None, ids: list[str]) -> dict[str, str] | None:
    """``--listen``: one HOST:PORT for one id, one per id (comma-separated) for several."""
    if listen is None:
        return None
    if len(ids) == 1:
        return {ids[0]: listen}
    addresses = [a.strip() for a in listen.split(",")]
    if len(addresses) != len(ids) or not all(addresses):
        raise ConfigError(
            f"--listen {clip(listen)} gives {len(addresses)} address(es) for {len(ids)} ids; "
            "give one HOST:PORT per id, in the order of --id, or leave --listen out (each "
            "peer serves on its roster address)."
        )
    return dict(zip(ids, addresses, strict=True))


def run(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.progress import write_stage
    from fedcore.runtime import end_with_parent

    end_with_parent()  # a launcher's peer: not left running when it dies
    ids = _node_ids(args.node_id)
    listen = _node_listen(args.listen, ids)
    outs = _node_outs(args.out, ids)
    for out in outs.values():  # before torch's import, the longest part of a start-up
        write_stage(out, "importing")
    try:
        set_threads(args.threads)
        from fedcore.deploy.peer import run_peers_main, tune_malloc
        from fedcore.deploy.roster import load_roster

        tune_malloc()
        config = load_config(args.config, args.overrides)
        roster = load_roster(args.roster)
    except Exception:
        for out in outs.values():
            write_stage(out, "failed")
        raise
    status = run_peers_main(
        config,
        ids,
        roster,
        outs=outs,
        listen=listen,
        resume=args.resume,
        show_progress=not args.quiet,
    )
    # Everything is written and closed. Spare the exit a final garbage collection of every
    # torch and gRPC object (measured at seconds per peer): the process ends anyway.
    gc.freeze()
    return status
