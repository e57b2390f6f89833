"""Codec names -> codecs: configured ones for encoding, defaults for decoding.

Decoding needs no configuration (every parameter travels in the header), so a receiver
decodes any codec by name with :func:`get_codec`. Encoding is configured from the config's
``[compression]`` table with :func:`make_codec`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedcore import registry
from fedcore.compression.base import Codec, RawCodec, RowsCodec
from fedcore.compression.codecs import CastCodec, QSGDCodec, RandKCodec, SignCodec, TopKCodec
from fedcore.compression.floats import CustomFloatCodec, FP8Codec, S2FP8Codec
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

CODEC_NAMES = registry.CODECS.names
"""The codecs a config may name (``compression.codec``; :data:`fedcore.registry.CODECS`)."""


@dataclass(frozen=True, slots=True)
class _Options:
    """The ``[compression]`` options every codec factory is given (each reads its own)."""

    bits: int
    ratio: float
    chunk: int
    scaled: bool
    format: str
    exp_bits: int
    man_bits: int
    scaling: str
    layers: Sequence[int]
    generator: torch.Generator | None


# Each codec's factory, as the registry names it: (name, options) -> its encoder.
def _cast(name: str, o: _Options) -> RowsCodec:
    return CastCodec(name)


def _qsgd(name: str, o: _Options) -> RowsCodec:
    return QSGDCodec(o.bits, chunk=o.chunk, scaled=o.scaled, generator=o.generator)


def _sign(name: str, o: _Options) -> RowsCodec:
    return SignCodec(o.chunk)


def _topk(name: str, o: _Options) -> RowsCodec:
    return TopKCodec(o.ratio)


def _randk(name: str, o: _Options) -> RowsCodec:
    return RandKCodec(o.ratio, generator=o.generator)


def _fp8(name: str, o: _Options) -> RowsCodec:
    return FP8Codec(o.format, chunk=o.chunk)


def _float(name: str, o: _Options) -> RowsCodec:
    return CustomFloatCodec(o.exp_bits, o.man_bits, scaling=o.scaling, layers=o.layers)


def _s2fp8(name: str, o: _Options) -> RowsCodec:
    return S2FP8Codec()


def _raw(name: str, o: _Options) -> RowsCodec:
    return RawCodec()


_DECODING = _Options(8, 0.01, 0, False, "e4m3", 4, 3, "none", (), generator=None)
"""Options of the decoders :func:`get_codec` hands out (decoding reads every parameter
from the message's header; the defaults only build the objects)."""

CODECS: dict[str, Codec] = {
    name: registry.CODECS.load(name)(name, _DECODING) for name in CODEC_NAMES
}
"""Name -> a codec that decodes what it names (:func:`get_codec`)."""


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
    if name not in registry.CODECS:
        raise CompressionError(f"compression.codec: {registry.CODECS.unknown(name)}.")
    options = _Options(
        bits,
        ratio,
        chunk,
        scaled,
        format,
        exp_bits,
        man_bits,
        scaling,
        layers,
        generator=torch.Generator().manual_seed(seed),
    )
    factory: Callable[[str, _Options], RowsCodec] = registry.CODECS.load(name)
    return factory(name, options)


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
