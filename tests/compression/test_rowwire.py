"""Encoded rows (:mod:`fedcore.compression.rowwire`): what :func:`encode_rows` sends decodes
to exactly :meth:`RowCodec.roundtrip`'s rows, bit for bit, with the same draws from each
owner's generator, in fewer bytes than the values; codecs with no row form say so."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedcore.compression import make_row_codec
from fedcore.compression.rowwire import decode_rows, encode_rows, wire_width
from fedcore.errors import CompressionError

CASES: list[tuple[str, dict[str, Any]]] = [
    ("fp16", {}),
    ("bf16", {}),
    ("sign", {}),
    ("sign", {"chunk": 5}),
    ("qsgd", {"bits": 2}),
    ("qsgd", {"bits": 4, "chunk": 7}),
    ("qsgd", {"bits": 8, "scaled": True}),
    ("topk", {"ratio": 0.1}),
    ("topk", {"ratio": 1.0}),
    ("randk", {"ratio": 0.2}),
    ("randk", {"ratio": 0.9}),
]


def _rows(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(m * 1000 + n)
    x = torch.randn(m, n, generator=g, dtype=torch.float64).to(dtype)
    if m and n:
        x[0, 0] = 0.0  # the sign of zero, a tie of top-k
        x[-1, -1] = -0.0
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize(("name", "options"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("m", "n"), [(5, 37), (1, 1), (3, 8), (0, 9), (4, 0)])
def test_encoded_rows_decode_to_the_round_trip(
    name: str, options: dict[str, Any], dtype: torch.dtype, m: int, n: int
) -> None:
    seeds = range(10, 10 + m + 2)
    sent, trip = (
        make_row_codec(name, seeds=seeds, **options),
        make_row_codec(name, seeds=seeds, **options),
    )
    x = _rows(m, n, dtype)
    owners = torch.arange(m) + 1  # not the row index: the owner's generator draws
    for _ in range(2):  # twice: the generators move on alike
        decoded, encoded = encode_rows(sent, x, owners)
        expected = trip.roundtrip(x, owners)
        assert decoded.dtype == dtype and torch.equal(_bits(decoded), _bits(expected))
        width = wire_width(sent, n, dtype)
        assert width is not None and encoded.shape == (m, width)
        assert encoded.dtype == torch.uint8
        back = decode_rows(make_row_codec(name, **options), encoded, n, dtype)
        assert torch.equal(_bits(back), _bits(expected))


@pytest.mark.parametrize(("name", "options"), CASES)
def test_encoded_rows_are_about_the_codecs_bytes(name: str, options: dict[str, Any]) -> None:
    codec = make_row_codec(name, seeds=range(1), **options)
    n = 1000
    width = wire_width(codec, n, torch.float32)
    assert width is not None
    # The codec's payload plus at most a header's scalars, never the values' 4 bytes each
    # but where the codec keeps them all (top-k of ratio 1: index and value).
    assert width <= codec.nbytes(n) + 8
    assert width < 4 * n or options.get("ratio", 0) >= 0.5


@pytest.mark.parametrize("name", ["raw", "fp32", "fp8", "s2fp8", "float"])
def test_codecs_without_a_row_form_say_so(name: str) -> None:
    codec, dtype = make_row_codec(name), torch.float32
    assert wire_width(codec, 10, dtype) is None
    with pytest.raises(CompressionError, match="no row form"):
        encode_rows(codec, torch.ones(2, 10, dtype=dtype), torch.arange(2))


def test_fp32_on_float64_rows_sends_float32() -> None:
    codec = make_row_codec("fp32")
    x = _rows(3, 11, torch.float64)
    assert wire_width(codec, 11, torch.float64) == 44
    decoded, encoded = encode_rows(codec, x, torch.arange(3))
    assert torch.equal(decoded, codec.roundtrip(x, torch.arange(3)))
    assert torch.equal(decode_rows(codec, encoded, 11, torch.float64), decoded)
