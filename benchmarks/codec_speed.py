# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Codec speed and wire size: fedcore's codecs against a memory-copy floor.

Two measurements.

**Speed.** Every codec ``fedcore.compression.make_codec`` builds (raw, fp32, fp16, bf16,
qsgd with 2/4/8 bits, sign per tensor and per 4096 values, topk and randk at 1%) encodes
and decodes one float32 tensor of each ``--sizes`` (default 1M and 16M values). Encode,
decode and the two together are timed in the same call (three clock readings), repeats
interleave the codecs (the order rotates each repeat) and the tables give medians. Speed is
GB/s of input, 4 bytes per value / seconds, next to the floor measured in the same run:
``dst.copy_(src)`` into a preallocated tensor of the same size. Target (from the issue):
sign, QSGD-8 and fp16 encode *and* decode at least 0.2x the copy's GB/s.

Beside it: exact ``torch.topk`` at the largest size and 1% against TopKCodec's selection
(``topk_indices``: the k-th magnitude estimated from a random sample, then an exact
``topk`` of the candidates above it) and against that threshold alone; and a timing of the
steps of every codec that misses its target, plus topk and randk.

**Wire size.** One message of a ``--wire-params`` (default 1,000,000) parameter model: a
float32 tensor ``"x"`` and the push-sum scalar ``"omega"``. For every codec: the ideal
payload (the codec's ``wire_bytes(n)`` and the information-theoretic size: n*bits/8 for
the packed formats, 8k for topk, 4k for randk), the bytes fedcore's gRPC wire carries (the
sum of the lengths of ``fedcore.transport.grpc.serde.message_to_wire(message)``, exactly
what goes into gRPC messages), and the overhead. gRPC's own framing (5 bytes per gRPC
message, 9 bytes per HTTP/2 DATA frame of at most 16 KiB) is an estimate, reported apart.
Target: at most 2% framing overhead.

Usage::

    python benchmarks/codec_speed.py [--sizes 1000000 16000000] [--repeats 5]
        [--out benchmarks/results/codecs.json] [--wire-params 1000000]
        [--malloc tuned|default] [--threads 1]

(The file is named like the standard library's ``codecs``; running it as a script is
safe because Python imports the standard ``codecs`` before the script's folder is on
``sys.path``. Do not import it as a module from ``benchmarks/``.)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Runnable as `python benchmarks/codec_speed.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.compression import RandKCodec, make_codec, topk_indices
from fedcore.compression.codecs import _pack, _unpack  # mirrored in the step timings
from fedcore.deploy.peer import tune_malloc
from fedcore.messages import EncodedTensor, Message
from fedcore.transport.grpc.serde import CHUNK_BYTES, MessageAssembler, message_to_wire

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "codecs.json"

# (label, make_codec name, make_codec options)
CODECS: list[tuple[str, str, dict[str, Any]]] = [
    ("raw", "raw", {}),
    ("fp32", "fp32", {}),
    ("fp16", "fp16", {}),
    ("bf16", "bf16", {}),
    ("qsgd-2", "qsgd", {"bits": 2}),
    ("qsgd-4", "qsgd", {"bits": 4}),
    ("qsgd-8", "qsgd", {"bits": 8}),
    ("sign", "sign", {"chunk": 0}),
    ("sign-4096", "sign", {"chunk": 4096}),
    ("topk-1%", "topk", {"ratio": 0.01}),
    ("randk-1%", "randk", {"ratio": 0.01}),
    ("fp8-e4m3", "fp8", {"format": "e4m3"}),
    ("fp8-e5m2-4096", "fp8", {"format": "e5m2", "chunk": 4096}),
    ("float-e4m3", "float", {"exp_bits": 4, "man_bits": 3}),
    ("float-e3m0", "float", {"exp_bits": 3, "man_bits": 0}),
    # APS: one layer here (the tensor is not a model with layers): its shift table, then
    # the shifted values
    ("float-e4m3-aps", "float", {"exp_bits": 4, "man_bits": 3, "scaling": "aps"}),
    ("s2fp8", "s2fp8", {}),
]
SPEED_TARGET = 0.2  # codec GB/s / copy GB/s, for encode and for decode
TARGETED = ("fp16", "qsgd-8", "sign", "sign-4096")
ALWAYS_PROFILED = ("topk-1%", "randk-1%")  # no target: reported, and their steps timed
WIRE_TARGET = 0.02  # (wire - ideal) / ideal
GRPC_PREFIX = 5  # bytes before every gRPC message: compressed flag + 4-byte length
HTTP2_FRAME_HEADER = 9
HTTP2_MAX_FRAME = 16384  # HTTP/2's initial SETTINGS_MAX_FRAME_SIZE: the most frames
TOPK_SAMPLE = 1 << 16  # magnitudes sampled to estimate the k-th largest


def gbps(n: int, seconds: float) -> float:
    """GB/s of float32 input: 4 bytes per value."""
    return 4 * n / seconds / 1e9 if seconds > 0 else math.inf


def median(xs: list[float]) -> float:
    return statistics.median(xs)


# --------------------------------------------------------------------------- speed


def bench_speed(n: int, repeats: int, seed: int) -> dict[str, Any]:
    """Median encode/decode/round-trip seconds of every codec and of the copy floor."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    dst = torch.empty_like(x)
    codecs = {label: make_codec(name, seed=seed, **opts) for label, name, opts in CODECS}
    # Warm-up: the first call of each op and the first use of each buffer size.
    dst.copy_(x)
    for codec in codecs.values():
        out = codec.decode(codec.encode(x))
        if out.shape != x.shape or out.dtype != x.dtype:
            raise SystemExit(f"{codec.name}: decode returned {out.dtype} {tuple(out.shape)}.")
        del out
    copy_s: list[float] = []
    times: dict[str, dict[str, list[float]]] = {
        label: {"encode": [], "decode": [], "roundtrip": []} for label in codecs
    }
    labels = list(codecs)
    for r in range(repeats):
        gc.collect()
        shift = r % len(labels)
        for label in labels[shift:] + labels[:shift]:
            # The floor is timed after every codec, so that it runs in the same cache state
            # as the codecs do (after other work), not back to back with itself.
            t0 = time.perf_counter()
            dst.copy_(x)
            copy_s.append(time.perf_counter() - t0)
            codec = codecs[label]
            t0 = time.perf_counter()
            encoded = codec.encode(x)
            t1 = time.perf_counter()
            decoded = codec.decode(encoded)
            t2 = time.perf_counter()
            del encoded, decoded
            times[label]["encode"].append(t1 - t0)
            times[label]["decode"].append(t2 - t1)
            times[label]["roundtrip"].append(t2 - t0)
    floor = median(copy_s)
    rows = []
    for label, t in times.items():
        row: dict[str, Any] = {"size": n, "codec": label}
        for part in ("encode", "decode", "roundtrip"):
            s = median(t[part])
            row[f"{part}_ms"] = 1e3 * s
            row[f"{part}_gbps"] = gbps(n, s)
            row[f"{part}_ratio"] = floor / s  # = codec GB/s / copy GB/s
            row[f"{part}_raw_s"] = t[part]
        if label in TARGETED:
            row["target_met"] = min(row["encode_ratio"], row["decode_ratio"]) >= SPEED_TARGET
        rows.append(row)
    return {
        "size": n,
        "copy_ms": 1e3 * floor,
        "copy_gbps": gbps(n, floor),
        "copy_raw_s": copy_s,
        "rows": rows,
    }


def format_floor_table(speed: list[dict[str, Any]]) -> str:
    lines = [
        "|     values | copy ms | copy GB/s (4 B/value) |",
        "|-----------:|--------:|----------------------:|",
    ]
    for s in speed:
        lines.append(f"| {s['size']:>10,} | {s['copy_ms']:>7.2f} | {s['copy_gbps']:>21.2f} |")
    return "\n".join(lines)


def format_speed_table(speed: list[dict[str, Any]]) -> str:
    head = (
        "|     values | codec     | encode ms | decode ms | enc+dec ms | encode GB/s "
        "| decode GB/s | enc+dec GB/s | encode/copy | decode/copy | enc+dec/copy | target |"
    )
    rule = (
        "|-----------:|-----------|----------:|----------:|-----------:|------------:"
        "|------------:|-------------:|------------:|------------:|-------------:|:------:|"
    )
    lines = [head, rule]
    for s in speed:
        for r in s["rows"]:
            met = r.get("target_met")
            verdict = "" if met is None else ("met" if met else "MISSED")
            lines.append(
                f"| {r['size']:>10,} | {r['codec']:<9} | {r['encode_ms']:>9.2f} "
                f"| {r['decode_ms']:>9.2f} | {r['roundtrip_ms']:>10.2f} "
                f"| {r['encode_gbps']:>11.3f} | {r['decode_gbps']:>11.3f} "
                f"| {r['roundtrip_gbps']:>12.3f} | {r['encode_ratio']:>11.3f} "
                f"| {r['decode_ratio']:>11.3f} | {r['roundtrip_ratio']:>12.3f} | {verdict:^6} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- top-k study


def select_exact(x: torch.Tensor, k: int) -> torch.Tensor:
    """Plain torch: exact top-k of |x|, indices sorted."""
    return torch.topk(x.abs(), k, sorted=False).indices.sort().values


def _sample_threshold(a: torch.Tensor, kept: int, gen: torch.Generator) -> float:
    """The ``kept``-th largest of TOPK_SAMPLE magnitudes drawn uniformly (with replacement)."""
    sample = a[torch.randint(0, a.numel(), (TOPK_SAMPLE,), generator=gen)]
    return float(torch.topk(sample, kept, sorted=False).values.min())


def select_threshold_only(x: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """Approximate: everything at or above the sample's estimate of the k-th magnitude."""
    a = x.abs()
    kept = max(1, round(TOPK_SAMPLE * k / x.numel()))
    return torch.nonzero(a >= _sample_threshold(a, kept, gen)).squeeze(1)


def bench_topk(n: int, ratio: float, repeats: int, seed: int) -> dict[str, Any]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed + 1))
    k = math.ceil(ratio * n)
    gen = torch.Generator().manual_seed(seed + 2)
    exact = select_exact(x, k)
    topk_indices(x, k)  # warm-up
    select_threshold_only(x, k, gen)
    t: dict[str, list[float]] = {"exact": [], "fixup": [], "threshold": []}
    fixup_exact: list[bool] = []
    counts: list[int] = []
    recalls: list[float] = []
    exact_set = torch.zeros(n, dtype=torch.bool)
    exact_set[exact] = True
    for r in range(repeats):
        gc.collect()
        order = ["exact", "fixup", "threshold"]
        for method in order[r % 3 :] + order[: r % 3]:
            t0 = time.perf_counter()
            if method == "exact":
                sel = select_exact(x, k)
            elif method == "fixup":
                sel = topk_indices(x, k)
            else:
                sel = select_threshold_only(x, k, gen)
            t[method].append(time.perf_counter() - t0)
            if method == "fixup":
                fixup_exact.append(bool(torch.equal(sel, exact)))
            elif method == "threshold":
                counts.append(int(sel.numel()))
                recalls.append(float(exact_set[sel].sum()) / k)
    med = {m: median(v) for m, v in t.items()}
    return {
        "size": n,
        "ratio": ratio,
        "k": k,
        "sample": TOPK_SAMPLE,
        "exact_ms": 1e3 * med["exact"],
        "fixup_ms": 1e3 * med["fixup"],
        "threshold_ms": 1e3 * med["threshold"],
        "fixup_speedup": med["exact"] / med["fixup"],
        "threshold_speedup": med["exact"] / med["threshold"],
        "fixup_equals_exact": fixup_exact,
        "threshold_counts": counts,
        "threshold_count_over_k": [c / k for c in counts],
        "threshold_recall": recalls,
        "raw_s": t,
    }


def format_topk_table(study: dict[str, Any], encode_ms: float | None) -> str:
    k = study["k"]
    over = study["threshold_count_over_k"]
    same = sum(study["fixup_equals_exact"])
    reps = len(study["fixup_equals_exact"])
    rec = study["threshold_recall"]
    lines = [
        f"top-k selection, {study['size']:,} values, k = {k:,} ({study['ratio']:.0%}), "
        f"sample {study['sample']:,}:",
        "",
        "| method | ms (median) | speed-up vs torch.topk | result |",
        "|--------|------------:|-----------------------:|--------|",
        f"| `torch.topk(abs, k)` + sort indices | {study['exact_ms']:.1f} "
        f"| 1.00 | exact, k values |",
        f"| `topk_indices` (what TopKCodec does): sampled threshold, `topk` on the "
        f"candidates `>=` it | {study['fixup_ms']:.1f} | {study['fixup_speedup']:.2f} "
        f"| equal to torch.topk's in {same}/{reps} repeats |",
        f"| sampled threshold alone (`nonzero(abs >= t)`) | {study['threshold_ms']:.1f} "
        f"| {study['threshold_speedup']:.2f} | count {min(over):.3f}-{max(over):.3f} k; "
        f"recall of the true top-k {min(rec):.3f}-{max(rec):.3f} |",
    ]
    if encode_ms is not None:
        lines.append(f"\n(the whole TopKCodec.encode at this size: {encode_ms:.1f} ms)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- step timing

# Each generator mirrors one codec method of fedcore/compression/codecs.py (or sparse.py)
# step by step, yielding a label after each step; run_steps times the gaps. The "sum of
# steps" column beside the codec's own median shows whether the mirror still matches the
# code.

StepGen = Iterator[str]


def steps_cast_fp16_encode(x: torch.Tensor) -> StepGen:
    h = x.detach().reshape(-1).to(torch.float16)
    yield "x.to(float16)"
    arr = h.numpy().astype("<f2", copy=False)
    yield ".numpy().astype('<f2', copy=False)"
    arr.tobytes()
    yield ".tobytes() (copy out)"


def steps_cast_fp16_decode(data: bytes) -> StepGen:
    values = torch.from_numpy(np.frombuffer(data, dtype="<f2").copy())
    yield "frombuffer(...).copy()"
    values.to(torch.float32)
    yield "float16 -> float32 (_restore)"


def steps_qsgd_encode(x: torch.Tensor, bits: int, gen: torch.Generator) -> StepGen:
    s = 2 ** (bits - 1) - 1
    xf = x.detach().reshape(-1).to(torch.float32)
    norm = torch.linalg.vector_norm(xf).reshape(1)
    yield "L2 norm (float32)"
    per_value = norm.expand(xf.numel())
    bool(torch.isfinite(norm).all())
    shifted = torch.rand(xf.numel(), generator=gen)
    yield "torch.rand(n) (one float32 draw per value)"
    shifted.addcdiv_(xf, per_value.clamp(min=torch.finfo(torch.float32).tiny), value=s)
    yield "u += s x / norm (addcdiv_, in place)"
    shifted.add_(s).clamp_(0, 2 * s)
    yield "+ s, clamp to [0, 2s] (in place)"
    codes = shifted.to(torch.uint8).numpy()
    yield "to(uint8) (floor)"
    _pack(codes, bits)
    yield f"_pack ({bits} bits)"


def steps_qsgd_decode(encoded: EncodedTensor) -> StepGen:
    bits = int(encoded.params["bits"])
    norm = encoded.params["norm"]
    s = 2 ** (bits - 1) - 1
    n = math.prod(encoded.shape)
    codes = _unpack(encoded.data, bits, n)
    yield f"_unpack ({bits} bits)"
    int(codes.max())
    yield "range check codes.max()"
    values = torch.from_numpy(codes).to(torch.float32)
    yield "to(float32)"
    values.sub_(s).mul_(norm / s)
    yield "(codes - s) * norm / s, in place"


def two_level_norm(x: torch.Tensor) -> float:
    """L2 norm: float32 norms of 1024-value rows, combined in float64 (no float64 copy)."""
    cut = x.numel() - x.numel() % 1024
    rows = torch.linalg.vector_norm(x[:cut].view(-1, 1024), dim=1).double()
    return math.sqrt(float(rows.square().sum()) + float(x[cut:].double().square().sum()))


def steps_sign_encode(x: torch.Tensor, chunk: int) -> StepGen:
    xf = x.detach().reshape(-1).to(torch.float32)
    n = xf.numel()
    bits = np.packbits((xf >= 0).numpy(), bitorder="little").tobytes()
    yield "x >= 0, np.packbits + tobytes"
    if chunk == 0:
        float(torch.linalg.vector_norm(xf, ord=1)) / n
        yield "scale = vector_norm(x, ord=1) / n"
        return
    cut = n - n % chunk
    sums = torch.linalg.vector_norm(xf[:cut].view(-1, chunk), ord=1, dim=1) / chunk
    if cut < n:
        sums = torch.cat([sums, xf[cut:].abs().mean().reshape(1)])
    yield "scales = vector_norm(chunks, ord=1, dim=1) / chunk (+ the tail)"
    bits + sums.numpy().astype("<f4").tobytes()
    yield "bits + scales"


def steps_sign_decode(encoded: EncodedTensor) -> StepGen:
    n = math.prod(encoded.shape)
    chunk = int(encoded.params.get("chunk", 0))
    nbits = (n + 7) // 8
    signs = np.unpackbits(
        np.frombuffer(encoded.data, dtype=np.uint8, count=nbits), count=n, bitorder="little"
    )
    yield "np.unpackbits"
    values = torch.from_numpy(signs).to(torch.float32)
    yield "to(float32) (one allocation)"
    if chunk == 0:
        scale = encoded.params["scale"]
        values.mul_(2 * scale).sub_(scale)
        yield "mul_(2 scale).sub_(scale) in place"
        return
    scales = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4", offset=nbits).copy())
    bool(torch.isfinite(scales).all())
    values.mul_(2).sub_(1)
    yield "mul_(2).sub_(1) in place"
    cut = n - n % chunk
    values[:cut].view(-1, chunk).mul_(scales[: cut // chunk, None])
    if cut < n:
        values[cut:].mul_(scales[-1])
    yield "chunks *= scales as a 2-D view"


def steps_topk_encode(x: torch.Tensor, ratio: float) -> StepGen:
    xf = x.detach().reshape(-1).to(torch.float32)
    k = math.ceil(ratio * xf.numel())
    idx = topk_indices(xf, k)
    yield "topk_indices(x, k) (sampled threshold, then topk of the candidates)"
    values = xf[idx]
    yield "gather x[idx]"
    data = idx.numpy().astype("<u4").tobytes() + values.numpy().astype("<f4").tobytes()
    yield "indices -> <u4, values -> <f4, tobytes, concat"
    del data


def steps_topk_decode(encoded: EncodedTensor) -> StepGen:
    n = math.prod(encoded.shape)
    k = int(encoded.params["k"])
    idx = np.frombuffer(encoded.data, dtype="<u4", count=k).astype(np.int64)
    yield "indices frombuffer -> int64"
    int(idx.max())
    yield "range check idx.max()"
    values = np.frombuffer(encoded.data, dtype="<f4", count=k, offset=4 * k)
    out = torch.zeros(n, dtype=torch.float32)
    yield "torch.zeros(n)"
    out[torch.from_numpy(idx)] = torch.from_numpy(values.copy())
    yield "scatter values"


def steps_randk_encode(x: torch.Tensor, ratio: float, gen: torch.Generator) -> StepGen:
    xf = x.detach().reshape(-1).to(torch.float32)
    n = xf.numel()
    k = math.ceil(ratio * n)
    seed = int(torch.randint(0, 2**53, (1,), generator=gen))
    idx = RandKCodec._indices(seed, n, k)
    yield "RandKCodec._indices (k distinct from randint + unique + randperm(k'))"
    values = xf[idx] * (n / k)
    yield "gather x[idx] * n/k"
    values.numpy().astype("<f4").tobytes()
    yield "values tobytes"


def steps_randk_decode(encoded: EncodedTensor) -> StepGen:
    n = math.prod(encoded.shape)
    k = int(encoded.params["k"])
    seed = int(encoded.params["seed"])
    out = torch.zeros(n, dtype=torch.float32)
    yield "torch.zeros(n)"
    values = torch.from_numpy(np.frombuffer(encoded.data, dtype="<f4").copy())
    idx = RandKCodec._indices(seed, n, k)
    yield "RandKCodec._indices (regenerate the indices)"
    out[idx] = values
    yield "scatter values"


def run_steps(make: Callable[[], StepGen], repeats: int) -> list[dict[str, Any]]:
    """Median seconds of each labelled step over ``repeats`` runs of the generator."""
    per: dict[str, list[float]] = {}
    for _ in range(repeats):
        gc.collect()
        steps = make()
        t0 = time.perf_counter()
        for label in steps:
            t1 = time.perf_counter()
            per.setdefault(label, []).append(t1 - t0)
            t0 = time.perf_counter()
    return [{"step": label, "ms": 1e3 * median(v)} for label, v in per.items()]


def profile_codec(
    label: str, n: int, repeats: int, seed: int, measured: dict[str, Any]
) -> dict[str, Any]:
    """Step timings of ``label``'s encode and decode at ``n`` values."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed + 3))
    name, opts = next((nm, o) for lb, nm, o in CODECS if lb == label)
    codec = make_codec(name, seed=seed, **opts)
    encoded = codec.encode(x)
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, Callable[[], StepGen]] = {}
    if name == "fp16":
        parts["encode"] = lambda: steps_cast_fp16_encode(x)
        parts["decode"] = lambda: steps_cast_fp16_decode(encoded.data)
    elif name == "qsgd":
        bits = opts["bits"]
        parts["encode"] = lambda: steps_qsgd_encode(x, bits, gen)
        parts["decode"] = lambda: steps_qsgd_decode(encoded)
    elif name == "sign":
        parts["encode"] = lambda: steps_sign_encode(x, opts["chunk"])
        parts["decode"] = lambda: steps_sign_decode(encoded)
    elif name == "topk":
        parts["encode"] = lambda: steps_topk_encode(x, opts["ratio"])
        parts["decode"] = lambda: steps_topk_decode(encoded)
    elif name == "randk":
        parts["encode"] = lambda: steps_randk_encode(x, opts["ratio"], gen)
        parts["decode"] = lambda: steps_randk_decode(encoded)
    result: dict[str, Any] = {"codec": label, "size": n, "parts": {}}
    for part, make in parts.items():
        make_gen = make
        for _ in make_gen():  # warm-up
            pass
        steps = run_steps(make_gen, repeats)
        total = sum(s["ms"] for s in steps)
        for s in steps:
            s["share"] = s["ms"] / total if total else 0.0
        codec_ms = measured.get(f"{part}_ms")
        result["parts"][part] = {"steps": steps, "sum_ms": total, "codec_median_ms": codec_ms}
    return result


def quantize_given_draws(x: torch.Tensor, u: torch.Tensor, factor: float) -> torch.Tensor:
    """QSGD-8's element-wise work in one expression: codes from x, draws u and s / norm."""
    v = (x.abs() * factor + u).floor().clamp(max=127.0)
    return (torch.copysign(v, x) + 127.0).to(torch.uint8)


def bench_fused_sketch(n: int, repeats: int, seed: int) -> dict[str, Any]:
    """``--fused-sketch``: QSGD-8's element-wise part eager against ``torch.compile`` (one
    fused loop), the draws given. Shows what fusing buys once the random draws are cheap."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed + 5))
    u = torch.rand(n, generator=torch.Generator().manual_seed(seed + 6))
    factor = 127 / two_level_norm(x)
    try:
        compiled = torch.compile(quantize_given_draws, dynamic=False)
        t0 = time.perf_counter()
        fused = compiled(x, u, factor)
        compile_s = time.perf_counter() - t0
    except Exception as exc:  # no C++ compiler, unsupported platform...
        return {"error": repr(exc)}
    eager = quantize_given_draws(x, u, factor)
    t: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(repeats):
        gc.collect()
        for label, fn in (("eager", quantize_given_draws), ("compiled", compiled)):
            t0 = time.perf_counter()
            fn(x, u, factor)
            t[label].append(time.perf_counter() - t0)
    return {
        "size": n,
        "compile_s": compile_s,
        "eager_ms": 1e3 * median(t["eager"]),
        "compiled_ms": 1e3 * median(t["compiled"]),
        "codes_differing": int((fused != eager).sum()),
        "raw_s": t,
    }


def format_steps(profile: dict[str, Any]) -> str:
    lines = [f"{profile['codec']} at {profile['size']:,} values:", ""]
    lines.append("| part | step | ms | share |")
    lines.append("|------|------|---:|------:|")
    for part, p in profile["parts"].items():
        for s in p["steps"]:
            lines.append(f"| {part} | {s['step']} | {s['ms']:.1f} | {s['share']:.0%} |")
        tail = f"sum of steps {p['sum_ms']:.1f} ms"
        if p["codec_median_ms"] is not None:
            tail += f" (codec's median in the speed table: {p['codec_median_ms']:.1f} ms)"
        lines.append(f"| {part} | *{tail}* | | |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- wire size


def ideal_bytes(name: str, opts: dict[str, Any], n: int, encoded: EncodedTensor) -> int:
    """Information-theoretic payload: the bits the format needs for n values."""
    if name in ("raw", "fp32"):
        return 4 * n
    if name in ("fp16", "bf16"):
        return 2 * n
    if name == "qsgd":
        return math.ceil(n * int(opts["bits"]) / 8)
    if name == "sign":
        chunk = opts["chunk"]
        return math.ceil(n / 8) + (4 * math.ceil(n / chunk) if chunk else 0)
    if name == "fp8":
        chunk = opts.get("chunk", 0)
        return n + 4 * (math.ceil(n / chunk) if chunk else 1)
    if name == "float":
        return math.ceil(n * (1 + int(opts["exp_bits"]) + int(opts["man_bits"])) / 8)
    if name == "s2fp8":
        return n + 8
    k = int(encoded.params["k"])
    return 8 * k if name == "topk" else 4 * k


def grpc_framing_estimate(chunks: list[bytes]) -> int:
    """gRPC's length prefix per message and HTTP/2 DATA frame headers (16 KiB frames)."""
    total = 0
    for c in chunks:
        framed = len(c) + GRPC_PREFIX
        total += GRPC_PREFIX + HTTP2_FRAME_HEADER * math.ceil(framed / HTTP2_MAX_FRAME)
    return total


def bench_wire(n: int, seed: int) -> list[dict[str, Any]]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed + 4))
    run_id = hashlib.sha256(b"fedcore codecs benchmark").hexdigest()  # a fingerprint's length
    rows = []
    for label, name, opts in CODECS:
        codec = make_codec(name, seed=seed, **opts)
        encoded = codec.encode(x)
        wire_bytes = getattr(codec, "wire_bytes", None)
        declared = wire_bytes(n) if wire_bytes is not None else 4 * n
        row: dict[str, Any] = {
            "codec": label,
            "params": n,
            "data_bytes": len(encoded.data),
            "wire_bytes_n": declared,
            "ideal_bytes": ideal_bytes(name, opts, n, encoded),
        }
        for style, scalars in (("pushsum", {"omega": 0.125}), ("plain", {})):
            message = Message(
                run=run_id,
                round=100,
                phase=0,
                sender="n3",
                receiver="n4",
                tensors={"x": encoded},
                scalars=scalars,
            )
            chunks = list(message_to_wire(message))
            assembler = MessageAssembler(limit_bytes=1 << 40)
            for c in chunks:
                assembler.add(c)
            back = assembler.finish()
            if back.tensors["x"].data != encoded.data or dict(back.scalars) != scalars:
                raise SystemExit(f"{label}: the wire does not reassemble into the message.")
            wire = sum(len(c) for c in chunks)
            grpc = grpc_framing_estimate(chunks)
            row[style] = {
                "chunks": len(chunks),
                "header_bytes": len(chunks[0]),
                "data_framing_bytes": wire - len(chunks[0]) - len(encoded.data),
                "wire_bytes": wire,
                "fedcore_nbytes": message.nbytes,
                "overhead": (wire - row["ideal_bytes"]) / row["ideal_bytes"],
                "overhead_vs_wire_bytes_n": (wire - declared) / declared,
                "header_share": len(chunks[0]) / wire,
                "grpc_estimate_bytes": grpc,
                "overhead_with_grpc": (wire + grpc - row["ideal_bytes"]) / row["ideal_bytes"],
                "target_met": (wire - row["ideal_bytes"]) / row["ideal_bytes"] <= WIRE_TARGET,
            }
        rows.append(row)
    return rows


def format_wire_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| codec     |   ideal B | wire_bytes(n) | fedcore wire B | header B | data framing B "
        "| overhead vs ideal | header share | + gRPC/HTTP2 est. B | overhead incl. est. "
        "| target |"
    )
    rule = (
        "|-----------|----------:|--------------:|---------------:|---------:|---------------:"
        "|------------------:|-------------:|--------------------:|--------------------:"
        "|:------:|"
    )
    lines = [head, rule]
    for r in rows:
        p = r["pushsum"]
        lines.append(
            f"| {r['codec']:<9} | {r['ideal_bytes']:>9,} | {r['wire_bytes_n']:>13,} "
            f"| {p['wire_bytes']:>14,} | {p['header_bytes']:>8} | {p['data_framing_bytes']:>14} "
            f"| {100 * p['overhead']:>16.3f}% | {100 * p['header_share']:>11.3f}% "
            f"| {p['grpc_estimate_bytes']:>19,} | {100 * p['overhead_with_grpc']:>18.3f}% "
            f"| {'met' if p['target_met'] else 'MISSED':^6} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 16_000_000])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--wire-params", type=int, default=1_000_000, help="model size of the wire table"
    )
    parser.add_argument(
        "--malloc",
        choices=("tuned", "default"),
        default="tuned",
        help="tuned (default): fedcore.deploy.peer.tune_malloc() first, as `fedcore node` "
        "does; default: glibc's own settings",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fused-sketch",
        action="store_true",
        help="also time QSGD-8's element-wise work under torch.compile (needs a C++ "
        "compiler; the first call compiles, about 25 s here)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    malloc_tuned = tune_malloc() if args.malloc == "tuned" else False
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    info = _common.machine_info(malloc_tuned=malloc_tuned, numpy=np.__version__)

    speed = []
    for n in args.sizes:
        s = bench_speed(n, args.repeats, args.seed)
        speed.append(s)
        print(f"speed at {n:,} values done ({time.perf_counter() - began:.0f} s)", flush=True)
    print()
    print("copy floor (dst.copy_(src), preallocated dst):")
    print(format_floor_table(speed))
    print()
    print(format_speed_table(speed))

    largest = max(args.sizes)
    top = speed[args.sizes.index(largest)]
    topk_row = next(r for r in top["rows"] if r["codec"] == "topk-1%")
    study = bench_topk(largest, 0.01, args.repeats, args.seed)
    print()
    print(format_topk_table(study, topk_row["encode_ms"]))

    missed = sorted(
        {r["codec"] for s in speed for r in s["rows"] if r.get("target_met") is False},
        key=[c[0] for c in CODECS].index,
    )
    profiles = []
    for label in [*missed, *ALWAYS_PROFILED]:
        measured = next(r for r in top["rows"] if r["codec"] == label)
        profiles.append(profile_codec(label, largest, args.repeats, args.seed, measured))
        print()
        print(format_steps(profiles[-1]))

    fused = None
    if args.fused_sketch:
        fused = bench_fused_sketch(largest, args.repeats, args.seed)
        print()
        if "error" in fused:
            print(f"fused sketch: torch.compile failed: {fused['error']}")
        else:
            print(
                f"QSGD-8 element-wise work at {largest:,} values, draws given: eager "
                f"{fused['eager_ms']:.1f} ms, torch.compile (fused) {fused['compiled_ms']:.1f} ms "
                f"(compile {fused['compile_s']:.0f} s; {fused['codes_differing']} codes differ)"
            )

    wire = bench_wire(args.wire_params, args.seed)
    print()
    print(f"wire size, one message of a {args.wire_params:,}-parameter model (x + omega):")
    print(format_wire_table(wire))

    print()
    for s in speed:
        for r in s["rows"]:
            if "target_met" in r:
                verdict = "meets" if r["target_met"] else "MISSES"
                print(
                    f"{r['codec']:<9} at {r['size']:>10,}: encode {r['encode_ratio']:.3f}x, "
                    f"decode {r['decode_ratio']:.3f}x of copy: {verdict} the "
                    f">= {SPEED_TARGET}x target"
                )
    worst = max(wire, key=lambda r: r["pushsum"]["overhead"])
    print(
        f"wire overhead: at most {100 * worst['pushsum']['overhead']:.3f}% ({worst['codec']}); "
        f"target <= {100 * WIRE_TARGET:.0f}%: "
        f"{'met' if all(r['pushsum']['target_met'] for r in wire) else 'MISSED'}"
    )
    wall = time.perf_counter() - began
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    print(f"wall time {wall:.1f} s")

    report = {
        "benchmark": "fedcore codecs: speed against a copy floor, and gRPC wire size",
        "command": " ".join(
            ["python", "benchmarks/codec_speed.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "settings": {
            "sizes": args.sizes,
            "repeats": args.repeats,
            "torch_threads": args.threads,
            "malloc": args.malloc,
            "seed": args.seed,
            "codecs": [{"label": lb, "name": nm, "options": o} for lb, nm, o in CODECS],
            "input": "torch.randn(n) float32",
            "gbps": "4 bytes per value / median seconds / 1e9 (encode, decode, or both)",
            "floor": "dst.copy_(src) into a preallocated tensor, timed once before each "
            "codec's turn (so after other work, as the codecs are), median",
            "speed_target": f"encode and decode each >= {SPEED_TARGET}x the copy's GB/s for "
            f"{', '.join(TARGETED)}",
            "wire_message": "run = 64-char fingerprint, round 100, phase 0, n3 -> n4, tensor "
            "'x' (and scalar 'omega' in the push-sum rows)",
            "wire": "sum of len() of serde.message_to_wire(message) chunks "
            f"(CHUNK_BYTES = {CHUNK_BYTES})",
            "grpc_estimate": f"{GRPC_PREFIX} B per gRPC message + {HTTP2_FRAME_HEADER} B per "
            f"HTTP/2 DATA frame of <= {HTTP2_MAX_FRAME} B; per-call HEADERS, trailers and "
            "the Ack not counted",
            "wire_target": f"(wire - ideal) / ideal <= {WIRE_TARGET}",
        },
        "machine": info,
        "speed": speed,
        "topk_study": study,
        "profiles": profiles,
        "fused_sketch": fused,
        "wire": wire,
        "wall_s": wall,
    }
    _common.write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
