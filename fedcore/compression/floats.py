"""Low-precision float codecs: ``fp8``, ``float`` (any exponent and mantissa width), ``s2fp8``.

Each is a real packed encoding with an exact wire size (``nbytes(n)``, what
``EncodedTensor.nbytes`` counts: payload plus 8 bytes per header scalar). All three are
deterministic, and all three refuse non-finite input with
:class:`~fedcore.errors.CompressionError` (as ``qsgd`` does: a scale or a format without
inf and NaN cannot carry them). Decoding checks the header against the bytes and refuses
codes the format does not define (NaN and inf codes, a reserved exponent, padding bits).

Wire formats (little-endian; ``n`` values; float32 scales):

=======  ===============================================  ======================  =========
codec    data                                             params                  nbytes
=======  ===============================================  ======================  =========
fp8      ``n`` float8 bytes (e4m3fn or e5m2), then one    ``exp_bits`` (4 or 5),  n + 4 s
         float32 scale per tensor (``chunk = 0``) or      ``chunk`` if chunked    + 8 p
         per ``chunk`` values: ``s`` scales
float    ``ceil(n (1 + e + m) / 8)`` bytes: value ``i``   ``exp_bits``,           payload
         in bits ``[i w, (i + 1) w)`` of the stream,      ``man_bits``            + 16
         low bit first; sign, exponent, mantissa from
         the top bit down
s2fp8    alpha, beta (two float32), then ``n`` e5m2       none                    n + 8
         bytes
=======  ===============================================  ======================  =========

``fp8`` scales each tensor (or chunk) so that its largest magnitude maps to the format's
largest finite value (448 for e4m3fn, 57344 for e5m2), casts with torch's
``float8_e4m3fn`` / ``float8_e5m2``, and multiplies back.

``float`` is the customized precision (CPD) of Han, Demmel and You: ``e`` exponent bits with
bias ``2**(e-1) - 1``, ``m`` mantissa bits, round to nearest even, subnormals. As in IEEE the
all-ones exponent is reserved (never sent, refused on decode), so e=8/m=23 is exactly
float32 and e=5/m=10 exactly float16 on every finite value a float16 can hold, normals and
subnormals alike. Unlike IEEE there is no inf: a value beyond the largest finite value
saturates to it (float16 would round ``|x| >= 65520`` to inf; this codec sends 65504).
With ``scaling = "aps"`` (Auto-Precision Scaling, Han, Demmel and You) each layer of the
model is first multiplied by ``2**s``, ``s`` from its largest magnitude (:func:`aps_shift`:
the largest value lands in the format's top binade), so that small layers are not
flushed to zero; the data then starts with one ``(uint32 numel, int16 s)`` record per
layer (``layers`` records, a third header scalar; nbytes ``+ 6 layers + 8``), and the
decoder divides by ``2**s`` exactly. A tensor that is not the whole model (an RPS block)
is one layer.

``s2fp8`` (Cambier et al., ICLR 2020) takes over the non-zero values ``L = log2|x|``,
``mu = mean L``, ``M = max L``, ``alpha = 15 / (M - mu)`` (1 when ``M = mu``),
``beta = -alpha mu`` (both rounded to float32 first, so both ends use the same), sends
``sign(x) * e5m2(2**(alpha L + beta))`` and decodes ``|x| = 2**((log2|y| - beta) / alpha)``.
Zeros stay zeros; a non-zero value too small for e5m2 (below its least subnormal
``2**-16`` in the shifted domain) is sent as that subnormal, so that signs and non-zeros
survive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from fedcore.compression.codecs import (
    _dtype_name,
    _expect,
    _flat,
    _int_param,
    _numel,
    _restore,
)
from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor

__all__ = [
    "APS_MAX_SHIFT",
    "FP8_FORMATS",
    "CustomFloatCodec",
    "FP8Codec",
    "S2FP8Codec",
    "aps_shift",
]

FP8_FORMATS: dict[str, tuple[int, torch.dtype]] = {
    "e4m3": (4, torch.float8_e4m3fn),
    "e5m2": (5, torch.float8_e5m2),
}
"""fp8 format name -> (exponent bits, the torch dtype)."""

_BY_EXP = dict(FP8_FORMATS.values())


def _finite(x: torch.Tensor, codec: str) -> None:
    if not bool(torch.isfinite(x).all()):
        raise CompressionError(
            f"codec {codec!r}: the tensor has non-finite values (inf or NaN), which the "
            "format cannot carry."
        )


def _bad_fp8(codes: np.ndarray, exp_bits: int) -> bool:
    """Whether any fp8 byte is a NaN (e4m3fn) or an inf/NaN (e5m2) code."""
    if exp_bits == 4:
        return bool(((codes & 0x7F) == 0x7F).any())
    return bool(((codes & 0x7C) == 0x7C).any())


class FP8Codec:
    """8-bit floats (e4m3fn or e5m2), one float32 scale per tensor or per ``chunk`` values."""

    name = "fp8"

    def __init__(self, format: str = "e4m3", *, chunk: int = 0) -> None:
        """Pick the format (``"e4m3"`` or ``"e5m2"``) and the values per scale (0: one)."""
        if format not in FP8_FORMATS:
            raise CompressionError(
                f"fp8 format must be one of {', '.join(FP8_FORMATS)}, got {format!r}."
            )
        if chunk < 0:
            raise CompressionError(f"fp8 chunk must be >= 0, got {chunk}.")
        self.format = format
        self.exp_bits, self.dtype = FP8_FORMATS[format]
        self.chunk = chunk

    def _scales(self, n: int) -> int:
        return 1 if self.chunk == 0 else -(-n // self.chunk)

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values: a byte each, then the float32 scales."""
        return n + 4 * self._scales(n)

    def nbytes(self, n: int) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values: the payload and the header scalars."""
        return self.wire_bytes(n) + 8 * (2 if self.chunk else 1)

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Scale each chunk's largest magnitude to the format's largest finite value, cast."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        _finite(x, self.name)
        n = x.numel()
        top = torch.finfo(self.dtype).max
        size = max(n if self.chunk == 0 else self.chunk, 1)
        blocks = torch.cat([x, x.new_zeros(-n % size)]).reshape(-1, size)
        peak = blocks.abs().amax(dim=1) if n else x.new_zeros(self._scales(n))
        scales = peak / top  # float32
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        y = (blocks / safe[:, None]).clamp_(-top, top).reshape(-1)[:n]
        codes = y.to(self.dtype).view(torch.uint8).numpy()
        data = codes.tobytes() + scales.numpy().astype("<f4").tobytes()
        params = {"exp_bits": float(self.exp_bits)}
        if self.chunk:
            params["chunk"] = float(self.chunk)
        return EncodedTensor(
            codec=self.name, dtype=dtype, shape=tuple(tensor.shape), data=data, params=params
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Read the bytes as float8 and multiply by their scale."""
        n = _numel(encoded, self.name)
        exp_bits = _int_param(encoded, "exp_bits", self.name, 4, 5)
        chunked = "chunk" in encoded.params
        chunk = _int_param(encoded, "chunk", self.name, 1, 1 << 40) if chunked else 0
        count = 1 if chunk == 0 else -(-n // chunk)
        _expect(encoded, n + 4 * count, self.name)
        codes = np.frombuffer(encoded.data, dtype=np.uint8, count=n)
        if _bad_fp8(codes, exp_bits):
            raise CompressionError(f"codec 'fp8': a byte is not a finite e{exp_bits} value.")
        scales = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4", offset=n).copy())
        if not bool((torch.isfinite(scales) & (scales >= 0)).all()):
            raise CompressionError("codec 'fp8': a scale is negative or not finite.")
        values = torch.from_numpy(codes.copy()).view(_BY_EXP[exp_bits]).to(torch.float32)
        size = max(n if chunk == 0 else chunk, 1)
        cut = n - n % size
        values[:cut].view(-1, size).mul_(scales[: cut // size, None])
        if cut < n:
            values[cut:].mul_(scales[-1])
        if not bool(torch.isfinite(values).all()):
            raise CompressionError("codec 'fp8': a scale times its values overflows float32.")
        return _restore(values, encoded)


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """``2.0**k`` as float64, exactly, for integer ``k`` in [-1022, 1023] (built from bits)."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def _pack_bits(codes: np.ndarray, width: int) -> bytes:
    """``width``-bit unsigned codes into a little-endian bit stream, low bit first."""
    if width in (8, 16, 32):
        return codes.astype(f"<u{width // 8}").tobytes()
    shifts = np.arange(width, dtype=np.uint64)
    bits = ((codes.astype(np.uint64)[:, None] >> shifts) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


def _unpack_bits(data: bytes, width: int, n: int) -> np.ndarray:
    if width in (8, 16, 32):
        return np.frombuffer(data, dtype=f"<u{width // 8}").astype(np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)
    bits = np.unpackbits(raw, count=n * width, bitorder="little").reshape(n, width)
    weights = np.left_shift(np.int64(1), np.arange(width, dtype=np.int64))
    codes: np.ndarray = (bits.astype(np.int64) * weights).sum(axis=1)
    return codes


APS_MAX_SHIFT = 1000
"""Largest magnitude of an APS shift: float64 holds every float32 value times ``2**1000``
(and ``2**-1000``) exactly, far beyond what any layer of a finite model needs."""

_APS_LAYER = np.dtype([("numel", "<u4"), ("shift", "<i2")])
"""One layer of the APS prefix: its value count and its shift (6 bytes)."""


def aps_shift(largest: float, top: float, summands: int = 1) -> int:
    """APS's shift of one layer: the largest ``s`` with ``summands * largest * 2**s <= top``
    (0 for an all-zero layer), within ``[-APS_MAX_SHIFT, APS_MAX_SHIFT]``.

    ``top`` is the format's largest finite value: the layer's largest magnitude lands in the
    format's top binade (``summands`` of them summed still fit), which moves every value
    of the layer as far from the underflow threshold as the format allows."""
    if largest <= 0:
        return 0
    bound = top / summands
    shift = math.floor(math.log2(bound / largest))
    while math.ldexp(largest, shift + 1) <= bound:  # log2 rounds: settle the last step
        shift += 1
    while math.ldexp(largest, shift) > bound:
        shift -= 1
    return max(-APS_MAX_SHIFT, min(APS_MAX_SHIFT, shift))


class CustomFloatCodec:
    """Customized precision: ``1 + exp_bits + man_bits`` bits per value, packed; with
    ``scaling = "aps"``, each layer first shifted by a power of two (:func:`aps_shift`).

    Args:
        exp_bits: Exponent bits, 2..8.
        man_bits: Mantissa bits, 0..23.
        scaling: ``"none"`` or ``"aps"``.
        layers: The value counts of the model's layers, in order (APS only): a tensor of
            exactly that many values is shifted layer by layer, any other tensor (an RPS
            block) as one layer.
        summands: How many such values a receiver sums in the format (APS only): the
            shift leaves room for that many. fedcore's receivers decode to float32 before
            they sum anything, so runs use 1.
    """

    name = "float"

    def __init__(
        self,
        exp_bits: int = 4,
        man_bits: int = 3,
        *,
        scaling: str = "none",
        layers: Sequence[int] = (),
        summands: int = 1,
    ) -> None:
        """Check the options (see the class docstring)."""
        if not 2 <= exp_bits <= 8:
            raise CompressionError(f"float exp_bits must be in 2..8, got {exp_bits}.")
        if not 0 <= man_bits <= 23:
            raise CompressionError(f"float man_bits must be in 0..23, got {man_bits}.")
        if scaling not in ("none", "aps"):
            raise CompressionError(f"float scaling must be 'none' or 'aps', got {scaling!r}.")
        if any(int(k) <= 0 or int(k) >= 2**32 for k in layers):
            raise CompressionError(f"float layers must be sizes in [1, 2**32), got {layers}.")
        if summands < 1:
            raise CompressionError(f"float summands must be at least 1, got {summands}.")
        self.exp_bits = exp_bits
        self.man_bits = man_bits
        self.scaling = scaling
        self.layers = tuple(int(k) for k in layers)
        self.summands = int(summands)

    @property
    def width(self) -> int:
        """Bits per value."""
        return 1 + self.exp_bits + self.man_bits

    def _sizes(self, n: int) -> tuple[int, ...]:
        """The layers a tensor of ``n`` values is shifted by (APS): the model's, or one."""
        if self.layers and sum(self.layers) == n:
            return self.layers
        chunks = []
        while n > 0:  # one layer, in pieces a uint32 count can say
            chunks.append(min(n, 2**32 - 1))
            n -= chunks[-1]
        return tuple(chunks) or (0,)

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values (with APS, 6 bytes a layer before the values)."""
        prefix = _APS_LAYER.itemsize * len(self._sizes(n)) if self.scaling == "aps" else 0
        return prefix + -(-n * self.width // 8)

    def nbytes(self, n: int) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (two header scalars; APS a third)."""
        return self.wire_bytes(n) + (24 if self.scaling == "aps" else 16)

    @staticmethod
    def limits(exp_bits: int, man_bits: int) -> tuple[int, int, float]:
        """``(bias, emin, largest finite)`` of the format."""
        bias = 2 ** (exp_bits - 1) - 1
        emax = 2**exp_bits - 2 - bias  # the all-ones exponent is reserved, as in IEEE
        return bias, 1 - bias, (2 - 2.0**-man_bits) * 2.0**emax

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """(APS: shift each layer,) round to nearest even into the format (saturating),
        then pack the codes."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        _finite(x, self.name)
        e, m = self.exp_bits, self.man_bits
        bias, emin, top = self.limits(e, m)
        a = x.abs().to(torch.float64)  # float32 values and every step below: exact
        params = {"exp_bits": float(e), "man_bits": float(m)}
        prefix = b""
        if self.scaling == "aps":
            sizes = self._sizes(a.numel())
            table = np.zeros(len(sizes), dtype=_APS_LAYER)
            table["numel"] = sizes
            at = 0
            for i, size in enumerate(sizes):
                part = a[at : at + size]
                largest = float(part.max()) if size else 0.0
                table["shift"][i] = shift = aps_shift(largest, top, self.summands)
                part.mul_(math.ldexp(1.0, shift))  # a power of two: exact in float64
                at += size
            prefix = table.tobytes()
            params["layers"] = float(len(sizes))
        _, ex = torch.frexp(a)
        exponent = torch.clamp(ex - 1, min=emin)  # floor(log2 a), subnormals at emin
        quantum = _pow2(exponent - m)
        r = torch.round(a / quantum).mul_(quantum).clamp_(max=top)  # round half to even
        _, ex = torch.frexp(r)
        exponent = torch.clamp(ex - 1, min=emin)
        unit = _pow2(exponent - m)
        normal = r >= 2.0**emin
        field = torch.where(normal, exponent + bias, torch.zeros_like(exponent)).to(torch.int64)
        mantissa = (r / unit).to(torch.int64) - torch.where(normal, 2**m, 0)
        sign = torch.signbit(x).to(torch.int64)
        codes = (sign << (e + m)) | (field << m) | mantissa
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=prefix + _pack_bits(codes.numpy(), self.width),
            params=params,
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Unpack the codes and rebuild the values (APS: shift each layer back), refusing
        reserved exponents, padding bits and layer tables that do not fit the tensor."""
        n = _numel(encoded, self.name)
        e = _int_param(encoded, "exp_bits", self.name, 2, 8)
        m = _int_param(encoded, "man_bits", self.name, 0, 23)
        width = 1 + e + m
        table = None
        data = encoded.data
        if "layers" in encoded.params:
            count = _int_param(encoded, "layers", self.name, 1, max(1, n))
            head = count * _APS_LAYER.itemsize
            _expect(encoded, head + -(-n * width // 8), self.name)
            table = np.frombuffer(data, dtype=_APS_LAYER, count=count)
            if int(table["numel"].astype(np.int64).sum()) != n or (
                n and not bool((table["numel"] > 0).all())
            ):
                raise CompressionError(
                    f"codec 'float': the APS layer sizes {table['numel'].tolist()[:8]} do not "
                    f"add up to the tensor's {n} values."
                )
            if bool((np.abs(table["shift"].astype(np.int64)) > APS_MAX_SHIFT).any()):
                raise CompressionError(f"codec 'float': an APS shift is beyond +-{APS_MAX_SHIFT}.")
            data = data[head:]
        else:
            _expect(encoded, -(-n * width // 8), self.name)
        spare = -(n * width) % 8
        if spare and data[-1] >> (8 - spare):
            raise CompressionError("codec 'float': the padding bits after the last value are set.")
        codes = torch.from_numpy(_unpack_bits(data, width, n))
        bias, emin, _ = self.limits(e, m)
        field = (codes >> m) & (2**e - 1)
        if bool((field == 2**e - 1).any()):
            raise CompressionError("codec 'float': a value has the reserved all-ones exponent.")
        mantissa = (codes & (2**m - 1)).to(torch.float64)
        normal = field > 0
        significand = torch.where(normal, mantissa + 2**m, mantissa)
        exponent = torch.where(normal, field - bias, torch.full_like(field, emin)) - m
        values = significand * _pow2(exponent)
        if table is not None:  # undo each layer's shift: a power of two, exact in float64
            sizes = torch.from_numpy(table["numel"].astype(np.int64))
            shifts = torch.from_numpy(table["shift"].astype(np.int64))
            values *= _pow2(-torch.repeat_interleave(shifts, sizes))
        values = torch.where((codes >> (e + m)) & 1 == 1, -values, values).to(torch.float32)
        if table is not None and not bool(torch.isfinite(values).all()):
            raise CompressionError("codec 'float': an APS shift decodes beyond float32.")
        return _restore(values, encoded)


_MAX_ALPHA = 2.0**40  # nearly equal magnitudes: a bounded squeeze keeps beta finite
_E5M2_TINY = 2.0**-16
"""e5m2's least subnormal: s2fp8 sends a non-zero value at least this large."""


class S2FP8Codec:
    """Shifted and squeezed fp8: per tensor ``(alpha, beta)`` and e5m2 values."""

    name = "s2fp8"

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values: alpha and beta, then a byte each."""
        return 8 + n

    def nbytes(self, n: int) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (no header scalars)."""
        return self.wire_bytes(n)

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Shift and squeeze ``log2|x|`` to mean 0 and max 15, cast to e5m2."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        _finite(x, self.name)
        a = x.abs().to(torch.float64)
        nonzero = a > 0
        logs = torch.log2(a[nonzero])
        alpha, beta = 1.0, 0.0
        if logs.numel():
            mu, top = float(logs.mean()), float(logs.max())
            alpha = float(np.float32(min(15.0 / (top - mu), _MAX_ALPHA))) if top > mu else 1.0
            beta = float(np.float32(-alpha * mu))
        shifted = torch.zeros_like(a)
        shifted[nonzero] = torch.exp2(alpha * logs + beta)
        top8 = torch.finfo(torch.float8_e5m2).max
        shifted = torch.where(nonzero, shifted.clamp(_E5M2_TINY, top8), shifted)
        y = torch.where(torch.signbit(x), -shifted, shifted).to(torch.float32)
        codes = y.to(torch.float8_e5m2).view(torch.uint8).numpy()
        head = np.array([alpha, beta], dtype="<f4").tobytes()
        return EncodedTensor(
            codec=self.name, dtype=dtype, shape=tuple(tensor.shape), data=head + codes.tobytes()
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Invert the shift and squeeze: ``|x| = 2**((log2|y| - beta) / alpha)``."""
        n = _numel(encoded, self.name)
        _expect(encoded, 8 + n, self.name)
        alpha, beta = (float(v) for v in np.frombuffer(encoded.data, dtype="<f4", count=2))
        if not (math.isfinite(alpha) and alpha > 0 and math.isfinite(beta)):
            raise CompressionError(
                f"codec 's2fp8': alpha={alpha}, beta={beta} (alpha must be positive, both finite)."
            )
        codes = np.frombuffer(encoded.data, dtype=np.uint8, offset=8)
        if _bad_fp8(codes, 5):
            raise CompressionError("codec 's2fp8': a byte is not a finite e5m2 value.")
        y = torch.from_numpy(codes.copy()).view(torch.float8_e5m2).to(torch.float64)
        mag = y.abs()
        nonzero = mag > 0
        out = torch.zeros_like(mag)
        out[nonzero] = torch.exp2((torch.log2(mag[nonzero]) - beta) / alpha)
        values = torch.where(torch.signbit(y), -out, out).to(torch.float32)
        if not bool(torch.isfinite(values).all()):
            raise CompressionError("codec 's2fp8': alpha and beta decode to non-finite values.")
        return _restore(values, encoded)
