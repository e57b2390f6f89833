"""One peer's minibatches: :class:`BatchStream` (seeded, reshuffled every epoch) and
:class:`NoData` (the stream of a peer that holds no data).

The vectorized engine draws the same batches for all peers at once
(:class:`fedcore.stacked_training.StackedBatches`, from the same per-peer generators).
"""

from __future__ import annotations

import torch

from fedcore.config import ORDERS
from fedcore.errors import DataError

__all__ = ["BatchStream", "NoData"]


class NoData:
    """The stream of a node that holds no data (the server family's server)."""

    examples = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Never: such a node takes no training step.

        Raises:
            DataError: always.
        """
        raise DataError("this node holds no training data (a server); it takes no step.")


class BatchStream:
    """One node's minibatches: shuffled without replacement, reshuffled every epoch.

    >>> s = BatchStream(torch.zeros(5, 2), torch.arange(5), batch_size=2, seed=0)
    >>> x, y = s.next_batch()
    >>> tuple(x.shape)
    (2, 2)
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        batch_size: int,
        seed: int,
        order: str = "shuffled",
    ) -> None:
        """Hold ``x``/``y`` and a private generator seeded with ``seed``.

        ``order = "sorted"`` walks the examples in label order (ties in a seeded shuffle),
        the same every epoch: a non-iid order over time, for online learning.
        """
        if batch_size < 1:
            raise DataError(f"data.batch_size must be >= 1, got {batch_size}.")
        if len(x) == 0:
            raise DataError("a node was given no training examples.")
        if order not in ORDERS:
            raise DataError(f"data.order must be one of {ORDERS}, got {order!r}.")
        self.x = x
        self.y = y
        self.examples = len(x)
        """How many training examples the node holds (FedAvg's weight)."""
        self.batch_size = min(batch_size, len(x))
        self._gen = torch.Generator().manual_seed(seed)
        self._sorted = order == "sorted"
        self._order = self._new_order()
        self._pos = 0

    def _new_order(self) -> torch.Tensor:
        perm = torch.randperm(len(self.x), generator=self._gen)
        if self._sorted:
            perm = perm[torch.sort(self.y[perm], stable=True).indices]
        return perm

    def __len__(self) -> int:
        """Number of examples this node holds."""
        return len(self.x)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the next ``batch_size`` examples, starting a new epoch when needed."""
        if self._pos + self.batch_size > len(self._order):
            self._order = self._new_order()
            self._pos = 0
        idx = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.x[idx], self.y[idx]
