# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Which engine is faster at which shape, and whether ``simulate.engine = "auto"`` picks it.

For a grid of algorithms, peer counts ``N`` and model sizes ``d``, the seconds of CPU per
round of the message engine (``build_network(config).run``) and of the vectorized engine
(``VectorizedNetwork.run_round``), measured in the same process, interleaved (messages,
vectorized, messages, ...), each after one untimed round on a fresh build, the minimum of
``--repeats``; builds are not timed. The models are ``mlp`` on digits with a hidden width
chosen for ``d`` (``hidden = 64`` gives ``d = 4,810``; ``hidden = 13,333`` about
1,000,000), trained with the config's defaults otherwise. The table gives both, their
ratio, the engine ``auto`` picks (:func:`fedcore.simulation.simulate.choose_engine`: the
vectorized engine wherever it can run the config) and whether that pick is the faster one
within ``--tolerance`` (default 10%: timings on a shared 2-core machine move that much).

Both engines run under ``torch.set_num_threads(1)`` (``fedcore simulate``'s default) with
freed large blocks kept (:func:`fedcore.runtime.keep_freed_memory`, as the CLI does).

Usage::

    python benchmarks/auto_engine.py [--algorithms dpsgd central] [--nodes 2 4 8 16 32]
        [--hidden 8 64 1333 13333] [--rounds 2] [--repeats 2]
        [--out benchmarks/results/auto_engine.json]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("fedcore") is None:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import torch

from fedcore.config import Config, config_from_dict
from fedcore.engines.messages import build_network
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.runtime import keep_freed_memory
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import choose_engine

CPU = torch.device("cpu")


TOPOLOGY = {"rps": "complete", "fedavg": "star", "doublesqueeze": "star", "apmsqueeze": "star"}
"""The trust graph each algorithm needs; the others run on a ring."""


def make_config(algorithm: str, n: int, hidden: int) -> Config:
    """``algorithm`` on a ring of ``n`` peers (a complete graph for ``rps``, a star of ``n``
    workers for the server family; ``central`` ignores the graph), an MLP of width
    ``hidden`` on digits split IID, no evaluation."""
    return config_from_dict(
        {
            "run": {"eval_every": 10**9},
            "topology": {"kind": TOPOLOGY.get(algorithm, "ring"), "nodes": n},
            "algorithm": {"name": algorithm},
            "model": {"name": "mlp", "hidden": hidden},
            "data": {"partition": "iid"},
        }
    )


def cpu_per_round(kind: str, config: Config, rounds: int) -> float:
    """CPU seconds per round of ``rounds`` rounds after one untimed round, fresh build."""
    if kind == "messages":
        net = build_network(config)
        net.run(1)
        gc.collect()
        began = time.process_time()
        net.run(1 + rounds)
        return (time.process_time() - began) / rounds
    vec = VectorizedNetwork(prepare_run(config), device=CPU)
    vec.run_round()
    gc.collect()
    began = time.process_time()
    for _ in range(rounds):
        vec.run_round()
    return (time.process_time() - began) / rounds


def bench(
    algorithm: str, n: int, hidden: int, rounds: int, repeats: int, tolerance: float
) -> dict[str, Any]:
    config = make_config(algorithm, n, hidden)
    setup = prepare_run(config)
    d = int(setup.evaluator.initial_params().numel())
    picked, why = choose_engine(setup, "auto")
    times: dict[str, list[float]] = {"messages": [], "vectorized": []}
    for _ in range(repeats):
        for kind in times:
            times[kind].append(cpu_per_round(kind, config, rounds))
    best = {kind: min(ts) for kind, ts in times.items()}
    faster = min(best, key=best.__getitem__)
    ratio = best["vectorized"] / best["messages"]
    ok = best[picked] <= (1 + tolerance) * best[faster]
    return {
        "algorithm": algorithm,
        "nodes": n,
        "hidden": hidden,
        "params": d,
        "cpu_s_per_round": best,
        "runs": times,
        "vectorized_over_messages": ratio,
        "auto": picked,
        "why": why,
        "faster": faster,
        "auto_ok": ok,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'algorithm':<9} {'N':>4} {'d':>10} {'messages ms':>12} {'vectorized ms':>14} "
        f"{'vec/msg':>8} {'auto':>11} {'ok':>3}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r["cpu_s_per_round"]
        lines.append(
            f"{r['algorithm']:<9} {r['nodes']:>4} {r['params']:>10,} "
            f"{1000 * t['messages']:>12.1f} {1000 * t['vectorized']:>14.1f} "
            f"{r['vectorized_over_messages']:>8.2f} {r['auto']:>11} "
            f"{'yes' if r['auto_ok'] else 'NO':>3}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", nargs="+", default=["dpsgd", "central"])
    p.add_argument("--nodes", nargs="+", type=int, default=[2, 4, 8, 16, 32])
    p.add_argument("--hidden", nargs="+", type=int, default=[8, 64, 1333, 13333])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/auto_engine.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    info = _common.machine_info()
    print(f"load average at start: {info['loadavg_start']}", flush=True)
    rows = []
    for algorithm in args.algorithms:
        for hidden in args.hidden:
            for n in args.nodes:
                row = bench(algorithm, n, hidden, args.rounds, args.repeats, args.tolerance)
                rows.append(row)
                t = row["cpu_s_per_round"]
                print(
                    f"{algorithm} N={n} d={row['params']:,}: messages "
                    f"{1000 * t['messages']:.1f} ms, vectorized {1000 * t['vectorized']:.1f} ms, "
                    f"auto {row['auto']}{'' if row['auto_ok'] else ' (the slower)'}",
                    flush=True,
                )
    table = format_table(rows)
    print()
    print(table)
    info["loadavg_end"] = list(__import__("os").getloadavg())
    missed = [r for r in rows if not r["auto_ok"]]
    print(
        f"\nauto picked the faster engine (within {args.tolerance:.0%}) in "
        f"{len(rows) - len(missed)} of {len(rows)} cases"
    )
    _common.write_report(
        args.out,
        {
            "benchmark": "auto engine choice: CPU per round of both engines",
            "command": " ".join(["python", "benchmarks/auto_engine.py", *(argv or sys.argv[1:])]),
            "machine": info,
            "rows": rows,
            "table": table,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
