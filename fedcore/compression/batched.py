"""Codecs applied to many rows at once, bit-identical to the per-message codecs.

The vectorized simulation engine holds every node's parameters as one ``[N, d]`` tensor,
so the tensors its messages carry come as rows of one matrix. A :class:`RowCodec` applies
a codec to all of them at once: ``roundtrip(x, owners)[r]`` is exactly
``codec.decode(codec.encode(x[r]))`` with node ``owners[r]``'s own codec (the one
:func:`~fedcore.compression.make_codec` builds with that node's seed), bit for bit, and
:meth:`RowCodec.nbytes` is exactly that message's ``EncodedTensor.nbytes``. The engine can
then swap the message engine for matrix arithmetic without changing a single number or a
single byte counted.

How each codec is done:

=========  ==========================================================================
raw        a copy (dtype kept)
fp32/16,   the same casts, batched. float64 goes to float16/bfloat16 *through float32*:
bf16       that double rounding is what the CPU cast inside the codec does
sign       batched: per-row (or per-chunk) L1 norms, the codec's float32/float64 roundings
qsgd       batched arithmetic; the uniforms come from the owners' CPU generators, one
           ``torch.rand`` per owner for all its rows (the per-row draws concatenated)
topk       one ``torch.topk`` along the rows; rows of ``n >= 4 * 65536`` values use
           :func:`~fedcore.compression.topk_indices` row by row, as the codec does
randk      a loop over rows for the seeds and indices (each row's indices come from a
           seed drawn from its owner's generator); gather and scatter batched
fp8,       a loop over rows: the codec's own ``decode(encode(row))`` on the CPU (they
s2fp8,     are deterministic, so no owner matters); exact by construction
float+aps
float      all rows at once on the CPU, through the codec's own rounding and decoding
           (every value rounds on its own)
=========  ==========================================================================

Exactness. Element-wise steps are written as separate float32 operations with tensor
operands on ``x.device`` (never a division by a Python number, which CUDA turns into a
multiplication by the reciprocal), so they round alike on every device. Reductions (sign
scales, qsgd norms) are the codec's own torch calls on a 2-D view: on the CPU a row of a
matrix is reduced in the same order as the codec's 1-D tensor while the row is shorter
than torch's parallel grain (32768 values); longer rows are reduced one by one with the
codec's 1-D call, whose order then depends on the thread count, so they match too. On an
accelerator the reductions follow that device's order and may differ from the CPU codec
in the last bit of a norm or scale; everything else stays identical. Top-k with tied
magnitudes keeps whichever tied values ``torch.topk`` picks: on the CPU the row-wise and
the codec's 1-D selections agreed in every check (one per-row kernel), but torch does not
promise it, and on an accelerator they may differ (the values kept are equal).

Stochastic codecs (``qsgd``, ``randk``) keep one ``torch.Generator`` per node, seeded as
``make_codec(..., seed=seeds[i])`` seeds its own, and rows draw from their owner's
generator in row order: the caller lists rows in the order the message engine encodes
them, and each node's draw sequence is the per-node codec's. Those draws happen on the CPU
(the generators are CPU generators) and move to ``x.device``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from fedcore.compression.codecs import (
    CastCodec,
    QSGDCodec,
    RandKCodec,
    SignCodec,
    TopKCodec,
    _keep,
    topk_indices,
)
from fedcore.compression.floats import (
    CustomFloatCodec,
    FP8Codec,
    S2FP8Codec,
    _codes,
    _pack_bits,
    _values,
)
from fedcore.compression.registry import CODEC_NAMES
from fedcore.errors import CompressionError

_CPU = torch.device("cpu")
"""Per-message codecs and per-node generators work on the host."""

__all__ = ["RowCodec", "make_row_codec"]

_FLOATS = (torch.float32, torch.float64)
_TINY = torch.finfo(torch.float32).tiny
_GRAIN = 32768  # at::internal::GRAIN_SIZE: shorter CPU reductions run serially
_TOPK_ROWWISE = 4 * (1 << 16)  # from this size topk_indices samples a threshold


def _const(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-dim operand on the device: ops with it round as on the CPU (no reciprocal)."""
    return torch.tensor(value, dtype=dtype, device=device)


def _reduce(
    values: torch.Tensor, length: int, op: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``op`` (a reduction over the last dim) of ``values``, in the codec's order.

    ``values[r]`` has the shape of the codec's own operand. A CPU reduction shorter than
    torch's grain is serial either way; a longer one over a lone 1-D tensor is split among
    threads, so those rows are reduced one at a time, each exactly as the codec does.
    """
    if values.device.type == "cpu" and length >= _GRAIN:
        return torch.stack([op(row) for row in values])
    return op(values)


def _l1(t: torch.Tensor) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(t, ord=1, dim=-1)
    return norm


def _l2(t: torch.Tensor) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(t, dim=-1)
    return norm


def _mean_abs(t: torch.Tensor) -> torch.Tensor:
    return t.abs().mean(dim=-1)


def _buckets(n: int, size: int, device: torch.device) -> torch.Tensor:
    """The bucket of each of ``n`` values, ``size`` values a bucket (no per-value copies)."""
    return torch.arange(n, device=device) // size


class RowCodec(ABC):
    """One codec applied to the rows of a matrix, each row as one message of its owner.

    Attributes:
        name: The codec's name (one of ``CODEC_NAMES``).
        deterministic: False for codecs that draw random numbers (``qsgd``, ``randk``).
    """

    name: str
    deterministic: bool = True

    def roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """``decode(encode(x[r]))`` with node ``owners[r]``'s codec, for every row ``r``.

        Args:
            x: ``[m, n]`` float32 or float64 rows, on any device.
            owners: ``[m]`` integer node index of each row; stochastic codecs draw for the
                rows in this order, each from its owner's generator.

        Returns:
            A new ``[m, n]`` tensor of ``x``'s dtype on ``x``'s device.

        Raises:
            CompressionError: a bad shape or dtype, an owner without a seed, or values the
                codec refuses (a non-finite norm or scale).
        """
        if x.dim() != 2:
            raise CompressionError(f"codec {self.name!r}: rows must be [m, n], got {x.shape}.")
        if x.dtype not in _FLOATS:
            raise CompressionError(
                f"codec {self.name!r} encodes float32 or float64, not {x.dtype}."
            )
        if owners.shape != (x.shape[0],) or owners.is_floating_point():
            raise CompressionError(
                f"codec {self.name!r}: owners must be {x.shape[0]} integer node indices, "
                f"got a {owners.dtype} tensor of shape {tuple(owners.shape)}."
            )
        if x.shape[0] == 0:
            return x.detach().clone()
        return self._roundtrip(x.detach(), owners)

    @abstractmethod
    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """The codec's work on checked rows."""

    @abstractmethod
    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """Bytes one encoded tensor of ``n`` values (of ``dtype``) puts on the wire.

        Exactly the per-message ``EncodedTensor.nbytes``: the payload plus 8 bytes per
        header scalar. Only ``raw`` depends on ``dtype``.
        """


class _RawRows(RowCodec):
    """``raw``: lossless, the dtype kept."""

    name = "raw"

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        return n * torch.empty(0, dtype=dtype, device=_CPU).element_size()


class _CastRows(RowCodec):
    """``fp32``, ``fp16``, ``bf16``: the casts, through float32 as the CPU codec rounds."""

    _WIRE: ClassVar[dict[str, torch.dtype]] = {
        "fp32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
    }

    def __init__(self, name: str) -> None:
        self.name = name
        self._codec = CastCodec(name)

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        # The CPU converts float64 to half types through float32 (a double rounding); an
        # explicit float32 step reproduces that on devices that round float64 directly.
        wire = x.to(torch.float32).to(self._WIRE[self.name])
        return wire.to(x.dtype, copy=True)

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        return self._codec.wire_bytes(n)


class _SignRows(RowCodec):
    """``sign``: ``±scale`` with the mean magnitude of the row (or of each chunk)."""

    name = "sign"

    def __init__(self, chunk: int) -> None:
        self._codec = SignCodec(chunk)  # validates chunk
        self.chunk = chunk

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        m, n = x.shape
        if n == 0:
            return x.clone()
        dev = x.device
        xf = x.to(torch.float32).contiguous()
        unit = (xf >= 0).to(torch.float32)  # zero counts as positive
        if self.chunk == 0:
            # Codec: float(l1_norm_float32) / n in Python (float64), a float64 parameter;
            # decode multiplies the 0/1 values by 2 * scale and subtracts scale, both
            # rounded to float32 by the in-place float32 ops.
            scale = _reduce(xf, n, _l1).to(torch.float64) / _const(n, torch.float64, dev)
            self._check(scale)
            two = (scale * 2).to(torch.float32)
            out = unit.mul_(two[:, None]).sub_(scale.to(torch.float32)[:, None])
            return out.to(x.dtype)
        chunk = self.chunk
        cut = n - n % chunk
        full = cut // chunk
        scales = _reduce(xf[:, :cut].view(m, full, chunk), chunk, _l1)
        scales = scales / _const(chunk, torch.float32, dev)
        if cut < n:  # the short last chunk: the mean of its magnitudes
            tail = _reduce(xf[:, cut:], n - cut, _mean_abs)
            scales = torch.cat([scales, tail[:, None]], dim=1)
        self._check(scales)
        per_value = scales.index_select(1, _buckets(n, chunk, dev))
        return unit.mul_(2).sub_(1).mul_(per_value).to(x.dtype)

    @staticmethod
    def _check(scales: torch.Tensor) -> None:
        # The codec's decode refuses a non-finite scale (one scalar sync).
        if not bool(torch.isfinite(scales).all()):
            raise CompressionError("codec 'sign': a scale is not finite.")

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        return self._codec.wire_bytes(n) + 8  # one parameter: scale, or chunk


class _StochasticRows(RowCodec):
    """A codec drawing from one CPU generator per node, seeded as ``make_codec`` does.

    Attributes:
        seeds: Node ``i``'s codec seed.
        generators: Node ``i``'s generator (its state is its position in the sequence).
    """

    deterministic = False

    def __init__(self, seeds: Sequence[int]) -> None:
        self.seeds = tuple(int(s) for s in seeds)
        self.generators = [torch.Generator().manual_seed(s) for s in self.seeds]

    def _owner_generators(self, owners: torch.Tensor) -> list[torch.Generator]:
        """The generator of each row's owner, in row order."""
        ids: list[int] = owners.tolist()
        bad = [i for i in ids if not 0 <= i < len(self.generators)]
        if bad:
            raise CompressionError(
                f"codec {self.name!r}: no seed for node {bad[0]} "
                f"({len(self.generators)} seeds given)."
            )
        return [self.generators[i] for i in ids]

    def _uniforms(self, owners: torch.Tensor, n: int) -> torch.Tensor:
        """``[m, n]`` float32 uniforms on the CPU: row ``r`` gets its owner's next ``rand(n)``.

        One draw per owner for all of its rows, in row order. That is the per-row draws
        exactly: torch's CPU ``uniform_`` takes one 32-bit word per float32 value, in
        order, so ``rand(c * n)`` is ``c`` successive ``rand(n)`` (the tests hold this
        against the codec's per-row calls). Owners are independent generators, so the
        order between owners does not matter.
        """
        self._owner_generators(owners)  # validates
        own = owners.cpu()
        perm = torch.argsort(own, stable=True)  # each owner's rows, in row order
        nodes, counts = torch.unique_consecutive(own[perm], return_counts=True)
        drawn = torch.empty(len(own), n, dtype=torch.float32, device=_CPU)  # rows sorted by owner
        start = 0
        for node, count in zip(nodes.tolist(), counts.tolist(), strict=True):
            block = drawn[start : start + count].view(-1)
            torch.rand(count * n, generator=self.generators[node], out=block, device=_CPU)
            start += count
        u = torch.empty_like(drawn)
        u[perm] = drawn
        return u


class _QSGDRows(_StochasticRows):
    """``qsgd``: stochastic rounding to ``2**(bits-1) - 1`` levels a side of the norm(s)."""

    name = "qsgd"

    def __init__(self, bits: int, chunk: int, scaled: bool, seeds: Sequence[int]) -> None:
        super().__init__(seeds)
        self._codec = QSGDCodec(bits, chunk=chunk, scaled=scaled)  # validates the options
        self.bits, self.chunk, self.scaled = bits, chunk, scaled

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        m, n = x.shape
        dev = x.device
        s = 2 ** (self.bits - 1) - 1
        xf = x.to(torch.float32).contiguous()
        if self.chunk == 0:
            norms = _reduce(xf, n, _l2)[:, None]  # [m, 1]
            bucket = torch.zeros(n, dtype=torch.int64, device=dev)
        else:
            size = min(self.chunk, max(n, 1))  # the codec's buckets, no giant padding
            count = -(-n // size)
            padded = torch.cat([xf, xf.new_zeros(m, count * size - n)], dim=1)
            norms = _reduce(padded.view(m, count, size), size, _l2)  # [m, count]
            bucket = _buckets(n, size, dev)
        if not bool(torch.isfinite(norms).all()):  # checked before any draw
            raise CompressionError(
                "codec 'qsgd': a norm of the tensor is not finite (values not finite, or so "
                "large that their squares overflow float32)."
            )
        u = self._uniforms(owners, n)  # the codec's draws, each from the row's owner
        per_value = norms.index_select(1, bucket).clamp_(min=_TINY)
        # Codec: u.addcdiv_(x, norm, value=s) computes u + (s * x) / norm in float32.
        levels = torch.mul(xf, _const(s, torch.float32, dev)).div_(per_value)
        levels.add_(u.to(dev)).add_(s).clamp_(0, 2 * s).trunc_()  # the uint8 code
        if self.scaled:
            norms = norms / _const(1 + self._codec.omega(n), torch.float32, dev)
        levels.sub_(s)
        if self.chunk == 0:
            # The norm travels as a float64 parameter; decode multiplies by norm / s.
            scale = norms.to(torch.float64) / _const(s, torch.float64, dev)
            return levels.mul_(scale.to(torch.float32)).to(x.dtype)
        # Float32 norms travel; decode multiplies by each bucket's norm, then divides by s.
        levels.mul_(norms.index_select(1, bucket)).div_(_const(s, torch.float32, dev))
        return levels.to(x.dtype)

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        return self._codec.wire_bytes(n) + 16  # parameters: bits, and norm or chunk


class _TopKRows(RowCodec):
    """``topk``: the ``k`` largest magnitudes of each row, the rest zero.

    With tied magnitudes the kept indices are ``torch.topk``'s along the rows: the
    codec's 1-D choice on the CPU in practice, not by promise, and maybe not elsewhere.
    """

    name = "topk"

    def __init__(self, ratio: float) -> None:
        self._codec = TopKCodec(ratio)  # validates ratio
        self.ratio = ratio

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        xf = x.to(torch.float32).contiguous()
        k = _keep(self.ratio, n)
        if k == 0:
            return x.clone()
        if n >= _TOPK_ROWWISE:  # the codec samples a threshold here: its selection per row
            idx = torch.stack([topk_indices(row, k) for row in xf]).to(x.device)
        else:
            idx = torch.topk(xf.abs(), k, dim=1, sorted=False).indices
        out = torch.zeros_like(xf).scatter_(1, idx, xf.gather(1, idx))
        return out.to(x.dtype)

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        return self._codec.wire_bytes(n) + 8  # parameter: k


class _RandKRows(_StochasticRows):
    """``randk``: ``k`` random values of each row scaled by ``n / k``, the rest zero.

    The seeds and indices are drawn row by row (a Python loop: each row's indices follow
    from a seed its owner's generator draws); the gather and scatter are batched.
    """

    name = "randk"

    def __init__(self, ratio: float, seeds: Sequence[int]) -> None:
        super().__init__(seeds)
        self._codec = RandKCodec(ratio)  # validates ratio
        self.ratio = ratio

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        m, n = x.shape
        gens = self._owner_generators(owners)
        k = _keep(self.ratio, n)
        idx = torch.empty(m, k, dtype=torch.int64, device=_CPU)
        for row, gen in zip(idx, gens, strict=True):
            # The codec draws the seed for every message, even an empty one.
            seed = int(torch.randint(0, 2**53, (1,), generator=gen, device=_CPU))
            if k:
                row.copy_(RandKCodec._indices(seed, n, k))
        if k == 0:
            return x.clone()
        dev = x.device
        idx = idx.to(dev)
        xf = x.to(torch.float32).contiguous()
        values = xf.gather(1, idx).mul_(_const(n / k, torch.float32, dev))
        return torch.zeros_like(xf).scatter_(1, idx, values).to(x.dtype)

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        return self._codec.wire_bytes(n) + 16  # parameters: k, seed


class _LoopRows(RowCodec):
    """A deterministic codec row by row: its own round trip on the CPU, bit for bit."""

    def __init__(self, codec: FP8Codec | CustomFloatCodec | S2FP8Codec) -> None:
        self.name = codec.name
        self._codec = codec

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        rows = x.to(_CPU)
        out = torch.stack([self._codec.decode(self._codec.encode(row)) for row in rows])
        return out.to(x.device)

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        return self._codec.nbytes(n)


class _FloatRows(_LoopRows):
    """``float`` without APS: each value rounds on its own, so all rows go at once, through
    the codec's own rounding, packing and decoding (on the CPU); APS shifts per row, by
    the codec row by row."""

    def __init__(self, codec: CustomFloatCodec) -> None:
        super().__init__(codec)
        self._float = codec

    def _roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        codec = self._float
        if codec.scaling != "none":
            return super()._roundtrip(x, owners)
        e, m = codec.exp_bits, codec.man_bits
        flat = x.to(_CPU).to(torch.float32).contiguous().reshape(-1)
        codes = _codes(flat, e, m, codec.name)
        values = _values(_pack_bits(codes, codec.width), e, m, flat.numel())
        return values.reshape(x.shape).to(x.dtype).to(x.device)


def make_row_codec(
    name: str,
    *,
    bits: int = 8,
    ratio: float = 0.01,
    chunk: int = 0,
    scaled: bool = False,
    format: str = "e4m3",
    exp_bits: int = 4,
    man_bits: int = 3,
    scaling: str = "none",
    layers: Sequence[int] = (),
    seeds: Sequence[int] = (),
) -> RowCodec:
    """The batched codec for ``name`` with ``make_codec``'s options.

    Args:
        name: One of ``CODEC_NAMES``.
        bits, ratio, chunk, scaled, format, exp_bits, man_bits, scaling, layers: As for
            :func:`~fedcore.compression.make_codec`.
        seeds: ``seeds[i]`` is node ``i``'s codec seed (in a run:
            :func:`~fedcore.compression.codec_seed`); used by ``qsgd`` and ``randk`` only.

    Raises:
        CompressionError: an unknown name or an invalid option.
    """
    if name == "raw":
        return _RawRows()
    if name in ("fp32", "fp16", "bf16"):
        return _CastRows(name)
    if name == "sign":
        return _SignRows(chunk)
    if name == "qsgd":
        return _QSGDRows(bits, chunk, scaled, seeds)
    if name == "topk":
        return _TopKRows(ratio)
    if name == "randk":
        return _RandKRows(ratio, seeds)
    if name == "fp8":
        return _LoopRows(FP8Codec(format, chunk=chunk))
    if name == "float":
        return _FloatRows(CustomFloatCodec(exp_bits, man_bits, scaling=scaling, layers=layers))
    if name == "s2fp8":
        return _LoopRows(S2FP8Codec())
    raise CompressionError(
        f"unknown codec {name!r}; use one of {', '.join(CODEC_NAMES)} (compression.codec)."
    )
