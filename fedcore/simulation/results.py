"""A run's results folder and records, whatever ran it (``simulate`` on either engine,
``launch`` and ``summarize`` over gRPC peers).

The folder holds ``config.toml`` (the effective config), ``metrics.jsonl`` (one
``"kind": "node"`` record per node per round and one ``"kind": "eval"`` record per
evaluation round), ``summary.json``, ``curves.png``, with ``run.checkpoint_every``
``checkpoints/``, and with ``run.tensorboard`` / ``run.csv`` ``tensorboard/`` /
``rounds.csv`` (:mod:`fedcore.simulation.tracking`).
:class:`~fedcore.simulation.observer.RunObserver` collects the records as rounds end
(every round of every engine and of ``launch`` passes through its
:meth:`~fedcore.simulation.observer.RunObserver.end_round`); :func:`finish_run` adds the
regret, says whether the run is diverging
(:meth:`~fedcore.simulation.observer.RunObserver.diverging`) and writes the summary and
the curves.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from fedcore.algorithms.user import is_import_path
from fedcore.config import NODE_MAPS_NODES, TRACKING_KEYS, Config
from fedcore.errors import ConfigError
from fedcore.ids import child_path
from fedcore.metrics import (
    JsonlWriter,
    ParamDigests,
    all_params_sha256,
    params_sha256,
    to_json_text,
    write_text_atomic,
)
from fedcore.setup.prepare import RunSetup
from fedcore.simulation.observer import RunObserver
from fedcore.simulation.personal import personal_figures
from fedcore.simulation.regret import RegretTracker
from fedcore.simulation.regret import applies as regret_applies
from fedcore.simulation.tracking import CSV_FILE, TENSORBOARD_DIR
from fedcore.topology import spectral_gap

__all__ = [
    "CHECKPOINTS",
    "MANIFEST",
    "MAX_GAP_NODES",
    "RUN_FILES",
    "add_regret",
    "default_out_dir",
    "finish_run",
    "make_summary",
    "name_part",
    "named_run",
    "open_run_dir",
    "regret_tracker",
    "run_name",
    "write_results",
]

logger = logging.getLogger(__name__)


MAX_GAP_NODES = 2000
"""Largest graph whose spectral gap the summary computes (a dense eigensolver is O(n^3))."""


NAME_SKIPS = ("run.name", "simulate.", "data.root", *(f"run.{key}" for key in TRACKING_KEYS))
"""Overrides that do not name a run: the name itself, how a run is simulated, where its
data's files are, and what it writes beside its records (``run.tensorboard``,
``run.csv``)."""


def run_name(config: Config, setup: RunSetup, overrides: Sequence[str] = ()) -> str:
    """The run's name: ``run.name`` when ``--set``/``--name`` gave it; otherwise the
    file's ``run.name`` (or ``<algorithm>-<topology>``) followed by what ``--set``
    changed, e.g. ``online-ops-social64-algorithm.name=dol``, so runs that differ by an
    override can be told apart.
    """
    algorithm = setup.algorithm.name
    return named_run(config, algorithm, f"{algorithm}-{setup.trust.name}", overrides)


def named_run(config: Config, algorithm: str, default: str, overrides: Sequence[str] = ()) -> str:
    """:func:`run_name` of a run of ``algorithm`` (its name, for :func:`name_part`), with
    ``default`` where the config names no run (the cohort engine builds no graph to name:
    ``<algorithm>-star-<N>``)."""
    keys = [item.partition("=")[0].strip() for item in overrides]
    if "run.name" in keys and config.run.name:
        return config.run.name
    base = config.run.name or default
    changed = [
        name_part(item, algorithm)
        for item, key in zip(overrides, keys, strict=True)
        if not key.startswith(NAME_SKIPS)
    ]
    return "-".join([base, *changed])


def name_part(item: str, algorithm: str) -> str:
    """``--set`` ``item`` as part of a run's name: ``key=value``; a user's algorithm by its
    own name, not its import path (``algorithm.name=momentum-gossip``, not
    ``algorithm.name=momentum_gossip:MomentumGossip``)."""
    key, value = (part.strip() for part in item.partition("=")[::2])
    if key == "algorithm.name" and is_import_path(value):
        value = algorithm
    return f"{key}={value}"


def default_out_dir(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``, with ``name`` made a safe folder name.

    The name comes from the run or the graph, and a graph file names itself: characters
    other than ASCII letters, digits, ``.``, ``_``, ``=`` and ``-`` become ``_`` (so a
    name such as ``"../../x"`` stays one folder inside ``runs/``), and it is cut to 100
    characters.
    """
    safe = re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("._=-")[:100] or "run"
    return child_path(Path("runs"), f"{safe}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")


CHECKPOINTS = "checkpoints"
"""The folder of a run's checkpoints (every ``run.checkpoint_every`` rounds)."""

MANIFEST = "manifest.json"
"""A sharded run's manifest in its checkpoints folder
(:mod:`fedcore.simulation.rank_checkpoints`)."""


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
    if force:  # the replaced run's checkpoints, picture and tracking files go with it
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
        shutil.rmtree(out / TENSORBOARD_DIR, ignore_errors=True)
        (out / "curves.png").unlink(missing_ok=True)
        (out / CSV_FILE).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


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
    status: str = "completed",
    error: str | None = None,
) -> dict[str, Any]:
    """The end of every run, whatever its transport: the regret (``run.regret``, of a
    completed run only), ``summary.json`` (with ``extra`` keys) and ``curves.png``;
    returns the summary.

    ``status`` is ``completed``, ``interrupted`` (Ctrl-C, SIGTERM, peers stopped) or
    ``failed`` (``error`` says why); the summary's ``rounds_completed`` says how far the
    run got and its figures are those of the last evaluation reached. A completed run with
    ``[personal]`` has the ``personal`` block (:mod:`fedcore.simulation.personal`).
    """
    regret = add_regret(setup, observer, out) if status == "completed" else None
    if observer.tracker is not None:
        for record in regret or []:
            observer.tracker.regret(record)
        observer.tracker.close()
    summary = make_summary(
        setup,
        name=name,
        transport=transport,
        wall_seconds=wall_seconds,
        observer=observer,
        final_params=final_params,
        regret=regret,
    )
    summary["status"] = status
    summary["rounds_completed"] = observer.rounds_done
    diverging, why = observer.diverging()
    summary["diverging"] = diverging
    if diverging:
        logger.warning(
            "the run is diverging: %s; try a smaller algorithm.lr (it was %g).",
            why,
            setup.config.algorithm.lr,
        )
    if error is not None:
        summary["error"] = error
    if status == "completed" and setup.config.personal.active:
        summary["personal"] = personal_figures(
            setup,
            final_params,
            nodes=observer.nodes,
            server=observer.server,
            liars=observer.liars,
            sample=observer.sample,
        )
    summary.update(extra or {})
    write_results(out, summary)
    return summary


def regret_tracker(setup: RunSetup) -> RegretTracker | None:
    """The tracker that computes a run's regret curve as it goes (``run.regret``, convex
    models), or None where no curve is computed."""
    if not (setup.config.run.regret and regret_applies(setup)):
        return None
    return RegretTracker(setup)


def add_regret(setup: RunSetup, observer: RunObserver, out: Path) -> list[dict[str, Any]] | None:
    """The regret curve of a finished run (``run.regret``, convex models), appended to
    ``metrics.jsonl`` as ``"kind": "regret"`` records; None where it is not computed.

    A simulated run's observer has brought its curve up to every evaluation already (this
    accounts nothing twice); the runs of ``fedcore launch``, whose records are read back
    after the run, compute it here, the same way."""
    tracker = observer.regret if observer.regret is not None else regret_tracker(setup)
    if tracker is None:
        return None
    began = time.perf_counter()
    rounds = observer.rounds  # a round a node never reported counts as down, as before
    losses = {n: row + [None] * (rounds - len(row)) for n, row in observer.losses.items()}
    curve = list(tracker.update(losses, [e["round"] for e in observer.evals]))
    writer = JsonlWriter(out / "metrics.jsonl", append=True)
    try:
        for record in curve:
            writer.write(record)
    finally:
        writer.close()
    logger.info(
        "regret computed in %.1f s (%.1f s at the end of the run)",
        tracker.seconds,
        time.perf_counter() - began,
    )
    return curve


def write_results(out: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` and draw ``curves.png`` into a finished run's folder."""
    write_text_atomic(out / "summary.json", to_json_text(summary, indent=2) + "\n")
    if not summary["final"]:
        return  # no evaluation yet: nothing to draw
    try:
        from fedcore import plotting
        from fedcore.plotting.figure import recycling

        with recycling():  # a sweep's next run draws on this run's figure: the same bytes
            plotting.plot_runs([out], out / "curves.png")
    except Exception as exc:  # a missing picture must not lose a finished run
        logger.warning("could not draw curves.png: %s", exc)


def _digests(final: Mapping[str, torch.Tensor], nodes: Sequence[str]) -> dict[str, Any]:
    """``params_sha256``: each node's final parameters' digest; above
    :data:`~fedcore.config.NODE_MAPS_NODES` nodes, ``params_sha256_all`` instead: one digest
    of every node's, in node order (or the digests hashed where the parameters are)."""
    if isinstance(final, ParamDigests):
        return dict(final.digests)
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
        # A private run's epsilon after the rounds done ([privacy]; fedcore.privacy.plan).
        **({"privacy": setup.privacy.report(observer.rounds_done)} if setup.privacy else {}),
        **_digests(final_params, observer.nodes),
        "regret": [{k: v for k, v in r.items() if k != "kind"} for r in regret or []],
    }
