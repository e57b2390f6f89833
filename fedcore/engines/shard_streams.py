"""A sharded rank's batches from an online source (``data.stream``): its own rows' streams
only, drawn as the one-process vectorized engine draws them
(:meth:`fedcore.engines.vectorized.VectorizedNetwork._data`), so each row reads the same
batches whichever rank holds it.

A source that gives a whole round at once (``batches(round, nodes)``, as
:class:`~fedcore.streams.SyntheticDrift` does) is asked for this rank's up rows, grouped by
how many batches each has read (a crashed row falls behind); each row of the answer is,
bit for bit, that node's batch alone. Any other source gives one stream a row, made for
this rank's rows only. Where each row is, its count of batches read, is what a checkpoint
keeps (:meth:`RowStreams.state_dict`): a stream is a function of the seed, so a resumed
rank reads its rows' streams forward that many batches, as one process does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedcore.streams import OnlineSource

__all__ = ["RowStreams"]

Group = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


class RowStreams:
    """The batches of the rows ``mine`` (sorted global rows) of ``n`` from ``source``,
    with :class:`~fedcore.data.batches.StackedBatches`' ``next`` (global rows, ``x``,
    ``y``, no mask) and checkpoint methods."""

    def __init__(self, source: OnlineSource, mine: np.ndarray[Any, Any], n: int) -> None:
        self.source = source
        self.read = np.zeros(n, dtype=np.int64)
        """Batches each row has read (rows of other ranks stay 0)."""
        self.batched = callable(getattr(source, "batches", None))
        self.streams = {} if self.batched else {i: source.stream(i) for i in mine.tolist()}

    def next(self, up: np.ndarray[Any, np.dtype[np.bool_]]) -> Group:
        """The batches of this rank's rows set in ``up`` (``[N]`` host bool), in global
        order, as ``(rows, x, y, None)``."""
        rows = np.nonzero(up)[0]
        positions = self.read[rows]
        if self.batched:
            xs, ys, order = [], [], []
            for pos in np.unique(positions).tolist():
                group = rows[positions == pos]
                nodes = torch.from_numpy(group)
                x, y = self.source.batches(int(pos), nodes)  # type: ignore[attr-defined]
                xs.append(x)
                ys.append(y)
                order.append(group)
            if len(xs) == 1:
                x, y = xs[0], ys[0]
            else:  # back to global order: the groups interleave
                at = torch.from_numpy(np.argsort(np.concatenate(order), kind="stable"))
                x, y = torch.cat(xs)[at], torch.cat(ys)[at]
        else:
            parts = [self.streams[i].next_batch() for i in rows.tolist()]
            x = torch.stack([p[0] for p in parts])
            y = torch.stack([p[1] for p in parts])
        self.read[rows] += 1
        return torch.from_numpy(rows), x, y, None

    def state_dict(self, rows: Sequence[int]) -> dict[str, Any]:
        """How many batches each of ``rows`` has read (for a checkpoint)."""
        return {"read": torch.from_numpy(self.read[list(rows)].copy())}

    def load_state_dict(self, state: dict[str, Any], rows: Sequence[int]) -> None:
        """Continue from a :meth:`state_dict` of ``rows``: each row's stream read forward
        to where it was."""
        read = state["read"].numpy()
        if read.shape != (len(rows),) or (read < 0).any():
            raise ValueError(f"{read.shape[0]} counts of batches read for {len(rows)} rows")
        self.read[list(rows)] = read
        for i, count in zip(rows, read.tolist(), strict=True):
            stream = self.streams.get(int(i))
            for _ in range(int(count) if stream is not None else 0):
                stream.next_batch()  # type: ignore[union-attr]
