"""Every node's codec of a run, batched (:func:`row_codec`): what the engines that hold
every peer as a row (and a simulation's virtual clock, :mod:`fedcore.engines.clock`) size
and round-trip messages with."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedcore.compression import CodecOptions, codec_seed
from fedcore.compression.batched import RowCodec, make_row_codec

if TYPE_CHECKING:
    from fedcore.setup.prepare import RunSetup

__all__ = ["row_codec"]


def row_codec(setup: RunSetup) -> RowCodec:
    """Every node's codec of ``setup``, batched (whose ``nbytes`` sizes the messages)."""
    c = setup.config.compression
    n = len(setup.graph.nodes)
    first = codec_seed(setup.config.run.seed, 0)
    seeds = range(first, first + n)  # consecutive seeds: no list of a million ints
    assert n < 2 or codec_seed(setup.config.run.seed, n - 1) == seeds[-1]
    return make_row_codec(c.codec, CodecOptions.of(c, setup.layers), seeds=seeds)
