"""``fedcore simulate``: run a config in one process and write a results folder.

The folder holds ``config.toml`` (the effective config), ``metrics.jsonl`` (one
``"kind": "node"`` record per node per round and one ``"kind": "eval"`` record per
evaluation round), ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import torch

from fedcore.algorithms.user import is_import_path
from fedcore.config import NODE_MAPS_NODES, Config, config_to_dict, dumps_toml, load_config
from fedcore.data import Dataset
from fedcore.engines.messages import Network, build_network
from fedcore.engines.vectorized import (
    Flusher,
    VectorizedNetwork,
    node_records_mode,
    resolve_device,
    unsupported,
)
from fedcore.errors import ConfigError
from fedcore.ids import child_path, first_line
from fedcore.metrics import (
    JsonlWriter,
    all_params_sha256,
    evaluate_models,
    params_sha256,
    round_record,
    to_json_text,
    write_text_atomic,
)
from fedcore.models import Objective
from fedcore.node import Node, RoundRecord
from fedcore.progress import Progress, announce_if_slow
from fedcore.setup import checkpoint
from fedcore.setup.plan import planned_nodes
from fedcore.setup.prepare import RunSetup, prepare_run, seed_torch
from fedcore.simulation.regret import RegretTracker
from fedcore.simulation.regret import applies as regret_applies
from fedcore.topology import spectral_gap

__all__ = [
    "MAX_GAP_NODES",
    "RunObserver",
    "choose_engine",
    "default_out_dir",
    "finish_run",
    "make_summary",
    "name_part",
    "open_run_dir",
    "resume",
    "run_name",
    "simulate",
    "write_results",
]

MAX_GAP_NODES = 2000
"""Largest graph whose spectral gap the summary computes (a dense eigensolver is O(n^3))."""

logger = logging.getLogger(__name__)


NAME_SKIPS = ("run.name", "simulate.")
"""Overrides that do not name a run: the name itself, and how a run is simulated."""


def run_name(config: Config, setup: RunSetup, overrides: Sequence[str] = ()) -> str:
    """The run's name: ``run.name`` when ``--set``/``--name`` gave it; otherwise the
    file's ``run.name`` (or ``<algorithm>-<topology>``) followed by what ``--set``
    changed, e.g. ``online-ops-social64-algorithm.name=dol``, so runs that differ by an
    override can be told apart.
    """
    keys = [item.partition("=")[0].strip() for item in overrides]
    if "run.name" in keys and config.run.name:
        return config.run.name
    base = config.run.name or f"{setup.algorithm.name}-{setup.trust.name}"
    changed = [
        name_part(item, setup.algorithm.name)
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
    if force:  # the replaced run's checkpoints and picture go with it
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
        (out / "curves.png").unlink(missing_ok=True)
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
        server: str | None = None,
        regret: RegretTracker | None = None,
    ) -> None:
        """Expect one record per node of ``nodes`` per round of ``config``; write them to
        ``writer`` as ``records`` says (``all``, ``eval``: on evaluation rounds, ``none``).
        ``server``: the server family's server, whose model is the one evaluated as the
        average model (:func:`~fedcore.metrics.evaluate_models`). ``regret``: the run's
        regret curve, brought up to each evaluation as it is recorded (see
        :func:`regret_tracker`)."""
        self.nodes = tuple(nodes)
        self.regret = regret
        self.server = server
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
        self.rounds_done = 0  # rounds every node has reported (they complete in order)

    _STATE = (
        "totals",
        "loss_sum",
        "loss_count",
        "losses",
        "missing_edges",
        "dropped_edges",
        "down",
        "evals",
        "_bytes_done",
        "_last_acc",
        "rounds_done",
    )

    def state_dict(self) -> dict[str, Any]:
        """What the observer has accounted (for a checkpoint, between rounds), as plain
        containers: the observer's own, not copies, so serialize them before going on."""
        if self._round_loss:
            raise RuntimeError("a checkpoint of the observer must fall between rounds")
        state = {key: getattr(self, key) for key in self._STATE}
        state["missing"] = {sender: sorted(r) for sender, r in self.missing.items()}
        return state

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        for key in self._STATE:
            setattr(self, key, copy.deepcopy(saved[key]))
        self.missing = {sender: set(r) for sender, r in saved["missing"].items()}

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
        loss = None if record.down or record.idle else record.loss
        losses[t] = loss
        self._round_loss.setdefault(t, []).append(loss)
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
        sent, missing, dropped = self._round_counts.pop(t)
        train_loss = self.end_round(
            t,
            losses,
            sent=sent,
            bytes_sent=self._round_bytes.pop(t),
            missing=missing,
            dropped=dropped,
        )
        snapshots = self._snapshots.pop(t, None)
        if snapshots is not None and len(snapshots) == self.n:
            ordered = {nid: snapshots[nid] for nid in self.nodes}
            result = evaluate_models(
                self.evaluator,
                ordered,
                self.dataset.x_test,
                self.dataset.y_test,
                server=self.server,
            )
            self.add_eval(t, train_loss, result)
        if self.progress is not None:
            self.progress.update(t + 1, loss=train_loss, accuracy=self._last_acc)

    def end_round(
        self,
        t: int,
        losses: Sequence[float],
        *,
        sent: int,
        bytes_sent: int,
        missing: int,
        dropped: int,
    ) -> float:
        """Account round ``t`` as complete, every node's record observed (the vectorized
        engine's :class:`~fedcore.engines.vectorized.Flusher` calls this itself), and
        write its ``"kind": "round"`` record; ``losses`` are the up nodes'. Returns the
        round's training loss (NaN when every node was down)."""
        train_loss = sum(losses) / len(losses) if losses else math.nan
        self._bytes_done += bytes_sent
        if self.writer is not None:
            self.writer.write(
                round_record(
                    t,
                    train_loss=train_loss,
                    nodes_up=len(losses),
                    messages_sent=sent,
                    bytes_sent=bytes_sent,
                    messages_missing=missing,
                    messages_dropped=dropped,
                )
            )
        self.loss_sum += sum(losses)
        self.loss_count += len(losses)
        self.rounds_done = t + 1
        return train_loss

    def add_eval(self, t: int, train_loss: float | None, result: Mapping[str, Any]) -> None:
        """Record the evaluation of round ``t`` (``result``: the models' figures)."""
        record: dict[str, Any] = {
            "kind": "eval",
            "round": t,
            "train_loss": train_loss,
            "average_loss": self.loss_sum / self.loss_count if self.loss_count else math.nan,
            "bytes_sent_per_node": self._bytes_done / self.n,
            **result,
        }
        self.evals.append(record)
        if self.regret is not None:  # the rounds since the last evaluation, once
            self.regret.update(self.losses, [e["round"] for e in self.evals])
        self._last_acc = result["avg_model_accuracy"]
        logger.debug("round %d evaluated: %s", t, _brief(record))
        if self.writer is not None:
            self.writer.write(record)
            self.writer.flush()

    @property
    def last_accuracy(self) -> float | None:
        """The average model's accuracy at the last evaluation (None before the first)."""
        return self._last_acc


def _brief(record: Mapping[str, Any]) -> str:
    """An evaluation record's figures, for a debug line."""
    return ", ".join(
        f"{k} {v:.4g}" for k, v in record.items() if isinstance(v, float) and k != "round"
    )


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
    overrides: Sequence[str] = (),
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
        overrides: The ``--set`` items ``config`` was loaded with: they name the run
            (:func:`run_name`) and the summary keeps them.

    Raises:
        ConfigError, TopologyError, DataError: invalid experiment (before any work).
        TransportTimeoutError: a strict-mode node waited too long.
    """
    stream = progress_stream if progress_stream is not None else sys.stderr
    with announce_if_slow(stream if show_progress else None, planned_nodes(config)):
        setup = prepare_run(config, hosts_all=True)
    seed_torch(config)
    engine, why = choose_engine(setup, config.simulate.engine)
    if why is not None:
        logger.info("engine: messages (%s)", why)
        if show_progress:
            print(f"simulate: engine 'messages' ({why})", file=stream, flush=True)
    built = _build(setup, engine)
    name = run_name(config, setup, overrides)
    out = open_run_dir(out_dir, name, force=force)
    (out / "config.toml").write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
    return _execute(
        setup,
        built,
        out,
        name=name,
        overrides=overrides,
        stream=stream,
        show_progress=show_progress,
        saved=None,
    )


def resume(
    run_dir: str | Path,
    *,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Continue the interrupted ``fedcore simulate`` run in ``run_dir`` from its newest
    good checkpoint (``run.checkpoint_every``); return the summary.

    The run goes on in the same folder, on the engine it started on, and ends with the
    parameters, records and figures the uninterrupted run would have (only wall times
    differ). A folder without a checkpoint starts again from round 0, with a warning.

    Raises:
        ConfigError: ``run_dir`` holds no simulate run, a finished one, or a checkpoint
            of another run.
    """
    out = Path(run_dir)
    if not (out / "config.toml").is_file():
        raise ConfigError(f"{str(out)!r} holds no run to resume: it has no config.toml.")
    prior: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        prior = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    if prior.get("status", "completed") == "completed" and prior:
        raise ConfigError(f"the run in {str(out)!r} completed; there is nothing to resume.")
    if prior.get("transport", "inproc") != "inproc" or (out / "roster.json").exists():
        raise ConfigError(
            f"{str(out)!r} is a `fedcore launch` run; its peers resume with `fedcore node "
            "--resume`, not `fedcore simulate --resume`."
        )
    config = load_config(out / "config.toml")
    setup = prepare_run(config, hosts_all=True)
    seed_torch(config)
    saved = checkpoint.latest(out / CHECKPOINTS)
    if saved is not None and saved.get("kind") != "simulate":
        raise ConfigError(f"{str(out / CHECKPOINTS)!r} holds a peer's checkpoints, not a run's.")
    if saved is not None and saved["run_id"] != setup.run_id:
        raise ConfigError(
            f"the checkpoints in {str(out)!r} belong to another run than its config.toml."
        )
    overrides = list(saved["overrides"] if saved else prior.get("overrides", []))
    name = saved["name"] if saved else prior.get("name") or run_name(config, setup, overrides)
    engine = saved["engine"] if saved else choose_engine(setup, config.simulate.engine)[0]
    stream = progress_stream if progress_stream is not None else sys.stderr
    if saved is None:
        logger.warning(
            "%s has no good checkpoint (run.checkpoint_every = %d); starting again from round 0",
            out,
            config.run.checkpoint_every,
        )
    elif show_progress:
        print(f"simulate: resuming {out} after round {saved['round']}", file=stream, flush=True)
    return _execute(
        setup,
        _build(setup, engine),
        out,
        name=name,
        overrides=overrides,
        stream=stream,
        show_progress=show_progress,
        saved=saved,
    )


def _build(setup: RunSetup, engine: str) -> Network | VectorizedNetwork:
    if engine == "vectorized":
        return VectorizedNetwork(setup, device=resolve_device(setup.config.simulate.device))
    return build_network(setup.config, setup=setup)


def _execute(
    setup: RunSetup,
    built: Network | VectorizedNetwork,
    out: Path,
    *,
    name: str,
    overrides: Sequence[str],
    stream: TextIO,
    show_progress: bool,
    saved: dict[str, Any] | None,
) -> dict[str, Any]:
    """Run (or continue, from checkpoint ``saved``) a run in its folder ``out``.

    An interrupted run (Ctrl-C, SIGTERM) or a failed one still writes ``summary.json``,
    with ``status`` ``interrupted`` or ``failed`` and the rounds completed, then the
    exception goes on (a :class:`KeyboardInterrupt` says where the results are).
    """
    config = setup.config
    rounds = config.run.rounds
    vectorized = built if isinstance(built, VectorizedNetwork) else None
    network = built if isinstance(built, Network) else None
    nodes: Sequence[str] = vectorized.nodes if vectorized is not None else list(built.nodes)
    metrics = out / "metrics.jsonl"
    if saved is not None:
        kept = int(saved["metrics_bytes"])
        if not metrics.is_file() or metrics.stat().st_size < kept:
            raise ConfigError(
                f"{metrics} is shorter than its checkpoint of round {saved['round']} says; "
                "the folder was changed since, so it cannot be resumed."
            )
        with open(metrics, "r+b") as fh:  # what was written after the checkpoint runs again
            fh.truncate(kept)
    writer = JsonlWriter(metrics, append=saved is not None)
    first = int(saved["round"]) if saved is not None else 0
    progress = (
        Progress(rounds, label="simulate", stream=stream, first=first) if show_progress else None
    )
    observer = RunObserver(
        nodes=nodes,
        config=config,
        evaluator=setup.evaluator,
        dataset=setup.dataset,
        writer=writer,
        progress=progress,
        records=node_records_mode(config, len(nodes)),
        server=getattr(setup.algorithm, "server", None),
        regret=regret_tracker(setup),
    )
    engine = "vectorized" if vectorized is not None else "messages"
    wall_before = float(saved["wall_seconds"]) if saved is not None else 0.0
    began = time.perf_counter()

    def save(round: int, state: dict[str, Any]) -> None:
        writer.flush()
        logger.debug("checkpoint of round %d in %s", round, out / CHECKPOINTS)
        checkpoint.write(
            out / CHECKPOINTS,
            round,
            {
                "kind": "simulate",
                "engine": engine,
                "round": round,
                "run_id": setup.run_id,
                "name": name,
                "overrides": list(overrides),
                "metrics_bytes": metrics.stat().st_size,
                "wall_seconds": wall_before + time.perf_counter() - began,
                "observer": observer.state_dict(),
                "torch_rng": torch.get_rng_state(),
                **state,
            },
        )

    if saved is not None:
        observer.load_state_dict(saved["observer"])
        torch.set_rng_state(saved["torch_rng"])
    logger.info(
        "run %s: %d nodes, %d rounds, engine %s, results in %s",
        name,
        observer.n,
        rounds,
        engine,
        out,
    )
    args = (setup, built, observer, out, name, overrides)
    final: dict[str, torch.Tensor] | None = None  # a finished vectorized run's parameters
    try:
        if network is not None:
            if saved is not None:
                for nid, node in network.nodes.items():
                    checkpoint.restore(node, saved["nodes"][nid])
            observer.attach(network)
            asyncio.run(_run_messages(network, rounds, config.run.checkpoint_every, save))
        else:
            assert vectorized is not None
            final = run_vectorized(vectorized, observer, writer, progress, save=save, saved=saved)
    except KeyboardInterrupt as stop:
        writer.close()
        try:
            _finish(*args, wall_before + time.perf_counter() - began, "interrupted", None)
        except Exception as exc:
            logger.warning("could not write the summary of the interrupted run: %s", exc)
            raise stop from None
        every = config.run.checkpoint_every
        raise KeyboardInterrupt(
            f"after round {observer.rounds_done} of {rounds}; the results so far are in {out}"
            + (
                f"; continue with: fedcore simulate --resume {out}"
                if every and observer.rounds_done >= every
                else " (set run.checkpoint_every to make a run resumable)"
                if not every
                else ""
            )
        ) from None
    except BaseException as exc:
        writer.close()
        why = first_line(str(exc)) or type(exc).__name__
        try:
            _finish(*args, wall_before + time.perf_counter() - began, "failed", why)
        except Exception as second:  # the run's own error says more than this one
            logger.warning("could not write the summary of the failed run: %s", second)
        raise
    writer.close()
    try:  # regret, spectral gap, summary, picture: seconds on a large run
        wall = wall_before + time.perf_counter() - began
        return _finish(*args, wall, "completed", None, final=final)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            _finish(*args, wall_before + time.perf_counter() - began, "interrupted", None)
        raise KeyboardInterrupt(
            f"while writing the results of the finished run in {out}; write them with: "
            f"fedcore simulate --resume {out}"
        ) from None


def _finish(
    setup: RunSetup,
    built: Network | VectorizedNetwork,
    observer: RunObserver,
    out: Path,
    name: str,
    overrides: Sequence[str],
    wall: float,
    status: str,
    error: str | None,
    *,
    final: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Write the summary of a run in any ``status``; ``final`` (every node's parameters)
    is read from ``built`` where not given."""
    # The same keys on both engines: the message engine runs one module per node on the CPU.
    extra: dict[str, Any] = {
        "engine": "messages",
        "device": "cpu",
        "gradients": "per-node",
        "overrides": list(overrides),
    }
    if isinstance(built, VectorizedNetwork):
        extra.update(engine="vectorized", device=str(built.device))
        extra["gradients"] = built.objective.mode
        if final is None:
            final = _vectorized_final(built, observer)
    elif final is None:
        final = {nid: node.model() for nid, node in built.nodes.items()}
    summary = finish_run(
        setup,
        observer,
        out,
        name=name,
        transport="inproc",
        wall_seconds=wall,
        final_params=final,
        extra=extra,
        status=status,
        error=error,
    )
    summary["out_dir"] = str(out)
    return summary


async def _run_messages(
    network: Network,
    rounds: int,
    every: int,
    save: Callable[[int, dict[str, Any]], None],
) -> None:
    """Run the message engine to ``rounds``, stopping every node at each multiple of
    ``every`` (0: never) to checkpoint them all at once.

    SIGINT and SIGTERM (in the main thread) cancel the run between the nodes' steps and
    raise :class:`KeyboardInterrupt` here, rather than inside one node's task.
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, task.cancel)
        except (ValueError, RuntimeError):  # not the main thread: signals stay as they are
            continue
        handled.append((sig, previous))
    try:
        done = min(node.round for node in network.nodes.values())
        while done < rounds:
            stop = min(rounds, (done // every + 1) * every) if every else rounds
            await network.run_async(stop)
            done = stop
            if every and done < rounds:
                nodes = network.nodes.items()
                save(done, {"nodes": {nid: checkpoint.snapshot(n) for nid, n in nodes}})
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        for sig, previous in handled:
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous)


def run_vectorized(
    net: VectorizedNetwork,
    observer: RunObserver,
    writer: JsonlWriter | None,
    progress: Progress | None,
    *,
    save: Callable[[int, dict[str, Any]], None] | None = None,
    saved: Mapping[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Run every round of a :class:`~fedcore.engines.vectorized.VectorizedNetwork`,
    accounting into ``observer``; checkpoint through ``save`` every
    ``run.checkpoint_every`` rounds, and continue from checkpoint ``saved``. Returns
    every node's final parameters (on the CPU)."""
    flusher = Flusher(
        net, observer=observer, writer=writer, records=observer.records, progress=progress
    )
    if saved is not None:
        net.load_state_dict(saved["network"])
        flusher.load_state_dict(saved["flusher"])
    every = net.setup.config.run.checkpoint_every if save is not None else 0
    try:
        while net.round < observer.rounds:
            flusher.add(net.run_round())
            if every and net.round % every == 0 and net.round < observer.rounds:
                assert save is not None
                flusher.flush()
                save(net.round, {"network": net.state_dict(), "flusher": flusher.state_dict()})
    except BaseException:
        with contextlib.suppress(Exception):  # account what ran, for the partial summary
            flusher.flush()
        raise
    flusher.flush()
    return _vectorized_final(net, observer)


def _vectorized_final(net: VectorizedNetwork, observer: RunObserver) -> dict[str, torch.Tensor]:
    """Every node's parameters (on the CPU), with the fault tables put into ``observer``."""
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
    status: str = "completed",
    error: str | None = None,
) -> dict[str, Any]:
    """The end of every run, whatever its transport: the regret (``run.regret``, of a
    completed run only), ``summary.json`` (with ``extra`` keys) and ``curves.png``;
    returns the summary.

    ``status`` is ``completed``, ``interrupted`` (Ctrl-C, SIGTERM, peers stopped) or
    ``failed`` (``error`` says why); the summary's ``rounds_completed`` says how far the
    run got and its figures are those of the last evaluation reached.
    """
    regret = add_regret(setup, observer, out) if status == "completed" else None
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
    if error is not None:
        summary["error"] = error
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
        **_digests(final_params, observer.nodes),
        "regret": [{k: v for k, v in r.items() if k != "kind"} for r in regret or []],
    }
