"""Codecs: tensors to the bytes a wire carries, and back.

A codec is a small stateless object with ``encode(tensor) -> EncodedTensor`` and
``decode(EncodedTensor) -> tensor``. Decoding bytes that do not match their header
raises :class:`~fedcore.errors.CompressionError`, never a crash or a wrong tensor.
Only the lossless ``raw`` codec exists so far; compressed codecs plug into the same
registry.
"""

from __future__ import annotations

from fedcore.compression.base import CODECS, Codec, RawCodec, get_codec

__all__ = ["CODECS", "Codec", "RawCodec", "get_codec"]
