"""Checkpoints of one peer: written atomically every K rounds, verified when read back.

A checkpoint holds everything a node needs to continue exactly where it was: the round,
its algorithm state (parameters, push-sum weight, error memory, public copies, running
sums: whatever the algorithm keeps), how many batches it has read from its stream (a
stream is a function of the seed, so it is fast-forwarded, never serialized), its codec's
random generator and torch's global one.

File format: ``FCKP1\\n``, the hex SHA-256 of the payload, a newline, then the payload
(``torch.save`` of plain containers and tensors only, loaded back with
``weights_only=True``: no arbitrary objects are unpickled). States that are NamedTuples
travel as ``{"__state__": "module:Class", ...}`` and are rebuilt only from classes of
``fedcore.algorithms``. Writing goes to a temporary file, is fsynced, then renamed over
``round-<t>.ckpt`` and the folder fsynced, so a crash leaves the previous checkpoint whole.
Reading takes the newest checkpoint whose digest matches, and warns about any it skips.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
from pathlib import Path
from typing import Any

import torch

from fedcore.errors import ConfigError
from fedcore.node import Node
from fedcore.registry import import_object

__all__ = [
    "drop_after",
    "from_tree",
    "good_rounds",
    "header",
    "latest",
    "read",
    "restore",
    "restore_state",
    "round_path",
    "save",
    "snapshot",
    "to_device",
    "to_tree",
    "write",
]

logger = logging.getLogger(__name__)

MAGIC = b"FCKP1\n"
_STATE_PACKAGE = "fedcore.algorithms."


def to_tree(obj: Any) -> Any:
    """``obj`` (an algorithm state: tensors, NamedTuples, containers) as plain containers
    and tensors, copied; :func:`from_tree` rebuilds it."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        cls = type(obj)
        return {
            "__state__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f: to_tree(getattr(obj, f)) for f in obj._fields},
        }
    if isinstance(obj, dict):
        return {"__dict__": [[to_tree(k), to_tree(v)] for k, v in obj.items()]}
    if isinstance(obj, list | tuple):
        return {"__seq__": [to_tree(v) for v in obj], "tuple": isinstance(obj, tuple)}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise ConfigError(f"cannot checkpoint a {type(obj).__name__} in the algorithm state.")


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` (what :func:`from_tree` returns) with every tensor moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def from_tree(tree: Any) -> Any:
    """Rebuild what :func:`to_tree` took apart (state classes of fedcore only)."""
    if isinstance(tree, dict) and "__state__" in tree:
        module, _, name = str(tree["__state__"]).partition(":")
        if not module.startswith(_STATE_PACKAGE):
            raise ConfigError(f"checkpoint names a state class outside fedcore: {module}.")
        cls = import_object(f"{module}:{name}", what="a checkpoint's state class")
        return cls(**{f: from_tree(v) for f, v in tree["fields"].items()})
    if isinstance(tree, dict) and "__dict__" in tree:
        return {from_tree(k): from_tree(v) for k, v in tree["__dict__"]}
    if isinstance(tree, dict) and "__seq__" in tree:
        items = [from_tree(v) for v in tree["__seq__"]]
        return tuple(items) if tree["tuple"] else items
    return tree


def _fits(saved: Any, current: Any) -> bool:
    """Whether a saved algorithm state has the layout of ``current``: the same state class
    and fields, and the same shapes and dtypes where both hold a tensor (a field that is
    ``None`` at some rounds, or a container, is not compared; a tensor empty along its
    first axis, state per edge sized at the first step, is compared past that axis)."""
    if isinstance(saved, torch.Tensor) and isinstance(current, torch.Tensor):
        if current.dim() and current.shape[0] == 0 and saved.dim():
            return saved.shape[1:] == current.shape[1:] and saved.dtype == current.dtype
        return saved.shape == current.shape and saved.dtype == current.dtype
    if isinstance(current, tuple) and hasattr(current, "_fields"):
        return (
            type(saved) is type(current)
            and saved._fields == current._fields
            and all(_fits(a, b) for a, b in zip(saved, current, strict=True))
        )
    return True


def restore_state(tree: Any, current: Any, who: str, algorithm: str) -> Any:
    """The algorithm state saved as ``tree``, if it has ``current``'s layout.

    Raises:
        ConfigError: it has another (a checkpoint of an older fedcore, or other options),
            in one line.
    """
    try:
        state = from_tree(tree)
    except (TypeError, AttributeError):  # a state class whose fields have changed
        state = None
    if state is None or not _fits(state, current):
        raise ConfigError(
            f"the checkpoint of {who} holds its {algorithm!r} state in another layout than "
            "this fedcore keeps (written by an older version, or with other options): start "
            "the run afresh without --resume, or resume with the fedcore and config that "
            "wrote it."
        )
    return state


def snapshot(node: Node) -> dict[str, Any]:
    """Everything :func:`restore` needs, as plain containers and tensors."""
    generator = getattr(node.codec, "generator", None)
    return {
        "node": node.id,
        "round": node.round,
        "batches_read": node.batches_read,
        "state": to_tree(node.state),
        "optimizer": to_tree(node.opt_state),
        "codec_rng": generator.get_state() if isinstance(generator, torch.Generator) else None,
        "torch_rng": torch.get_rng_state(),
    }


def save(folder: Path, node: Node) -> Path:
    """Write ``node``'s checkpoint as ``folder/round-<t>.ckpt`` atomically; keep the last 3."""
    return write(folder, node.round, snapshot(node))


def write(folder: Path, round: int, content: dict[str, Any]) -> Path:
    """Write ``content`` (plain containers and tensors) as ``folder/round-<round>.ckpt``
    atomically; keep the last 3. :func:`latest` reads it back."""
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(content, buffer)
    payload = buffer.getvalue()
    path = round_path(folder, round)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    for old in sorted(folder.glob("round-*.ckpt"))[:-3]:
        old.unlink()
    return path


def round_path(folder: Path, round: int) -> Path:
    """Where :func:`write` puts the checkpoint of ``round`` in ``folder``."""
    return folder / f"round-{round:06d}.ckpt"


def header(path: Path) -> tuple[str, int]:
    """``(digest, size)`` of the checkpoint file ``path`` as its header says (the hex
    SHA-256 of its payload) and as it lies: what a manifest records of it.

    Raises:
        ValueError: it is not a fedcore checkpoint.
        OSError: it cannot be read.
    """
    with open(path, "rb") as fh:
        head = fh.read(len(MAGIC) + 65)
    if not head.startswith(MAGIC) or len(head) < len(MAGIC) + 65 or head[-1:] != b"\n":
        raise ValueError("not a fedcore checkpoint (bad header)")
    return head[len(MAGIC) : -1].decode(), path.stat().st_size


def read(path: Path) -> dict[str, Any]:
    """The checkpoint ``path`` holds, its digest checked.

    Raises:
        ValueError: it is not a checkpoint, or torn or corrupt.
        OSError: it cannot be read.
    """
    data = path.read_bytes()
    head = len(MAGIC) + 65
    if not data.startswith(MAGIC) or len(data) < head or data[head - 1 : head] != b"\n":
        raise ValueError("not a fedcore checkpoint (bad header)")
    digest, payload = data[len(MAGIC) : head - 1].decode(), data[head:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("its digest does not match (torn or corrupt)")
    loaded = torch.load(io.BytesIO(payload), weights_only=True)
    if not isinstance(loaded, dict):
        raise ValueError("its payload is not a checkpoint")
    return loaded


def latest(folder: Path) -> dict[str, Any] | None:
    """The newest good checkpoint in ``folder`` (None if there is none), with warnings."""
    for path in sorted(folder.glob("round-*.ckpt"), reverse=True):
        try:
            return read(path)
        except Exception as exc:  # any damage: fall back to the previous one
            logger.warning("skipping checkpoint %s: %s", path, exc)
    return None


def good_rounds(folder: Path) -> list[int]:
    """The rounds of the good checkpoints in ``folder``, oldest first (damaged ones are
    left out, with a warning, as :func:`latest` skips them)."""
    rounds = []
    for path in sorted(folder.glob("round-*.ckpt")):
        try:
            rounds.append(int(read(path)["round"]))
        except Exception as exc:
            logger.warning("skipping checkpoint %s: %s", path, exc)
    return rounds


def drop_after(folder: Path, round: int | None) -> None:
    """Delete the checkpoints in ``folder`` of rounds after ``round`` (None: all of them),
    so that :func:`latest` reads the one of ``round``: a launch resumes every peer from
    the same round, and the later rounds run again, the same."""
    for path in folder.glob("round-*.ckpt"):
        stem = path.stem.removeprefix("round-")
        if not stem.isdigit() or round is None or int(stem) > round:
            path.unlink()


def restore(node: Node, checkpoint: dict[str, Any]) -> None:
    """Put ``node`` back where ``checkpoint`` was: round, state, stream position, generators.

    Raises:
        ConfigError: the checkpoint belongs to another node.
    """
    if checkpoint["node"] != node.id:
        raise ConfigError(f"the checkpoint is node {checkpoint['node']!r}'s, not {node.id!r}'s.")
    saved_opt = from_tree(checkpoint.get("optimizer"))
    if (saved_opt is None) != (node.opt_state is None) or (
        saved_opt is not None and type(saved_opt) is not type(node.opt_state)
    ):
        raise ConfigError(
            f"the checkpoint of node {node.id!r} was written with another [optimizer] than "
            "this run's: its optimizer state does not fit. Resume with the config it ran with."
        )
    node.state = restore_state(
        checkpoint["state"], node.state, f"node {node.id!r}", node.algorithm.name
    )
    node.opt_state = saved_opt
    node.round = int(checkpoint["round"])
    for _ in range(int(checkpoint["batches_read"])):  # streams are functions of the seed
        node.stream.next_batch()
    node.batches_read = int(checkpoint["batches_read"])
    generator = getattr(node.codec, "generator", None)
    if isinstance(generator, torch.Generator) and checkpoint["codec_rng"] is not None:
        generator.set_state(checkpoint["codec_rng"])
    torch.set_rng_state(checkpoint["torch_rng"])
