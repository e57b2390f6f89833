# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Simulation throughput of fedcore against a plain-torch floor.

Measures node-rounds per second of an in-process D-PSGD simulation
(``fedcore.setup.prepare.build_network(config).run(rounds)``, no observer, so no
evaluation and no metrics) and of the fastest plain single-process torch loop we know how
to write for the same work (the *floor*):

* the same data: digits, fedcore's default Dirichlet partition, the same per-node
  ``BatchStream`` objects (seed ``seed * 1_000_003 + i``), so identical minibatches;
* the same model architecture and initial parameters, forward + backward per node;
* the same D-PSGD combine-then-adapt update ``x_i <- sum_j W_ji x_j - lr * g_i(x_i)``
  with the Metropolis-Hastings matrix from ``fedcore.topology.prepare``.

Floor layout: all nodes' parameters are stacked in one ``[N, d]`` tensor ``X`` and their
gradients in ``G``. Node i has its own ``nn.Module`` whose parameters are *views* into row
``X[i]`` and whose ``.grad`` are views into ``G[i]``, so the per-node work is exactly one
forward and one backward (no parameter copies in or out); the mix of all nodes is one
sparse CSR matmul ``W.T @ X`` followed by ``X -= lr * G``.

Repeats are interleaved (fedcore, floor, fedcore, floor, ...) and medians reported.
Both run with ``torch.set_num_threads(1)``.

Usage::

    python benchmarks/throughput.py [--nodes 16 64 256] [--models logreg mlp]
        [--rounds R] [--repeats K] [--out benchmarks/results/throughput.json]
    python benchmarks/throughput.py --profile        # cProfile of fedcore, N=64 logreg
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import importlib.util
import io
import math
import os
import pstats
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional

# Runnable as `python benchmarks/throughput.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore import topology
from fedcore.config import Config, config_from_dict
from fedcore.data import BatchStream, Dataset, load_dataset, partition
from fedcore.engines.messages import Network, build_network
from fedcore.errors import DataError
from fedcore.models import build_model
from fedcore.setup.graph import build_topology

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "throughput.json"
# Node-rounds per timed run when --rounds is not given: rounds(N) = max(MIN_ROUNDS,
# NODE_ROUNDS // N), i.e. 64 rounds at N=16, 16 at N=64, 4 at N=256.
NODE_ROUNDS = 1024
MIN_ROUNDS = 4
# Dirichlet concentrations tried in order when fedcore's default (0.3) leaves a node with
# fewer than 2 examples (digits has 1437 training examples; N=256 needs a larger alpha).
ALPHA_LADDER = (0.5, 1.0, 2.0, 5.0)
TARGET_RATIO_N64 = 1.5

# torch calls CSR support "beta"; the one op used here (CSR @ dense) is long stable.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


# --------------------------------------------------------------------------- setup


def make_config(n: int, model: str, alpha: float | None = None) -> Config:
    """fedcore's defaults, except: dpsgd on a square torus, evaluation period > rounds."""
    side = math.isqrt(n)
    if side * side != n or side < 2:
        raise SystemExit(f"--nodes {n}: the torus benchmark needs a square N >= 4 (16, 64, 256).")
    raw: dict[str, Any] = {
        "run": {"eval_every": 10**9},
        "topology": {"kind": "torus", "nodes": n, "rows": side, "cols": side},
        "algorithm": {"name": "dpsgd"},
        "model": {"name": model},
    }
    if alpha is not None:
        raw["data"] = {"alpha": alpha}
    return config_from_dict(raw)


def choose_alpha(dataset: Dataset, n: int, model: str) -> float:
    """fedcore's default alpha, or the first of ALPHA_LADDER that gives every node 2 examples."""
    config = make_config(n, model)
    base = config.data
    for alpha in (base.alpha, *ALPHA_LADDER):
        try:
            partition(dataset.y_train, n, base.partition, seed=config.run.seed, alpha=alpha)
        except DataError:
            continue
        return alpha
    raise SystemExit(f"no Dirichlet alpha in {ALPHA_LADDER} splits digits across {n} nodes.")


def fresh_network(config: Config, dataset: Dataset) -> Network:
    """A new fedcore network (no observer, no recording): what ``fedcore simulate`` builds."""
    return build_network(config, dataset=dataset)


@dataclass
class Floor:
    """State of the plain-torch loop: stacked parameters, per-node modules and streams."""

    x: torch.Tensor  # [N, d] parameters, row i = node i
    g: torch.Tensor  # [N, d] gradients
    modules: list[nn.Module]
    streams: list[BatchStream]
    wt: torch.Tensor  # W.T as sparse CSR, W[i, j] = weight of i -> j
    lr: float

    def run(self, rounds: int) -> None:
        """``rounds`` rounds of D-PSGD: per-node forward/backward, then one sparse mix."""
        x, g, wt, lr = self.x, self.g, self.wt, self.lr
        pairs = list(zip(self.modules, self.streams, strict=True))
        for _ in range(rounds):
            g.zero_()
            for module, stream in pairs:
                xb, yb = stream.next_batch()
                functional.cross_entropy(module(xb), yb).backward()
            with torch.no_grad():
                mixed = wt @ x
                mixed.sub_(g, alpha=lr)
                x.copy_(mixed)


def model_kwargs(config: Config) -> dict[str, Any]:
    kwargs = dict(config.model.options)
    if config.model.name == "mlp":
        kwargs["hidden"] = config.model.hidden
    return kwargs


def build_floor(config: Config, dataset: Dataset) -> Floor:
    """The floor's state, built from fedcore's setup helpers only (not timed)."""
    seed = config.run.seed
    trust = build_topology(config.topology)
    graph = topology.prepare(trust, mixing="doubly-stochastic", algorithm="dpsgd")
    nodes = graph.nodes
    n = len(nodes)
    w = torch.as_tensor(graph.mixing_matrix(), dtype=torch.float32)
    wt = w.T.contiguous().to_sparse_csr()

    template = build_model(
        config.model.name,
        input_dim=dataset.input_dim,
        num_classes=dataset.num_classes,
        seed=seed,
        **model_kwargs(config),
    ).to(torch.float32)
    start = torch.cat([p.detach().reshape(-1) for p in template.parameters()])
    x = start.repeat(n, 1).contiguous()
    g = torch.zeros_like(x)
    modules: list[nn.Module] = []
    for i in range(n):
        module = copy.deepcopy(template)
        offset = 0
        for p in module.parameters():
            k = p.numel()
            p.data = x[i, offset : offset + k].view_as(p)
            p.grad = g[i, offset : offset + k].view_as(p)
            offset += k
        module.train()
        modules.append(module)

    parts = partition(
        dataset.y_train,
        n,
        config.data.partition,
        seed=seed,
        alpha=config.data.alpha,
        shards_per_node=config.data.shards_per_node,
    )
    streams = []
    for i in range(n):
        idx = torch.as_tensor(parts[i])
        streams.append(
            BatchStream(
                dataset.x_train[idx],
                dataset.y_train[idx],
                batch_size=config.data.batch_size,
                seed=seed * 1_000_003 + i,
            )
        )
    return Floor(x=x, g=g, modules=modules, streams=streams, wt=wt, lr=config.algorithm.lr)


# --------------------------------------------------------------------------- checks


def check_equivalence(dataset: Dataset, n: int, model: str, rounds: int) -> dict[str, Any]:
    """Run fedcore and the floor side by side and compare the final parameters."""
    config = make_config(n, model, choose_alpha(dataset, n, model))
    network = fresh_network(config, dataset)
    floor = build_floor(config, dataset)
    same_init = torch.equal(network.evaluator.initial_params(), floor.x[0])
    same_order = tuple(network.graph.nodes) == tuple(f"n{i}" for i in range(n))
    network.run(rounds)
    floor.run(rounds)
    fed = torch.stack([node.model() for node in network.nodes.values()])
    diff = (fed - floor.x).abs()
    max_abs = float(diff.max())
    scale = float(fed.abs().max())
    return {
        "nodes": n,
        "model": model,
        "rounds": rounds,
        "same_initial_params": same_init,
        "same_node_order": same_order,
        "max_abs_diff": max_abs,
        "max_abs_param": scale,
        "bitwise_equal": bool(torch.equal(fed, floor.x)),
        "match_1e-5": max_abs <= 1e-5,
    }


# --------------------------------------------------------------------------- timing


def time_fedcore(config: Config, dataset: Dataset, rounds: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``network.run(rounds)`` on a fresh network."""
    network = fresh_network(config, dataset)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    network.run(rounds)
    return time.perf_counter() - wall, time.process_time() - cpu


def time_floor(config: Config, dataset: Dataset, rounds: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``Floor.run(rounds)`` on fresh floor state."""
    floor = build_floor(config, dataset)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    floor.run(rounds)
    return time.perf_counter() - wall, time.process_time() - cpu


def rounds_for(n: int, fixed: int | None) -> int:
    return fixed if fixed is not None else max(MIN_ROUNDS, NODE_ROUNDS // n)


def bench_one(dataset: Dataset, n: int, model: str, rounds: int, repeats: int) -> dict[str, Any]:
    alpha = choose_alpha(dataset, n, model)
    config = make_config(n, model, alpha)
    warm = max(1, min(2, rounds))
    time_fedcore(config, dataset, warm)
    time_floor(config, dataset, warm)
    fed_times: list[float] = []
    floor_times: list[float] = []
    fed_cpu: list[float] = []
    floor_cpu: list[float] = []
    for _ in range(repeats):
        wall, cpu = time_fedcore(config, dataset, rounds)
        fed_times.append(wall)
        fed_cpu.append(cpu)
        wall, cpu = time_floor(config, dataset, rounds)
        floor_times.append(wall)
        floor_cpu.append(cpu)
    node_rounds = n * rounds
    fed_med = statistics.median(fed_times)
    floor_med = statistics.median(floor_times)
    pair_ratios = [f / b for f, b in zip(fed_times, floor_times, strict=True)]
    return {
        "nodes": n,
        "model": model,
        "params": int(build_floor_dim(config, dataset)),
        "alpha": alpha,
        "rounds": rounds,
        "node_rounds": node_rounds,
        "fedcore_s": fed_times,
        "floor_s": floor_times,
        "fedcore_median_s": fed_med,
        "floor_median_s": floor_med,
        "fedcore_node_rounds_per_s": node_rounds / fed_med,
        "floor_node_rounds_per_s": node_rounds / floor_med,
        "ratio": fed_med / floor_med,
        "fedcore_cpu_s": fed_cpu,
        "floor_cpu_s": floor_cpu,
        "cpu_ratio": statistics.median(fed_cpu) / statistics.median(floor_cpu),
        "pair_ratios": pair_ratios,
        "pair_ratio_min": min(pair_ratios),
        "pair_ratio_max": max(pair_ratios),
    }


def build_floor_dim(config: Config, dataset: Dataset) -> int:
    module = build_model(
        config.model.name,
        input_dim=dataset.input_dim,
        num_classes=dataset.num_classes,
        seed=config.run.seed,
        **model_kwargs(config),
    )
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------- output


def format_table(results: list[dict[str, Any]]) -> str:
    head = (
        "|   N | model  | rounds | fedcore node-rounds/s | floor node-rounds/s "
        "| ratio (fedcore/floor) | pair ratios min-max | CPU-time ratio |"
    )
    rule = (
        "|----:|--------|-------:|----------------------:|--------------------:"
        "|----------------------:|:-------------------:|---------------:|"
    )
    lines = [head, rule]
    for r in results:
        spread = f"{r['pair_ratio_min']:.2f} - {r['pair_ratio_max']:.2f}"
        lines.append(
            f"| {r['nodes']:>3} | {r['model']:<6} | {r['rounds']:>6} "
            f"| {r['fedcore_node_rounds_per_s']:>21.0f} | {r['floor_node_rounds_per_s']:>19.0f} "
            f"| {r['ratio']:>21.2f} | {spread:^19} | {r['cpu_ratio']:>14.2f} |"
        )
    return "\n".join(lines)


def profile_fedcore(n: int, model: str, rounds: int, top: int) -> str:
    """cProfile of one fedcore run (after a warm-up), top functions by own and total time."""
    dataset = load_dataset("digits", seed=0)
    config = make_config(n, model, choose_alpha(dataset, n, model))
    time_fedcore(config, dataset, 2)
    network = fresh_network(config, dataset)
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    network.run(rounds)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--models", nargs="+", default=["logreg", "mlp"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds per timed run for every N (default: max({MIN_ROUNDS}, {NODE_ROUNDS} // N))",
    )
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--check-nodes", type=int, default=16, help="N of the equivalence check (default 16)"
    )
    parser.add_argument(
        "--check-rounds", type=int, default=10, help="rounds of the equivalence check (default 10)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch.set_num_threads for both (default 1)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of benchmarking, print a cProfile of one fedcore run "
        "(N=64 unless --nodes is given, then its first N; the first of --models)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.profile:
        n = args.nodes[0] if args.nodes != [16, 64, 256] else 64
        model = args.models[0]
        rounds = rounds_for(n, args.rounds)
        print(f"cProfile of fedcore network.run({rounds}), N={n}, {model}")
        print(profile_fedcore(n, model, rounds, top=30))
        return 0

    began = time.perf_counter()
    info = _common.machine_info()
    dataset = load_dataset("digits", seed=0)

    checks = [
        check_equivalence(dataset, args.check_nodes, model, args.check_rounds)
        for model in args.models
    ]
    for c in checks:
        verdict = (
            "bitwise equal"
            if c["bitwise_equal"]
            else ("match (<= 1e-5)" if c["match_1e-5"] else "MISMATCH")
        )
        print(
            f"equivalence N={c['nodes']} {c['model']} {c['rounds']} rounds: "
            f"max |fedcore - floor| = {c['max_abs_diff']:.3g} "
            f"(max |param| {c['max_abs_param']:.3g}): {verdict}",
            flush=True,
        )

    results = []
    for n in args.nodes:
        for model in args.models:
            rounds = rounds_for(n, args.rounds)
            r = bench_one(dataset, n, model, rounds, args.repeats)
            results.append(r)
            print(
                f"N={n:>3} {model:<6} rounds={rounds:>3}: fedcore "
                f"{r['fedcore_node_rounds_per_s']:8.0f} nr/s, floor "
                f"{r['floor_node_rounds_per_s']:8.0f} nr/s, ratio {r['ratio']:.2f}",
                flush=True,
            )

    wall = time.perf_counter() - began
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    print()
    print(format_table(results))
    at64 = [r for r in results if r["nodes"] == 64]
    for r in at64:
        ok = "meets" if r["ratio"] <= TARGET_RATIO_N64 else "MISSES"
        print(f"N=64 {r['model']}: ratio {r['ratio']:.2f} {ok} the target <= {TARGET_RATIO_N64}")
    print(f"wall time {wall:.1f} s")

    report = {
        "benchmark": "fedcore in-process simulation throughput vs plain-torch floor",
        "command": " ".join(
            ["python", "benchmarks/throughput.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "settings": {
            "nodes": args.nodes,
            "models": args.models,
            "rounds": args.rounds,
            "rounds_rule": f"max({MIN_ROUNDS}, {NODE_ROUNDS} // N)"
            if args.rounds is None
            else "fixed",
            "repeats": args.repeats,
            "torch_threads": args.threads,
            "algorithm": "dpsgd",
            "topology": "torus sqrt(N) x sqrt(N)",
            "mixing": "Metropolis-Hastings (fedcore.topology.prepare)",
            "dataset": "digits",
            "partition": "dirichlet",
            "alpha_rule": f"fedcore default 0.3, else first of {list(ALPHA_LADDER)} that splits",
            "batch_size": make_config(16, "logreg").data.batch_size,
            "lr": make_config(16, "logreg").algorithm.lr,
            "timed": "network.run(rounds) on a fresh build_network(config), no observer; "
            "floor: Floor.run(rounds) on fresh state; builds are not timed",
            "floor": "per-node nn.Module with parameters/grads as views into rows of stacked "
            "X/G [N, d]; per node forward+backward; mix = sparse CSR W.T @ X, X -= lr*G",
            "ratio": "median fedcore wall time / median floor wall time",
            "cpu_ratio": "the same with process CPU time (less sensitive to other load)",
            "target": f"ratio <= {TARGET_RATIO_N64} at N=64",
        },
        "machine": info,
        "equivalence": checks,
        "results": results,
        "wall_s": wall,
    }
    _common.write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
