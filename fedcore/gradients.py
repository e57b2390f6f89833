"""One gradient path for every engine: the loss and gradient of ``M`` stacked copies of a model.

A gRPC peer and the message engine call :meth:`RowGradient.loss_and_grad` with one row
(``M = 1``); the vectorized engine calls it with every up peer's row (``M = N``). Both run
the same code, so they agree exactly when the kernels it uses give each row the same bits
whatever ``M`` is (*batch-invariance*). Three ways to compute, chosen once per run
(:attr:`RowGradient.mode`):

* ``"batched"``: a ``Sequential`` of ``Flatten``, ``Linear`` and ``ReLU`` layers (the
  built-in ``logreg`` and ``mlp``) as batched matrix products over the peer axis, backward
  by autograd. Bit-identical rows for every ``M`` on any CPU, given what it relies on:

  - ``torch.bmm`` of ``[M, p, q] x [M, q, r]`` computes each row's product as its own
    GEMM (MKL's batched GEMM), and with ``M >= 2`` it splits the work over rows, so no GEMM
    is split across threads. A single row (``M = 1``) is therefore computed with one
    intra-op thread (:func:`one_thread`): with two threads MKL splits one GEMM and rounds
    differently.
  - Some CPUs' GEMM kernels round by where an operand or the result sits in memory (seen
    on AMD EPYC with AVX-512, where a row at an odd offset of the stacked tensors got other
    bits than the same row alone). So every operand's rows start at 64-byte boundaries
    (:func:`aligned_rows`), and every product is ``a @ b^T`` with both stored row-major
    (:func:`product`), the one form whose rounding did not depend on where the result's
    rows fall; a product with one output column is computed as two, one of zeros.
  - A batch of one example would make the products matrix-vector ones, which MKL's
    SSE4.2 kernels round differently by memory alignment; a batch of one is computed as
    two examples, the second a copy with weight 0, which adds exact zeros to every sum.
  - Elementwise ops (ReLU, the bias add), the softmax cross-entropy over the classes of
    one example, and the sum over a row's examples (the bias gradient) are computed per
    row in the same order for every ``M``.

  ``tests/test_gradients.py`` checks these under every kernel level CI forces
  (``ATEN_CPU_CAPABILITY`` and ``MKL_ENABLE_INSTRUCTIONS``), and one and two threads.
* ``"vmap"``: any other model ``torch.func.vmap`` can map. Not batch-invariant: vmap runs a
  convolution of ``M`` rows as one grouped convolution, whose rounding depends on ``M``.
  The engines agree to float32 rounding (about 1e-6 relative after one step), not bits.
* ``"module"``: a model vmap cannot map (BatchNorm's running statistics, data-dependent
  control flow, its own randomness): the module's own forward and backward, one row at a
  time, with one thread. Bit-identical on both engines, and slow at many rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn import functional

from fedcore.errors import DataError
from fedcore.ids import error_text

__all__ = [
    "ALIGNMENT",
    "GRADIENT_MODES",
    "RowGradient",
    "aligned_rows",
    "one_thread",
    "product",
]

logger = logging.getLogger(__name__)

GRADIENT_MODES = ("batched", "vmap", "module")

RowFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[float, torch.Tensor]]
"""One row's ``(loss, gradient)`` at flat parameters ``[d]`` on ``x [B, ...]``, ``y [B]``."""


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one intra-op thread (then restore the count)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class RowGradient:
    """Loss and gradient of stacked flat-parameter rows of one model (see the module
    docstring).

    Args:
        module: The model (its parameter values are not read: rows replace them).
        dtype: Parameter dtype.
        module_row: The module's own ``(loss, gradient)`` of one row (mode ``"module"``
            and the reference the others are checked against).
        mode: Use this mode (a run decides once, :func:`fedcore.runners.network.prepare_run`,
            and every peer and engine reuses it); ``None``: decide, by probing ``sample``
            if given, else ``"batched"`` where the layers allow and ``"module"`` otherwise.
        sample: A few training examples ``(x, y)`` (at least 6) to check the stacked
            gradients against ``module_row`` on.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        dtype: torch.dtype,
        module_row: RowFn,
        *,
        mode: str | None = None,
        sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Take the parameter layout; decide the mode."""
        self.module = module
        self.dtype = dtype
        self._module_row = module_row
        self._layout = [
            (name, tuple(p.shape), p.numel())
            for name, p in module.named_parameters()
            if p.requires_grad
        ]
        self.numel = sum(n for _, _, n in self._layout)
        self._buffers = dict(module.named_buffers())
        self._slices: list[tuple[str, int, int]] = []  # (name, offset, numel), flat order
        offset = 0
        for name, _, n in self._layout:
            self._slices.append((name, offset, n))
            offset += n
        self._where = {name: (start, n) for name, start, n in self._slices}
        self._layers = _batchable_layers(module)
        self._grad = torch.func.vmap(
            torch.func.grad_and_value(self._loss), in_dims=(0, 0, 0), randomness="error"
        )
        self._logits = torch.func.vmap(self._forward, in_dims=(0, None), randomness="error")
        self.why = ""
        self._constants: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        """Read-only constant tensors of the backward pass, by what they depend on."""
        if mode is not None:
            if mode not in GRADIENT_MODES or (mode == "batched" and self._layers is None):
                raise DataError(f"gradient mode {mode!r} does not fit this model.")
            self.mode = mode
        elif sample is None:
            self.mode = "batched" if self._layers is not None else "module"
        else:
            self.mode = self._probe(sample)

    # -- the model as a function of one flat row -------------------------------------

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

    # -- choosing the mode ------------------------------------------------------------

    def _probe(self, sample: tuple[torch.Tensor, torch.Tensor]) -> str:
        """The first of batched (where the layers allow), vmap, module whose gradients
        match the module's own at two parameter rows on ``sample``."""
        for mode in ("batched", "vmap"):
            if mode == "batched" and self._layers is None:
                continue
            self.mode = mode
            try:
                self._compare(sample)
                return mode
            except Exception as exc:  # any model vmap cannot map: try the next mode
                self.why = error_text(exc)
        logger.info("stacked gradients: one module per row (%s)", self.why)
        return "module"

    def _compare(self, sample: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = sample
        if len(y) < 6:
            raise DataError("fewer than 6 examples to compare gradients on")
        gen = torch.Generator().manual_seed(0)
        rows = torch.cat([p.detach().reshape(-1) for p in self.module.parameters()])
        rows = rows.to(self.dtype).unsqueeze(0).repeat(2, 1)
        rows[1] += 0.01 * torch.randn(rows.shape[1], generator=gen, dtype=rows.dtype)
        xs = x[:6].reshape(2, 3, *x.shape[1:])
        ys = y[:6].reshape(2, 3)
        losses, grads = self.loss_and_grad(rows, xs, ys)
        for i in range(2):
            loss, grad = self._module_row(rows[i], xs[i], ys[i])
            if not torch.allclose(grads[i], grad, rtol=1e-4, atol=1e-6) or abs(
                float(losses[i]) - loss
            ) > 1e-4 * max(1.0, abs(loss)):
                raise DataError(f"{self.mode} gradients differ from the module's own")

    # -- loss, gradient, logits ---------------------------------------------------------

    def loss_and_grad(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row mean cross-entropy ``[M]`` and gradient ``[M, d]`` of ``params [M, d]``
        on batches ``x [M, B, ...]``, ``y [M, B]``; ``mask [M, B]`` (bool) marks the
        examples of rows whose batches are shorter than ``B`` (a row is computed on its own
        examples only, as the peer holding them computes it)."""
        if mask is not None:
            return self._ragged(params, x, y, mask)
        if self.mode == "module":
            return self._rows(params, x, y)
        if params.shape[0] == 1 and torch.get_num_threads() != 1:
            with one_thread():
                return self._stacked(params, x, y)
        return self._stacked(params, x, y)

    def _stacked(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "vmap":
            self.module.train()
            grads, losses = self._grad(params, x, y)
            return losses.detach(), grads.detach()
        single = x.shape[1] == 1
        if single:  # never a matrix-vector product (see the module docstring)
            x = torch.cat([x, x], dim=1)
            y = torch.cat([y, y], dim=1)
        return self._backprop(params, x, y, single)

    def _backprop(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, single: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy and its gradient through Flatten/Linear/ReLU layers, the
        backward pass written out (batched matmuls, no autograd graph): per layer
        ``dW = g^T h``, ``db = sum_b g``, ``g <- g W``, through ReLU ``g <- g [z > 0]``."""
        assert self._layers is not None
        m, b = y.shape
        inputs: list[torch.Tensor] = []  # what each Linear layer saw
        relus: list[torch.Tensor] = []  # where each ReLU let through
        weights: dict[str, torch.Tensor] = {}  # each Linear layer's, every row aligned
        h = self.batched_forward(params, x, inputs=inputs, relus=relus, weights=weights)
        logp = torch.log_softmax(h, dim=-1)
        y1 = y.unsqueeze(-1)
        ce = -logp.gather(-1, y1).squeeze(-1)  # [M, B]
        losses = ce[:, 0] if single else ce.mean(dim=1)
        key = (single, m, b, h.dtype, h.device)
        constants = self._constants.get(key)
        if constants is None:  # the same few shapes every step: made once (read only)
            if single:  # the second example is the first's copy, weighted 0
                weight_b = torch.tensor([1.0, 0.0], dtype=h.dtype, device=h.device)
            else:
                weight_b = torch.full((b,), 1.0 / b, dtype=h.dtype, device=h.device)
            minus_one = torch.full_like(ce, -1.0).unsqueeze(-1)
            if len(self._constants) > 64:
                self._constants.clear()
            constants = self._constants[key] = (weight_b.view(1, b, 1), minus_one)
        g = logp.exp()
        g.scatter_add_(-1, y1, constants[1])
        g = g * constants[0]
        grads: dict[str, torch.Tensor] = {}
        linear = len(inputs)
        for prefix, layer in reversed(self._layers):
            if isinstance(layer, torch.nn.Linear):
                linear -= 1
                # dW = g^T h and g <- g W, each as a product by a transposed operand
                g_t = aligned_rows(g.transpose(1, 2))
                grads[f"{prefix}weight"] = product(
                    g_t, aligned_rows(inputs[linear].transpose(1, 2))
                )
                if layer.bias is not None:
                    grads[f"{prefix}bias"] = g.sum(dim=1)
                if linear > 0:
                    assert isinstance(layer, torch.nn.Linear)
                    g = product(aligned_rows(g), aligned_rows(weights[prefix].transpose(1, 2)))
            elif isinstance(layer, torch.nn.ReLU):
                g = g * relus.pop()
        flat = [grads[name].reshape(m, -1) for name, _, _ in self._slices]
        return losses, torch.cat(flat, dim=1)

    def _ragged(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows grouped by batch size, each group on exactly its rows' examples."""
        counts = mask.sum(dim=1)
        losses = torch.empty(params.shape[0], dtype=self.dtype, device=params.device)
        grads = torch.empty_like(params)
        for c in torch.unique(counts).tolist():
            rows = torch.nonzero(counts == c).squeeze(1)
            c = int(c)
            loss, grad = self.loss_and_grad(params[rows], x[rows, :c], y[rows, :c])
            losses[rows] = loss.to(losses.dtype)
            grads[rows] = grad
        return losses, grads

    def _rows(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's own gradient, row by row, with one thread."""
        losses = torch.empty(params.shape[0], dtype=torch.float64)
        grads = torch.empty_like(params)
        with one_thread():
            for i in range(params.shape[0]):
                loss, grad = self._module_row(params[i].cpu(), x[i].cpu(), y[i].cpu())
                losses[i] = loss
                grads[i] = grad.to(params.device)
        return losses.to(params.device), grads

    def batched_forward(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        shared_input: bool = False,
        inputs: list[torch.Tensor] | None = None,
        relus: list[torch.Tensor] | None = None,
        weights: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits ``[M, B, C]`` of ``M`` stacked models of Flatten/Linear/ReLU layers on
        ``x`` (``[M, B, ...]``, or ``[B, ...]`` shared by every row), as batched matmuls;
        ``inputs``, ``relus`` and ``weights`` collect what the backward pass needs (each
        Linear layer's input, each ReLU's mask, each Linear layer's weights). Every operand
        of a matmul has each row at a 64-byte boundary (:func:`aligned_rows`)."""
        assert self._layers is not None
        h = x.to(self.dtype)
        lead = 2 if shared_input is False else 1  # dims before a per-example feature
        for prefix, layer in self._layers:
            if isinstance(layer, torch.nn.Flatten):
                h = h.flatten(lead, -1) if h.dim() > lead + 1 else h
            elif isinstance(layer, torch.nn.Linear):
                if lead == 2:
                    h = aligned_rows(h)
                lead = 2
                if inputs is not None:
                    inputs.append(h)
                weight = aligned_rows(self._weight(params, prefix, layer))
                if weights is not None:
                    weights[prefix] = weight
                # (examples shared by every row, evaluation: one matmul)
                h = product(h, weight) if h.dim() == 3 else torch.matmul(h, weight.transpose(1, 2))
                if layer.bias is not None:
                    start, n = self._where[f"{prefix}bias"]
                    h = h + params[:, start : start + n].unsqueeze(1)
            else:
                if relus is not None:
                    relus.append(h > 0)
                h = torch.relu(h)
        return h

    def _weight(self, params: torch.Tensor, prefix: str, layer: torch.nn.Linear) -> torch.Tensor:
        """A Linear layer's weights of every row, ``[M, out, in]`` (a view of ``params``)."""
        start, n = self._where[f"{prefix}weight"]
        return params[:, start : start + n].view(params.shape[0], layer.out_features, -1)

    def logits(self, params: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[M, B, C]`` of every row on the shared examples ``x [B, ...]``
        (modes batched and vmap)."""
        if self.mode == "batched":
            return self.batched_forward(params, x, shared_input=True)
        self.module.eval()
        out: torch.Tensor = self._logits(params, x)
        return out


ALIGNMENT = 64
"""Bytes: where every row of a matmul operand starts (torch's CPU allocator aligns every
tensor to 64 bytes)."""


def aligned_rows(t: torch.Tensor) -> torch.Tensor:
    """``t [M, ...]`` with every row starting at a multiple of :data:`ALIGNMENT` bytes from
    the storage's start: ``t`` itself where it is so (a contiguous tensor whose rows are
    whole multiples of it), else a copy into rows padded to it.

    MKL's small GEMM kernels round a product differently by the address of its operands on
    some CPUs (seen on AMD EPYC with AVX-512, where a row at an odd offset of ``[M, ...]``
    got other bits than the same row alone); with every row aligned, a row's product is the
    same bits alone and among any rows."""
    if t.device.type != "cpu":
        return t
    step = max(1, ALIGNMENT // t.element_size())
    size = math.prod(t.shape[1:])
    if t.is_contiguous() and size % step == 0 and t.storage_offset() % step == 0:
        return t
    stride = -(-size // step) * step
    out = t.new_empty((t.shape[0], stride))[:, :size].view(t.shape)
    return out.copy_(t)


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b^T`` of ``a [M, p, q]`` and ``b [M, r, q]``, row-aligned (:func:`aligned_rows`),
    each row's product as the same bits alone and among any rows.

    Only this form is: on the CPU above, a product by a non-transposed ``b`` (and one with a
    single output column, ``r = 1``, which is computed as ``r = 2`` with a zero row) rounded
    by where the result's rows fall."""
    if b.shape[1] == 1:
        return product(a, torch.cat([b, torch.zeros_like(b)], dim=1))[:, :, :1]
    return torch.bmm(a, b.transpose(1, 2))


def _batchable_layers(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]] | None:
    """``(parameter-name prefix, layer)`` of a ``Sequential`` of only ``Flatten`` (default
    dims), ``Linear`` and ``ReLU`` layers (the built-in logreg and mlp), else None."""
    if not isinstance(module, torch.nn.Sequential):
        return None
    layers: list[tuple[str, Any]] = []
    for name, layer in module.named_children():
        flatten = isinstance(layer, torch.nn.Flatten) and (layer.start_dim, layer.end_dim) == (
            1,
            -1,
        )
        if not (flatten or isinstance(layer, torch.nn.Linear | torch.nn.ReLU)):
            return None
        layers.append((f"{name}.", layer))
    return layers
