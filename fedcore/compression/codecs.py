"""Lossy codecs with real packed encodings: what crosses the wire is what they promise.

Every codec turns a float tensor into an :class:`~fedcore.messages.EncodedTensor` whose
``data`` is the packed payload and whose ``params`` are its few scalars, and back.
``wire_bytes(n)`` states the exact payload size for ``n`` values; a test holds every codec
to it. Decoding checks the header against the bytes and raises
:class:`~fedcore.errors.CompressionError` on any mismatch (wrong length, absurd ``k`` or
bit width, out-of-range levels or indices), never a crash or a silently wrong tensor.

=========  =================================================  ===============================
name       payload                                            error
=========  =================================================  ===============================
fp32       float32 values                                     exact for float32 input
fp16       float16 values                                     relative 2**-11 (normal range)
bf16       bfloat16 values (upper half of float32)            relative 2**-8
qsgd       ``bits`` per value (2, 4 or 8), packed; the norm   unbiased; |err| <= norm / s
           (or a norm per ``chunk``; ``scaled``: shrunk by    (scaled: contractive, biased)
           ``1 + omega``)
sign       1 bit per value, packed; one scale per chunk       biased (scaled sign)
topk       k uint32 indices, then k float32 values            exact on the k largest
randk      k float32 values; indices regenerated from seed    unbiased (values scaled n/k)
=========  =================================================  ===============================

Stochastic codecs (``qsgd``, ``randk``) draw from an explicit ``torch.Generator`` given at
construction, so a seeded run replays exactly; ``randk`` sends the seed of its index draw,
not the indices.

Rows. The arithmetic of each codec is written once, over the rows of an ``[m, n]`` matrix,
each row one message (see :mod:`fedcore.compression.batched`): ``encode`` runs it on its
tensor as one row and packs the result, ``decode`` unpacks into one row and runs the
other half, and ``roundtrip_rows`` runs both halves on many rows with no bytes between.
So the vectorized engine's rows are the messages' values by construction. Those steps
round alike on every device: element-wise steps are float32 operations with tensor
operands (never a division by a Python number, which CUDA turns into a multiplication by
the reciprocal), and reductions (sign scales, qsgd norms) go through
:func:`~fedcore.gradients.row_reduce`. The stochastic codecs draw on the CPU, row ``r``
from ``generators[r]``.

This module holds the casts, ``qsgd`` and ``sign``; ``topk`` and ``randk`` are in
:mod:`fedcore.compression.sparse`, and the header checks and row helpers every codec
shares in :mod:`fedcore.compression.wire`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import torch

from fedcore.compression.wire import (
    _CPU,
    _const,
    _dtype_name,
    _expect,
    _flat,
    _int_param,
    _numel,
    _param,
    _restore,
    _rows,
)
from fedcore.errors import CompressionError
from fedcore.gradients import row_reduce
from fedcore.messages import EncodedTensor

__all__ = ["CastCodec", "QSGDCodec", "SignCodec"]

_TINY = torch.finfo(torch.float32).tiny


def _l1(t: torch.Tensor) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(t, ord=1, dim=-1)
    return norm


def _l2(t: torch.Tensor) -> torch.Tensor:
    norm: torch.Tensor = torch.linalg.vector_norm(t, dim=-1)
    return norm


def _mean_abs(t: torch.Tensor) -> torch.Tensor:
    return t.abs().mean(dim=-1)


def _per_chunk_(
    values: torch.Tensor,
    scales: torch.Tensor,
    chunk: int,
    op: Callable[[torch.Tensor, torch.Tensor], object],
) -> torch.Tensor:
    """``op(value, scale)`` in place on ``[m, n]`` values, each with its chunk's scale from
    ``[m, ceil(n / chunk)]`` scales (through views: no per-value copy of the scales)."""
    m, n = values.shape
    full = n // chunk
    cut = full * chunk
    op(values[:, :cut].view(m, full, chunk), scales[:, :full, None])
    if cut < n:  # the short last chunk
        op(values[:, cut:], scales[:, full:])
    return values


def _uniforms(generators: Sequence[torch.Generator], n: int) -> torch.Tensor:
    """``[m, n]`` float32 uniforms on the CPU: row ``r`` gets ``generators[r]``'s next
    ``rand(n)``.

    One draw per generator for all of its rows, in row order. That is the per-row draws
    exactly: torch's CPU ``uniform_`` takes one 32-bit word per float32 value, in order,
    so ``rand(c * n)`` is ``c`` successive ``rand(n)``. Generators are independent, so
    the order between them does not matter.
    """
    rows: dict[int, list[int]] = {}
    for r, gen in enumerate(generators):
        rows.setdefault(id(gen), []).append(r)
    if len(rows) == 1:  # one owner (a message): its rows are all the rows, in order
        return torch.rand(len(generators), n, generator=generators[0], device=_CPU)
    u = torch.empty(len(generators), n, dtype=torch.float32, device=_CPU)
    for own in rows.values():
        drawn = torch.rand(len(own), n, generator=generators[own[0]], device=_CPU)
        u[torch.tensor(own, device=_CPU)] = drawn
    return u


class CastCodec:
    """Plain float casts: ``fp32``, ``fp16`` or ``bf16`` values, little-endian."""

    _WIRE: ClassVar[dict[str, torch.dtype]] = {
        "fp32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
    }
    _BITS: ClassVar[dict[int, torch.dtype]] = {2: torch.int16, 4: torch.int32}

    def __init__(self, name: str = "fp32") -> None:
        """Pick the wire format by codec name."""
        if name not in self._WIRE:
            raise CompressionError(f"no cast codec {name!r}; use one of {sorted(self._WIRE)}.")
        self.name = name
        self._size = self._WIRE[name].itemsize

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values."""
        return self._size * n

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (no header scalars)."""
        return self.wire_bytes(n)

    def _wire(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the wire's dtype. The CPU casts float64 to the half types through
        float32 (a double rounding); the explicit float32 step does the same on devices
        that would round float64 directly."""
        return x.to(torch.float32).to(self._WIRE[self.name])

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Cast and copy the values' bits out (as integers: bfloat16 has no numpy dtype)."""
        dtype = _dtype_name(tensor, self.name)
        wire = self._wire(tensor.detach().reshape(-1)).view(self._BITS[self._size])
        data = wire.numpy().astype(f"<i{self._size}", copy=False).tobytes()
        return EncodedTensor(codec=self.name, dtype=dtype, shape=tuple(tensor.shape), data=data)

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Read the values back into the original dtype and shape."""
        n = _numel(encoded, self.name)
        _expect(encoded, self.wire_bytes(n), self.name)
        bits = np.frombuffer(encoded.data, dtype=f"<i{self._size}").copy()
        return _restore(torch.from_numpy(bits).view(self._WIRE[self.name]), encoded)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x`` (a new tensor of its dtype)."""
        return self._wire(x.detach()).to(x.dtype, copy=True)


class QSGDCodec:
    """QSGD stochastic quantization to ``bits`` per value (Alistarh et al., 2017).

    With ``s = 2**(bits-1) - 1`` levels a side, ``x_i`` becomes ``norm * l_i / s`` where the
    integer ``l_i`` rounds ``s x_i / norm`` up or down at random so that the expectation is
    exact (unbiased, up to float32 rounding). Each value travels as ``l_i + s`` in ``bits``
    bits, packed ``8 // bits`` to a byte. ``norm`` is the L2 norm of the whole tensor (a
    parameter) or, with ``chunk > 0``, of each bucket of ``chunk`` values (float32 norms
    after the packed codes): QSGD's buckets, which cut the variance from ``sqrt(n)/s`` to
    ``sqrt(chunk)/s`` times ``||x||^2`` for 32 bits per bucket.
    """

    name = "qsgd"
    BITS = (2, 4, 8)

    def __init__(
        self,
        bits: int = 8,
        *,
        chunk: int = 0,
        scaled: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        """Quantize to ``bits`` (2, 4 or 8) using ``generator`` for the rounding.

        ``chunk``: values per norm (0: one norm for the tensor). ``scaled`` shrinks the
        result by ``1 + omega`` (see :meth:`omega`), which makes the codec *contractive*:
        ``E||C(x) - x||^2 <= (1 - 1/(1 + omega)) ||x||^2``. Error-feedback methods
        (DeepSqueeze, CHOCO) need that; plain QSGD's error can exceed ``||x||`` and they
        diverge with it at 2 or 4 bits. The receiver needs no flag: the shrunk norms are
        what travel.
        """
        if bits not in self.BITS:
            raise CompressionError(f"qsgd bits must be one of {self.BITS}, got {bits}.")
        if chunk < 0:
            raise CompressionError(f"qsgd chunk must be >= 0, got {chunk}.")
        self.bits = bits
        self.chunk = chunk
        self.scaled = scaled
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def omega(self, n: int) -> float:
        """The variance factor for ``n`` values: ``E||Q(x) - x||^2 <= omega ||x||^2``."""
        s = 2 ** (self.bits - 1) - 1
        b = n if self.chunk == 0 else min(n, self.chunk)
        return float(min(b / s**2, math.sqrt(b) / s))

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values: the packed codes, plus per-bucket norms if chunked."""
        norms = 0 if self.chunk == 0 else -(-n // self.chunk)
        return (n * self.bits + 7) // 8 + 4 * norms

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (two header scalars)."""
        return self.wire_bytes(n) + 16

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Quantize stochastically (:meth:`_quantize` on one row) and pack."""
        dtype = _dtype_name(tensor, self.name)
        codes, norms = self._quantize(_flat(tensor)[None], [self.generator])
        data = _pack(codes[0].to(torch.uint8).numpy(), self.bits)  # truncation: floor
        params = {"bits": float(self.bits)}
        if self.chunk == 0:
            params["norm"] = float(norms[0, 0])
        else:
            data += norms[0].numpy().astype("<f4").tobytes()
            params["chunk"] = float(self.chunk)
        return EncodedTensor(
            codec=self.name, dtype=dtype, shape=tuple(tensor.shape), data=data, params=params
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Unpack the levels and rescale by the norm(s)."""
        n = _numel(encoded, self.name)
        bits = _int_param(encoded, "bits", self.name, 2, 8)
        if bits not in self.BITS:
            raise CompressionError(f"codec 'qsgd': bit width {bits} is absurd.")
        chunked = "chunk" in encoded.params  # absent: one norm for the whole tensor
        chunk = _int_param(encoded, "chunk", self.name, 1, 1 << 40) if chunked else 0
        ncodes = (n * bits + 7) // 8
        _expect(encoded, ncodes + (4 * -(-n // chunk) if chunk else 0), self.name)
        s = 2 ** (bits - 1) - 1
        codes = _unpack(encoded.data[:ncodes], bits, n)
        if codes.size and int(codes.max()) > 2 * s:
            raise CompressionError(f"codec 'qsgd': a level exceeds the {2 * s + 1} allowed.")
        if chunk == 0:
            norm = _param(encoded, "norm", self.name)
            if norm < 0:
                raise CompressionError(f"codec 'qsgd': negative norm {norm}.")
            norms = torch.tensor([norm], dtype=torch.float64, device=_CPU)
        else:
            norms = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4", offset=ncodes).copy())
            if not bool((torch.isfinite(norms) & (norms >= 0)).all()):
                raise CompressionError("codec 'qsgd': a bucket norm is negative or not finite.")
        levels = torch.from_numpy(codes).to(torch.float32)[None]
        return _restore(self._dequantize(levels, norms[None], chunk, s)[0], encoded)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x``, row ``r`` drawing from
        ``generators[r]`` (a new tensor of ``x``'s dtype)."""
        codes, norms = self._quantize(_rows(x), generators)
        s = 2 ** (self.bits - 1) - 1
        return self._dequantize(codes.trunc_(), norms, self.chunk, s).to(x.dtype)

    def _quantize(
        self, x: torch.Tensor, generators: Sequence[torch.Generator]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes before truncation (float32 ``l + s``, in ``[0, 2 s]``) and the
        float32 norms ``[m, buckets]`` (shrunk if scaled) of float32 rows.

        Stochastic rounding of ``y = s x / norm`` is ``floor(y + u)`` with ``u`` uniform in
        [0, 1): it rounds up with probability ``frac(y)``, the same distribution as rounding
        ``|y|`` and restoring the sign, in one fused pass. The code is ``floor(y + u + s)``
        (``(s x) / norm`` rounded to float32, then the sum, on every device).

        Raises:
            CompressionError: a norm is not finite (checked before any draw).
        """
        m, n = x.shape
        dev = x.device
        s = 2 ** (self.bits - 1) - 1
        if self.chunk == 0:
            norms = row_reduce(x, n, _l2)[:, None]
        else:
            size = min(self.chunk, max(n, 1))  # the same buckets; no giant padding
            count = -(-n // size)
            padded = torch.cat([x, x.new_zeros(m, count * size - n)], dim=1)
            norms = row_reduce(padded.view(m, count, size), size, _l2)
        if not bool(torch.isfinite(norms).all()):
            raise CompressionError(
                "codec 'qsgd': a norm of the tensor is not finite (values not finite, or so "
                "large that their squares overflow float32)."
            )
        per_value = norms.clamp(min=_TINY)
        if self.chunk:
            per_value = per_value.repeat_interleave(size, dim=1)[:, :n]
        codes = _uniforms(generators, n).to(dev)
        if dev.type == "cpu":  # torch's CPU addcdiv computes u + (s x) / norm in one pass
            codes.addcdiv_(x, per_value, value=s)
        else:  # others may compute u + s (x / norm): scale first, then divide by 1
            codes.addcdiv_(torch.mul(x, _const(s, torch.float32, dev)), per_value)
        codes.add_(s).clamp_(0, 2 * s)
        if self.scaled:
            norms = norms / _const(1 + self.omega(n), torch.float32, dev)
        return codes, norms

    @staticmethod
    def _dequantize(codes: torch.Tensor, norms: torch.Tensor, chunk: int, s: int) -> torch.Tensor:
        """The values of float32 codes (overwritten): ``(code - s) norm / s``.

        One norm a row (``chunk = 0``) travels as a float64 parameter and multiplies by
        ``norm / s`` rounded to float32; float32 bucket norms multiply, then ``s`` divides.
        """
        codes.sub_(s)
        if chunk == 0:
            scale = norms.to(torch.float64) / _const(s, torch.float64, norms.device)
            return codes.mul_(scale.to(torch.float32))
        _per_chunk_(codes, norms, chunk, torch.Tensor.mul_)
        return codes.div_(_const(s, torch.float32, codes.device))


def _pack(codes: np.ndarray, bits: int) -> bytes:
    """Pack unsigned codes below ``2**bits`` into bytes, ``8 // bits`` per byte, low bits first."""
    if bits == 8:
        return codes.astype(np.uint8).tobytes()
    per = 8 // bits
    padded = np.zeros(-(-len(codes) // per) * per, dtype=np.uint8)
    padded[: len(codes)] = codes
    groups = padded.reshape(-1, per)
    packed = np.zeros(len(groups), dtype=np.uint8)
    for j in range(per):
        packed |= groups[:, j] << (j * bits)
    return packed.tobytes()


def _unpack(data: bytes | memoryview, bits: int, n: int) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8)
    if bits == 8:
        return raw.copy()
    per = 8 // bits
    mask = (1 << bits) - 1
    out = np.empty((len(raw), per), dtype=np.uint8)
    for j in range(per):
        out[:, j] = (raw >> (j * bits)) & mask
    return out.reshape(-1)[:n]


class SignCodec:
    """Scaled sign: 1 bit per value and the mean magnitude of its chunk as the scale.

    ``x_i`` becomes ``+scale`` or ``-scale`` (``scale = mean |x|`` over its chunk; zero
    counts as positive). With ``chunk = 0`` the whole tensor is one chunk and the scale is a
    parameter; otherwise the float32 scales of each ``chunk`` values follow the sign bits.
    """

    name = "sign"

    def __init__(self, chunk: int = 0) -> None:
        """Scale per tensor (``chunk = 0``) or per ``chunk`` values."""
        if chunk < 0:
            raise CompressionError(f"sign chunk must be >= 0, got {chunk}.")
        self.chunk = chunk

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values: the sign bits, plus per-chunk scales if chunked."""
        scales = 0 if self.chunk == 0 else -(-n // self.chunk)
        return (n + 7) // 8 + 4 * scales

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (one header scalar: scale, or chunk)."""
        return self.wire_bytes(n) + 8

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Pack the signs and the scale(s) of :meth:`_scales` on one row."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        bits = np.packbits((x >= 0).numpy(), bitorder="little").tobytes()
        scales = self._scales(x[None])[0]
        if self.chunk == 0:
            data, params = bits, {"scale": float(scales[0])}
        else:
            data = bits + scales.numpy().astype("<f4").tobytes()
            params = {"chunk": float(self.chunk)}
        return EncodedTensor(
            codec=self.name, dtype=dtype, shape=tuple(tensor.shape), data=data, params=params
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Expand the bits to ``±scale``."""
        n = _numel(encoded, self.name)
        chunked = "chunk" in encoded.params  # absent: one scale for the whole tensor
        chunk = _int_param(encoded, "chunk", self.name, 1, 1 << 40) if chunked else 0
        nbits = (n + 7) // 8
        scales_count = 0 if chunk == 0 else -(-n // chunk)
        _expect(encoded, nbits + 4 * scales_count, self.name)
        signs = np.unpackbits(
            np.frombuffer(encoded.data, dtype=np.uint8, count=nbits), count=n, bitorder="little"
        )
        if chunk == 0:
            scale = _param(encoded, "scale", self.name)
            if scale < 0:
                raise CompressionError(f"codec 'sign': negative scale {scale}.")
            scales = torch.tensor([scale], dtype=torch.float64, device=_CPU)
        else:
            scales = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4", offset=nbits).copy())
            if not bool((torch.isfinite(scales) & (scales >= 0)).all()):
                raise CompressionError("codec 'sign': a chunk scale is negative or not finite.")
        unit = torch.from_numpy(signs).to(torch.float32)[None]
        return _restore(self._expand(unit, scales[None], chunk)[0], encoded)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x`` (a new tensor of its dtype).

        Raises:
            CompressionError: a scale is not finite (which ``decode`` refuses).
        """
        xf = _rows(x)
        scales = self._scales(xf)
        if not bool(torch.isfinite(scales).all()):
            raise CompressionError("codec 'sign': a scale is not finite.")
        return self._expand((xf >= 0).to(torch.float32), scales, self.chunk).to(x.dtype)

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        """The scales of float32 rows: ``[m, 1]`` float64 (one chunk: ``l1 / n``, as the
        float64 parameter carries it) or ``[m, chunks]`` float32 (the short last chunk's
        scale is the mean of its magnitudes)."""
        m, n = x.shape
        dev = x.device
        if self.chunk == 0:
            l1 = row_reduce(x, n, _l1).to(torch.float64)[:, None]
            return l1 / _const(max(n, 1), torch.float64, dev)
        chunk = self.chunk
        full = n // chunk
        cut = full * chunk
        scales = row_reduce(x[:, :cut].view(m, full, chunk), chunk, _l1)
        scales = scales / _const(chunk, torch.float32, dev)
        if cut < n:
            tail = row_reduce(x[:, cut:], n - cut, _mean_abs)
            scales = torch.cat([scales, tail[:, None]], dim=1)
        return scales

    @staticmethod
    def _expand(unit: torch.Tensor, scales: torch.Tensor, chunk: int) -> torch.Tensor:
        """``±scale`` from float32 ``1`` (``x >= 0``) and ``0`` values (overwritten).

        One scale a row (float64) is a parameter: ``unit * 2 scale - scale``, both
        rounded to float32; chunk scales: ``(2 unit - 1) scale``.
        """
        if chunk == 0:
            two = (scales * 2).to(torch.float32)
            return unit.mul_(two).sub_(scales.to(torch.float32))
        return _per_chunk_(unit.mul_(2).sub_(1), scales, chunk, torch.Tensor.mul_)
