# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""The node optimizer's step: its cost per node-round against plain SGD's ``lr * g``.

For every ``--dims`` d (default 4,810, the digits MLP, and 1,000,000 parameters) and
``--nodes`` N (default 1 and 64 stacked nodes: parameters ``[d]`` for N = 1, ``[N, d]``
otherwise, as the vectorized engine holds them), times one call of
``update(grad, state, params, lr)`` of each optimizer ``fedcore.algorithms.optim.
make_optimizer`` builds (sgd, momentum, nesterov, adam, adamw, lars, lamb), with the state
fed back call after call, against the plain SGD step ``lr * g`` measured in the same run.
LARS and LAMB get realistic layer segments: the digits MLP's own four parameter tensors
(``fedcore.models.mlp``: two weights, two biases) at d = 4,810, and four layers of a weight
and a 256-value bias (eight segments) at other sizes.

Repeats interleave the optimizers (the order rotates every repeat); each sample is the mean
of ``--calls`` back-to-back calls (fewer at large N x d, see ``calls_for``), and the table
gives the median sample, microseconds per node-round (the call's time / N), and the ratio
to ``lr * g``. One torch thread by default (``--threads``), as the simulator runs, and
glibc's default malloc, as ``fedcore simulate`` has it: every update allocates its outputs
and temporaries, and blocks this large come from fresh ``mmap`` pages (page faults).
``--malloc tuned`` applies ``fedcore.deploy.peer.tune_malloc`` (what a gRPC peer does)
to keep freed memory warm instead.

Usage::

    python benchmarks/optimizer_step.py [--dims 4810 1000000] [--nodes 1 64]
        [--repeats 7] [--malloc default|tuned] [--out benchmarks/results/optimizer_step.json]
    python benchmarks/optimizer_step.py --tiny --out /tmp/opt.json   # a smoke test
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Runnable as `python benchmarks/optimizer_step.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.algorithms.optim import Segment, make_optimizer
from fedcore.deploy.peer import tune_malloc
from fedcore.models import mlp

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "optimizer_step.json"
LR = 0.01

# (label, make_optimizer name, options)
OPTIMIZERS: list[tuple[str, str, dict[str, Any]]] = [
    ("sgd", "sgd", {}),
    ("sgd+wd", "sgd", {"weight_decay": 1e-4}),
    ("momentum", "momentum", {"momentum": 0.9}),
    ("nesterov", "momentum", {"momentum": 0.9, "nesterov": True}),
    ("adam", "adam", {}),
    ("adamw", "adamw", {"weight_decay": 1e-4}),
    ("lars", "lars", {"momentum": 0.9, "weight_decay": 1e-4}),
    ("lamb", "lamb", {"weight_decay": 1e-4}),
]
FLOOR = "lr * g"


def segments_for(d: int) -> list[Segment]:
    """The digits MLP's parameter tensors at its size; else four layers of weight + bias."""
    model = mlp(input_dim=64, num_classes=10, hidden=64)
    named = [(n, p.numel()) for n, p in model.named_parameters()]
    if sum(k for _, k in named) != d:
        bias = min(256, max(1, d // 16))
        sizes = [d // 4 - bias, bias] * 3
        sizes += [d - sum(sizes) - bias, bias]
        named = [(f"layer{i // 2}.{('weight', 'bias')[i % 2]}", k) for i, k in enumerate(sizes)]
    out: list[Segment] = []
    at = 0
    for name, k in named:
        out.append((name, at, k))
        at += k
    return out


def calls_for(n: int, d: int, most: int = 200) -> int:
    """Back-to-back calls per sample: about 20M values' worth, between 1 and ``most``."""
    return max(1, min(most, 20_000_000 // (n * d)))


def bench(n: int, d: int, repeats: int, seed: int, most: int = 200) -> dict[str, Any]:
    """Median seconds per call of every optimizer's update and of ``lr * g``."""
    gen = torch.Generator().manual_seed(seed)
    shape = (d,) if n == 1 else (n, d)
    params = torch.randn(shape, generator=gen)
    grad = torch.randn(shape, generator=gen) * 0.01
    segments = segments_for(d)
    steps: dict[str, Callable[[], None]] = {}

    def floor() -> None:
        LR * grad

    steps[FLOOR] = floor
    for label, name, options in OPTIMIZERS:
        opt = make_optimizer(name, segments=segments, **options)
        box = [opt.init(params)]

        def step(opt: Any = opt, box: list[Any] = box) -> None:
            _, box[0] = opt.update(grad, box[0], params, LR)

        steps[label] = step
    calls = calls_for(n, d, most)
    for warm in steps.values():  # warm-up: first calls, first allocations of each size
        warm()
        warm()
    times: dict[str, list[float]] = {label: [] for label in steps}
    labels = list(steps)
    for r in range(repeats):
        gc.collect()
        shift = r % len(labels)
        for label in labels[shift:] + labels[:shift]:
            timed = steps[label]
            t0 = time.perf_counter()
            for _ in range(calls):
                timed()
            times[label].append((time.perf_counter() - t0) / calls)
    floor_s = statistics.median(times[FLOOR])
    rows = []
    for label in labels:
        s = statistics.median(times[label])
        rows.append(
            {
                "optimizer": label,
                "seconds_per_call": s,
                "us_per_node_round": 1e6 * s / n,
                "ratio_to_lr_g": s / floor_s,
                "samples": times[label],
            }
        )
    return {
        "nodes": n,
        "dim": d,
        "segments": len(segments),
        "calls_per_sample": calls,
        "rows": rows,
    }


def table(result: dict[str, Any]) -> str:
    """One markdown table of one (N, d)."""
    lines = [
        f"N = {result['nodes']}, d = {result['dim']:,} ({result['segments']} segments for "
        f"lars/lamb), {result['calls_per_sample']} calls per sample",
        "",
        "| update | µs per call | µs per node-round | x `lr * g` |",
        "|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['optimizer']} | {1e6 * row['seconds_per_call']:.1f} | "
            f"{row['us_per_node_round']:.2f} | {row['ratio_to_lr_g']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dims", type=int, nargs="+", default=[4810, 1_000_000])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--malloc",
        choices=["default", "tuned"],
        default="default",
        help="glibc malloc as `fedcore simulate` runs it (default) or as a gRPC peer tunes it",
    )
    parser.add_argument("--max-calls", type=int, default=200, help="calls per sample, at most")
    parser.add_argument(
        "--tiny", action="store_true", help="d 4810, N 1 and 4, 3 repeats of 10 calls"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.tiny:
        args.dims, args.nodes, args.repeats, args.max_calls = [4810], [1, 4], 3, 10
    torch.set_num_threads(args.threads)
    tuned = tune_malloc() if args.malloc == "tuned" else False
    report: dict[str, Any] = {
        "machine": _common.machine_info(threads=args.threads, malloc_tuned=tuned),
        "lr": LR,
        "optimizers": {label: [name, options] for label, name, options in OPTIMIZERS},
        "results": [],
    }
    with torch.no_grad():
        for d in args.dims:
            for n in args.nodes:
                result = bench(n, d, args.repeats, args.seed, args.max_calls)
                report["results"].append(result)
                print(table(result) + "\n", flush=True)
    report["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    _common.write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
