"""The summary's digests of a sharded run's parameters (``params_sha256``, or
``params_sha256_all`` above :data:`~fedcore.config.NODE_MAPS_NODES` peers), made without
gathering every model on rank 0.

* ``params_sha256`` (one digest a peer): each rank hashes its own rows (each row's
  float32 little-endian bytes, as :func:`~fedcore.metrics.params_sha256` hashes a model)
  and rank 0 gathers 32 bytes a peer, in node order.
* ``params_sha256_all`` (one digest of every peer's bytes, in node order): rank 0 feeds one
  SHA-256 block by block, each block :data:`DIGEST_BLOCK_BYTES` of global rows gathered
  from the ranks that hold them (a hash is fed in order, so the blocks go in node order);
  rank 0 holds a block a rank at most, never every model.

The digests are those of :func:`~fedcore.metrics.all_params_sha256` over the gathered
models, bit for bit: a SHA-256 fed the same bytes in the same order, in any chunks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedcore.config import NODE_MAPS_NODES
from fedcore.engines.ranks import Ranks, gather_rows
from fedcore.metrics import ParamDigests, params_sha256

__all__ = ["DIGEST_BLOCK_BYTES", "gathered_digests", "start_digests"]

DIGEST_BLOCK_BYTES = 16 << 20
"""Bytes of float32 rows in one block of ``params_sha256_all`` (the most rank 0 holds of a
rank's rows at once)."""

_Array = np.ndarray[Any, Any]


def _f32(rows: torch.Tensor) -> _Array:
    """``rows`` as C-contiguous float32 little-endian (the bytes a digest reads)."""
    return np.ascontiguousarray(rows.detach().to(torch.float32).cpu().numpy().astype("<f4"))


def _row_digests(rows: torch.Tensor) -> torch.Tensor:
    """``[B, 32]`` uint8: the SHA-256 of each row's bytes."""
    array = _f32(rows)
    raw = b"".join(hashlib.sha256(row.data).digest() for row in array)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(len(array), 32)


def _block_rows(d: int) -> int:
    return max(1, DIGEST_BLOCK_BYTES // max(1, 4 * d))


def gathered_digests(
    ranks: Ranks, local: torch.Tensor, shards: Sequence[_Array], nodes: Sequence[str]
) -> ParamDigests | None:
    """The summary's digests of every peer's parameters on rank 0 (``None`` on the others),
    rank ``r`` holding the rows of the global rows ``shards[r]`` (``local``, ``[B, d]``);
    see the module docstring. A collective: every rank calls it at the same point.

    Raises:
        PeerUnavailableError: a gather failed.
    """
    n = len(nodes)
    if n <= NODE_MAPS_NODES:
        full = gather_rows(ranks, _row_digests(local), shards)
        if full is None:
            return None
        raw = full.numpy().tobytes()
        return ParamDigests(
            {"params_sha256": {nid: raw[32 * i : 32 * i + 32].hex() for i, nid in enumerate(nodes)}}
        )
    digest = hashlib.sha256()
    local = local.detach().to(torch.float32)  # the bytes hashed, and no more, travel
    block = _block_rows(int(local.shape[1]))  # the same on every rank
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        ends = [np.searchsorted(rows, (lo, hi)) for rows in shards]
        parts = [rows[a:b] - lo for rows, (a, b) in zip(shards, ends, strict=True)]
        a, b = ends[ranks.rank]
        got = gather_rows(ranks, local[a:b], parts)
        if got is not None:
            digest.update(_f32(got).data)
    return ParamDigests({"params_sha256_all": digest.hexdigest()}) if ranks.rank == 0 else None


def start_digests(start: torch.Tensor, nodes: Sequence[str]) -> ParamDigests:
    """The summary's digests where every peer holds ``start`` (no gather yet), computed
    on its own, block by block."""
    one = params_sha256(start)
    n = len(nodes)
    if n <= NODE_MAPS_NODES:
        return ParamDigests({"params_sha256": dict.fromkeys(nodes, one)})
    row = _f32(start.reshape(1, -1)).tobytes()
    block = _block_rows(start.numel())
    digest = hashlib.sha256()
    chunk = row * block
    for lo in range(0, n, block):
        digest.update(chunk if lo + block <= n else row * (n - lo))
    return ParamDigests({"params_sha256_all": digest.hexdigest()})
