# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Loopback bandwidth of fedcore's gRPC transport against raw TCP and torch.distributed gloo.

One run, one payload, two processes per method (a receiver started as a child process, the
sender in this process), on 127.0.0.1 only:

* **raw**: a TCP socket; each message is an 8-byte length then the payload, sent with
  ``sendall`` straight from the tensor's memory; the receiver ``recv_into``s a buffer
  preallocated for the largest size and answers one byte.
* **gloo**: ``torch.distributed`` with the gloo backend (``tcp://127.0.0.1:PORT``, world size
  2); ``send`` of the float32 tensor, the receiver ``recv``s into a preallocated tensor of
  that size and ``send``s back a one-element tensor as the ack.
* **fedcore**: a ``GrpcTransport`` sender (``connect``, then ``send`` of a ``Message``
  holding the payload as a ``raw``-codec float32 tensor) to a ``GrpcTransport`` receiver that
  ``collect``s round r, phase 0. ``send`` returns when the receiver's servicer has assembled
  the message, filed it and answered the stream, so its time is the one-way transfer plus
  the ack.

Each measurement is a burst of acknowledged messages of one size (more messages for small
sizes); bursts are interleaved: for each repeat, for each size, each method in turn (the
order rotates every repeat). One untimed warm-up message per size and method comes first.
The table reports the median MB/s (10^6 bytes per second) over repeats.

Also, without any network: the cost of fedcore's serde path for 64 MiB (the hot path
``message_to_wire`` + ``MessageAssembler`` + ``finish``, and the generated-class path
``message_to_chunks`` + ``SerializeToString`` for comparison) against one plain 64 MiB copy,
stage by stage and for several chunk sizes. The targets, at 16 MiB and 64 MiB: fedcore at
least half raw TCP's bandwidth, and its receiver's CPU per MiB at most twice raw's. If the
bandwidth target is missed, or with ``--profile`` (never with ``--no-profile``), the gRPC
path is profiled (cProfile in the sender and the receiver), and gRPC sender/receiver pairs
are re-measured with other malloc settings and chunk sizes (``--variants``).

Usage::

    python benchmarks/transport.py [--sizes-kib 64 1024 16384 65536] [--repeats 7]
        [--out benchmarks/results/transport.json] [--profile | --no-profile] [--no-variants]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import functools
import importlib.util
import io
import json
import os
import pstats
import socket
import statistics
import struct
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Runnable as `python benchmarks/transport.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.compression.base import RawCodec
from fedcore.deploy.launch import free_ports
from fedcore.deploy.peer import tune_malloc
from fedcore.messages import Message
from fedcore.transport.grpc import GrpcTransport, serde
from fedcore.transport.grpc import transport as grpc_transport_module

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "transport.json"
HOST = "127.0.0.1"
KIB = 1 << 10
MIB = 1 << 20
METHODS = ("raw", "gloo", "fedcore")
RUN_ID = "transport-benchmark"
SENDER, RECEIVER = "s", "r"
TARGET_FRACTION = 0.5  # fedcore >= 0.5 x raw's bandwidth at 16 MiB and 64 MiB
TARGET_RECV_CPU = 2.0  # fedcore's receiver CPU per MiB <= 2 x raw's there
TARGET_SIZES = (16 * MIB, 64 * MIB)
# glibc settings that keep large blocks on the heap and never give them back, so a new
# 64 MiB buffer reuses pages already mapped instead of faulting in fresh zeroed ones.
TUNED_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
MALLOC_KEYS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def burst_count(size: int) -> int:
    """Messages per timed burst: about 4 MiB at least, one for the largest sizes."""
    return max(1, min(64, (4 * MIB) // size))


def make_plan(sizes: list[int], repeats: int) -> list[tuple[int, int, int]]:
    """The timed schedule, ``(repeat, size, rotation)`` per burst, the same for every method."""
    return [(rep, size, rep % len(METHODS)) for rep in range(repeats) for size in sizes]


def message_sizes(sizes: list[int], repeats: int) -> list[int]:
    """Every message one receiver gets, in order: one warm-up per size, then the bursts."""
    out = list(sizes)
    for _, size, _ in make_plan(sizes, repeats):
        out.extend([size] * burst_count(size))
    return out


def payload_tensor(nbytes: int) -> torch.Tensor:
    """The same float32 payload for every method (deterministic, finite)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(nbytes // 4, generator=gen, dtype=torch.float32)


def cpu_now() -> tuple[float, float]:
    """(process CPU s over all threads, CPU s of the calling thread)."""
    return time.process_time(), time.thread_time()


# --------------------------------------------------------------------------- receivers


def recv_raw(port: int, sizes: list[int]) -> dict[str, Any]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, port))
    listener.listen(1)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(max(sizes))
    view = memoryview(buffer)
    head = bytearray(8)
    cpu: list[tuple[float, float]] = []
    last = cpu_now()
    for expected in sizes:
        got = 0
        while got < 8:
            got += conn.recv_into(memoryview(head)[got:], 8 - got)
        (n,) = struct.unpack("!Q", head)
        if n != expected:
            raise RuntimeError(f"raw receiver expected {expected} bytes, header says {n}")
        got = 0
        while got < n:
            k = conn.recv_into(view[got:n], n - got)
            if k == 0:
                raise RuntimeError("raw sender closed mid-message")
            got += k
        conn.sendall(b"\x01")
        now = cpu_now()
        cpu.append((now[0] - last[0], now[1] - last[1]))
        last = now
    conn.close()
    listener.close()
    return {"cpu": cpu}


def recv_gloo(port: int, sizes: list[int]) -> dict[str, Any]:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{HOST}:{port}",
        rank=1,
        world_size=2,
        timeout=timedelta(seconds=120),
    )
    buffers = {n: torch.empty(n // 4, dtype=torch.float32) for n in set(sizes)}
    ack = torch.ones(1, dtype=torch.float32)
    cpu: list[tuple[float, float]] = []
    last = cpu_now()
    for n in sizes:
        dist.recv(buffers[n], src=0)
        dist.send(ack, dst=0)
        now = cpu_now()
        cpu.append((now[0] - last[0], now[1] - last[1]))
        last = now
    dist.barrier()
    dist.destroy_process_group()
    return {"cpu": cpu}


async def _recv_fedcore_async(port: int, count: int) -> dict[str, Any]:
    transport = GrpcTransport(
        RECEIVER,
        listen=f"{HOST}:{port}",
        roster={},
        run_id=RUN_ID,
        trusted={SENDER},
    )
    await transport.start()
    cpu: list[tuple[float, float]] = []
    last = cpu_now()
    try:
        for r in range(count):
            got = await transport.collect(r, 0, {SENDER}, timeout=300.0)
            if SENDER not in got:
                raise RuntimeError(f"fedcore receiver: round {r} never arrived")
            now = cpu_now()
            cpu.append((now[0] - last[0], now[1] - last[1]))
            last = now
            del got
    finally:
        await transport.close(grace_s=1.0)
    return {"cpu": cpu, "stats": dataclasses.asdict(transport.stats)}


def recv_fedcore(port: int, sizes: list[int], profile_out: str | None) -> dict[str, Any]:
    if profile_out is None:
        return asyncio.run(_recv_fedcore_async(port, len(sizes)))
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        return asyncio.run(_recv_fedcore_async(port, len(sizes)))
    finally:
        profiler.disable()
        profiler.dump_stats(profile_out)


def receiver_main(args: argparse.Namespace) -> int:
    sizes = json.loads(Path(args.plan).read_text())
    if args.role == "recv-raw":
        result = recv_raw(args.port, sizes)
    elif args.role == "recv-gloo":
        result = recv_gloo(args.port, sizes)
    else:
        result = recv_fedcore(args.port, sizes, args.profile_out)
    result["malloc_env"] = {k: os.environ[k] for k in MALLOC_KEYS if k in os.environ}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- senders


class RawSender:
    def __init__(self, port: int) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                self.sock = socket.create_connection((HOST, port), timeout=60)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ack = bytearray(1)

    def send(self, payload: torch.Tensor) -> None:
        data = memoryview(payload.numpy()).cast("B")
        self.sock.sendall(struct.pack("!Q", len(data)))
        self.sock.sendall(data)
        if self.sock.recv_into(self.ack, 1) != 1:
            raise RuntimeError("raw receiver closed")

    def close(self) -> None:
        self.sock.close()


class GlooSender:
    def __init__(self, port: int) -> None:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{HOST}:{port}",
            rank=0,
            world_size=2,
            timeout=timedelta(seconds=120),
        )
        self.ack = torch.zeros(1, dtype=torch.float32)

    def send(self, payload: torch.Tensor) -> None:
        dist.send(payload, dst=1)
        dist.recv(self.ack, src=1)

    def close(self) -> None:
        dist.barrier()
        dist.destroy_process_group()


class FedcoreSender:
    """A GrpcTransport that only sends (no server needed), one round per message."""

    def __init__(self, port: int) -> None:
        self.transport = GrpcTransport(
            SENDER,
            listen=f"{HOST}:0",
            roster={RECEIVER: f"{HOST}:{port}"},
            run_id=RUN_ID,
            trusted=(),
        )
        self.round = 0
        self.encoded: dict[int, Any] = {}

    async def connect(self) -> None:
        await self.transport.connect([RECEIVER], timeout_s=120.0)

    def message(self, payload: torch.Tensor) -> Message:
        """A fresh message for the next round; the payload is encoded once per size."""
        key = payload.numel()
        enc = self.encoded.get(key)
        if enc is None:
            enc = self.encoded[key] = RawCodec().encode(payload)
        msg = Message(
            run=RUN_ID,
            round=self.round,
            phase=0,
            sender=SENDER,
            receiver=RECEIVER,
            tensors={"x": enc},
        )
        self.round += 1
        return msg

    async def send(self, message: Message) -> None:
        await self.transport.send(message)

    async def close(self) -> None:
        await self.transport.close(grace_s=1.0)


def spawn(
    role: str,
    port: int,
    plan_path: Path,
    env_extra: dict[str, str] | None = None,
    profile_out: str | None = None,
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    for k in MALLOC_KEYS:
        env.pop(k, None)
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--role",
        role,
        "--port",
        str(port),
        "--plan",
        str(plan_path),
    ]
    if profile_out:
        argv += ["--profile-out", profile_out]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish_child(proc: subprocess.Popen[str], name: str, timeout: float = 120) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} receiver failed ({proc.returncode}):\n{err[-3000:]}")
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise RuntimeError(f"{name} receiver printed no result:\n{out[-2000:]}\n{err[-2000:]}")


# --------------------------------------------------------------------------- main measurement


async def measure(sizes: list[int], repeats: int, workdir: Path) -> dict[str, Any]:
    """Interleaved bursts of every method; per-burst wall and sender CPU, receivers' CPU."""
    msizes = message_sizes(sizes, repeats)
    plan_path = workdir / "plan.json"
    plan_path.write_text(json.dumps(msizes))
    raw_port, gloo_port, grpc_port = free_ports(3)
    children = {
        "raw": spawn("recv-raw", raw_port, plan_path),
        "gloo": spawn("recv-gloo", gloo_port, plan_path),
        "fedcore": spawn("recv-fedcore", grpc_port, plan_path),
    }
    try:
        started = time.perf_counter()
        fed = FedcoreSender(grpc_port)
        await fed.connect()
        raw = RawSender(raw_port)
        gloo = GlooSender(gloo_port)
        setup_s = time.perf_counter() - started
        payloads = {n: payload_tensor(n) for n in sizes}

        async def one(method: str, n: int) -> tuple[float, float, float]:
            payload = payloads[n]
            msg = fed.message(payload) if method == "fedcore" else None
            c0 = cpu_now()
            t0 = time.perf_counter()
            if method == "raw":
                raw.send(payload)
            elif method == "gloo":
                gloo.send(payload)
            else:
                assert msg is not None
                await fed.send(msg)
            t1 = time.perf_counter()
            c1 = cpu_now()
            return t1 - t0, c1[0] - c0[0], c1[1] - c0[1]

        for n in sizes:  # warm-up: one untimed message per size and method
            for method in METHODS:
                await one(method, n)
        bursts: list[dict[str, Any]] = []
        for rep, n, rot in make_plan(sizes, repeats):
            order = METHODS[rot:] + METHODS[:rot]
            for method in order:
                times = [await one(method, n) for _ in range(burst_count(n))]
                bursts.append(
                    {
                        "method": method,
                        "repeat": rep,
                        "size": n,
                        "messages": len(times),
                        "wall_s": [t[0] for t in times],
                        "sender_cpu_s": sum(t[1] for t in times),
                        "sender_main_thread_cpu_s": sum(t[2] for t in times),
                    }
                )
        raw.close()
        gloo.close()
        await fed.close()
        receivers = {m: finish_child(p, m) for m, p in children.items()}
    finally:
        for p in children.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    # Receiver CPU per message, in plan order: skip the warm-ups, then bursts as planned.
    for method, res in receivers.items():
        cpu = res["cpu"][len(sizes) :]
        i = 0
        for b in bursts:
            if b["method"] != method:
                continue
            chunk = cpu[i : i + b["messages"]]
            i += b["messages"]
            b["receiver_cpu_s"] = sum(c[0] for c in chunk)
            b["receiver_main_thread_cpu_s"] = sum(c[1] for c in chunk)
    return {"setup_s": setup_s, "bursts": bursts}


def summarize(bursts: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"size": n, "messages_per_burst": burst_count(n)}
        for method in METHODS:
            mine = [b for b in bursts if b["method"] == method and b["size"] == n]
            rates = [b["messages"] * n / sum(b["wall_s"]) / 1e6 for b in mine]
            total = sum(b["messages"] for b in mine) * n
            row[method] = {
                "mb_per_s": statistics.median(rates),
                "mb_per_s_all": rates,
                "latency_ms_median": 1e3
                * statistics.median([t for b in mine for t in b["wall_s"]]),
                "sender_cpu_ms_per_mib": 1e3 * sum(b["sender_cpu_s"] for b in mine) / (total / MIB),
                "receiver_cpu_ms_per_mib": 1e3
                * sum(b["receiver_cpu_s"] for b in mine)
                / (total / MIB),
                "sender_main_thread_share": _share(mine, "sender"),
                "receiver_main_thread_share": _share(mine, "receiver"),
            }
        row["fedcore_over_raw"] = row["fedcore"]["mb_per_s"] / row["raw"]["mb_per_s"]
        row["fedcore_over_gloo"] = row["fedcore"]["mb_per_s"] / row["gloo"]["mb_per_s"]
        for side in ("sender", "receiver"):
            key = f"{side}_cpu_ms_per_mib"
            row[f"fedcore_{side}_cpu_over_raw"] = row["fedcore"][key] / row["raw"][key]
        rows.append(row)
    return rows


def _share(bursts: list[dict[str, Any]], side: str) -> float | None:
    total = sum(b[f"{side}_cpu_s"] for b in bursts)
    main = sum(b[f"{side}_main_thread_cpu_s"] for b in bursts)
    return main / total if total > 0 else None


def size_label(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| size | raw MB/s | gloo MB/s | fedcore MB/s | fedcore/raw | fedcore/gloo "
        "| fedcore ms/msg | CPU ms/MiB send+recv: raw / gloo / fedcore "
        "| fedcore/raw CPU send, recv |",
        "|-----:|---------:|----------:|-------------:|------------:|-------------:"
        "|---------------:|:------------------------------------------:|---------------:|",
    ]
    for r in rows:
        cpu = " / ".join(
            f"{r[m]['sender_cpu_ms_per_mib']:.2f}+{r[m]['receiver_cpu_ms_per_mib']:.2f}"
            for m in METHODS
        )
        lines.append(
            f"| {size_label(r['size']):>7} | {r['raw']['mb_per_s']:8.0f} "
            f"| {r['gloo']['mb_per_s']:9.0f} | {r['fedcore']['mb_per_s']:12.0f} "
            f"| {r['fedcore_over_raw']:11.2f} | {r['fedcore_over_gloo']:12.2f} "
            f"| {r['fedcore']['latency_ms_median']:14.2f} | {cpu:^42} "
            f"| {r['fedcore_sender_cpu_over_raw']:.2f}, {r['fedcore_receiver_cpu_over_raw']:.2f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- serde alone


def _median_time(fn: Any, k: int) -> float:
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def serde_costs(nbytes: int, chunk_sizes: list[int], k: int) -> dict[str, Any]:
    """fedcore's serde for one ``nbytes`` message, with no network, against plain copies."""
    payload = payload_tensor(nbytes)
    enc = RawCodec().encode(payload)
    msg = Message(
        run=RUN_ID, round=0, phase=0, sender=SENDER, receiver=RECEIVER, tensors={"x": enc}
    )
    src = memoryview(enc.data)
    dst = memoryview(bytearray(nbytes))

    def into_prealloc() -> None:
        dst[:] = src  # a memoryview slice assignment is one memcpy (a bytearray's is two)

    copy_new = _median_time(lambda: bytes(src), k)  # the reference: a fresh 64 MiB bytes
    copy_warm = _median_time(into_prealloc, k)  # the same bytes into memory already mapped
    alloc = _median_time(lambda: bytearray(nbytes), k)

    def assemble(chunk_bytes: int, wire: bool) -> None:
        a = serde.MessageAssembler(1 << 31)
        if wire:  # the hot path: what GrpcTransport sends and its servicer receives
            for raw in serde.message_to_wire(msg, chunk_bytes=chunk_bytes):
                a.add(raw)
        else:  # through the generated classes, serialized as gRPC would
            for c in serde.message_to_chunks(msg, chunk_bytes=chunk_bytes):
                a.add(c.SerializeToString())
        a.finish()

    sweep = []
    for cb in chunk_sizes:
        sweep.append(
            {
                "chunk_bytes": cb,
                "serde_s": _median_time(functools.partial(assemble, cb, True), k),
                "serde_generated_s": _median_time(functools.partial(assemble, cb, False), k),
            }
        )

    # The hot path stage by stage at the default chunk size, streamed one chunk at a time
    # as on the wire (so the per-chunk blocks are reused): each stage's cost is the
    # difference between a pipeline that stops after it and one that stops before it.
    cb = serde.CHUNK_BYTES
    codec = RawCodec()

    def pipeline(level: int) -> None:
        a = serde.MessageAssembler(1 << 31)
        for raw in serde.message_to_wire(msg, chunk_bytes=cb):
            if level < 2:
                continue
            part = serde.parse_chunk(raw)
            if level < 3:
                continue
            if isinstance(part, memoryview) and level < 4:
                continue  # below: the buffer is allocated at the first data chunk
            a.add(raw)
        if level >= 5:
            got = a.finish()
            if level >= 6:
                codec.decode(got.tensors["x"])

    names = [
        "send: message_to_wire (tag, length and slice joined into each chunk's bytes)",
        "recv: parse_chunk (a memoryview of each chunk's data, no copy)",
        "recv: header checks (MessageAssembler.add of the header chunk)",
        "recv: MessageAssembler.add: np.empty(total) once, each chunk copied in",
        "recv: finish(): the tensors as memoryview slices of the buffer",
        "decode: RawCodec.decode (in place, np.frombuffer over the buffer)",
    ]
    cumulative = [_median_time(functools.partial(pipeline, level), k) for level in range(1, 7)]
    steps = {
        name: cumulative[i] - (cumulative[i - 1] if i else 0.0) for i, name in enumerate(names)
    }
    default = next(s for s in sweep if s["chunk_bytes"] == serde.CHUNK_BYTES)
    return {
        "nbytes": nbytes,
        "copy_new_bytes_s": copy_new,
        "copy_into_preallocated_s": copy_warm,
        "bytearray_alloc_s": alloc,
        "chunk_sweep": sweep,
        "steps_s": steps,
        "pipeline_cumulative_s": cumulative,
        "serde_in_copies": default["serde_s"] / copy_new,
        "serde_generated_in_copies": default["serde_generated_s"] / copy_new,
        "serde_in_warm_copies": default["serde_s"] / copy_warm,
        "malloc_env": {k: os.environ[k] for k in MALLOC_KEYS if k in os.environ},
    }


def serde_in_child(env_extra: dict[str, str], chunk_sizes: list[int], k: int) -> dict[str, Any]:
    """:func:`serde_costs` in a fresh interpreter with other malloc settings."""
    env = dict(os.environ)
    for key in MALLOC_KEYS:
        env.pop(key, None)
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--role",
        "serde",
        "--serde-chunks",
        *[str(c) for c in chunk_sizes],
        "--serde-repeats",
        str(k),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True, timeout=300)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[7:])
    return result


def format_serde(s: dict[str, Any], label: str, stages: bool) -> str:
    ms = 1e3
    lines = [
        f"serde alone, {size_label(s['nbytes'])} ({label}): one new bytes copy "
        f"{s['copy_new_bytes_s'] * ms:.1f} ms, copy into a preallocated buffer "
        f"{s['copy_into_preallocated_s'] * ms:.1f} ms, bytearray(64 MiB) "
        f"{s['bytearray_alloc_s'] * ms:.1f} ms",
        "| chunk | wire bytes + assembler ms | x new copy | generated classes ms | x new copy |",
        "|------:|--------------------------:|-----------:|---------------------:|-----------:|",
    ]
    for row in s["chunk_sweep"]:
        lines.append(
            f"| {size_label(row['chunk_bytes']):>7} | {row['serde_s'] * ms:25.1f} "
            f"| {row['serde_s'] / s['copy_new_bytes_s']:10.1f} "
            f"| {row['serde_generated_s'] * ms:20.1f} "
            f"| {row['serde_generated_s'] / s['copy_new_bytes_s']:10.1f} |"
        )
    if not stages:
        # Under glibc's default (dynamic) mmap threshold, whether a 1 MiB block comes from
        # fresh mmapped pages depends on the allocation history, so stage costs don't add up.
        return "\n".join(lines)
    lines.append("stages at 1 MiB chunks, streamed (ms, and in copies into preallocated memory):")
    for name, t in s["steps_s"].items():
        lines.append(f"  {t * ms:7.1f} ms  {t / s['copy_into_preallocated_s']:4.1f}x  {name}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- profile, variants


def _top(stats_path_or_profile: Any, n: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(stats_path_or_profile, stream=out)
    stats.sort_stats("tottime").print_stats(n)
    text = out.getvalue()
    start = text.find("   ncalls")
    return text[start:] if start >= 0 else text


async def profile_fedcore(workdir: Path, size: int, count: int) -> dict[str, Any]:
    """cProfile of ``count`` gRPC messages of ``size`` in the sender and in the receiver."""
    msizes = [size] * (count + 1)
    plan_path = workdir / "plan-profile.json"
    plan_path.write_text(json.dumps(msizes))
    (port,) = free_ports(1)
    prof_path = workdir / "receiver.pstats"
    child = spawn("recv-fedcore", port, plan_path, profile_out=str(prof_path))
    try:
        fed = FedcoreSender(port)
        await fed.connect()
        payload = payload_tensor(size)
        await fed.send(fed.message(payload))  # warm-up
        profiler = cProfile.Profile()
        c0 = cpu_now()
        t0 = time.perf_counter()
        profiler.enable()
        for _ in range(count):
            await fed.send(fed.message(payload))
        profiler.disable()
        wall = time.perf_counter() - t0
        c1 = cpu_now()
        await fed.close()
        rec = finish_child(child, "profiled fedcore")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    rcpu = rec["cpu"][1:]
    return {
        "size": size,
        "messages": count,
        "wall_s": wall,
        "mb_per_s": count * size / wall / 1e6,
        "sender_cpu_s": c1[0] - c0[0],
        "sender_main_thread_cpu_s": c1[1] - c0[1],
        "receiver_cpu_s": sum(c[0] for c in rcpu),
        "receiver_main_thread_cpu_s": sum(c[1] for c in rcpu),
        "sender_top": _top(profiler, 14),
        "receiver_top": _top(str(prof_path), 14),
    }


def sender_child_main(args: argparse.Namespace) -> int:
    """A gRPC sender in its own process (for variants): reads 'SIZE COUNT' lines on stdin."""
    if args.chunk_bytes:
        # GrpcTransport.send has no chunk-size parameter; swap the function it calls.
        grpc_transport_module.message_to_wire = functools.partial(  # type: ignore[assignment]
            serde.message_to_wire, chunk_bytes=args.chunk_bytes
        )

    async def main() -> None:
        fed = FedcoreSender(args.port)
        await fed.connect()
        payloads: dict[int, torch.Tensor] = {}
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line.strip() or line.strip() == "QUIT":
                break
            n, count = (int(x) for x in line.split())
            if n not in payloads:
                payloads[n] = payload_tensor(n)
            payload = payloads[n]
            times = []
            for _ in range(count):
                msg = fed.message(payload)
                t0 = time.perf_counter()
                await fed.send(msg)
                times.append(time.perf_counter() - t0)
            print("TIMES " + json.dumps(times), flush=True)
        await fed.close()

    asyncio.run(main())
    return 0


async def measure_variants(
    workdir: Path, sizes: list[int], repeats: int, variants: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """gRPC sender and receiver both as children, per variant (malloc env, chunk size);
    bursts interleaved across the variants."""
    per_variant = [size for size in sizes for _ in range(1 + repeats * burst_count(size))]
    plan_path = workdir / "plan-variants.json"
    plan_path.write_text(json.dumps(per_variant))
    ports = free_ports(len(variants))
    pairs = []
    try:
        for v, port in zip(variants, ports, strict=True):
            recv = spawn("recv-fedcore", port, plan_path, env_extra=v["env"])
            env = dict(os.environ)
            for key in MALLOC_KEYS:
                env.pop(key, None)
            env.update(v["env"])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
            argv = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--role",
                "send-fedcore",
                "--port",
                str(port),
                "--chunk-bytes",
                str(v["chunk_bytes"] or 0),
            ]
            send = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            pairs.append((recv, send))
        for _, send in pairs:
            assert send.stdout is not None
            line = send.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"variant sender did not start: {line!r} {send.stderr}")

        def burst(send: subprocess.Popen[str], n: int, count: int) -> list[float]:
            assert send.stdin is not None and send.stdout is not None
            send.stdin.write(f"{n} {count}\n")
            send.stdin.flush()
            line = send.stdout.readline()
            if not line.startswith("TIMES "):
                raise RuntimeError(f"variant sender failed: {line!r}")
            times: list[float] = json.loads(line[6:])
            return times

        results: list[dict[str, Any]] = [
            {
                "name": v["name"],
                "env": v["env"],
                "chunk_bytes": v["chunk_bytes"] or serde.CHUNK_BYTES,
                "rates": {n: [] for n in sizes},
            }
            for v in variants
        ]
        for n in sizes:
            for _, send in pairs:
                burst(send, n, 1)  # warm-up
            for rep in range(repeats):
                k = len(pairs)
                for j in range(k):
                    idx = (j + rep) % k
                    times = burst(pairs[idx][1], n, burst_count(n))
                    results[idx]["rates"][n].append(len(times) * n / sum(times) / 1e6)
        for _, send in pairs:
            assert send.stdin is not None
            send.stdin.write("QUIT\n")
            send.stdin.flush()
        for recv, send in pairs:
            send.wait(timeout=60)
            finish_child(recv, "variant fedcore")
    finally:
        for recv, send in pairs:
            for p in (recv, send):
                if p.poll() is None:
                    p.kill()
                    p.wait()
    for r in results:
        r["mb_per_s"] = {n: statistics.median(v) for n, v in r["rates"].items()}
        r["rates"] = {str(n): v for n, v in r["rates"].items()}
        r["mb_per_s"] = {str(n): v for n, v in r["mb_per_s"].items()}
    return results


# --------------------------------------------------------------------------- main


def machine_info() -> dict[str, Any]:
    import grpc

    return _common.machine_info(grpc=grpc.__version__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 1024, 16384, 65536])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (default 7)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the gRPC path and run the variants even when the target is met",
    )
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="never profile or run the variants (for repeated A/B runs)",
    )
    parser.add_argument(
        "--no-variants",
        action="store_true",
        help="skip the malloc / chunk-size variants of the gRPC pair",
    )
    parser.add_argument(
        "--variant-repeats",
        type=int,
        default=5,
        help="interleaved repeats of the variants (default 5)",
    )
    parser.add_argument(
        "--serde-chunks", type=int, nargs="+", default=[64 * KIB, 256 * KIB, MIB, 4 * MIB]
    )
    parser.add_argument("--serde-repeats", type=int, default=5)
    # Internal: the child processes.
    parser.add_argument(
        "--role",
        default="main",
        help=argparse.SUPPRESS,
        choices=["main", "recv-raw", "recv-gloo", "recv-fedcore", "send-fedcore", "serde"],
    )
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plan", default="", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chunk-bytes", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    # As `fedcore node` does (FEDCORE_MALLOC_TUNING=0 in a variant's env turns it off);
    # it applies to every method's processes alike.
    tune_malloc()
    if args.role.startswith("recv-"):
        return receiver_main(args)
    if args.role == "send-fedcore":
        return sender_child_main(args)
    if args.role == "serde":
        result = serde_costs(64 * MIB, args.serde_chunks, args.serde_repeats)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    return asyncio.run(main_async(args, argv))


async def main_async(args: argparse.Namespace, argv: list[str] | None) -> int:
    began = time.perf_counter()
    info = machine_info()
    sizes = [k * KIB for k in args.sizes_kib]
    workdir = args.out.parent / "transport-work"
    workdir.mkdir(parents=True, exist_ok=True)

    measured = await measure(sizes, args.repeats, workdir)
    rows = summarize(measured["bursts"], sizes)
    print(format_table(rows), flush=True)
    checked = [r for r in rows if r["size"] in TARGET_SIZES]
    met = bool(checked) and all(r["fedcore_over_raw"] >= TARGET_FRACTION for r in checked)
    cpu_met = bool(checked) and all(
        r["fedcore_receiver_cpu_over_raw"] <= TARGET_RECV_CPU for r in checked
    )
    for r in checked:
        verdict = "meets" if r["fedcore_over_raw"] >= TARGET_FRACTION else "MISSES"
        cpu = r["fedcore_receiver_cpu_over_raw"]
        cpu_verdict = "meets" if cpu <= TARGET_RECV_CPU else "MISSES"
        print(
            f"{size_label(r['size'])}: fedcore/raw bandwidth {r['fedcore_over_raw']:.2f} {verdict} "
            f"the target >= {TARGET_FRACTION}; receiver CPU per MiB {cpu:.2f}x raw's "
            f"{cpu_verdict} the target <= {TARGET_RECV_CPU:g}",
            flush=True,
        )

    serde_default = serde_costs(64 * MIB, args.serde_chunks, args.serde_repeats)
    print(format_serde(serde_default, "this process's malloc settings", stages=False), flush=True)
    serde_tuned = serde_in_child(TUNED_MALLOC_ENV, args.serde_chunks, args.serde_repeats)
    print(
        format_serde(serde_tuned, "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2**40", stages=True),
        flush=True,
    )

    profile = None
    variants = None
    if (not met or args.profile) and not args.no_profile:
        profile = await profile_fedcore(workdir, 64 * MIB, 6)
        print(
            f"\ncProfile, fedcore gRPC, {profile['messages']} x 64 MiB: "
            f"{profile['mb_per_s']:.0f} MB/s (slower under the profiler); CPU s sender "
            f"{profile['sender_cpu_s']:.2f} (main thread {profile['sender_main_thread_cpu_s']:.2f})"
            f", receiver {profile['receiver_cpu_s']:.2f} (main thread "
            f"{profile['receiver_main_thread_cpu_s']:.2f})"
        )
        print("sender, by own time:\n" + profile["sender_top"])
        print("receiver, by own time:\n" + profile["receiver_top"])
        if not args.no_variants:
            specs = [
                {"name": "default", "env": {"FEDCORE_MALLOC_TUNING": "0"}, "chunk_bytes": None},
                {"name": "malloc-tuned", "env": TUNED_MALLOC_ENV, "chunk_bytes": None},
                {
                    "name": "malloc-tuned + chunk 256 KiB",
                    "env": TUNED_MALLOC_ENV,
                    "chunk_bytes": 256 * KIB,
                },
                {
                    "name": "malloc-tuned + chunk 4 MiB",
                    "env": TUNED_MALLOC_ENV,
                    "chunk_bytes": 4 * MIB,
                },
            ]
            vsizes = [n for n in sizes if n in TARGET_SIZES] or sizes[-2:]
            variants = await measure_variants(workdir, vsizes, args.variant_repeats, specs)
            print("\ngRPC sender and receiver both child processes, per variant (median MB/s):")
            print("| variant | " + " | ".join(size_label(n) for n in vsizes) + " |")
            print("|---------|" + "|".join("-------:" for _ in vsizes) + "|")
            for v in variants:
                print(
                    f"| {v['name']} | "
                    + " | ".join(f"{v['mb_per_s'][str(n)]:.0f}" for n in vsizes)
                    + " |"
                )

    wall = time.perf_counter() - began
    info["loadavg_end"] = list(os.getloadavg())
    print(f"wall time {wall:.1f} s")
    report = {
        "benchmark": "loopback bandwidth: raw TCP vs torch.distributed gloo vs fedcore gRPC",
        "command": " ".join(
            ["python", "benchmarks/transport.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "settings": {
            "sizes": sizes,
            "repeats": args.repeats,
            "messages_per_burst": {str(n): burst_count(n) for n in sizes},
            "mb": "10**6 bytes",
            "timed": "per message: send until the receiver's ack (raw: 1 byte; gloo: a "
            "1-element tensor; fedcore: the Push stream's Ack)",
            "target": f"fedcore >= {TARGET_FRACTION} x raw's bandwidth and <= "
            f"{TARGET_RECV_CPU:g} x raw's receiver CPU per MiB at 16 MiB and 64 MiB",
        },
        "machine": info,
        "setup_s": measured["setup_s"],
        "results": rows,
        "target_met": met,
        "receiver_cpu_target_met": cpu_met,
        "bursts": measured["bursts"],
        "serde": {"default_malloc": serde_default, "tuned_malloc": serde_tuned},
        "profile": profile,
        "variants": variants,
        "wall_s": wall,
    }
    _common.write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
