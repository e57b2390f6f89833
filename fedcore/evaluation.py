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

**The average of the rows** (the average model, and the centre of the consensus distance)
is taken from integer sums (:func:`column_sums`): every value is split into integer limbs
whose sums no order of addition changes, so the average is the same bits whichever rows
are added first, by one process or by ranks that each add their own rows and add the
ranks' sums (:func:`mean_of_sums`), and on any number of threads. The limbs cover the bits
the rows hold (:func:`sum_window`: from the lowest bit of any value to the highest, at
most :data:`SUM_WINDOW_BITS`), not the format's whole range (288 bits for float32, 2,144
for float64, which took 15 GB for a 6.6-million-parameter model in float64): the sum is
exact unless the values span more than that, and then the bits below the window are
dropped from every value alike, the same whatever the order.

**A sample of the peers** (``run.eval_peers``): :func:`eval_sample` picks ``k`` of them
by keyed hashes of the run's seed and each peer's place in node order, the same ``k``
peers at every evaluation, on every engine and whichever rank holds them.
"""

from __future__ import annotations

import math

import torch

from fedcore.counter_random import hash64_tensor, make_key
from fedcore.gradients import RowGradient

__all__ = [
    "CHUNK_BYTES",
    "EVAL_INPUT_BYTES",
    "SUM_COLUMNS",
    "VMAP_CHUNK_VALUES",
    "chunk_rows",
    "column_sums",
    "eval_sample",
    "exact_mean",
    "example_chunk",
    "hits",
    "mean_of_sums",
    "row_accuracy",
    "row_figures",
    "stacked_figures",
    "sum_extremes",
    "sum_window",
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
    distance ``(1/M) sum_i ||p_i - mean||_2`` (float64, the mean :func:`exact_mean`; NaN
    when not asked), in one pass over ``params`` after the mean (see the module
    docstring). Modes ``batched`` and ``vmap`` (the module mode evaluates one model at a
    time, elsewhere)."""
    mean = exact_mean(params) if distance else None
    acc, norms = row_figures(rows, params, x, y, mean=mean, chunk_bytes=chunk_bytes)
    return acc, float(norms.mean()) if distance else float("nan")


@torch.no_grad()
def row_figures(
    rows: RowGradient,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    mean: torch.Tensor | None,
    accuracy: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's test accuracy ``[M]`` (float64; empty without ``accuracy``) and, given
    the rows' ``mean`` (float64 ``[d]``), each row's distance to it ``||p_i - mean||_2``
    ``[M]`` (float64; empty without), in one pass over ``params`` in chunks (see the
    module docstring): every row's figures are its own, whichever chunk holds it. The
    accuracy: modes ``batched`` and ``vmap``; the distances alone: any mode."""
    total = params.shape[0]
    acc = torch.empty(total if accuracy else 0, dtype=torch.float64, device=params.device)
    norms = torch.empty(total if mean is not None else 0, dtype=torch.float64, device=params.device)
    examples = len(y)
    batched = rows.mode == "batched" and rows._layers is not None
    if not accuracy:
        step = chunk_rows(params.shape[1], 1, 8, chunk_bytes=chunk_bytes)
    else:
        step = chunk_rows(examples, _widest(rows), params.element_size(), chunk_bytes=chunk_bytes)
    part = examples  # examples a pass: all of them, but for a deep model's many
    if accuracy and not batched:
        step = 1  # one row first, to learn the number of classes
        example_bytes = x[:1].numel() * max(params.element_size(), x.element_size())
        part = example_chunk(examples, example_bytes)
    start = 0
    while start < total:
        chunk = params[start : start + step]
        end = start + chunk.shape[0]
        if accuracy and batched:
            correct = hits(_batched_logits(rows, chunk, x), y)
        elif accuracy:
            correct = torch.zeros(chunk.shape[0], dtype=torch.int64, device=params.device)
            for first in range(0, examples, part):
                logits = rows.logits(chunk, x[first : first + part])
                correct += hits(logits, y[first : first + part])
        if accuracy:
            acc[start:end] = correct.to(torch.float64) / examples
        if mean is not None:
            norms[start:end] = (chunk.to(torch.float64) - mean).norm(dim=1)
        start = end
        if accuracy and not batched:
            step = max(1, VMAP_CHUNK_VALUES // max(1, part * int(logits.shape[-1])))
            step = min(step, max(1, EVAL_INPUT_BYTES // (part * example_bytes)))
    return acc, norms


# --- exact sums of the rows: the average model, whatever adds them ---------------------------

_LIMB = 32
_Form = tuple[torch.dtype, int, int]
_FORMS: dict[torch.dtype, _Form] = {  # (integer view, mantissa bits, exponent mask)
    torch.float32: (torch.int32, 23, 0xFF),
    torch.float64: (torch.int64, 52, 0x7FF),
}
"""A finite float is ``m * 2**(p - lowest)`` with ``m`` its mantissa (hidden bit included)
and ``0 <= p < 2**exponent_bits - 2`` its place."""

SUM_COLUMNS = 3
"""Counts of NaN, +inf and -inf beside a column's limbs in :func:`column_sums`."""

SUM_WINDOW_BITS = 160
"""The most bits the limbs of :func:`column_sums` cover in a column, from the highest bit
any of its values holds down (and to a limb boundary below that): bits more than
``2**-160`` below the column's largest value are dropped, from every value alike, and only
where a column's values span more than that; far below float64's 53 bits of a mean."""

_SUM_CHUNK_VALUES = 1 << 20
"""Values of the rows a pass of :func:`column_sums` takes (its int64 temporaries: a few
MiB each)."""

_EMPTY = -(1 << 62)


def _sum_form(dtype: torch.dtype) -> _Form:
    """How :func:`column_sums` reads ``dtype`` (float16 and bfloat16 as float32)."""
    return _FORMS[torch.float64 if dtype == torch.float64 else torch.float32]


def _words(params: torch.Tensor) -> tuple[torch.Tensor, _Form]:
    form = _sum_form(params.dtype)
    if params.dtype not in (torch.float32, torch.float64):
        params = params.to(torch.float32)  # exact
    return params.contiguous().view(form[0]), form


@torch.no_grad()
def sum_extremes(params: torch.Tensor) -> torch.Tensor:
    """``[d, 2]`` int64: each column's ``-lowest place`` and ``highest bit`` of its finite
    nonzero values (both very negative where there is none), so that a maximum over
    ranks (``all_reduce(MAX)``) gives every rank's. :func:`sum_window` makes the window
    of each column from them."""
    words, (_, bits, top) = _words(params)
    magnitude = (1 << (bits + top.bit_length())) - 1  # every bit but the sign
    m, d = words.shape
    out = torch.full((d, 2), _EMPTY, dtype=torch.int64, device=params.device)
    step = max(1, _SUM_CHUNK_VALUES // max(1, d))
    for start in range(0, m, step):
        word = words[start : start + step].to(torch.int64)
        exponent = (word >> bits) & top
        held = (exponent != top) & ((word & magnitude) != 0)
        place = exponent.clamp(min=1) - 1
        lowest = torch.where(held, -place, _EMPTY).amax(dim=0)
        highest = torch.where(held, place + bits + 1, _EMPTY).amax(dim=0)
        out = torch.maximum(out, torch.stack([lowest, highest], dim=1))
    return out


def sum_window(extremes: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """``(low, limbs)`` of :func:`column_sums` for rows of ``dtype`` whose
    :func:`sum_extremes` are ``extremes``: each column's place of limb 0's lowest bit
    (``[d]`` int64), and the number of 32-bit limbs (with room for the carries of up to
    ``2**31`` rows)."""
    bits = _sum_form(dtype)[1]
    lowest, highest = -extremes[:, 0], extremes[:, 1]
    held = highest != _EMPTY  # a column of zeros: any window holds it
    # On a limb boundary of the format's whole range (a multiple of 32 places): the limbs
    # are then those of an accumulator of every place, and so is the float64 they add to.
    low = torch.where(held, torch.maximum(lowest, highest - SUM_WINDOW_BITS), 0)
    low = torch.div(low, _LIMB, rounding_mode="floor") * _LIMB
    span = torch.where(held, highest - bits - 1 - low, 0)
    return low, (int(span.max()) >> 5) + 4 if span.numel() else 4


@torch.no_grad()
def _add_limbs(
    out: torch.Tensor,
    base: torch.Tensor,
    word: torch.Tensor,
    form: _Form,
    low: torch.Tensor,
    limbs: int,
) -> None:
    """Add the values whose bits are ``word`` (``[m, c]`` int64; read as ``form`` says,
    :data:`_FORMS`) to their columns' limbs and counts in ``out`` (a column's first entry
    at ``base``; ``low``: each column's place of limb 0's lowest bit, bits below it
    dropped; ``limbs`` a column)."""
    _, bits, top = form
    low_mask = (1 << _LIMB) - 1
    negative = word < 0
    exponent = (word >> bits) & top
    fraction = word & ((1 << bits) - 1)
    finite = exponent != top
    mantissa = torch.where(exponent > 0, fraction | (1 << bits), fraction)
    mantissa = torch.where(finite, mantissa, 0)
    # A NaN or an infinity (mantissa 0 here; counted below) adds nothing at place 0.
    place = torch.where(finite, exponent.clamp(min=1) - 1 - low, 0)
    mantissa = mantissa >> (-place).clamp(min=0, max=63)  # below the window: dropped
    place = place.clamp(min=0)
    at = base + (place >> 5)
    shift = place & (_LIMB - 1)
    for piece in range(0, bits + 1, _LIMB):  # float64's 53 bits in two pieces
        part = ((mantissa >> piece) & low_mask) << shift  # < 2**63
        for extra, value in ((0, part & low_mask), (1, part >> _LIMB)):
            signed = torch.where(negative, -value, value)
            out.index_add_(0, (at + piece // _LIMB + extra).flatten(), signed.flatten())
    nan = ~finite & (fraction != 0)
    inf = ~finite & (fraction == 0)
    for k, flag in enumerate((nan, inf & ~negative, inf & negative)):
        out.index_add_(0, base + limbs + k, flag.sum(dim=0))


@torch.no_grad()
def column_sums(
    params: torch.Tensor, window: tuple[torch.Tensor, int] | None = None
) -> torch.Tensor:
    """The sum of each column of ``params`` (``[M, d]``, floating) as integers:
    ``[d, L + 3]`` int64, ``L`` 32-bit limbs (the sum in units of ``2**(low - lowest)``,
    ``low`` the column's in ``window``; limb ``l`` worth ``2**(32 l)``; any limb may hold
    more than 32 bits until :func:`mean_of_sums` carries them) and the counts of NaN,
    +inf and -inf.

    ``window``: :func:`sum_window`'s ``(low, L)``, the same for every part whose sums are
    added (ranks: of their :func:`sum_extremes`' maximum); by default ``params``' own.
    Integer sums are associative: the sums of two sets of rows added together are the
    sums of their union, exactly, in any order (an all-reduce of ranks' sums included).
    Good for up to ``2**31`` rows."""
    if window is None:
        window = sum_window(sum_extremes(params), params.dtype)
    words, form = _words(params)
    m, d = words.shape
    low, limbs = window
    width = limbs + SUM_COLUMNS
    out = torch.zeros(d * width, dtype=torch.int64, device=params.device)
    cols = min(d, _SUM_CHUNK_VALUES)  # a block of rows and columns a pass
    step = max(1, _SUM_CHUNK_VALUES // max(1, cols))
    for first in range(0, d, cols):
        base = torch.arange(first, min(d, first + cols), device=params.device) * width
        for start in range(0, m, step):
            block = words[start : start + step, first : first + cols]
            cut = low[first : first + cols]
            _add_limbs(out, base, block.to(torch.int64), form, cut, limbs)
    return out.view(d, width)


def _carry(limbs: torch.Tensor) -> None:
    """Bring every limb but the top one into ``[0, 2**32)`` (in place), the value kept."""
    for k in range(limbs.shape[1] - 1):
        carry = limbs[:, k] >> _LIMB  # floor
        limbs[:, k] -= carry << _LIMB
        limbs[:, k + 1] += carry


@torch.no_grad()
def mean_of_sums(
    sums: torch.Tensor, count: int, dtype: torch.dtype, low: torch.Tensor
) -> torch.Tensor:
    """The mean of ``count`` rows (float64, ``[d]``) from their :func:`column_sums` (of
    rows of ``dtype``, each column's limb 0 at its place in ``low``: :func:`sum_window`'s):
    the sum's
    magnitude, its limbs carried into ``[0, 2**32)``, added in float64 from the largest
    limb, its sign, divided by ``count``. A column with a NaN, or with both infinities,
    is NaN; one with an infinity of one sign is that infinity."""
    _, bits, top = _sum_form(dtype)
    limbs = sums.shape[1] - SUM_COLUMNS
    value = sums[:, :limbs].clone()
    _carry(value)
    negative = value[:, -1] < 0  # the top limb carries the sign of the whole
    value = torch.where(negative.unsqueeze(1), -value, value)
    _carry(value)
    lowest = (top >> 1) + bits - 1  # the smallest subnormal is 2**-lowest
    total = torch.zeros(sums.shape[0], dtype=torch.float64, device=sums.device)
    for k in range(limbs - 1, -1, -1):
        power = _LIMB * k + low - lowest  # 2**power in two factors, each within range
        half = torch.div(power, 2, rounding_mode="floor")
        total += torch.ldexp(torch.ldexp(value[:, k].to(torch.float64), half), power - half)
    mean = torch.where(negative, -total, total) / count
    nan, up, down = sums[:, limbs], sums[:, limbs + 1], sums[:, limbs + 2]
    mean = torch.where(up > 0, math.inf, mean)
    mean = torch.where(down > 0, -math.inf, mean)
    return torch.where((nan > 0) | ((up > 0) & (down > 0)), math.nan, mean)


def exact_mean(params: torch.Tensor) -> torch.Tensor:
    """The mean of the rows of ``params`` (float64, ``[d]``) from exact sums: the same
    bits in any order of the rows (:func:`column_sums`, :func:`mean_of_sums`).

    Most columns take a shortcut to the same bits: a column whose values (of ``M`` rows,
    float32 or narrower) lie within ``2**(29 - ceil(log2 M))`` of each other in magnitude
    sums exactly in float64 in any order (every partial sum fits float64's 53 bits), so
    its float64 sum is its exact sum, as are its limbs'; a NaN or an infinity gives what
    :func:`mean_of_sums` gives too. The other columns (and every float64 column) go
    through the limbs, a block of columns at a time (memory: a few int64 a column)."""
    m, d = params.shape
    mean = params.to(torch.float64).sum(dim=0) / max(1, m)
    if params.dtype == torch.float64 or m == 0:
        slow = torch.arange(d, device=params.device)
    else:
        rows = params.to(torch.float32).abs()
        largest = rows.amax(dim=0)
        smallest = torch.where(rows > 0, rows, math.inf).amin(dim=0)
        spread = torch.frexp(largest).exponent - torch.frexp(smallest).exponent
        slow = torch.nonzero(
            torch.isfinite(largest) & (smallest < math.inf) & (spread > 29 - _log2_ceil(m))
        ).flatten()
    cols = max(1, _SUM_CHUNK_VALUES // 16)
    for first in range(0, slow.numel(), cols):
        which = slow[first : first + cols]
        block = params.index_select(1, which)
        low, limbs = sum_window(sum_extremes(block), params.dtype)
        sums = column_sums(block, (low, limbs))
        mean[which] = mean_of_sums(sums, m, params.dtype, low)
    return mean


def _log2_ceil(m: int) -> int:
    return max(0, (m - 1).bit_length())


def eval_sample(seed: int, population: int, k: int) -> torch.Tensor:
    """``k`` of ``population`` peers (their places in node order, sorted, int64): those whose
    keyed hash of ``(seed, place)`` is smallest, so a pure function of the run's seed
    (whichever rank holds a peer) and the same peers at every evaluation; a sample of
    ``k`` holds the sample of ``k - 1``."""
    cpu = torch.device("cpu")
    places = torch.arange(population, device=cpu)
    words = hash64_tensor(make_key("fedcore.eval_peers", seed), places)
    keys = words ^ torch.tensor(-(1 << 63), dtype=torch.int64, device=cpu)  # unsigned order
    picked = torch.topk(keys, k, largest=False, sorted=False).indices
    return picked.sort().values
