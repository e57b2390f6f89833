"""The ``s2fp8`` codec (Cambier et al., ICLR 2020): shifted and squeezed e5m2 bytes, with
the 256-entry decoding tables where torch's vectorized and scalar ``log2``/``exp2``
agree."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch

from fedcore.compression.floats.fp8 import _all_finite, _bad_fp8, _each_row, _finite, _index
from fedcore.compression.wire import _dtype_name, _expect, _flat, _numel, _restore
from fedcore.errors import CompressionError
from fedcore.gradients.blas import REDUCE_GRAIN
from fedcore.messages import EncodedTensor

_MAX_ALPHA = 2.0**40  # nearly equal magnitudes: a bounded squeeze keeps beta finite
_E5M2_TINY = 2.0**-16
"""e5m2's least subnormal: s2fp8 sends a non-zero value at least this large."""


def _s2fp8_magnitudes(mag: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """``2**((log2 mag - beta) / alpha)`` of positive float64 magnitudes."""
    return torch.exp2((torch.log2(mag) - beta) / alpha)


def _scalar_loop(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a strided view: torch's CPU kernels run their scalar loop on it."""
    return torch.stack([t, t], dim=1).reshape(-1)[::2]


@functools.cache
def _exp2_block() -> int | None:
    """How torch's CPU ``exp2`` splits a contiguous float64 tensor of ``k`` values: the
    first ``k - k % block`` by the vectorized loop, the last ``k % block`` by the scalar
    one (found by probing an input where the two differ); None if not seen."""
    probe = torch.linspace(0.1, 15.9, 1 << 14, dtype=torch.float64)
    differ = torch.nonzero(torch.exp2(probe) != torch.exp2(_scalar_loop(probe)))
    if len(differ) == 0:
        return None
    d = probe[int(differ[0])]
    scalar = torch.exp2(_scalar_loop(d.repeat(2)))[0]
    for block in (2, 4, 8, 16, 32, 64):
        if all(
            torch.equal(
                torch.exp2(d.repeat(k)) == scalar,
                torch.arange(k) >= k - k % block,
            )
            for k in range(1, 3 * block + 2)
        ):
            return block
    return None


@functools.lru_cache(maxsize=16)
def _s2fp8_tables(alpha: float, beta: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The decoded float32 value of every e5m2 byte (inf/NaN bytes: 0) by torch's
    vectorized and by its scalar ``exp2`` loop; None where the two ``log2`` loops differ."""
    y = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e5m2)
    y = y.to(torch.float64)
    mag = y.abs()
    usable = torch.isfinite(mag) & (mag > 0)
    safe = torch.where(usable, mag, torch.ones_like(mag))
    logs = torch.log2(safe)  # contiguous, 256 values: the vectorized loop
    if not torch.equal(logs, torch.log2(_scalar_loop(safe))):
        return None
    inner = (logs - beta) / alpha
    tables = []
    for out in (torch.exp2(inner), torch.exp2(_scalar_loop(inner))):
        out = torch.where(usable, out, torch.zeros_like(out))
        tables.append(torch.where(torch.signbit(y), -out, out).to(torch.float32))
    return tables[0], tables[1]


def _s2fp8_lookup(codes: np.ndarray, alpha: float, beta: float) -> torch.Tensor | None:
    """The value-by-value decode of ``codes`` by table, or None where it cannot be sure.

    The value-by-value decode runs ``exp2`` over the ``k`` non-zero bytes in order, and
    torch's vectorized and scalar loops may differ in the last bit: the last
    ``k % block`` of them take the scalar loop's values (on one thread, or below the
    grain, where the loop is not split among threads)."""
    tables = _s2fp8_tables(alpha, beta)
    if tables is None:
        return None
    vec, sca = tables
    values = torch.index_select(vec, 0, _index(codes))
    if torch.equal(vec, sca):
        return values
    block = _exp2_block()
    nonzero = np.bitwise_and(codes, 0x7F)
    k = int(np.count_nonzero(nonzero))
    if block is None or (k >= REDUCE_GRAIN and torch.get_num_threads() > 1):
        return None
    tail = k % block
    if tail:
        window = 64
        while True:
            at = np.flatnonzero(nonzero[-window:])
            if len(at) >= tail or window >= len(codes):
                break
            window *= 4
        at = at[-tail:] + (len(codes) - len(nonzero[-window:]))
        index = torch.from_numpy(at.astype(np.int64))
        values[index] = sca[torch.from_numpy(codes[at].astype(np.int64))]
    return values


class S2FP8Codec:
    """Shifted and squeezed fp8: per tensor ``(alpha, beta)`` and e5m2 values."""

    name = "s2fp8"

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values: alpha and beta, then a byte each."""
        return 8 + n

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (no header scalars)."""
        return self.wire_bytes(n)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x`` (:func:`_each_row`)."""
        return _each_row(self, x)

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Shift and squeeze ``log2|x|`` to mean 0 and max 15, cast to e5m2."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        _finite(x, self.name)
        a = x.abs().to(torch.float64)
        nonzero = a > 0
        dense = bool(nonzero.all())  # then a[nonzero] is a itself: skip the masks
        logs = torch.log2(a) if dense else torch.log2(a[nonzero])
        alpha, beta = 1.0, 0.0
        if logs.numel():
            mu, top = float(logs.mean()), float(logs.max())
            alpha = float(np.float32(min(15.0 / (top - mu), _MAX_ALPHA))) if top > mu else 1.0
            beta = float(np.float32(-alpha * mu))
        top8 = torch.finfo(torch.float8_e5m2).max
        if dense:
            shifted = torch.exp2(logs.mul_(alpha).add_(beta)).clamp_(_E5M2_TINY, top8)
            y = torch.copysign(shifted.to(torch.float32), x)
        else:
            shifted = torch.zeros_like(a)
            shifted[nonzero] = torch.exp2(alpha * logs + beta)
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
        values = _s2fp8_lookup(codes, alpha, beta)
        if values is not None:  # finite tables give finite values
            tables = _s2fp8_tables(alpha, beta) or ()
            check = not all(bool(torch.isfinite(t).all()) for t in tables)
        else:
            y = torch.from_numpy(codes.copy()).view(torch.float8_e5m2).to(torch.float64)
            mag = y.abs()
            nonzero = mag > 0
            out = torch.zeros_like(mag)
            out[nonzero] = _s2fp8_magnitudes(mag[nonzero], alpha, beta)
            values = torch.where(torch.signbit(y), -out, out).to(torch.float32)
            check = True
        if check and not _all_finite(values):
            raise CompressionError("codec 's2fp8': alpha and beta decode to non-finite values.")
        return _restore(values, encoded)
