"""The one gradient path: each row's loss and gradient are the same bits whatever the batch.

:mod:`fedcore.gradients` states what the engines' agreement relies on: the kernels of the
``batched`` mode give a row the same bits whether it is computed alone (a gRPC peer, the
message engine) or among ``M`` rows (the vectorized engine), with one or two threads, for
any batch size and any subset of rows. These tests check that on this machine's kernels;
``.ci/run`` runs them once more under forced lower kernel levels (``ATEN_CPU_CAPABILITY``,
``MKL_ENABLE_INSTRUCTIONS``), with every test that compares engines.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.gradients import RowGradient, blas, one_thread, reproducible_blas
from fedcore.gradients import rows as rows_module
from fedcore.gradients.rows import _sum_examples
from fedcore.models import Objective, cnn1d, logreg, mlp

INPUT = 64
CLASSES = 10


def _objective(name: str) -> Objective:
    torch.manual_seed(1)
    if name == "logreg":
        module = logreg(input_dim=INPUT, num_classes=CLASSES)
    elif name == "mlp":
        module = mlp(input_dim=INPUT, num_classes=CLASSES)
    elif name == "mlp-wide":  # odd sizes: rows of the activations at unaligned offsets
        module = mlp(input_dim=INPUT, num_classes=CLASSES, hidden=37)
    else:
        module = cnn1d(input_dim=INPUT, num_classes=CLASSES, hidden=8)
    gen = torch.Generator().manual_seed(2)
    sample = (torch.randn(6, INPUT, generator=gen), torch.randint(0, CLASSES, (6,), generator=gen))
    return Objective(module, sample=sample)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield int(request.param)
    torch.set_num_threads(before)


def _rows(objective: Objective, m: int, b: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    start = objective.initial_params()
    params = start + 0.1 * torch.randn(m, start.numel(), generator=gen)
    x = torch.randn(m, b, INPUT, generator=gen)
    y = torch.randint(0, CLASSES, (m, b), generator=gen)
    return params, x, y


@pytest.mark.parametrize("name", ["logreg", "mlp", "mlp-wide"])
@pytest.mark.parametrize("m", [2, 3, 17, 64])
@pytest.mark.parametrize("b", [1, 2, 5, 32])
def test_a_row_alone_equals_the_row_among_many(name: str, m: int, b: int, threads: int) -> None:
    """A peer's gradient of its one row is bit for bit the vectorized engine's row, and so
    is the row among any subset of the rows (crashed peers leave the batch)."""
    objective = _objective(name)
    assert objective.rows.mode == "batched"
    params, x, y = _rows(objective, m, b, seed=m * 100 + b)
    losses, grads = objective.rows.loss_and_grad(params, x, y)
    for i in sorted({0, m // 2, m - 1}):
        loss, grad = objective.loss_and_grad(params[i].clone(), x[i].clone(), y[i].clone())
        assert torch.equal(grad, grads[i]), f"row {i} of {m}"
        assert loss == float(losses[i])
    odd = torch.arange(1, m, 2)
    _, some = objective.rows.loss_and_grad(params[odd], x[odd], y[odd])
    assert torch.equal(some, grads[odd])


@settings(max_examples=60, deadline=None)
@given(
    features=st.integers(1, 70),
    hidden=st.one_of(st.none(), st.integers(1, 70)),
    classes=st.integers(2, 12),
    b=st.integers(1, 40),
    m=st.integers(2, 9),
    threads=st.sampled_from([1, 2]),
    double=st.booleans(),
)
def test_any_shape_row_alone_equals_the_row_among_many(
    features: int, hidden: int | None, classes: int, b: int, m: int, threads: int, double: bool
) -> None:
    """Odd sizes put a row's operands and results at any offset of the stacked tensors;
    MKL's kernels round by offset on some CPUs unless its reproducibility mode is on (as
    fedcore switches it on): the rows stay the lone row's bits."""
    assert reproducible_blas()
    torch.manual_seed(features * 1000 + classes)
    if hidden is None:
        module = logreg(input_dim=features, num_classes=classes)
    else:
        module = mlp(input_dim=features, num_classes=classes, hidden=hidden)
    dtype = torch.float64 if double else torch.float32
    rows = RowGradient(module, dtype, lambda *_: (0.0, torch.zeros(0)), mode="batched")
    gen = torch.Generator().manual_seed(m * 100 + b)
    start = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).to(dtype)
    params = start + 0.1 * torch.randn(m, start.numel(), generator=gen, dtype=dtype)
    x = torch.randn(m, b, features, generator=gen)
    y = torch.randint(0, classes, (m, b), generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        losses, grads = rows.loss_and_grad(params, x, y)
        for i in sorted({0, m // 2, m - 1}):
            loss, grad = rows.loss_and_grad(params[i : i + 1].clone(), x[i : i + 1], y[i : i + 1])
            assert torch.equal(grad[0], grads[i]), f"row {i} of {m}"
            assert torch.equal(loss[0], losses[i])
    finally:
        torch.set_num_threads(before)


def test_rows_of_different_batch_sizes_are_computed_on_their_own_examples(threads: int) -> None:
    """A peer holding fewer examples than the batch size: the engine's padded row equals
    the peer's own, unpadded batch."""
    objective = _objective("mlp")
    params, x, y = _rows(objective, 5, 8, seed=3)
    counts = torch.tensor([8, 3, 8, 1, 5])
    mask = torch.arange(8) < counts.unsqueeze(1)
    _, grads = objective.rows.loss_and_grad(params, x, y, mask)
    for i, c in enumerate(counts.tolist()):
        _, grad = objective.loss_and_grad(params[i], x[i, :c], y[i, :c])
        assert torch.equal(grad, grads[i])


def _module_rows(module: torch.nn.Module, dtype: torch.dtype) -> RowGradient:
    return RowGradient(module, dtype, lambda *_: (0.0, torch.zeros(0)), mode="batched")


def _stack(
    module: torch.nn.Module, m: int, b: int, features: int, classes: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    start = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    params = start + 0.1 * torch.randn(m, start.numel(), generator=gen)
    x = torch.randn(m, b, features, generator=gen)
    y = torch.randint(0, classes, (m, b), generator=gen)
    return params, x, y


@settings(max_examples=80, deadline=None)
@given(
    features=st.integers(1, 70),
    hidden=st.one_of(st.none(), st.integers(2, 70)),
    classes=st.integers(2, 12),
    b=st.integers(5, 64),
    m=st.integers(2, 9),
    shortest=st.integers(4, 63),
    threads=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_padded_rows_equal_their_examples_alone(
    features: int,
    hidden: int | None,
    classes: int,
    b: int,
    m: int,
    shortest: int,
    threads: int,
    data: st.DataObject,
) -> None:
    """Rows of different batch sizes in one pass, padded to the longest with examples
    weighted 0: each row is the bits of its own examples alone (a peer's gradient),
    loss included, for any shape within the padding's limits."""
    shortest = min(shortest, b - 1)
    counts = data.draw(st.lists(st.integers(shortest, b), min_size=m, max_size=m))
    counts[0], counts[-1] = shortest, b  # ragged: one pass padded to b
    torch.manual_seed(features * 1000 + classes)
    if hidden is None:
        module = logreg(input_dim=features, num_classes=classes)
    else:
        module = mlp(input_dim=features, num_classes=classes, hidden=hidden)
    rows = _module_rows(module, torch.float32)
    params, x, y = _stack(module, m, b, features, classes, seed=m * 100 + b)
    mask = torch.arange(b) < torch.tensor(counts).unsqueeze(1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        losses, grads = rows.loss_and_grad(params, x, y, mask)
        for i, c in enumerate(counts):
            loss, grad = rows.loss_and_grad(params[i : i + 1], x[i : i + 1, :c], y[i : i + 1, :c])
            assert torch.equal(grad[0], grads[i]), f"row {i} of {counts}"
            assert torch.equal(loss[0], losses[i]), f"row {i} of {counts}"
    finally:
        torch.set_num_threads(before)


def test_the_benchmark_ragged_batches_share_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """MNIST-1D split over 1024 peers gives batches of 7 and 8 examples (31 and 32 at 256):
    one padded pass, no rows gathered into groups by size, with the groups' bits."""

    def no_groups(*_: object) -> None:
        raise AssertionError("rows were grouped by batch size")

    for hidden, b in [(None, 8), (64, 8), (None, 32), (64, 32)]:
        torch.manual_seed(0)
        if hidden is None:
            module = logreg(input_dim=40, num_classes=10)
        else:
            module = mlp(input_dim=40, num_classes=10, hidden=hidden)
        rows = _module_rows(module, torch.float32)
        params, x, y = _stack(module, 6, b, 40, 10, seed=b)
        counts = torch.tensor([b, b - 1, b, b - 1, b - 1, b])
        mask = torch.arange(b) < counts.unsqueeze(1)
        expected = rows._ragged(params, x, y, mask)  # each size on its own
        rows.loss_and_grad(params, x, y, mask)  # checks the padding once on this CPU
        if not blas._padding_kernels() or not all(rows._padding.values()):
            pytest.skip("this CPU's kernels round padded rows otherwise: batches go by size")
        monkeypatch.setattr(rows, "_ragged", no_groups)
        got = rows.loss_and_grad(params, x, y, mask)
        monkeypatch.undo()
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_padding_that_changes_a_row_s_bits_falls_back_to_batches_by_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU whose kernels round a padded row otherwise (here: a padded pass that is one
    ulp off) gets its batches computed by size, with the bits of each row alone."""
    monkeypatch.setattr(rows_module, "_padding_kernels", lambda: True)  # padding is tried
    torch.manual_seed(0)
    module = mlp(input_dim=40, num_classes=10, hidden=64)
    rows = _module_rows(module, torch.float32)
    params, x, y = _stack(module, 4, 8, 40, 10, seed=3)
    counts = torch.tensor([8, 7, 8, 7])
    mask = torch.arange(8) < counts.unsqueeze(1)
    expected = rows._ragged(params, x, y, mask)
    backprop = rows._backprop

    def off_by_an_ulp(*args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        loss, grad = backprop(*args, **kwargs)  # type: ignore[arg-type]
        if len(args) > 3:  # the padded pass (its counts)
            grad = torch.nextafter(grad, torch.full_like(grad, math.inf))
        return loss, grad

    monkeypatch.setattr(rows, "_backprop", off_by_an_ulp)
    for _ in range(2):  # the verdict is kept
        got = rows.loss_and_grad(params, x, y, mask)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert rows._padding == {(7, 8, torch.get_num_threads()): False}


class _Library:
    """A stand-in for torch's CPU library: MKL's AUTO branch is ``branch`` (``None``: an
    MKL without the function)."""

    def __init__(self, branch: int | None) -> None:
        if branch is not None:
            self.mkl_serv_cbwr_get_auto_branch = lambda: branch


@pytest.mark.parametrize(
    ("branch", "pads"),
    [(8, False), (10, True), (12, True), (14, True), (None, False)],
    ids=["SSE4_2", "AVX2", "AVX512", "AVX512_E1", "unknown"],
)
def test_padding_is_used_on_mkl_avx2_kernels_or_later_only(
    branch: int | None, pads: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MKL's SSE4.2 kernels add a padded product's last examples by the operands'
    alignment (a row at one offset of the stacked rows kept its bits, the same row at
    another did not), so below AVX2, or where MKL cannot say its kernels, rows of
    different batch sizes are grouped by size; ``tests/gradients/test_rows.py`` at
    ``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` (CI's lower-level run) holds the rows' bits."""
    monkeypatch.setattr(blas, "_torch_cpu_library", lambda: _Library(branch))
    monkeypatch.setattr(blas, "_padding_kernels_checked", None)
    assert blas._padding_kernels() is pads
    torch.manual_seed(0)
    module = mlp(input_dim=40, num_classes=10, hidden=64)
    rows = _module_rows(module, torch.float32)
    assert rows._pads_exactly(7, 8) is pads
    monkeypatch.setattr(blas, "_torch_cpu_library", lambda: None)  # torch without MKL
    monkeypatch.setattr(blas, "_padding_kernels_checked", None)
    assert blas._padding_kernels() and rows._pads_exactly(7, 8)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 5),
    length=st.integers(2, 70),
    extra=st.integers(0, 70),
    width=st.integers(1, 20),
)
def test_sums_over_examples_ignore_zero_padding(
    m: int, length: int, extra: int, width: int
) -> None:
    """The pairwise sum over a row's examples is the same bits with zeros appended (where
    ``torch.sum`` splits the sum by its length)."""
    gen = torch.Generator().manual_seed(length * 100 + extra)
    t = torch.randn(m, length, width, generator=gen)
    padded = torch.cat([t, torch.zeros(m, extra, width)], dim=1)
    assert torch.equal(_sum_examples(t), _sum_examples(padded))
    assert torch.equal(_sum_examples(t[..., 0]), _sum_examples(padded[..., 0]))
    torch.testing.assert_close(_sum_examples(t), t.sum(dim=1), rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(["logreg", "mlp", "mlp-odd"]),
    b=st.integers(1, 40),
    m=st.integers(1, 6),
    ragged=st.booleans(),
    data=st.data(),
)
def test_the_written_out_backward_is_autograd_gradient(
    model: str, b: int, m: int, ragged: bool, data: st.DataObject
) -> None:
    """The hand-written forward and backward compute the model's loss and gradient: each
    row within float32 rounding of autograd's (torch.func.grad of the module's own mean
    cross-entropy on the row's own examples), ragged batches included."""
    torch.manual_seed(b)
    if model == "logreg":
        module = logreg(input_dim=INPUT, num_classes=CLASSES)
    else:
        module = mlp(input_dim=INPUT, num_classes=CLASSES, hidden=64 if model == "mlp" else 37)
    rows = _module_rows(module, torch.float32)
    params, x, y = _stack(module, m, b, INPUT, CLASSES, seed=m * 100 + b)
    counts = [b] * m
    mask = None
    if ragged and b > 1:
        counts = data.draw(st.lists(st.integers(1, b), min_size=m, max_size=m))
        mask = torch.arange(b) < torch.tensor(counts).unsqueeze(1)
    losses, grads = rows.loss_and_grad(params, x, y, mask)
    named = list(module.named_parameters())

    def loss(flat: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        parts = torch.split(flat, [p.numel() for _, p in named])
        shaped = {n: t.view(p.shape) for (n, p), t in zip(named, parts, strict=True)}
        logits = torch.func.functional_call(module, shaped, (xs,))
        return torch.nn.functional.cross_entropy(logits, ys)

    for i, c in enumerate(counts):
        ref, value = torch.func.grad_and_value(loss)(params[i], x[i, :c], y[i, :c])
        torch.testing.assert_close(grads[i], ref, rtol=1e-5, atol=1e-6)
        assert float(losses[i]) == pytest.approx(float(value), rel=1e-6)


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn1d"])
def test_every_mode_agrees_with_the_module_own_gradient(name: str) -> None:
    """The row path is the model's gradient: within float32 rounding of autograd through
    the module (the reference every mode is checked against when a run starts)."""
    objective = _objective(name)
    params, x, y = _rows(objective, 4, 7, seed=5)
    for i in range(4):
        loss, grad = objective.loss_and_grad(params[i], x[i], y[i])
        ref_loss, ref = objective.module_loss_and_grad(params[i], x[i], y[i])
        torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-6)
        assert loss == pytest.approx(ref_loss, rel=1e-6)


def test_cnn1d_is_mapped_by_vmap_within_rounding() -> None:
    """vmap runs a convolution of M rows as one grouped convolution: not batch-invariant,
    the documented exception; rows agree to float32 rounding."""
    objective = _objective("cnn1d")
    assert objective.rows.mode == "vmap"
    params, x, y = _rows(objective, 9, 4, seed=7)
    _, grads = objective.rows.loss_and_grad(params, x, y)
    _, grad = objective.loss_and_grad(params[4], x[4], y[4])
    torch.testing.assert_close(grad, grads[4], rtol=1e-5, atol=1e-7)


def test_module_mode_is_the_module_row_by_row() -> None:
    """A model vmap cannot map: the module's own gradient, row by row, identical bits."""
    objective = _objective("cnn1d")
    rows = RowGradient(
        objective.module, torch.float32, objective.module_loss_and_grad, mode="module"
    )
    params, x, y = _rows(objective, 3, 4, seed=9)
    _, grads = rows.loss_and_grad(params, x, y)
    for i in range(3):
        with one_thread():
            _, grad = objective.module_loss_and_grad(params[i], x[i], y[i])
        assert torch.equal(grad, grads[i])


def test_the_probe_leaves_the_initial_parameters_alone() -> None:
    """Deciding the mode loads other parameters into the module; the objective's initial
    parameters are still the model's own."""
    torch.manual_seed(1)
    module = mlp(input_dim=INPUT, num_classes=CLASSES)
    own = torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])
    gen = torch.Generator().manual_seed(2)
    sample = (torch.randn(6, INPUT, generator=gen), torch.randint(0, CLASSES, (6,), generator=gen))
    assert torch.equal(Objective(module, sample=sample).initial_params(), own)


def test_one_thread_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
