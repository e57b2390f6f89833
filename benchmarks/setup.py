# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""Set-up of a large run, stage by stage, against a plain numpy pass over the same edges.

For every ``--nodes`` N (default 10,000, 100,000 and 1,000,000) and its degree (``--degree``,
default 15 up to 100,000 peers and 4 at a million: the issue's two targets), builds what
``fedcore simulate`` builds before round 1 of a DOG run of logistic regression on the
synthetic stream (``examples/dog-10k.toml`` at N peers), one stage at a time:

- ``data``: the synthetic stream for N peers (``fedcore.streams.load_source``);
- ``graph``: the seeded random-regular graph (``fedcore.topology.build``);
- ``weights``: the checks and Metropolis-Hastings weights (``topology.prepare``);
- ``fingerprint``: the run fingerprint over every weighted edge;
- ``tables``: the vectorized engine's neighbour tables (``stack_graph``);
- ``engine``: the whole engine build (``VectorizedNetwork``, the tables included);
- ``prepare_run``: everything before the engine, as ``fedcore simulate`` calls it.

Each stage is timed in CPU seconds of this process (``time.process_time``, what load on
a shared machine disturbs least) and wall seconds. The reference, measured in the same
run right before each stage, is one ``numpy.argsort`` of the graph's ``N * degree`` edge
keys: the cost of one pass that touches every edge once, in compiled code; a stage's
ratio to it says how many such passes the stage costs. ``--networkx`` adds networkx's own
generator (``networkx.random_regular_graph``, the per-edge code fedcore's graph used to be
built with) at N up to that bound. Each size runs ``--repeats`` times, the median is
reported, and the peak resident memory of the process after each size
(``resource.getrusage``: the maximum so far, so sizes run in increasing order).

Usage::

    python benchmarks/setup.py [--nodes 10000 100000 1000000] [--repeats 1]
        [--networkx 100000] [--out benchmarks/results/setup.json]
    python benchmarks/setup.py --tiny --out /tmp/setup.json   # a smoke test
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Runnable as `python benchmarks/setup.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script

from fedcore.config import fingerprint_json, load_config
from fedcore.engines.stacked_graph import EdgeUnion, stack_graph
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.setup.graph import build_topology, communication_graph
from fedcore.setup.prepare import prepare_run
from fedcore.streams import load_source
from fedcore.topology import TrustGraph
from fedcore.topology.digest import edges_json

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "setup.json"
EXAMPLE = _ROOT / "examples" / "dog-10k.toml"


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(CPU seconds, wall seconds, result) of one call."""
    gc.collect()
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - w, out


def measure(n: int, degree: int, networkx_upto: int) -> dict[str, Any]:
    """One repeat of every stage at ``n`` peers of ``degree``."""
    config = load_config(
        EXAMPLE, [f"topology.nodes={n}", f"topology.degree={degree}", "run.rounds=1"]
    )
    rows: dict[str, dict[str, float]] = {}

    def stage(name: str, fn: Callable[[], Any], edges: int) -> Any:
        keys = np.random.default_rng(n).integers(0, n * n, size=edges)
        ref_cpu, ref_wall, _ = _timed(lambda: np.argsort(keys))
        cpu, wall, out = _timed(fn)
        rows[name] = {"cpu_s": cpu, "wall_s": wall, "ref_cpu_s": ref_cpu, "ref_wall_s": ref_wall}
        return out

    e = n * degree
    d = config.data
    options = {"features": d.features, "adversarial": d.adversarial, "noise": d.noise}
    options["drift"] = d.drift
    stage(
        "data",
        lambda: load_source(
            "synthetic", nodes=n, rounds=1, batch_size=1, seed=config.run.seed, options=options
        ),
        e,
    )
    trust = stage("graph", lambda: build_topology(config.topology), e)
    assert isinstance(trust, TrustGraph)
    if n <= networkx_upto:
        import networkx as nx

        stage("networkx-graph", lambda: nx.random_regular_graph(degree, n, seed=0), e)
    setup = prepare_run(config)  # the algorithm object, and a setup for the engine
    graph = stage("weights", lambda: communication_graph(setup.algorithm, trust), e)
    stage("fingerprint", lambda: fingerprint_json(config, edges_json(graph)), e)
    stage(
        "tables",
        lambda: stack_graph(graph, union=EdgeUnion.of([graph]), device=torch.device("cpu")),
        e,
    )
    del setup
    setup = stage("prepare_run", lambda: prepare_run(config, hosts_all=True), e)
    stage("engine", lambda: VectorizedNetwork(setup, device=torch.device("cpu")), e)
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run the stages at every size and print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--degree", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--networkx", type=int, default=100_000)
    parser.add_argument("--tiny", action="store_true", help="a smoke test: 2,000 peers")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [2_000] if args.tiny else sorted(args.nodes)
    degrees = args.degree or [15 if n <= 100_000 else 4 for n in sizes]
    if len(degrees) == 1:
        degrees = degrees * len(sizes)
    results: list[dict[str, Any]] = []
    print(f"{'nodes':>9} {'deg':>3} {'stage':<15} {'cpu s':>8} {'wall s':>8} {'x sort':>7}")
    for n, degree in zip(sizes, degrees, strict=True):
        samples = [measure(n, degree, args.networkx) for _ in range(args.repeats)]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        for name in samples[0]:
            cpu = statistics.median(s[name]["cpu_s"] for s in samples)
            wall = statistics.median(s[name]["wall_s"] for s in samples)
            ref = statistics.median(s[name]["ref_cpu_s"] for s in samples)
            ratio = cpu / ref if ref > 0 else float("nan")
            print(f"{n:>9,} {degree:>3} {name:<15} {cpu:>8.2f} {wall:>8.2f} {ratio:>7.1f}")
            results.append(
                {
                    "nodes": n,
                    "degree": degree,
                    "stage": name,
                    "cpu_s": cpu,
                    "wall_s": wall,
                    "ref_sort_cpu_s": ref,
                    "ratio_to_sort": ratio,
                    "peak_rss_bytes": peak,
                }
            )
        setup_cpu = statistics.median(
            s["prepare_run"]["cpu_s"] + s["engine"]["cpu_s"] for s in samples
        )
        total = f"{n:>9,} {degree:>3} {'set-up total':<15} {setup_cpu:>8.2f}"
        print(f"{total}   peak {peak / 2**30:.2f} GiB")
    _common.write_report(
        args.out,
        {
            "benchmark": "setup",
            "machine": _common.machine_info(),
            "reference": "one numpy.argsort of N * degree random int64 keys, same run",
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
