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

Where the time goes (``--profile-nodes``, default 16): the same run started by hand, every
peer as ``python -m fedcore node`` except n0, which runs the same CLI with cProfile switched
on during rounds 1..R-1 only (imports, data set-up, connecting and round 0, which waits for
slower-starting peers, are outside), and its process and main-thread CPU time noted; its profile is split into compute, encode, send,
receive, decode, mix, idle.

Usage::

    python benchmarks/launch_rounds.py [--peers 4 8 16] [--rounds 8] [--hidden 13333]
        [--profile-nodes 16 | --profile-nodes 0] [--out benchmarks/results/launch_rounds.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
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

from fedcore.config import Config, config_to_dict, dumps_toml, load_config
from fedcore.runners.launch import free_ports, launch
from fedcore.runners.simulate import RunObserver, simulate

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "launch_rounds.json"
HIDDEN_1M = 13_333  # 75 * h + 10 = 999,985 parameters (64 inputs, 10 classes)
CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def children_cpu_s(parent: int) -> tuple[float, int]:
    """(user + system CPU seconds, count) of the live direct children of ``parent``."""
    total = 0
    count = 0
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
        total += int(fields[11]) + int(fields[12])  # utime, stime
        count += 1
    return total / CLK_TCK, count


class Watcher(threading.Thread):
    """Notes when each peer's round records appear, and the peers' CPU at the milestones."""

    def __init__(self, nodes_dir: Path, nodes: list[str], rounds: int, t0: float) -> None:
        super().__init__(daemon=True)
        self.nodes_dir = nodes_dir
        self.nodes = nodes
        self.rounds = rounds
        self.t0 = t0
        self.seen: dict[str, list[float]] = {n: [] for n in nodes}
        self.offsets = {n: 0 for n in nodes}
        self.cpu_marks: dict[str, tuple[float, float, int]] = {}
        self.stop_flag = threading.Event()

    def _mark(self, name: str) -> None:
        if name not in self.cpu_marks:
            cpu, count = children_cpu_s(os.getpid())
            self.cpu_marks[name] = (time.perf_counter() - self.t0, cpu, count)

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


def bench_launch(config: Config, out: Path) -> dict[str, Any]:
    n = config.topology.nodes
    rounds = config.run.rounds
    nodes = [f"n{i}" for i in range(n)]
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    watcher = Watcher(out / "nodes", nodes, rounds, t0)
    watcher.start()
    summary = launch(config, out_dir=out, show_progress=False)
    total = time.perf_counter() - t0
    watcher.stop_flag.set()
    watcher.join()
    records = read_records(out / "nodes", nodes)
    by_round = [[records[p][t]["wall_s"] for p in nodes] for t in range(rounds)]
    steady = by_round[1:] or by_round
    marks = watcher.cpu_marks
    first = marks["first_record"][0]
    r0 = marks["all_round0"][0]
    last = marks["all_last"][0]
    steady_rounds = max(1, rounds - 1)
    cpu_steady = marks["all_last"][1] - marks["all_round0"][1]
    return {
        "nodes": n,
        "rounds": rounds,
        "total_s": total,
        "startup_s": first,
        "all_round0_done_s": r0,
        "last_round_done_s": last,
        "merge_s": total - last,
        "round_s_steady": (last - r0) / steady_rounds,
        "round_s_records_slowest_median": statistics.median(max(r) for r in steady),
        "round_s_records_median": statistics.median(x for r in steady for x in r),
        "round0_s_records_max": max(by_round[0]),
        "peer_cpu_s_startup": marks["all_round0"][1],
        "peer_cpu_s_per_round": cpu_steady / steady_rounds,
        "peer_processes_seen": marks["all_round0"][2],
        "cores_busy_in_rounds": cpu_steady / max(1e-9, last - r0),
        "wall_s_records": by_round,
        "summary_wall_seconds": summary["wall_seconds"],
        "bytes_per_node_per_round": summary["traffic"]["bytes_per_node_per_round"],
        "final_accuracy": summary["final"].get("avg_model_accuracy"),
    }


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
    """``fedcore node`` with cProfile on during rounds 1.. only (the profiled peer)."""
    import cProfile

    from fedcore import cli
    from fedcore.node import Node

    out_path = argv[0]
    profiler = cProfile.Profile()
    original = Node.run_round
    spent = {"wall_s": 0.0, "process_cpu_s": 0.0, "main_thread_cpu_s": 0.0, "rounds": 0}

    async def profiled_round(self: Node) -> Any:
        if self.round == 0:  # round 0 waits for the peers still starting: not profiled
            return await original(self)
        c0, m0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        profiler.enable()
        try:
            return await original(self)
        finally:
            profiler.disable()
            spent["wall_s"] += time.perf_counter() - w0
            spent["process_cpu_s"] += time.process_time() - c0
            spent["main_thread_cpu_s"] += time.thread_time() - m0
            spent["rounds"] += 1

    Node.run_round = profiled_round  # type: ignore[method-assign]
    status = cli.main(["node", *argv[1:]])
    profiler.dump_stats(out_path)
    Path(out_path + ".json").write_text(json.dumps(spent))
    return status


CATEGORIES: list[tuple[str, str, str]] = [
    # (label, file suffix, function): cumulative time of the function
    ("compute: forward + backward (Objective.loss_and_grad)", "fedcore/models.py",
     "loss_and_grad"),
    ("encode: RawCodec.encode (tensor -> bytes copy)", "fedcore/compression/base.py", "encode"),
    ("send: GrpcTransport.send (call set-up, awaiting)", "fedcore/transport/grpc/transport.py",
     "send"),
    ("send: gRPC request writer (message_to_chunks, serialize, write)", "grpc/aio/_call.py",
     "_consume_request_iterator"),
    ("receive: Push servicer (read, deserialize, assemble, validate)",
     "fedcore/transport/grpc/transport.py", "Push"),
    ("  of which Node.validate (decode + finite check)", "fedcore/node.py", "validate"),
    ("decode in collect: Node._decode (all calls, validate's included)", "fedcore/node.py",
     "_decode"),
    ("mix: algorithm mix (gossip average)", "fedcore/algorithms/dpsgd.py", "mix"),
    ("step: algorithm step (x - lr * g)", "fedcore/algorithms/dpsgd.py", "step"),
    ("record + snapshot (_PeerLog)", "fedcore/runners/peer.py", "__call__"),
    ("idle: event loop waiting (epoll)", "~", "<method 'poll' of 'select.epoll' objects>"),
]


def split_profile(path: Path, rounds: int) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    rows = []
    for label, suffix, func in CATEGORIES:
        ct = 0.0
        for (file, _line, name), (_cc, _nc, tt, cum, _callers) in raw.items():
            if name != func:
                continue
            if suffix == "~" and file == "~":
                ct += tt
            elif suffix != "~" and file.replace("\\", "/").endswith(suffix):
                ct += cum
        rows.append({"what": label, "s": ct, "share": ct / total if total else 0.0,
                     "ms_per_round": 1e3 * ct / rounds})
    return {"profiled_wall_s": total, "rows": rows}


def top_functions(path: Path, n: int) -> str:
    import io

    buf = io.StringIO()
    stats = pstats.Stats(str(path), stream=buf)
    stats.sort_stats("tottime").print_stats(n)
    text = buf.getvalue()
    start = text.find("   ncalls")
    return text[start:] if start >= 0 else text


def profile_run(config: Config, out: Path) -> dict[str, Any]:
    """Start every peer by hand, n0 under cProfile (around Node.run)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    n = config.topology.nodes
    nodes = [f"n{i}" for i in range(n)]
    config_path = out / "config.toml"
    config_path.write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
    roster = {p: f"127.0.0.1:{port}" for p, port in zip(nodes, free_ports(n), strict=True)}
    roster_path = out / "roster.json"
    roster_path.write_text(json.dumps(roster), encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH")) if p)
    prof_path = out / "n0.pstats"
    procs = []
    t0 = time.perf_counter()
    try:
        for p in nodes:
            common = ["--config", str(config_path), "--id", p, "--roster", str(roster_path),
                      "--out", str(out / "nodes" / p), "--threads", "1"]
            if p == "n0":
                argv = [sys.executable, str(Path(__file__).resolve()), "--role", "peer",
                        str(prof_path), *common]
            else:
                argv = [sys.executable, "-m", "fedcore", "node", *common]
            (out / "nodes" / p).mkdir(parents=True, exist_ok=True)
            log = open(out / "nodes" / p / "node.log", "wb")  # noqa: SIM115
            procs.append((p, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                              env=env), log))
        for p, proc, log in procs:
            status = proc.wait(timeout=600)
            log.close()
            if status != 0:
                raise RuntimeError(f"profiled run: peer {p} exited {status}; see "
                                   f"{out / 'nodes' / p / 'node.log'}")
    finally:
        for _, proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    wall = time.perf_counter() - t0
    spent = json.loads((Path(str(prof_path) + ".json")).read_text())
    rounds = spent["rounds"]
    split = split_profile(prof_path, rounds)
    records = read_records(out / "nodes", ["n0"])["n0"]
    return {
        "nodes": n,
        "rounds": rounds,
        "total_s": wall,
        "n0_run": spent,
        "n0_round_wall_s": [r["wall_s"] for r in records],
        "split": split,
        "top": top_functions(prof_path, 25),
    }


# --------------------------------------------------------------------------- main


def machine_info() -> dict[str, Any]:
    cpu_model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "loadavg_start": list(os.getloadavg()),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "|  N | rounds | start-up s | launch round s (steady) | slowest peer wall_s, median "
        "| peers' CPU s / round | simulate round s | launch / simulate | launch total s |",
        "|---:|-------:|-----------:|------------------------:|---------------------------:"
        "|---------------------:|-----------------:|------------------:|---------------:|",
    ]
    for r in rows:
        la, si = r["launch"], r["simulate"]
        lines.append(
            f"| {la['nodes']:>2} | {la['rounds']:>6} | {la['startup_s']:10.1f} "
            f"| {la['round_s_steady']:23.3f} | {la['round_s_records_slowest_median']:26.3f} "
            f"| {la['peer_cpu_s_per_round']:20.2f} | {si['round_s']:16.3f} "
            f"| {la['round_s_steady'] / si['round_s']:17.2f} | {la['total_s']:14.1f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=HIDDEN_1M)
    parser.add_argument("--algorithm", default="dpsgd")
    parser.add_argument("--topology", default="ring")
    parser.add_argument("--profile-nodes", type=int, default=16,
                        help="N of the hand-started run with n0 under cProfile (0: skip)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:2] == ["--role", "peer"]:
        return peer_main(raw[2:])
    args = parse_args(argv)
    torch.set_num_threads(1)
    began = time.perf_counter()
    info = machine_info()
    runs = args.out.parent / "launch-runs"
    rows = []
    for n in args.peers:
        config = make_config(n, args.rounds, args.hidden, args.algorithm, args.topology)
        la = bench_launch(config, runs / f"launch-{n}")
        print(f"launch   N={n:>2}: start-up {la['startup_s']:.1f} s, round "
              f"{la['round_s_steady']:.3f} s (steady), total {la['total_s']:.1f} s, peers' CPU "
              f"{la['peer_cpu_s_per_round']:.2f} s/round", flush=True)
        si = bench_simulate(config, runs / f"simulate-{n}")
        print(f"simulate N={n:>2}: round {si['round_s']:.3f} s, build {si['build_s']:.1f} s",
              flush=True)
        rows.append({"launch": la, "simulate": si})
    profile = None
    if args.profile_nodes:
        config = make_config(args.profile_nodes, args.rounds, args.hidden, args.algorithm,
                             args.topology)
        profile = profile_run(config, runs / f"profile-{args.profile_nodes}")
    wall = time.perf_counter() - began
    info["loadavg_end"] = list(os.getloadavg())

    from fedcore.models import build_model

    params = sum(
        p.numel()
        for p in build_model("mlp", input_dim=64, num_classes=10, seed=0,
                             hidden=args.hidden).parameters()
    )
    print()
    print(f"dpsgd on a {args.topology}, mlp hidden={args.hidden} ({params:,} parameters, "
          f"{4 * params / 1e6:.1f} MB a message), {args.rounds} rounds, 1 torch thread a peer")
    print(format_table(rows))
    if profile is not None:
        spent = profile["n0_run"]
        print(f"\nN={profile['nodes']}, n0 under cProfile (rounds 1..R-1): "
              f"{spent['wall_s']:.1f} s wall for {spent['rounds']} rounds, process CPU "
              f"{spent['process_cpu_s']:.1f} s (main thread {spent['main_thread_cpu_s']:.1f} s)")
        print("| where (n0's main thread, cumulative) | ms / round | share |")
        print("|---|---:|---:|")
        for r in profile["split"]["rows"]:
            print(f"| {r['what']} | {r['ms_per_round']:.0f} | {100 * r['share']:.0f}% |")
        print("\n" + "\n".join(profile["top"].splitlines()[:20]))
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
        },
        "machine": info,
        "results": rows,
        "profile": profile,
        "wall_s": wall,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
