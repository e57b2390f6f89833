"""Checkpoints of a sharded run (``fedcore simulate --ranks R`` with ``run.checkpoint_every``):
one file per rank, and a manifest that ties the files of one round together.

Every ``run.checkpoint_every`` rounds each rank writes its own checkpoint
(:meth:`~fedcore.engines.sharded.ShardedNetwork.state_dict`; rank 0's holds the run's
figures too, as a one-process run's does) to
``checkpoints/rank-<r>-of-<R>/round-<t>.ckpt`` in the run folder, atomically (a temporary
file, fsynced, renamed: :func:`fedcore.setup.checkpoint.write`, which keeps each rank's
last three). Then one small collective (:func:`seal`) brings every rank's file name, digest
and size to rank 0, which only then writes ``checkpoints/manifest.json`` (atomically): the
round, the world size, the placement of the peers, the run's fingerprint and the files. A
crash mid-write thus never leaves a manifest that names a missing or half-written file:
the manifest names the last round whose files every rank wrote.

``--resume`` reads the manifest (:func:`read_manifest`: the files it names are there and
of the sizes it says), and every rank loads its own file of the manifest's round
(:func:`load_rank`: its digest, rank, round and run checked). On another number of ranks
than the one that wrote it, a cohort run is refused (:func:`check_world`: each rank
resumes its own clients), and a vectorized run is re-sharded: each new rank reads the old
files that hold its rows (:func:`load_parts`; the manifest lists each file's rows) and
puts them together (:func:`fedcore.engines.shard_reshard.merge_parts`). Every rank writes into the
folder rank 0 made (:func:`share_folder`), so ranks on several machines need a run folder
on a file system they all see.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
import torch.distributed as dist

from fedcore.engines.ranks import Ranks, lost
from fedcore.engines.shard_reshard import Part
from fedcore.errors import ConfigError
from fedcore.metrics import write_text_atomic
from fedcore.setup import checkpoint
from fedcore.simulation.results import CHECKPOINTS, MANIFEST

__all__ = [
    "KIND",
    "MANIFEST",
    "Manifest",
    "check_world",
    "due",
    "load_parts",
    "load_rank",
    "prior_summary",
    "rank_file",
    "rank_folder",
    "read_manifest",
    "resumed_name",
    "seal",
    "sharded_world",
    "share_folder",
    "verify_files",
]

logger = logging.getLogger(__name__)

KIND = "fedcore-sharded-checkpoint"
"""What a manifest says it is."""


def due(every: int, done: int, rounds: int) -> bool:
    """Whether a checkpoint is written after ``done`` rounds of ``rounds`` (every
    ``every``, 0: never; none after the last round), as a one-process run writes them."""
    return bool(every) and done % every == 0 and done < rounds


def rank_folder(out: Path, rank: int, world: int) -> Path:
    """The folder of rank ``rank`` of ``world``'s checkpoints in the run folder ``out``."""
    return out / CHECKPOINTS / f"rank-{rank}-of-{world}"


def rank_file(out: Path, rank: int, world: int, round: int) -> Path:
    """Rank ``rank`` of ``world``'s checkpoint of ``round`` in the run folder ``out``."""
    return checkpoint.round_path(rank_folder(out, rank, world), round)


def prior_summary(run_dir: Path) -> dict[str, Any]:
    """The summary an earlier part of the run in ``run_dir`` wrote (empty where none)."""
    try:
        prior = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return prior if isinstance(prior, dict) else {}


def sharded_world(run_dir: Path) -> int | None:
    """How many ranks ran the run in ``run_dir`` (its manifest's, else its summary's
    ``ranks``), or None for a one-process run's folder.

    Raises:
        ConfigError: the run completed, or the folder holds none, or its manifest is not
            one (one line).
    """
    if not (run_dir / "config.toml").is_file():
        raise ConfigError(f"{str(run_dir)!r} holds no run to resume: it has no config.toml.")
    prior = prior_summary(run_dir)
    if prior and prior.get("status", "completed") == "completed":
        raise ConfigError(f"the run in {str(run_dir)!r} completed; there is nothing to resume.")
    manifest = read_manifest(run_dir)
    if manifest is not None:
        return manifest.world
    ranks = prior.get("ranks")
    return ranks if isinstance(ranks, int) and ranks >= 1 else None


def share_folder(ranks: Ranks, out: Path | None) -> Path:
    """Rank 0's run folder ``out``, told every rank (a collective; the others pass
    ``None``): where they write their checkpoints. Its UTF-8 bytes travel as a tensor
    (its length first), no pickle.

    Raises:
        PeerUnavailableError: the broadcast failed.
    """
    text = os.fsencode(str(out)) if out is not None else b""
    if ranks.world > 1:
        size = torch.tensor([len(text)], dtype=torch.long)
        try:
            dist.broadcast(size, src=0)
            data = torch.zeros(int(size[0]), dtype=torch.uint8)
            if ranks.rank == 0:
                data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
            dist.broadcast(data, src=0)
        except (RuntimeError, ValueError) as exc:
            raise lost(ranks, "the broadcast of the run folder", exc) from exc
        text = bytes(data.tolist())
    return Path(os.fsdecode(text))


def seal(ranks: Ranks, out: Path, round: int, *, run_id: str, placement: Any | None) -> None:
    """After every rank wrote its checkpoint of ``round`` (a collective): rank 0 writes the
    manifest naming them all (each rank's file's name is its rank's), with their digests
    and sizes (one gather of 33 numbers a rank), atomically; with the ``placement`` of a
    sharded run's peers (its method, and each rank's rows), or none (the cohort engine's
    clients: client ``i`` on rank ``i % world``).

    Raises:
        PeerUnavailableError: the gather failed (no manifest is written).
    """
    digest, size = checkpoint.header(rank_file(out, ranks.rank, ranks.world, round))
    mine = torch.tensor([size, *bytes.fromhex(digest)], dtype=torch.long)
    parts = [mine]
    if ranks.world > 1:
        parts = [torch.empty_like(mine) for _ in range(ranks.world)] if ranks.rank == 0 else []
        try:
            dist.gather(mine, parts if ranks.rank == 0 else None, dst=0)
        except (RuntimeError, ValueError) as exc:
            raise lost(ranks, "the gather of the checkpoints' digests", exc) from exc
    if ranks.rank != 0:
        return
    files = [
        {
            "path": str(rank_file(out, r, ranks.world, round).relative_to(out / CHECKPOINTS)),
            "sha256": bytes(part[1:].tolist()).hex(),
            "bytes": int(part[0]),
        }
        for r, part in enumerate(parts)
    ]
    manifest: dict[str, Any] = {"kind": KIND, "round": round, "world": ranks.world}
    manifest["run_id"] = run_id
    if placement is not None:
        manifest["partition"] = placement.method
        manifest["rows"] = [[int(i) for i in rows] for rows in placement.rows]
    else:
        manifest["partition"] = "client % world"
    manifest["files"] = files
    write_text_atomic(out / CHECKPOINTS / MANIFEST, json.dumps(manifest) + "\n")


@dataclass(frozen=True)
class Manifest:
    """A sharded run's manifest, as :func:`read_manifest` checked it.

    Attributes:
        round: The rounds done at the checkpoint.
        world: The ranks that wrote it.
        run_id: The run's fingerprint (its config and graph).
        files: Per rank, its file (in the run folder), digest and size.
        rows: Per rank, the global rows of the peers its file holds (a sharded run's;
            ``None``: a cohort run's, whose clients are ``i % world``).
    """

    round: int
    world: int
    run_id: str
    files: tuple[tuple[Path, str, int], ...]
    rows: tuple[tuple[int, ...], ...] | None = None


def _bad(where: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{str(where)!r} is not a sharded run's manifest ({why}); the run cannot be resumed "
        "from it: start it afresh, or resume from a folder fedcore wrote."
    )


def read_manifest(run_dir: Path) -> Manifest | None:
    """The manifest of the sharded run in ``run_dir`` (None where it has none), every file
    it names there with the size it says.

    Raises:
        ConfigError: the manifest is not one, or a file it names is missing or of another
            size (one line).
    """
    where = run_dir / CHECKPOINTS / MANIFEST
    if not where.is_file():
        return None
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _bad(where, f"unreadable: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict) or raw.get("kind") != KIND:
        raise _bad(where, "it does not say it is one")
    t, world, run_id, files = (raw.get(k) for k in ("round", "world", "run_id", "files"))
    if not (type(t) is int and type(world) is int and t >= 1 and world >= 1):
        raise _bad(where, "its round and world size are not whole numbers >= 1")
    if not isinstance(run_id, str) or not isinstance(files, list) or len(files) != world:
        named = len(files) if isinstance(files, list) else 0
        raise _bad(where, f"it names {named} files for {world} ranks")
    out = []
    for r, entry in enumerate(files):
        path = rank_file(run_dir, r, world, t)
        expected = str(path.relative_to(run_dir / CHECKPOINTS))
        if not isinstance(entry, dict) or entry.get("path") != expected:
            raise _bad(where, f"rank {r}'s file is not named {expected!r}")
        digest, size = entry.get("sha256"), entry.get("bytes")
        if not isinstance(digest, str) or type(size) is not int:
            raise _bad(where, f"rank {r}'s digest and size are missing")
        if not path.is_file():
            raise ConfigError(
                f"rank {r} of {world}'s checkpoint of round {t}, {str(path)!r}, is missing: "
                "the run cannot be resumed from this folder; start it afresh."
            )
        have = path.stat().st_size
        if have != size:
            raise ConfigError(
                f"rank {r} of {world}'s checkpoint of round {t}, {str(path)!r}, holds {have} "
                f"bytes, not the {size} the manifest says (truncated or replaced): the run "
                "cannot be resumed from this folder; start it afresh."
            )
        out.append((path, digest, size))
    rows = raw.get("rows")
    if rows is not None and not (
        isinstance(rows, list)
        and len(rows) == world
        and all(isinstance(r, list) and all(type(i) is int for i in r) for r in rows)
    ):
        raise _bad(where, f"its rows are not {world} lists of whole numbers")
    held = None if rows is None else tuple(tuple(r) for r in rows)
    return Manifest(t, world, run_id, tuple(out), held)


def verify_files(manifest: Manifest) -> None:
    """Every rank's file holds what the manifest's digest says (read whole, not loaded).

    Raises:
        ConfigError: one does not (one line, naming it).
    """
    for r, (path, digest, _) in enumerate(manifest.files):
        _verify(path, digest, r, manifest.world)


def _verify(path: Path, digest: str, rank: int, world: int) -> None:
    try:
        said, _ = checkpoint.header(path)
        data = path.read_bytes()
    except (OSError, ValueError) as exc:
        said, data = f"unreadable: {exc}", b""
    payload = data[len(checkpoint.MAGIC) + 65 :]
    if said != digest or hashlib.sha256(payload).hexdigest() != digest:
        raise ConfigError(
            f"rank {rank} of {world}'s checkpoint {str(path)!r} is not the file the manifest "
            "names (damaged, or of another round or run): the run cannot be resumed from "
            "this folder; start it afresh."
        )


def check_world(
    manifest: Manifest, world: int, run_dir: Path, *, torchrun: bool, held: str = "block of peers"
) -> None:
    """Refuse to resume ``manifest``'s run on ``world`` ranks when another number wrote
    it (every rank's state is its ``held``: the same ones resume).

    Raises:
        ConfigError: one line saying how many ranks to start.
    """
    if world == manifest.world:
        return
    how = (
        f"start {manifest.world} ranks (WORLD_SIZE = {manifest.world}; on one machine, "
        f"torchrun --nproc-per-node {manifest.world})"
        if torchrun
        else f"resume with --ranks {manifest.world}, or leave --ranks out"
    )
    raise ConfigError(
        f"the checkpoints in {str(run_dir)!r} were written by {manifest.world} ranks, and "
        f"each rank resumes its own {held}: {how}; {world} cannot resume them."
    )


def load_rank(
    run_dir: Path, manifest: Manifest, ranks: Ranks, run_id: str, *, held: str = "block of peers"
) -> dict[str, Any]:
    """This rank's checkpoint of the manifest's round, checked: the run's, this rank's and
    that round's, whole (``held``: what a rank's state is, for :func:`check_world`).

    Raises:
        ConfigError: it is not (one line).
    """
    if manifest.run_id != run_id:
        raise ConfigError(
            f"the checkpoints in {str(run_dir)!r} belong to another run than its config.toml "
            "(another config or graph): resume with the config that wrote them."
        )
    check_world(manifest, ranks.world, run_dir, torchrun=True, held=held)
    return _load_file(manifest, ranks.rank, run_id, ranks.label)


def _load_file(manifest: Manifest, rank: int, run_id: str, label: str) -> dict[str, Any]:
    """Rank ``rank``'s file of ``manifest``, checked: its digest the manifest's, and it
    says it is that rank's of the manifest's round and world, of run ``run_id``
    (``label``: the rank that reads it, as its error line names it)."""
    path, digest, _ = manifest.files[rank]
    try:
        said_digest, _ = checkpoint.header(path)
        saved = checkpoint.read(path) if said_digest == digest else None
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"{label}'s checkpoint {str(path)!r} cannot be read "
            f"({str(exc).splitlines()[0]}): start the run afresh."
        ) from None
    if saved is None:
        raise ConfigError(
            f"{label}'s checkpoint {str(path)!r} is not the file the manifest names "
            "(of another round or run): start the run afresh."
        )
    said = tuple(saved.get(k) for k in ("rank", "world", "round", "run_id"))
    if said != (rank, manifest.world, manifest.round, run_id):
        raise ConfigError(
            f"{label}'s checkpoint {str(path)!r} says it is rank {said[0]} of {said[1]}'s "
            f"of round {said[2]}, not what the manifest names: start the run afresh."
        )
    return saved


def load_parts(
    run_dir: Path, manifest: Manifest, ranks: Ranks, run_id: str, rows: np.ndarray[Any, Any]
) -> tuple[dict[str, Any], list[Part]]:
    """Re-sharding (a manifest of another number of ranks than ``ranks.world``): the old
    ranks' files that hold any of this rank's ``rows`` (rank 0: every file, for the
    run's figures and every rank's halo bytes), checked as :func:`load_rank` checks its
    own, as :class:`~fedcore.engines.shard_reshard.Part` s; and this rank's checkpoint
    less its ``"network"`` (which :func:`~fedcore.engines.shard_reshard.merge_parts`
    makes once the network is built): rank 0's the old rank 0's, the run's figures.

    Raises:
        ConfigError: the manifest is of another run, lists no rows (a cohort run's), or
            a file does not fit (one line).
    """
    if manifest.run_id != run_id:
        raise ConfigError(
            f"the checkpoints in {str(run_dir)!r} belong to another run than its config.toml "
            "(another config or graph): resume with the config that wrote them."
        )
    if manifest.rows is None:
        raise _bad(run_dir / CHECKPOINTS / MANIFEST, "it lists no rows of its ranks")
    wanted = set(np.asarray(rows).tolist())
    parts = []
    head: dict[str, Any] = {}
    for r, held in enumerate(manifest.rows):
        if ranks.rank != 0 and wanted.isdisjoint(held):
            continue
        saved = _load_file(manifest, r, run_id, ranks.label)
        parts.append(Part(r, np.asarray(held, dtype=np.int64), saved.pop("network")))
        if r == 0 and ranks.rank == 0:
            head = saved
    head.update(rank=ranks.rank, world=ranks.world, round=manifest.round, run_id=run_id)
    return head, parts


def resumed_name(
    out: Path,
    every: int,
    saved: dict[str, Any] | None,
    stream: TextIO,
    show_progress: bool,
    name_of: Callable[[list[str]], str],
) -> tuple[str, list[str]]:
    """Rank 0 of a resumed run over ranks: its name and ``--set`` items, as its checkpoint
    (``saved``), else its summary, says (``name_of(overrides)`` where neither names it),
    having said where it goes on from (``every``: ``run.checkpoint_every``)."""
    if saved is not None:
        if show_progress:
            print(f"simulate: resuming {out} after round {saved['round']}", file=stream)
        return str(saved["name"]), list(saved["overrides"])
    logger.warning(
        "%s has no checkpoint of its ranks (run.checkpoint_every = %d); starting again from "
        "round 0",
        out,
        every,
    )
    prior = prior_summary(out)
    overrides = list(prior.get("overrides", []))
    return str(prior.get("name") or name_of(overrides)), overrides
