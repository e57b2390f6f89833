"""Rows of a :class:`~fedcore.compression.batched.RowCodec` as the bytes their codec puts on
the wire, for engines that move encoded rows between processes (the sharded engine's halo).

:meth:`RowCodec.roundtrip` gives what receivers decode; an engine that holds the receivers
in another process needs what travels instead: :func:`encode_rows` returns both, the
decoded rows (for the sender's own use) and each row's encoded bytes (``[m, width]``
``uint8``), and :func:`decode_rows` turns those bytes back into exactly the decoded rows,
bit for bit. Both run the codec's own steps (the same scale, norm, index and draw functions
as its ``roundtrip_rows``), split where its wire splits them:

* ``fp16``, ``bf16`` (and ``fp32`` on float64 rows): the values in the wire's dtype;
* ``sign``: the sign bits, eight to a byte, and the scale(s) (float64 with one chunk,
  float32 per chunk);
* ``qsgd``: the levels, ``8 // bits`` to a byte, and the float32 norm(s);
* ``topk``: the ``k`` indices (int32) and float32 values;
* ``randk``: the index seed (the receiver draws the indices from it, as a codec's decode
  does) and the ``k`` float32 values.

Every draw is the ``roundtrip_rows`` draw (each row from its owner's generator), so a row
encoded here leaves its owner's generator where a round trip would. Codecs not listed
(``fp8``, ``s2fp8``, ``float``) have no row form here: :func:`wire_width` says ``None`` and
the engine sends the decoded values (their full width). Lossless codecs send the values.
"""

from __future__ import annotations

import torch

from fedcore.compression.batched import RowCodec
from fedcore.compression.codecs import CastCodec, QSGDCodec, SignCodec
from fedcore.compression.sparse import RandKCodec, TopKCodec, _keep, _scatter
from fedcore.compression.wire import _rows
from fedcore.errors import CompressionError

__all__ = ["decode_rows", "encode_rows", "wire_width"]


def _chunks(chunk: int, n: int) -> int:
    """Scales or norms a row of ``n`` values carries (one with ``chunk = 0``)."""
    return 1 if chunk == 0 else -(-n // chunk)


def wire_width(codec: RowCodec, n: int, dtype: torch.dtype) -> int | None:
    """Bytes :func:`encode_rows` gives a row of ``n`` values of ``dtype``, or ``None``: a
    codec with no row form here (or a lossless one: its values are its bytes)."""
    c = codec.codec
    if codec.lossless(dtype):
        return None
    if isinstance(c, CastCodec):
        return n * c._WIRE[c.name].itemsize
    if isinstance(c, SignCodec):
        return -(-n // 8) + (8 if c.chunk == 0 else 4 * _chunks(c.chunk, n))
    if isinstance(c, QSGDCodec):
        per = 8 // c.bits
        return -(-n // per) + 4 * _chunks(c.chunk, n)
    if isinstance(c, TopKCodec):
        return 8 * _keep(c.ratio, n)
    if isinstance(c, RandKCodec):
        return 8 + 4 * _keep(c.ratio, n)
    return None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``[m, ...]`` values as ``[m, bytes]`` uint8 (their own bytes)."""
    m = t.shape[0]
    per_row = t[0].numel() * t.element_size() if m else 0
    return t.contiguous().reshape(-1).view(torch.uint8).reshape(m, per_row)


def _from(raw: torch.Tensor, dtype: torch.dtype, width: int) -> torch.Tensor:
    """``[m, width]`` values of ``dtype`` from their ``[m, width * itemsize]`` bytes."""
    flat = raw.clone().reshape(-1)  # a copy of its own: aligned for any dtype
    return flat.view(dtype).reshape(raw.shape[0], width)


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``[m, n]`` codes below ``2**bits`` as ``[m, ceil(n * bits / 8)]`` bytes."""
    m, n = codes.shape
    per = 8 // bits
    padded = torch.zeros(m, -(-n // per) * per, dtype=torch.uint8)
    padded[:, :n] = codes
    groups = padded.reshape(m, -1, per)
    out = torch.zeros(m, groups.shape[1], dtype=torch.uint8)
    for j in range(per):
        out |= groups[:, :, j] << (bits * j)
    return out


def _unpack(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The ``[m, n]`` codes of :func:`_pack`'s bytes."""
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * j)) & mask for j in range(per)]
    return torch.stack(parts, dim=2).reshape(packed.shape[0], -1)[:, :n]


def encode_rows(
    codec: RowCodec, x: torch.Tensor, owners: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(decoded, encoded)`` of the ``[m, n]`` rows ``x`` (on the CPU), row ``r`` sent by
    node ``owners[r]``: ``decoded`` is :meth:`RowCodec.roundtrip` ``(x, owners)`` (the same
    draws), ``encoded`` the ``[m, wire_width]`` bytes :func:`decode_rows` reads.

    Raises:
        CompressionError: a codec with no row form, or what the round trip raises.
    """
    c = codec.codec
    m, n = x.shape
    width = wire_width(codec, n, x.dtype)
    if width is None:
        raise CompressionError(f"codec {codec.name!r} has no row form to send.")
    if m == 0:
        return x.detach().clone(), torch.zeros(0, width, dtype=torch.uint8)
    generators = codec._owner_generators(owners)
    if isinstance(c, CastCodec):
        wire = c._wire(x.detach())
        return wire.to(x.dtype, copy=True), _bytes(wire)
    xf = _rows(x)
    if isinstance(c, SignCodec):
        scales = c._scales(xf)
        if not bool(torch.isfinite(scales).all()):
            raise CompressionError("codec 'sign': a scale is not finite.")
        unit = (xf >= 0).to(torch.float32)
        encoded = torch.cat([_pack(unit.to(torch.uint8), 1), _bytes(scales)], dim=1)
        return c._expand(unit, scales, c.chunk).to(x.dtype), encoded
    if isinstance(c, QSGDCodec):
        codes, norms = c._quantize(xf, generators)
        codes.trunc_()
        encoded = torch.cat([_pack(codes.to(torch.uint8), c.bits), _bytes(norms)], dim=1)
        s = 2 ** (c.bits - 1) - 1
        return c._dequantize(codes, norms, c.chunk, s).to(x.dtype), encoded
    if isinstance(c, TopKCodec):
        idx = c._select(xf)
        values = xf.gather(1, idx)
        encoded = torch.cat([_bytes(idx.to(torch.int32)), _bytes(values)], dim=1)
        return _scatter(n, idx, values).to(x.dtype), encoded
    assert isinstance(c, RandKCodec)
    seeds, idx = c._draw(generators, n)
    values = c._values(xf, idx)
    seed = torch.tensor(seeds, dtype=torch.int64).reshape(m, 1)
    encoded = torch.cat([_bytes(seed), _bytes(values)], dim=1)
    return _scatter(n, idx, values).to(x.dtype), encoded


def decode_rows(codec: RowCodec, encoded: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``[m, n]`` rows of ``dtype`` that :func:`encode_rows`'s bytes ``encoded`` stand
    for: exactly its ``decoded`` rows."""
    c = codec.codec
    m = encoded.shape[0]
    if m == 0:
        return torch.zeros(0, n, dtype=dtype)
    if isinstance(c, CastCodec):
        wire = c._WIRE[c.name]
        return _from(encoded, wire, n).to(dtype)
    if isinstance(c, SignCodec):
        nbits = -(-n // 8)
        unit = _unpack(encoded[:, :nbits], 1, n).to(torch.float32)
        scales = (
            _from(encoded[:, nbits:], torch.float64, 1)
            if c.chunk == 0
            else _from(encoded[:, nbits:], torch.float32, _chunks(c.chunk, n))
        )
        return c._expand(unit, scales, c.chunk).to(dtype)
    if isinstance(c, QSGDCodec):
        ncodes = -(-n // (8 // c.bits))
        codes = _unpack(encoded[:, :ncodes], c.bits, n).to(torch.float32)
        norms = _from(encoded[:, ncodes:], torch.float32, _chunks(c.chunk, n))
        s = 2 ** (c.bits - 1) - 1
        return c._dequantize(codes, norms, c.chunk, s).to(dtype)
    if isinstance(c, TopKCodec):
        k = _keep(c.ratio, n)
        idx = _from(encoded[:, : 4 * k], torch.int32, k).to(torch.int64)
        return _scatter(n, idx, _from(encoded[:, 4 * k :], torch.float32, k)).to(dtype)
    assert isinstance(c, RandKCodec)
    k = _keep(c.ratio, n)
    seeds = _from(encoded[:, :8], torch.int64, 1).flatten().tolist()
    idx = torch.empty(m, k, dtype=torch.int64)
    if k:
        for row, seed in zip(idx, seeds, strict=True):
            row.copy_(c._indices(int(seed), n, k))
    return _scatter(n, idx, _from(encoded[:, 8:], torch.float32, k)).to(dtype)
