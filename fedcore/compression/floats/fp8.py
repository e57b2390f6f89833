"""The ``fp8`` codec (e4m3fn or e5m2 bytes, a float32 scale per tensor or chunk), and what
the low-precision float codecs share: the fp8 formats and value tables, the refusal of
non-finite values, the row-by-row round trip."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch

from fedcore.compression.base import Codec
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

FP8_FORMATS: dict[str, tuple[int, torch.dtype]] = {
    "e4m3": (4, torch.float8_e4m3fn),
    "e5m2": (5, torch.float8_e5m2),
}
"""fp8 format name -> (exponent bits, the torch dtype)."""

_BY_EXP = dict(FP8_FORMATS.values())
_F32_TINY = 2.0**-126
_BAD_FP8 = {4: 0x7F, 5: 0x7C}
"""The bits that, all set, make an fp8 byte a NaN (e4m3fn) or an inf/NaN (e5m2)."""


def _not_finite(codec: str) -> CompressionError:
    return CompressionError(
        f"codec {codec!r}: the tensor has non-finite values (inf or NaN), which the "
        "format cannot carry."
    )


def _finite(x: torch.Tensor, codec: str) -> None:
    """Refuse inf and NaN: one min/max pass (NaN propagates through both)."""
    if not _all_finite(x):
        raise _not_finite(codec)


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value is finite: one min/max pass (NaN propagates through both)."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def _bad_fp8(codes: np.ndarray, exp_bits: int) -> bool:
    """Whether any fp8 byte is a NaN (e4m3fn) or an inf/NaN (e5m2) code.

    The masked bits are the largest value the mask lets through exactly when they are
    all set, so one maximum tells."""
    mask = _BAD_FP8[exp_bits]
    return bool(codes.size) and int(np.bitwise_and(codes, mask).max()) == mask


@functools.cache
def _fp8_values(exp_bits: int) -> torch.Tensor:
    """The float32 value of every fp8 byte (NaN and inf codes included, never looked up)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return codes.view(_BY_EXP[exp_bits]).to(torch.float32)


def _index(codes: np.ndarray) -> torch.Tensor:
    """Codes as an int32 index tensor (a copy: the bytes may be read-only)."""
    return torch.from_numpy(codes.astype(np.int32))


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

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values: the payload and the header scalars."""
        return self.wire_bytes(n) + 8 * (2 if self.chunk else 1)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x`` (:func:`_each_row`)."""
        return _each_row(self, x)

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Scale each chunk's largest magnitude to the format's largest finite value, cast."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor).contiguous()
        n = x.numel()
        top = torch.finfo(self.dtype).max
        if n == 0:
            scales = x.new_zeros(self._scales(0))
            codes = b""
        else:
            size = n if self.chunk == 0 else self.chunk
            full, rest = divmod(n, size)
            cut = full * size
            blocks = x[:cut].view(full, size)
            if full == 1:  # one pass for both ends (along a dim, aminmax is slower)
                low, high = torch.aminmax(blocks)
                his, los = [high.reshape(1)], [low.reshape(1)]
            else:
                his = [blocks.amax(dim=1)] if full else []
                los = [blocks.amin(dim=1)] if full else []
            if rest:
                his.append(x[cut:].amax(dim=0, keepdim=True))
                los.append(x[cut:].amin(dim=0, keepdim=True))
            hi, lo = torch.cat(his), torch.cat(los)
            if not bool((torch.isfinite(hi) & torch.isfinite(lo)).all()):
                raise _not_finite(self.name)
            peak = torch.maximum(lo.neg(), hi).abs()  # max |x| per block; abs: +0, not -0
            scales = peak / top  # float32
            safe = torch.where(scales > 0, scales, torch.ones_like(scales))
            y = torch.empty_like(x)
            if full:
                torch.div(blocks, safe[:full, None], out=y[:cut].view(full, size))
            if rest:
                torch.div(x[cut:], safe[full], out=y[cut:])
            if not bool(((scales == 0) | (scales >= _F32_TINY)).all()):
                # A normal scale keeps |y| within two float32 steps of the top, which the
                # cast rounds to the top; a subnormal one (peak < top * 2**-126) may not.
                y.clamp_(-top, top)
            codes = y.to(self.dtype).view(torch.uint8).numpy().tobytes()
        data = codes + scales.numpy().astype("<f4").tobytes()
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
        table = _fp8_values(exp_bits)
        if count == 1:  # one scale: scale the 256 values once, then look every byte up
            values = torch.index_select(table * scales[0], 0, _index(codes))
        else:
            if exp_bits == 5:  # torch's e5m2 -> float32 cast is fast; e4m3fn's is not
                values = torch.from_numpy(codes.copy()).view(_BY_EXP[5]).to(torch.float32)
            else:
                values = torch.index_select(table, 0, _index(codes))
            size = chunk
            cut = n - n % size
            values[:cut].view(-1, size).mul_(scales[: cut // size, None])
            if cut < n:
                values[cut:].mul_(scales[-1])
        # |value| <= top, so a value overflows only where top * its scale does.
        top = torch.finfo(_BY_EXP[exp_bits]).max
        if not bool(torch.isfinite(scales * top).all()) and not bool(torch.isfinite(values).all()):
            raise CompressionError("codec 'fp8': a scale times its values overflows float32.")
        return _restore(values, encoded)


def _each_row(codec: Codec, x: torch.Tensor) -> torch.Tensor:
    """``codec.decode(codec.encode(row))`` of every row of ``x``, on the CPU: for a
    deterministic codec that is its whole round trip, bit for bit."""
    out = torch.stack([codec.decode(codec.encode(row)) for row in x.detach().to(_CPU)])
    return out.to(x.device)
