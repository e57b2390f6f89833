"""One gradient path for every engine: the loss and gradient of ``M`` stacked copies of a model.

A gRPC peer and the message engine call :meth:`RowGradient.loss_and_grad` with one row
(``M = 1``); the vectorized engine calls it with every up peer's row (``M = N``). Both run
the same code, so they agree exactly when the kernels it uses give each row the same bits
whatever ``M`` is (*batch-invariance*). Three ways to compute, chosen once per run
(:attr:`RowGradient.mode`):

* ``"batched"``: a ``Sequential`` of ``Flatten``, ``Linear`` and ``ReLU`` layers (the
  built-in ``logreg`` and ``mlp``) as batched matrix products over the peer axis, the
  softmax cross-entropy's backward written out (``p = softmax(logits)``, ``p[y] -= 1``,
  ``p`` times each example's weight, then per layer ``dW = p^T h``, ``db = sum_b p``,
  ``p <- p W`` masked by the ReLU; no autograd). Bit-identical rows for every ``M`` on
  any CPU, given what it relies on:

  - ``torch.matmul`` of ``[M, B, k] x [M, k, n]`` computes each row's product as its own
    GEMM, and with ``M >= 2`` torch splits the work over rows, so no GEMM is split across
    threads. A single row (``M = 1``) is therefore computed with one intra-op thread
    (:func:`one_thread`): with two threads MKL splits one GEMM and rounds differently. The
    same holds only for a contiguous product: written into a strided slice (``out=``),
    MKL's AVX2 kernels split a row's GEMM over two threads too (and torch multiplies the
    rows one by one), so each layer's weight gradient is computed contiguous and then
    copied into its slice.
  - A batch of one example would make the products matrix-vector ones, which MKL's
    SSE4.2 kernels round differently by memory alignment; a batch of one is computed as
    two examples, the second a copy with weight 0, which adds exact zeros to every sum.
  - Elementwise ops (ReLU, the bias add), the softmax cross-entropy over the classes of
    one example, and the sums over a row's examples (the bias gradients, the loss) are
    computed per row in the same order for every ``M``. The sums are pairwise over the
    examples zero-padded to a power of two (:func:`_sum_examples`), so zeros appended to
    a row's examples do not change them either.
  - Rows of different batch sizes (a peer holding fewer examples than the batch size)
    share one pass, padded to the longest with examples weighted 0, where that gives each
    row the bits of its own examples alone: in float32 on MKL's AVX2 kernels or later,
    every row of at least 4 examples and the longest of at most 64, and no layer's
    product crossing torch's small-product threshold (:meth:`RowGradient._pads_exactly`:
    where MKL's kernels were seen to change with the number of examples; within these
    limits they add a product's terms over the examples in order, so the padding adds
    exact zeros; MKL's SSE4.2 kernels add the last ones by the operands' alignment,
    :func:`_padding_kernels`). Otherwise rows are grouped by batch size, each group
    computed on exactly its rows' examples.
  - MKL runs in its conditional numerical reproducibility mode (``MKL_CBWR=AUTO``, set
    when fedcore is imported; :func:`reproducible_blas`): otherwise its GEMM kernels
    round by the memory address of the operands on some CPUs (AMD EPYC with AVX-512, where
    a row at an odd offset of the stacked ``[M, d]`` parameters got other bits than the
    same row alone). The mode costs no measurable time here.

  ``tests/gradients/test_rows.py`` checks these under every kernel level CI forces
  (``ATEN_CPU_CAPABILITY`` and ``MKL_ENABLE_INSTRUCTIONS``), and one and two threads.
* ``"vmap"``: any other model ``torch.func.vmap`` can map. Not batch-invariant: vmap runs a
  convolution of ``M`` rows as one grouped convolution, whose rounding depends on ``M``.
  The engines (a peer's gradient as one row, or as one of several) agree to rounding, not
  bits, except where an input to a ReLU's gate (or a max-pool window's two largest) lies
  within that rounding of zero (of each other): the gate then flips on one engine only,
  and every parameter upstream of it moves by that activation's whole share of the
  gradient, which no rounding bounds (one float32 step measured 1.2e-4 relative for
  ``resnet20``, 5.7e-4 for ``cnn32``). So ``tests/engines/test_published_models.py``
  compares vmap-mode models in float64, where such a flip is all but impossible, against
  a bound derived from the kernels' rounding (its docstring derives it).
* ``"module"``: a model vmap cannot map (BatchNorm's running statistics, data-dependent
  control flow, its own randomness), or maps only by looping over the rows itself (an
  operator with no batching rule, such as an LSTM's ``aten::mkldnn_rnn_layer``: torch warns
  of "a performance drop", which the probe takes as a no; 9x slower than this mode for the
  built-in ``char-lstm`` at 16 rows): the module's own forward and backward, one row at a
  time, with one thread. Bit-identical on both engines, and slow at many rows.

The probe (:meth:`RowGradient._probe`) takes the first of batched (where the layers allow)
and vmap whose gradients at two parameter rows match the module's own: elementwise, or
for a deep model within 1e-3 of the gradient's norm (:func:`_agree`). Only the vectorized
engine says that it fell back to one module per row, once a process.

The package: :mod:`~fedcore.gradients.rows` holds :class:`RowGradient`,
:mod:`~fedcore.gradients.blas` what it asks of the CPU's kernels and checks.
"""

from __future__ import annotations

from fedcore.gradients.blas import one_thread, reproducible_blas, row_reduce
from fedcore.gradients.rows import GRADIENT_MODES, RowGradient, model_input

__all__ = [
    "GRADIENT_MODES",
    "RowGradient",
    "model_input",
    "one_thread",
    "reproducible_blas",
    "row_reduce",
]
