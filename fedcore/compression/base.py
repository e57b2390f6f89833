"""The codec protocols and the lossless ``raw`` codec."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor

__all__ = ["Codec", "RawCodec", "RowsCodec"]

# Wire dtype names -> (torch dtype, numpy dtype). Little-endian on every platform we run.
_DTYPES: dict[str, tuple[torch.dtype, np.dtype[np.generic]]] = {
    "float32": (torch.float32, np.dtype("<f4")),
    "float64": (torch.float64, np.dtype("<f8")),
    "int64": (torch.int64, np.dtype("<i8")),
}

_NAMES = {torch_dtype: name for name, (torch_dtype, _) in _DTYPES.items()}


class Codec(Protocol):
    """Encodes tensors into packed bytes and decodes them back."""

    name: str

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Return the bytes (and header) a wire carries for ``tensor``."""
        ...

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Return the tensor ``encoded`` stands for; raise CompressionError on bad bytes."""
        ...


class RowsCodec(Codec, Protocol):
    """A codec whose arithmetic runs over the rows of a matrix, each row one message:
    every built-in codec, and what the vectorized engine needs of one."""

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """Return ``EncodedTensor.nbytes`` for ``n`` values of ``dtype``: the payload
        plus 8 bytes per header scalar."""
        ...

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """Return ``decode(encode(row))`` of every row of ``[m, n]`` float ``x``, on its
        device and in its dtype; a stochastic codec draws for row ``r`` from
        ``generators[r]``, as its own generator would for that message."""
        ...


class RawCodec:
    """Lossless codec: the tensor's own little-endian bytes, dtype kept.

    >>> codec = RawCodec()
    >>> t = torch.arange(3, dtype=torch.float32)
    >>> torch.equal(codec.decode(codec.encode(t)), t)
    True
    """

    name = "raw"

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Copy ``tensor``'s bytes out (a snapshot: later in-place changes do not leak)."""
        dtype = _NAMES.get(tensor.dtype)
        if dtype is None:
            raise CompressionError(
                f"codec 'raw' cannot encode dtype {tensor.dtype}; use one of {sorted(_DTYPES)}."
            )
        data = tensor.detach().cpu().numpy().tobytes()  # tobytes() copies in C order
        return EncodedTensor(codec=self.name, dtype=dtype, shape=tuple(tensor.shape), data=data)

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values of ``dtype`` (its own bytes)."""
        return n * dtype.itemsize

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """A copy of ``x``: the codec is lossless."""
        return x.detach().clone()

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Rebuild the tensor, checking codec, dtype, shape and byte count."""
        array = self._array(encoded)
        data = encoded.data
        owned = isinstance(data, memoryview) and not data.readonly
        if owned and array.ctypes.data % array.dtype.itemsize == 0:
            # A received message's own buffer (a writable memoryview, see EncodedTensor):
            # the tensor views it, no copy; inbox tensors are read-only to algorithms.
            return torch.from_numpy(array)
        # Copy: frombuffer views immutable bytes (or misaligned ones); the receiver owns a
        # writable tensor.
        return torch.from_numpy(array.copy())

    def view(self, encoded: EncodedTensor) -> torch.Tensor:
        """:meth:`decode` without a copy wherever the bytes are aligned, the sender's
        immutable ``bytes`` included: for receivers that only read the tensor (those of
        :class:`~fedcore.node.DecodeCache`, which share one tensor anyway), so that a sent
        model and what its receivers decode are one buffer, not two. The same checks and
        the same values as :meth:`decode`."""
        array = self._array(encoded)
        if len(encoded.data) < _VIEW_FROM or array.ctypes.data % array.dtype.itemsize:
            return self.decode(encoded)  # small: a copy costs less than the warning filter
        with warnings.catch_warnings():
            # torch warns that the array is not writable: nothing writes it.
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)

    def _array(self, encoded: EncodedTensor) -> np.ndarray[tuple[int, ...], np.dtype[np.generic]]:
        """``encoded``'s values as an array over its bytes, after every check."""
        if encoded.codec != self.name:
            raise CompressionError(
                f"codec 'raw' was handed a tensor encoded with {encoded.codec!r}."
            )
        if encoded.dtype not in _DTYPES:
            raise CompressionError(
                f"unknown dtype {encoded.dtype!r} in a 'raw' tensor; expected one of "
                f"{sorted(_DTYPES)}."
            )
        if any(d < 0 for d in encoded.shape):
            raise CompressionError(f"negative dimension in shape {encoded.shape}.")
        _, np_dtype = _DTYPES[encoded.dtype]
        expected = math.prod(encoded.shape) * np_dtype.itemsize
        if len(encoded.data) != expected:
            raise CompressionError(
                f"a 'raw' {encoded.dtype} tensor of shape {encoded.shape} needs {expected} "
                f"bytes but {len(encoded.data)} arrived (truncated or corrupt data)."
            )
        return np.frombuffer(encoded.data, dtype=np_dtype).reshape(encoded.shape)


_VIEW_FROM = 1 << 16
"""Bytes from which :meth:`RawCodec.view` views rather than copies."""
