"""Batched row codecs: bit for bit the per-node codecs, row by row, and the same wire size.

The reference is the message engine's own path: one ``make_codec(..., seed=seeds[i])``
object per node, each row encoded by its owner's codec in row order, decoded by name.
Comparisons are bitwise (signed zeros count). Top-k data is tie-free: with tied
magnitudes the batched ``torch.topk`` may keep other (equal) values than the 1-D one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.compression import CODEC_NAMES, Codec, get_codec, make_codec
from fedcore.compression.batched import RowCodec, make_row_codec
from fedcore.errors import CompressionError

SETTINGS: dict[str, dict[str, Any]] = {
    "raw": {},
    "fp32": {},
    "fp16": {},
    "bf16": {},
    "qsgd-2": {"bits": 2},
    "qsgd-4": {"bits": 4},
    "qsgd-8": {"bits": 8},
    "qsgd-2-chunked": {"bits": 2, "chunk": 4},
    "qsgd-4-chunked": {"bits": 4, "chunk": 5},
    "qsgd-8-chunked": {"bits": 8, "chunk": 64},  # often more than n: one bucket
    "qsgd-4-scaled": {"bits": 4, "scaled": True},
    "qsgd-2-chunked-scaled": {"bits": 2, "chunk": 3, "scaled": True},
    "sign": {},
    "sign-chunked": {"chunk": 7},  # most n leave a short last chunk
    "sign-chunk-1": {"chunk": 1},
    "sign-big-chunk": {"chunk": 50},
    "topk-0.1": {"ratio": 0.1},
    "topk-0.5": {"ratio": 0.5},
    "topk-1": {"ratio": 1.0},
    "randk-0.1": {"ratio": 0.1},  # 4k <= n: the unique-draws path
    "randk-0.4": {"ratio": 0.4},  # 4k > n: randperm
    "randk-1": {"ratio": 1.0},
    "fp8": {},
    "fp8-e5m2-chunked": {"format": "e5m2", "chunk": 5},
    "float-e4m3": {"exp_bits": 4, "man_bits": 3},
    "float-e2m0": {"exp_bits": 2, "man_bits": 0},
    "s2fp8": {},
}


def _name(key: str) -> str:
    return key.split("-")[0]


def _seeds(run_seed: int, nodes: int) -> list[int]:
    return [run_seed * 1_000_003 + i + 7919 for i in range(nodes)]


class Reference:
    """The message engine: one codec object per node, rows encoded in order."""

    def __init__(self, key: str, seeds: Sequence[int]) -> None:
        self.codecs: list[Codec] = [make_codec(_name(key), **SETTINGS[key], seed=s) for s in seeds]

    def roundtrip(self, x: torch.Tensor, owners: torch.Tensor) -> tuple[torch.Tensor, set[int]]:
        """The decoded rows and the wire sizes seen."""
        out, sizes = torch.empty_like(x), set()
        for r, owner in enumerate(owners.tolist()):
            encoded = self.codecs[owner].encode(x[r])
            sizes.add(encoded.nbytes)
            out[r] = get_codec(encoded.codec).decode(encoded)  # a receiver decodes by name
        return out, sizes


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def assert_bit_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(_bits(got), _bits(want)), (got - want).abs().max()


def _rows(seed: int, m: int, n: int, dtype: torch.dtype, tie_free: bool) -> torch.Tensor:
    """Rows of mixed magnitudes; unless ``tie_free``, with zeros, -0.0 and all-zero rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=gen, dtype=torch.float64)
    x *= 10.0 ** torch.randint(-4, 5, (m, 1), generator=gen)
    if not tie_free and m * n:
        x[torch.rand(m, n, generator=gen) < 0.15] = 0.0
        x[torch.rand(m, n, generator=gen) < 0.05] = -0.0
        x[torch.rand(m, generator=gen) < 0.2] = 0.0
    return x.to(dtype)


cases = st.fixed_dictionaries(
    {
        "m": st.integers(0, 9),
        "n": st.one_of(st.integers(0, 3), st.integers(4, 90)),
        "dtype": st.sampled_from([torch.float32, torch.float64]),
        "nodes": st.integers(1, 4),
        "seed": st.integers(0, 2**31),
    }
)


@pytest.mark.parametrize("key", list(SETTINGS))
@given(case=cases, data=st.data())
@settings(max_examples=20)
def test_roundtrip_is_bit_identical_to_per_node_codecs(
    key: str, case: dict[str, Any], data: st.DataObject
) -> None:
    """Two calls in a row: each owner's random sequence carries on as its codec's would."""
    m, nodes = case["m"], case["nodes"]
    seeds = _seeds(case["seed"] % 1000, nodes)
    batched, reference = (
        make_row_codec(_name(key), **SETTINGS[key], seeds=seeds),
        Reference(key, seeds),
    )
    for call, n in enumerate([case["n"], data.draw(cases)["n"]]):  # sizes change, state stays
        owners = torch.tensor(
            data.draw(st.lists(st.integers(0, nodes - 1), min_size=m, max_size=m)),
            dtype=torch.int64,
        )
        x = _rows(case["seed"] + call, m, n, case["dtype"], tie_free=key.startswith("topk"))
        want, sizes = reference.roundtrip(x, owners)
        assert_bit_equal(batched.roundtrip(x, owners), want)
        assert sizes <= {batched.nbytes(n, case["dtype"])}


def test_every_codec_name_is_batched() -> None:
    stochastic = {"qsgd", "randk"}
    for name in CODEC_NAMES:
        codec = make_row_codec(name, seeds=[1])
        assert isinstance(codec, RowCodec) and codec.name == name
        assert codec.deterministic == (name not in stochastic)
    assert {_name(key) for key in SETTINGS} == set(CODEC_NAMES)


@pytest.mark.parametrize("key", list(SETTINGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nbytes_is_the_encoded_size(key: str, dtype: torch.dtype) -> None:
    batched = make_row_codec(_name(key), **SETTINGS[key], seeds=[0])
    codec = make_codec(_name(key), **SETTINGS[key])
    for n in (0, 1, 2, 7, 8, 9, 64, 65, 1000):
        assert batched.nbytes(n, dtype) == codec.encode(torch.zeros(n, dtype=dtype)).nbytes


def test_owners_in_any_order_draw_their_own_sequences() -> None:
    """Interleaved owners, each repeated: a node's k-th row gets its codec's k-th draw."""
    seeds = _seeds(7, 3)
    owners = torch.tensor([2, 0, 0, 2, 1, 2, 0, 2, 2])
    x = _rows(1, len(owners), 33, torch.float32, tie_free=False)
    for key in ("qsgd-4-chunked", "randk-0.1"):
        batched, reference = (
            make_row_codec(_name(key), **SETTINGS[key], seeds=seeds),
            Reference(key, seeds),
        )
        for part in (owners[:4], owners[4:], owners):  # three calls, state carried over
            rows = x[: len(part)]
            assert_bit_equal(batched.roundtrip(rows, part), reference.roundtrip(rows, part)[0])


def test_casts_round_float64_through_float32() -> None:
    """Values whose direct float64 -> half rounding differs from the codec's double one."""
    x = torch.tensor(
        [[1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-40, -(1 + 2**-11 + 2**-45), 3e-8 + 1e-20]],
        dtype=torch.float64,
    )
    for key in ("fp32", "fp16", "bf16"):
        want, _ = Reference(key, [0]).roundtrip(x, torch.tensor([0]))
        assert_bit_equal(make_row_codec(key).roundtrip(x, torch.tensor([0])), want)


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """Long CPU reductions over one 1-D tensor split among threads: force that case."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("key", "options", "n"),
    [
        ("sign", {}, 40_000),
        ("sign", {"chunk": 33_000}, 70_000),  # two full chunks and a long short one
        ("sign", {"chunk": 50_000}, 90_000),  # one full chunk: a lone long reduction
        ("qsgd", {"bits": 4}, 40_000),
        ("qsgd", {"bits": 2, "chunk": 36_000, "scaled": True}, 40_000),
        ("topk", {"ratio": 0.01}, 4 * 65_536),  # sampled threshold, row by row
    ],
)
def test_long_rows(key: str, options: dict[str, Any], n: int) -> None:
    seeds = _seeds(3, 2)
    owners = torch.tensor([1, 0, 1])
    x = _rows(5, len(owners), n, torch.float32, tie_free=True)
    codecs = [make_codec(key, **options, seed=s) for s in seeds]
    batched = make_row_codec(key, **options, seeds=seeds)
    with _threads(2):
        want = torch.stack(
            [codecs[o].decode(codecs[o].encode(x[r])) for r, o in enumerate([1, 0, 1])]
        )
        assert_bit_equal(batched.roundtrip(x, owners), want)


def test_values_the_codec_refuses_raise() -> None:
    x = torch.ones(2, 5)
    x[1, 3] = float("inf")
    owners = torch.tensor([0, 0])
    cases: list[tuple[str, dict[str, Any]]] = [
        ("qsgd", {}),
        ("qsgd", {"chunk": 2}),
        ("sign", {}),
        ("sign", {"chunk": 2}),
    ]
    for name, options in cases:
        codec = make_codec(name, **options)
        with pytest.raises(CompressionError):  # the message engine refuses the row too
            codec.decode(codec.encode(x[1]))
        with pytest.raises(CompressionError, match="not finite"):
            make_row_codec(name, **options, seeds=[0]).roundtrip(x, owners)


def test_bad_arguments_raise() -> None:
    qsgd = make_row_codec("qsgd", seeds=[0, 1])
    with pytest.raises(CompressionError, match="no seed for node 2"):
        qsgd.roundtrip(torch.zeros(2, 3), torch.tensor([0, 2]))
    with pytest.raises(CompressionError, match="float32 or float64"):
        qsgd.roundtrip(torch.zeros(2, 3, dtype=torch.float16), torch.tensor([0, 1]))
    with pytest.raises(CompressionError, match=r"\[m, n\]"):
        qsgd.roundtrip(torch.zeros(3), torch.tensor([0, 1, 1]))
    with pytest.raises(CompressionError, match="owners"):
        qsgd.roundtrip(torch.zeros(2, 3), torch.tensor([0]))
    with pytest.raises(CompressionError, match="'zip'"):
        make_row_codec("zip")
    with pytest.raises(CompressionError, match="bits"):
        make_row_codec("qsgd", bits=3)
    with pytest.raises(CompressionError, match="ratio"):
        make_row_codec("randk", ratio=0.0)
