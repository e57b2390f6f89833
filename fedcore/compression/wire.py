"""What every codec shares: the checks of an encoded tensor's wire header and the rows
codecs compute on.

An :class:`~fedcore.messages.EncodedTensor` says its codec, dtype (float32 or float64),
shape and parameters beside its payload; :func:`_numel`, :func:`_param`,
:func:`_int_param` and :func:`_expect` check each against what the decoder needs and
raise :class:`~fedcore.errors.CompressionError` on any mismatch, before anything is
allocated. :func:`_rows` and :func:`_const` are the float32 rows and 0-dim operands the
codecs' arithmetic runs on (see :mod:`fedcore.compression.codecs`). Every codec module
(:mod:`~fedcore.compression.codecs`, :mod:`~fedcore.compression.sparse`,
:mod:`~fedcore.compression.floats`) imports them from here.
"""

from __future__ import annotations

import functools
import math

import torch

from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor

__all__: list[str] = []  # the codec modules' own helpers, no API

_CPU = torch.device("cpu")
"""Per-message codecs and per-node generators work on the host."""

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


def _rows(x: torch.Tensor) -> torch.Tensor:
    """Rows as the codecs compute on them: detached, float32, contiguous."""
    return x.detach().to(torch.float32).contiguous()


@functools.lru_cache(maxsize=256)
def _const(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-dim operand on the device: ops with it round as on the CPU (no reciprocal).
    Kept: operands are never written to."""
    return torch.tensor(value, dtype=dtype, device=device)
