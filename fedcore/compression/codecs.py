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

__all__ = ["CastCodec", "QSGDCodec", "RandKCodec", "SignCodec", "TopKCodec"]

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

    With ``s = 2**(bits-1) - 1`` levels a side, ``x_i`` becomes ``norm * sign(x_i) * l_i / s``
    where ``l_i`` rounds ``s |x_i| / norm`` up or down at random so that the expectation is
    exact (unbiased). Each value travels as ``l_i * sign + s`` in ``bits`` bits, packed
    ``8 // bits`` to a byte; the L2 norm travels as a parameter.
    """

    name = "qsgd"
    BITS = (2, 4, 8)

    def __init__(self, bits: int = 8, *, generator: torch.Generator | None = None) -> None:
        """Quantize to ``bits`` (2, 4 or 8) using ``generator`` for the rounding."""
        if bits not in self.BITS:
            raise CompressionError(f"qsgd bits must be one of {self.BITS}, got {bits}.")
        self.bits = bits
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values."""
        return (n * self.bits + 7) // 8

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Quantize stochastically and pack."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        s = 2 ** (self.bits - 1) - 1
        norm = float(torch.linalg.vector_norm(x.to(torch.float64)))
        if norm > 0:
            scaled = x.abs() * (s / norm)
            low = scaled.floor()
            up = torch.rand(x.shape, generator=self.generator) < (scaled - low)
            levels = (low + up.to(low.dtype)).clamp_(max=s) * torch.sign(x)
        else:
            levels = torch.zeros_like(x)
        codes = (levels + s).to(torch.uint8).numpy()
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=_pack(codes, self.bits),
            params={"bits": float(self.bits), "norm": norm},
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Unpack the levels and rescale by the norm."""
        n = _numel(encoded, self.name)
        bits = int(_param(encoded, "bits", self.name))
        if bits not in self.BITS or _param(encoded, "bits", self.name) != bits:
            raise CompressionError(f"codec 'qsgd': bit width {encoded.params['bits']} is absurd.")
        norm = _param(encoded, "norm", self.name)
        if norm < 0:
            raise CompressionError(f"codec 'qsgd': negative norm {norm}.")
        _expect(encoded, (n * bits + 7) // 8, self.name)
        s = 2 ** (bits - 1) - 1
        codes = _unpack(encoded.data, bits, n)
        if codes.size and int(codes.max()) > 2 * s:
            raise CompressionError(f"codec 'qsgd': a level exceeds the {2 * s + 1} allowed.")
        levels = torch.from_numpy(codes.astype(np.float32)) - s
        return _restore(levels * (norm / s), encoded)


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
        """Pack the signs; compute the scale(s)."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        bits = np.packbits((x >= 0).numpy(), bitorder="little").tobytes()
        n = x.numel()
        if self.chunk == 0:
            scale = float(x.abs().mean()) if n else 0.0
            return EncodedTensor(
                codec=self.name,
                dtype=dtype,
                shape=tuple(tensor.shape),
                data=bits,
                params={"scale": scale},
            )
        pad = -n % self.chunk
        padded = torch.cat([x.abs(), x.new_zeros(pad)]).reshape(-1, self.chunk)
        counts = torch.full((padded.shape[0],), float(self.chunk))
        if pad:
            counts[-1] = self.chunk - pad
        scales = (padded.sum(dim=1) / counts).numpy().astype("<f4")
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=bits + scales.tobytes(),
            params={"chunk": float(self.chunk)},
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
        values = torch.from_numpy(signs.astype(np.float32) * 2 - 1)
        if chunk == 0:
            scale = _param(encoded, "scale", self.name)
            values *= scale
        else:
            scales = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4", offset=nbits).copy())
            if not bool(torch.isfinite(scales).all()):
                raise CompressionError("codec 'sign': a chunk scale is not finite.")
            values *= scales.repeat_interleave(chunk)[:n]
        return _restore(values, encoded)


def _keep(ratio: float, n: int) -> int:
    """Elements kept out of ``n`` at ``ratio`` (the fraction kept): at least 1 if n > 0."""
    return 0 if n == 0 else min(n, max(1, math.ceil(ratio * n)))


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
        """Select exactly the k largest magnitudes (ties by ``torch.topk``), sorted by index."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        k = _keep(self.ratio, x.numel())
        idx = torch.topk(x.abs(), k, sorted=False).indices.sort().values if k else x.new_zeros(0)
        idx = idx.to(torch.int64)
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
        values = np.frombuffer(encoded.data, dtype="<f4", count=k, offset=4 * k)
        out = torch.zeros(n, dtype=torch.float32)
        out[torch.from_numpy(idx)] = torch.from_numpy(values.copy())
        return _restore(out, encoded)


class RandKCodec:
    """Random-k sparsification, unbiased: k random values scaled by ``n / k``.

    The indices are ``randperm(n)[:k]`` of a generator seeded with the ``seed`` parameter,
    which the receiver regenerates: the wire carries the seed instead of the indices.
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
        return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k]

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Draw a seed, select its k indices, scale the values by ``n / k``."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        n = x.numel()
        k = _keep(self.ratio, n)
        # Below 2**53 a seed survives the float64 parameter exactly.
        seed = int(torch.randint(0, 2**53, (1,), generator=self.generator))
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
        out = torch.zeros(n, dtype=torch.float32)
        if k:
            values = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4").copy())
            out[self._indices(seed, n, k)] = values
        return _restore(out, encoded)
