# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Round time of ``fedcore launch`` (one process per peer, gRPC on 127.0.0.1) against
``fedcore simulate`` of the same config, with a ~1M-parameter model.

Config: fedcore's defaults except ``algorithm.name = dpsgd``, ``topology.kind = ring`` with
N nodes, ``model.name = mlp`` with ``model.hidden = 13333`` (64*h + h + 10*h + 10 =
999,985 parameters on digits, so a message is 4 MB), ``run.rounds = R``,
``run.eval_every`` larger than R (only the last round evaluates) and a longer
``transport.startup_timeout_s`` (16 peers importing torch on 2 cores take a while).

For each N, ``fedcore.deploy.launch.launch(config)`` runs in this process while a watcher
thread notes when each peer's per-round record (``nodes/<id>/metrics.jsonl``) appears and
samples the CPU time of the peer processes (``/proc``). Then ``simulate(config)``.
Reported per N:

* start-up: from the ``launch`` call until the first round record appears;
* round time, steady state: (all peers done with the last round - all peers done with
  round 0) / (R - 1), and from the records' own ``wall_s`` (median over rounds >= 1 of the
  slowest peer, and the median over peers and rounds >= 1);
* CPU seconds per round of all peers together in the steady state (2 cores give at most
  2 CPU-seconds per wall second);
* total wall time of ``launch`` (start-up + rounds + the launcher's merge and evaluation);
* ``simulate``: steady-state round time, (round R-1 complete - round 0 complete) / (R - 1),
  from its observer's round completions (noted before the final evaluation); also its
  ``wall_seconds`` / R (first round and final evaluation included).

Where the time goes: in the largest-N launch, one peer (``--profile-peer``, default n0) runs
the same ``fedcore node`` CLI through this script (the launcher's child start is wrapped),
with cProfile on its main thread's CPU time during rounds 1..R-1 (imports, set-up,
connecting and round 0, which waits for slower-starting peers, are outside), and per round
its wall time, process CPU, and its main thread's on-CPU and run-queue time (schedstat).
The profile splits the main thread's CPU into compute, encode, send, receive, decode,
mix; wall minus on-CPU minus run-queue is time blocked on messages and acks. The other
peers are plain children; the watcher adds up every peer's on-CPU and run-queue time.

Peers per process (``--peers-per-process K ...``): instead, for every N of ``--peers``
(default 16 64) and every K, ``launch(config, peers_per_process=K)`` with a small model
(``model.hidden = 64``: 4,810 parameters) and ``--rounds`` (default 10), and once per N
``simulate`` with the message engine. Reported per (N, K):

* start-up to round 1: from the ``launch`` call until every peer has recorded round 0;
* round time, steady state, as above;
* memory: the peak, sampled every second, of the sum over the peer processes of PSS
  (``/proc/<pid>/smaps_rollup``: each shared page split among the processes that map it,
  so the sum is what the peers really take) and of RSS (which counts shared libraries once
  per process); the launcher itself is not counted. A run whose peers would not fit (the
  PSS of a process at K = 1 times the processes, against the available memory less 3 GiB)
  is skipped, and one that brings the available memory under 3 GiB is stopped, both with
  the reason in the table;
* whether it equals ``simulate`` bit for bit: every peer's ``params_sha256``, the final
  figures and every merged record (timings left out).

It also checks that K = 8 of 16 peers equals ``simulate`` and takes at most a third of
the memory (PSS) of K = 1.

Usage::

    python benchmarks/launch_rounds.py [--peers 4 8 16] [--rounds 8] [--hidden 13333]
        [--profile-peer n0 | --profile-peer none] [--out benchmarks/results/launch_rounds.json]
    python benchmarks/launch_rounds.py --peers-per-process 1 4 8 16 [--peers 16 64]
        [--rounds 10] [--hidden 64] [--out benchmarks/results/launch_peers_per_process.json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import pstats
import shutil
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

# Runnable as `python benchmarks/launch_rounds.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.config import Config, load_config
from fedcore.deploy import launch as launch_module
from fedcore.deploy.launch import launch
from fedcore.simulation.observer import RunObserver
from fedcore.simulation.simulate import simulate

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "launch_rounds.json"
DEFAULT_PPP_OUT = Path(__file__).resolve().parent / "results" / "launch_peers_per_process.json"
HIDDEN_1M = 13_333  # 75 * h + 10 = 999,985 parameters (64 inputs, 10 classes)


def make_config(
    n: int, rounds: int, hidden: int, algorithm: str, topology: str, *extra: str
) -> Config:
    return load_config(
        None,
        overrides=[
            *extra,
            f"topology.kind={topology}",
            f"topology.nodes={n}",
            f"algorithm.name={algorithm}",
            "model.name=mlp",
            f"model.hidden={hidden}",
            f"run.rounds={rounds}",
            f"run.eval_every={10**6}",
            "run.name=bench",
            "transport.startup_timeout_s=300",
        ],
    )


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _schedstat(pid: int) -> tuple[int, int]:
    """(on-CPU ns, run-queue wait ns) of ``pid``'s main thread (threads that exit take their
    schedstat with them, so only the main thread's is reliable)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", encoding="ascii") as fh:
            on_cpu, waited, _ = (int(x) for x in fh.read().split())
    except (OSError, ValueError):
        return 0, 0
    return on_cpu, waited


def children_sample(parent: int) -> dict[str, float]:
    """CPU (s, every thread, exited ones included) and the main threads' on-CPU and run-queue
    wait (s) of the live direct children of ``parent``, summed."""
    out = {"processes": 0.0, "cpu_s": 0.0, "main_cpu_s": 0.0, "main_runqueue_s": 0.0}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) != parent:
            continue
        main_cpu, main_wait = _schedstat(int(entry))
        out["processes"] += 1
        out["cpu_s"] += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime
        out["main_cpu_s"] += main_cpu / 1e9
        out["main_runqueue_s"] += main_wait / 1e9
    return out


class Watcher(threading.Thread):
    """Notes when each peer's round records appear, and samples the peers' CPU and run-queue
    wait when the first record appears, when every peer finished round 0, and when every
    peer finished the last round."""

    def __init__(self, nodes_dir: Path, nodes: list[str], rounds: int, t0: float) -> None:
        super().__init__(daemon=True)
        self.nodes_dir = nodes_dir
        self.nodes = nodes
        self.rounds = rounds
        self.t0 = t0
        self.seen: dict[str, list[float]] = {n: [] for n in nodes}
        self.offsets = dict.fromkeys(nodes, 0)
        self.marks: dict[str, dict[str, float]] = {}
        self.stop_flag = threading.Event()

    def _mark(self, name: str) -> None:
        if name not in self.marks:
            sample = children_sample(os.getpid())
            sample["t"] = time.perf_counter() - self.t0
            self.marks[name] = sample

    def run(self) -> None:
        while not self.stop_flag.is_set():
            now = time.perf_counter() - self.t0
            for n in self.nodes:
                path = self.nodes_dir / n / "metrics.jsonl"
                try:
                    with open(path, "rb") as fh:
                        fh.seek(self.offsets[n])
                        chunk = fh.read()
                except FileNotFoundError:
                    continue
                done = chunk.rfind(b"\n") + 1
                self.offsets[n] += done
                self.seen[n].extend([now] * chunk[:done].count(b"\n"))
            counts = [len(v) for v in self.seen.values()]
            if max(counts) >= 1:
                self._mark("first_record")
            if min(counts) >= 1:
                self._mark("all_round0")
            if min(counts) >= self.rounds:
                self._mark("all_last")
                return
            time.sleep(0.05)


def read_records(nodes_dir: Path, nodes: list[str]) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for n in nodes:
        with open(nodes_dir / n / "metrics.jsonl", encoding="utf-8") as fh:
            out[n] = [json.loads(line) for line in fh if line.strip()]
    return out


def bench_launch(config: Config, out: Path, profile_peer: str | None) -> dict[str, Any]:
    """``launch(config)`` with a watcher; ``profile_peer`` runs under :func:`peer_main`."""
    n = config.topology.nodes
    rounds = config.run.rounds
    nodes = [f"n{i}" for i in range(n)]
    if out.exists():
        shutil.rmtree(out)
    prof_path = out / f"{profile_peer}.pstats"
    merge_began: list[float] = []
    original_start = launch_module._Children.start
    original_merge = launch_module._merge

    def start(
        self: Any,
        index: int,
        peers: Any,
        argv: list[str],
        log_path: Path,
        env: dict[str, str],
    ) -> None:
        if profile_peer in peers:
            # argv is [python, -m, fedcore, node, ...]: same CLI, with the profiler around it.
            assert argv[1:4] == ["-m", "fedcore", "node"], argv
            argv = [
                argv[0],
                str(Path(__file__).resolve()),
                "--role",
                "peer",
                str(prof_path),
                *argv[4:],
            ]
        original_start(self, index, peers, argv, log_path, env)

    def merge(*args: Any, **kwargs: Any) -> Any:
        merge_began.append(time.perf_counter())
        return original_merge(*args, **kwargs)

    launch_module._Children.start = start  # type: ignore[method-assign]
    launch_module._merge = merge  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        watcher = Watcher(out / "nodes", nodes, rounds, t0)
        watcher.start()
        summary = launch(config, out_dir=out, show_progress=False)
        total = time.perf_counter() - t0
    finally:
        launch_module._Children.start = original_start  # type: ignore[method-assign]
        launch_module._merge = original_merge
        watcher.stop_flag.set()
    watcher.join()
    records = read_records(out / "nodes", nodes)
    by_round = [[records[p][t]["wall_s"] for p in nodes] for t in range(rounds)]
    steady = by_round[1:] or by_round
    marks = watcher.marks
    first = marks["first_record"]["t"]
    r0 = marks["all_round0"]["t"]
    last = marks["all_last"]["t"]
    steady_rounds = max(1, rounds - 1)
    steady_wall = max(1e-9, last - r0)

    def per_round(key: str) -> float:
        return (marks["all_last"][key] - marks["all_round0"][key]) / steady_rounds

    result: dict[str, Any] = {
        "nodes": n,
        "rounds": rounds,
        "total_s": total,
        "startup_s": first,
        "all_round0_done_s": r0,
        "last_round_done_s": last,
        "peers_exit_s": merge_began[0] - t0 - last,
        "merge_s": total - (merge_began[0] - t0),
        "round_s_steady": (last - r0) / steady_rounds,
        "round_s_records_slowest_median": statistics.median(max(r) for r in steady),
        "round_s_records_median": statistics.median(x for r in steady for x in r),
        "round0_s_records_max": max(by_round[0]),
        "peer_processes_seen": marks["all_round0"]["processes"],
        "peer_cpu_s_startup": marks["all_round0"]["cpu_s"],
        "peer_cpu_s_per_round": per_round("cpu_s"),
        "peer_main_thread_cpu_s_per_round": per_round("main_cpu_s"),
        "peer_main_thread_runqueue_s_per_round": per_round("main_runqueue_s"),
        "cores_busy_in_rounds": per_round("cpu_s") * steady_rounds / steady_wall,
        "wall_s_records": by_round,
        "summary_wall_seconds": summary["wall_seconds"],
        "bytes_per_node_per_round": summary["traffic"]["bytes_per_node_per_round"],
        "final_accuracy": summary["final"].get("avg_model_accuracy"),
        "profiled_peer": profile_peer,
    }
    if profile_peer is not None:
        result["profile"] = read_profile(prof_path, records[profile_peer])
    return result


def bench_simulate(config: Config, out: Path) -> dict[str, Any]:
    """``simulate(config)`` on the message engine (one node object per peer exchanging
    encoded messages, as the launched peers do; ``auto`` would take the vectorized engine,
    which neither compares like with like nor reports round completions), noting when each
    round completes (before its evaluation)."""
    config = dataclasses.replace(
        config, simulate=dataclasses.replace(config.simulate, engine="messages")
    )
    if out.exists():
        shutil.rmtree(out)
    done: list[float] = []
    original = RunObserver._round_complete

    def noting(self: RunObserver, t: int) -> None:
        done.append(time.perf_counter())
        original(self, t)

    RunObserver._round_complete = noting  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        c0 = time.process_time()
        summary = simulate(config, out_dir=out, show_progress=False)
        total = time.perf_counter() - t0
    finally:
        RunObserver._round_complete = original  # type: ignore[method-assign]
    rounds = config.run.rounds
    return {
        "nodes": config.topology.nodes,
        "engine": config.simulate.engine,
        "rounds": rounds,
        "total_s": total,
        "cpu_s": time.process_time() - c0,
        "run_s": summary["wall_seconds"],
        "round_s_with_eval": summary["wall_seconds"] / rounds,
        "round_s": (done[-1] - done[0]) / (rounds - 1) if rounds > 1 else done[0] - t0,
        "build_s": total - summary["wall_seconds"],
        "final_accuracy": summary["final"].get("avg_model_accuracy"),
    }


# --------------------------------------------------------------------------- profile


def peer_main(argv: list[str]) -> int:
    """``fedcore node`` with a CPU-time cProfile during rounds 1.. (the profiled peer).

    Also notes, per round, the wall time, the process CPU (all threads: gRPC's C-core
    threads too), and the main thread's on-CPU and run-queue wait from schedstat.
    """
    import cProfile

    from fedcore import cli
    from fedcore.node import Node

    out_path = argv[0]
    # Main-thread CPU time as the clock: with 16 peers on 2 cores, wall-clock profiles mostly
    # measure preemption.
    profiler = cProfile.Profile(time.thread_time)
    original = Node.run_round
    per_round: list[dict[str, float]] = []
    pid = os.getpid()

    async def profiled_round(self: Node) -> Any:
        if self.round == 0:  # round 0 waits for the peers still starting: not profiled
            return await original(self)
        w0, c0 = time.perf_counter(), time.process_time()
        s0 = _schedstat(pid)
        profiler.enable()
        try:
            return await original(self)
        finally:
            profiler.disable()
            s1 = _schedstat(pid)
            per_round.append(
                {
                    "wall_s": time.perf_counter() - w0,
                    "process_cpu_s": time.process_time() - c0,
                    "main_cpu_s": (s1[0] - s0[0]) / 1e9,
                    "main_runqueue_s": (s1[1] - s0[1]) / 1e9,
                }
            )

    Node.run_round = profiled_round  # type: ignore[method-assign]
    status = cli.main(["node", *argv[1:]])
    profiler.dump_stats(out_path)
    Path(out_path + ".json").write_text(json.dumps(per_round))
    return status


CATEGORIES: list[tuple[str, str, str]] = [
    # (label, file suffix, function): the function's cumulative main-thread CPU
    ("compute: forward + backward (Objective.loss_and_grad)", "fedcore/models.py", "loss_and_grad"),
    ("step: algorithm step (x - lr * g)", "fedcore/algorithms/dpsgd.py", "step"),
    ("encode: RawCodec.encode (tensor -> bytes)", "fedcore/compression/base.py", "encode"),
    (
        "send: gRPC request writer (message_to_chunks, serialize, write)",
        "grpc/aio/_call.py",
        "_consume_request_iterator",
    ),
    ("send: GrpcTransport.send (the call itself)", "fedcore/transport/grpc/transport.py", "send"),
    (
        "receive: Push servicer (read, deserialize, assemble, validate)",
        "fedcore/transport/grpc/transport.py",
        "Push",
    ),
    ("  of which Node.validate (decode + finite check)", "fedcore/node/intake.py", "validate"),
    (
        "  of which MessageAssembler (copies into the buffer, finish)",
        "fedcore/transport/grpc/serde.py",
        "add+_start+finish",
    ),
    ("mix: algorithm mix (gossip average)", "fedcore/algorithms/dpsgd.py", "mix"),
    ("record + snapshot (_PeerLog)", "fedcore/deploy/peer.py", "__call__"),
]


def split_profile(path: Path, rounds: int) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    rows = []
    for label, suffix, funcs in CATEGORIES:
        wanted = set(funcs.split("+"))
        ct = sum(
            cum
            for (file, _line, name), (_cc, _nc, _tt, cum, _callers) in raw.items()
            if name in wanted and file.replace("\\", "/").endswith(suffix)
        )
        rows.append({"what": label, "s": ct, "ms_per_round": 1e3 * ct / rounds})
    top_level = [r for r in rows if not r["what"].startswith(" ")]
    rest = total - sum(r["s"] for r in top_level)
    rows.append(
        {
            "what": "other main-thread CPU (asyncio, gRPC's Python layer, ...)",
            "s": rest,
            "ms_per_round": 1e3 * rest / rounds,
        }
    )
    return {"profiled_main_thread_cpu_s": total, "rows": rows}


def top_functions(path: Path, n: int) -> str:
    import io

    buf = io.StringIO()
    stats = pstats.Stats(str(path), stream=buf)
    stats.sort_stats("tottime").print_stats(n)
    text = buf.getvalue()
    start = text.find("   ncalls")
    return text[start:] if start >= 0 else text


def read_profile(prof_path: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    per_round = json.loads(Path(str(prof_path) + ".json").read_text())
    rounds = len(per_round)

    def mean(key: str) -> float:
        return sum(r[key] for r in per_round) / rounds

    wall, main_cpu, runq = mean("wall_s"), mean("main_cpu_s"), mean("main_runqueue_s")
    return {
        "rounds_profiled": rounds,
        "per_round": per_round,
        "wall_ms_per_round": 1e3 * wall,
        "main_thread_cpu_ms_per_round": 1e3 * main_cpu,
        "main_thread_runqueue_ms_per_round": 1e3 * runq,
        "main_thread_blocked_ms_per_round": 1e3 * (wall - main_cpu - runq),
        "other_threads_cpu_ms_per_round": 1e3 * (mean("process_cpu_s") - main_cpu),
        "split": split_profile(prof_path, rounds),
        "top": top_functions(prof_path, 25),
        "records_wall_s": [r["wall_s"] for r in records],
    }


def format_profile(n: int, peer: str, p: dict[str, Any]) -> str:
    lines = [
        f"N={n}, where peer {peer}'s round goes (rounds 1..R-1, {p['rounds_profiled']} "
        f"rounds, cProfile on its main thread's CPU time):",
        "| where | ms / round |",
        "|---|---:|",
        f"| wall time of a round | {p['wall_ms_per_round']:.0f} |",
        f"| main thread blocked (waiting for messages, acks) | "
        f"{p['main_thread_blocked_ms_per_round']:.0f} |",
        f"| main thread runnable, waiting for a core | "
        f"{p['main_thread_runqueue_ms_per_round']:.0f} |",
        f"| main thread on a core | {p['main_thread_cpu_ms_per_round']:.0f} |",
    ]
    for r in p["split"]["rows"]:
        lines.append(f"| &nbsp;&nbsp;{r['what'].strip()} | {r['ms_per_round']:.1f} |")
    lines.append(
        f"| other threads on a core (gRPC C-core I/O) | {p['other_threads_cpu_ms_per_round']:.0f} |"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- peers per process


def _rollup(pid: int) -> tuple[int, int] | None:
    """(RSS, PSS) in bytes of process ``pid`` (``/proc/<pid>/smaps_rollup``)."""
    rss = pss = None
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return (rss, pss) if rss is not None and pss is not None else None


def _children_pids(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[1]) == parent:
            pids.append(int(entry))
    return pids


def _mem_available() -> int:
    with open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class MemorySampler(threading.Thread):
    """Sums RSS and PSS over the peer processes (this process's children) every
    ``interval_s`` and keeps the peaks. PSS splits each shared page among the processes
    that map it, so its sum is the memory the peers really take; RSS counts shared
    libraries once per process. If the machine's available memory drops under
    ``floor_bytes``, it stops the peers (SIGKILL) and says so, rather than waiting for the
    kernel's OOM killer to pick a process of its own."""

    def __init__(self, interval_s: float = 1.0, floor_bytes: int = 3 << 30) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.floor_bytes = floor_bytes
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self.peak_process_pss = 0
        self.samples = 0
        self.aborted: str | None = None
        self.stop_flag = threading.Event()

    def sample(self) -> None:
        rss = pss = 0
        pids = _children_pids(os.getpid())
        for pid in pids:
            got = _rollup(pid)
            if got is not None:
                rss += got[0]
                pss += got[1]
                self.peak_process_pss = max(self.peak_process_pss, got[1])
        self.samples += 1
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_processes = max(self.peak_processes, len(pids))
        available = _mem_available()
        if pids and available < self.floor_bytes and self.aborted is None:
            self.aborted = (
                f"available memory fell to {available / 2**30:.1f} GiB with {len(pids)} peer "
                f"processes holding {pss / 2**30:.1f} GiB (PSS); the peers were stopped"
            )
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.sample()
            self.stop_flag.wait(self.interval_s)


def comparable_metrics(path: Path) -> list[dict[str, Any]]:
    """A run's merged records without their timings, in one order."""
    with open(path, encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    for r in records:
        r.pop("wall_s", None)
    return sorted(records, key=lambda r: (r["round"], r["kind"], r.get("node", "")))


def bench_ppp(config: Config, k: int, out: Path, reference: dict[str, Any]) -> dict[str, Any]:
    """``launch(config, peers_per_process=k)`` with the round watcher and the memory
    sampler; compared with ``reference`` (simulate's summary and records)."""
    n = config.topology.nodes
    rounds = config.run.rounds
    nodes = [f"n{i}" for i in range(n)]
    if out.exists():
        shutil.rmtree(out)
    sampler = MemorySampler()
    t0 = time.perf_counter()
    watcher = Watcher(out / "nodes", nodes, rounds, t0)
    watcher.start()
    sampler.start()
    error = None
    try:
        summary = launch(config, out_dir=out, show_progress=False, peers_per_process=k)
    except Exception as exc:  # a run stopped for memory, say: reported, not fatal
        summary, error = None, f"{type(exc).__name__}: {exc}"
    finally:
        total = time.perf_counter() - t0
        sampler.stop_flag.set()
        watcher.stop_flag.set()
    sampler.join()
    watcher.join()
    processes = -(-n // k)
    result: dict[str, Any] = {
        "nodes": n,
        "peers_per_process": k,
        "processes": processes,
        "rounds": rounds,
        "total_s": total,
        "peak_rss_sum_bytes": sampler.peak_rss,
        "peak_pss_sum_bytes": sampler.peak_pss,
        "peak_process_pss_bytes": sampler.peak_process_pss,
        "pss_per_peer_bytes": sampler.peak_pss / n,
        "memory_samples": sampler.samples,
        "peer_processes_seen": sampler.peak_processes,
    }
    if sampler.aborted or summary is None:
        result["error"] = sampler.aborted or error
        return result
    marks = watcher.marks
    r0, last = marks["all_round0"]["t"], marks["all_last"]["t"]
    same_metrics = comparable_metrics(out / "metrics.jsonl") == reference["metrics"]
    result.update(
        {
            "first_record_s": marks["first_record"]["t"],
            "startup_to_round1_s": r0,
            "round_s_steady": (last - r0) / max(1, rounds - 1),
            "peer_cpu_s_startup": marks["all_round0"]["cpu_s"],
            "params_sha256_equal": summary["params_sha256"] == reference["params_sha256"],
            "metrics_equal": same_metrics,
            "final_equal": summary["final"] == reference["final"],
            "final_accuracy": summary["final"].get("avg_model_accuracy"),
        }
    )
    result["equals_simulate"] = bool(
        result["params_sha256_equal"] and result["metrics_equal"] and result["final_equal"]
    )
    return result


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f}"


def format_ppp_table(rows: list[dict[str, Any]]) -> str:
    base = {r["nodes"]: r for r in rows if r["peers_per_process"] == 1 and "error" not in r}
    lines = [
        "|  N |  K | processes | start-up to round 1 s | round s | peak RSS sum GiB "
        "| peak PSS sum GiB | PSS / peer MiB | PSS vs K=1 | = simulate |",
        "|---:|---:|----------:|---------------------:|--------:|-----------------:"
        "|-----------------:|---------------:|-----------:|:----------:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['nodes']:>2} | {r['peers_per_process']:>2} | {r['processes']:>9} "
                f"| not run: {r['error']} |"
            )
            continue
        ref = base.get(r["nodes"])
        ratio = f"{r['peak_pss_sum_bytes'] / ref['peak_pss_sum_bytes']:.2f}" if ref else "-"
        lines.append(
            f"| {r['nodes']:>2} | {r['peers_per_process']:>2} | {r['processes']:>9} "
            f"| {r['startup_to_round1_s']:20.1f} | {r['round_s_steady']:7.3f} "
            f"| {_gib(r['peak_rss_sum_bytes']):>16} | {_gib(r['peak_pss_sum_bytes']):>16} "
            f"| {r['pss_per_peer_bytes'] / 2**20:14.0f} | {ratio:>10} "
            f"| {'yes' if r['equals_simulate'] else 'NO':^10} |"
        )
    return "\n".join(lines)


def main_ppp(args: argparse.Namespace, raw: list[str]) -> int:
    """The peers-per-process grid: every N of ``--peers`` at every K."""
    began = time.perf_counter()
    info = _common.machine_info()
    info["mem_available_start_bytes"] = _mem_available()
    runs = args.out.parent / "launch-ppp-runs"
    hidden = args.hidden if args.hidden is not None else 64
    rows: list[dict[str, Any]] = []
    per_process_pss: float | None = None  # measured at K = 1: what one more process costs
    for n in args.peers:
        # simulate's message engine: the reference launch must equal bit for bit.
        config = make_config(
            n, args.rounds, hidden, args.algorithm, args.topology, "simulate.engine=messages"
        )
        sim_out = runs / f"simulate-{n}"
        if sim_out.exists():
            shutil.rmtree(sim_out)
        sim = simulate(config, out_dir=sim_out, show_progress=False)
        reference = {
            "params_sha256": sim["params_sha256"],
            "final": sim["final"],
            "metrics": comparable_metrics(sim_out / "metrics.jsonl"),
        }
        for k in args.peers_per_process:
            if k > n:
                continue
            processes = -(-n // k)
            if per_process_pss is not None:
                need = processes * per_process_pss
                available = _mem_available() - (3 << 30)
                if need > available:
                    rows.append(
                        {
                            "nodes": n,
                            "peers_per_process": k,
                            "processes": processes,
                            "error": f"{processes} processes would need about "
                            f"{need / 2**30:.1f} GiB (PSS {per_process_pss / 2**20:.0f} MiB "
                            f"each, measured), more than the {available / 2**30:.1f} GiB "
                            "available (3 GiB kept free)",
                        }
                    )
                    print(f"N={n:>2} K={k:>2}: skipped: {rows[-1]['error']}", flush=True)
                    continue
            r = bench_ppp(config, k, runs / f"launch-{n}-k{k}", reference)
            rows.append(r)
            if "error" in r:
                print(f"N={n:>2} K={k:>2}: failed: {r['error']}", flush=True)
                continue
            if k == 1 and per_process_pss is None:
                per_process_pss = r["peak_pss_sum_bytes"] / r["processes"]
            print(
                f"N={n:>2} K={k:>2} ({r['processes']} processes): start-up to round 1 "
                f"{r['startup_to_round1_s']:.1f} s, round {r['round_s_steady']:.3f} s, peak "
                f"RSS {_gib(r['peak_rss_sum_bytes'])} GiB, PSS {_gib(r['peak_pss_sum_bytes'])} "
                f"GiB, equals simulate: {r['equals_simulate']}",
                flush=True,
            )
    wall = time.perf_counter() - began
    info["loadavg_end"] = list(os.getloadavg())
    print()
    print(
        f"{args.algorithm} on a {args.topology}, mlp hidden={hidden}, {args.rounds} rounds, "
        "1 torch thread a process; memory: peaks of the sums over the peer processes "
        "(sampled every second; the launcher not counted)"
    )
    print(format_ppp_table(rows))
    checks = []
    for r in rows:
        if r["peers_per_process"] == 8 and r["nodes"] == 16 and "error" not in r:
            ref = next((x for x in rows if x["nodes"] == 16 and x["peers_per_process"] == 1), None)
            if ref is not None and "error" not in ref:
                ratio = r["peak_pss_sum_bytes"] / ref["peak_pss_sum_bytes"]
                check = {
                    "what": "launch --peers-per-process 8 of 16 peers: equals simulate bit for "
                    "bit, at most a third of the memory (PSS) of K = 1",
                    "equals_simulate": r["equals_simulate"],
                    "pss_ratio": ratio,
                    "holds": bool(r["equals_simulate"] and ratio <= 1 / 3),
                }
                checks.append(check)
                print(
                    f"\nN=16, K=8: equals simulate bit for bit: {r['equals_simulate']}; "
                    f"PSS {ratio:.3f} of K=1's (at most 1/3: {ratio <= 1 / 3}); RSS "
                    f"{r['peak_rss_sum_bytes'] / ref['peak_rss_sum_bytes']:.3f} of K=1's"
                )
    print(f"wall time {wall:.1f} s")
    report = {
        "benchmark": "fedcore launch --peers-per-process: start-up, round time, memory",
        "command": " ".join(["python", "benchmarks/launch_rounds.py", *raw]),
        "settings": {
            "peers": args.peers,
            "peers_per_process": args.peers_per_process,
            "rounds": args.rounds,
            "hidden": hidden,
            "algorithm": args.algorithm,
            "topology": args.topology,
            "torch_threads_per_process": 1,
            "memory_sample_interval_s": 1.0,
        },
        "machine": info,
        "results": rows,
        "checks": checks,
        "wall_s": wall,
    }
    _common.write_report(args.out, report)
    return 0


# --------------------------------------------------------------------------- main


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "|  N | start-up s | launch round s (steady) | slowest peer's wall_s, median "
        "| simulate round s | launch / simulate | peers' CPU s / round | cores busy "
        "| launch total s | of which peers' exit + merge s |",
        "|---:|-----------:|------------------------:|-----------------------------:"
        "|-----------------:|------------------:|---------------------:|-----------:"
        "|---------------:|------------------------------:|",
    ]
    for r in rows:
        la, si = r["launch"], r["simulate"]
        lines.append(
            f"| {la['nodes']:>2} | {la['startup_s']:10.1f} "
            f"| {la['round_s_steady']:23.3f} | {la['round_s_records_slowest_median']:28.3f} "
            f"| {si['round_s']:16.3f} | {la['round_s_steady'] / si['round_s']:17.2f} "
            f"| {la['peer_cpu_s_per_round']:20.2f} | {la['cores_busy_in_rounds']:10.2f} "
            f"| {la['total_s']:14.1f} | {la['peers_exit_s']:.1f} + {la['merge_s']:.1f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--peers", type=int, nargs="+", help="N values (default 4 8 16; 16 64 with K)"
    )
    parser.add_argument(
        "--peers-per-process",
        type=int,
        nargs="+",
        metavar="K",
        help="the peers-per-process grid instead: start-up, round time and memory of every "
        "N at every K (e.g. 1 4 8 16), each compared with simulate bit for bit",
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 8; 10 with K)")
    parser.add_argument(
        "--hidden", type=int, help=f"mlp hidden units (default {HIDDEN_1M}; 64 with K)"
    )
    parser.add_argument("--algorithm", default="dpsgd")
    parser.add_argument("--topology", default="ring")
    parser.add_argument(
        "--profile-peer",
        default="n0",
        help="peer of the largest-N launch to run under cProfile ('none': no profile)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    grid = args.peers_per_process is not None
    if args.peers is None:
        args.peers = [16, 64] if grid else [4, 8, 16]
    if args.rounds is None:
        args.rounds = 10 if grid else 8
    if args.hidden is None and not grid:
        args.hidden = HIDDEN_1M
    if args.out is None:
        args.out = DEFAULT_PPP_OUT if grid else DEFAULT_OUT
    return args


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:2] == ["--role", "peer"]:
        return peer_main(raw[2:])
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.peers_per_process is not None:
        return main_ppp(args, raw)
    began = time.perf_counter()
    info = _common.machine_info()
    runs = args.out.parent / "launch-runs"
    profiled_n = max(args.peers)
    peer = None if args.profile_peer == "none" else args.profile_peer
    rows = []
    for n in args.peers:
        config = make_config(n, args.rounds, args.hidden, args.algorithm, args.topology)
        la = bench_launch(config, runs / f"launch-{n}", peer if n == profiled_n else None)
        print(
            f"launch   N={n:>2}: start-up {la['startup_s']:.1f} s, round "
            f"{la['round_s_steady']:.3f} s (steady), total {la['total_s']:.1f} s, peers' CPU "
            f"{la['peer_cpu_s_per_round']:.2f} s/round",
            flush=True,
        )
        si = bench_simulate(config, runs / f"simulate-{n}")
        print(
            f"simulate N={n:>2}: round {si['round_s']:.3f} s, build {si['build_s']:.1f} s",
            flush=True,
        )
        rows.append({"launch": la, "simulate": si})
    wall = time.perf_counter() - began
    info["loadavg_end"] = list(os.getloadavg())

    from fedcore.models import build_model

    params = sum(
        p.numel()
        for p in build_model(
            "mlp", input_dim=64, num_classes=10, seed=0, hidden=args.hidden
        ).parameters()
    )
    print()
    print(
        f"dpsgd on a {args.topology}, mlp hidden={args.hidden} ({params:,} parameters, "
        f"{4 * params / 1e6:.1f} MB a message), {args.rounds} rounds, 1 torch thread a peer"
    )
    print(format_table(rows))
    big = rows[args.peers.index(profiled_n)]["launch"]
    steady = max(1, args.rounds - 1)
    print(
        f"\nN={profiled_n}, all peers, steady rounds: per round and peer, main thread on a core "
        f"{1e3 * big['peer_main_thread_cpu_s_per_round'] / profiled_n:.0f} ms, waiting for a "
        f"core {1e3 * big['peer_main_thread_runqueue_s_per_round'] / profiled_n:.0f} ms; all "
        f"threads on a core {1e3 * big['peer_cpu_s_per_round'] / profiled_n:.0f} ms "
        f"({steady} rounds of {big['round_s_steady']:.2f} s)"
    )
    if "profile" in big:
        print()
        print(format_profile(profiled_n, str(peer), big["profile"]))
        print("\n" + "\n".join(big["profile"]["top"].splitlines()[:22]))
    print(f"wall time {wall:.1f} s")
    report = {
        "benchmark": "fedcore launch (gRPC peers) round time vs fedcore simulate",
        "command": " ".join(["python", "benchmarks/launch_rounds.py", *raw]),
        "settings": {
            "peers": args.peers,
            "rounds": args.rounds,
            "hidden": args.hidden,
            "params": params,
            "algorithm": args.algorithm,
            "topology": args.topology,
            "eval_every": 10**6,
            "torch_threads_per_peer": 1,
            "profiled_peer": peer,
            "profiled_n": profiled_n,
        },
        "machine": info,
        "results": rows,
        "wall_s": wall,
    }
    _common.write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
