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
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor

_CPU = torch.device("cpu")
"""Per-message codecs and per-node generators work on the host."""

__all__ = ["CastCodec", "QSGDCodec", "RandKCodec", "SignCodec", "TopKCodec", "topk_indices"]

_FLOAT_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_MAX_ELEMENTS = 1 << 34  # far above any model; stops absurd shapes before allocation


def _dtype_name(tensor: torch.Tensor, codec: str) -> str:
    for name, dtype in _FLOAT_DTYPES.items():
        if tensor.dtype == dtype:
            return name
    raise CompressionError(f"codec {codec!r} encodes float32 or float64, not {tensor.dtype}.")


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).to(torch.float32)


def _numel(encoded: EncodedTensor, codec: str) -> int:
    """Check the header common to every codec; return the element count."""
    if encoded.codec != codec:
        raise CompressionError(
            f"codec {codec!r} was handed a tensor encoded with {encoded.codec!r}."
        )
    if encoded.dtype not in _FLOAT_DTYPES:
        raise CompressionError(f"codec {codec!r}: unknown dtype {encoded.dtype!r}.")
    if any(not isinstance(d, int) or d < 0 for d in encoded.shape):
        raise CompressionError(f"codec {codec!r}: invalid shape {encoded.shape}.")
    n = math.prod(encoded.shape)
    if n > _MAX_ELEMENTS:
        raise CompressionError(f"codec {codec!r}: shape {encoded.shape} is absurdly large.")
    return n


def _param(encoded: EncodedTensor, key: str, codec: str) -> float:
    value = encoded.params.get(key)
    if value is None or not math.isfinite(value):
        raise CompressionError(f"codec {codec!r}: parameter {key!r} is missing or not finite.")
    return float(value)


def _int_param(encoded: EncodedTensor, key: str, codec: str, low: int, high: int) -> int:
    value = _param(encoded, key, codec)
    if value != int(value) or not low <= value <= high:
        raise CompressionError(
            f"codec {codec!r}: parameter {key}={value} must be an integer in [{low}, {high}]."
        )
    return int(value)


def _expect(encoded: EncodedTensor, size: int, codec: str) -> None:
    if len(encoded.data) != size:
        raise CompressionError(
            f"codec {codec!r}: a tensor of shape {encoded.shape} needs {size} bytes but "
            f"{len(encoded.data)} arrived (truncated or corrupt data)."
        )


def _restore(values: torch.Tensor, encoded: EncodedTensor) -> torch.Tensor:
    return values.to(_FLOAT_DTYPES[encoded.dtype]).reshape(encoded.shape)


class CastCodec:
    """Plain float casts: ``fp32``, ``fp16`` or ``bf16`` values, little-endian."""

    _WIRE: ClassVar[dict[str, int]] = {"fp32": 4, "fp16": 2, "bf16": 2}

    def __init__(self, name: str = "fp32") -> None:
        """Pick the wire format by codec name."""
        if name not in self._WIRE:
            raise CompressionError(f"no cast codec {name!r}; use one of {sorted(self._WIRE)}.")
        self.name = name

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values."""
        return self._WIRE[self.name] * n

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Cast and copy the values out."""
        dtype = _dtype_name(tensor, self.name)
        x = tensor.detach().reshape(-1)
        if self.name == "fp32":
            data = x.to(torch.float32).numpy().astype("<f4", copy=False).tobytes()
        elif self.name == "fp16":
            data = x.to(torch.float16).numpy().astype("<f2", copy=False).tobytes()
        else:  # bfloat16 has no numpy dtype: ship its 16 bits as int16
            data = (
                x.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2", copy=False).tobytes()
            )
        return EncodedTensor(codec=self.name, dtype=dtype, shape=tuple(tensor.shape), data=data)

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Read the values back into the original dtype and shape."""
        n = _numel(encoded, self.name)
        _expect(encoded, self.wire_bytes(n), self.name)
        if self.name == "fp32":
            values = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4").copy())
        elif self.name == "fp16":
            values = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f2").copy())
        else:
            bits = torch.from_numpy(np.frombuffer(encoded.data, dtype="<i2").copy())
            values = bits.view(torch.bfloat16)
        return _restore(values, encoded)


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

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Quantize stochastically and pack.

        Stochastic rounding of ``y = s x / norm`` is ``floor(y + u)`` with ``u`` uniform in
        [0, 1): it rounds up with probability ``frac(y)``, the same distribution as rounding
        ``|y|`` and restoring the sign, in one fused pass. The code is ``floor(y + s + u)``.
        """
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        n = x.numel()
        s = 2 ** (self.bits - 1) - 1
        if self.chunk == 0:
            norms = torch.linalg.vector_norm(x).reshape(1)
            per_value = norms.expand(n)
        else:
            chunk = min(self.chunk, max(n, 1))  # the same buckets; no giant padding
            pad = -n % chunk
            buckets = torch.cat([x, x.new_zeros(pad)]).reshape(-1, chunk)
            norms = torch.linalg.vector_norm(buckets, dim=1)
            per_value = norms.repeat_interleave(chunk)[:n]
        if not bool(torch.isfinite(norms).all()):
            raise CompressionError(
                "codec 'qsgd': a norm of the tensor is not finite (values not finite, or so "
                "large that their squares overflow float32)."
            )
        shifted = torch.rand(n, generator=self.generator, device=_CPU)
        shifted.addcdiv_(x, per_value.clamp(min=torch.finfo(torch.float32).tiny), value=s)
        codes = shifted.add_(s).clamp_(0, 2 * s).to(torch.uint8).numpy()  # truncation: floor
        if self.scaled:
            norms = norms / (1 + self.omega(n))
        data = _pack(codes, self.bits)
        params = {"bits": float(self.bits)}
        if self.chunk == 0:
            params["norm"] = float(norms[0])
        else:
            data += norms.numpy().astype("<f4").tobytes()
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
        values = torch.from_numpy(codes).to(torch.float32).sub_(s)
        if chunk == 0:
            norm = _param(encoded, "norm", self.name)
            if norm < 0:
                raise CompressionError(f"codec 'qsgd': negative norm {norm}.")
            values.mul_(norm / s)
        else:
            norms = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4", offset=ncodes).copy())
            if not bool((torch.isfinite(norms) & (norms >= 0)).all()):
                raise CompressionError("codec 'qsgd': a bucket norm is negative or not finite.")
            cut = n - n % chunk  # scale views in place: no per-value copy of the norms
            values[:cut].view(-1, chunk).mul_(norms[: cut // chunk, None])
            if cut < n:
                values[cut:].mul_(norms[-1])
            values.div_(s)
        return _restore(values, encoded)


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


def _unpack(data: bytes, bits: int, n: int) -> np.ndarray:
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

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Pack the signs; compute the scale(s) as L1 norms, with no temporary copies."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        bits = np.packbits((x >= 0).numpy(), bitorder="little").tobytes()
        n = x.numel()
        if self.chunk == 0:
            scale = float(torch.linalg.vector_norm(x, ord=1)) / n if n else 0.0
            return EncodedTensor(
                codec=self.name,
                dtype=dtype,
                shape=tuple(tensor.shape),
                data=bits,
                params={"scale": scale},
            )
        cut = n - n % self.chunk
        scales = torch.linalg.vector_norm(x[:cut].view(-1, self.chunk), ord=1, dim=1)
        scales /= self.chunk
        if cut < n:
            scales = torch.cat([scales, x[cut:].abs().mean().reshape(1)])
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=bits + scales.numpy().astype("<f4").tobytes(),
            params={"chunk": float(self.chunk)},
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Expand the bits to ``±scale``, in place."""
        n = _numel(encoded, self.name)
        chunked = "chunk" in encoded.params  # absent: one scale for the whole tensor
        chunk = _int_param(encoded, "chunk", self.name, 1, 1 << 40) if chunked else 0
        nbits = (n + 7) // 8
        scales_count = 0 if chunk == 0 else -(-n // chunk)
        _expect(encoded, nbits + 4 * scales_count, self.name)
        signs = np.unpackbits(
            np.frombuffer(encoded.data, dtype=np.uint8, count=nbits), count=n, bitorder="little"
        )
        values = torch.from_numpy(signs).to(torch.float32)
        if chunk == 0:
            scale = _param(encoded, "scale", self.name)
            if scale < 0:
                raise CompressionError(f"codec 'sign': negative scale {scale}.")
            values.mul_(2 * scale).sub_(scale)
            return _restore(values, encoded)
        scales = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4", offset=nbits).copy())
        if not bool((torch.isfinite(scales) & (scales >= 0)).all()):
            raise CompressionError("codec 'sign': a chunk scale is negative or not finite.")
        values.mul_(2).sub_(1)
        cut = n - n % chunk
        values[:cut].view(-1, chunk).mul_(scales[: cut // chunk, None])
        if cut < n:
            values[cut:].mul_(scales[-1])
        return _restore(values, encoded)


def _keep(ratio: float, n: int) -> int:
    """Elements kept out of ``n`` at ``ratio`` (the fraction kept): at least 1 if n > 0."""
    return 0 if n == 0 else min(n, max(1, math.ceil(ratio * n)))


_TOPK_SAMPLE = 1 << 16  # magnitudes sampled to estimate the k-th largest


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (sorted) of the ``k`` largest magnitudes of ``x``: exact, faster than topk.

    ``torch.topk`` over millions of values is slow on a CPU. This samples magnitudes to set a
    threshold low enough that, with high probability, at least ``k`` values pass it, then
    runs ``topk`` on those candidates only. The candidates hold the k largest whenever there
    are at least k of them, so the result is exact (ties aside); if too few pass, the margin
    doubles, then a full ``topk`` runs. The sample's generator is seeded by the size, so the
    result never depends on a random draw.
    """
    n = x.numel()
    a = x.abs()
    expect = _TOPK_SAMPLE * k / n  # sampled values expected above the true k-th magnitude
    if expect >= 8 and n >= 4 * _TOPK_SAMPLE:
        gen = torch.Generator().manual_seed(n)
        for sigmas in (4.0, 8.0):
            kept = min(_TOPK_SAMPLE, math.ceil(expect + sigmas * math.sqrt(expect)))
            sample = a[torch.randint(0, n, (_TOPK_SAMPLE,), generator=gen, device=_CPU)]
            threshold = torch.topk(sample, kept, sorted=False).values.min()
            candidates = torch.nonzero(a >= threshold).squeeze(1)  # sorted
            if candidates.numel() >= k:
                pick = torch.topk(a[candidates], k, sorted=False).indices.sort().values
                return candidates[pick]
    return torch.topk(a, k, sorted=False).indices.sort().values


def _check_ratio(ratio: float, codec: str) -> None:
    if not 0 < ratio <= 1:
        raise CompressionError(f"{codec} ratio (the fraction kept) must be in (0, 1], got {ratio}.")


class TopKCodec:
    """Top-k sparsification: the ``k`` largest magnitudes, as uint32 indices then float32 values."""

    name = "topk"

    def __init__(self, ratio: float = 0.01) -> None:
        """Keep ``ceil(ratio * n)`` values (at least one)."""
        _check_ratio(ratio, self.name)
        self.ratio = ratio

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values."""
        return 8 * _keep(self.ratio, n)

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Select exactly the k largest magnitudes (:func:`topk_indices`), sorted by index."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        k = _keep(self.ratio, x.numel())
        idx = topk_indices(x, k) if k else torch.zeros(0, dtype=torch.int64, device=_CPU)
        data = idx.numpy().astype("<u4").tobytes() + x[idx].numpy().astype("<f4").tobytes()
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=data,
            params={"k": float(k)},
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Scatter the values into zeros."""
        n = _numel(encoded, self.name)
        k = _int_param(encoded, "k", self.name, 0, n)
        _expect(encoded, 8 * k, self.name)
        idx = np.frombuffer(encoded.data, dtype="<u4", count=k).astype(np.int64)
        if k and int(idx.max()) >= n:
            raise CompressionError(f"codec 'topk': an index exceeds the {n} elements.")
        if k > 1 and bool((np.diff(idx) <= 0).any()):
            raise CompressionError("codec 'topk': indices must be strictly increasing.")
        values = np.frombuffer(encoded.data, dtype="<f4", count=k, offset=4 * k)
        out = torch.zeros(n, dtype=torch.float32, device=_CPU)
        out[torch.from_numpy(idx)] = torch.from_numpy(values.copy())
        return _restore(out, encoded)


class RandKCodec:
    """Random-k sparsification, unbiased: k random values scaled by ``n / k``.

    The indices are a uniform k-subset drawn by a generator seeded with the ``seed``
    parameter, which the receiver regenerates: the wire carries the seed instead of the
    indices.
    """

    name = "randk"

    def __init__(self, ratio: float = 0.01, *, generator: torch.Generator | None = None) -> None:
        """Keep ``ceil(ratio * n)`` values, drawing each message's seed from ``generator``."""
        _check_ratio(ratio, self.name)
        self.ratio = ratio
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values."""
        return 4 * _keep(self.ratio, n)

    @staticmethod
    def _indices(seed: int, n: int, k: int) -> torch.Tensor:
        """A uniform k-subset of range(n), a function of ``seed`` alone.

        For small ``k`` it costs O(k log k), not ``randperm(n)``'s O(n) (a second for 16M):
        the distinct values of ``k + k/8 + 16`` uniform draws are a uniform random subset
        of their size, and a random ``k`` of those a uniform k-subset.
        """
        gen = torch.Generator().manual_seed(seed)
        if 4 * k > n:
            return torch.randperm(n, generator=gen, device=_CPU)[:k]
        while True:
            draws: torch.Tensor = torch.unique(
                torch.randint(0, n, (k + k // 8 + 16,), generator=gen, device=_CPU)
            )
            if draws.numel() >= k:
                return draws[torch.randperm(draws.numel(), generator=gen, device=_CPU)[:k]]

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Draw a seed, select its k indices, scale the values by ``n / k``."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        n = x.numel()
        k = _keep(self.ratio, n)
        # Below 2**53 a seed survives the float64 parameter exactly.
        seed = int(torch.randint(0, 2**53, (1,), generator=self.generator, device=_CPU))
        values = x[self._indices(seed, n, k)] * (n / k) if k else x.new_zeros(0)
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=values.numpy().astype("<f4").tobytes(),
            params={"k": float(k), "seed": float(seed)},
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Regenerate the indices from the seed and scatter the values."""
        n = _numel(encoded, self.name)
        k = _int_param(encoded, "k", self.name, 0, n)
        seed = _int_param(encoded, "seed", self.name, 0, 2**53)
        _expect(encoded, 4 * k, self.name)
        out = torch.zeros(n, dtype=torch.float32, device=_CPU)
        if k:
            values = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4").copy())
            out[self._indices(seed, n, k)] = values
        return _restore(out, encoded)
