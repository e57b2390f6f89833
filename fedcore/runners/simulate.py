"""``fedcore simulate``: run a config in one process and write a results folder.

The folder holds ``config.toml`` (the effective config), ``metrics.jsonl`` (one
``"kind": "node"`` record per node per round and one ``"kind": "eval"`` record per
evaluation round), ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import torch

from fedcore.config import Config, config_to_dict, dumps_toml
from fedcore.metrics import JsonlWriter, evaluate_models, params_sha256
from fedcore.node import Node, RoundRecord
from fedcore.progress import Progress
from fedcore.runners.network import Network, build_network
from fedcore.topology import spectral_gap

__all__ = ["MAX_GAP_NODES", "RunObserver", "default_out_dir", "make_summary", "simulate"]

MAX_GAP_NODES = 2000
"""Largest graph whose spectral gap the summary computes (a dense eigensolver is O(n^3))."""

logger = logging.getLogger(__name__)


def default_out_dir(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``."""
    return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


class RunObserver:
    """Collects node records into metrics, evaluation records and progress.

    Evaluation happens at every ``eval_every``-th round and at the last round, once
    every node has reported that round: models are snapshotted as each node finishes
    the round, so nodes running ahead do not skew the evaluation.
    """

    def __init__(
        self, network: Network, *, writer: JsonlWriter | None, progress: Progress | None
    ) -> None:
        """Attach to every node of ``network``."""
        self.network = network
        self.n = len(network.nodes)
        self.rounds = network.config.run.rounds
        self.eval_every = network.config.run.eval_every
        self.writer = writer
        self.progress = progress
        for node in network.nodes.values():
            node.observer = self
        self.evals: list[dict[str, Any]] = []
        self.totals = {
            "messages_sent": 0,
            "bytes_sent": 0,
            "messages_received": 0,
            "messages_missing": 0,
            "messages_late": 0,
            "messages_rejected": 0,
        }
        self.loss_sum = 0.0  # over completed rounds only, so it is exact at each evaluation
        self.loss_count = 0
        self.missing: dict[str, list[int]] = {}
        self._round_loss: dict[int, list[float]] = {}
        self._round_bytes: dict[int, int] = {}
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._bytes_done = 0
        self._last_acc: float | None = None

    def is_eval_round(self, t: int) -> bool:
        """Whether round ``t`` (0-based) ends with an evaluation."""
        return (t + 1) % self.eval_every == 0 or t + 1 == self.rounds

    def __call__(self, node: Node, record: RoundRecord) -> None:
        """Account one node's round."""
        t = record.round
        if self.writer is not None:
            line = asdict(record)
            line["kind"] = "node"
            line["missing"] = list(record.missing)
            self.writer.write(line)
        for key in self.totals:
            self.totals[key] += getattr(record, key)
        for sender in record.missing:
            self.missing.setdefault(sender, []).append(t)
        self._round_loss.setdefault(t, []).append(record.loss)
        self._round_bytes[t] = self._round_bytes.get(t, 0) + record.bytes_sent
        if self.is_eval_round(t):
            self._snapshots.setdefault(t, {})[node.id] = node.model().detach().clone()
        if len(self._round_loss[t]) == self.n:
            self._round_complete(t)

    def _round_complete(self, t: int) -> None:
        losses = self._round_loss.pop(t)
        self._bytes_done += self._round_bytes.pop(t)
        train_loss = sum(losses) / len(losses)
        self.loss_sum += sum(losses)
        self.loss_count += len(losses)
        snapshots = self._snapshots.pop(t, None)
        if snapshots is not None:
            net = self.network
            ordered = {nid: snapshots[nid] for nid in net.nodes}
            result = evaluate_models(net.evaluator, ordered, net.dataset.x_test, net.dataset.y_test)
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


def simulate(
    config: Config,
    *,
    out_dir: str | Path | None = None,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run ``config`` in one process; write the results folder; return the summary.

    Args:
        config: The experiment.
        out_dir: Results folder (default ``runs/<name>-<timestamp>``).
        progress_stream: Where progress goes (default stderr).
        show_progress: Whether to show progress at all.

    Raises:
        ConfigError, TopologyError, DataError: invalid experiment (before any work).
        TransportTimeoutError: a strict-mode node waited too long.
    """
    rounds = config.run.rounds
    progress = Progress(rounds, label="simulate", stream=progress_stream) if show_progress else None
    network = build_network(config)
    name = config.run.name or f"{network.algorithm.name}-{network.trust.name}"
    out = Path(out_dir) if out_dir is not None else default_out_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
    writer = JsonlWriter(out / "metrics.jsonl")
    observer = RunObserver(network, writer=writer, progress=progress)
    logger.info("run %s: %d nodes, %d rounds, results in %s", name, observer.n, rounds, out)
    began = time.perf_counter()
    try:
        network.run(rounds)
    finally:
        writer.close()
    wall = time.perf_counter() - began
    summary = make_summary(network, observer, name=name, wall_seconds=wall, transport="inproc")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    try:
        from fedcore.plotting import plot_runs

        plot_runs([out], out / "curves.png")
    except Exception as exc:  # a missing picture must not lose a finished run
        logger.warning("could not draw curves.png: %s", exc)
    summary["out_dir"] = str(out)
    return summary


def make_summary(
    network: Network, observer: RunObserver, *, name: str, wall_seconds: float, transport: str
) -> dict[str, Any]:
    """The ``summary.json`` content of a finished run."""
    n = len(network.nodes)
    rounds = network.config.run.rounds
    final = dict(observer.evals[-1])  # the last round always evaluates
    for key in ("kind", "round", "bytes_sent_per_node"):
        final.pop(key, None)
    n_graph = len(network.graph.nodes)
    totals = observer.totals
    return {
        "name": name,
        "algorithm": network.algorithm.name,
        "transport": transport,
        "nodes": n,
        "rounds": rounds,
        "wall_seconds": wall_seconds,
        "run_id": network.run_id,
        "topology": {
            "name": network.trust.name,
            "communication_graph": network.graph.name,
            # O(n^3): skipped (null) on graphs too large for a dense eigensolver.
            "spectral_gap": spectral_gap(network.graph) if n_graph <= MAX_GAP_NODES else None,
            "period": network.graph.period,
        },
        "final": final,
        "traffic": {
            "bytes_sent": totals["bytes_sent"],
            "messages_sent": totals["messages_sent"],
            "messages_dropped": totals["messages_missing"],
            "messages_late": totals["messages_late"],
            "messages_rejected": totals["messages_rejected"],
            "bytes_per_node_per_round": totals["bytes_sent"] / (n * rounds),
        },
        "missing_rounds": observer.missing,
        "params_sha256": {nid: params_sha256(node.model()) for nid, node in network.nodes.items()},
    }
