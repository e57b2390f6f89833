# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""A whole ``fedcore simulate`` run, phase by phase, against its round loop.

Runs a config as a user does (``examples/dog-10k.toml`` by default: 10,000 peers, DOG,
online logreg, ``run.regret = true``) through :func:`fedcore.simulation.simulate.simulate`,
the function ``fedcore simulate`` calls (progress off), and times each phase by wrapping
the functions that do it, without changing what they do:

* **set-up**: ``prepare_run`` (topology, weights, data, models, fingerprint) and the
  engine's build (``VectorizedNetwork``);
* **rounds**: the round loop (``run_vectorized``, or the message engine's
  ``_run_messages``), less the evaluations and the regret work done inside it;
* **evaluations**: every evaluation of all the models (``evaluate_stacked``, or
  ``evaluate_models`` on the message engine), with its count;
* **regret**: the regret curve, wherever it is computed (``RegretTracker.update`` during
  the run where the checkout has it, and ``add_regret`` at the end);
* **writing**: ``summary.json`` and ``curves.png`` (``write_results``);
* **other**: the rest of the wall time (run folder, summary, metrics lines).

It reports the ratio of the whole run's wall time to the round loop alone (the target of
issue 25 is at most 3 for dog-10k). Each repeat runs in a fresh subprocess, one after the
other; the table gives the median of each phase.

Usage::

    python benchmarks/end_to_end.py [--config examples/dog-10k.toml] [--nodes N]
        [--rounds R] [--repeats K] [--engine auto] [--out benchmarks/results/end_to_end.json]
    python benchmarks/end_to_end.py --nodes 1000      # a quick check (seconds)

``--nodes`` and ``--rounds`` override ``topology.nodes`` and ``run.rounds`` (``--set``
style); ``PYTHONPATH=<another checkout>`` measures that checkout with this script.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

PHASES = ("setup", "rounds", "evaluations", "regret", "writing", "other")


class _Clock:
    """Seconds spent in wrapped functions, by phase (a call inside another wrapped call
    of a different phase is taken out of the outer one)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(PHASES, 0)
        self._stack: list[list[float]] = []  # per open call: [start, inner seconds]

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed into ``phase`` (a coroutine function: while it is awaited)."""

        def done() -> None:
            start, inner = self._stack.pop()
            spent = time.perf_counter() - start
            self.seconds[phase] += spent - inner
            self.calls[phase] += 1
            if self._stack:
                self._stack[-1][1] += spent

        if inspect.iscoroutinefunction(fn):

            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                self._stack.append([time.perf_counter(), 0.0])
                try:
                    return await fn(*args, **kwargs)
                finally:
                    done()

            return timed_async

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                done()

        return timed


@contextlib.contextmanager
def _patched(clock: _Clock) -> Iterator[None]:
    """Wrap the functions of each phase where the checkout looks them up."""

    # Each function where the checkout looks it up: an older layout's (fedcore/runners/,
    # tried first: an editable install of this one also answers its new names), or this.
    def module(*names: str) -> Any:
        for name in names:
            with contextlib.suppress(ModuleNotFoundError):
                return importlib.import_module(name)
        raise ModuleNotFoundError(names[0])

    sim = module("fedcore.runners.simulate", "fedcore.simulation.simulate")
    results = module("fedcore.runners.simulate", "fedcore.simulation.results")
    observer = module(
        "fedcore.runners.simulate", "fedcore.simulation.observer", "fedcore.simulation.results"
    )
    drivers = module(
        "fedcore.runners.simulate", "fedcore.simulation.drivers", "fedcore.simulation.simulate"
    )
    vectorized = module("fedcore.runners.vectorized", "fedcore.engines.vectorized")
    build = "build_engine" if hasattr(sim, "build_engine") else "_build"
    targets: list[tuple[Any, str, str]] = [
        (sim, "prepare_run", "setup"),
        (sim, build, "setup"),
        (drivers, "run_vectorized", "rounds"),
        (drivers, "_run_messages", "rounds"),  # the message engine's loop (a coroutine)
        (vectorized, "evaluate_stacked", "evaluations"),
        (observer, "evaluate_models", "evaluations"),
        (results, "add_regret", "regret"),
        (results, "write_results", "writing"),
    ]
    regret = module("fedcore.runners.regret", "fedcore.simulation.regret")
    if hasattr(regret, "RegretTracker"):  # the curve computed during the run
        targets.append((regret.RegretTracker, "update", "regret"))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    try:
        for owner, name, phase in targets:
            setattr(owner, name, clock.wrap(phase, getattr(owner, name)))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def run_once(config_path: str, overrides: list[str], engine: str) -> dict[str, Any]:
    """One run in this process: its phases, wall time and what ran."""
    import torch

    from fedcore.config import load_config

    try:  # a checkout of the earlier layout (fedcore/runners/), or this one
        from fedcore.runners.simulate import simulate  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        from fedcore.simulation.simulate import simulate

    torch.set_num_threads(1)  # fedcore simulate's default (--threads 1)
    config = load_config(config_path, [*overrides, f"simulate.engine={engine}"])
    clock = _Clock()
    with tempfile.TemporaryDirectory() as out, _patched(clock):
        began = time.perf_counter()
        summary = simulate(config, out_dir=out, show_progress=False, overrides=overrides)
        wall = time.perf_counter() - began
    seconds = dict(clock.seconds)
    seconds["other"] = wall - sum(seconds.values())
    return {
        "wall_s": wall,
        "seconds": seconds,
        "evaluations": clock.calls["evaluations"],
        "engine": summary.get("engine"),
        "nodes": summary.get("nodes"),
        "rounds": config.run.rounds,
        "ratio_whole_to_rounds": wall / seconds["rounds"] if seconds["rounds"] else None,
        "final_static_regret": summary.get("final", {}).get("static_regret"),
        "final_mean_node_accuracy": summary.get("final", {}).get("mean_node_accuracy"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(_ROOT / "examples" / "dog-10k.toml"))
    parser.add_argument("--nodes", type=int, help="topology.nodes (default: the config's)")
    parser.add_argument("--rounds", type=int, help="run.rounds (default: the config's)")
    parser.add_argument("--engine", default="auto", choices=("auto", "vectorized", "messages"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=str(_ROOT / "benchmarks" / "results" / "end_to_end.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides: list[str] = []
    if args.nodes is not None:
        overrides.append(f"topology.nodes={args.nodes}")
    if args.rounds is not None:
        overrides.append(f"run.rounds={args.rounds}")
    if args.child:
        print(json.dumps(run_once(args.config, overrides, args.engine)))
        return
    runs = []
    for k in range(args.repeats):
        command = [sys.executable, __file__, "--child", "--config", args.config]
        command += ["--engine", args.engine]
        if args.nodes is not None:
            command += ["--nodes", str(args.nodes)]
        if args.rounds is not None:
            command += ["--rounds", str(args.rounds)]
        done = subprocess.run(command, capture_output=True, text=True, env=os.environ)
        if done.returncode:
            sys.exit(f"the run failed:\n{done.stderr}")
        run = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append(run)
        ratio = run["ratio_whole_to_rounds"]
        print(
            f"repeat {k + 1}: wall {run['wall_s']:.1f} s, rounds {run['seconds']['rounds']:.1f} s,"
            f" ratio {'-' if ratio is None else f'{ratio:.2f}'}",
            flush=True,
        )
    median = {p: statistics.median(r["seconds"][p] for r in runs) for p in PHASES}
    wall = statistics.median(r["wall_s"] for r in runs)
    first = runs[0]
    print()
    print(
        f"{Path(args.config).name}: {first['nodes']} nodes, {first['rounds']} rounds, "
        f"engine {first['engine']}, {first['evaluations']} evaluations, "
        f"{len(runs)} repeat(s), medians"
    )
    print(f"| {'phase':<12} | {'seconds':>8} | {'share':>6} |")
    print(f"|{'-' * 14}|{'-' * 10}:|{'-' * 7}:|")
    for phase in PHASES:
        print(f"| {phase:<12} | {median[phase]:8.2f} | {median[phase] / wall:6.1%} |")
    print(f"| {'whole run':<12} | {wall:8.2f} | {1:6.1%} |")
    ratio = wall / median["rounds"] if median["rounds"] else float("nan")
    print(f"whole run / round loop: {ratio:.2f} (target: at most 3)")
    report = {
        "benchmark": "end_to_end",
        "config": args.config,
        "overrides": overrides,
        "engine": args.engine,
        "machine": _common.machine_info(loadavg_end=list(os.getloadavg())),
        "median_seconds": median,
        "median_wall_s": wall,
        "ratio_whole_to_rounds": ratio,
        "runs": runs,
    }
    _common.write_report(Path(args.out), report)


if __name__ == "__main__":
    main()
