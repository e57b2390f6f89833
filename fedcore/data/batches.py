"""Peers' minibatches: :class:`StackedBatches` (every peer's, as index tensors, for the
vectorized engine), :class:`BatchStream` (one peer's: the one-row case of it) and
:class:`NoData` (the stream of a peer that holds no data).

A peer reads ``min(batch_size, examples)`` examples a round, walking a permutation of its
examples that it draws from its own seeded generator when it starts an epoch (sorted by
label, ties in the permutation's order, for ``order = "sorted"``); a batch that would run
past the end starts the next epoch instead (the remainder waits: drop-last). Both classes
draw through the same code, so for the same seeds both engines train on identical data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedcore.config import ORDERS
from fedcore.errors import DataError

__all__ = ["BatchStream", "NoData", "StackedBatches"]

_CPU = torch.device("cpu")
"""Where permutations are drawn (the per-peer generators live there)."""


def _past_end(pos: Any, batch: Any, size: Any) -> Any:
    """Whether a batch of ``batch`` examples from position ``pos`` of an epoch would run
    past a peer's ``size`` examples, so that the peer starts its next epoch (ints, or host
    arrays elementwise)."""
    return pos + batch > size


class NoData:
    """The stream of a node that holds no data (the server family's server)."""

    examples = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Never: such a node takes no training step.

        Raises:
            DataError: always.
        """
        raise DataError("this node holds no training data (a server); it takes no step.")


class StackedBatches:
    """Every node's minibatches, one row a node (see the module docstring).

    Node ``i`` holds the training examples ``parts[i]`` and a generator seeded with
    ``seeds[i]``. :meth:`next` gives the batches of the nodes that are up (a crashed node
    reads nothing that round); :meth:`take` one node's next batch alone (the path of a
    :class:`BatchStream`, a one-row stack); :meth:`state_dict` says where every node is,
    for a checkpoint.

    Args:
        x, y: The training split.
        parts: Each node's example indices.
        batch_size: ``data.batch_size``.
        seeds: Each node's stream seed.
        order: ``"shuffled"`` or ``"sorted"``.
        device: Where batches are built.

    Raises:
        DataError: ``batch_size < 1``, a node without examples, or an unknown ``order``.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        parts: Sequence[Any],
        *,
        batch_size: int,
        seeds: Sequence[int],
        order: str,
        device: torch.device,
    ) -> None:
        """Draw every node's first permutation."""
        if batch_size < 1:
            raise DataError(f"data.batch_size must be >= 1, got {batch_size}.")
        sizes = [len(p) for p in parts]
        if not all(sizes):
            which = f" (node index {sizes.index(0)})" if len(sizes) > 1 else ""
            raise DataError(f"a node was given no training examples{which}.")
        if order not in ORDERS:
            raise DataError(f"data.order must be one of {ORDERS}, got {order!r}.")
        self.device = device
        self.x = x.to(device)
        self.y = y.to(device)
        self._gens = [torch.Generator().manual_seed(s) for s in seeds]
        n, widest = len(parts), max(sizes)
        self._sizes_np = np.asarray(sizes, dtype=np.int64)
        self._batch_np = np.minimum(self._sizes_np, batch_size)
        self._pos_np = np.zeros(n, dtype=np.int64)
        # Each node's examples (global indices), padded; a permutation holds positions in it.
        local = np.zeros((n, widest), dtype=np.int64)
        for i, p in enumerate(parts):
            local[i, : sizes[i]] = np.asarray(p, dtype=np.int64)
        self._local = torch.from_numpy(local)
        # For order = "sorted": each node's labels, in its part's order.
        self._labels = y.to(_CPU)[self._local] if order == "sorted" else None
        self._local_dev = self._local.to(device)
        self._perm = torch.zeros(n, widest, dtype=torch.long, device=device)
        self._row_orders: list[torch.Tensor] | None = None  # _perm's rows, made by take
        self._new_orders(np.arange(n))
        self._batch_dev = torch.from_numpy(self._batch_np).to(device)
        self._all = torch.arange(n, device=device)
        self._widest_batch = int(self._batch_np.max())
        self._ragged = bool((self._batch_np != self._widest_batch).any())

    def shape_as(self, widest_batch: int, ragged: bool) -> None:
        """Give every batch ``widest_batch`` examples, with a mask where ``ragged``: the
        shape the stack of a larger population gives them (a sharded rank's stack of its
        own peers, shaped as the stack of every peer, reads the same tensors)."""
        self._widest_batch, self._ragged = widest_batch, ragged

    def state_dict(self, rows: Sequence[int] | None = None) -> dict[str, Any]:
        """Where every node is in its epoch (for a checkpoint): generators, positions and
        orders, as CPU tensors; of the nodes ``rows`` only, in that order, where given (a
        sharded rank's)."""
        at = list(range(len(self._gens))) if rows is None else [int(i) for i in rows]
        index = torch.tensor(at, dtype=torch.long)
        return {
            "generators": [self._gens[i].get_state() for i in at],
            "positions": torch.from_numpy(self._pos_np[at].copy()),
            "orders": self._perm.cpu()[index],
        }

    def load_state_dict(self, state: dict[str, Any], rows: Sequence[int] | None = None) -> None:
        """Continue from a :meth:`state_dict` (of the nodes ``rows``, where given)."""
        at = list(range(len(self._gens))) if rows is None else [int(i) for i in rows]
        for i, s in zip(at, state["generators"], strict=True):
            self._gens[i].set_state(s)
        self._pos_np[at] = state["positions"].numpy()
        index = torch.tensor(at, dtype=torch.long, device=self.device)
        self._perm[index] = state["orders"].to(self.device)

    def _order(self, i: int) -> torch.Tensor:
        """Node ``i``'s next epoch: a permutation of the positions in its part, drawn from
        its generator (then stably sorted by label, for ``order = "sorted"``)."""
        perm = torch.randperm(int(self._sizes_np[i]), generator=self._gens[i], device=_CPU)
        if self._labels is not None:
            perm = perm[torch.sort(self._labels[i][perm], stable=True).indices]
        return perm

    def _new_orders(self, rows: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        """Start the next epoch of every node in ``rows`` (each from its own generator) and
        write their permutations all at once."""
        if rows.size == 0:
            return
        perms = [self._order(i) for i in rows.tolist()]
        sizes = self._sizes_np[rows]
        flat = torch.cat(perms)
        row_index = np.repeat(rows, sizes)
        col_index = np.arange(flat.numel()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        self._perm[
            torch.from_numpy(row_index).to(self.device), torch.from_numpy(col_index).to(self.device)
        ] = flat.to(self.device)

    def take(self, i: int) -> torch.Tensor:
        """Node ``i``'s next batch alone, as positions in its part (a view of its order):
        what :meth:`next` gives it when only it is up, without the stacking (a
        :class:`BatchStream` calls it once a round)."""
        if self._row_orders is None:
            self._row_orders = list(self._perm.unbind())  # views: writes to _perm show
        order = self._row_orders[i]
        pos, batch = int(self._pos_np[i]), int(self._batch_np[i])
        size = int(self._sizes_np[i])
        if _past_end(pos, batch, size):  # its next epoch (as _new_orders, for one row)
            order[:size].copy_(self._order(i))
            pos = 0
        self._pos_np[i] = pos + batch
        return order[pos : pos + batch]

    def next(
        self, up: np.ndarray[Any, np.dtype[np.bool_]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The batches of the up nodes (``up``: host bool array) as ``(rows, x, y, mask)``:
        ``x`` of shape ``[len(rows), b, ...]`` with ``b`` the largest batch; where nodes'
        batches differ in size (a node holding fewer examples than ``batch_size``),
        ``mask [len(rows), b]`` marks each row's real examples (else ``None``). Positions
        are kept on the host (one integer per node), so no device value is read back."""
        pos, batch = self._pos_np, self._batch_np
        starting = np.nonzero(up & _past_end(pos, batch, self._sizes_np))[0]
        self._new_orders(starting)
        pos[starting] = 0
        offsets = torch.from_numpy(pos.copy()).to(self.device, non_blocking=True)
        everyone = bool(up.all())
        up_dev = None if everyone else torch.from_numpy(up.copy()).to(self.device)
        rows = self._all if up_dev is None else self._all[up_dev]
        b = self._widest_batch
        cols = offsets[rows].unsqueeze(1) + torch.arange(b, device=self.device)
        mask = None
        if self._ragged:
            count = self._batch_dev[rows].unsqueeze(1)
            keep = torch.arange(b, device=self.device) < count
            cols = torch.where(keep, cols, offsets[rows].unsqueeze(1))  # padding: any example
            mask = keep
        idx = self._local_dev[rows.unsqueeze(1), self._perm[rows.unsqueeze(1), cols]]
        pos += np.where(up, batch, 0)
        return rows, self.x[idx], self.y[idx], mask


class BatchStream:
    """One node's minibatches: shuffled without replacement, reshuffled every epoch (a
    one-row :class:`StackedBatches`, so the same batches the vectorized engine draws).

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

        Raises:
            DataError: ``batch_size < 1``, no examples, or an unknown ``order``.
        """
        self._stack = StackedBatches(
            x,
            y,
            [np.arange(len(x), dtype=np.int64)],  # the one node holds all of x, in order
            batch_size=batch_size,
            seeds=[seed],
            order=order,
            device=x.device,
        )
        self.x = x
        self.y = y
        self.examples = len(x)
        """How many training examples the node holds (FedAvg's weight)."""
        self.batch_size = min(batch_size, len(x))

    def __len__(self) -> int:
        """Number of examples this node holds."""
        return len(self.x)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the next ``batch_size`` examples, starting a new epoch when needed."""
        idx = self._stack.take(0)  # positions in the one part: all of x, so indices of x
        return self.x[idx], self.y[idx]
