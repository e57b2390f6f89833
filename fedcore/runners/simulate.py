"""``fedcore simulate``: run a config in one process and write a results folder.

The folder holds ``config.toml`` (the effective config), ``metrics.jsonl`` (one
``"kind": "node"`` record per node per round and one ``"kind": "eval"`` record per
evaluation round), ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import torch

from fedcore.config import Config, config_to_dict, dumps_toml
from fedcore.data import Dataset
from fedcore.errors import ConfigError
from fedcore.ids import child_path
from fedcore.metrics import (
    JsonlWriter,
    evaluate_models,
    params_sha256,
    round_record,
    to_json_text,
)
from fedcore.models import Objective
from fedcore.node import Node, RoundRecord
from fedcore.progress import Progress
from fedcore.runners.network import Network, RunSetup, build_network, prepare_run
from fedcore.runners.regret import applies as regret_applies
from fedcore.runners.regret import regret_curve
from fedcore.runners.vectorized import (
    Flusher,
    VectorizedNetwork,
    node_records_mode,
    resolve_device,
    unsupported,
)
from fedcore.topology import spectral_gap

__all__ = [
    "MAX_GAP_NODES",
    "RunObserver",
    "choose_engine",
    "default_out_dir",
    "finish_run",
    "make_summary",
    "open_run_dir",
    "simulate",
    "write_results",
]

MAX_GAP_NODES = 2000
"""Largest graph whose spectral gap the summary computes (a dense eigensolver is O(n^3))."""

logger = logging.getLogger(__name__)


def default_out_dir(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``, with ``name`` made a safe folder name.

    The name comes from the run or the graph, and a graph file names itself: characters
    other than ASCII letters, digits, ``.``, ``_`` and ``-`` become ``_`` (so a name such
    as ``"../../x"`` stays one folder inside ``runs/``), and it is cut to 100 characters.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:100] or "run"
    return child_path(Path("runs"), f"{safe}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")


RUN_FILES = ("config.toml", "metrics.jsonl", "summary.json")
"""What a results folder holds; a folder with any of them holds a run."""


def open_run_dir(out_dir: str | Path | None, name: str, *, force: bool = False) -> Path:
    """The folder a run writes into, created.

    Without ``out_dir``: ``default_out_dir(name)``, created atomically; if another run
    took that name in the same second (two runs started together), ``-2``, ``-3``, ...
    is appended, so two runs never share a folder. With ``out_dir``: that folder, which
    must not hold another run's files unless ``force`` (then they are replaced).

    Raises:
        ConfigError: ``out_dir`` holds another run and ``force`` is false.
    """
    if out_dir is None:
        base = default_out_dir(name)
        base.parent.mkdir(parents=True, exist_ok=True)
        for k in range(1, 10_000):
            candidate = base if k == 1 else base.with_name(f"{base.name}-{k}")
            try:
                candidate.mkdir()
            except FileExistsError:
                continue
            return candidate
        raise ConfigError(f"could not find a free results folder beside {base}; give --out.")
    out = Path(out_dir)
    held = [f for f in RUN_FILES if (out / f).exists()]
    if held and not force:
        raise ConfigError(
            f"results folder {str(out)!r} holds another run ({', '.join(held)}); give another "
            "--out, or --force to replace it."
        )
    for f in held:
        (out / f).unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


class RunObserver:
    """Collects node records into metrics, evaluation records and progress.

    Evaluation happens at every ``eval_every``-th round and at the last round, once
    every node has reported that round: models are snapshotted as each node finishes
    the round, so nodes running ahead do not skew the evaluation.
    """

    def __init__(
        self,
        *,
        nodes: Sequence[str],
        config: Config,
        evaluator: Objective,
        dataset: Dataset,
        writer: JsonlWriter | None,
        progress: Progress | None,
        records: str = "all",
    ) -> None:
        """Expect one record per node of ``nodes`` per round of ``config``; write them to
        ``writer`` as ``records`` says (``all``, ``eval``: on evaluation rounds, ``none``)."""
        self.nodes = tuple(nodes)
        self.records = records
        self.n = len(self.nodes)
        self.rounds = config.run.rounds
        self.eval_every = config.run.eval_every
        self.evaluator = evaluator
        self.dataset = dataset
        self.writer = writer
        self.progress = progress
        self.evals: list[dict[str, Any]] = []
        self.totals = {
            "messages_sent": 0,
            "bytes_sent": 0,
            "messages_received": 0,
            "messages_missing": 0,
            "messages_late": 0,
            "messages_rejected": 0,
            "messages_dropped": 0,
            "fp32_bytes_sent": 0,
        }
        self.loss_sum = 0.0  # over completed rounds only, so it is exact at each evaluation
        self.loss_count = 0
        self.missing: dict[str, set[int]] = {}
        # None: the node was down that round (a diverged node's NaN losses stay NaN)
        # (grown as rounds arrive: a run of many rounds allocates nothing up front)
        self.losses: dict[str, list[float | None]] = {n: [] for n in self.nodes}
        self.missing_edges: dict[str, int] = {}
        self.dropped_edges: dict[str, int] = {}
        self.down: dict[str, list[int]] = {}
        self._round_loss: dict[int, list[float | None]] = {}
        self._round_bytes: dict[int, int] = {}
        # messages sent, missing and dropped in each round not yet complete
        self._round_counts: dict[int, list[int]] = {}
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._bytes_done = 0
        self._last_acc: float | None = None

    def is_eval_round(self, t: int) -> bool:
        """Whether round ``t`` (0-based) ends with an evaluation."""
        return (t + 1) % self.eval_every == 0 or t + 1 == self.rounds

    def attach(self, network: Network) -> None:
        """Observe every node of an in-process network."""
        for node in network.nodes.values():
            node.observer = self._on_node

    def _on_node(self, node: Node, record: RoundRecord) -> None:
        model = node.model().detach().clone() if self.is_eval_round(record.round) else None
        self.observe(record, model)

    def observe(self, record: RoundRecord, model: torch.Tensor | None) -> None:
        """Account one node's round; ``model`` is its parameters on evaluation rounds."""
        t = record.round
        if self.writer is not None and (
            self.records == "all" or (self.records == "eval" and self.is_eval_round(t))
        ):
            self.writer.write(record.to_json())
        for key in self.totals:
            self.totals[key] += getattr(record, key)
        for sender in record.missing:
            self.missing.setdefault(sender, set()).add(t)
            edge = f"{sender}->{record.node}"
            self.missing_edges[edge] = self.missing_edges.get(edge, 0) + 1
        for receiver in record.dropped_out:
            edge = f"{record.node}->{receiver}"
            self.dropped_edges[edge] = self.dropped_edges.get(edge, 0) + 1
        if record.down:
            self.down.setdefault(record.node, []).append(t)
        losses = self.losses[record.node]
        if len(losses) <= t:
            losses.extend([None] * (t + 1 - len(losses)))
        losses[t] = None if record.down else record.loss
        self._round_loss.setdefault(t, []).append(None if record.down else record.loss)
        self._round_bytes[t] = self._round_bytes.get(t, 0) + record.bytes_sent
        counts = self._round_counts.setdefault(t, [0, 0, 0])
        counts[0] += record.messages_sent
        counts[1] += record.messages_missing
        counts[2] += record.messages_dropped
        if model is not None:
            self._snapshots.setdefault(t, {})[record.node] = model
        if len(self._round_loss[t]) == self.n:
            self._round_complete(t)

    def _round_complete(self, t: int) -> None:
        losses = [x for x in self._round_loss.pop(t) if x is not None]  # not down nodes
        round_bytes = self._round_bytes.pop(t)
        self._bytes_done += round_bytes
        sent, missing, dropped = self._round_counts.pop(t)
        train_loss = sum(losses) / len(losses) if losses else math.nan
        if self.writer is not None:
            self.writer.write(
                round_record(
                    t,
                    train_loss=train_loss,
                    nodes_up=len(losses),
                    messages_sent=sent,
                    bytes_sent=round_bytes,
                    messages_missing=missing,
                    messages_dropped=dropped,
                )
            )
        self.loss_sum += sum(losses)
        self.loss_count += len(losses)
        snapshots = self._snapshots.pop(t, None)
        if snapshots is not None and len(snapshots) == self.n:
            ordered = {nid: snapshots[nid] for nid in self.nodes}
            result = evaluate_models(
                self.evaluator, ordered, self.dataset.x_test, self.dataset.y_test
            )
            record: dict[str, Any] = {
                "kind": "eval",
                "round": t,
                "train_loss": train_loss,
                "average_loss": self.loss_sum / self.loss_count,
                "bytes_sent_per_node": self._bytes_done / self.n,
                **result,
            }
            self.evals.append(record)
            self._last_acc = result["avg_model_accuracy"]
            if self.writer is not None:
                self.writer.write(record)
                self.writer.flush()
        if self.progress is not None:
            self.progress.update(t + 1, loss=train_loss, accuracy=self._last_acc)


def choose_engine(setup: RunSetup, engine: str) -> tuple[str, str | None]:
    """``(engine, why)``: the engine that runs ``setup`` and, when ``auto`` fell back to
    the message engine, why (one clause).

    Raises:
        ConfigError: ``vectorized`` was asked for and cannot run the config.
    """
    if engine == "messages":
        return "messages", None
    reason = unsupported(setup)
    if reason is None:
        return "vectorized", None
    if engine == "vectorized":
        raise ConfigError(
            f"simulate.engine = 'vectorized' cannot run this config: {reason}. Use "
            "simulate.engine = 'messages' (or 'auto')."
        )
    return "messages", reason


def simulate(
    config: Config,
    *,
    out_dir: str | Path | None = None,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """Run ``config`` in one process; write the results folder; return the summary.

    The engine is ``config.simulate.engine`` (see :class:`~fedcore.config.SimulateConfig`);
    the summary's ``engine`` says which ran.

    Args:
        config: The experiment.
        out_dir: Results folder (default ``runs/<name>-<timestamp>``, never one another
            run uses: see :func:`open_run_dir`).
        progress_stream: Where progress goes (default stderr).
        show_progress: Whether to show progress at all (and the engine note).
        force: Replace the run files an existing ``out_dir`` holds.

    Raises:
        ConfigError, TopologyError, DataError: invalid experiment (before any work).
        TransportTimeoutError: a strict-mode node waited too long.
    """
    rounds = config.run.rounds
    setup = prepare_run(config)
    engine, why = choose_engine(setup, config.simulate.engine)
    stream = progress_stream if progress_stream is not None else sys.stderr
    if why is not None:
        logger.info("engine: messages (%s)", why)
        if show_progress:
            print(f"simulate: engine 'messages' ({why})", file=stream, flush=True)
    network: Network | None = None
    vectorized: VectorizedNetwork | None = None
    if engine == "vectorized":
        vectorized = VectorizedNetwork(setup, device=resolve_device(config.simulate.device))
        nodes: Sequence[str] = vectorized.nodes
    else:
        network = build_network(config, setup=setup)
        nodes = list(network.nodes)
    progress = Progress(rounds, label="simulate", stream=stream) if show_progress else None
    name = config.run.name or f"{setup.algorithm.name}-{setup.trust.name}"
    out = open_run_dir(out_dir, name, force=force)
    (out / "config.toml").write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
    writer = JsonlWriter(out / "metrics.jsonl")
    observer = RunObserver(
        nodes=nodes,
        config=config,
        evaluator=setup.evaluator,
        dataset=setup.dataset,
        writer=writer,
        progress=progress,
        records=node_records_mode(config, len(nodes)),
    )
    logger.info(
        "run %s: %d nodes, %d rounds, engine %s, results in %s",
        name,
        observer.n,
        rounds,
        engine,
        out,
    )
    began = time.perf_counter()
    try:
        if network is not None:
            observer.attach(network)
            network.run(rounds)
            final = {nid: node.model() for nid, node in network.nodes.items()}
        else:
            assert vectorized is not None
            final = run_vectorized(vectorized, observer, writer, progress)
    finally:
        writer.close()
    wall = time.perf_counter() - began
    # The same keys on both engines: the message engine runs one module per node on the CPU.
    extra: dict[str, Any] = {"engine": engine, "device": "cpu", "gradients": "per-node"}
    if vectorized is not None:
        extra["device"] = str(vectorized.device)
        extra["gradients"] = vectorized.objective.mode
    summary = finish_run(
        setup,
        observer,
        out,
        name=name,
        transport="inproc",
        wall_seconds=wall,
        final_params=final,
        extra=extra,
    )
    summary["out_dir"] = str(out)
    return summary


def run_vectorized(
    net: VectorizedNetwork,
    observer: RunObserver,
    writer: JsonlWriter | None,
    progress: Progress | None,
) -> dict[str, torch.Tensor]:
    """Run every round of a :class:`~fedcore.runners.vectorized.VectorizedNetwork`,
    accounting into ``observer``; return every node's final parameters (on the CPU)."""
    flusher = Flusher(
        net, observer=observer, writer=writer, records=observer.records, progress=progress
    )
    while net.round < observer.rounds:
        flusher.add(net.run_round())
    flusher.flush()
    missing, dropped = net.fault_counts()
    observer.missing_edges.update(missing)
    observer.dropped_edges.update(dropped)
    final = net.model().cpu()
    return {nid: final[i] for i, nid in enumerate(net.nodes)}


def finish_run(
    setup: RunSetup,
    observer: RunObserver,
    out: Path,
    *,
    name: str,
    transport: str,
    wall_seconds: float,
    final_params: Mapping[str, torch.Tensor],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The end of every run, whatever its transport: the regret (``run.regret``),
    ``summary.json`` (with ``extra`` keys) and ``curves.png``; returns the summary."""
    regret = add_regret(setup, observer, out)
    summary = make_summary(
        setup,
        name=name,
        transport=transport,
        wall_seconds=wall_seconds,
        observer=observer,
        final_params=final_params,
        regret=regret,
    )
    summary.update(extra or {})
    write_results(out, summary)
    return summary


def add_regret(setup: RunSetup, observer: RunObserver, out: Path) -> list[dict[str, Any]] | None:
    """The regret curve of a finished run (``run.regret``, convex models), appended to
    ``metrics.jsonl`` as ``"kind": "regret"`` records; None where it is not computed."""
    if not (setup.config.run.regret and regret_applies(setup)):
        return None
    began = time.perf_counter()
    rounds = observer.rounds  # a round a node never reported counts as down, as before
    losses = {n: row + [None] * (rounds - len(row)) for n, row in observer.losses.items()}
    curve = regret_curve(setup, losses, [e["round"] for e in observer.evals])
    writer = JsonlWriter(out / "metrics.jsonl", append=True)
    try:
        for record in curve:
            writer.write(record)
    finally:
        writer.close()
    logger.info("regret computed in %.1f s", time.perf_counter() - began)
    return curve


def write_results(out: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` and draw ``curves.png`` into a finished run's folder."""
    (out / "summary.json").write_text(to_json_text(summary, indent=2) + "\n", encoding="utf-8")
    try:
        from fedcore.plotting import plot_runs

        plot_runs([out], out / "curves.png")
    except Exception as exc:  # a missing picture must not lose a finished run
        logger.warning("could not draw curves.png: %s", exc)


def _ranges(rounds: Sequence[int]) -> list[list[int]]:
    """Sorted rounds as inclusive ``[first, last]`` runs: [3, 4, 5, 9] -> [[3, 5], [9, 9]]."""
    out: list[list[int]] = []
    for r in rounds:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def make_summary(
    setup: RunSetup,
    *,
    name: str,
    transport: str,
    wall_seconds: float,
    observer: RunObserver,
    final_params: Mapping[str, torch.Tensor],
    regret: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` content of a finished run (the same for every transport)."""
    config, graph = setup.config, setup.graph
    n = observer.n
    rounds = config.run.rounds
    final = dict(observer.evals[-1])  # the last round always evaluates
    for key in ("kind", "round", "bytes_sent_per_node"):
        final.pop(key, None)
    if regret:
        last = regret[-1]
        for key in (
            "static_regret",
            "dynamic_regret",
            "average_static_regret",
            "average_dynamic_regret",
        ):
            final[key] = last[key]
    totals = observer.totals
    return {
        "name": name,
        "algorithm": setup.algorithm.name,
        "transport": transport,
        "nodes": n,
        "rounds": rounds,
        "wall_seconds": wall_seconds,
        "run_id": setup.run_id,
        "topology": {
            "name": setup.trust.name,
            "communication_graph": graph.name,
            # O(n^3): skipped (null) on graphs too large for a dense eigensolver.
            "spectral_gap": spectral_gap(graph) if len(graph.nodes) <= MAX_GAP_NODES else None,
            "period": graph.period,
        },
        "final": final,
        "traffic": {
            "bytes_sent": totals["bytes_sent"],
            "messages_sent": totals["messages_sent"],
            "messages_missing": totals["messages_missing"],
            "messages_dropped": totals["messages_dropped"],
            "messages_late": totals["messages_late"],
            "messages_rejected": totals["messages_rejected"],
            "bytes_per_node_per_round": totals["bytes_sent"] / (n * rounds),
            "codec": config.compression.codec,
            # What float32 would have taken for the same tensors, over what was sent
            # (payload bytes, headers excluded).
            "compression_ratio_vs_fp32": (
                totals["fp32_bytes_sent"] / totals["bytes_sent"] if totals["bytes_sent"] else None
            ),
        },
        "missing_rounds": {
            sender: _ranges(sorted(rounds)) for sender, rounds in sorted(observer.missing.items())
        },
        "faults": {
            "lost_per_edge": dict(sorted(observer.dropped_edges.items())),
            "missing_per_edge": dict(sorted(observer.missing_edges.items())),
            "down_rounds": {n: _ranges(r) for n, r in sorted(observer.down.items())},
        },
        "params_sha256": {nid: params_sha256(final_params[nid]) for nid in observer.nodes},
        "regret": [{k: v for k, v in r.items() if k != "kind"} for r in regret or []],
    }
