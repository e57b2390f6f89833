# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""DP-SGD's cost on the vectorized engine's gradient path, as a ratio to the plain gradient.

For ``--nodes`` N stacked peers (default 1,000) of the digits MLP (64 features, ``--hidden``
64, 10 classes: 4,810 parameters), each with a batch of ``--batch`` examples (default 32),
times one call of the gradient every engine shares
(:meth:`fedcore.gradients.RowGradient.loss_and_grad`) and of DP-SGD's private gradient
(:meth:`fedcore.privacy.dpsgd.DPSGD.loss_and_grad`: per-example clipping and the keyed
Gaussian noise), in the ``batched`` mode (the built-in MLP's) and the ``vmap`` mode
(``torch.func`` per example), plus the noise alone. Repeats interleave the variants; the
table gives each one's median time a call and its ratio to the plain gradient of its mode.

Usage::

    python benchmarks/privacy.py [--nodes 1000] [--batch 32] [--hidden 64] [--repeats 7]
        [--out benchmarks/results/privacy.json]
    python benchmarks/privacy.py --tiny --out /tmp/privacy.json   # a smoke test
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.models import Objective, mlp
from fedcore.privacy.dpsgd import DPSGD, add_keyed_noise, peer_words


def _variants(n: int, batch: int, hidden: int) -> dict[str, Callable[[], Any]]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, batch, 64, generator=gen)
    y = torch.randint(0, 10, (n, batch), generator=gen)
    peers = peer_words([f"n{i}" for i in range(n)])
    dp = DPSGD(clip=1.0, noise=1.0, seed=0)
    out: dict[str, Callable[[], Any]] = {}
    for mode in ("batched", "vmap"):
        torch.manual_seed(0)
        obj = Objective(
            mlp(input_dim=64, num_classes=10, hidden=hidden), torch.float32, gradient_mode=mode
        )
        params = obj.initial_params().repeat(n, 1)
        rows = obj.rows
        out[f"{mode}: plain gradient"] = lambda r=rows, p=params: r.loss_and_grad(p, x, y)
        out[f"{mode}: dp-sgd"] = lambda r=rows, p=params: dp.loss_and_grad(r, p, x, y, peers, 0, 0)
    zeros = torch.zeros_like(params)
    out["noise alone"] = lambda: add_keyed_noise(zeros, dp.key, peers, 0, 0, 1.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="8 nodes, 2 repeats: a smoke test")
    parser.add_argument("--out", type=Path, default=_ROOT / "benchmarks/results/privacy.json")
    args = parser.parse_args()
    if args.tiny:
        args.nodes, args.repeats = 8, 2
    torch.set_num_threads(args.threads)
    variants = _variants(args.nodes, args.batch, args.hidden)
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn()  # warm-up
    names = list(variants)
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            began = time.perf_counter()
            variants[name]()
            samples[name].append(time.perf_counter() - began)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    rows = []
    print(
        f"{args.nodes} peers x {args.batch} examples, MLP hidden {args.hidden}, "
        f"{args.threads} thread(s)"
    )
    print(f"{'variant':28} {'ms / call':>10} {'ratio':>7}")
    for name, t in medians.items():
        mode = name.split(":")[0]
        base = medians.get(f"{mode}: plain gradient", medians["batched: plain gradient"])
        rows.append({"variant": name, "seconds": t, "ratio_to_plain": t / base})
        print(f"{name:28} {1e3 * t:10.2f} {t / base:7.2f}")
    report = {
        "machine": _common.machine_info(),
        "nodes": args.nodes,
        "batch": args.batch,
        "hidden": args.hidden,
        "repeats": args.repeats,
        "rows": rows,
    }
    _common.write_report(args.out, report)


if __name__ == "__main__":
    main()
