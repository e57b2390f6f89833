"""Codecs applied to many rows at once: the per-message codecs' own arithmetic.

The vectorized simulation engine holds every node's parameters as one ``[N, d]`` tensor,
so the tensors its messages carry come as rows of one matrix. A :class:`RowCodec` applies
a codec to all of them at once: ``roundtrip(x, owners)[r]`` is exactly
``codec.decode(codec.encode(x[r]))`` with node ``owners[r]``'s own codec (the one
:func:`~fedcore.compression.make_codec` builds with that node's seed), bit for bit, and
:meth:`RowCodec.nbytes` is exactly that message's ``EncodedTensor.nbytes``. It is so by
construction: every codec's arithmetic is written once over rows
(:meth:`~fedcore.compression.base.RowsCodec.roundtrip_rows`), and a message is one row
of it plus the byte packing. The engine can then swap the message engine for matrix
arithmetic without changing a single number or a single byte counted.

How rows go: ``raw``, the casts, ``sign``, ``qsgd``, ``topk`` and ``randk`` on the rows'
device, all rows at once (``randk`` draws its seeds and indices row by row; ``topk``
takes rows of ``n >= 4 * 65536`` values one by one, as
:func:`~fedcore.compression.topk_indices` samples a threshold there); ``float`` without
APS all rows at once on the CPU; ``fp8``, ``s2fp8`` and ``float`` with APS row by row on
the CPU (they are deterministic, so no owner matters).

Exactness across devices. Element-wise steps round alike on every device (see
:mod:`fedcore.compression.codecs`). Reductions (sign scales, qsgd norms) on the CPU
reduce a row of a matrix in the lone message's order while the row is shorter than
torch's parallel grain (32768 values), and longer rows one by one; on an accelerator
they follow that device's order and may differ from the CPU codec in the last bit of a
norm or scale; everything else stays identical. Top-k with tied magnitudes keeps
whichever tied values ``torch.topk`` picks (see :class:`~fedcore.compression.TopKCodec`).

Stochastic codecs (``qsgd``, ``randk``) keep one ``torch.Generator`` per node, seeded as
``make_codec(..., seed=seeds[i])`` seeds its own, and rows draw from their owner's
generator in row order: the caller lists rows in the order the message engine encodes
them, and each node's draw sequence is the per-node codec's. Those draws happen on the CPU
(the generators are CPU generators) and move to ``x.device``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedcore.compression.base import RawCodec, RowsCodec
from fedcore.compression.codecs import CastCodec, QSGDCodec
from fedcore.compression.registry import CodecOptions, make_codec
from fedcore.compression.sparse import RandKCodec
from fedcore.errors import CompressionError

__all__ = ["RowCodec", "make_row_codec"]

_FLOATS = (torch.float32, torch.float64)


class RowCodec:
    """One codec applied to the rows of a matrix, each row as one message of its owner.

    Attributes:
        codec: The codec (its own generator unused: rows draw from their owners').
        name: The codec's name (one of ``CODEC_NAMES``).
        deterministic: False for codecs that draw random numbers (``qsgd``, ``randk``).
        seeds: Node ``i``'s codec seed (stochastic codecs only).
        generators: Node ``i``'s generator (its state is its position in the sequence).
    """

    def __init__(self, codec: RowsCodec, seeds: Sequence[int] = ()) -> None:
        """Apply ``codec``; ``seeds[i]`` seeds node ``i``'s draws."""
        self.codec = codec
        self.name = codec.name
        self.deterministic = not isinstance(codec, QSGDCodec | RandKCodec)
        self.seeds = () if self.deterministic else tuple(int(s) for s in seeds)
        self.generators = [torch.Generator().manual_seed(s) for s in self.seeds]

    def lossless(self, dtype: torch.dtype) -> bool:
        """Whether every value of ``dtype`` decodes to itself (``raw``; ``fp32`` on float32
        models): a receiver then holds exactly what was sent, and an engine that shares
        memory with the sender need not round-trip at all."""
        if isinstance(self.codec, RawCodec):
            return True
        return (
            isinstance(self.codec, CastCodec)
            and self.codec.name == "fp32"
            and dtype == torch.float32
        )

    def roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """``decode(encode(x[r]))`` with node ``owners[r]``'s codec, for every row ``r``.

        Args:
            x: ``[m, n]`` float32 or float64 rows, on any device.
            owners: ``[m]`` integer node index of each row; stochastic codecs draw for the
                rows in this order, each from its owner's generator.

        Returns:
            A new ``[m, n]`` tensor of ``x``'s dtype on ``x``'s device.

        Raises:
            CompressionError: a bad shape or dtype, an owner without a seed, or values the
                codec refuses (a non-finite norm or scale).
        """
        if x.dim() != 2:
            raise CompressionError(f"codec {self.name!r}: rows must be [m, n], got {x.shape}.")
        if x.dtype not in _FLOATS:
            raise CompressionError(
                f"codec {self.name!r} encodes float32 or float64, not {x.dtype}."
            )
        if owners.shape != (x.shape[0],) or owners.is_floating_point():
            raise CompressionError(
                f"codec {self.name!r}: owners must be {x.shape[0]} integer node indices, "
                f"got a {owners.dtype} tensor of shape {tuple(owners.shape)}."
            )
        if x.shape[0] == 0:
            return x.detach().clone()
        return self.codec.roundtrip_rows(x.detach(), self._owner_generators(owners))

    def nbytes(self, n: int, dtype: torch.dtype = torch.float32) -> int:
        """Bytes one encoded tensor of ``n`` values (of ``dtype``) puts on the wire.

        Exactly the per-message ``EncodedTensor.nbytes``: the payload plus 8 bytes per
        header scalar. Only ``raw`` depends on ``dtype``.
        """
        return self.codec.nbytes(n, dtype)

    def _owner_generators(self, owners: torch.Tensor) -> list[torch.Generator]:
        """The generator of each row's owner, in row order (none if deterministic)."""
        if self.deterministic:
            return []
        ids: list[int] = owners.tolist()
        bad = [i for i in ids if not 0 <= i < len(self.generators)]
        if bad:
            raise CompressionError(
                f"codec {self.name!r}: no seed for node {bad[0]} "
                f"({len(self.generators)} seeds given)."
            )
        return [self.generators[i] for i in ids]


def make_row_codec(
    name: str,
    options: CodecOptions | None = None,
    *,
    seeds: Sequence[int] = (),
    **given: Any,
) -> RowCodec:
    """The batched codec for ``name`` with :func:`~fedcore.compression.make_codec`'s
    ``options`` (and the options ``given`` by keyword in their place).

    Args:
        name: One of ``CODEC_NAMES``.
        options: As for :func:`~fedcore.compression.make_codec`.
        seeds: ``seeds[i]`` is node ``i``'s codec seed (in a run:
            :func:`~fedcore.compression.codec_seed`); used by ``qsgd`` and ``randk`` only.

    Raises:
        CompressionError: an unknown name or an invalid option.
    """
    codec = make_codec(name, options, **given)
    return RowCodec(codec, seeds)
