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
    CODEC_NAMES,
    CODECS,
    CastCodec,
    Codec,
    QSGDCodec,
    RandKCodec,
    SignCodec,
    TopKCodec,
    get_codec,
    make_codec,
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
    "sign": {},
    "sign-chunked": {"chunk": 7},
    "topk": {"ratio": 0.1},
    "randk": {"ratio": 0.1},
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
    if key.startswith("qsgd"):
        s = 2 ** (int(key.split("-")[1]) - 1) - 1
        norm = float(torch.linalg.vector_norm(flat_x))
        return bool(((flat_x - flat_y).abs() <= norm / s * (1 + 1e-5) + 1e-6).all())
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
    "codec", [QSGDCodec(2), QSGDCodec(4), RandKCodec(0.1)], ids=["qsgd-2", "qsgd-4", "randk"]
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
    assert set(CODEC_NAMES) == {"fp32", "fp16", "bf16", "qsgd", "sign", "topk", "randk", "raw"}
    assert set(CODEC_NAMES) <= set(CODECS)
    assert isinstance(get_codec("fp16"), CastCodec)
