"""``fedcore simulate`` on the cohort engine (``simulate.engine = "cohort"``): a population
of clients with only the round's cohort in memory (:mod:`fedcore.engines.cohort`).

The results folder holds ``config.toml``, ``metrics.jsonl`` and ``summary.json`` as a run
of the other engines does (no ``curves.png``), and with ``run.checkpoint_every`` its
checkpoints, from which :func:`resume_cohort` (``fedcore simulate --resume``) continues
to the uninterrupted run's results. Over ranks (:func:`simulate_cohort_rank`) every rank
writes its own checkpoint (its share of the :class:`~fedcore.engines.cohort.ClientStore`,
the global model and the server optimizer's state, which every rank holds the same; rank
0's the run's figures too) and rank 0 a manifest once all are written, as a sharded run
does (:mod:`fedcore.simulation.rank_checkpoints`); ``--resume`` starts the same number
of ranks, each from its own file of the manifest's round.

``metrics.jsonl`` has the same ``"kind": "round"`` records as the vectorized engine's run
of the config, and ``"kind": "eval"`` records with its keys less those that need every
client's model (``mean_node_accuracy``, ``min_node_accuracy``, ``consensus_distance``,
``node_accuracy``). The summary's ``params_sha256`` holds the server's (the global model's)
digest only; ``population``, ``cohort`` and ``clients_held`` say how many clients the run
had, sampled a round, and held at its end.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from fedcore.config import Config, config_to_dict, dumps_toml, fingerprint
from fedcore.engines.cohort import CohortNetwork, mean_loss
from fedcore.engines.ranks import Ranks, join, leave
from fedcore.engines.vectorized import resolve_device
from fedcore.errors import ConfigError
from fedcore.ids import first_line
from fedcore.metrics import (
    JsonlWriter,
    params_sha256,
    round_record,
    to_json_text,
    write_text_atomic,
)
from fedcore.progress import Progress, current_warnings, run_warnings
from fedcore.runtime import auto_threads, run_threads, usable_cores
from fedcore.setup import checkpoint
from fedcore.setup.prepare import seed_torch
from fedcore.simulation.rank_checkpoints import (
    due,
    load_rank,
    rank_folder,
    read_manifest,
    resumed_name,
    seal,
    share_folder,
)
from fedcore.simulation.results import CHECKPOINTS, named_run, open_run_dir

logger = logging.getLogger(__name__)

__all__ = ["cohort_run_id", "resume_cohort", "simulate_cohort", "simulate_cohort_rank"]

COHORT_RANK = "cohort-rank"
"""What the checkpoint of a rank other than 0 of a cohort run over ranks says it is."""


def cohort_run_id(config: Config) -> str:
    """The fingerprint of a cohort run (its config: the star is ``topology.nodes``), which
    its ranks' checkpoints and manifest carry."""
    return fingerprint(config, ())


def _run_name(config: Config, overrides: Sequence[str]) -> str:
    """:func:`~fedcore.simulation.results.run_name` of a star run, without its graph."""
    name = config.algorithm.name
    return named_run(config, name, f"{name}-star-{config.topology.nodes}", overrides)


def _threads(
    net: CohortNetwork, threads: int | str | None
) -> contextlib.AbstractContextManager[None]:
    """torch's intra-op threads for the run: as ``simulate``'s, ``auto`` sized by the
    cohort's ``[m, d]`` stack (on a sharded run: a rank's share of it and of this
    machine's cores)."""

    def auto() -> int:
        ranks = net.ranks
        share = 1 if ranks is None else ranks.world
        cores = None if ranks is None else max(1, usable_cores() // ranks.on_this_machine)
        return auto_threads(-(-net.m // share) * net.d * net.x.element_size(), cores)

    return run_threads(threads, auto)


def simulate_cohort(
    config: Config,
    *,
    out_dir: str | Path | None = None,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
    force: bool = False,
    overrides: Sequence[str] = (),
    threads: int | str | None = None,
) -> dict[str, Any]:
    """Run ``config`` on the cohort engine; write the results folder (see the module
    docstring); return the summary. The arguments are
    :func:`~fedcore.simulation.simulate.simulate`'s.

    Raises:
        ConfigError: the cohort engine cannot run ``config`` (one line saying why).
    """
    with run_warnings(quiet=not show_progress):
        net = CohortNetwork(config, device=resolve_device(config.simulate.device))
        seed_torch(config)
        name = _run_name(config, overrides)
        out = open_run_dir(out_dir, name, force=force)
        (out / "config.toml").write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
        stream = progress_stream if progress_stream is not None else sys.stderr
        with _threads(net, threads):
            summary = _execute(net, out, name, overrides, stream if show_progress else None)
        summary["warnings"] = current_warnings()
        write_text_atomic(out / "summary.json", to_json_text(summary, indent=2) + "\n")
        summary["out_dir"] = str(out)
        return summary


class _Account:
    """The run's figures so far, as the other engines' observer accounts them."""

    def __init__(self) -> None:
        self.loss_sum = 0.0
        self.loss_count = 0
        self.bytes = 0
        self.messages = 0
        self.rounds_done = 0
        self.evals: list[dict[str, Any]] = []
        self.target_hit: dict[str, Any] | None = None
        self.wall_before = 0.0  # seconds run before a resume


def _execute(
    net: CohortNetwork,
    out: Path,
    name: str,
    overrides: Sequence[str],
    stream: TextIO | None,
    saved: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every round (or those after checkpoint ``saved``) into ``out/metrics.jsonl``,
    checkpointing every ``run.checkpoint_every`` rounds; the summary (written by the
    caller)."""
    config = net.config
    run = config.run
    rounds = run.rounds
    account = _Account()
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
        net.load_state_dict(saved["network"])
        vars(account).update(saved["account"])
        torch.set_rng_state(saved["torch_rng"])
    writer = JsonlWriter(metrics, append=saved is not None)
    progress = (
        Progress(rounds, label="simulate", stream=stream, first=net.round)
        if stream is not None
        else None
    )
    every = run.checkpoint_every
    began = time.perf_counter()
    status, error = "completed", None
    try:
        while net.round < rounds:
            figures = net.run_round()
            t = figures.round
            train_loss = mean_loss(figures.losses)
            writer.write(
                round_record(
                    t,
                    train_loss=train_loss,
                    nodes_up=len(figures.losses),
                    messages_sent=figures.sent,
                    bytes_sent=figures.bytes_sent,
                    messages_missing=0,
                    messages_dropped=0,
                )
            )
            account.loss_sum += sum(figures.losses)
            account.loss_count += len(figures.losses)
            account.bytes += figures.bytes_sent
            account.messages += figures.sent
            account.rounds_done = t + 1
            if (t + 1) % run.eval_every == 0 or t + 1 == rounds:
                _evaluate(net, account, t, train_loss, writer)
                if progress is not None:
                    accuracy = account.evals[-1]["avg_model_accuracy"]
                    progress.update(t + 1, loss=train_loss, accuracy=accuracy)
            if due(every, net.round, rounds):
                writer.flush()
                _save(net, account, out, name, overrides, began)
    except KeyboardInterrupt:
        status = "interrupted"
        said = _where_it_stopped(out, account.rounds_done, rounds, every)
        raise KeyboardInterrupt(said) from None
    except BaseException as exc:
        status, error = "failed", first_line(str(exc)) or type(exc).__name__
        raise
    finally:
        writer.close()
        wall = account.wall_before + time.perf_counter() - began
        if status != "completed":  # the summary of a run that stopped, then its exception
            summary = _summary(net, account, name, overrides, wall, status, error, len(net.store))
            write_text_atomic(out / "summary.json", to_json_text(summary, indent=2) + "\n")
    return _summary(net, account, name, overrides, wall, status, error, net.clients_held())


def _where_it_stopped(out: Path, done: int, rounds: int, every: int) -> str:
    """What an interrupted run says (after ``fedcore: interrupted``), as the other engines'
    runs say it: where its results are, and how to continue it."""
    if not every:
        how = " (set run.checkpoint_every to make a run resumable)"
    else:
        how = f"; continue with: fedcore simulate --resume {out}" if done >= every else ""
    return f"after round {done} of {rounds}; the results so far are in {out}{how}"


def _save(
    net: CohortNetwork,
    account: _Account,
    out: Path,
    name: str,
    overrides: Sequence[str],
    began: float,
) -> None:
    """A checkpoint of the round just ended in ``out/checkpoints`` (what
    :func:`resume_cohort` continues from); over ranks, rank 0's file of it, then (once
    every rank wrote its own) the manifest (:func:`_follow` writes the others')."""
    figures = dict(vars(account))
    figures["wall_before"] = account.wall_before + time.perf_counter() - began
    content = {
        "kind": "simulate",
        "engine": "cohort",
        "round": net.round,
        "name": name,
        "overrides": list(overrides),
        "metrics_bytes": (out / "metrics.jsonl").stat().st_size,
        "account": figures,
        "network": net.state_dict(),
        "torch_rng": torch.get_rng_state(),
    }
    ranks = net.ranks
    if ranks is None:
        checkpoint.write(out / CHECKPOINTS, net.round, content)
        return
    run_id = cohort_run_id(net.config)
    content.update(rank=0, world=ranks.world, run_id=run_id)
    checkpoint.write(rank_folder(out, 0, ranks.world), net.round, content)
    seal(ranks, out, net.round, run_id=run_id, placement=None)


def _evaluate(
    net: CohortNetwork, account: _Account, t: int, train_loss: float, writer: JsonlWriter
) -> None:
    """The ``"eval"`` record of round ``t``: the global model's figures (the other
    engines' average model), with the observer's running figures."""
    loss, acc = net.evaluate()
    record: dict[str, Any] = {
        "kind": "eval",
        "round": t,
        "train_loss": train_loss,
        "average_loss": account.loss_sum / account.loss_count if account.loss_count else math.nan,
        "bytes_sent_per_node": account.bytes / (net.n + 1),  # the server is a node
        "avg_model_accuracy": acc,
        "avg_model_test_loss": loss,
    }
    target = net.config.run.target_accuracy
    if target > 0 and account.target_hit is None and acc >= target:
        account.target_hit = {"round": t, "vtime": None, "accuracy": acc}
    writer.write(record)
    writer.flush()
    account.evals.append(record)


def _summary(
    net: CohortNetwork,
    account: _Account,
    name: str,
    overrides: Sequence[str],
    wall: float,
    status: str,
    error: str | None,
    held: int,
) -> dict[str, Any]:
    """``summary.json`` of a cohort run (see the module docstring); ``held``: the clients
    held (on this rank alone where the run stopped)."""
    config = net.config
    final: dict[str, Any] = {}
    if account.evals:
        skip = ("kind", "round", "bytes_sent_per_node")
        final = {k: v for k, v in account.evals[-1].items() if k not in skip}
    summary: dict[str, Any] = {
        "name": name,
        "algorithm": config.algorithm.name,
        "transport": "inproc",
        "engine": "cohort",
        "device": str(net.device),
        "gradients": net.objective.mode,
        "nodes": net.n + 1,
        "population": net.n,
        "cohort": net.m,
        "clients_held": held,
        "examples_per_client": net.k,
        "rounds": config.run.rounds,
        "rounds_completed": account.rounds_done,
        "status": status,
        "wall_seconds": wall,
        "rounds_per_second": account.rounds_done / wall if wall > 0 else None,
        "topology": {
            "name": f"star-{net.n}",
            "communication_graph": f"star-{net.n}",
            "spectral_gap": None,
            "period": 1,
        },
        "final": final,
        "traffic": {
            "bytes_sent": account.bytes,
            "messages_sent": account.messages,
            "messages_missing": 0,
            "messages_dropped": 0,
            "bytes_per_node_per_round": account.bytes / ((net.n + 1) * max(1, account.rounds_done)),
            "local_steps": config.run.local_steps,
            "bytes_per_node_per_local_step": account.bytes
            / ((net.n + 1) * max(1, account.rounds_done) * config.run.local_steps),
            "codec": config.compression.codec,
        },
        "params_sha256": {config.topology.server: params_sha256(net.model().cpu())},
        "threads": torch.get_num_threads(),
        "overrides": list(overrides),
    }
    if net.ranks is not None:
        summary["ranks"] = net.ranks.world
    if config.run.target_accuracy > 0:
        summary["target_accuracy"] = config.run.target_accuracy
        summary["time_to_target"] = account.target_hit
    if error is not None:
        summary["error"] = error
    return summary


def simulate_cohort_rank(
    config: Config,
    ranks: Ranks,
    *,
    out_dir: str | Path | None = None,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
    force: bool = False,
    overrides: Sequence[str] = (),
    threads: int | str | None = None,
    resume: bool = False,
) -> dict[str, Any] | None:
    """One rank of a cohort run over ranks (``--ranks R``, torchrun): every rank trains
    its share of each cohort (client ``i`` on rank ``i % R``, which alone holds its state)
    and gathers the others' rows, so every rank mixes the same rows in the same order and
    holds the same global model; rank 0 writes the results folder (as
    :func:`simulate_cohort`, the summary with ``ranks``) and returns the summary, the
    others ``None``. With ``run.checkpoint_every`` each rank writes its own checkpoint and
    rank 0 the manifest (see the module docstring); with ``resume``, every rank continues
    the run in ``out_dir`` from its own file of the manifest's round (from round 0, with
    a warning, where it has none). The arguments are
    :func:`~fedcore.simulation.ranks.simulate_rank`'s.

    Raises:
        ConfigError: what the cohort engine does not run, or a checkpoint that does not
            fit (of another run, another number of ranks, damaged), before joining the
            others.
        PeerUnavailableError: another rank failed or stopped answering.
    """
    with run_warnings(quiet=not show_progress):
        net = CohortNetwork(config, device=resolve_device(config.simulate.device), ranks=ranks)
        saved: dict[str, Any] | None = None
        if resume:  # every rank checks its own file before it joins the others
            assert out_dir is not None
            manifest = read_manifest(Path(out_dir))
            if manifest is not None:
                saved = load_rank(
                    Path(out_dir), manifest, ranks, cohort_run_id(config), held="clients"
                )
                kind = saved.get("engine") if ranks.rank == 0 else saved.get("kind")
                if kind != ("cohort" if ranks.rank == 0 else COHORT_RANK):
                    raise ConfigError(
                        f"{ranks.label}'s checkpoint in {str(out_dir)!r} is not a cohort "
                        "run's: resume with the config that wrote it."
                    )
        seed_torch(config)
        join(ranks, config.transport.strict_timeout_s)
        every = config.run.checkpoint_every
        try:
            with _threads(net, threads):
                if ranks.rank != 0:
                    _follow(net, share_folder(ranks, None) if every else None, saved)
                    return None
                stream = progress_stream if progress_stream is not None else sys.stderr
                if resume:
                    assert out_dir is not None
                    out = Path(out_dir)
                    name, overrides = resumed_name(
                        out,
                        config.run.checkpoint_every,
                        saved,
                        stream,
                        show_progress,
                        lambda sets: _run_name(config, sets),
                    )
                else:
                    name = _run_name(config, overrides)
                    out = open_run_dir(out_dir, name, force=force)
                    text = dumps_toml(config_to_dict(config))
                    (out / "config.toml").write_text(text, encoding="utf-8")
                if every:
                    share_folder(ranks, out)
                summary = _execute(
                    net, out, name, overrides, stream if show_progress else None, saved=saved
                )
            summary["warnings"] = current_warnings()
            write_text_atomic(out / "summary.json", to_json_text(summary, indent=2) + "\n")
            summary["out_dir"] = str(out)
            return summary
        finally:
            leave()


def _follow(net: CohortNetwork, out: Path | None, saved: dict[str, Any] | None) -> None:
    """A rank other than 0: its share of every round (continuing from ``saved``, its own
    checkpoint), its checkpoints in the run folder ``out`` as rank 0 writes its own, and
    the count of clients held at the end, in the order rank 0's run asks for them."""
    if saved is not None:
        net.load_state_dict(saved["network"])
        torch.set_rng_state(saved["torch_rng"])
    ranks = net.ranks
    assert ranks is not None
    rounds, every = net.config.run.rounds, net.config.run.checkpoint_every
    run_id = cohort_run_id(net.config)
    while net.round < rounds:
        net.run_round()
        if out is not None and due(every, net.round, rounds):
            checkpoint.write(
                rank_folder(out, ranks.rank, ranks.world),
                net.round,
                {
                    "kind": COHORT_RANK,
                    "rank": ranks.rank,
                    "world": ranks.world,
                    "round": net.round,
                    "run_id": run_id,
                    "network": net.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                },
            )
            seal(ranks, out, net.round, run_id=run_id, placement=None)
    net.clients_held()


def resume_cohort(
    config: Config,
    out: Path,
    *,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
    threads: int | str | None = None,
) -> dict[str, Any]:
    """Continue the interrupted cohort run in ``out`` (its ``config.toml`` is ``config``)
    from its newest good checkpoint, to the uninterrupted run's results; from round 0, with
    a warning, where it has none.

    Raises:
        ConfigError: the checkpoints are not a cohort run's.
    """
    with run_warnings(quiet=not show_progress):
        net = CohortNetwork(config, device=resolve_device(config.simulate.device))
        seed_torch(config)
        saved = checkpoint.latest(out / CHECKPOINTS)
        if saved is not None and saved.get("engine") != "cohort":
            raise ConfigError(f"{str(out / CHECKPOINTS)!r} holds another engine's checkpoints.")
        stream = progress_stream if progress_stream is not None else sys.stderr
        if saved is None:
            logger.warning(
                "%s has no good checkpoint (run.checkpoint_every = %d); starting again from "
                "round 0",
                out,
                config.run.checkpoint_every,
            )
            name, overrides = _run_name(config, ()), []
        else:
            name, overrides = str(saved["name"]), list(saved["overrides"])
            if show_progress:
                print(f"simulate: resuming {out} after round {saved['round']}", file=stream)
        with _threads(net, threads):
            summary = _execute(
                net, out, name, overrides, stream if show_progress else None, saved=saved
            )
        summary["warnings"] = current_warnings()
        write_text_atomic(out / "summary.json", to_json_text(summary, indent=2) + "\n")
        summary["out_dir"] = str(out)
        return summary
