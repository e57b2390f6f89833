"""The low-precision float codecs: fp8 against torch's casts, ``float`` against fp32 and
fp16, s2fp8's invariants, exact wire sizes, refused bytes, and an end-to-end run."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.compression import CustomFloatCodec, FP8Codec, S2FP8Codec, get_codec
from fedcore.compression.batched import make_row_codec
from fedcore.compression.floats import aps_shift
from fedcore.errors import CompressionError
from fedcore.messages import EncodedTensor
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
    from fedcore.simulation.simulate import simulate

    base = ["run.rounds=6", "compression.codec=float", "compression.exp_bits=5"]
    base += ["compression.man_bits=2", "algorithm.name=dpsgd", "topology.kind=ring"]
    digests = []
    for engine in ("messages", "vectorized"):
        config = load_config(None, [*base, f"simulate.engine={engine}"])
        summary = simulate(config, out_dir=tmp_path / engine, show_progress=False)
        digests.append(summary["params_sha256"])
    assert digests[0] == digests[1]


# --- APS: per-layer power-of-two shifts (issue 15) -------------------------------------------

LAYERS = (30, 7, 50, 13)


def _layered(seed: int = 0) -> torch.Tensor:
    """Four layers of very different magnitudes, as a model's gradient has."""
    scales = (1.0, 1e-3, 1e-6, 300.0)
    parts = [_rand(k, seed + i) * s for i, (k, s) in enumerate(zip(LAYERS, scales, strict=True))]
    return torch.cat(parts)


def _table(encoded: Any) -> np.ndarray:
    from fedcore.compression.floats.custom import _APS_LAYER

    return np.frombuffer(encoded.data, dtype=_APS_LAYER, count=int(encoded.params["layers"]))


@pytest.mark.parametrize(("e", "m"), [(4, 3), (3, 0), (5, 2), (2, 1)])
def test_aps_shifts_are_powers_of_two_and_exact(e: int, m: int) -> None:
    """Each layer's shift puts its largest value in the top binade; the APS encoding is the
    plain encoding of ``x * 2**s``, divided by ``2**s`` on the way back: bit for bit."""
    x = _layered()
    aps = CustomFloatCodec(e, m, scaling="aps", layers=LAYERS)
    plain = CustomFloatCodec(e, m)
    encoded = aps.encode(x)
    assert (
        len(encoded.data) == aps.wire_bytes(x.numel()) == 6 * 4 + -(-x.numel() * (1 + e + m) // 8)
    )
    assert encoded.nbytes == aps.nbytes(x.numel())
    table = _table(encoded)
    assert table["numel"].tolist() == list(LAYERS)
    _, _, top = CustomFloatCodec.limits(e, m)
    y = get_codec("float").decode(encoded)
    at = 0
    for size, shift in zip(LAYERS, table["shift"].tolist(), strict=True):
        part = x[at : at + size].double()
        largest = float(part.abs().max())
        assert largest * 2.0**shift <= top < largest * 2.0 ** (shift + 1)
        assert shift == aps_shift(largest, top)
        shifted = (part * 2.0**shift).float()
        assert torch.equal(shifted.double(), part * 2.0**shift)  # the shift itself is exact
        expected = (plain.decode(plain.encode(shifted)).double() / 2.0**shift).float()
        assert torch.equal(y[at : at + size], expected)
        at += size


def test_aps_e8m23_is_still_exactly_fp32() -> None:
    x = _layered(3)
    codec = CustomFloatCodec(8, 23, scaling="aps", layers=LAYERS)
    assert torch.equal(codec.decode(codec.encode(x)), x)


def test_aps_summands_leave_room_for_the_sum() -> None:
    x = _layered(5)
    _, _, top = CustomFloatCodec.limits(4, 3)
    for k in (1, 3, 16):
        table = _table(CustomFloatCodec(4, 3, scaling="aps", layers=LAYERS, summands=k).encode(x))
        for size, shift, at in zip(
            LAYERS, table["shift"], np.cumsum((0, *LAYERS[:-1])), strict=True
        ):
            largest = float(x[at : at + size].abs().max())
            assert k * largest * 2.0 ** int(shift) <= top < k * largest * 2.0 ** (int(shift) + 1)


def test_a_tensor_that_is_not_the_model_is_one_layer() -> None:
    codec = CustomFloatCodec(4, 3, scaling="aps", layers=LAYERS)
    encoded = codec.encode(_rand(17))  # an RPS block, say
    assert _table(encoded)["numel"].tolist() == [17]
    assert len(encoded.data) == codec.wire_bytes(17) == 6 + -(-17 * 8 // 8)
    zeros = codec.decode(codec.encode(torch.zeros(9)))
    assert torch.equal(zeros, torch.zeros(9))


def test_aps_flushes_fewer_of_a_real_gradient_to_zero() -> None:
    """On the digits MLP's real gradient, a 4-bit (e3m0) and an e4m3 cast flush most small
    values to zero; APS's shifts keep many more of them."""
    from fedcore.config import load_config
    from fedcore.setup.prepare import prepare_run

    setup = prepare_run(load_config(None, ["model.name=mlp", "topology.nodes=4"]))
    objective = setup.objective()
    x, y = setup.dataset.x_train[:32], setup.dataset.y_train[:32]
    _, grad = objective.loss_and_grad(objective.initial_params(), x, y)
    layers = setup.layers
    assert len(layers) == 4 and sum(layers) == grad.numel()
    nonzero = grad != 0
    for e, m in ((3, 0), (4, 3)):
        flushed = {}
        for scaling in ("none", "aps"):
            codec = CustomFloatCodec(e, m, scaling=scaling, layers=layers)
            decoded = codec.decode(codec.encode(grad))
            flushed[scaling] = int((nonzero & (decoded == 0)).sum())
        assert flushed["aps"] < flushed["none"], (e, m, flushed)


def test_bad_aps_tables_raise() -> None:
    from fedcore.compression.floats.custom import _APS_LAYER

    codec = CustomFloatCodec(4, 3, scaling="aps", layers=(3, 5))
    good = codec.encode(_rand(8))
    table = _table(good).copy()
    body = good.data[table.nbytes :]

    def with_table(t: np.ndarray, **params: float) -> Any:
        return replace(
            good, data=t.astype(_APS_LAYER).tobytes() + body, params={**good.params, **params}
        )

    wrong_sizes = table.copy()
    wrong_sizes["numel"] = (3, 4)
    huge_shift = table.copy()
    huge_shift["shift"] = (0, 1001)
    overflow = table.copy()
    overflow["shift"] = (-1000, 0)
    empty = table.copy()
    empty["numel"] = (0, 8)
    for bad in (
        with_table(wrong_sizes),
        with_table(huge_shift),
        with_table(overflow),
        with_table(empty),
        replace(good, params={**good.params, "layers": 3.0}),
        replace(good, params={**good.params, "layers": 0.0}),
        replace(good, params={**good.params, "layers": 1.5}),
        replace(good, data=good.data[:5]),
    ):
        with pytest.raises(CompressionError):
            get_codec("float").decode(bad)


@given(data=st.binary(max_size=80), layers=st.integers(-1, 4), e=st.integers(2, 8))
@settings(max_examples=60)
def test_fuzzed_aps_bytes_never_crash(data: bytes, layers: int, e: int) -> None:
    encoded = EncodedTensor(
        codec="float",
        dtype="float32",
        shape=(12,),
        data=data,
        params={"exp_bits": float(e), "man_bits": 2.0, "layers": float(layers)},
    )
    try:
        y = get_codec("float").decode(encoded)
    except CompressionError:
        return
    assert y.shape == (12,) and bool(torch.isfinite(y).all())


def test_aps_reaches_both_engines_and_learns_where_a_plain_cast_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """D-PSGD with 4-bit (e3m0) models: the plain cast flushes the MLP's small weights and
    does not learn; with APS it does, and both engines agree bit for bit."""
    args = [
        "--set", "algorithm.name=dpsgd", "--set", "topology.kind=ring", "--set", "model.name=mlp",
        "--set", "compression.codec=float", "--set", "compression.exp_bits=3",
        "--set", "compression.man_bits=0", "--set", "run.rounds=60", "--set", "run.eval_every=60",
        "--set", "algorithm.lr=0.3", "--set", "topology.nodes=8", "-q",
    ]  # fmt: skip
    out = {}
    for scaling in ("none", "aps"):
        for engine in ("vectorized", "messages"):
            folder = tmp_path / f"{scaling}-{engine}"
            status, _, err = cli(
                capsys, "simulate", *args, "--set", f"compression.scaling={scaling}",
                "--engine", engine, "--out", str(folder),
            )  # fmt: skip
            assert status == 0, err
            out[scaling, engine] = json.loads((folder / "summary.json").read_text())
    for scaling in ("none", "aps"):
        assert (
            out[scaling, "vectorized"]["params_sha256"] == out[scaling, "messages"]["params_sha256"]
        )
    assert out["aps", "messages"]["final"]["avg_model_accuracy"] > 0.5
    assert out["none", "messages"]["final"]["avg_model_accuracy"] < 0.35
    sent = {k: out[k, "messages"]["traffic"]["bytes_sent"] for k in ("none", "aps")}
    assert sent["aps"] > sent["none"]  # the layer table: 6 bytes a layer and one scalar
