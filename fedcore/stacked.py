"""Many nodes' models and minibatches at once, for the vectorized engine.

* :class:`StackedObjective`: the loss and gradient of ``N`` models in one call, from their
  parameters stacked as ``[N, d]`` (each row the flat vector a per-node
  :class:`~fedcore.models.Objective` holds). It maps ``torch.func.grad`` over the rows with
  ``vmap`` and ``functional_call``, for every model vmap can handle (the built-in ones and
  most user models). A model it cannot handle (an in-place buffer update such as
  BatchNorm's running statistics, data-dependent control flow, its own randomness) falls
  back to one module per node whose flat parameters are loaded row by row: slower, the
  same numbers. :attr:`StackedObjective.mode` says which, and :attr:`why` why.
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
from torch.nn import functional

from fedcore.config import ORDERS
from fedcore.errors import DataError
from fedcore.ids import error_text
from fedcore.models import Objective

__all__ = ["StackedBatches", "StackedObjective"]

logger = logging.getLogger(__name__)

_CPU = torch.device("cpu")
"""Where host-side draws happen (the per-node generators live there)."""

_EVAL_CHUNK = 1 << 22
"""Logits (nodes x examples x classes) evaluated at once: bounds evaluation memory."""


class StackedObjective:
    """Loss, gradient and accuracy of ``N`` stacked models (see the module docstring).

    Args:
        make: A fresh per-node objective (the run's model, same initialization).
        device: Where the stacked parameters and batches live.
        sample: A few training examples ``(x, y)`` (at least 6) to check vmap's gradients
            against the module's own.
        evaluator: The run's evaluating objective, which the per-node fallback evaluates
            every node's model with (as the message engine does; a model's buffers, such as
            BatchNorm statistics, are then the evaluator's).
    """

    def __init__(
        self,
        make: Callable[[], Objective],
        device: torch.device,
        sample: tuple[torch.Tensor, torch.Tensor],
        evaluator: Objective | None = None,
    ) -> None:
        """Take the model's parameter layout from one objective and probe vmap on it."""
        self._make = make
        self.device = device
        template = self._build()
        self.dtype = template.dtype
        self.numel = template.numel
        module = template.module.to(device)
        self.module = module
        self._layout = [
            (name, tuple(p.shape), p.numel())
            for name, p in module.named_parameters()
            if p.requires_grad
        ]
        self._buffers = dict(module.named_buffers())
        self._offsets: dict[str, int] = {}
        offset = 0
        for name, _, n in self._layout:
            self._offsets[name] = offset
            offset += n
        self._layers = _batchable_layers(module)
        self._fallback: list[Objective] = []
        self._evaluator = evaluator
        self.mode = "batched" if self._layers is not None else "vmap"
        self.why = ""
        self._grad = torch.func.vmap(
            torch.func.grad_and_value(self._loss), in_dims=(0, 0, 0), randomness="error"
        )
        self._masked_grad = torch.func.vmap(
            torch.func.grad_and_value(self._masked_loss), in_dims=(0, 0, 0, 0), randomness="error"
        )
        self._logits = torch.func.vmap(self._forward, in_dims=(0, None), randomness="error")
        self._probe(self._build(), sample)

    def _unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for name, shape, n in self._layout:
            out[name] = flat[offset : offset + n].view(shape)
            offset += n
        return out

    def _forward(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        params = self._unflatten(flat)
        result: torch.Tensor = torch.func.functional_call(
            self.module, (params, self._buffers), (x.to(self.dtype),)
        )
        return result

    def _loss(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(self._forward(flat, x), y)

    def _masked_loss(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The mean loss over the examples ``mask`` keeps (padding rows count nothing)."""
        losses = functional.cross_entropy(self._forward(flat, x), y, reduction="none")
        return (losses * mask).sum() / mask.sum()

    def _probe(self, reference: Objective, sample: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Compare the stacked gradients with a per-node objective (on the CPU) at two
        parameter rows on ``sample``: the batched layers if the model is made of them, else
        vmap; fall back to vmap, then to one module per node, on any failure or
        disagreement."""
        if self.mode == "batched":
            self._compare(reference, sample)
            if self.mode == "batched":
                return
            self.mode = "vmap"
        self._compare(reference, sample)

    def _compare(self, reference: Objective, sample: tuple[torch.Tensor, torch.Tensor]) -> None:
        gen = torch.Generator().manual_seed(0)
        rows = reference.initial_params().unsqueeze(0).repeat(2, 1)
        rows[1] += 0.01 * torch.randn(rows.shape[1], generator=gen, dtype=rows.dtype, device=_CPU)
        try:
            if len(sample[1]) < 6:
                raise DataError("fewer than 6 examples to compare gradients on")
            x = sample[0][:6].reshape(2, 3, *sample[0].shape[1:])
            y = sample[1][:6].reshape(2, 3)
            losses, grads = self.loss_and_grad(
                rows.to(self.device), x.to(self.device), y.to(self.device)
            )
            for i in range(2):
                loss, grad = reference.loss_and_grad(rows[i], x[i], y[i])
                if not torch.allclose(grads[i].cpu(), grad, rtol=1e-4, atol=1e-6) or abs(
                    float(losses[i]) - loss
                ) > 1e-4 * max(1.0, abs(loss)):
                    raise DataError("vmap's gradient differs from the module's own")
        except Exception as exc:  # any model vmap cannot map: the per-node fallback
            if self.mode == "batched":
                self.mode = "vmap-next"  # try vmap before giving up
                return
            self.mode = "per-node"
            self.why = error_text(exc)
            logger.info("stacked gradients: one module per node (%s)", self.why)

    def _build(self) -> Objective:
        """A per-node objective, built on the CPU (as the message engine builds it)."""
        with torch.device("cpu"):
            return self._make()

    def _objectives(self, n: int) -> list[Objective]:
        while len(self._fallback) < n:
            self._fallback.append(self._build())
        return self._fallback

    def loss_and_grad(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row mean cross-entropy ``[M]`` and gradient ``[M, d]`` of ``params [M, d]``
        on batches ``x [M, B, ...]``, ``y [M, B]``; ``mask [M, B]`` (1 or 0) marks the
        examples of rows whose batches are shorter than ``B``."""
        if self.mode == "batched":
            return self._batched_loss_and_grad(params, x, y, mask)
        if self.mode == "vmap":
            self.module.train()
            if mask is None:
                grads, losses = self._grad(params, x, y)
            else:
                grads, losses = self._masked_grad(params, x, y, mask.to(self.dtype))
            return losses.detach(), grads.detach()
        if mask is not None:
            counts = mask.sum(dim=1).to(torch.long).tolist()
            return self._per_node(params, [(x[i, :c], y[i, :c]) for i, c in enumerate(counts)])
        return self._per_node(params, [(x[i], y[i]) for i in range(x.shape[0])])

    def _batched_forward(
        self, params: torch.Tensor, x: torch.Tensor, shared_input: bool = False
    ) -> torch.Tensor:
        """Logits ``[M, B, C]`` of ``M`` stacked models of Flatten/Linear/ReLU layers on
        ``x`` (``[M, B, ...]``, or ``[B, ...]`` shared by every row), as batched matmuls."""
        assert self._layers is not None
        m = params.shape[0]
        h = x.to(self.dtype)
        lead = 2 if shared_input is False else 1  # dims before a per-example feature
        for prefix, layer in self._layers:
            if isinstance(layer, torch.nn.Flatten):
                h = h.flatten(lead, -1) if h.dim() > lead + 1 else h
            elif isinstance(layer, torch.nn.Linear):
                lead = 2
                start = self._offsets[f"{prefix}weight"]
                size = layer.out_features * layer.in_features
                weight = params[:, start : start + size].view(m, layer.out_features, -1)
                h = torch.matmul(h, weight.transpose(1, 2))
                if layer.bias is not None:
                    start = self._offsets[f"{prefix}bias"]
                    h = h + params[:, start : start + layer.out_features].unsqueeze(1)
            else:
                h = torch.relu(h)
        return h

    def _batched_loss_and_grad(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        p = params.detach().requires_grad_(True)
        with torch.enable_grad():
            logits = self._batched_forward(p, x)
            classes = logits.shape[-1]
            ce = functional.cross_entropy(
                logits.reshape(-1, classes), y.reshape(-1), reduction="none"
            ).view(y.shape)
            if mask is None:
                losses = ce.mean(dim=1)
            else:
                weight = mask.to(ce.dtype)
                losses = (ce * weight).sum(dim=1) / weight.sum(dim=1)
            (grad,) = torch.autograd.grad(losses.sum(), p)
        return losses.detach(), grad

    def _per_node(
        self, params: torch.Tensor, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        objectives = self._objectives(params.shape[0])
        losses_out = torch.empty(params.shape[0], dtype=torch.float64, device=_CPU)
        grads_out = torch.empty_like(params)
        for i, (x, y) in enumerate(batches):
            loss, grad = objectives[i].loss_and_grad(params[i].cpu(), x.cpu(), y.cpu())
            losses_out[i] = loss
            grads_out[i] = grad.to(params.device)
        return losses_out.to(params.device), grads_out

    @torch.no_grad()
    def accuracy(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Accuracy ``[M]`` (float64) of every row of ``params`` on the test set ``(x, y)``."""
        out = torch.empty(params.shape[0], dtype=torch.float64, device=params.device)
        if self.mode != "vmap":
            # As the message engine evaluates: with the run's evaluator for every node.
            if self._evaluator is None:
                self._evaluator = self._build()
            objective = self._evaluator
            for i in range(params.shape[0]):
                out[i] = objective.evaluate(params[i].cpu(), x.cpu(), y.cpu())[1]
            return out
        self.module.eval()

        def forward(rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            if self.mode == "batched":
                return self._batched_forward(rows, x, shared_input=True)
            logits: torch.Tensor = self._logits(rows, x)
            return logits

        step = 1  # one row first, to learn the number of classes
        start = 0
        while start < params.shape[0]:
            rows = params[start : start + step]
            logits = forward(rows, x)
            hits = (logits.argmax(dim=-1) == y).to(torch.float64)
            out[start : start + rows.shape[0]] = hits.mean(dim=1)
            start += rows.shape[0]
            step = max(1, _EVAL_CHUNK // max(1, len(y) * int(logits.shape[-1])))
        return out


def _batchable_layers(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]] | None:
    """``(parameter-name prefix, layer)`` of a ``Sequential`` of only ``Flatten`` (default
    dims), ``Linear`` and ``ReLU`` layers (the built-in logreg and mlp), else None."""
    if not isinstance(module, torch.nn.Sequential):
        return None
    layers = []
    for name, layer in module.named_children():
        flatten = isinstance(layer, torch.nn.Flatten) and (layer.start_dim, layer.end_dim) == (
            1,
            -1,
        )
        if not (flatten or isinstance(layer, torch.nn.Linear | torch.nn.ReLU)):
            return None
        layers.append((f"{name}.", layer))
    return layers


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
