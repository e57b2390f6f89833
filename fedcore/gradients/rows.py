""":class:`RowGradient`: the loss and gradient of stacked flat-parameter rows of one model,
by batched products, ``torch.func.vmap`` or the module row by row (see
:mod:`fedcore.gradients` for what keeps the rows batch-invariant)."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional

from fedcore.errors import DataError
from fedcore.gradients.blas import _padding_kernels, one_thread, reproducible_blas
from fedcore.ids import error_text

logger = logging.getLogger(__name__)


GRADIENT_MODES = ("batched", "vmap", "module")

_SMALL_PRODUCT = 400
"""torch multiplies a batch of matrices with its own loop, not BLAS, where one product has
fewer than this many multiply-adds (``bmm`` on the CPU)."""

_FEWEST_PADDED = 4
"""Rows of fewer examples are not padded: MKL multiplies a matrix of 2 or 3 rows (a row's
examples) with other kernels than a longer one (other bits for the same row)."""

_WIDEST_PADDED = 64
"""Batches of more examples are not padded: MKL splits a product's sum over more than 192
examples into blocks by their number (so padding would move the blocks' bounds); 64
leaves a margin for CPUs whose kernels block sooner."""


def model_input(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a model takes it: floating features in the model's ``dtype``, integer ones
    (a character model's indices) as they are."""
    return x.to(dtype) if x.is_floating_point() else x


RowFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[float, torch.Tensor]]
"""One row's ``(loss, gradient)`` at flat parameters ``[d]`` on ``x [B, ...]``, ``y [B]``."""


class RowGradient:
    """Loss and gradient of stacked flat-parameter rows of one model (see the module
    docstring).

    Args:
        module: The model (its parameter values are not read: rows replace them).
        dtype: Parameter dtype.
        module_row: The module's own ``(loss, gradient)`` of one row (mode ``"module"``
            and the reference the others are checked against).
        mode: Use this mode (a run decides once, :func:`fedcore.setup.prepare.prepare_run`,
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
        reproducible_blas()
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
        self._padding: dict[tuple[int, int, int], bool] = {}
        self._grad = torch.func.vmap(
            torch.func.grad_and_value(self._layer_loss), in_dims=(0, 0, 0), randomness="error"
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
        return self._call(self._unflatten(flat), x)

    def _call(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = torch.func.functional_call(
            self.module, (params, self._buffers), (model_input(x, self.dtype),)
        )
        return result

    def _layer_loss(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        return functional.cross_entropy(self._call(params, x), y)

    def _vmap_grad(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """vmap's losses and gradients of rows ``params [M, d]``, taken per layer (views of
        ``params``) and written into one ``[M, d]`` result. Taken with respect to the flat
        rows, autograd would add each layer's gradient zero-padded to ``[M, d]``: several
        stacks at once, for a large model the round's peak. The bits are those sums':
        each value once, plus exact zeros, which turn a ``-0.0`` into ``+0.0`` (hence the
        ``+ 0.0`` pass where there is more than one layer)."""
        m = params.shape[0]
        layers = {
            name: params[:, start : start + n].view(m, *shape)
            for (name, shape, n), (_, start, _) in zip(self._layout, self._slices, strict=True)
        }
        grads, losses = self._grad(layers, x, y)
        del layers
        out = torch.empty_like(params)
        for name, start, n in self._slices:
            out[:, start : start + n].copy_(grads.pop(name).reshape(m, n))
        if len(self._slices) > 1:
            out.add_(0.0)
        return losses.detach(), out

    # -- choosing the mode ------------------------------------------------------------

    def _probe(self, sample: tuple[torch.Tensor, torch.Tensor]) -> str:
        """The first of batched (where the layers allow), vmap, module whose gradients
        match the module's own at two parameter rows on ``sample``."""
        for mode in ("batched", "vmap"):
            if mode == "batched" and self._layers is None:
                continue
            self.mode = mode
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    self._compare(sample)
                slow = _loops_over_rows(caught)
                if mode == "vmap" and slow:
                    self.why = (
                        f"torch.func.vmap has no batching rule for {slow} and would loop over "
                        "the rows, slower than one module per row"
                    )
                    continue
                return mode
            except Exception as exc:  # any model vmap cannot map: try the next mode
                self.why = error_text(exc)
        # The engine that stacks rows says so, once (fedcore.engines.vectorized).
        logger.debug("stacked gradients: one module per row (%s)", self.why)
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
            if not _agree(grads[i], grad) or abs(float(losses[i]) - loss) > 1e-4 * max(
                1.0, abs(loss)
            ):
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
        on batches ``x [M, B, ...]``, ``y [M, B]``; ``mask [M, B]`` (bool, each row's
        ``True`` entries first) marks the examples of rows whose batches are shorter than
        ``B``: a row gets the bits of its own examples alone, as the peer holding them
        computes it (the examples past them are weighted 0 or left out, so they must be
        finite: :class:`~fedcore.data.StackedBatches` repeats a row's first)."""
        if self.mode == "module":
            return self._rows(params, x, y) if mask is None else self._ragged(params, x, y, mask)
        if mask is not None:
            counts = mask.sum(dim=1)
            low, high = (int(v) for v in torch.aminmax(counts))
            if low == high:  # one size after all: no padding
                return self.loss_and_grad(params, x[:, :low].contiguous(), y[:, :low].contiguous())
            if self.mode == "vmap" or not self._pads_exactly(low, x.shape[1]):
                return self._ragged(params, x, y, mask)
            out = self._backprop(params, x, y, counts)
            if not self._padding_agrees(params, x, y, counts, out):
                return self._ragged(params, x, y, mask)
            return out
        if params.shape[0] == 1 and torch.get_num_threads() != 1:
            with one_thread():
                return self._stacked(params, x, y)
        return self._stacked(params, x, y)

    def _pads_exactly(self, shortest: int, b: int) -> bool:
        """Whether rows of ``shortest`` to ``b`` examples can share one pass padded to
        ``b`` (the examples past a row's own weighted 0) and still get the bits of the row
        alone. Zero-weighted examples add exact zeros to every sum over examples (equal
        values; at most a zero's sign can differ), as long as padding changes neither the
        products' kernels nor how they split a sum. In float32 (float64's kernels change
        with the number of examples in more ways), MKL multiplies 2 or 3 examples with
        other kernels than 4 or more (:data:`_FEWEST_PADDED`) and splits a sum over many
        examples (above :data:`_WIDEST_PADDED`) into blocks by their number; torch
        multiplies small products (:data:`_SMALL_PRODUCT`) with its own loop. All of this
        holds for MKL's AVX2 kernels and later only (:func:`_padding_kernels`)."""
        assert self._layers is not None
        if self.dtype != torch.float32 or shortest < _FEWEST_PADDED or b > _WIDEST_PADDED:
            return False
        if not _padding_kernels():
            return False
        for _, layer in self._layers:
            if isinstance(layer, torch.nn.Linear):
                size = layer.in_features * layer.out_features
                if size * shortest < _SMALL_PRODUCT <= size * b:
                    return False
        return True

    def _padding_agrees(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        counts: torch.Tensor,
        out: tuple[torch.Tensor, torch.Tensor],
    ) -> bool:
        """Whether this CPU's kernels give a padded row the bits of the row alone, checked
        once per (examples, padded batch, threads) on a row of the call itself: the limits
        of :meth:`_pads_exactly` were measured on one machine's MKL, and a CPU whose
        kernels handle a product's last examples otherwise must fall back to grouping
        (:meth:`_ragged`) rather than give other bits than the peer alone."""
        b, threads = x.shape[1], torch.get_num_threads()
        agrees = True
        for k in sorted({int(c) for c in counts} - {b}):
            key = (k, b, threads)
            if key not in self._padding:
                i = int(torch.nonzero(counts == k)[0])
                loss, grad = self.loss_and_grad(
                    params[i : i + 1], x[i : i + 1, :k].contiguous(), y[i : i + 1, :k].contiguous()
                )
                self._padding[key] = bool(
                    torch.equal(loss[0], out[0][i]) and torch.equal(grad[0], out[1][i])
                )
                if not self._padding[key]:
                    logger.info(
                        "rows of %d examples padded to %d differ from the row alone on this "
                        "CPU's kernels; computing such batches by size instead",
                        k,
                        b,
                    )
            agrees = agrees and self._padding[key]
        return agrees

    def _stacked(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "vmap":
            self.module.train()
            return self._vmap_grad(params, x, y)
        if x.shape[1] == 1:  # never a matrix-vector product (see the module docstring)
            x = torch.cat([x, x], dim=1)
            y = torch.cat([y, y], dim=1)
            return self._backprop(params, x, y, single=True)
        return self._backprop(params, x, y)

    def _backprop(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        counts: torch.Tensor | None = None,
        single: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy and its gradient through Flatten/Linear/ReLU layers, the
        backward pass written out (batched matmuls, no autograd graph): with ``p`` the
        softmax of the logits, ``p[y] -= 1`` and ``p`` scaled by each example's weight,
        per layer ``dW = p^T h``, ``db = sum_b p``, ``p <- p W``, through ReLU ``p <- p
        [z > 0]``. A row's examples weigh ``1 / count`` each: ``count`` is ``counts[i]``
        (the first ones; the rest weigh 0), else ``B``, else 1 with ``single`` (the
        second example a copy)."""
        assert self._layers is not None
        m, b = y.shape
        inputs: list[torch.Tensor] = []  # what each Linear layer saw
        relus: list[torch.Tensor] = []  # where each ReLU let through
        h = self.batched_forward(params, x, inputs=inputs, relus=relus)
        logp = torch.log_softmax(h, dim=-1)
        y1 = y.unsqueeze(-1)
        ce = logp.gather(-1, y1).squeeze(-1)  # [M, B], minus each example's loss
        weight, divisor, own = self._weights(m, b, h, counts, single)
        if single:
            losses = ce[:, 0].neg()
        else:
            if own is not None:  # padding adds exact zeros
                ce = torch.where(own, ce, 0.0)
            losses = _sum_examples(ce).div_(divisor).neg_()
        g = logp.exp_()  # the softmax, in logp's place (logp is read no more)
        g.scatter_add_(-1, y1, self._minus_one(m, b, h))
        g.mul_(weight)
        # Each layer's gradient goes into its slice of the one [M, d] result (no per-layer
        # tensors concatenated after: one stack, not two), computed as a contiguous product
        # and then copied there: into a strided output (out=) torch multiplies the rows one
        # by one (several times slower), and with two threads MKL's AVX2 kernels then split
        # one row's GEMM over the threads (other bits than the row alone).
        out = torch.empty_like(params)
        linear = len(inputs)
        for prefix, layer in reversed(self._layers):
            if isinstance(layer, torch.nn.Linear):
                linear -= 1
                product = torch.matmul(g.transpose(1, 2), inputs[linear])
                self._weight(out, prefix, layer).copy_(product)
                if layer.bias is not None:
                    start, n = self._where[f"{prefix}bias"]
                    out[:, start : start + n].copy_(_sum_examples(g))
                if linear > 0:
                    g = torch.matmul(g, self._weight(params, prefix, layer))
            elif isinstance(layer, torch.nn.ReLU):
                g.mul_(relus.pop())  # g is this pass's own tensor
        return losses, out

    def _weights(
        self, m: int, b: int, h: torch.Tensor, counts: torch.Tensor | None, single: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Each example's weight ``[M, B, 1]``, each row's count ``[M]`` (h's dtype), and
        with ``counts`` which examples are a row's own ``[M, B]`` (bool). A row's weight
        ``1 / count`` is the same bits padded or alone: the division correctly rounded in
        h's dtype (from a Python float here, a tensor's reciprocal with ``counts``; the
        same value for any count below 2**24)."""
        if counts is not None:
            count = counts.to(h.dtype)
            own = torch.arange(b, device=h.device) < counts.unsqueeze(1)
            weight = torch.where(own, count.reciprocal().unsqueeze(1), 0.0)
            return weight.unsqueeze(-1), count, own
        key = ("weights", single, m, b, h.dtype, h.device)
        constants = self._constants.get(key)
        if constants is None:  # the same few shapes every step: made once (read only)
            if single:  # the second example is the first's copy, weighted 0
                weight = torch.tensor([1.0, 0.0], dtype=h.dtype, device=h.device)
            else:
                weight = torch.full((b,), 1.0 / b, dtype=h.dtype, device=h.device)
            divisor = torch.full((m,), 1 if single else b, dtype=h.dtype, device=h.device)
            constants = self._remember(key, (weight.view(1, b, 1), divisor))
        return constants[0], constants[1], None

    def _minus_one(self, m: int, b: int, h: torch.Tensor) -> torch.Tensor:
        """``-1`` of shape ``[M, B, 1]`` (subtracted at each example's label)."""
        key = ("minus_one", m, b, h.dtype, h.device)
        constants = self._constants.get(key)
        if constants is None:
            minus = torch.full((m, b, 1), -1.0, dtype=h.dtype, device=h.device)
            constants = self._remember(key, (minus, minus))
        return constants[0]

    def _remember(
        self, key: tuple[Any, ...], value: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self._constants) > 64:
            self._constants.clear()
        self._constants[key] = value
        return value

    def _ragged(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows grouped by batch size, each group on exactly its rows' examples."""
        counts = mask.sum(dim=1)
        sizes = torch.unique(counts).tolist()
        losses = torch.empty(params.shape[0], dtype=self.dtype, device=params.device)
        grads = torch.empty_like(params)
        for c in sizes:
            rows = torch.nonzero(counts == c).squeeze(1)
            c = int(c)
            x_c, y_c = x[rows, :c].contiguous(), y[rows, :c].contiguous()
            loss, grad = self.loss_and_grad(params[rows], x_c, y_c)
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
    ) -> torch.Tensor:
        """Logits ``[M, B, C]`` of ``M`` stacked models of Flatten/Linear/ReLU layers on
        ``x`` (``[M, B, ...]``, or ``[B, ...]`` shared by every row), as batched matmuls;
        ``inputs`` and ``relus`` collect what the backward pass needs (each Linear layer's
        input, each ReLU's mask)."""
        assert self._layers is not None
        h = x.to(self.dtype)
        lead = 2 if shared_input is False else 1  # dims before a per-example feature
        owned = False  # whether h is a tensor made here (not the caller's x)
        for prefix, layer in self._layers:
            if isinstance(layer, torch.nn.Flatten):
                h = h.flatten(lead, -1) if h.dim() > lead + 1 else h
            elif isinstance(layer, torch.nn.Linear):
                lead = 2
                if inputs is not None:
                    inputs.append(h)
                h = torch.matmul(h, self._weight(params, prefix, layer).transpose(1, 2))
                if layer.bias is not None:  # in place: h is the product's own new tensor
                    start, n = self._where[f"{prefix}bias"]
                    h.add_(params[:, start : start + n].unsqueeze(1))
            else:
                if relus is not None:
                    relus.append(h > 0)
                h = torch.relu_(h) if owned else torch.relu(h)
            owned = isinstance(layer, torch.nn.Linear | torch.nn.ReLU)  # h is a new tensor
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


def _agree(grad: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether a stacked gradient is the module's own up to float rounding: elementwise
    (``rtol`` 1e-4, ``atol`` 1e-6), or for a deep model within 1e-3 of its norm. Two correct
    float32 kernels of a deep model differ by more than 1e-4 in some entries (ResNet-20 with
    GroupNorm at its initial weights: the module's own native kernels were 1.3e-4 from the
    float64 gradient where vmap's were 2.5e-7); a model vmap maps wrongly (in-place
    statistics, its own randomness) is off by far more, or fails outright."""
    if torch.allclose(grad, reference, rtol=1e-4, atol=1e-6):
        return True
    return bool((grad - reference).norm() <= 1e-3 * reference.norm())


def _loops_over_rows(caught: list[warnings.WarningMessage]) -> str:
    """The operator vmap had no batching rule for (``"aten::mkldnn_rnn_layer"``, an LSTM's,
    which it then computes row by row in a Python-level loop: torch warns "There is a
    performance drop"), from the warnings of a probe; ``""`` if none."""
    for w in caught:
        text = str(w.message)
        if "batching rule" in text:
            found = re.search(r"for (aten::[A-Za-z0-9_.]+)", text)
            return found.group(1).rstrip(".") if found else "an operator of the model"
    return ""


def _sum_examples(t: torch.Tensor) -> torch.Tensor:
    """The sum over dim 1 (a row's examples) of ``t [M, L, ...]`` (``L >= 2``), pairwise:
    as if padded with zeros to the next power of two, each half added onto the other until
    one is left. Zeros appended to the examples (a padded row) leave every sum the same
    bits: the halves they fall in add exact zeros. (``torch.sum`` does not guarantee this:
    how it splits the sum depends on the length.)"""
    length = t.shape[1]
    half = 1 << ((length - 1).bit_length() - 1)  # half the next power of two
    s = t[:, :half].clone()
    s[:, : length - half].add_(t[:, half:])
    while half > 1:
        half //= 2
        s[:, :half].add_(s[:, half : 2 * half])
    return s[:, 0]


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
