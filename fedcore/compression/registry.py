"""Codec names -> codecs: configured ones for encoding, defaults for decoding.

Decoding needs no configuration (every parameter travels in the header), so a receiver
decodes any codec by name with :func:`get_codec`. Encoding is configured from the config's
``[compression]`` table with :func:`make_codec`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fedcore import registry
from fedcore.compression.base import Codec, RawCodec, RowsCodec
from fedcore.compression.codecs import CastCodec, QSGDCodec, SignCodec
from fedcore.compression.floats import CustomFloatCodec, FP8Codec, S2FP8Codec
from fedcore.compression.sparse import RandKCodec, TopKCodec
from fedcore.config import CompressionConfig
from fedcore.errors import CompressionError, FedcoreError
from fedcore.ids import error_text

__all__ = [
    "CODECS",
    "CODEC_NAMES",
    "CodecOptions",
    "codec_seed",
    "configured_codec",
    "get_codec",
    "make_codec",
]

CODEC_NAMES = registry.CODECS.builtin
"""The codecs a config may name (``compression.codec``; :data:`fedcore.registry.CODECS`)."""


@dataclass(frozen=True, slots=True)
class CodecOptions:
    """The ``[compression]`` options of a codec, besides its name, as one typed object
    (each codec reads its own; :meth:`of` reads them from a config).

    ``bits`` and ``scaled`` apply to ``qsgd``; ``ratio`` to ``topk`` and ``randk``;
    ``chunk`` to ``qsgd``, ``sign`` and ``fp8``; ``format`` (``"e4m3"`` or ``"e5m2"``) to
    ``fp8``; ``exp_bits``, ``man_bits``, ``scaling`` and ``layers`` (the model's layer
    sizes) to ``float``; the others take none."""

    bits: int = 8
    ratio: float = 0.01
    chunk: int = 0
    scaled: bool = False
    format: str = "e4m3"
    exp_bits: int = 4
    man_bits: int = 3
    scaling: str = "none"
    layers: Sequence[int] = ()

    @classmethod
    def of(cls, compression: CompressionConfig, layers: Sequence[int] = ()) -> CodecOptions:
        """The options of a ``[compression]`` table (``layers``: the model's, for APS)."""
        c = compression
        return cls(
            bits=c.bits,
            ratio=c.ratio,
            chunk=c.chunk,
            scaled=c.scaled,
            format=c.format,
            exp_bits=c.exp_bits,
            man_bits=c.man_bits,
            scaling=c.scaling,
            layers=layers,
        )


# Each codec's factory, as the registry names it: (name, options, generator) -> its
# encoder (``generator``: the stochastic codecs' draws; None to decode only).
def _cast(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return CastCodec(name)


def _qsgd(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return QSGDCodec(o.bits, chunk=o.chunk, scaled=o.scaled, generator=generator)


def _sign(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return SignCodec(o.chunk)


def _topk(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return TopKCodec(o.ratio)


def _randk(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return RandKCodec(o.ratio, generator=generator)


def _fp8(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return FP8Codec(o.format, chunk=o.chunk)


def _float(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return CustomFloatCodec(o.exp_bits, o.man_bits, scaling=o.scaling, layers=o.layers)


def _s2fp8(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return S2FP8Codec()


def _raw(name: str, o: CodecOptions, generator: torch.Generator | None) -> RowsCodec:
    return RawCodec()


CODECS: dict[str, Codec] = {
    name: registry.CODECS.load(name)(name, CodecOptions(), None) for name in CODEC_NAMES
}
"""Name -> a codec that decodes what it names (:func:`get_codec`; decoding reads every
parameter from the message's header, the default options only build the objects)."""


def get_codec(name: str) -> Codec:
    """A codec that decodes tensors encoded as ``name``.

    Raises:
        CompressionError: if no codec has that name.
    """
    try:
        return CODECS[name]
    except KeyError:
        if name in registry.CODECS:  # a plug-in's: built once, with the default options
            CODECS[name] = make_codec(name)
            return CODECS[name]
        raise CompressionError(
            f"unknown codec {name!r}; known codecs: {', '.join(sorted(CODECS))}."
        ) from None


def make_codec(
    name: str, options: CodecOptions | None = None, *, seed: int = 0, **given: Any
) -> RowsCodec:
    """An encoder: ``name`` with its ``options`` (default :class:`CodecOptions`, with
    the options ``given`` by keyword in their place); ``seed`` seeds the stochastic ones.

    Raises:
        CompressionError: an unknown name or an invalid option (naming both).
    """
    if name not in registry.CODECS:
        raise CompressionError(f"compression.codec: {registry.CODECS.unknown(name)}.")
    chosen = dataclasses.replace(options or CodecOptions(), **given)
    factory: Callable[[str, CodecOptions, torch.Generator | None], RowsCodec]
    factory = registry.CODECS.load(name)
    if name in registry.CODECS.builtin:
        return factory(name, chosen, torch.Generator().manual_seed(seed))
    what = f"codec {name!r} ({registry.CODECS.entry(name).target})"
    try:  # a plug-in's factory can raise anything, or build anything
        made = factory(name, chosen, torch.Generator().manual_seed(seed))
    except FedcoreError:
        raise
    except Exception as exc:
        raise CompressionError(
            f"{what} failed: {error_text(exc)}; fix it (fedcore -v shows the traceback)."
        ) from exc
    missing = [m for m in ("encode", "decode", "nbytes", "roundtrip_rows") if not hasattr(made, m)]
    if missing or getattr(made, "name", None) != name:
        raise CompressionError(
            f"{what} returned {type(made).__name__}, not a codec: it needs the methods "
            "encode, decode, nbytes and roundtrip_rows (fedcore.compression.RowsCodec) "
            f"and name = {name!r}."
        )
    return made


def codec_seed(run_seed: int, node: int) -> int:
    """The seed of the codec of the ``node``-th node (graph order) of a run."""
    return run_seed * 1_000_003 + node + 7919


def configured_codec(
    compression: CompressionConfig, *, seed: int, layers: Sequence[int] = ()
) -> Codec:
    """The encoder a ``[compression]`` table names, every option passed (``seed`` as above;
    ``layers``, the model's layer sizes, for APS)."""
    return make_codec(compression.codec, CodecOptions.of(compression, layers), seed=seed)
