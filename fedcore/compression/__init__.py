"""Codecs: tensors to the bytes a wire carries, and back.

A codec has ``encode(tensor) -> EncodedTensor`` and ``decode(EncodedTensor) -> tensor``.
Decoding bytes that do not match their header raises
:class:`~fedcore.errors.CompressionError`, never a crash or a wrong tensor. ``raw`` is the
lossless default of the node; ``fp32``, ``fp16``, ``bf16``, ``qsgd``, ``sign``, ``topk``
and ``randk`` are the packed lossy codecs (see :mod:`fedcore.compression.codecs` and
:mod:`fedcore.compression.sparse`), and
``fp8``, ``float`` and ``s2fp8`` the low-precision floats (:mod:`fedcore.compression.floats`).
"""

from __future__ import annotations

from fedcore.compression.base import Codec, RawCodec
from fedcore.compression.batched import RowCodec, make_row_codec
from fedcore.compression.codecs import CastCodec, QSGDCodec, SignCodec
from fedcore.compression.floats import CustomFloatCodec, FP8Codec, S2FP8Codec
from fedcore.compression.registry import (
    CODEC_NAMES,
    CODECS,
    CodecOptions,
    codec_seed,
    configured_codec,
    get_codec,
    make_codec,
)
from fedcore.compression.sparse import RandKCodec, TopKCodec, topk_indices

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "CastCodec",
    "Codec",
    "CodecOptions",
    "CustomFloatCodec",
    "FP8Codec",
    "QSGDCodec",
    "RandKCodec",
    "RawCodec",
    "RowCodec",
    "S2FP8Codec",
    "SignCodec",
    "TopKCodec",
    "codec_seed",
    "configured_codec",
    "get_codec",
    "make_codec",
    "make_row_codec",
    "topk_indices",
]
