# ruff: noqa: E402  (fedcore is imported after the checkout root is put on sys.path)
"""The vectorized engine against the message engine and two hand-written floors.

Node-rounds per second of a D-PSGD simulation on a ``sqrt(N) x sqrt(N)`` torus, MNIST-1D
with an IID partition (so every node holds examples at N = 1024), four ways:

* ``messages``: the message engine, ``build_network(config).run(R)`` with no observer
  (what ``benchmarks/throughput.py`` calls "fedcore");
* ``vectorized``: ``VectorizedNetwork(prepare_run(config)).run_round()`` R times;
* ``floor``: throughput.py's floor (one ``nn.Module`` per node on views into a stacked
  ``[N, d]`` tensor, autograd per node, one sparse CSR mix);
* ``batched floor``: the fastest batched code we can write by hand with no framework:
  parameters ``[N, d]``, the forward as ``baddbmm`` over all nodes, the softmax
  cross-entropy gradient (and the MLP's backward through its ReLU) written out by hand, no
  autograd, and one sparse CSR mix ``X <- W^T X - lr G``; batches from
  ``fedcore.data.StackedBatches`` with the engine's seeds, so both draw the same data.

Before timing, the batched floor's and the floor's parameters after a few rounds are
checked against the vectorized engine's (1e-5 relative). Repeats are interleaved (the four
in a rotating order), builds are not timed, each of the four gets one untimed warm-up run
per case, every timed run except the message engine's starts after one untimed round on
the same state, and medians are reported. Everything runs under
``torch.set_num_threads(1)`` unless ``--threads``.

Two more sections, each in fresh subprocesses (so peak memory of one does not mix into
another): ``--dog10k`` (``examples/dog-10k.toml``, or the same settings built in code:
10,000 nodes, random 15-regular graph, DOG, the synthetic stream, batch 1) times
``run_round()`` and measures peak memory per node for logreg and an MLP (the MLP with
``run.regret = false``: regret needs a convex loss); ``--largest`` finds the largest N of
those settings that still runs one round a second.

Usage::

    python benchmarks/engines.py [--nodes 16 64 256 1024] [--models logreg mlp]
        [--repeats 5] [--skip-messages-above N] [--threads 1]
        [--dog10k] [--largest] [--no-engines] [--out benchmarks/results/engines.json]
    python benchmarks/engines.py --profile --nodes 1024 --models mlp   # cProfile, vectorized
    python benchmarks/engines.py --breakdown --nodes 256 1024   # ms per part of a round
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import io
import json
import math
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Runnable as `python benchmarks/engines.py` from a checkout without installing fedcore.
_ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("fedcore") is None and (_ROOT / "fedcore").is_dir():
    sys.path.insert(0, str(_ROOT))

import _common  # benchmarks/_common.py, beside this script
import throughput  # benchmarks/throughput.py: the per-node floor (Floor, build_floor)

from fedcore import topology
from fedcore.config import Config, config_from_dict, load_config
from fedcore.data import Dataset, StackedBatches, load_dataset, partition
from fedcore.engines.messages import build_network
from fedcore.engines.vectorized import VectorizedNetwork
from fedcore.models import build_model
from fedcore.setup.graph import build_topology
from fedcore.setup.prepare import prepare_run

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "engines.json"
DOG_TOML = _ROOT / "examples" / "dog-10k.toml"
CPU = torch.device("cpu")

# Rounds per timed run: the slow two (messages, per-node floor) do SLOW_NODE_ROUNDS node-rounds
# (128 rounds at N=16 ... 2 at N=1024), the fast two FAST_NODE_ROUNDS (1024 ... 16).
SLOW_NODE_ROUNDS, SLOW_MIN_ROUNDS = 2048, 2
FAST_NODE_ROUNDS, FAST_MIN_ROUNDS = 16384, 16
CHECK_ROUNDS = 5
CHECK_TOLERANCE = 1e-5  # max |diff| / max |param|
TARGET_VEC_OVER_BATCHED = 1.3  # at N >= 256
TARGET_SPEEDUP_N256 = 20.0
TARGET_DOG_ROUNDS_PER_S = 20.0
LARGEST_NODES = (10_000, 20_000, 50_000, 100_000)
KINDS = ("messages", "vectorized", "floor", "batched")

# torch calls CSR support "beta"; the one op used here (CSR @ dense) is long stable.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


# --------------------------------------------------------------------------- configs


def make_config(n: int, model: str) -> Config:
    """fedcore's defaults, except: D-PSGD on a square torus, MNIST-1D split IID, no eval."""
    side = math.isqrt(n)
    if side * side != n or side < 2:
        raise SystemExit(f"--nodes {n}: the torus benchmark needs a square N >= 4.")
    return config_from_dict(
        {
            "run": {"eval_every": 10**9},
            "topology": {"kind": "torus", "nodes": n, "rows": side, "cols": side},
            "algorithm": {"name": "dpsgd"},
            "model": {"name": model},
            "data": {"dataset": "mnist1d", "partition": "iid"},
        }
    )


def dog_overrides(n: int, model: str) -> list[str]:
    """``--set`` overrides of the dog-10k settings (on the example file if it exists). The
    MLP runs with ``run.regret = false``: regret needs a convex loss (the config refuses it
    with an MLP), and ``run_round()``, which is what is timed, does not compute it."""
    sets = [f"topology.nodes={n}", f"model.name={model}", "run.eval_every=1000000000"]
    if model == "mlp":
        sets += ["model.hidden=64", "run.regret=false"]
    if DOG_TOML.is_file():
        return sets
    return [
        "algorithm.name=dog",
        "topology.kind=random-regular",
        "topology.degree=15",
        "data.stream=synthetic",
        "data.features=10",
        "data.batch_size=1",
        "run.rounds=300",
        *sets,
    ]


def dog_config(n: int, model: str) -> Config:
    return load_config(DOG_TOML if DOG_TOML.is_file() else None, dog_overrides(n, model))


# --------------------------------------------------------------------------- batched floor


@dataclass
class BatchedFloor:
    """Hand-written batched D-PSGD: ``X [N, d]``, a by-hand forward and backward for all
    nodes at once (``baddbmm``/``bmm``, no autograd), one sparse CSR mix per round.

    Flat layout per row (``named_parameters`` order of ``fedcore.models``): logreg
    ``1.weight [C, F]``, ``1.bias [C]``; mlp ``1.weight [H, F]``, ``1.bias [H]``,
    ``3.weight [C, H]``, ``3.bias [C]``.
    """

    x: torch.Tensor  # [N, d]
    g: torch.Tensor  # [N, d] gradient buffer
    wt: torch.Tensor  # W.T, sparse CSR
    lr: float
    batches: StackedBatches
    model: str
    features: int
    classes: int
    hidden: int

    def __post_init__(self) -> None:
        self.up = torch.ones(self.x.shape[0], dtype=torch.bool).numpy()

    def grad(self, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Mean softmax cross-entropy gradient of every node at ``self.x`` into ``self.g``."""
        x, g = self.x, self.g
        n, b = xb.shape[0], xb.shape[1]
        f, c, h = self.features, self.classes, self.hidden
        # d loss / d logits = (softmax - onehot) * weight of the example (1/B, or mask/count)
        if mask is None:
            scale: torch.Tensor | float = 1.0 / b
        else:
            m = mask.to(x.dtype)
            scale = (m / m.sum(dim=1, keepdim=True)).unsqueeze(2)
        onehot_neg = torch.full((n, b, 1), -1.0, dtype=x.dtype)
        if self.model == "logreg":
            w, bias = x[:, : c * f].view(n, c, f), x[:, c * f :]
            logits = torch.baddbmm(bias.unsqueeze(1), xb, w.transpose(1, 2))  # [N, B, C]
            p = torch.softmax(logits, dim=2)
            p.scatter_add_(2, yb.unsqueeze(2), onehot_neg)
            p.mul_(scale)
            g[:, : c * f].view(n, c, f).copy_(torch.bmm(p.transpose(1, 2), xb))
            torch.sum(p, dim=1, out=g[:, c * f :])
            return
        o1, o2, o3 = h * f, h * f + h, h * f + h + c * h
        w1, b1 = x[:, :o1].view(n, h, f), x[:, o1:o2]
        w2, b2 = x[:, o2:o3].view(n, c, h), x[:, o3:]
        pre = torch.baddbmm(b1.unsqueeze(1), xb, w1.transpose(1, 2))  # [N, B, H]
        hid = torch.relu(pre)
        logits = torch.baddbmm(b2.unsqueeze(1), hid, w2.transpose(1, 2))  # [N, B, C]
        p = torch.softmax(logits, dim=2)
        p.scatter_add_(2, yb.unsqueeze(2), onehot_neg)
        p.mul_(scale)
        g[:, o2:o3].view(n, c, h).copy_(torch.bmm(p.transpose(1, 2), hid))
        torch.sum(p, dim=1, out=g[:, o3:])
        dh = torch.bmm(p, w2)  # [N, B, H]
        dh.mul_(pre > 0)
        g[:, :o1].view(n, h, f).copy_(torch.bmm(dh.transpose(1, 2), xb))
        torch.sum(dh, dim=1, out=g[:, o1:o2])

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            _, xb, yb, mask = self.batches.next(self.up)
            self.grad(xb, yb, mask)
            mixed = self.wt @ self.x
            mixed.sub_(self.g, alpha=self.lr)
            self.x = mixed


def flat_layout(config: Config, dataset: Dataset) -> tuple[torch.Tensor, list[tuple[str, tuple]]]:
    """The model's initial flat parameters and ``(name, shape)`` of each, from build_model."""
    module = build_model(
        config.model.name,
        input_dim=dataset.input_dim,
        num_classes=dataset.num_classes,
        seed=config.run.seed,
        **throughput.model_kwargs(config),
    ).to(torch.float32)
    named = list(module.named_parameters())
    flat = torch.cat([p.detach().reshape(-1) for _, p in named])
    return flat, [(name, tuple(p.shape)) for name, p in named]


def build_batched_floor(config: Config, dataset: Dataset) -> BatchedFloor:
    """The batched floor's state from fedcore's setup helpers only (not timed)."""
    seed = config.run.seed
    trust = build_topology(config.topology)
    graph = topology.prepare(trust, mixing="doubly-stochastic", algorithm="dpsgd")
    n = len(graph.nodes)
    w = torch.as_tensor(graph.mixing_matrix(), dtype=torch.float32)
    wt = w.T.contiguous().to_sparse_csr()
    start, layout = flat_layout(config, dataset)
    expected = (
        ["1.weight", "1.bias"]
        if config.model.name == "logreg"
        else ["1.weight", "1.bias", "3.weight", "3.bias"]
    )
    if [name for name, _ in layout] != expected:
        raise SystemExit(f"unexpected parameter layout of {config.model.name}: {layout}")
    parts = partition(
        dataset.y_train,
        n,
        config.data.partition,
        seed=seed,
        alpha=config.data.alpha,
        shards_per_node=config.data.shards_per_node,
    )
    batches = StackedBatches(
        dataset.x_train,
        dataset.y_train,
        parts,
        batch_size=config.data.batch_size,
        seeds=[seed * 1_000_003 + i for i in range(n)],
        order=config.data.order,
        device=CPU,
    )
    x = start.repeat(n, 1).contiguous()
    return BatchedFloor(
        x=x,
        g=torch.zeros_like(x),
        wt=wt,
        lr=config.algorithm.lr,
        batches=batches,
        model=config.model.name,
        features=dataset.input_dim,
        classes=dataset.num_classes,
        hidden=config.model.hidden if config.model.name == "mlp" else 0,
    )


# --------------------------------------------------------------------------- the four runners


def build(kind: str, config: Config, dataset: Dataset) -> Any:
    if kind == "messages":
        return build_network(config, dataset=dataset)
    if kind == "vectorized":
        return VectorizedNetwork(prepare_run(config, dataset=dataset), device=CPU)
    if kind == "floor":
        return throughput.build_floor(config, dataset)
    return build_batched_floor(config, dataset)


def advance(kind: str, state: Any, rounds: int) -> None:
    if kind == "vectorized":
        for _ in range(rounds):
            state.run_round()
    else:
        state.run(rounds)


def params_of(kind: str, state: Any) -> torch.Tensor:
    if kind == "vectorized":
        return state.model()
    if kind == "messages":
        return torch.stack([node.model() for node in state.nodes.values()])
    return state.x


def timed(kind: str, config: Config, dataset: Dataset, rounds: int, warm: int) -> tuple:
    """Wall and CPU seconds of ``rounds`` rounds after ``warm`` untimed ones, fresh state.

    The message engine's ``run(R)`` runs up to R rounds in total, so it is not warmed in
    place (``asyncio.run`` starts a new loop each call); it gets its warm-up run on a
    separate network instead (see :func:`bench_one`)."""
    state = build(kind, config, dataset)
    if kind != "messages" and warm:
        advance(kind, state, warm)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    advance(kind, state, rounds)
    return time.perf_counter() - wall, time.process_time() - cpu


def check_equivalence(config: Config, dataset: Dataset, rounds: int) -> dict[str, Any]:
    """Vectorized engine against both floors after ``rounds`` rounds from the same start."""
    net = build("vectorized", config, dataset)
    start, layout = flat_layout(config, dataset)
    same_start = bool(torch.equal(net.model()[0], start))
    same_order = tuple(net.nodes) == tuple(f"n{i}" for i in range(net.n))
    advance("vectorized", net, rounds)
    ref = net.model()
    scale = float(ref.abs().max())
    out: dict[str, Any] = {
        "rounds": rounds,
        "layout": [[name, list(shape)] for name, shape in layout],
        "same_initial_params": same_start,
        "same_node_order": same_order,
        "max_abs_param": scale,
        "gradient_mode": net.objective.mode,  # StackedObjective: batched, vmap or per-node
    }
    for kind in ("batched", "floor"):
        state = build(kind, config, dataset)
        advance(kind, state, rounds)
        diff = float((params_of(kind, state) - ref).abs().max())
        out[f"{kind}_max_abs_diff"] = diff
        out[f"{kind}_rel_diff"] = diff / scale
        out[f"{kind}_match"] = diff / scale <= CHECK_TOLERANCE
    return out


def rounds_for(n: int, node_rounds: int, minimum: int) -> int:
    return max(minimum, node_rounds // n)


def bench_one(
    dataset: Dataset, n: int, model: str, repeats: int, kinds: list[str]
) -> dict[str, Any]:
    config = make_config(n, model)
    check = check_equivalence(config, dataset, CHECK_ROUNDS)
    print(
        f"  check N={n} {model} {CHECK_ROUNDS} rounds: max |batched - vectorized| = "
        f"{check['batched_max_abs_diff']:.3g}, max |floor - vectorized| = "
        f"{check['floor_max_abs_diff']:.3g} (max |param| {check['max_abs_param']:.3g}, "
        f"same start {check['same_initial_params']}, gradients {check['gradient_mode']})",
        flush=True,
    )
    if not (check["batched_match"] and check["floor_match"] and check["same_initial_params"]):
        raise SystemExit(f"N={n} {model}: the floors do not match the vectorized engine")
    rounds = {
        k: rounds_for(n, SLOW_NODE_ROUNDS, SLOW_MIN_ROUNDS)
        if k in ("messages", "floor")
        else rounds_for(n, FAST_NODE_ROUNDS, FAST_MIN_ROUNDS)
        for k in kinds
    }
    # Warm-ups: one short untimed run of each (lazy inits, allocator, vmap tracing).
    for k in kinds:
        timed(k, config, dataset, 1 if k != "messages" else min(2, rounds[k]), warm=1)
    walls: dict[str, list[float]] = {k: [] for k in kinds}
    cpus: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(repeats):
        order = kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]
        for k in order:
            wall, cpu = timed(k, config, dataset, rounds[k], warm=1)
            walls[k].append(wall)
            cpus[k].append(cpu)
    # Per node-round seconds, so runs of different lengths compare.
    per = {k: [w / (n * rounds[k]) for w in walls[k]] for k in kinds}
    per_cpu = {k: [c / (n * rounds[k]) for c in cpus[k]] for k in kinds}
    med = {k: statistics.median(per[k]) for k in kinds}
    med_cpu = {k: statistics.median(per_cpu[k]) for k in kinds}
    out: dict[str, Any] = {
        "nodes": n,
        "model": model,
        "params": int(check_params(config, dataset)),
        "batch_sizes": batch_sizes(config, dataset),
        "rounds": rounds,
        "wall_s": walls,
        "cpu_s": cpus,
        "node_rounds_per_s": {k: 1.0 / med[k] for k in kinds},
        "cpu_node_rounds_per_s": {k: 1.0 / med_cpu[k] for k in kinds},
        "check": check,
        "loadavg_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }

    def ratio(a: str, b: str) -> dict[str, Any] | None:
        if a not in kinds or b not in kinds:
            return None
        pairs = [x / y for x, y in zip(per[a], per[b], strict=True)]
        return {
            "ratio": med[a] / med[b],
            "pair_min": min(pairs),
            "pair_max": max(pairs),
            "cpu_ratio": med_cpu[a] / med_cpu[b],
        }

    out["vectorized_over_batched"] = ratio("vectorized", "batched")
    out["messages_over_vectorized"] = ratio("messages", "vectorized")
    out["floor_over_batched"] = ratio("floor", "batched")
    return out


def check_params(config: Config, dataset: Dataset) -> int:
    return int(flat_layout(config, dataset)[0].numel())


def batch_sizes(config: Config, dataset: Dataset) -> list[int]:
    """Smallest and largest per-node batch (min(batch_size, examples held))."""
    n = config.topology.nodes
    parts = partition(dataset.y_train, n, config.data.partition, seed=config.run.seed)
    sizes = [min(config.data.batch_size, len(p)) for p in parts]
    return [min(sizes), max(sizes)]


# --------------------------------------------------------------------------- subprocess children


def _status_kib(key: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def child_dog(n: int, model: str, rounds: int, blocks: int, budget_s: float) -> dict[str, Any]:
    """In a fresh process: setup time, rounds/s of run_round() and memory of one network."""
    config = dog_config(n, model)
    gc.collect()
    rss0 = _status_kib("VmRSS")
    t0 = time.perf_counter()
    setup = prepare_run(config)
    t1 = time.perf_counter()
    rss_setup = _status_kib("VmRSS")
    net = VectorizedNetwork(setup, device=CPU)
    t2 = time.perf_counter()
    rss_built = _status_kib("VmRSS")
    net.run_round()  # warm-up
    t3 = time.perf_counter()
    rates = []
    spent = 0.0
    while len(rates) < blocks and (not rates or spent < budget_s):
        began = time.perf_counter()
        for _ in range(rounds):
            net.run_round()
        took = time.perf_counter() - began
        spent += took
        rates.append(rounds / took)
    hwm = _status_kib("VmHWM")
    return {
        "nodes": n,
        "model": model,
        "params": net.d,
        "edges": int(net.graphs[0].edges),
        "gradient_mode": net.objective.mode,
        "prepare_run_s": t1 - t0,
        "build_s": t2 - t1,
        "setup_s": t2 - t0,
        "first_round_s": t3 - t2,
        "rounds_per_block": rounds,
        "rounds_per_s_blocks": rates,
        "rounds_per_s": statistics.median(rates),
        "rss_before_kib": rss0,
        "rss_after_setup_kib": rss_setup,
        "rss_after_build_kib": rss_built,
        "rss_after_rounds_kib": _status_kib("VmRSS"),
        "peak_kib": hwm,
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "peak_growth_per_node_kib": (hwm - rss0) / n,
        "source": str(DOG_TOML.relative_to(_ROOT)) if DOG_TOML.is_file() else "built in code",
    }


def run_child(spec: dict[str, Any], threads: int, timeout: float) -> dict[str, Any]:
    """Run ``child_dog(**spec)`` in a fresh interpreter; ``{"error": ...}`` on failure."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    cmd += ["--threads", str(threads)]
    began = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {**spec, "error": f"exit {done.returncode}: " + " | ".join(tail)}
    result = json.loads(lines[-1])
    result["process_s"] = time.perf_counter() - began
    return result


def dog10k(threads: int, timeout: float) -> list[dict[str, Any]]:
    out = []
    for model in ("logreg", "mlp"):
        spec = {"n": 10_000, "model": model, "rounds": 20, "blocks": 3, "budget_s": 30.0}
        r = run_child(spec, threads, timeout)
        out.append(r)
        if "error" in r:
            print(f"  dog-10k {model}: {r['error']}", flush=True)
        else:
            print(
                f"  dog-10k {model}: {r['rounds_per_s']:.1f} rounds/s, setup {r['setup_s']:.1f} s, "
                f"peak +{r['peak_growth_per_node_kib']:.2f} KiB/node",
                flush=True,
            )
    return out


def largest(threads: int, timeout: float, sizes: list[int]) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        spec = {"n": n, "model": "logreg", "rounds": 5, "blocks": 3, "budget_s": 20.0}
        r = run_child(spec, threads, timeout)
        out.append(r)
        if "error" in r:
            print(f"  largest N={n}: {r['error']} (larger N not tried)", flush=True)
            break
        print(
            f"  largest N={n}: {r['rounds_per_s']:.2f} rounds/s, setup {r['setup_s']:.1f} s, "
            f"peak +{r['peak_growth_per_node_kib']:.2f} KiB/node",
            flush=True,
        )
    return out


# --------------------------------------------------------------------------- output


def format_engines(results: list[dict[str, Any]]) -> str:
    head = (
        "|    N | model  | batch | messages nr/s | vectorized nr/s | floor nr/s "
        "| batched floor nr/s | vectorized / batched (pairs) "
        "| vectorized speed-up over messages | floor / batched |"
    )
    rule = (
        "|-----:|--------|:-----:|--------------:|----------------:|-----------:"
        "|-------------------:|:----------------------------:"
        "|----------------------------------:|----------------:|"
    )
    lines = [head, rule]
    for r in results:
        rate = r["node_rounds_per_s"]
        msg = f"{rate['messages']:,.0f}" if "messages" in rate else "skipped"
        vb = r["vectorized_over_batched"]
        mv = r["messages_over_vectorized"]
        fb = r["floor_over_batched"]
        spread = f"{vb['ratio']:.2f} ({vb['pair_min']:.2f}-{vb['pair_max']:.2f})"
        speed = f"{mv['ratio']:.1f}x" if mv else "-"
        lo, hi = r["batch_sizes"]
        batch = str(lo) if lo == hi else f"{lo}-{hi}"
        lines.append(
            f"| {r['nodes']:>4} | {r['model']:<6} | {batch:^5} | {msg:>13} "
            f"| {rate['vectorized']:>15,.0f} | {rate['floor']:>10,.0f} | {rate['batched']:>18,.0f} "
            f"| {spread:^28} | {speed:>33} | {fb['ratio']:>15.2f} |"
        )
    return "\n".join(lines)


def format_dog(rows: list[dict[str, Any]], title: str) -> str:
    head = (
        f"| {title} | model  | params | rounds/s (blocks) | setup s (prepare_run + build) "
        "| RSS before MiB | peak MiB | peak growth per node KiB |"
    )
    rule = (
        "|------:|--------|-------:|:------------------|:------------------"
        "|---------------:|---------:|-------------------------:|"
    )
    lines = [head, rule]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['n']:>6,} | {r['model']:<6} | - | {r['error']} | - | - | - | - |")
            continue
        blocks = ", ".join(f"{x:.1f}" for x in r["rounds_per_s_blocks"])
        lines.append(
            f"| {r['nodes']:>6,} | {r['model']:<6} | {r['params']:>6} "
            f"| {r['rounds_per_s']:.2f} ({blocks}) "
            f"| {r['setup_s']:.1f} ({r['prepare_run_s']:.1f} + {r['build_s']:.1f}) "
            f"| {r['rss_before_kib'] / 1024:>14.0f} | {r['peak_kib'] / 1024:>8.0f} "
            f"| {r['peak_growth_per_node_kib']:>24.2f} |"
        )
    return "\n".join(lines)


def _median_ms(fn: Any, calls: int) -> float:
    fn()
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def breakdown(dataset: Dataset, n: int, model: str, calls: int = 30) -> list[tuple[str, float]]:
    """Median ms of each part of one round, vectorized engine and batched floor (the parts
    re-run on the state after one round; their sum need not equal the whole)."""
    from fedcore.algorithms.rule import Slot, gossip
    from fedcore.engines.batched import BatchRound

    config = make_config(n, model)
    net = build("vectorized", config, dataset)
    net.run_round()
    bf = build("batched", config, dataset)
    bf.run(1)
    up = torch.ones(n, dtype=torch.bool)
    up_np = up.numpy()
    rows, xb, yb, mask = net.batches.next(up_np)
    params = net.model()
    _, grads = net.objective.loss_and_grad(params[rows], xb, yb, mask)
    g = net.graphs[0]
    every = torch.ones(g.edges, dtype=torch.bool)
    ctx = BatchRound(
        round=1, lr=config.algorithm.lr, graph=g, up=up, arrived=[every], codec=net.codec,
        nodes=net.nodes,
    )  # fmt: skip

    def mix() -> torch.Tensor:
        w, arrived = g.slots(g.weight), g.slots(every)
        slots = [
            Slot({"x": params.index_select(0, g.nbr[:, k])}, {}, w[:, k], arrived[:, k])
            for k in range(g.nbr.shape[1])
        ]
        return gossip(params, g.self_weight, slots)

    def scatter() -> None:
        grad = torch.zeros_like(params)
        grad[rows] = grads

    def csr_mix() -> None:
        bf.wt @ bf.x

    mode = net.objective.mode  # StackedObjective: batched (stacked matmuls), vmap, per-node
    # Every node is up, so run_round() passes the whole stack (no params[rows] gather and
    # no grad[rows] scatter); the scatter is timed apart, for rounds where some are down.
    parts = [
        ("vectorized: run_round()", net.run_round),
        ("  StackedBatches.next", lambda: net.batches.next(up_np)),
        (f"  loss_and_grad ({mode})", lambda: net.objective.loss_and_grad(params, xb, yb, mask)),
        ("  (some node down: zeros + grad[rows] = grads)", scatter),
        ("  form.round (D-PSGD update)", lambda: net.form.round(net.state, grads, ctx)),
        ("    of which codec.roundtrip (raw: a copy)", lambda: net.codec.roundtrip(
            params, torch.arange(n))),
        ("    of which slot-by-slot mix (gossip over slots)", mix),
        ("batched floor: one round", lambda: bf.run(1)),
        ("  StackedBatches.next", lambda: bf.batches.next(up_np)),
        ("  hand-written gradient", lambda: bf.grad(xb, yb, mask)),
        ("  sparse CSR W.T @ X", csr_mix),
    ]  # fmt: skip
    return [(name, _median_ms(fn, calls)) for name, fn in parts]


def profile_vectorized(dataset: Dataset, n: int, model: str, rounds: int, top: int) -> str:
    config = make_config(n, model)
    net = build("vectorized", config, dataset)
    advance("vectorized", net, 2)
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    advance("vectorized", net, rounds)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--models", nargs="+", default=["logreg", "mlp"])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument(
        "--skip-messages-above",
        type=int,
        default=None,
        metavar="N",
        help="leave the message engine out for N above this",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--dog10k", action="store_true", help="also the dog-10k section")
    parser.add_argument("--largest", action="store_true", help="also the largest-N section")
    parser.add_argument(
        "--largest-nodes", type=int, nargs="+", default=list(LARGEST_NODES), metavar="N"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per subprocess (default 600)"
    )
    parser.add_argument("--no-engines", action="store_true", help="skip the four-way table")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print a cProfile of the vectorized engine (first of --nodes and --models)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="print the median ms of each part of a round, vectorized and batched floor, "
        "for every --nodes and --models",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child is not None:
        print(json.dumps(child_dog(**json.loads(args.child))))
        return 0
    if args.breakdown:
        dataset = load_dataset("mnist1d", seed=make_config(16, "logreg").run.seed)
        print(f"load average at start: {list(os.getloadavg())}")
        for n in args.nodes:
            for model in args.models:
                print(f"\nN={n} {model}: median ms per call")
                for name, ms in breakdown(dataset, n, model):
                    print(f"  {name:<52} {ms:8.2f}")
        print(f"load average at end: {list(os.getloadavg())}")
        return 0
    if args.profile:
        n, model = args.nodes[0], args.models[0]
        dataset = load_dataset("mnist1d", seed=make_config(16, model).run.seed)
        rounds = rounds_for(n, FAST_NODE_ROUNDS, FAST_MIN_ROUNDS)
        print(f"cProfile of VectorizedNetwork.run_round() x {rounds}, N={n}, {model}")
        print(profile_vectorized(dataset, n, model, rounds, top=30))
        return 0

    began = time.perf_counter()
    info = _common.machine_info()
    print(f"load average at start: {info['loadavg_start']}", flush=True)
    report: dict[str, Any] = {
        "benchmark": "vectorized engine vs message engine, per-node floor and batched floor",
        "command": " ".join(
            ["python", "benchmarks/engines.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": info,
    }
    tables = []
    if not args.no_engines:
        base = make_config(16, args.models[0])
        dataset = load_dataset("mnist1d", seed=base.run.seed, test_fraction=base.data.test_fraction)
        results = []
        for n in args.nodes:
            for model in args.models:
                kinds = list(KINDS)
                if args.skip_messages_above is not None and n > args.skip_messages_above:
                    kinds.remove("messages")
                r = bench_one(dataset, n, model, args.repeats, kinds)
                results.append(r)
                rate = r["node_rounds_per_s"]
                print(
                    f"N={n:>4} {model:<6}: "
                    + ", ".join(f"{k} {rate[k]:,.0f}" for k in kinds)
                    + f" nr/s; vectorized/batched {r['vectorized_over_batched']['ratio']:.2f}",
                    flush=True,
                )
        tables.append(format_engines(results))
        report["settings"] = {
            "nodes": args.nodes,
            "models": args.models,
            "repeats": args.repeats,
            "torch_threads": args.threads,
            "algorithm": "dpsgd",
            "topology": "torus sqrt(N) x sqrt(N)",
            "mixing": "Metropolis-Hastings (fedcore.topology.prepare)",
            "dataset": "mnist1d",
            "partition": "iid",
            "batch_size": base.data.batch_size,
            "lr": base.algorithm.lr,
            "rounds_rule": f"messages and floor: max({SLOW_MIN_ROUNDS}, {SLOW_NODE_ROUNDS} // N); "
            f"vectorized and batched floor: max({FAST_MIN_ROUNDS}, {FAST_NODE_ROUNDS} // N)",
            "timed": "builds not timed; vectorized/floors after 1 untimed round on the same "
            "state; messages: network.run(R) on a fresh build_network, no observer",
            "ratios": "medians of seconds per node-round; pairs = per-repeat ratios",
            "targets": f"vectorized/batched <= {TARGET_VEC_OVER_BATCHED} at N >= 256; "
            f"messages/vectorized >= {TARGET_SPEEDUP_N256} at N = 256",
        }
        report["engines"] = results
    if args.dog10k:
        print("dog-10k (fresh subprocess per model):", flush=True)
        report["dog10k"] = dog10k(args.threads, args.timeout)
        tables.append(format_dog(report["dog10k"], "N"))
    if args.largest:
        print("largest N at >= 1 round/s (logreg, dog-10k settings):", flush=True)
        report["largest"] = largest(args.threads, args.timeout, args.largest_nodes)
        fast = [r for r in report["largest"] if "error" not in r and r["rounds_per_s"] >= 1.0]
        report["largest_n_at_1_round_per_s"] = max((r["nodes"] for r in fast), default=None)
        tables.append(format_dog(report["largest"], "N"))

    wall = time.perf_counter() - began
    info["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["wall_s"] = wall
    print()
    for t in tables:
        print(t)
        print()
    for line in verdicts(report):
        print(line)
    print(f"wall time {wall:.1f} s; load average at end {info['loadavg_end']}")
    _common.write_report(args.out, report)
    return 0


def verdicts(report: dict[str, Any]) -> list[str]:
    lines = []
    for r in report.get("engines", []):
        vb = r["vectorized_over_batched"]["ratio"]
        if r["nodes"] >= 256:
            ok = "meets" if vb <= TARGET_VEC_OVER_BATCHED else "MISSES"
            lines.append(
                f"N={r['nodes']} {r['model']}: vectorized/batched {vb:.2f} {ok} <= "
                f"{TARGET_VEC_OVER_BATCHED}"
            )
        mv = r["messages_over_vectorized"]
        if r["nodes"] == 256 and mv:
            ok = "meets" if mv["ratio"] >= TARGET_SPEEDUP_N256 else "MISSES"
            lines.append(
                f"N=256 {r['model']}: speed-up over messages {mv['ratio']:.1f}x {ok} >= "
                f"{TARGET_SPEEDUP_N256:.0f}x"
            )
    for r in report.get("dog10k", []):
        if r.get("model") == "logreg" and "error" not in r:
            ok = "meets" if r["rounds_per_s"] >= TARGET_DOG_ROUNDS_PER_S else "MISSES"
            lines.append(
                f"dog-10k logreg: {r['rounds_per_s']:.1f} rounds/s {ok} >= "
                f"{TARGET_DOG_ROUNDS_PER_S:.0f}"
            )
    if "largest" in report:
        lines.append(f"largest N at >= 1 round/s: {report['largest_n_at_1_round_per_s']}")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
