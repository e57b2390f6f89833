"""Codec names -> codecs: configured ones for encoding, defaults for decoding.

Decoding needs no configuration (every parameter travels in the header), so a receiver
decodes any codec by name with :func:`get_codec`. Encoding is configured from the config's
``[compression]`` table with :func:`make_codec`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedcore.compression.base import Codec, RawCodec, RowsCodec
from fedcore.compression.codecs import CastCodec, QSGDCodec, RandKCodec, SignCodec, TopKCodec
from fedcore.compression.floats import CustomFloatCodec, FP8Codec, S2FP8Codec
from fedcore.config import CODECS as CODECS_IN_CONFIG
from fedcore.config import CompressionConfig
from fedcore.errors import CompressionError

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "codec_options",
    "codec_seed",
    "configured_codec",
    "get_codec",
    "make_codec",
]

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
    "fp8": FP8Codec(),
    "float": CustomFloatCodec(),
    "s2fp8": S2FP8Codec(),
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
    format: str = "e4m3",
    exp_bits: int = 4,
    man_bits: int = 3,
    scaling: str = "none",
    layers: Sequence[int] = (),
    seed: int = 0,
) -> RowsCodec:
    """An encoder: ``name`` with its options; ``seed`` seeds the stochastic ones.

    ``format`` (``"e4m3"`` or ``"e5m2"``) and ``chunk`` apply to ``fp8``; ``exp_bits``,
    ``man_bits`` and ``scaling`` to ``float``; ``s2fp8`` takes none.

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
    if name == "fp8":
        return FP8Codec(format, chunk=chunk)
    if name == "float":
        return CustomFloatCodec(exp_bits, man_bits, scaling=scaling, layers=layers)
    if name == "s2fp8":
        return S2FP8Codec()
    if name == "raw":
        return RawCodec()
    raise CompressionError(
        f"unknown codec {name!r}; use one of {', '.join(CODEC_NAMES)} (compression.codec)."
    )


def codec_options(compression: CompressionConfig) -> dict[str, Any]:
    """The codec options of a ``[compression]`` table, as :func:`make_codec` and
    :func:`~fedcore.compression.batched.make_row_codec` take them (all but the name)."""
    c = compression
    return {
        "bits": c.bits,
        "ratio": c.ratio,
        "chunk": c.chunk,
        "scaled": c.scaled,
        "format": c.format,
        "exp_bits": c.exp_bits,
        "man_bits": c.man_bits,
        "scaling": c.scaling,
    }


def codec_seed(run_seed: int, node: int) -> int:
    """The seed of the codec of the ``node``-th node (graph order) of a run."""
    return run_seed * 1_000_003 + node + 7919


def configured_codec(
    compression: CompressionConfig, *, seed: int, layers: Sequence[int] = ()
) -> Codec:
    """The encoder a ``[compression]`` table names, every option passed (``seed`` as above;
    ``layers``, the model's layer sizes, for APS)."""
    return make_codec(compression.codec, seed=seed, layers=layers, **codec_options(compression))
