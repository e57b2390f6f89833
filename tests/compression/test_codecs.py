"""One contract suite over every codec, plus each codec's own statistical promise."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.compression import (
    CastCodec,
    Codec,
    QSGDCodec,
    RandKCodec,
    SignCodec,
    TopKCodec,
    get_codec,
    make_codec,
    topk_indices,
)
from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor

SETTINGS = {
    "fp32": {},
    "fp16": {},
    "bf16": {},
    "qsgd-2": {"bits": 2},
    "qsgd-4": {"bits": 4},
    "qsgd-8": {"bits": 8},
    "qsgd-4-chunked": {"bits": 4, "chunk": 5},
    "qsgd-2-scaled": {"bits": 2, "chunk": 4, "scaled": True},
    "sign": {},
    "sign-chunked": {"chunk": 7},
    "topk": {"ratio": 0.1},
    "randk": {"ratio": 0.1},
    "fp8": {},
    "fp8-e5m2-chunked": {"format": "e5m2", "chunk": 6},
    "float": {"exp_bits": 4, "man_bits": 3},
    "float-e3m0": {"exp_bits": 3, "man_bits": 0},
    "float-e8m23": {"exp_bits": 8, "man_bits": 23},
    "float-aps": {"exp_bits": 3, "man_bits": 1, "scaling": "aps", "layers": (30, 10)},
    "s2fp8": {},
}


def _codec(key: str) -> Codec:
    name = key.split("-")[0]
    return make_codec(name, seed=3, **SETTINGS[key])


def _error_ok(key: str, x: torch.Tensor, y: torch.Tensor) -> bool:
    """Each codec's deterministic error bound."""
    flat_x, flat_y = x.reshape(-1).double(), y.reshape(-1).double()
    if key == "fp32":
        return torch.equal(flat_x.float(), flat_y.float())
    if key in ("fp16", "bf16"):
        rel = 2.0**-11 if key == "fp16" else 2.0**-8
        return bool(((flat_x - flat_y).abs() <= rel * flat_x.abs() + 1e-7).all())
    if key.startswith("qsgd"):  # within one level of its bucket (a bucket's norm / s)
        s = 2 ** (int(key.split("-")[1]) - 1) - 1
        chunk = int(SETTINGS[key].get("chunk", 0)) or flat_x.numel()
        pad = -flat_x.numel() % chunk
        norms = torch.linalg.vector_norm(
            torch.cat([flat_x, flat_x.new_zeros(pad)]).reshape(-1, chunk), dim=1
        ).repeat_interleave(chunk)[: flat_x.numel()]
        if key.endswith("scaled"):  # contractive: a shrunk copy of the unbiased quantization
            flat_y = flat_y * (1 + QSGDCodec(2, chunk=chunk).omega(flat_x.numel()))
        return bool(((flat_x - flat_y).abs() <= norms / s * (1 + 1e-5) + 1e-6).all())
    if key.startswith("sign"):  # every value is +-scale with the input's sign
        same = (flat_y >= 0) == (flat_x >= 0)
        return bool(same.all())
    if key == "topk":
        kept = flat_y != 0
        return bool(torch.allclose(flat_y[kept], flat_x[kept].float().double(), atol=1e-6))
    return True  # randk: unbiasedness is tested statistically


tensors = st.builds(
    lambda shape, seed, dtype: torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(
        dtype
    ),
    st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
    st.integers(0, 10**6),
    st.sampled_from([torch.float32, torch.float64]),
)


@pytest.mark.parametrize("key", list(SETTINGS))
@given(x=tensors)
@settings(max_examples=25)
def test_round_trip_contract(key: str, x: torch.Tensor) -> None:
    """Shape and dtype restored, size as promised, error within the codec's bound."""
    codec = _codec(key)
    encoded = codec.encode(x)
    assert len(encoded.data) == codec.wire_bytes(x.numel())  # type: ignore[attr-defined]
    y = get_codec(encoded.codec).decode(encoded)  # a receiver decodes by name alone
    assert y.shape == x.shape and y.dtype == x.dtype
    assert _error_ok(key, x, y)


def test_qsgd_size_is_bits_per_value_plus_bucket_norms() -> None:
    x = torch.randn(1000)
    assert len(QSGDCodec(2, chunk=100).encode(x).data) == 250 + 4 * 10
    assert len(QSGDCodec(8, chunk=300).encode(x).data) == 1000 + 4 * 4


def test_sign_size_is_one_bit_per_value_plus_scales() -> None:
    x = torch.randn(1000)
    assert len(SignCodec().encode(x).data) == 125
    assert len(SignCodec(chunk=100).encode(x).data) == 125 + 4 * 10
    assert len(QSGDCodec(2).encode(x).data) == 250
    assert len(QSGDCodec(4).encode(x).data) == 500


def test_topk_keeps_exactly_the_k_largest_magnitudes() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    y = TopKCodec(ratio=0.05).decode(TopKCodec(ratio=0.05).encode(x))
    kept = set(torch.nonzero(y).reshape(-1).tolist())
    assert kept == set(torch.topk(x.abs(), 50).indices.tolist())
    assert torch.equal(y[list(kept)], x[list(kept)])


@pytest.mark.parametrize(
    "codec",
    [QSGDCodec(2), QSGDCodec(4), QSGDCodec(2, chunk=8), RandKCodec(0.1)],
    ids=["qsgd-2", "qsgd-4", "qsgd-2-chunked", "randk"],
)
def test_unbiased(codec: Codec) -> None:
    """The mean of many decodings approaches the input (fixed seed: deterministic)."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(2))
    mean = torch.zeros(64, dtype=torch.float64)
    trials = 4000
    for _ in range(trials):
        mean += codec.decode(codec.encode(x)).double()
    mean /= trials
    spread = float(x.abs().max()) * (10 if isinstance(codec, RandKCodec) else 2)
    assert float((mean - x.double()).abs().max()) < 4 * spread / math.sqrt(trials)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_scaled_qsgd_is_contractive(bits: int) -> None:
    """Scaled QSGD is plain QSGD shrunk by 1 + omega, and E||C(x) - x||^2 < ||x||^2."""
    x = torch.randn(500, generator=torch.Generator().manual_seed(3))
    plain = QSGDCodec(bits, generator=torch.Generator().manual_seed(4))
    scaled = QSGDCodec(bits, scaled=True, generator=torch.Generator().manual_seed(4))
    shrink = 1 + scaled.omega(500)
    errors, norm2 = [], float(x.square().sum())
    for _ in range(200):
        a, b = plain.decode(plain.encode(x)), get_codec("qsgd").decode(scaled.encode(x))
        torch.testing.assert_close(b, a / shrink)
        errors.append(float((b - x).square().sum()))
    assert sum(errors) / len(errors) <= (1 - 1 / shrink) * norm2 * 1.05
    if bits < 8:  # plain QSGD at few bits is not contractive: that is why scaling exists
        assert float((a - x).square().sum()) > norm2


def test_stochastic_codecs_replay_with_their_seed() -> None:
    x = torch.randn(100)
    for name in ("qsgd", "randk"):
        a, b = make_codec(name, seed=5), make_codec(name, seed=5)
        assert a.encode(x) == b.encode(x)
        assert make_codec(name, seed=6).encode(x) != a.encode(x)


def test_randk_sends_a_seed_not_indices() -> None:
    enc = RandKCodec(0.1).encode(torch.randn(1000))
    assert len(enc.data) == 4 * 100 and "seed" in enc.params


BAD_HEADERS = {
    "truncated": lambda e: replace(e, data=e.data[:-1]),
    "extended": lambda e: replace(e, data=e.data + b"\x00"),
    "other-codec": lambda e: replace(e, codec="nope"),
    "bad-dtype": lambda e: replace(e, dtype="int8"),
    "huge-shape": lambda e: replace(e, shape=(1 << 30, 1 << 30)),
    "negative-shape": lambda e: replace(e, shape=(-1,)),
}


@pytest.mark.parametrize("key", list(SETTINGS))
@pytest.mark.parametrize("corrupt", list(BAD_HEADERS))
def test_bad_headers_raise_compression_error(key: str, corrupt: str) -> None:
    encoded = _codec(key).encode(torch.randn(40))
    broken = BAD_HEADERS[corrupt](encoded)
    codec = get_codec(encoded.codec)
    with pytest.raises(CompressionError):
        codec.decode(broken)


@pytest.mark.parametrize(
    "name,params",
    [
        ("qsgd", {"bits": 3.0, "norm": 1.0}),
        ("qsgd", {"bits": 8.0, "norm": float("nan")}),
        ("qsgd", {"bits": 8.0}),
        ("qsgd", {"bits": 8.0, "chunk": 0.5}),
        ("topk", {"k": 41.0}),
        ("topk", {"k": 2.5}),
        ("randk", {"k": 4.0, "seed": -1.0}),
        ("sign", {"chunk": -3.0}),
    ],
)
def test_absurd_parameters_raise(name: str, params: dict[str, float]) -> None:
    encoded = make_codec(name, ratio=0.1).encode(torch.randn(40))
    with pytest.raises(CompressionError):
        get_codec(name).decode(replace(encoded, params=params))


@pytest.mark.parametrize("key", list(SETTINGS))
@given(
    data=st.binary(max_size=200),
    params=st.dictionaries(
        st.sampled_from(["bits", "norm", "k", "seed", "chunk", "scale"]),
        st.floats(allow_nan=True, allow_infinity=True),
        max_size=4,
    ),
)
@settings(max_examples=40)
def test_fuzzed_bytes_never_crash(key: str, data: bytes, params: dict[str, float]) -> None:
    """Random bytes and parameters: a correct tensor of the right size, or CompressionError."""
    name = key.split("-")[0]
    encoded = EncodedTensor(codec=name, dtype="float32", shape=(40,), data=data, params=params)
    try:
        y = get_codec(name).decode(encoded)
    except CompressionError:
        return
    assert y.shape == (40,) and y.dtype == torch.float32


def test_topk_index_out_of_range() -> None:
    enc = TopKCodec(0.1).encode(torch.randn(40))
    idx = np.frombuffer(enc.data, dtype="<u4").copy()
    idx[0] = 40
    with pytest.raises(CompressionError, match="index"):
        get_codec("topk").decode(replace(enc, data=idx.tobytes()))


def test_qsgd_level_out_of_range() -> None:
    enc = QSGDCodec(2).encode(torch.randn(8))
    with pytest.raises(CompressionError, match="level"):
        get_codec("qsgd").decode(replace(enc, data=b"\xff\xff"))


def test_registry_errors_name_the_codec() -> None:
    with pytest.raises(CompressionError, match="'zip'"):
        make_codec("zip")
    with pytest.raises(CompressionError, match="bits"):
        make_codec("qsgd", bits=3)
    with pytest.raises(CompressionError, match="ratio"):
        make_codec("topk", ratio=0.0)
    assert isinstance(get_codec("fp16"), CastCodec)


@pytest.mark.parametrize("n", [300_000, 1_000_000])
@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.2])
def test_threshold_topk_equals_exact_topk(n: int, ratio: float) -> None:
    """The sampled-threshold selection returns exactly torch.topk's indices."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    k = math.ceil(ratio * n)
    exact = torch.topk(x.abs(), k, sorted=False).indices.sort().values
    assert torch.equal(topk_indices(x, k), exact)
    heavy = x**3  # heavy tails: a threshold far from the bulk
    exact = torch.topk(heavy.abs(), k, sorted=False).indices.sort().values
    assert torch.equal(topk_indices(heavy, k), exact)


def test_review_cases_of_malformed_headers() -> None:
    """A huge qsgd chunk decodes without allocating per chunk; duplicate top-k indices
    and negative sign scales are refused."""
    enc = QSGDCodec(8, chunk=4).encode(torch.randn(10))
    huge = replace(enc, params={"bits": 8.0, "chunk": float(2**40)}, data=enc.data[:14])
    assert torch.isfinite(get_codec("qsgd").decode(huge)).all()
    top = TopKCodec(0.3).encode(torch.randn(10))
    idx = np.frombuffer(top.data, dtype="<u4", count=3).copy()
    idx[1] = idx[0]
    with pytest.raises(CompressionError, match="strictly increasing"):
        get_codec("topk").decode(replace(top, data=idx.tobytes() + top.data[12:]))
    sign = SignCodec().encode(torch.randn(10))
    with pytest.raises(CompressionError, match="negative scale"):
        get_codec("sign").decode(replace(sign, params={"scale": -1.0}))
    chunked = SignCodec(chunk=5).encode(torch.randn(10))
    scales = np.frombuffer(chunked.data, dtype="<f4", offset=2).copy()
    scales[0] = -1.0
    with pytest.raises(CompressionError, match="negative"):
        get_codec("sign").decode(replace(chunked, data=chunked.data[:2] + scales.tobytes()))
