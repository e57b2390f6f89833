"""``fedcore simulate``: run a config in one process and write a results folder.

The folder holds ``config.toml`` (the effective config), ``metrics.jsonl`` (one
``"kind": "node"`` record per node per round and one ``"kind": "eval"`` record per
evaluation round), ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from fedcore.algorithms.asynchronous import is_asynchronous
from fedcore.config import Config, config_to_dict, dumps_toml, load_config
from fedcore.engines.clock import virtual_clock
from fedcore.engines.vectorized import (
    node_records_mode,
    unsupported,
)
from fedcore.errors import ConfigError, UserCodeError
from fedcore.ids import first_line
from fedcore.metrics import JsonlWriter, to_json_text, write_text_atomic
from fedcore.progress import Progress, announce_if_slow, current_warnings, run_warnings
from fedcore.runtime import auto_threads, run_threads, threads_sleep
from fedcore.setup import checkpoint
from fedcore.setup.engine_checks import EngineInputs, check_engine, engine_error
from fedcore.setup.plan import planned_nodes
from fedcore.setup.prepare import RunSetup, prepare_run, seed_torch
from fedcore.simulation.drivers import Engine, build_engine
from fedcore.simulation.observer import RunObserver
from fedcore.simulation.results import (
    CHECKPOINTS,
    MANIFEST,
    finish_run,
    open_run_dir,
    regret_tracker,
    run_name,
)
from fedcore.simulation.tracking import make_tracker

__all__ = [
    "choose_engine",
    "choose_threads",
    "keep_late_warnings",
    "resume",
    "simulate",
]

logger = logging.getLogger(__name__)


def choose_engine(setup: RunSetup, engine: str) -> tuple[str, str | None]:
    """``(engine, why)``: the engine that runs ``setup`` and, when ``auto`` fell back to
    the message engine, why (one clause).

    Raises:
        ConfigError: ``vectorized`` was asked for and cannot run the config.
    """
    if is_asynchronous(setup.algorithm):
        if engine != "auto":
            check_engine(EngineInputs.of(setup.config), setup.algorithm)  # its refusal
        return "events", None
    if engine == "messages":
        return "messages", None
    reason = unsupported(setup)
    if reason is None:
        return "vectorized", None
    # The message engine would run on the CPU, a device other than it unused.
    if engine == "vectorized" or setup.config.simulate.device != "cpu":
        raise engine_error(setup.config.simulate, reason)
    return "messages", reason


def choose_threads(setup: RunSetup, engine: str, cores: int | None = None) -> tuple[int, str]:
    """``(threads, why)``: the torch threads ``--threads auto`` gives a run of ``setup`` on
    ``engine``, and why (one clause): one per :data:`~fedcore.runtime.BYTES_PER_THREAD` of
    its largest whole-state pass (the vectorized engine's ``[N, d]`` stack, the message
    engine's one model), up to ``cores`` (default: the usable cores)."""
    model = setup.start.numel() * setup.start.element_size()
    if engine == "vectorized":
        nodes = len(setup.graph.nodes)
        size, what = nodes * model, f"{nodes} peers' models"
    else:
        size, what = model, "one peer's model"
    why = f"{what}: {size / 2**20:.1f} MiB"
    if not threads_sleep():
        return (
            1,
            f"{why}, but OpenMP threads spin (OMP_WAIT_POLICY) and would stall on a busy machine",
        )
    return auto_threads(size, cores), why


def simulate(
    config: Config,
    *,
    out_dir: str | Path | None = None,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
    force: bool = False,
    overrides: Sequence[str] = (),
    threads: int | str | None = None,
) -> dict[str, Any]:
    """Run ``config`` in one process; write the results folder; return the summary.

    The engine is ``config.simulate.engine`` (see :class:`~fedcore.config.SimulateConfig`);
    the summary's ``engine`` says which ran.

    Args:
        config: The experiment.
        out_dir: Results folder (default ``runs/<name>-<timestamp>``, never one another
            run uses: see :func:`open_run_dir`).
        progress_stream: Where progress goes (default stderr).
        show_progress: Whether to show progress at all (and the engine note). Without
            it the run is quiet: fedcore's warnings stay off the terminal
            (:func:`~fedcore.progress.run_warnings`); the summary's ``warnings`` lists
            them either way.
        force: Replace the run files an existing ``out_dir`` holds.
        overrides: The ``--set`` items ``config`` was loaded with: they name the run
            (:func:`run_name`) and the summary keeps them.
        threads: torch intra-op threads for the rounds: a number, ``"auto"``
            (:func:`choose_threads`, by the run's shape), or None to leave torch's setting
            as it is. The process's setting is put back when the run ends.

    Raises:
        ConfigError, TopologyError, DataError: invalid experiment (before any work).
        TransportTimeoutError: a strict-mode node waited too long.
    """
    with run_warnings(quiet=not show_progress):
        return _simulate(
            config,
            out_dir=out_dir,
            progress_stream=progress_stream,
            show_progress=show_progress,
            force=force,
            overrides=overrides,
            threads=threads,
        )


def _simulate(
    config: Config,
    *,
    out_dir: str | Path | None,
    progress_stream: TextIO | None,
    show_progress: bool,
    force: bool,
    overrides: Sequence[str],
    threads: int | str | None,
) -> dict[str, Any]:
    """:func:`simulate`, its warnings collected."""
    if config.simulate.engine == "cohort":  # a population: no graph, no part per client
        from fedcore.simulation.population import simulate_cohort

        return simulate_cohort(
            config,
            out_dir=out_dir,
            progress_stream=progress_stream,
            show_progress=show_progress,
            force=force,
            overrides=overrides,
            threads=threads,
        )
    stream = progress_stream if progress_stream is not None else sys.stderr
    with announce_if_slow(stream if show_progress else None, planned_nodes(config.topology)):
        # What the config says the engine cannot run is refused with the cheap checks,
        # before any data is loaded; choose_engine checks the rest (memory) once set up.
        setup = prepare_run(config, hosts_all=True, simulated=True)
    setup.clock = virtual_clock(setup)
    seed_torch(config)
    engine, why = choose_engine(setup, config.simulate.engine)
    if why is not None:
        logger.info("engine: messages (%s)", why)
        if show_progress:
            print(f"simulate: engine 'messages' ({why})", file=stream, flush=True)
    with _threads_for(setup, engine, threads):
        built = build_engine(setup, engine)
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


def _threads_for(
    setup: RunSetup, engine: str, threads: int | str | None
) -> contextlib.AbstractContextManager[None]:
    """torch's intra-op threads for the run (see :func:`simulate`), put back after it."""

    def auto() -> int:
        count, why = choose_threads(setup, engine)
        logger.info("threads: %d (%s)", count, why)
        return count

    return run_threads(threads, auto)


def resume(
    run_dir: str | Path,
    *,
    progress_stream: TextIO | None = None,
    show_progress: bool = True,
    threads: int | str | None = None,
) -> dict[str, Any]:
    """Continue the interrupted ``fedcore simulate`` run in ``run_dir`` from its newest
    good checkpoint (``run.checkpoint_every``); return the summary. ``threads`` as for
    :func:`simulate`.

    The run goes on in the same folder, on the engine it started on, and ends with the
    parameters, records and figures the uninterrupted run would have (only wall times
    differ). A folder without a checkpoint starts again from round 0, with a warning.

    Raises:
        ConfigError: ``run_dir`` holds no simulate run, a finished one, or a checkpoint
            of another run.
    """
    with run_warnings(quiet=not show_progress):
        return _resume(
            run_dir, progress_stream=progress_stream, show_progress=show_progress, threads=threads
        )


def _resume(
    run_dir: str | Path,
    *,
    progress_stream: TextIO | None,
    show_progress: bool,
    threads: int | str | None,
) -> dict[str, Any]:
    """:func:`resume`, its warnings collected."""
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
            f"{str(out)!r} is a `fedcore launch` run; resume it with `fedcore launch "
            "--resume`, not `fedcore simulate --resume`."
        )
    if (out / CHECKPOINTS / MANIFEST).is_file() or "ranks" in prior:
        raise ConfigError(
            f"{str(out)!r} is a sharded run's (--ranks); resume it with `fedcore simulate "
            f"--resume {out}`, which starts its ranks again."
        )
    config = load_config(out / "config.toml")
    if config.simulate.engine == "cohort":  # a population: no graph, no part per client
        from fedcore.simulation.population import resume_cohort

        return resume_cohort(
            config,
            out,
            progress_stream=progress_stream,
            show_progress=show_progress,
            threads=threads,
        )
    setup = prepare_run(config, hosts_all=True)
    setup.clock = virtual_clock(setup)
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
    with _threads_for(setup, engine, threads):
        return _execute(
            setup,
            build_engine(setup, engine),
            out,
            name=name,
            overrides=overrides,
            stream=stream,
            show_progress=show_progress,
            saved=saved,
        )


def _execute(
    setup: RunSetup,
    built: Engine,
    out: Path,
    *,
    name: str,
    overrides: Sequence[str],
    stream: TextIO,
    show_progress: bool,
    saved: dict[str, Any] | None,
    checkpoints: Path | None = None,
) -> dict[str, Any]:
    """Run (or continue, from checkpoint ``saved``) a run in its folder ``out``; its
    checkpoints go to ``checkpoints`` (default ``out/checkpoints``).

    An interrupted run (Ctrl-C, SIGTERM) or a failed one still writes ``summary.json``,
    with ``status`` ``interrupted`` or ``failed`` and the rounds completed, then the
    exception goes on (a :class:`KeyboardInterrupt` says where the results are).
    """
    config = setup.config
    rounds = config.run.rounds
    nodes: Sequence[str] = list(built.nodes)
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
        server=setup.algorithm.server,
        own_tests=setup.own_tests(),
        regret=regret_tracker(setup),
        tracker=make_tracker(
            config, out, (out / "config.toml").read_text(encoding="utf-8"), first_round=first
        ),
    )
    engine = built.name
    wall_before = float(saved["wall_seconds"]) if saved is not None else 0.0
    began = time.perf_counter()

    def save(round: int, state: dict[str, Any]) -> None:
        writer.flush()
        if observer.tracker is not None:
            observer.tracker.flush()
        folder = checkpoints if checkpoints is not None else out / CHECKPOINTS
        logger.debug("checkpoint of round %d in %s", round, folder)
        checkpoint.write(
            folder,
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
    final: dict[str, torch.Tensor] | None = None  # a finished run's parameters, if at hand
    try:
        final = built.run(observer, writer, progress, save, saved)
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
        if isinstance(exc, UserCodeError):  # its traceback is for the rule's author
            exc.keep_traceback(out)
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
    built: Engine,
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
    # The same keys on every engine.
    extra: dict[str, Any] = {
        **built.summary(),
        "threads": torch.get_num_threads(),
        "overrides": list(overrides),
        "warnings": current_warnings(),
    }
    if final is None:
        final = built.final(observer)
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
    keep_late_warnings(out, summary)
    summary["out_dir"] = str(out)
    return summary


def keep_late_warnings(out: Path, summary: dict[str, Any]) -> None:
    """Rewrite ``out/summary.json`` with the warnings said while it was written (a run
    that diverges, a picture that could not be drawn), if any (before ``out_dir`` is
    added to ``summary``: the file has none)."""
    said = current_warnings()
    if said != summary.get("warnings", said):
        summary["warnings"] = said
        write_text_atomic(out / "summary.json", to_json_text(summary, indent=2) + "\n")
