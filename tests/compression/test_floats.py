"""The low-precision float codecs: fp8 against torch's casts, ``float`` against fp32 and
fp16, s2fp8's invariants, exact wire sizes, refused bytes, and an end-to-end run."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedcore.compression import CustomFloatCodec, FP8Codec, S2FP8Codec, get_codec
from fedcore.compression.batched import make_row_codec
from fedcore.errors import CompressionError
from tests.clitools import cli


def _rand(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("fmt", "dtype"), [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)]
)
@pytest.mark.parametrize("chunk", [0, 7])
def test_fp8_is_torchs_cast_after_the_same_scaling(
    fmt: str, dtype: torch.dtype, chunk: int
) -> None:
    x = _rand(50) * 10
    codec = FP8Codec(fmt, chunk=chunk)
    encoded = codec.encode(x)
    size = chunk or 50
    top = torch.finfo(dtype).max
    want = torch.empty(50)
    for lo in range(0, 50, size):
        part = x[lo : lo + size]
        scale = part.abs().max() / top
        want[lo : lo + size] = (part / scale).to(dtype).to(torch.float32) * scale
    assert torch.equal(get_codec("fp8").decode(encoded), want)
    assert (
        encoded.nbytes == codec.nbytes(50) == 50 + 4 * math.ceil(50 / size) + 8 * (1 + bool(chunk))
    )
    assert torch.equal(codec.decode(codec.encode(torch.zeros(5))), torch.zeros(5))


def _extremes() -> torch.Tensor:
    tiny, big = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
    sub = torch.tensor([2.0**-149, 3 * 2.0**-149, tiny / 2, tiny * (1 - 2**-23)])
    edge = torch.tensor([tiny, big, -big, 1.0, -0.0, 0.0, 2.0**127, 1 + 2**-23])
    return torch.cat([sub, -sub, edge])


def test_float_e8m23_is_exactly_fp32() -> None:
    codec = CustomFloatCodec(8, 23)
    bits = torch.randint(-(2**31), 2**31 - 1, (4000,), generator=torch.Generator().manual_seed(1))
    random = bits.to(torch.int32).view(torch.float32)
    random = random[torch.isfinite(random)]
    for x in (_rand(1000) * 1e3, random, _extremes()):
        y = codec.decode(codec.encode(x))
        assert torch.equal(y.view(torch.int32), x.view(torch.int32))  # -0.0 too


def test_float_e5m10_is_fp16_and_saturates() -> None:
    codec = CustomFloatCodec(5, 10)
    sub = torch.linspace(-(2.0**-14), 2.0**-14, 999) * 1.37  # subnormals, and below them
    x = torch.cat([_rand(2000) * 100, sub, torch.tensor([65504.0, 65519.0, 2.0**-25, 2.0**-24])])
    assert torch.equal(codec.decode(codec.encode(x)), x.half().float())
    over = torch.tensor([65520.0, 1e6, -1e30])
    assert torch.isinf(over.half()).all()  # fp16 overflows; this codec saturates
    assert codec.decode(codec.encode(over)).tolist() == [65504.0, 65504.0, -65504.0]


@pytest.mark.parametrize(("e", "m"), [(4, 3), (3, 0), (2, 0), (6, 9)])
def test_float_wire_size(e: int, m: int) -> None:
    codec = CustomFloatCodec(e, m)
    for n in (0, 1, 3, 8, 101):
        encoded = codec.encode(_rand(n))
        assert len(encoded.data) == math.ceil(n * (1 + e + m) / 8)
        assert encoded.nbytes == codec.nbytes(n) == len(encoded.data) + 16


def test_float_e3m0_values() -> None:
    codec = CustomFloatCodec(3, 0)  # bias 3: 0.25 .. 8, no subnormals but zero
    x = torch.tensor([0.3, 0.1, 3.0, 5.0, 100.0, -6.0, 0.0])
    assert codec.decode(codec.encode(x)).tolist() == [0.25, 0.0, 4.0, 4.0, 8.0, -8.0, 0.0]


def test_s2fp8_keeps_signs_and_zeros_within_its_bound() -> None:
    x = _rand(3000) * torch.exp2(torch.linspace(-20, 10, 3000))
    x[::7] = 0.0
    codec = S2FP8Codec()
    encoded = codec.encode(x)
    assert encoded.nbytes == codec.nbytes(3000) == 3008
    y = get_codec("s2fp8").decode(encoded)
    assert torch.equal(y == 0, x == 0)
    assert torch.equal(torch.signbit(y[x != 0]), torch.signbit(x[x != 0]))
    alpha, beta = torch.frombuffer(bytearray(encoded.data[:8]), dtype=torch.float32).tolist()
    nz = x != 0
    shifted = alpha * torch.log2(x[nz].double().abs()) + beta
    normal = shifted >= -14  # e5m2's normal range in the transformed domain: 2 mantissa bits
    assert int(normal.sum()) > 2000
    ratio = (y[nz].double() / x[nz].double()).abs() ** alpha
    assert float((ratio[normal] - 1).abs().max()) <= 2.0**-3 * (1 + 1e-3)


def test_non_finite_input_is_refused() -> None:
    for codec in (FP8Codec(), CustomFloatCodec(), S2FP8Codec()):
        for bad in (math.nan, math.inf):
            with pytest.raises(CompressionError):
                codec.encode(torch.tensor([1.0, bad]))


@pytest.mark.parametrize(
    "codec", [FP8Codec(), FP8Codec("e5m2", chunk=3), CustomFloatCodec(3, 2), S2FP8Codec()]
)
def test_bad_bytes_and_headers_raise(codec: FP8Codec | CustomFloatCodec | S2FP8Codec) -> None:
    encoded = codec.encode(_rand(10))
    decode = get_codec(codec.name).decode
    for data in (encoded.data[:-1], encoded.data + b"\0", b""):
        with pytest.raises(CompressionError):
            decode(replace(encoded, data=data))
    for key in encoded.params:
        for value in (math.nan, -1.0, 99.0, 2.5):
            with pytest.raises(CompressionError):
                decode(replace(encoded, params={**encoded.params, key: value}))
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):  # random bytes: a tensor or CompressionError, never a crash
        data = bytes(torch.randint(0, 256, (len(encoded.data),), generator=gen).tolist())
        try:
            out = decode(replace(encoded, data=data))
        except CompressionError:
            continue
        assert out.shape == (10,) and bool(torch.isfinite(out).all())


def test_reserved_codes_raise() -> None:
    nan8 = FP8Codec().encode(torch.ones(2))
    with pytest.raises(CompressionError):
        FP8Codec().decode(replace(nan8, data=b"\x7f" + nan8.data[1:]))
    enc = CustomFloatCodec(2, 1).encode(torch.tensor([1.0, 1.0]))  # 4 bits each
    with pytest.raises(CompressionError):  # exponent 11: reserved
        CustomFloatCodec().decode(replace(enc, data=bytes([0x66])))


def test_rows_are_the_codec_bit_for_bit() -> None:
    x = _rand(3 * 40).reshape(3, 40) * 5
    for name, opts, codec in (
        ("fp8", {"format": "e5m2", "chunk": 6}, FP8Codec("e5m2", chunk=6)),
        ("float", {"exp_bits": 3, "man_bits": 1}, CustomFloatCodec(3, 1)),
        ("s2fp8", {}, S2FP8Codec()),
    ):
        rows = make_row_codec(name, **opts, seeds=[0, 1, 2])  # type: ignore[arg-type]
        want = torch.stack([codec.decode(codec.encode(r)) for r in x])
        assert torch.equal(rows.roundtrip(x, torch.tensor([0, 1, 2])), want)
        assert rows.deterministic and rows.nbytes(40) == codec.encode(x[0]).nbytes


def test_fp8_end_to_end_on_both_engines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--set", "compression.codec=fp8", "--set", "algorithm.name=dpsgd"]
    args += ["--set", "topology.kind=ring", "--set", "run.rounds=20", "-q"]
    digests = []
    for engine in ("messages", "vectorized"):
        status, out, err = cli(capsys, "simulate", *args, "--engine", engine)
        assert status == 0, err
        folder = Path(out.split("results: ", 1)[1].strip())
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["final"]["avg_model_accuracy"] > 0.5
        digests.append(summary["params_sha256"])
    assert digests[0] == digests[1]


def test_the_float_options_reach_every_engine(tmp_path: Path) -> None:
    """``compression.exp_bits``/``man_bits`` (not only the defaults) on both engines."""
    from fedcore.config import load_config
    from fedcore.runners.simulate import simulate

    base = ["run.rounds=6", "compression.codec=float", "compression.exp_bits=5"]
    base += ["compression.man_bits=2", "algorithm.name=dpsgd", "topology.kind=ring"]
    digests = []
    for engine in ("messages", "vectorized"):
        config = load_config(None, [*base, f"simulate.engine={engine}"])
        summary = simulate(config, out_dir=tmp_path / engine, show_progress=False)
        digests.append(summary["params_sha256"])
    assert digests[0] == digests[1]
