"""Many nodes' models and minibatches at once, for the vectorized engine.

* :class:`StackedObjective`: the loss and gradient of ``N`` models in one call, from their
  parameters stacked as ``[N, d]`` (each row the flat vector a per-node
  :class:`~fedcore.models.Objective` holds), through the same
  :class:`~fedcore.gradients.RowGradient` code a peer runs on its one row; and every
  row's accuracy. :attr:`StackedObjective.mode` says how the run computes gradients
  (batched layers, vmap, or the module row by row), and :attr:`why` why.
* :class:`StackedBatches`: every node's next minibatch as index tensors, drawing exactly
  the batches :class:`~fedcore.data.BatchStream` draws for the same seed (the same
  per-node generator, called only when a node starts an epoch), so both engines train on
  identical data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fedcore.config import ORDERS
from fedcore.errors import DataError
from fedcore.evaluation import row_accuracy
from fedcore.gradients import RowGradient
from fedcore.models import Objective

__all__ = ["StackedBatches", "StackedObjective"]

logger = logging.getLogger(__name__)

_CPU = torch.device("cpu")
"""Where host-side draws happen (the per-node generators live there)."""


class StackedObjective:
    """Loss, gradient and accuracy of ``N`` stacked models (see the module docstring).

    Args:
        make: A fresh per-node objective (the run's model, same initialization, and the
            run's gradient mode).
        device: Where the stacked parameters and batches live.
        evaluator: The run's evaluating objective, which mode ``"module"`` evaluates every
            node's model with (as the message engine does; a model's buffers, such as
            BatchNorm statistics, are then the evaluator's).
    """

    def __init__(
        self,
        make: Callable[[], Objective],
        device: torch.device,
        evaluator: Objective | None = None,
    ) -> None:
        """Take the model's layout and the run's gradient mode from one objective."""
        self._make = make
        self.device = device
        template = self._build()
        self.dtype = template.dtype
        self.numel = template.numel
        self.mode = template.rows.mode
        self.why = (evaluator or template).rows.why  # the run decided on the evaluator
        self._evaluator = evaluator
        if self.mode == "module":
            self.rows = template.rows
        else:
            module = self._build().module.to(device)
            self.rows = RowGradient(
                module, self.dtype, template.module_loss_and_grad, mode=self.mode
            )

    def _build(self) -> Objective:
        """A per-node objective, built on the CPU (as the message engine builds it)."""
        with torch.device("cpu"):
            return self._make()

    def loss_and_grad(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row mean cross-entropy ``[M]`` and gradient ``[M, d]``
        (:meth:`~fedcore.gradients.RowGradient.loss_and_grad`)."""
        return self.rows.loss_and_grad(params, x, y, mask)

    @torch.no_grad()
    def accuracy(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Accuracy ``[M]`` (float64) of every row of ``params`` on the test set ``(x, y)``."""
        out = torch.empty(params.shape[0], dtype=torch.float64, device=params.device)
        if self.mode == "module":
            # As the message engine evaluates: with the run's evaluator for every node.
            if self._evaluator is None:
                self._evaluator = self._build()
            objective = self._evaluator
            for i in range(params.shape[0]):
                out[i] = objective.evaluate(params[i].cpu(), x.cpu(), y.cpu())[1]
            return out
        return row_accuracy(self.rows, params, x, y)


class StackedBatches:
    """Every node's minibatches as :class:`~fedcore.data.BatchStream` draws them.

    Node ``i`` holds the training examples ``parts[i]`` and a generator seeded with
    ``seeds[i]``; it reads ``min(batch_size, len(parts[i]))`` examples a round from a
    permutation drawn when it starts an epoch (sorted by label, ties in the permutation's
    order, for ``order = "sorted"``). A crashed node reads nothing that round.

    Args:
        x, y: The training split.
        parts: Each node's example indices.
        batch_size: ``data.batch_size``.
        seeds: Each node's stream seed.
        order: ``"shuffled"`` or ``"sorted"``.
        device: Where batches are built.
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
        if order not in ORDERS:
            raise DataError(f"data.order must be one of {ORDERS}, got {order!r}.")
        sizes = [len(p) for p in parts]
        if not all(sizes):
            empty = sizes.index(0)
            raise DataError(f"a node was given no training examples (node index {empty}).")
        self.device = device
        self.x = x.to(device)
        self.y = y.to(device)
        self._y_cpu = y
        self._gens = [torch.Generator().manual_seed(s) for s in seeds]
        self._sorted = order == "sorted"
        n, widest = len(parts), max(sizes)
        self._sizes_np = np.asarray(sizes, dtype=np.int64)
        self._batch_np = np.minimum(self._sizes_np, batch_size)
        self._pos_np = np.zeros(n, dtype=np.int64)
        # Each node's examples (global indices), padded; a permutation holds positions in it.
        local = np.zeros((n, widest), dtype=np.int64)
        for i, p in enumerate(parts):
            local[i, : sizes[i]] = np.asarray(p, dtype=np.int64)
        self._local = torch.from_numpy(local)
        self._local_dev = self._local.to(device)
        self._perm = torch.zeros(n, widest, dtype=torch.long, device=device)
        self._starts = np.concatenate([[0], np.cumsum(self._sizes_np)[:-1]])
        self._new_orders(np.arange(n))
        self._batch_dev = torch.from_numpy(self._batch_np).to(device)
        self._all = torch.arange(n, device=device)
        self._widest_batch = int(self._batch_np.max())
        self._ragged = bool((self._batch_np != self._widest_batch).any())

    def state_dict(self) -> dict[str, Any]:
        """Where every node is in its epoch (for a checkpoint): generators, positions and
        orders, as CPU tensors."""
        return {
            "generators": [g.get_state() for g in self._gens],
            "positions": torch.from_numpy(self._pos_np.copy()),
            "orders": self._perm.cpu(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        for g, s in zip(self._gens, state["generators"], strict=True):
            g.set_state(s)
        self._pos_np[:] = state["positions"].numpy()
        self._perm.copy_(state["orders"].to(self.device))

    def _new_orders(self, rows: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        """Draw the next epoch's permutation of every node in ``rows`` (each from its own
        generator, as its BatchStream would) and write them all at once."""
        if rows.size == 0:
            return
        sizes = self._sizes_np[rows]
        perms = [
            torch.randperm(int(m), generator=self._gens[i], device=_CPU)
            for i, m in zip(rows, sizes, strict=True)
        ]
        if self._sorted:
            labels = self._y_cpu
            for k, i in enumerate(rows.tolist()):
                perm = perms[k]
                key = labels[self._local[i, perm]]
                perms[k] = perm[torch.sort(key, stable=True).indices]
        flat = torch.cat(perms)
        row_index = np.repeat(rows, sizes)
        col_index = np.arange(flat.numel()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        self._perm[
            torch.from_numpy(row_index).to(self.device), torch.from_numpy(col_index).to(self.device)
        ] = flat.to(self.device)

    def next(
        self, up: np.ndarray[Any, np.dtype[np.bool_]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The batches of the up nodes (``up``: host bool array) as ``(rows, x, y, mask)``:
        ``x`` of shape ``[len(rows), b, ...]`` with ``b`` the largest batch; where nodes'
        batches differ in size (a node holding fewer examples than ``batch_size``),
        ``mask [len(rows), b]`` marks each row's real examples (else ``None``). Positions
        are kept on the host (one integer per node), so no device value is read back."""
        pos, batch = self._pos_np, self._batch_np
        starting = np.nonzero(up & (pos + batch > self._sizes_np))[0]
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
