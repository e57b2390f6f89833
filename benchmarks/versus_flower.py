"""fedcore against Flower's simulation engine, on the same FedAvg workloads.

The comparison a user makes: the same federated run written for each library, each side
started as its own process (so imports and start-up are what a user waits for), timed
from the outside.

Workloads (FedAvg, plain SGD on the workers, batch 32, lr 0.05, IID split, seed 0):

* ``fedavg-100`` / ``fedavg-1000``: 100 / 1,000 clients, 10% sampled each round, 5 local
  steps, fedcore's default ``mlp`` (64 hidden units) on MNIST-1D (8,000 training
  examples, generated offline by fedcore; digits' 1,437 cannot give 1,000 clients two
  examples each);
* ``flat1m-8`` / ``flat1m-16``: 8 / 16 clients, all of them every round, 1 local step, an
  MLP of 999,985 parameters (``model.hidden = 13333``) on scikit-learn's digits.

fedcore runs ``fedcore simulate examples/fedavg.toml --set ...`` (the CLI's own ``main``,
in a child process) with the engine ``auto`` picks, and again with the other engine.
Flower runs ``benchmarks/versus_flower_flwr.py`` in a second interpreter that has
``flwr[simulation]`` (``--flower-python``); it gets the data exactly as fedcore split it.
This script installs nothing; without that interpreter it says how to make it and exits 2.

Measured per run: the time from launching the process to the end of round 1
(*start-up*), and the median time of rounds 2.. (*per round*, steady state). Repeats are
interleaved (fedcore, Flower, fedcore, Flower, ...); the table shows medians over repeats
and the ratios Flower / fedcore (above 1: fedcore faster). The JSON keeps every time, the
load average before and after each run, and the machine.

Usage::

    python benchmarks/versus_flower.py --flower-python /path/to/flower-venv/bin/python
        [--quick] [--workloads fedavg-100 ...] [--repeats K] [--out FILE.json]
    python benchmarks/versus_flower.py --only fedcore ...        # fedcore alone
    python benchmarks/versus_flower.py --profile fedavg-100 --engine messages
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FLOWER_SIDE = Path(__file__).resolve().parent / "versus_flower_flwr.py"
EXAMPLE = ROOT / "examples" / "fedavg.toml"

VENV_HINT = (
    "python3 -m venv /work/flower-venv && "
    "/work/flower-venv/bin/pip install 'flwr[simulation]' torch==2.13.0"
)
FLOWER_CHECK = "import flwr, flwr.simulation, flwr.serverapp, ray, torch, numpy"


@dataclass(frozen=True)
class Workload:
    """One FedAvg run, as both libraries are given it."""

    name: str
    clients: int
    fraction: float
    local_steps: int
    dataset: str
    hidden: int
    rounds: int
    quick_rounds: int
    batch_size: int = 32
    lr: float = 0.05
    seed: int = 0

    def overrides(self, rounds: int) -> list[str]:
        """The ``--set`` items that make ``examples/fedavg.toml`` this workload."""
        return [
            f"topology.nodes={self.clients}",
            f"algorithm.fraction={self.fraction}",
            f"algorithm.lr={self.lr}",
            f"run.local_steps={self.local_steps}",
            f"run.rounds={rounds}",
            f"run.eval_every={rounds}",  # evaluated once, after the last timed round
            f"run.seed={self.seed}",
            f"data.dataset={self.dataset}",
            "data.partition=iid",
            f"data.batch_size={self.batch_size}",
            "model.name=mlp",
            f"model.hidden={self.hidden}",
        ]


WORKLOADS = {
    w.name: w
    for w in (
        Workload("fedavg-100", 100, 0.1, 5, "mnist1d", 64, rounds=30, quick_rounds=6),
        Workload("fedavg-1000", 1000, 0.1, 5, "mnist1d", 64, rounds=20, quick_rounds=5),
        Workload("flat1m-8", 8, 1.0, 1, "digits", 13333, rounds=10, quick_rounds=4),
        Workload("flat1m-16", 16, 1.0, 1, "digits", 13333, rounds=10, quick_rounds=4),
    )
}


# ---------------------------------------------------------------------------------------
# The fedcore child: `fedcore simulate`, with the end of each round noted.


def _fedcore_child(spec: dict[str, Any]) -> None:
    """Run ``fedcore simulate`` in this process (the CLI's ``main``), noting
    ``time.time()`` at the end of every round, and write them to ``spec["result"]``.

    The message engine's rounds end when the observer accounts a round every node has
    reported (``RunObserver.end_round``); the vectorized engine's when ``run_round``
    returns (its observer accounts rounds in batches). Neither hook changes what runs.
    """
    sys.path.insert(0, str(ROOT))
    import importlib

    from fedcore.cli import main

    sim = importlib.import_module("fedcore.simulation.simulate")  # the package names a function so
    vec = importlib.import_module("fedcore.engines.vectorized")

    ends: dict[str, list[float]] = {"messages": [], "vectorized": []}
    end_round = sim.RunObserver.end_round
    run_round = vec.VectorizedNetwork.run_round

    def timed_end_round(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = end_round(self, *args, **kwargs)
        ends["messages"].append(time.time())
        return out

    def timed_run_round(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = run_round(self, *args, **kwargs)
        ends["vectorized"].append(time.time())
        return out

    sim.RunObserver.end_round = timed_end_round  # type: ignore[method-assign]
    vec.VectorizedNetwork.run_round = timed_run_round  # type: ignore[method-assign]
    out_dir = Path(spec["out_dir"])
    argv = ["simulate", str(EXAMPLE), "--quiet", "--force", "--out", str(out_dir)]
    argv += ["--engine", spec["engine"], "--threads", str(spec.get("threads", "auto"))]
    for item in spec["overrides"]:
        argv += ["--set", item]

    def run() -> None:
        code = main(argv)
        if code != 0:
            raise SystemExit(code)

    if spec.get("profile"):
        import cProfile

        cProfile.runctx("run()", globals(), {"run": run}, spec["profile"])
    else:
        run()
    summary = json.loads((out_dir / "summary.json").read_text(encoding="utf-8"))
    engine = summary.get("engine", "messages")
    result = {
        "engine": engine,
        "threads": summary.get("threads"),
        "stamps": ends[engine],
        "wall_seconds": summary["wall_seconds"],
    }
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")


# ---------------------------------------------------------------------------------------
# The parent: data for Flower, interleaved runs, the table.


def _export_data(work: Workload, path: Path) -> dict[str, Any]:
    """Write the workload's data, split exactly as fedcore splits it, for the Flower side;
    return what the Flower side needs to build the same model."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from fedcore.config import load_config
    from fedcore.setup.prepare import prepare_run

    setup = prepare_run(load_config(EXAMPLE, work.overrides(1)))
    server = getattr(setup.algorithm, "server", None)
    parts = [p for nid, p in zip(setup.graph.nodes, setup.parts, strict=True) if nid != server]
    if len(parts) != work.clients:
        raise RuntimeError(f"{work.name}: fedcore made {len(parts)} parts, not {work.clients}")
    offsets = np.cumsum([0] + [len(p) for p in parts])
    np.savez(
        path,
        x_train=setup.dataset.x_train.numpy(),
        y_train=setup.dataset.y_train.numpy(),
        part_index=np.concatenate(parts).astype(np.int64),
        part_offsets=offsets.astype(np.int64),
    )
    return {
        "input_dim": int(setup.dataset.input_dim),
        "classes": int(setup.dataset.num_classes),
        "parameters": int(setup.start.numel()),
    }


def _loadavg() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _launch(cmd: list[str], result: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd`` as its own process group; return its timings (``time.time()`` based:
    ``launched`` is taken just before the process is made)."""
    load_before = _loadavg()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s", "output": output[-3000:]}
    finally:
        # What the run left behind (Ray's workers), by the process group this run made.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or not result.is_file():
        return {"error": f"exit status {proc.returncode}", "output": output[-3000:]}
    data = json.loads(result.read_text(encoding="utf-8"))
    stamps = [float(s) for s in data.pop("stamps")]
    rounds = [b - a for a, b in itertools.pairwise(stamps)]
    # Steady state: rounds 2 .. R-1 (round 1 starts the workers; the message engine's
    # last round has no broadcast after it), or what there is of them.
    steady = rounds[:-1] if len(rounds) >= 2 else rounds
    return {
        **data,
        "launched": launched,
        "process_seconds": ended - launched,
        "startup_to_round1": stamps[0] - launched if stamps else None,
        "round_seconds": rounds,
        "per_round": statistics.median(steady) if steady else None,
        "rounds_timed": len(stamps),
        "cpu_seconds_reaped": (after.ru_utime + after.ru_stime) - (usage.ru_utime + usage.ru_stime),
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "output_tail": output[-2000:],
    }


def _fedcore_run(
    work: Workload,
    rounds: int,
    engine: str,
    tmp: Path,
    tag: str,
    env: dict[str, str],
    threads: str,
) -> dict[str, Any]:
    result = tmp / f"fedcore-{tag}.json"
    result.unlink(missing_ok=True)
    spec = {
        "engine": engine,
        "threads": threads,
        "overrides": work.overrides(rounds),
        "out_dir": str(tmp / f"run-{tag}"),
        "result": str(result),
    }
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    return _launch(cmd, result, timeout=900, env=env)


def _flower_run(
    work: Workload, rounds: int, python: str, data: dict[str, Any], tmp: Path, tag: str
) -> dict[str, Any]:
    result = tmp / f"flower-{tag}.json"
    result.unlink(missing_ok=True)
    spec = {
        **data,
        "clients": work.clients,
        "fraction": work.fraction,
        "local_steps": work.local_steps,
        "hidden": work.hidden,
        "batch_size": work.batch_size,
        "lr": work.lr,
        "seed": work.seed,
        "rounds": rounds,
        "threads": 1,
        "client_cpus": 1,
    }
    spec_path = tmp / f"flower-{tag}-spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    cmd = [python, str(FLOWER_SIDE), "--spec", str(spec_path), "--result", str(result)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # Flower's own venv
    return _launch(cmd, result, timeout=900, env=env)


def _flower_missing(python: str | None) -> str | None:
    """Why Flower cannot run (one line), or None."""
    if python is None:
        return "no --flower-python given"
    try:
        proc = subprocess.run(
            [python, "-c", FLOWER_CHECK], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot be run ({exc})"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["it failed"])[-1]
        return f"{python} cannot import flwr[simulation] ({last})"
    return None


def _median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    return {
        "per_round": _median([r["per_round"] for r in ok]),
        "per_round_min": min((r["per_round"] for r in ok if r["per_round"]), default=None),
        "startup_to_round1": _median([r["startup_to_round1"] for r in ok]),
        "threads": sorted({r["threads"] for r in ok if r.get("threads")}),
        "failed": len(runs) - len(ok),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    return f"{x:.3f}{unit}" if x < 10 else f"{x:.1f}{unit}"


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| workload | params | side | per round (s) | start-up to round 1 (s) "
        "| Flower/this per round | Flower/this start-up |"
    )
    lines = [head, "|---|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        flower = row["sides"].get("flower")
        for side, s in row["sides"].items():
            ratio_round = _ratio(flower["per_round"], s["per_round"]) if flower else None
            ratio_start = (
                _ratio(flower["startup_to_round1"], s["startup_to_round1"]) if flower else None
            )
            shown = side if side != "fedcore-auto" else f"fedcore auto ({row['auto_engine']})"
            if s.get("threads"):
                shown += f", {'/'.join(map(str, s['threads']))} thread(s)"
            if side == "flower":
                ratio_round = ratio_start = None
            lines.append(
                f"| {row['workload']} | {row['parameters']:,} | {shown} | {_fmt(s['per_round'])} "
                f"| {_fmt(s['startup_to_round1'])} | {_fmt(ratio_round, 'x')} "
                f"| {_fmt(ratio_start, 'x')} |"
            )
    return "\n".join(lines)


def _profile(work: Workload, rounds: int, engine: str) -> None:
    """cProfile of the fedcore child (the whole process: start-up and rounds)."""
    import pstats

    with tempfile.TemporaryDirectory(prefix="versus-flower-") as tmp_name:
        tmp = Path(tmp_name)
        spec = {
            "engine": engine,
            "overrides": work.overrides(rounds),
            "out_dir": str(tmp / "run"),
            "result": str(tmp / "result.json"),
            "profile": str(tmp / "profile.out"),
        }
        _fedcore_child(spec)
        print(json.loads((tmp / "result.json").read_text(encoding="utf-8")))
        stats = pstats.Stats(str(tmp / "profile.out"))
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(40)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flower-python", help="an interpreter with flwr[simulation]")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=None)
    parser.add_argument("--quick", action="store_true", help="a few rounds, one repeat")
    parser.add_argument("--rounds", type=int, help="rounds per run (default: per workload)")
    parser.add_argument("--repeats", type=int, help="interleaved repeats (default 3, quick 1)")
    parser.add_argument("--only", choices=["fedcore"], help="run fedcore alone (no Flower)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/versus_flower.json")
    parser.add_argument("--profile", choices=list(WORKLOADS), help="cProfile fedcore's side")
    parser.add_argument("--engine", default="auto", help="with --profile: the engine")
    parser.add_argument(
        "--fedcore-threads",
        default="auto",
        help="fedcore simulate --threads: N or auto (default auto, fedcore's own default)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _fedcore_child(json.loads(args.child))
        return 0
    if args.profile:
        work = WORKLOADS[args.profile]
        _profile(work, args.rounds or work.quick_rounds, args.engine)
        return 0
    with_flower = args.only != "fedcore"
    if with_flower:
        why = _flower_missing(args.flower_python)
        if why is not None:
            print(
                f"versus_flower: Flower is needed and {why}; make its venv with "
                f"`{VENV_HINT}` and pass --flower-python /work/flower-venv/bin/python "
                "(or --only fedcore).",
                file=sys.stderr,
            )
            return 2
    names = args.workloads or list(WORKLOADS)
    repeats = args.repeats or (1 if args.quick else 3)
    threads = args.fedcore_threads
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    report: dict[str, Any] = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "loadavg_start": _loadavg(),
        },
        "settings": {
            "repeats": repeats,
            "quick": args.quick,
            "flower_python": args.flower_python,
            "fedcore_threads": threads,
        },
        "workloads": [],
    }
    with tempfile.TemporaryDirectory(prefix="versus-flower-") as tmp_name:
        tmp = Path(tmp_name)
        for name in names:
            work = WORKLOADS[name]
            rounds = args.rounds or (work.quick_rounds if args.quick else work.rounds)
            data_path = tmp / f"{name}.npz"
            data = {"data": str(data_path), **_export_data(work, data_path)}
            runs: dict[str, list[dict[str, Any]]] = {"fedcore-auto": []}
            other: str | None = None
            for rep in range(repeats):
                tag = f"{name}-{rep}"
                print(f"{name}: repeat {rep + 1}/{repeats}", file=sys.stderr, flush=True)
                auto = _fedcore_run(work, rounds, "auto", tmp, f"{tag}-auto", env, threads)
                runs["fedcore-auto"].append(auto)
                if with_flower:
                    flower = _flower_run(work, rounds, args.flower_python, data, tmp, tag)
                    runs.setdefault("flower", []).append(flower)
                if other is None and "engine" in auto:
                    other = "messages" if auto["engine"] == "vectorized" else "vectorized"
                if other is not None:
                    side = f"fedcore-{other}"
                    runs.setdefault(side, []).append(
                        _fedcore_run(work, rounds, other, tmp, f"{tag}-{other}", env, threads)
                    )
            for side, side_runs in runs.items():
                for r in side_runs:
                    if "error" in r:
                        print(f"{name} {side}: {r['error']}\n{r['output']}", file=sys.stderr)
            engines = {r.get("engine") for r in runs["fedcore-auto"] if "engine" in r}
            row = {
                "workload": name,
                "spec": asdict(work),
                "rounds": rounds,
                "parameters": data["parameters"],
                "auto_engine": "/".join(sorted(e for e in engines if e)) or "?",
                "sides": {side: _summarize(rs) for side, rs in runs.items()},
                "runs": runs,
            }
            report["workloads"].append(row)
    report["machine"]["loadavg_end"] = _loadavg()
    print(_table(report["workloads"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
