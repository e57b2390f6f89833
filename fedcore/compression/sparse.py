"""Sparsifying codecs: ``topk`` (the ``k`` largest magnitudes, indices and values on the
wire) and ``randk`` (``k`` random values scaled by ``n / k``; the wire carries the seed
of the index draw, not the indices).

They follow the conventions of :mod:`fedcore.compression.codecs` (one arithmetic over the
rows of an ``[m, n]`` matrix, exact wire sizes, header checks from
:mod:`fedcore.compression.wire`). :func:`topk_indices` is the exact, sampled-threshold
selection ``topk`` uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
    _restore,
    _rows,
)
from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor

__all__ = ["RandKCodec", "TopKCodec", "topk_indices"]


def _scatter(n: int, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[m, n]`` zeros with ``values[r]`` at ``idx[r]`` in row ``r`` (float32)."""
    out = torch.zeros(idx.shape[0], n, dtype=torch.float32, device=values.device)
    return out.scatter_(1, idx, values)


def _keep(ratio: float, n: int) -> int:
    """Elements kept out of ``n`` at ``ratio`` (the fraction kept): at least 1 if n > 0."""
    return 0 if n == 0 else min(n, max(1, math.ceil(ratio * n)))


_TOPK_SAMPLE = 1 << 16  # magnitudes sampled to estimate the k-th largest


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (sorted) of the ``k`` largest magnitudes of ``x``, or of each row of an
    ``[m, n]`` ``x``: exact, faster than topk.

    ``torch.topk`` over millions of values is slow on a CPU. This samples magnitudes to set a
    threshold low enough that, with high probability, at least ``k`` values pass it, then
    runs ``topk`` on those candidates only. The candidates hold the k largest whenever there
    are at least k of them, so the result is exact (ties aside); if too few pass, the margin
    doubles, then a full ``topk`` runs. The sample's generator is seeded by the size, so the
    result never depends on a random draw. Shorter rows go through one ``topk`` together.
    """
    n = x.shape[-1]
    expect = _TOPK_SAMPLE * k / n  # sampled values expected above the true k-th magnitude
    sampled = expect >= 8 and n >= 4 * _TOPK_SAMPLE
    if sampled and x.dim() > 1:
        return torch.stack([topk_indices(row, k) for row in x])
    a = x.abs()
    if sampled:
        gen = torch.Generator().manual_seed(n)
        for sigmas in (4.0, 8.0):
            kept = min(_TOPK_SAMPLE, math.ceil(expect + sigmas * math.sqrt(expect)))
            sample = a[torch.randint(0, n, (_TOPK_SAMPLE,), generator=gen, device=_CPU)]
            threshold = torch.topk(sample, kept, sorted=False).values.min()
            candidates = torch.nonzero(a >= threshold).squeeze(1)  # sorted
            if candidates.numel() >= k:
                pick = torch.topk(a[candidates], k, sorted=False).indices.sort().values
                return candidates[pick]
    return torch.topk(a, k, dim=-1, sorted=False).indices.sort(dim=-1).values


def _check_ratio(ratio: float, codec: str) -> None:
    if not 0 < ratio <= 1:
        raise CompressionError(f"{codec} ratio (the fraction kept) must be in (0, 1], got {ratio}.")


class TopKCodec:
    """Top-k sparsification: the ``k`` largest magnitudes, as uint32 indices then float32 values.

    With tied magnitudes the kept indices are ``torch.topk``'s: on the CPU one row of a
    matrix and the lone message agreed in every check, but torch does not promise it,
    and on an accelerator they may differ (the values kept are equal).
    """

    name = "topk"

    def __init__(self, ratio: float = 0.01) -> None:
        """Keep ``ceil(ratio * n)`` values (at least one)."""
        _check_ratio(ratio, self.name)
        self.ratio = ratio

    def wire_bytes(self, n: int) -> int:
        """Payload size for ``n`` values."""
        return 8 * _keep(self.ratio, n)

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (one header scalar: k)."""
        return self.wire_bytes(n) + 8

    def encode(self, tensor: torch.Tensor) -> EncodedTensor:
        """Select exactly the k largest magnitudes (:func:`topk_indices`), sorted by index."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)
        idx = self._select(x[None])[0]
        data = idx.numpy().astype("<u4").tobytes() + x[idx].numpy().astype("<f4").tobytes()
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=data,
            params={"k": float(len(idx))},
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
        out = _scatter(n, torch.from_numpy(idx)[None], torch.from_numpy(values.copy())[None])
        return _restore(out[0], encoded)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x`` (a new tensor of its dtype)."""
        xf = _rows(x)
        idx = self._select(xf).to(xf.device)
        return _scatter(xf.shape[1], idx, xf.gather(1, idx)).to(x.dtype)

    def _select(self, x: torch.Tensor) -> torch.Tensor:
        """The ``[m, k]`` sorted indices of each row's k largest magnitudes."""
        m, n = x.shape
        k = _keep(self.ratio, n)
        if k == 0:
            return torch.zeros(m, 0, dtype=torch.int64, device=x.device)
        return topk_indices(x, k)


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

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """``EncodedTensor.nbytes`` for ``n`` values (two header scalars: k, seed)."""
        return self.wire_bytes(n) + 16

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
        """Draw a seed, select its k indices, scale the values by ``n / k`` (on one row)."""
        dtype = _dtype_name(tensor, self.name)
        x = _flat(tensor)[None]
        seeds, idx = self._draw([self.generator], x.shape[1])
        return EncodedTensor(
            codec=self.name,
            dtype=dtype,
            shape=tuple(tensor.shape),
            data=self._values(x, idx)[0].numpy().astype("<f4").tobytes(),
            params={"k": float(idx.shape[1]), "seed": float(seeds[0])},
        )

    def decode(self, encoded: EncodedTensor) -> torch.Tensor:
        """Regenerate the indices from the seed and scatter the values."""
        n = _numel(encoded, self.name)
        k = _int_param(encoded, "k", self.name, 0, n)
        seed = _int_param(encoded, "seed", self.name, 0, 2**53)
        _expect(encoded, 4 * k, self.name)
        values = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4").copy())
        idx = self._indices(seed, n, k) if k else torch.zeros(0, dtype=torch.int64, device=_CPU)
        return _restore(_scatter(n, idx[None], values[None])[0], encoded)

    def roundtrip_rows(
        self, x: torch.Tensor, generators: Sequence[torch.Generator] = ()
    ) -> torch.Tensor:
        """``decode(encode(row))`` of every row of ``x``, row ``r`` drawing its seed from
        ``generators[r]`` (a new tensor of ``x``'s dtype)."""
        xf = _rows(x)
        _, idx = self._draw(generators, xf.shape[1])
        idx = idx.to(xf.device)
        return _scatter(xf.shape[1], idx, self._values(xf, idx)).to(x.dtype)

    def _draw(
        self, generators: Sequence[torch.Generator], n: int
    ) -> tuple[list[int], torch.Tensor]:
        """Each row's seed, from its generator (every message draws one, even an empty
        one), and the ``[m, k]`` indices it selects (on the CPU)."""
        k = _keep(self.ratio, n)
        # Below 2**53 a seed survives the float64 parameter exactly.
        seeds = [int(torch.randint(0, 2**53, (1,), generator=g, device=_CPU)) for g in generators]
        idx = torch.empty(len(seeds), k, dtype=torch.int64, device=_CPU)
        if k:
            for row, seed in zip(idx, seeds, strict=True):
                row.copy_(self._indices(seed, n, k))
        return seeds, idx

    @staticmethod
    def _values(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The selected values of each row, times ``n / k`` rounded to float32."""
        n, k = x.shape[1], idx.shape[1]
        values = x.gather(1, idx)
        return values.mul_(_const(n / k, torch.float32, x.device)) if k else values
