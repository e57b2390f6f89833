# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Round time of ``fedcore launch`` (one process per peer, gRPC on 127.0.0.1) against
``fedcore simulate`` of the same config, with a ~1M-parameter model.

Config: fedcore's defaults except ``algorithm.name = dpsgd``, ``topology.kind = ring`` with
N nodes, ``model.name = mlp`` with ``model.hidden = 13333`` (64*h + h + 10*h + 10 =
999,985 parameters on digits, so a message is 4 MB), ``run.rounds = R``,
``run.eval_every`` larger than R (only the last round evaluates) and a longer
``transport.startup_timeout_s`` (16 peers importing torch on 2 cores take a while).

For each N, ``fedcore.runners.launch.launch(config)`` runs in this process while a watcher
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

Usage::

    python benchmarks/launch_rounds.py [--peers 4 8 16] [--rounds 8] [--hidden 13333]
        [--profile-peer n0 | --profile-peer none] [--out benchmarks/results/launch_rounds.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pstats
import shutil
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
from fedcore.runners import launch as launch_module
from fedcore.runners.launch import launch
from fedcore.runners.simulate import RunObserver, simulate

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "launch_rounds.json"
HIDDEN_1M = 13_333  # 75 * h + 10 = 999,985 parameters (64 inputs, 10 classes)


def make_config(n: int, rounds: int, hidden: int, algorithm: str, topology: str) -> Config:
    return load_config(
        None,
        overrides=[
            f"topology.kind={topology}",
            f"topology.nodes={n}",
            f"algorithm.name={algorithm}",
            "model.name=mlp",
            f"model.hidden={hidden}",
            f"run.rounds={rounds}",
            f"run.eval_every={10**6}",
            "run.name=bench",
            "transport.kind=grpc",
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

    def start(self: Any, node: str, argv: list[str], folder: Path, env: dict[str, str]) -> None:
        if node == profile_peer:
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
        original_start(self, node, argv, folder, env)

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
    """``simulate(config)``, noting when each round completes (before its evaluation)."""
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
    ("  of which Node.validate (decode + finite check)", "fedcore/node.py", "validate"),
    (
        "  of which MessageAssembler (copies into the buffer, finish)",
        "fedcore/transport/grpc/serde.py",
        "add+_start+finish",
    ),
    ("mix: algorithm mix (gossip average)", "fedcore/algorithms/dpsgd.py", "mix"),
    ("record + snapshot (_PeerLog)", "fedcore/runners/peer.py", "__call__"),
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
    parser.add_argument("--peers", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=HIDDEN_1M)
    parser.add_argument("--algorithm", default="dpsgd")
    parser.add_argument("--topology", default="ring")
    parser.add_argument(
        "--profile-peer",
        default="n0",
        help="peer of the largest-N launch to run under cProfile ('none': no profile)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:2] == ["--role", "peer"]:
        return peer_main(raw[2:])
    args = parse_args(argv)
    torch.set_num_threads(1)
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
