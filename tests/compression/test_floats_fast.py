"""The fast float codecs against a frozen copy of the slow ones they replaced.

``Ref*`` below are the encoders and decoders of ``fedcore/compression/floats/`` as they
were before the fast paths (frexp/round chains in float64, one uint8 per bit): the wire
format is defined by them. The fast codecs must give exactly the same bytes and params,
exactly the same decoded tensors (bit for bit, signs of zeros included), and refuse
exactly the same payloads with the same message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.compression.batched import make_row_codec
from fedcore.compression.floats import (
    FP8_FORMATS,
    CustomFloatCodec,
    FP8Codec,
    S2FP8Codec,
)
from fedcore.compression.wire import (
    _dtype_name,
    _expect,
    _flat,
    _int_param,
    _numel,
    _restore,
)
from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor

# --------------------------------------------------------------------------- reference

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


class RefFP8Codec:
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


class RefCustomFloatCodec:
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


class RefS2FP8Codec:
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


# --------------------------------------------------------------------------- inputs

_TINY = 2.0**-126
_MAX32 = float(np.finfo(np.float32).max)


def _from_bits(bits: Sequence[int]) -> torch.Tensor:
    """float32 values with these bit patterns; non-finite patterns become 0."""
    x = np.array(list(bits), dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    x[~np.isfinite(x)] = 0.0
    return torch.from_numpy(x)


def _specials() -> torch.Tensor:
    """Zeros, subnormals, the float32 extremes, and the saturation edges of every format."""
    vals = [0.0, -0.0, 2.0**-149, 3 * 2.0**-149, _TINY / 2, _TINY * (1 - 2**-23), _TINY]
    vals += [_MAX32, 2.0**127, 1.0, 1 + 2**-23, 448.0, 464.0, 480.0, 57344.0, 61440.0]
    vals += [240.0, 248.0, 256.0, 65504.0, 65520.0, 65536.0, 1e-45, 1e-40, 1e-8, 0.5]
    for e in range(2, 9):
        for m in (0, 1, 2, 3, 7, 10, 22, 23):
            _bias, emin, top = RefCustomFloatCodec.limits(e, m)
            for v in (top, top * (1 + 2.0 ** -(m + 1)), top * 1.5, 2.0**emin, 2.0 ** (emin - m)):
                if v < _MAX32:
                    vals.append(v)
            vals.append(2.0 ** (emin - m - 1))  # a tie between 0 and the least subnormal
            vals.append(3 * 2.0 ** (emin - m - 1))  # a tie between 1 and 2 quanta
    x = torch.tensor(vals, dtype=torch.float64).to(torch.float32)
    return torch.cat([x, -x])


def _ties(e: int, m: int, count: int, seed: int) -> torch.Tensor:
    """Values exactly half-way between two neighbours of the (e, m) format."""
    gen = np.random.default_rng(seed)
    bias, emin, _ = RefCustomFloatCodec.limits(e, m)
    exps = gen.integers(emin - m - 2, 2**e - 1 - bias + 1, size=count)
    k = gen.integers(0, 2 ** (m + 1), size=count) * 2 + 1  # odd: exactly half a quantum
    v = np.ldexp(k.astype(np.float64), (np.maximum(exps, emin) - m - 1).astype(np.int64))
    v = np.where(np.abs(v) < _MAX32, v, 0.0).astype(np.float32)
    signs = gen.integers(0, 2, size=count) * 2 - 1
    v = (v * signs).astype(np.float32)
    # and their float32 neighbours: a tie plus or minus one unit in the last place
    up = np.nextafter(v, np.float32(np.inf), dtype=np.float32)
    down = np.nextafter(v, np.float32(-np.inf), dtype=np.float32)
    both = np.concatenate([v, up, down])
    both[~np.isfinite(both)] = 0
    return torch.from_numpy(both)


_bits = st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=300)


@st.composite
def tensors(draw: Any) -> torch.Tensor:
    """float32 tensors mixing random bit patterns, specials, ties, small and large scales."""
    parts = [_from_bits(draw(_bits))]
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    n = draw(st.integers(0, 300))
    scale = 2.0 ** draw(st.integers(-140, 120))
    parts.append((torch.randn(n, generator=gen, dtype=torch.float64) * scale).float())
    if draw(st.booleans()):
        sp = _specials()
        keep = torch.rand(len(sp), generator=gen) < 0.3
        parts.append(sp[keep])
    if draw(st.booleans()):
        parts.append(torch.zeros(draw(st.integers(0, 20))))
    x = torch.cat(parts)
    perm = torch.randperm(len(x), generator=gen)
    return x[perm]


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == torch.float64:
        assert torch.equal(a.view(torch.int64), b.view(torch.int64))
    else:
        assert torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _same_encoding(a: EncodedTensor, b: EncodedTensor) -> None:
    assert a.codec == b.codec and a.dtype == b.dtype and a.shape == b.shape
    assert a.params == b.params
    assert a.data == b.data
    assert a.nbytes == b.nbytes


def _outcome(codec: Any, encoded: EncodedTensor) -> Any:
    try:
        return codec.decode(encoded)
    except CompressionError as err:
        return str(err)


def _same_decode(fast: Any, ref: Any, encoded: EncodedTensor) -> None:
    got, want = _outcome(fast, encoded), _outcome(ref, encoded)
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
    else:
        _same_tensor(got, want)


def _outcome_encode(codec: Any, x: torch.Tensor) -> Any:
    try:
        return codec.encode(x)
    except CompressionError as err:
        return str(err)


def _check(fast: Any, ref: Any, x: torch.Tensor) -> EncodedTensor | None:
    got, want = _outcome_encode(fast, x), _outcome_encode(ref, x)
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return None
    _same_encoding(got, want)
    _same_decode(fast, ref, want)
    return want


def _corruptions(encoded: EncodedTensor, seed: int) -> list[EncodedTensor]:
    """Payloads the decoders must treat alike: flipped bytes, random bytes, wrong sizes,
    changed params."""
    gen = np.random.default_rng(seed)
    data = np.frombuffer(encoded.data, dtype=np.uint8).copy()
    out = []
    if len(data):
        flipped = data.copy()
        at = gen.integers(0, len(data), size=min(4, len(data)))
        flipped[at] ^= gen.integers(1, 256, size=len(at)).astype(np.uint8)
        out.append(replace(encoded, data=flipped.tobytes()))
        out.append(replace(encoded, data=gen.integers(0, 256, len(data), dtype=np.uint8).tobytes()))
        last = data.copy()
        last[-1] = 0xFF
        out.append(replace(encoded, data=last.tobytes()))
        out.append(replace(encoded, data=encoded.data[:-1]))
    out.append(replace(encoded, data=encoded.data + b"\x00"))
    for key in [*list(encoded.params), "chunk", "layers"]:
        for value in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 9.0, 24.0, 1.5, -1.0, math.inf):
            params = dict(encoded.params)
            params[key] = value
            out.append(replace(encoded, params=params))
        params = dict(encoded.params)
        params.pop(key, None)
        out.append(replace(encoded, params=params))
    return out


# --------------------------------------------------------------------------- fp8


@settings(max_examples=150)
@given(
    x=tensors(),
    fmt=st.sampled_from(sorted(FP8_FORMATS)),
    chunk=st.sampled_from([0, 1, 3, 7, 64, 4096]),
    double=st.booleans(),
    scale=st.integers(-150, 127),
)
def test_fp8_matches_the_reference(
    x: torch.Tensor, fmt: str, chunk: int, double: bool, scale: int
) -> None:
    if scale % 3 == 0:
        x = (x.double() * 2.0**scale).clamp(-_MAX32, _MAX32).float()
    if double:
        x = x.double() * (1 + 2**-40)
    fast, ref = FP8Codec(fmt, chunk=chunk), RefFP8Codec(fmt, chunk=chunk)
    want = _check(fast, ref, x)
    if want is not None:
        for bad in _corruptions(want, len(x)):
            _same_decode(fast, ref, bad)


@pytest.mark.parametrize("fmt", sorted(FP8_FORMATS))
@pytest.mark.parametrize("chunk", [0, 5, 4096])
def test_fp8_every_byte_and_refusals(fmt: str, chunk: int) -> None:
    fast, ref = FP8Codec(fmt, chunk=chunk), RefFP8Codec(fmt, chunk=chunk)
    n = 256 * 40
    codes = np.tile(np.arange(256, dtype=np.uint8), 40)
    good = ref.encode(torch.randn(n))
    count = len(good.data) - n
    for scale in (1.0, 0.0, 1e-38, 1e-45, 3e36, 3e38, -1.0, math.inf, math.nan):
        scales = np.full(count // 4, scale, dtype="<f4")
        data = codes.tobytes() + scales.tobytes()
        _same_decode(fast, ref, replace(good, data=data))
        fine = codes.copy()
        bad = (fine & 0x7F) == 0x7F if fmt == "e4m3" else (fine & 0x7C) == 0x7C
        fine[bad] = 0
        _same_decode(fast, ref, replace(good, data=fine.tobytes() + scales.tobytes()))
    x = torch.randn(1000)
    for bad in (x * math.inf, x.clone().fill_(math.nan), torch.tensor([1.0, math.inf])):
        _check(fast, ref, bad)
    for n in (0, 1, 4095, 4096, 4097, 10000):
        _check(fast, ref, torch.randn(n) * 1e-3)
        _check(fast, ref, -torch.zeros(n))
    _check(fast, ref, torch.tensor([3e38, -3e38, 1.0]))
    _check(fast, ref, torch.tensor([1e-44, -1e-45, 0.0]))
    _check(fast, ref, torch.randn(3, 5, 7).double())


# --------------------------------------------------------------------------- float

_PAIRS = [(e, m) for e in range(2, 9) for m in range(24)]


@pytest.mark.parametrize(("e", "m"), _PAIRS)
def test_float_every_pair_on_specials_and_ties(e: int, m: int) -> None:
    fast, ref = CustomFloatCodec(e, m), RefCustomFloatCodec(e, m)
    x = torch.cat([_specials(), _ties(e, m, 400, e * 100 + m), torch.randn(77)])
    want = _check(fast, ref, x)
    assert want is not None
    for bad in _corruptions(want, e * 100 + m):
        _same_decode(fast, ref, bad)
    for n in (0, 1, 2, 3, 7, 8, 9, 63, 64, 65):
        _check(fast, ref, torch.randn(n) * 10)
    # every code the width allows (small widths), as a payload
    width = 1 + e + m
    if width <= 12:
        n = 2**width
        codes = np.arange(n, dtype=np.uint64)
        data = _ref_pack(codes, width)
        enc = EncodedTensor(
            codec="float",
            dtype="float32",
            shape=(n,),
            data=data,
            params={"exp_bits": float(e), "man_bits": float(m)},
        )
        _same_decode(fast, ref, enc)


def _ref_pack(codes: np.ndarray, width: int) -> bytes:
    return _pack_bits(codes, width)


@settings(max_examples=300)
@given(
    x=tensors(),
    e=st.integers(2, 8),
    m=st.integers(0, 23),
    double=st.booleans(),
)
def test_float_matches_the_reference(x: torch.Tensor, e: int, m: int, double: bool) -> None:
    if double:
        x = x.double() * (1 + 2**-40)
    fast, ref = CustomFloatCodec(e, m), RefCustomFloatCodec(e, m)
    x = torch.cat([x.to(torch.float32), _ties(e, m, 20, len(x))]).to(x.dtype)
    want = _check(fast, ref, x)
    if want is not None:
        for bad in _corruptions(want, len(x)):
            _same_decode(fast, ref, bad)


@settings(max_examples=80)
@given(
    data=st.data(),
    e=st.integers(2, 8),
    m=st.integers(0, 23),
    summands=st.sampled_from([1, 2, 7]),
    double=st.booleans(),
)
def test_float_aps_matches_the_reference(
    data: Any, e: int, m: int, summands: int, double: bool
) -> None:
    layers = data.draw(st.lists(st.integers(1, 60), min_size=1, max_size=6))
    parts = []
    for i, size in enumerate(layers):
        kind = data.draw(st.sampled_from(["randn", "zeros", "tiny", "huge", "bits"]))
        gen = torch.Generator().manual_seed(i)
        if kind == "randn":
            parts.append(torch.randn(size, generator=gen) * 2.0 ** data.draw(st.integers(-60, 60)))
        elif kind == "zeros":
            parts.append(torch.zeros(size) * (-1) ** i)
        elif kind == "tiny":
            parts.append(torch.randn(size, generator=gen) * 1e-42)
        elif kind == "huge":
            parts.append(torch.randn(size, generator=gen) * 1e37)
        else:
            parts.append(
                _from_bits(
                    data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=size, max_size=size))
                )
            )
    x = torch.cat(parts)
    if double:
        x = x.double()
    fast = CustomFloatCodec(e, m, scaling="aps", layers=layers, summands=summands)
    ref = RefCustomFloatCodec(e, m, scaling="aps", layers=layers, summands=summands)
    for t in (x, x[: max(0, len(x) - 1)], torch.cat([x, x])):  # the model, and not the model
        want = _check(fast, ref, t)
        if want is not None:
            for bad in _corruptions(want, len(t)):
                _same_decode(fast, ref, bad)
            _aps_table_corruptions(fast, ref, want)


def _aps_table_corruptions(fast: Any, ref: Any, encoded: EncodedTensor) -> None:
    count = int(encoded.params["layers"])
    table = np.frombuffer(encoded.data, dtype=_APS_LAYER, count=count).copy()
    rest = encoded.data[count * _APS_LAYER.itemsize :]
    variants = []
    for shift in (APS_MAX_SHIFT, APS_MAX_SHIFT + 1, -APS_MAX_SHIFT - 1, 200, -200, 130, -130):
        t = table.copy()
        t["shift"][-1] = shift
        variants.append(t)
    if count > 1:
        t = table.copy()
        t["numel"][0] += 1
        t["numel"][1] -= 1
        variants.append(t)
        t = table.copy()
        t["numel"][0] += t["numel"][1]
        t["numel"][1] = 0
        variants.append(t)
    t = table.copy()
    t["numel"][0] += 1
    variants.append(t)
    for t in variants:
        _same_decode(fast, ref, replace(encoded, data=t.tobytes() + rest))


def test_float_long_random_tensors() -> None:
    gen = torch.Generator().manual_seed(5)
    for e, m in [
        (4, 3),
        (3, 0),
        (5, 2),
        (5, 10),
        (8, 7),
        (8, 23),
        (2, 5),
        (6, 9),
        (3, 12),
        (7, 20),
    ]:
        x = torch.randn(100_003, generator=gen) * 2.0 ** torch.randint(
            -30, 30, (100_003,), generator=gen
        )
        _check(CustomFloatCodec(e, m), RefCustomFloatCodec(e, m), x)
        bits = torch.randint(-(2**31), 2**31 - 1, (50_001,), generator=gen, dtype=torch.int64)
        _check(
            CustomFloatCodec(e, m), RefCustomFloatCodec(e, m), _from_bits((bits % 2**32).tolist())
        )
        layers = [30_000, 1, 70_002]
        _check(
            CustomFloatCodec(e, m, scaling="aps", layers=layers),
            RefCustomFloatCodec(e, m, scaling="aps", layers=layers),
            x,
        )


# --------------------------------------------------------------------------- s2fp8


@settings(max_examples=150)
@given(x=tensors(), double=st.booleans())
def test_s2fp8_matches_the_reference(x: torch.Tensor, double: bool) -> None:
    if double:
        x = x.double() * (1 + 2**-40)
    fast, ref = S2FP8Codec(), RefS2FP8Codec()
    want = _check(fast, ref, x)
    if want is not None:
        for bad in _corruptions(want, len(x)):
            _same_decode(fast, ref, bad)


@pytest.mark.parametrize("threads", [1, 2])
def test_s2fp8_long_tensors_with_zeros(threads: int) -> None:
    """Long tensors: the decoder's table must reproduce the value-by-value exp2 wherever
    each non-zero byte sits (torch's vectorized loop, or its scalar tail)."""
    fast, ref = S2FP8Codec(), RefS2FP8Codec()
    gen = torch.Generator().manual_seed(11)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n in (1, 15, 16, 17, 100, 1000, 4097, 40_000, 70_001):
            for zeros in (0.0, 0.1, 0.9):
                x = torch.randn(n, generator=gen) * 2.0 ** torch.randint(
                    -12, 12, (n,), generator=gen
                )
                x[torch.rand(n, generator=gen) < zeros] = 0.0
                want = _check(fast, ref, x)
                assert want is not None
                data = np.frombuffer(want.data, dtype=np.uint8).copy()
                for alpha, beta in [(1.7, -3.1), (0.37, 2.2), (12.5, 40.0)]:
                    data[:8] = np.frombuffer(
                        np.array([alpha, beta], dtype="<f4").tobytes(), np.uint8
                    )
                    _same_decode(fast, ref, replace(want, data=data.tobytes()))
    finally:
        torch.set_num_threads(before)


def test_s2fp8_every_byte_and_headers() -> None:
    fast, ref = S2FP8Codec(), RefS2FP8Codec()
    codes = np.tile(np.arange(256, dtype=np.uint8), 9)
    good = ref.encode(torch.randn(len(codes)))
    for alpha, beta in [
        (1.0, 0.0),
        (3.5, -2.0),
        (1e-30, 0.0),
        (0.0, 0.0),
        (-1.0, 0.0),
        (math.inf, 0.0),
        (1.0, math.nan),
        (40.0, 600.0),
        (2.0**40, 1e30),
    ]:
        head = np.array([alpha, beta], dtype="<f4").tobytes()
        for payload in (codes, np.where((codes & 0x7C) == 0x7C, 0, codes).astype(np.uint8)):
            _same_decode(fast, ref, replace(good, data=head + payload.tobytes()))
    for x in (
        torch.zeros(10),
        torch.full((5,), 3.0),
        torch.randn(100_000) * 1e-30,
        torch.tensor([1e-45, -3e38, 0.0]),
    ):
        _check(fast, ref, x)


# --------------------------------------------------------------------------- batched


@pytest.mark.parametrize(
    ("name", "opts"),
    [
        ("fp8", {"format": "e4m3"}),
        ("fp8", {"format": "e5m2", "chunk": 7}),
        ("float", {"exp_bits": 4, "man_bits": 3}),
        ("float", {"exp_bits": 3, "man_bits": 0}),
        ("float", {"exp_bits": 6, "man_bits": 11}),
        ("float", {"exp_bits": 4, "man_bits": 3, "scaling": "aps", "layers": [10, 30, 5]}),
        ("s2fp8", {}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_match_the_reference(name: str, opts: dict[str, Any], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    x = (
        torch.randn(6, 45, generator=gen) * 2.0 ** torch.randint(-20, 20, (6, 45), generator=gen)
    ).to(dtype)
    x[1] = 0
    x[2, :10] = -0.0
    x[3] = _specials()[:45]
    rows = make_row_codec(name, **opts)
    ref: Any
    if name == "fp8":
        ref = RefFP8Codec(opts["format"], chunk=opts.get("chunk", 0))
    elif name == "float":
        ref = RefCustomFloatCodec(
            opts["exp_bits"],
            opts["man_bits"],
            scaling=opts.get("scaling", "none"),
            layers=opts.get("layers", ()),
        )
    else:
        ref = RefS2FP8Codec()
    try:
        want = torch.stack([ref.decode(ref.encode(row)) for row in x])
    except CompressionError as err:
        with pytest.raises(CompressionError) as got_err:
            rows.roundtrip(x, torch.arange(6))
        assert str(got_err.value) == str(err)
        x[3] = torch.randn(45, generator=gen)
        want = torch.stack([ref.decode(ref.encode(row)) for row in x])
    _same_tensor(rows.roundtrip(x, torch.arange(6)), want)
    assert rows.nbytes(45) == ref.nbytes(45)


@pytest.mark.parametrize(
    "codec",
    [
        (FP8Codec("e4m3", chunk=3), RefFP8Codec("e4m3", chunk=3)),
        (CustomFloatCodec(3, 0), RefCustomFloatCodec(3, 0)),
        (CustomFloatCodec(4, 3), RefCustomFloatCodec(4, 3)),
        (CustomFloatCodec(6, 11), RefCustomFloatCodec(6, 11)),
        (CustomFloatCodec(8, 23), RefCustomFloatCodec(8, 23)),
        (
            CustomFloatCodec(5, 2, scaling="aps", layers=[7, 3]),
            RefCustomFloatCodec(5, 2, scaling="aps", layers=[7, 3]),
        ),
        (S2FP8Codec(), RefS2FP8Codec()),
    ],
)
def test_non_contiguous_tensors(codec: Any) -> None:
    fast, ref = codec
    x = torch.randn(10, 7, generator=torch.Generator().manual_seed(2))
    for t in (x.t(), x[:, ::3], x.t()[1], x.double().t()):
        _check(fast, ref, t)
