"""The wire bytes and decoded values of every codec, frozen as digests.

The gRPC protocol carries what ``encode`` packs, so a refactoring of the codecs must not
change a single byte of it, nor a single bit of what ``decode`` returns. Each codec setting
encodes a fixed list of tensors (odd sizes, zeros and ``-0.0``, negative, huge and tiny
values, both float dtypes, rows longer than torch's parallel grain) with a few node seeds,
several messages in a row (the stochastic codecs' draws carry on), and the SHA-256 of
everything it produced is compared with the digest the code gave when it was frozen. A
refused tensor counts by its error class.

Norms, means and some transcendental kernels reduce or round in an order that depends on
the thread count and on the CPU's vector width, so the digests hold on one thread and on the
CPU capability they were frozen on (elsewhere the test skips). To see the digests, run this
module as a script: it prints them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fedcore.compression import codec_seed, get_codec, make_codec
from fedcore.errors import CompressionError

SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "raw": ("raw", {}),
    "fp32": ("fp32", {}),
    "fp16": ("fp16", {}),
    "bf16": ("bf16", {}),
    "qsgd-2": ("qsgd", {"bits": 2}),
    "qsgd-4": ("qsgd", {"bits": 4}),
    "qsgd-8": ("qsgd", {"bits": 8}),
    "qsgd-2-chunked": ("qsgd", {"bits": 2, "chunk": 4}),
    "qsgd-4-chunked-scaled": ("qsgd", {"bits": 4, "chunk": 5, "scaled": True}),
    "qsgd-8-chunked": ("qsgd", {"bits": 8, "chunk": 40_000}),
    "qsgd-8-scaled": ("qsgd", {"bits": 8, "scaled": True}),
    "sign": ("sign", {}),
    "sign-chunk-1": ("sign", {"chunk": 1}),
    "sign-chunk-7": ("sign", {"chunk": 7}),
    "sign-chunk-33000": ("sign", {"chunk": 33_000}),
    "topk-0.01": ("topk", {"ratio": 0.01}),
    "topk-0.3": ("topk", {"ratio": 0.3}),
    "topk-1": ("topk", {"ratio": 1.0}),
    "randk-0.01": ("randk", {"ratio": 0.01}),
    "randk-0.4": ("randk", {"ratio": 0.4}),
    "randk-1": ("randk", {"ratio": 1.0}),
    "fp8": ("fp8", {}),
    "fp8-e5m2-chunked": ("fp8", {"format": "e5m2", "chunk": 5}),
    "float-e4m3": ("float", {"exp_bits": 4, "man_bits": 3}),
    "float-e2m0": ("float", {"exp_bits": 2, "man_bits": 0}),
    "float-e5m7": ("float", {"exp_bits": 5, "man_bits": 7}),
    "float-aps": ("float", {"exp_bits": 3, "man_bits": 2, "scaling": "aps", "layers": [3, 30]}),
    "s2fp8": ("s2fp8", {}),
}

NODES = ((0, 0), (0, 3), (11, 1))
"""``(run seed, node index)`` pairs whose codecs are frozen; each node sends every input."""

MESSAGES = 2
"""Successive messages (rounds) of each input per node."""


def inputs() -> Iterator[torch.Tensor]:
    """The frozen tensors, made from fixed seeds."""
    gen = torch.Generator().manual_seed(20240605)
    for shape in ((0,), (1,), (2,), (7,), (3, 5), (33,), (65,), (1000,), (70_001,)):
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        yield x.to(torch.float32)
        yield x * 1e-3
    x = torch.randn(257, generator=gen)
    x[torch.rand(257, generator=gen) < 0.3] = 0.0
    x[torch.rand(257, generator=gen) < 0.1] = -0.0
    yield x
    yield torch.zeros(9)
    yield -torch.rand(31, generator=gen) - 0.5
    yield torch.randn(40, generator=gen) * 1e18
    yield torch.randn(40, generator=gen) * 1e-30
    yield torch.tensor([3e38, -3e38, 1.0])
    yield torch.randn(4 * 65_536 + 17, generator=gen)  # topk samples a threshold


def _update(digest: Any, *parts: object) -> None:
    for part in parts:
        digest.update(repr(part).encode())
        digest.update(b"\0")


def digests(key: str) -> tuple[str, str]:
    """The SHA-256 of the wire (data, header) and of the decoded values of ``key``, on one
    thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _digests(key)
    finally:
        torch.set_num_threads(before)


def _digests(key: str) -> tuple[str, str]:
    name, options = SETTINGS[key]
    wire, values = hashlib.sha256(), hashlib.sha256()
    tensors = list(inputs())
    for run_seed, node in NODES:
        codec = make_codec(name, **options, seed=codec_seed(run_seed, node))
        for _ in range(MESSAGES):
            for x in tensors:
                try:
                    encoded = codec.encode(x)
                except CompressionError:
                    _update(wire, "refused")
                    continue
                _update(wire, encoded.codec, encoded.dtype, encoded.shape)
                _update(wire, sorted(encoded.params.items()))
                wire.update(encoded.data)
                try:
                    decoded = get_codec(encoded.codec).decode(encoded)
                except CompressionError:
                    _update(values, "refused")
                    continue
                _update(values, decoded.dtype, tuple(decoded.shape))
                values.update(decoded.contiguous().numpy().tobytes())
    return wire.hexdigest(), values.hexdigest()


FROZEN_ON = "AVX512"
"""``torch.backends.cpu.get_cpu_capability()`` where the digests were taken."""

FROZEN: dict[str, tuple[str, str]] = {
    "raw": (
        "3a59d1619f95b16a9c42e435d154b51615736ce173782c15ccfcc49be4e9b4e5",
        "42d2a679e43b8610fc2871959a6886322a66bf16258194bd2a9bd2094ad05235",
    ),
    "fp32": (
        "9d4dcbc088a6191360dbf3d422fa4ef6427eb4d20a4286fba506c65e3ccc9527",
        "b01a7af224652136fbeedf16e23b8fa15eb85e8d626367177d2557b9b5f620a6",
    ),
    "fp16": (
        "0f630a45cd173e2c2c30444886c6d0abbd38c48db2ff2bf25a915b112ca817e7",
        "fe97e88f08f64b4871cf9ee935ac8adcdfbb691c8165c518a140a50aab5d4370",
    ),
    "bf16": (
        "4c84b9d7c7e8f16c5febf49bb257d74962c3e8bffcd1c72316f2a13fb09eb424",
        "d44be57ff1bb59abddc7f70b2a9e3d088eb1afb27bcb6eab609359f21a0aa399",
    ),
    "qsgd-2": (
        "20dceaa5a08c0b75b4876421847438278475560499728c1744e0491d3f3911a2",
        "a16335f5303546b0a4b0c22715bab1d8fa4e11ec1da8ac3a7c90a47782b43344",
    ),
    "qsgd-4": (
        "9d29386bd7a5247b3fe0f4e9b018230e3d206348c488125fc536111554229dd8",
        "6ae9c2835ffe2a76034026b4638089343b5990117a527b6fcb5ac749e5d6c834",
    ),
    "qsgd-8": (
        "ece3133c760f62ac2029ad26ce32e53b3cd6755ecf8cd0e371032153beb017c7",
        "3feac3801e997430c2c1f752d7acb58b89076c0c69291cb2841ce676e93e83db",
    ),
    "qsgd-2-chunked": (
        "0195bfdc746fec70c20f017553d662cbc9219df21e7a14613719fda2c3dc0b3f",
        "58404bf6c209577467a424db38df1604226c38b8cf236f9923262fec7591ad75",
    ),
    "qsgd-4-chunked-scaled": (
        "e4dcffc825948c44e2579baa885c66f73ed273ec3dd0ddfb20434bea86d43ba0",
        "dcc59c0e6efcbbd7761939694f6410520f4ece35e89fbf3d19e1e1688e703229",
    ),
    "qsgd-8-chunked": (
        "08188621311594fd43e82622534bea29476fee77b66f572fdedc391b6bf9d05f",
        "a3493beabfea391c9795bcf557fe255c5655ab3490ae1c0bdcd2acb8c65608cd",
    ),
    "qsgd-8-scaled": (
        "b48366f346e776857e205a2ffbaf6f05bd648c9a343e30c42468b8d43a7c03c8",
        "0b3398bfdc42ef0fb6b65b2a023d4ef4fc19364588c04d00fd2788eabe1653b6",
    ),
    "sign": (
        "f485f851a31a3c7122e3eebcc9007bc01130772f33e5edaa488119cb98b68f64",
        "b8d8c0b7cfc5c317cf029f1cd8085afc54b7203b2b6a31c95014f0cc7348ce60",
    ),
    "sign-chunk-1": (
        "8affff5816603885c6952ae36d54a98711b55ff4c46146093547a5fda283a472",
        "11c0ac37c93cea1edbb0054a1dce431c83e71c10cf07c7ffd5423c8f11f370aa",
    ),
    "sign-chunk-7": (
        "5f306cac9b670906aaf35219996d0aa16dda9dfee377df1f9cf007329ee5ccc9",
        "3e919818d73995e18363609c8f30593546a46fdc2cd11927bda384bb20cb8adb",
    ),
    "sign-chunk-33000": (
        "f6324c1e58d911fd763a9b5e96a97a5d467f531a76a3f81f991a552610dac76b",
        "bab75e0c002f282e7b6a9cfc7ca3d9a02cadea3d2c473db576597727751c5fed",
    ),
    "topk-0.01": (
        "740ab94f5c01e01edfa226cdbbdc52ea37664ebc75cd74ab3cb788b601a21e41",
        "4de81821ea6ed45e8cb42b1f1fedf1c622079fd54841a5662126ecf84929994d",
    ),
    "topk-0.3": (
        "766216150112f4e1b1ea5a3c9f6c11df1399ec7568771a9a483ca13029960eb5",
        "f72842130cef124e11daf5d6f33ddf6e70f7039bf8e39496c40df7d284000d6b",
    ),
    "topk-1": (
        "a9f9169e1b655ca8ed3bae9aea363290b2fdb3cdd78bf7f9adc5942b323a86b6",
        "b01a7af224652136fbeedf16e23b8fa15eb85e8d626367177d2557b9b5f620a6",
    ),
    "randk-0.01": (
        "3c674acc4c23693b873f178cd2d1eca6bc4db7bdbdcb3a7a62b749030084c871",
        "8387cc8ab60f1983f77baebbba53deee3c1eb6aefd5398f89b5b17b5a1981a62",
    ),
    "randk-0.4": (
        "933ae993290346e4f922b957a029407934d3197a8bf0eb37a886509145f0721a",
        "ceafd487c13a71f63033cbe9cea472395f3b5ffd7b100ba25208c8655026d812",
    ),
    "randk-1": (
        "5eeaa42bcd3b0f4d20bb756a013958eef170b80e8f9d3c8c62d9191a96eb9994",
        "b01a7af224652136fbeedf16e23b8fa15eb85e8d626367177d2557b9b5f620a6",
    ),
    "fp8": (
        "aa13f7e33a930a5fb62fa5f51edc7579de073e8d70a3773bde7ee2245a05717d",
        "290326da98b468038374843b5319cc4c4f1c9f70d7631f48557e8f63c7419107",
    ),
    "fp8-e5m2-chunked": (
        "d00348a8d28a53e4762c2bcb2c598abbbd33aee95b735eedd2f1236307088c18",
        "c061cb5b5933ea3dcc6648438cbe97f478b00e15f1eee4000e4305063b4b7c2e",
    ),
    "float-e4m3": (
        "bf8d7eda9efa8f51e646ec512e280b85abc878fb81e366358ca520232eaa6fe5",
        "4df89f6aad48400e51f54fc25617ddf90d1ac95c230f67114bb8d29813971ffd",
    ),
    "float-e2m0": (
        "8cdcb65ce69edfae8ac07792dc54c90466ece8ce8266a23715b95bc922970a2c",
        "dfa1360e1fb1e9df6c9ca722db0e42c4b9176581c66cb3af96175930e234cf78",
    ),
    "float-e5m7": (
        "16359efae684cf0dfe478bed9f616761103f1dacb284426d4752098405735862",
        "6a58a4b84cd1d0b1f04aa2fcce32853fc016da6cf81d869e4a446ab07f8854ec",
    ),
    "float-aps": (
        "383a43bcde6e086c162f7b6db43572f34fdffeff47a1cae36bf4cdd2cd9a48a9",
        "5b8bc46271e7342fac27198b1c1cc51b3493876fef576d65d2c6d5e8f1b92d3a",
    ),
    "s2fp8": (
        "a6afe6e49dc6a8c79ac150efa8cb91202189b5fa7be4bb2f8d290030193cb27f",
        "0e15c7b05324410c27195ce7c0c483bd32097b7b285eadd58d53ca0cd6bc0c6f",
    ),
}


@pytest.mark.parametrize("key", list(SETTINGS))
def test_wire_and_values_are_frozen(key: str) -> None:
    if torch.backends.cpu.get_cpu_capability() != FROZEN_ON:
        pytest.skip(f"digests frozen on {FROZEN_ON} CPU kernels")
    assert digests(key) == FROZEN[key]


if __name__ == "__main__":
    for setting in SETTINGS:
        print(f"    {setting!r}: {digests(setting)!r},")
