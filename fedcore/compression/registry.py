"""Codec names -> codecs: configured ones for encoding, defaults for decoding.

Decoding needs no configuration (every parameter travels in the header), so a receiver
decodes any codec by name with :func:`get_codec`. Encoding is configured from the config's
``[compression]`` table with :func:`make_codec`.
"""

from __future__ import annotations

import torch

from fedcore.compression.base import Codec, RawCodec
from fedcore.compression.codecs import CastCodec, QSGDCodec, RandKCodec, SignCodec, TopKCodec
from fedcore.config import CODECS as CODECS_IN_CONFIG
from fedcore.errors import CompressionError

__all__ = ["CODECS", "CODEC_NAMES", "get_codec", "make_codec"]

CODEC_NAMES = CODECS_IN_CONFIG
"""The codecs a config may name (``compression.codec``)."""

CODECS: dict[str, Codec] = {
    "raw": RawCodec(),
    "fp32": CastCodec("fp32"),
    "fp16": CastCodec("fp16"),
    "bf16": CastCodec("bf16"),
    "qsgd": QSGDCodec(),
    "sign": SignCodec(),
    "topk": TopKCodec(),
    "randk": RandKCodec(),
}


def get_codec(name: str) -> Codec:
    """A codec that decodes tensors encoded as ``name``.

    Raises:
        CompressionError: if no codec has that name.
    """
    try:
        return CODECS[name]
    except KeyError:
        raise CompressionError(
            f"unknown codec {name!r}; known codecs: {', '.join(sorted(CODECS))}."
        ) from None


def make_codec(
    name: str,
    *,
    bits: int = 8,
    ratio: float = 0.01,
    chunk: int = 0,
    scaled: bool = False,
    seed: int = 0,
) -> Codec:
    """An encoder: ``name`` with its options; ``seed`` seeds the stochastic ones.

    Raises:
        CompressionError: an unknown name or an invalid option (naming both).
    """
    generator = torch.Generator().manual_seed(seed)
    if name in ("fp32", "fp16", "bf16"):
        return CastCodec(name)
    if name == "qsgd":
        return QSGDCodec(bits, chunk=chunk, scaled=scaled, generator=generator)
    if name == "sign":
        return SignCodec(chunk)
    if name == "topk":
        return TopKCodec(ratio)
    if name == "randk":
        return RandKCodec(ratio, generator=generator)
    if name == "raw":
        return RawCodec()
    raise CompressionError(
        f"unknown codec {name!r}; use one of {', '.join(CODEC_NAMES)} (compression.codec)."
    )
