"""The weighted edges of a topology as the JSON text the run fingerprint hashes, in numpy.

:func:`fedcore.config.fingerprint` hashes ``json.dumps(sorted(edges))`` of the
``(sender, receiver, weight)`` triples of every round's graph. :func:`edges_json` writes
that very text (same order, same float spelling, byte for byte) from the graphs' arrays, in
chunks, so a run of millions of edges is fingerprinted without a Python tuple per edge.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from fedcore.topology.schedule import Schedule, Topology

__all__ = ["edges_json"]

CHUNK = 1 << 20
"""Edges written per chunk (about 40 MB of text at most)."""


def _python_json(t: Topology) -> Iterator[bytes]:
    graphs = t.graphs if isinstance(t, Schedule) else (t,)
    edges = [(u, v, g.weight(u, v)) for g in graphs for u, v in g.edges()]
    yield json.dumps(sorted(edges)).encode()


def edges_json(t: Topology) -> Iterator[bytes]:
    """Chunks whose concatenation is ``json.dumps(sorted(edges)).encode()`` for the
    weighted non-self edges ``(u, v, weight(u, v))`` of every graph of one period of ``t``
    (which must carry weights)."""
    graphs = t.graphs if isinstance(t, Schedule) else (t,)
    parts = [g.index_edges() for g in graphs]
    if any(w is None for _, _, w in parts):
        yield from _python_json(t)  # raises the standard "no mixing weights" error
        return
    src = np.concatenate([s for s, _, _ in parts])
    dst = np.concatenate([d for _, d, _ in parts])
    weight = np.concatenate([w for _, _, w in parts if w is not None])
    names = t.nodes
    if not all(name.isascii() for name in names) or bool(
        np.any((weight == 0.0) & np.signbit(weight))
    ):
        yield from _python_json(t)  # escapes or -0.0: leave them to json itself
        return
    if not src.size:
        yield b"[]"
        return
    rank = graphs[0].name_ranks()
    key = rank[src] * len(names) + rank[dst]
    # Python's order of the triples: ids, then weight (which only a schedule, listing an
    # edge once per round, can need).
    one = len(graphs) == 1
    order = np.argsort(key, kind="stable") if one else np.lexsort((weight, key))
    quoted = np.array([f'"{name}"' for name in names], dtype=np.bytes_)
    values, which = np.unique(weight, return_inverse=True)
    spelled = np.array([repr(v) for v in values.tolist()], dtype=np.bytes_)
    yield b"["
    for at in range(0, order.size, CHUNK):
        e = order[at : at + CHUNK]
        text = _join(b"[", quoted[src[e]], b", ", quoted[dst[e]], b", ", spelled[which[e]], b"], ")
        yield text[:-2] if at + CHUNK >= order.size else text
    yield b"]"


def _join(*pieces: bytes | npt.NDArray[np.bytes_]) -> bytes:
    """Concatenate per-edge byte strings (arrays) and constants, edge by edge, into one
    bytes: fixed-width rows padded with NUL bytes, which JSON text never holds."""
    row: npt.NDArray[np.bytes_] | bytes = pieces[0]
    for piece in pieces[1:]:
        row = np.char.add(row, piece)
    assert isinstance(row, np.ndarray)
    return row.tobytes().replace(b"\x00", b"")
