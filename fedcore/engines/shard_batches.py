"""A sharded rank's minibatches: its own rows' only (:class:`RankBatches`), drawn as one
process draws them, answering in global rows as the batches of every peer would.

Each peer's batches are a function of its own part of the data and its own generator
(seeded by its global row), so a rank builds the generators, first permutations and
places of its rows alone (``B`` of them, not ``N``: the set-up and the memory split over
the ranks) and each row reads what it reads in one process, whichever rank holds it: its
batches are padded (and masked) as the stack of every peer pads them, and a checkpoint's
epoch orders are as wide as that stack's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedcore.engines.vectorized import stacked_batches
from fedcore.setup.prepare import RunSetup

__all__ = ["RankBatches"]

_Array = np.ndarray[Any, Any]


class RankBatches:
    """The batches of the sorted global rows ``mine`` of ``setup``'s peers, with
    :class:`~fedcore.data.batches.StackedBatches`' ``next`` and checkpoint methods in
    global rows (what :class:`~fedcore.engines.sharded.ShardedNetwork` and its checkpoints
    read)."""

    def __init__(self, setup: RunSetup, device: torch.device, mine: _Array) -> None:
        self.mine = mine
        self.rows = torch.from_numpy(mine)
        self.local = stacked_batches(setup, device, mine.tolist())
        n = len(setup.parts)
        sizes = np.maximum(np.fromiter(map(len, setup.parts), dtype=np.int64, count=n), 1)
        batch = np.minimum(sizes, setup.config.data.batch_size)
        widest = int(batch.max())
        self.local.shape_as(widest, bool((batch != widest).any()))  # as every peer's stack
        self.width = int(sizes.max())
        """The largest part of every peer's: a checkpoint's epoch orders are this wide on
        every rank (as the batches of every peer hold them), whichever rows it holds."""

    def _local(self, rows: Sequence[int]) -> list[int]:
        """The local rows of the global ``rows`` (every one of them this rank's)."""
        at: list[int] = np.searchsorted(self.mine, np.asarray(rows, dtype=np.int64)).tolist()
        return at

    def next(
        self, up: np.ndarray[Any, np.dtype[np.bool_]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The batches of this rank's rows set in ``up`` (``[N]`` host bool), as
        ``(global rows, x, y, mask)`` (:meth:`~fedcore.data.batches.StackedBatches.next`)."""
        rows, x, y, mask = self.local.next(up[self.mine])
        return self.rows[rows], x, y, mask

    def state_dict(self, rows: Sequence[int]) -> dict[str, Any]:
        """Where each of the global ``rows`` is in its epoch (for a checkpoint): the epoch
        orders padded with zeros to :attr:`width`, as the batches of every peer hold them."""
        state = self.local.state_dict(self._local(rows))
        orders = state["orders"]
        wide = orders.new_zeros((orders.shape[0], self.width))
        wide[:, : orders.shape[1]] = orders
        return {**state, "orders": wide}

    def load_state_dict(self, state: dict[str, Any], rows: Sequence[int]) -> None:
        """Continue the global ``rows`` from a :meth:`state_dict` (of any rank's rows: each
        row's order lies in its first places, as wide as its part)."""
        width = self.local.state_dict([])["orders"].shape[1]
        orders = state["orders"][:, :width]
        self.local.load_state_dict({**state, "orders": orders}, self._local(rows))
