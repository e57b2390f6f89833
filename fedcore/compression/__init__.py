"""Codecs: tensors to the bytes a wire carries, and back.

A codec has ``encode(tensor) -> EncodedTensor`` and ``decode(EncodedTensor) -> tensor``.
Decoding bytes that do not match their header raises
:class:`~fedcore.errors.CompressionError`, never a crash or a wrong tensor. ``raw`` is the
lossless default of the node; ``fp32``, ``fp16``, ``bf16``, ``qsgd``, ``sign``, ``topk``
and ``randk`` are the packed lossy codecs (see :mod:`fedcore.compression.codecs`).
"""

from __future__ import annotations

from fedcore.compression.base import Codec, RawCodec
from fedcore.compression.batched import RowCodec, make_row_codec
from fedcore.compression.codecs import (
    CastCodec,
    QSGDCodec,
    RandKCodec,
    SignCodec,
    TopKCodec,
    topk_indices,
)
from fedcore.compression.registry import CODEC_NAMES, CODECS, get_codec, make_codec

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "CastCodec",
    "Codec",
    "QSGDCodec",
    "RandKCodec",
    "RawCodec",
    "RowCodec",
    "SignCodec",
    "TopKCodec",
    "get_codec",
    "make_codec",
    "make_row_codec",
    "topk_indices",
]
