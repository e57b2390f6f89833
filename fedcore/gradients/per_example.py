"""Per-example gradients, each clipped to a norm, summed per row: what DP-SGD adds its
noise to (:mod:`fedcore.privacy.dpsgd`), through the same :class:`RowGradient` every
engine shares.

:func:`clipped_sums` returns, for rows ``params [M, d]`` on batches ``x [M, B, ...]``,
``y [M, B]``, each row's mean loss and ``sum_b min(1, C / ||g_b||) g_b``, ``g_b`` the
gradient of example ``b``'s own cross-entropy. Two of the gradient path's modes:

* ``"batched"`` (Flatten, Linear, ReLU), written out: the backward pass of
  :meth:`RowGradient._backprop` with every example weighted 1, keeping each Linear
  layer's signal ``p_b`` and input ``h_b``. An example's weight gradient is the outer
  product ``p_b h_b^T``, whose norm is ``||p_b|| ||h_b||``, and its bias gradient is
  ``p_b``: so ``||g_b||^2 = sum over layers of ||p_b||^2 (||h_b||^2 + 1)``, with no
  ``[B, d]`` per-example tensor formed. The clipped sum is then each layer's product
  ``(s p)^T h`` with ``s_b = min(1, C / ||g_b||)``: the same batched products as the
  plain gradient, so a row gets the same bits alone or among many (the squared norms are
  pairwise sums, the square root :func:`~fedcore.counter_random.sqrt_tensor`'s, both
  exact operations). Rows of different batch sizes are computed by size, never padded.
* ``"vmap"``: ``torch.func`` per example (``vmap`` over rows of ``vmap`` over examples of
  ``grad``), then the norms, the factors and the sum. As the plain vmap gradient, the
  engines agree to rounding, not bits.

Mode ``"module"`` (a model vmap cannot map, BatchNorm's running statistics) has no
per-example gradient here: :func:`clipped_sums` refuses it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

from fedcore.counter_random import sqrt_tensor
from fedcore.errors import DataError
from fedcore.gradients.blas import one_thread
from fedcore.gradients.rows import RowGradient, _sum_examples

__all__ = ["clipped_sums"]


def clipped_sums(
    rows: RowGradient,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    clip: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's mean cross-entropy ``[M]``, its sum of per-example gradients each
    clipped to norm ``clip`` ``[M, d]``, and its number of examples ``[M]`` (int64);
    ``mask [M, B]`` as :meth:`RowGradient.loss_and_grad` takes it (a row's examples
    first).

    Raises:
        DataError: the run's gradient mode is ``"module"``.
    """
    if rows.mode == "module":
        raise DataError(
            "DP-SGD needs per-example gradients, which this model's gradient mode "
            f"'module' cannot give ({rows.why or 'torch.func cannot map the model'}); use a "
            "model torch.func can map (no BatchNorm: model.norm = 'group')."
        )
    m, b = y.shape
    if mask is not None:
        counts = mask.sum(dim=1)
        if int(counts.min()) != int(counts.max()):  # by size: each row's own examples
            losses = torch.empty(m, dtype=rows.dtype, device=params.device)
            sums = torch.empty_like(params)
            for c in torch.unique(counts).tolist():
                at = torch.nonzero(counts == c).squeeze(1)
                c = int(c)
                loss, part, _ = clipped_sums(
                    rows, params[at], x[at, :c].contiguous(), y[at, :c].contiguous(), clip
                )
                losses[at] = loss.to(losses.dtype)
                sums[at] = part
            return losses, sums, counts.to(torch.int64)
        b = int(counts[0])
        x, y = x[:, :b].contiguous(), y[:, :b].contiguous()
    counts = torch.full((m,), b, dtype=torch.int64, device=params.device)
    if rows.mode == "vmap":
        return (*_vmap_sums(rows, params, x, y, clip), counts)
    if m == 1 and torch.get_num_threads() != 1:  # as RowGradient computes a single row
        with one_thread():
            return (*_batched_sums(rows, params, x, y, clip), counts)
    return (*_batched_sums(rows, params, x, y, clip), counts)


def _squares(t: torch.Tensor) -> torch.Tensor:
    """``sum_k t[..., k]^2`` of ``t [M, B, K]`` as ``[M, B]``, pairwise (the same bits for a
    row whatever ``M``)."""
    m, b, k = t.shape
    sq = (t * t).reshape(m * b, k)
    if k == 1:
        return sq.reshape(m, b)
    return _sum_examples(sq).reshape(m, b)


def _factors(norms2: torch.Tensor, clip: float, dtype: torch.dtype) -> torch.Tensor:
    """``min(1, clip / sqrt(norms2))`` in ``dtype``, through float64 and
    :func:`~fedcore.counter_random.sqrt_tensor` (exact operations only)."""
    n2 = norms2.to(torch.float64)
    over = n2 > clip * clip
    root = sqrt_tensor(torch.where(over, n2, 1.0))
    return torch.where(over, clip / root, 1.0).to(dtype)


def _batched_sums(
    rows: RowGradient, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mode ``"batched"`` (see the module docstring)."""
    layers = rows._layers
    assert layers is not None
    single = y.shape[1] == 1
    if single:  # never a matrix-vector product: a copy weighted 0 (RowGradient._stacked)
        x, y = torch.cat([x, x], dim=1), torch.cat([y, y], dim=1)
    m, b = y.shape
    inputs: list[torch.Tensor] = []
    relus: list[torch.Tensor] = []
    h = rows.batched_forward(params, x, inputs=inputs, relus=relus)
    logp = torch.log_softmax(h, dim=-1)
    y1 = y.unsqueeze(-1)
    ce = logp.gather(-1, y1).squeeze(-1)
    losses = ce[:, 0].neg() if single else _sum_examples(ce).div_(b).neg_()
    g = logp.exp_()
    g.scatter_add_(-1, y1, torch.full((m, b, 1), -1.0, dtype=g.dtype, device=g.device))
    if single:
        g[:, 1].zero_()
    signals: list[tuple[str, torch.nn.Linear, torch.Tensor, torch.Tensor]] = []
    norms2 = torch.zeros(m, b, dtype=g.dtype, device=g.device)
    linear = len(inputs)
    for prefix, layer in reversed(layers):
        if isinstance(layer, torch.nn.Linear):
            linear -= 1
            h_in = inputs[linear]
            part = _squares(g) * _squares(h_in)
            if layer.bias is not None:
                part += _squares(g)
            norms2 += part
            signals.append((prefix, layer, g, h_in))
            if linear > 0:
                g = torch.matmul(g, rows._weight(params, prefix, layer))
        elif isinstance(layer, torch.nn.ReLU):
            g = g * relus.pop()
    s = _factors(norms2, clip, g.dtype).unsqueeze(-1)  # [M, B, 1]
    out = torch.empty_like(params)
    for prefix, layer, p, h_in in signals:
        p = p * s
        rows._weight(out, prefix, layer).copy_(torch.matmul(p.transpose(1, 2), h_in))
        if layer.bias is not None:
            start, n = rows._where[f"{prefix}bias"]
            out[:, start : start + n].copy_(_sum_examples(p))
    return losses, out


def _vmap_sums(
    rows: RowGradient, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mode ``"vmap"``: per-example gradients by ``torch.func`` (see the module
    docstring)."""
    m = params.shape[0]
    layers = {
        name: params[:, start : start + n].view(m, *shape)
        for (name, shape, n), (_, start, _) in zip(rows._layout, rows._slices, strict=True)
    }

    def one(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return functional.cross_entropy(rows._call(p, xb.unsqueeze(0)), yb.unsqueeze(0))

    each: Any = torch.func.vmap(
        torch.func.vmap(torch.func.grad_and_value(one), in_dims=(None, 0, 0), randomness="error"),
        in_dims=(0, 0, 0),
        randomness="error",
    )
    rows.module.train()
    grads, losses = each(layers, x, y)  # [M, B, ...] per layer; [M, B]
    flat = [grads[name].reshape(m, y.shape[1], -1) for name, _, _ in rows._slices]
    norms2 = torch.stack([(f * f).sum(dim=-1) for f in flat]).sum(dim=0)
    s = _factors(norms2, clip, params.dtype).unsqueeze(-1)
    out = torch.empty_like(params)
    for (_, start, n), f in zip(rows._slices, flat, strict=True):
        out[:, start : start + n].copy_((f * s).sum(dim=1))
    return losses.detach().mean(dim=1), out
