"""Many nodes' models evaluated at once on one test set, in chunks that stay in cache.

Evaluating ``N`` models on a test set of ``B`` examples makes ``N x B x C`` logits: at
10,000 peers, 4,000 test examples and two classes, 320 MB, every byte of which used to
be written, read back by ``argmax``, compared and averaged in separate passes over memory.
Here the rows of the parameter stack go through in chunks whose logits take about
:data:`CHUNK_BYTES` (a core's L2 cache), and each chunk's figures are finished while its
logits are still in cache:

* the first ``Linear`` layer of a batched model (:attr:`~fedcore.gradients.RowGradient.
  mode` ``"batched"``) is one matrix product of the shared test inputs with the chunk's
  stacked weights (``[B, in] @ [in, m * out]``) rather than ``m`` small products;
* a prediction is the first largest logit, as ``argmax`` says, with two classes read off
  one comparison (``l1 > l0``, NaN counted as ``argmax`` counts it);
* the consensus distance of the same rows is taken in the same pass.

The figures equal those of :meth:`fedcore.models.Objective.evaluate` and
:func:`fedcore.metrics.consensus_distance` (accuracy exactly where the logits are the same
floats, as they are for the built-in models; the distance within float64 rounding of a
sum taken in another order).
"""

from __future__ import annotations

import torch

from fedcore.gradients import RowGradient

__all__ = [
    "CHUNK_BYTES",
    "EVAL_INPUT_BYTES",
    "VMAP_CHUNK_VALUES",
    "chunk_rows",
    "example_chunk",
    "hits",
    "row_accuracy",
    "stacked_figures",
]

CHUNK_BYTES = 1 << 20
"""Bytes of per-row intermediate values (logits, hidden activations) one chunk makes."""

VMAP_CHUNK_VALUES = 1 << 22
"""Logits one chunk of a ``vmap`` model makes (its hidden layers are unknown here: the
bound that keeps evaluation memory in check, as before)."""

EVAL_INPUT_BYTES = 64 << 20
"""Bytes of input examples (rows x examples x bytes an example) one forward pass of a model
whose layers are unknown here takes (modes ``vmap`` and ``module``): a deep model's
activations are a few times its inputs a layer, so this bounds its evaluation memory
(ResNet-20 on CIFAR-10's 10,000 test images at once would take over 2 GiB a model). The
small datasets (digits, MNIST-1D) fit whole in one pass, as before."""


def example_chunk(examples: int, example_bytes: int, *, rows: int = 1) -> int:
    """Examples per forward pass of ``rows`` models, within :data:`EVAL_INPUT_BYTES`."""
    return max(1, min(examples, EVAL_INPUT_BYTES // max(1, rows * example_bytes)))


def chunk_rows(examples: int, width: int, itemsize: int, *, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: as many as keep ``examples x width`` values of each within
    ``chunk_bytes`` (at least one)."""
    return max(1, chunk_bytes // max(1, examples * width * itemsize))


def hits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Correct predictions per row, ``[m]`` (int64), of ``logits [m, B, C]`` on labels
    ``y [B]``: the prediction is ``logits.argmax(-1)`` (the first largest; a NaN counts as
    the largest, the first NaN where there are several)."""
    if logits.shape[-1] == 2:
        l0, l1 = logits[..., 0], logits[..., 1]
        one = (l1 > l0) | (l1.isnan() & ~l0.isnan())
        return (one == (y == 1)).sum(dim=1)
    return (logits.argmax(dim=-1) == y).sum(dim=1)


def _widest(rows: RowGradient) -> int:
    """The most values one example makes in any layer of a batched model."""
    widths = [
        layer.out_features for _, layer in rows._layers or () if isinstance(layer, torch.nn.Linear)
    ]
    return max(widths, default=1)


def _batched_logits(rows: RowGradient, params: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Logits ``[m, B, C]`` of the ``m`` rows of ``params`` on the shared inputs ``x``, as
    :meth:`~fedcore.gradients.RowGradient.batched_forward` computes them, but with the first
    ``Linear`` layer as one matrix product for all ``m`` rows."""
    assert rows._layers is not None
    m = params.shape[0]
    h = x.to(rows.dtype)
    if h.dim() > 2:
        h = h.flatten(1, -1)
    first = True
    for prefix, layer in rows._layers:
        if isinstance(layer, torch.nn.Flatten):
            if h.dim() > 3:
                h = h.flatten(2, -1)
        elif isinstance(layer, torch.nn.Linear):
            weight = rows._weight(params, prefix, layer)  # [m, out, in]
            out = layer.out_features
            if first:
                # [B, in] @ [in, m * out]: one product, then [m, B, out] as a view.
                h = torch.matmul(h, weight.reshape(m * out, -1).t())
                if layer.bias is not None:
                    start, n = rows._where[f"{prefix}bias"]
                    h = h + params[:, start : start + n].reshape(m * out)
                h = h.view(h.shape[0], m, out).transpose(0, 1)
                first = False
            else:
                h = torch.matmul(h, weight.transpose(1, 2))
                if layer.bias is not None:
                    start, n = rows._where[f"{prefix}bias"]
                    h = h + params[:, start : start + n].unsqueeze(1)
        else:
            h = torch.relu(h)
    return h


@torch.no_grad()
def row_accuracy(
    rows: RowGradient,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    chunk_bytes: int = CHUNK_BYTES,
) -> torch.Tensor:
    """Test accuracy ``[M]`` (float64) of every row of ``params`` (modes ``batched`` and
    ``vmap``)."""
    return stacked_figures(rows, params, x, y, distance=False, chunk_bytes=chunk_bytes)[0]


@torch.no_grad()
def stacked_figures(
    rows: RowGradient,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    distance: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[torch.Tensor, float]:
    """Every row's test accuracy ``[M]`` (float64) and, with ``distance``, the consensus
    distance ``(1/M) sum_i ||p_i - mean||_2`` (float64; NaN when not asked), in one pass
    over ``params`` after the mean (see the module docstring). Modes ``batched`` and
    ``vmap`` (the module mode evaluates one model at a time, elsewhere)."""
    total = params.shape[0]
    acc = torch.empty(total, dtype=torch.float64, device=params.device)
    examples = len(y)
    mean: torch.Tensor | None = None
    if distance:
        mean = torch.zeros(params.shape[1], dtype=torch.float64, device=params.device)
        step = chunk_rows(params.shape[1], 1, 8, chunk_bytes=chunk_bytes)
        for start in range(0, total, step):
            mean += params[start : start + step].to(torch.float64).sum(dim=0)
        mean /= total
    norms = torch.empty(total if distance else 0, dtype=torch.float64, device=params.device)
    batched = rows.mode == "batched" and rows._layers is not None
    step = chunk_rows(examples, _widest(rows), params.element_size(), chunk_bytes=chunk_bytes)
    part = examples  # examples a pass: all of them, but for a deep model's many
    if not batched:
        step = 1  # one row first, to learn the number of classes
        example_bytes = x[:1].numel() * max(params.element_size(), x.element_size())
        part = example_chunk(examples, example_bytes)
    start = 0
    while start < total:
        chunk = params[start : start + step]
        end = start + chunk.shape[0]
        if batched:
            correct = hits(_batched_logits(rows, chunk, x), y)
        else:
            correct = torch.zeros(chunk.shape[0], dtype=torch.int64, device=params.device)
            for first in range(0, examples, part):
                logits = rows.logits(chunk, x[first : first + part])
                correct += hits(logits, y[first : first + part])
        acc[start:end] = correct.to(torch.float64) / examples
        if mean is not None:
            norms[start:end] = (chunk.to(torch.float64) - mean).norm(dim=1)
        start = end
        if not batched:
            step = max(1, VMAP_CHUNK_VALUES // max(1, part * int(logits.shape[-1])))
            step = min(step, max(1, EVAL_INPUT_BYTES // (part * example_bytes)))
    return acc, float(norms.mean()) if distance else float("nan")
