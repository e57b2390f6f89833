"""A finished run's ``summary.json`` (the same for every engine and transport: final
figures, step size, graph, traffic, faults, virtual time, parameter digests, regret) and
the writing of it and of ``curves.png``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fedcore.config import NODE_MAPS_NODES, Config
from fedcore.metrics import all_params_sha256, params_sha256, to_json_text, write_text_atomic
from fedcore.setup.prepare import RunSetup
from fedcore.topology import spectral_gap

if TYPE_CHECKING:
    from fedcore.simulation.results import RunObserver

__all__ = ["MAX_GAP_NODES", "make_summary", "write_results"]

logger = logging.getLogger(__name__)

MAX_GAP_NODES = 2000
"""Largest graph whose spectral gap the summary computes (a dense eigensolver is O(n^3))."""


def write_results(out: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` and draw ``curves.png`` into a finished run's folder."""
    write_text_atomic(out / "summary.json", to_json_text(summary, indent=2) + "\n")
    if not summary["final"]:
        return  # no evaluation yet: nothing to draw
    try:
        from fedcore.plotting import plot_runs

        plot_runs([out], out / "curves.png")
    except Exception as exc:  # a missing picture must not lose a finished run
        logger.warning("could not draw curves.png: %s", exc)


def _digests(final: Mapping[str, torch.Tensor], nodes: Sequence[str]) -> dict[str, Any]:
    """``params_sha256``: each node's final parameters' digest; above
    :data:`~fedcore.config.NODE_MAPS_NODES` nodes, ``params_sha256_all`` instead: one digest
    of every node's, in node order."""
    if len(nodes) <= NODE_MAPS_NODES:
        return {"params_sha256": {nid: params_sha256(final[nid]) for nid in nodes}}
    return {"params_sha256_all": all_params_sha256(final[nid] for nid in nodes)}


def _time_figures(config: Config, observer: RunObserver) -> dict[str, Any]:
    """The summary's virtual time (``virtual_seconds``, each node's ``utilisation``: the
    share of the run's virtual time it computed) and ``time_to_target`` (the first
    evaluation at ``run.target_accuracy``: its round, counted from 0 as in the records,
    virtual seconds, accuracy; ``null`` if never reached; the results table prints the
    same round); each only where the run has it."""
    out: dict[str, Any] = {}
    if observer.vtime is not None:
        span = observer.vtime
        shares = {
            n: (observer.busy.get(n, 0.0) / span if span > 0 else None) for n in observer.nodes
        }
        known = [v for v in shares.values() if v is not None]
        out["time"] = {
            "virtual_seconds": span,
            "mean_utilisation": sum(known) / len(known) if known else None,
            "min_utilisation": min(known) if known else None,
        }
        if len(observer.nodes) <= NODE_MAPS_NODES:
            out["time"]["utilisation"] = shares
    if config.run.target_accuracy > 0:
        out["target_accuracy"] = config.run.target_accuracy
        out["time_to_target"] = observer.target_hit
    return out


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
    # The last round always evaluates; a run stopped early has the last evaluation it
    # reached (or none).
    final = dict(observer.evals[-1]) if observer.evals else {}
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
        # The step size as used: after algorithm.lr_scaling for the batch size.
        "step_size": {
            "lr": setup.options.lr,
            "schedule": setup.options.lr_schedule,
            "warmup_rounds": setup.options.warmup_rounds,
            "lr_power": setup.options.lr_power,
            "lr_scaling": config.algorithm.lr_scaling,
        },
        # The node optimizer and the options it took ("sgd" alone: the plain step).
        "optimizer": {"name": config.optimizer.name, **config.optimizer.options()},
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
            "bytes_per_node_per_round": totals["bytes_sent"] / (n * max(1, observer.rounds_done)),
            # run.local_steps optimizer steps a round: the bytes each step costs.
            "local_steps": config.run.local_steps,
            "bytes_per_node_per_local_step": totals["bytes_sent"]
            / (n * max(1, observer.rounds_done) * config.run.local_steps),
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
        **_time_figures(config, observer),
        **_digests(final_params, observer.nodes),
        "regret": [{k: v for k, v in r.items() if k != "kind"} for r in regret or []],
    }
