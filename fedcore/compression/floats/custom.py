"""The ``float`` codec: customized precision (CPD) with any exponent and mantissa width,
packed into a bit stream, with Auto-Precision Scaling (``scaling = "aps"``) by layer."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch

from fedcore.compression.floats.fp8 import _all_finite, _each_row, _finite, _index, _not_finite
from fedcore.compression.wire import (
    _CPU,
    _dtype_name,
    _expect,
    _flat,
    _int_param,
    _numel,
    _restore,
)
from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """``2.0**k`` as float64, exactly, for integer ``k`` in [-1022, 1023] (built from bits)."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def _pack_bits(codes: np.ndarray, width: int) -> bytes:
    """``width``-bit unsigned codes into a little-endian bit stream, low bit first.

    Eight codes make ``width`` bytes: they are or-ed into 64-bit little-endian words (a
    code that straddles two words goes into both), whose first ``width`` bytes are the
    stream."""
    n = codes.size
    if width in (8, 16, 32):
        return codes.astype(f"<u{width // 8}", copy=False).tobytes()
    if width == 4:  # two codes a byte: the low nibble first
        c = codes.astype(np.uint8, copy=False)
        if n % 2:
            c = np.concatenate([c, np.zeros(1, dtype=np.uint8)])
        pairs = c.view("<u2")  # low | high << 8, both below 16
        packed: bytes = (pairs | (pairs >> 4)).astype(np.uint8).tobytes()
        return packed
    groups = -(-n // 8)
    lanes_per = -(-width // 8)  # 64-bit words per group of 8 codes (8 * width bits)
    c = np.zeros(groups * 8, dtype=np.uint64)
    c[:n] = codes
    c = c.reshape(groups, 8)
    lanes = np.zeros((groups, lanes_per), dtype="<u8")
    for j in range(8):
        lane, shift = divmod(j * width, 64)
        lanes[:, lane] |= c[:, j] << np.uint64(shift)
        if shift + width > 64:
            lanes[:, lane + 1] |= c[:, j] >> np.uint64(64 - shift)
    stream = lanes.view(np.uint8).reshape(groups, 8 * lanes_per)[:, :width]
    return stream.tobytes()[: -(-n * width // 8)]


def _unpack_bits(data: bytes | memoryview, width: int, n: int) -> np.ndarray:
    """The ``n`` codes of a stream :func:`_pack_bits` wrote (unsigned integers)."""
    if width in (8, 16, 32):
        return np.frombuffer(data, dtype=f"<u{width // 8}", count=n)
    raw = np.frombuffer(data, dtype=np.uint8)
    if width == 4:
        out = np.empty((len(raw), 2), dtype=np.uint8)
        np.bitwise_and(raw, 0x0F, out=out[:, 0])
        np.right_shift(raw, 4, out=out[:, 1])
        return out.reshape(-1)[:n]
    groups = -(-n // 8)
    lanes_per = -(-width // 8)
    buf = np.zeros((groups, 8 * lanes_per), dtype=np.uint8)
    padded = np.zeros(groups * width, dtype=np.uint8)
    padded[: len(raw)] = raw
    buf[:, :width] = padded.reshape(groups, width)
    lanes = buf.view("<u8")
    out = np.empty((groups, 8), dtype=np.uint64)
    mask = np.uint64((1 << width) - 1)
    for j in range(8):
        lane, shift = divmod(j * width, 64)
        v = lanes[:, lane] >> np.uint64(shift)
        if shift + width > 64:
            v |= lanes[:, lane + 1] << np.uint64(64 - shift)
        np.bitwise_and(v, mask, out=out[:, j])
    return out.reshape(-1)[:n]


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


def _limits(exp_bits: int, man_bits: int) -> tuple[int, int, float]:
    bias = 2 ** (exp_bits - 1) - 1
    emax = 2**exp_bits - 2 - bias  # the all-ones exponent is reserved, as in IEEE
    return bias, 1 - bias, (2 - 2.0**-man_bits) * 2.0**emax


def _f32_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.int32))


def _codes_exact(a: torch.Tensor, x: torch.Tensor, e: int, m: int) -> torch.Tensor:
    """The codes (int64) of magnitudes ``a`` (float64, exact) with the signs of ``x``:
    round to nearest even in float64, saturate. The definition; slow."""
    bias, emin, top = _limits(e, m)
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
    return (sign << (e + m)) | (field << m) | mantissa


def _values_exact(codes: torch.Tensor, e: int, m: int) -> torch.Tensor:
    """The float64 values of codes (int64; reserved exponents decode as if normal)."""
    bias, emin, _ = _limits(e, m)
    field = (codes >> m) & (2**e - 1)
    mantissa = (codes & (2**m - 1)).to(torch.float64)
    normal = field > 0
    significand = torch.where(normal, mantissa + 2**m, mantissa)
    exponent = torch.where(normal, field - bias, torch.full_like(field, emin)) - m
    values = significand * _pow2(exponent)
    return torch.where((codes >> (e + m)) & 1 == 1, -values, values)


_CASTS: dict[tuple[int, int], torch.dtype] = {
    (4, 3): torch.float8_e4m3fn,  # e4m3fn differs from e4m3 only above 240: clamped
    (5, 2): torch.float8_e5m2,
    (5, 10): torch.float16,
    (8, 7): torch.bfloat16,
}
"""Formats whose codes torch's casts give (round to nearest even) once clamped to the top."""

_SENTINEL = 0xFF
"""Key-table entry for inf/NaN (formats of at most 7 bits, whose codes are below it)."""


@functools.cache
def _key_table(e: int, m: int) -> torch.Tensor:
    """The code of every 16-bit key: the top half of a float32, its last bit or-ed with
    whether the low half is non-zero (round to odd). For ``m <= 5`` the nearest-even
    rounding of the key and of the value agree: every tie of the format is an even key."""
    keys = torch.arange(1 << 16, dtype=torch.int32)
    values = (keys << 16).view(torch.float32)
    finite = torch.isfinite(values)
    safe = torch.where(finite, values, torch.zeros_like(values))
    codes = _codes_exact(safe.abs().to(torch.float64), safe, e, m)
    if 1 + e + m <= 7:
        codes[~finite] = _SENTINEL
        return codes.to(torch.uint8)
    return codes.to(torch.int16)


def _codes_by_key(x: torch.Tensor, e: int, m: int) -> tuple[torch.Tensor, bool]:
    """Codes by :func:`_key_table` (``m <= 5``); and whether inf/NaN was seen (sentinel)."""
    bits = x.view(torch.int32)
    key = torch.bitwise_and(bits, 0xFFFF)
    key.add_(0xFFFF).bitwise_or_(bits)  # bit 16 |= (low half != 0)
    high = key.view(torch.uint16).view(-1, 2)[:, 1]  # little-endian: the top half
    codes = torch.index_select(_key_table(e, m), 0, high.to(torch.int32))
    if codes.dtype == torch.uint8:
        return codes, bool(codes.numel()) and int(codes.max()) == _SENTINEL
    return codes, False


def _codes_by_bits(x: torch.Tensor, e: int, m: int) -> torch.Tensor:
    """Codes (int32) by integer rounding on the float32 bits: add half a unit minus one
    plus the last kept bit, shift (nearest even); values below the format's normal range
    round by a float32 addition of ``2**(emin - m + 23)``; then saturate and sign."""
    emin = _limits(e, m)[1]
    shift = 23 - m
    bits = x.view(torch.int32)
    mag = torch.bitwise_and(bits, 0x7FFFFFFF)
    rebias = (126 + emin) << 23  # float32 exponent field -> the format's
    if shift:
        codes = torch.bitwise_right_shift(mag, shift).bitwise_and_(1)
        codes.add_(mag).add_((1 << (shift - 1)) - 1 - rebias).bitwise_right_shift_(shift)
    else:
        codes = mag - rebias
    if e < 8:  # subnormals of the format (float32 holds them as normals)
        magic = 2.0 ** (emin - m + 23)
        low = torch.clamp(mag.view(torch.float32), max=2.0**emin).add_(magic)
        low_codes = low.view(torch.int32).sub_(_f32_bits(magic))
        torch.maximum(codes, low_codes, out=codes)
    codes.clamp_(max=((2**e - 2) << m) | (2**m - 1))
    sign = torch.bitwise_right_shift(bits, 31).bitwise_and_(1 << (e + m))
    return codes.bitwise_or_(sign)


def _codes(x: torch.Tensor, e: int, m: int, codec: str, *, checked: bool = False) -> np.ndarray:
    """The codes of float32 values (refusing inf/NaN unless ``checked``: the caller has),
    as unsigned numpy integers."""
    cast = _CASTS.get((e, m))
    if not checked and (cast is not None or (e, m) == (8, 23) or m > 5):
        _finite(x, codec)
    if cast is not None:
        top = _limits(e, m)[2]
        wire = torch.clamp(x, -top, top).to(cast)
        view = torch.uint8 if cast.itemsize == 1 else torch.int16
        return wire.view(view).numpy().view(np.uint8 if cast.itemsize == 1 else np.uint16)
    if (e, m) == (8, 23):
        return x.numpy().view(np.uint32)
    if m > 5:
        return _codes_by_bits(x, e, m).numpy()
    codes, bad = _codes_by_key(x, e, m)
    if bad or (not checked and codes.dtype != torch.uint8 and x.numel()):
        _finite(x, codec)
    return codes.numpy().view(np.uint8 if codes.dtype == torch.uint8 else np.uint16)


@functools.cache
def _value_table(e: int, m: int) -> torch.Tensor:
    """The float32 value of every code (widths up to 16)."""
    codes = torch.arange(1 << (1 + e + m), dtype=torch.int64)
    return _values_exact(codes, e, m).to(torch.float32)


@functools.cache
def _pair_table(e: int, m: int) -> torch.Tensor:
    """The values of the two 4-bit codes in each byte, low nibble first, as the int64
    holding both float32 bit patterns (one lookup a byte)."""
    table = _value_table(e, m)
    byte = torch.arange(256)
    pairs = torch.stack([table[byte & 15], table[byte >> 4]], dim=1).contiguous()
    return pairs.view(torch.int64).reshape(-1)


def _values(data: bytes | memoryview, e: int, m: int, n: int) -> torch.Tensor:
    """Unpack and decode ``n`` codes (float32), refusing the reserved exponent."""
    width = 1 + e + m
    field = ((1 << e) - 1) << m
    reserved = CompressionError("codec 'float': a value has the reserved all-ones exponent.")
    if width == 4:
        raw = np.frombuffer(data, dtype=np.uint8)
        for mask in (field, field << 4):
            if raw.size and int(np.bitwise_and(raw, mask).max()) == mask:
                raise reserved
        pairs = torch.index_select(_pair_table(e, m), 0, _index(raw))
        return pairs.view(torch.float32)[:n]
    codes = _unpack_bits(data, width, n)
    if codes.size and int(np.bitwise_and(codes, codes.dtype.type(field)).max()) == field:
        raise reserved
    if width <= 16:
        return torch.index_select(_value_table(e, m), 0, _index(codes))
    if width == 32:
        return torch.from_numpy(codes.view(np.float32).copy())
    emin = _limits(e, m)[1]
    c = torch.from_numpy(codes.astype(np.int32))
    mag = torch.bitwise_and(c, (1 << (e + m)) - 1)
    # normals: the bits moved into float32's fields; subnormals: mant * 2**(emin - m),
    # as (magic + mant) - magic - 2**emin, added to the normal part clamped at 2**emin.
    magic = 2.0 ** (emin - m + 23)
    low = torch.clamp(mag, max=1 << m).add_(_f32_bits(magic)).view(torch.float32)
    low.sub_(magic + 2.0**emin)
    high = torch.clamp(mag, min=1 << m).bitwise_left_shift_(23 - m)
    values = high.add_((126 + emin) << 23).view(torch.float32).add_(low)
    sign = torch.bitwise_right_shift(c, e + m).bitwise_left_shift_(31)
    return values.view(torch.int32).bitwise_or_(sign).view(torch.float32)


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

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (two header scalars; APS a third)."""
        return self.wire_bytes(n) + (24 if self.scaling == "aps" else 16)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x``. Without APS each value rounds on
        its own, so all rows go at once through the codec's rounding, packing and
        decoding (on the CPU); APS shifts per row, so its rows go one by one."""
        if self.scaling != "none":
            return _each_row(self, x)
        e, m = self.exp_bits, self.man_bits
        flat = x.detach().to(_CPU).to(torch.float32).contiguous().reshape(-1)
        values = _values(_pack_bits(_codes(flat, e, m, self.name), self.width), e, m, flat.numel())
        return values.reshape(x.shape).to(x.dtype).to(x.device)

    @staticmethod
    def limits(exp_bits: int, man_bits: int) -> tuple[int, int, float]:
        """``(bias, emin, largest finite)`` of the format."""
        return _limits(exp_bits, man_bits)

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """(APS: shift each layer,) round to nearest even into the format (saturating),
        then pack the codes."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor).contiguous()
        e, m = self.exp_bits, self.man_bits
        params = {"exp_bits": float(e), "man_bits": float(m)}
        prefix = b""
        if self.scaling == "aps":
            sizes = self._sizes(x.numel())
            table = np.zeros(len(sizes), dtype=_APS_LAYER)
            table["numel"] = sizes
            table["shift"] = self._shifts(x, sizes)
            prefix = table.tobytes()
            params["layers"] = float(len(sizes))
            shifted = self._shifted(x, sizes, table["shift"].tolist())
            if shifted is None:  # float32 cannot hold the shifted values: the definition
                a = x.abs().to(torch.float64)
                at = 0
                for size, shift in zip(sizes, table["shift"].tolist(), strict=True):
                    a[at : at + size].mul_(math.ldexp(1.0, shift))
                    at += size
                codes = _codes_exact(a, x, e, m).numpy()
            else:  # the shifts' min/max pass refused inf/NaN; the shifts keep finite
                codes = _codes(shifted, e, m, self.name, checked=True)
        else:
            codes = _codes(x, e, m, self.name)
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=prefix + _pack_bits(codes, self.width),
            params=params,
        )

    def _shifts(self, x: torch.Tensor, sizes: Sequence[int]) -> list[int]:
        """Each layer's shift, from its min/max; refuses inf/NaN (first, as the codec's
        check before anything else)."""
        top = _limits(self.exp_bits, self.man_bits)[2]
        ends = []
        at = 0
        for size in sizes:
            lo, hi = torch.aminmax(x[at : at + size]) if size else (x.new_zeros(()),) * 2
            ends.append((float(lo), float(hi)))
            at += size
        if not all(math.isfinite(lo) and math.isfinite(hi) for lo, hi in ends):
            raise _not_finite(self.name)
        return [aps_shift(max(-lo, hi), top, self.summands) for lo, hi in ends]

    def _shifted(
        self, x: torch.Tensor, sizes: Sequence[int], shifts: Sequence[int]
    ) -> torch.Tensor | None:
        """``x`` with each layer times ``2**shift`` in float32, or None where that is not
        code for code the exact product (e = 8 below float32's normal range)."""
        if self.exp_bits == 8 and min(shifts) < 0:
            return None
        out = torch.empty_like(x)
        at = 0
        for size, shift in zip(sizes, shifts, strict=True):
            part, dst = x[at : at + size], out[at : at + size]
            if -126 <= shift <= 127:  # exact, or (shift < 0) below every code but zero
                torch.mul(part, torch.tensor(math.ldexp(1.0, shift)), out=dst)
            else:
                dst.copy_(part.to(torch.float64).mul_(math.ldexp(1.0, shift)))
            at += size
        return out

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
        values = _values(data, e, m, n)
        if table is not None:  # undo each layer's shift: one rounding, as float64 then float32
            shifts = table["shift"].astype(np.int64).tolist()
            at = 0
            for size, shift in zip(table["numel"].tolist(), shifts, strict=True):
                part = values[at : at + size]
                if -149 <= -shift <= 127:
                    part.mul_(torch.tensor(math.ldexp(1.0, -shift)))
                else:
                    part.copy_(part.to(torch.float64).mul_(math.ldexp(1.0, -shift)))
                at += size
            if min(shifts, default=0) < 0 and not _all_finite(values):
                raise CompressionError("codec 'float': an APS shift decodes beyond float32.")
        return _restore(values, encoded)
