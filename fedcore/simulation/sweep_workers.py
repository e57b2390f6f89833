"""The runs of a seed sweep, one seed each: in this process or in spawned worker processes,
each run's failure its own outcome, Ctrl-C stopping every worker at once."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedcore.config import load_config
from fedcore.errors import FedcoreError
from fedcore.ids import first_line
from fedcore.progress import Note, run_warnings
from fedcore.simulation.results import CHECKPOINTS
from fedcore.simulation.simulate import resume, simulate
from fedcore.simulation.sweep_figures import final_figures


@dataclass(frozen=True, slots=True)
class _RunSpec:
    """One run of a sweep, as a worker process receives it."""

    group: int
    seed: int
    config: str | None
    overrides: tuple[str, ...]
    out_dir: str
    force: bool
    threads: int | str | None = None
    resume: bool = False


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What a run gave: its figures, or why it failed (and the error's class)."""

    group: int
    seed: int
    status: str
    figures: dict[str, float | None]
    reason: str | None = None
    error: type[FedcoreError] | None = None
    notes: tuple[Note, ...] = ()
    """The warnings the run logged (kept off the terminal: the sweep says each once)."""


def _run_one(spec: _RunSpec) -> _Outcome:
    """Run one seed (in a worker process or in this one); an error is its outcome. Its
    warnings stay off the terminal (in its summary, and in the outcome)."""
    with run_warnings(quiet=True) as said:
        outcome = _run_quietly(spec)
    return dataclasses.replace(outcome, notes=tuple(said.notes))


def _run_quietly(spec: _RunSpec) -> _Outcome:
    """:func:`_run_one`, its warnings collected."""
    overrides = [*spec.overrides, f"run.seed={spec.seed}"]
    try:
        if spec.resume and (done := _completed_summary(Path(spec.out_dir))) is not None:
            summary = done  # it ended, but the sweep was stopped before it said so
        elif spec.resume and _has_checkpoint(Path(spec.out_dir)):
            summary = resume(spec.out_dir, show_progress=False, threads=spec.threads)
        else:
            config = load_config(spec.config, overrides)
            summary = simulate(
                config,
                out_dir=spec.out_dir,
                show_progress=False,
                force=spec.force or spec.resume,
                overrides=overrides,
                threads=spec.threads,
            )
    except Exception as exc:  # torch, CUDA ...: one seed's failure, not the sweep's
        reason = first_line(str(exc)) or type(exc).__name__
        kind = type(exc) if isinstance(exc, FedcoreError) else None
        return _Outcome(spec.group, spec.seed, "failed", {}, reason, kind)
    return _Outcome(spec.group, spec.seed, "completed", final_figures(summary))


def _completed_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run in ``run_dir`` that completed, else None."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError):
        return None
    ok = isinstance(summary, dict) and summary.get("status", "completed") == "completed"
    return summary if ok else None


def _has_checkpoint(run_dir: Path) -> bool:
    """Whether a stopped run in ``run_dir`` left a config and checkpoints to resume from."""
    folder = run_dir / CHECKPOINTS
    return (run_dir / "config.toml").is_file() and folder.is_dir() and any(folder.iterdir())


def _init_worker(threads: int) -> None:
    """A worker leaves Ctrl-C to the sweep (which stops it), uses ``threads`` threads and
    keeps freed large blocks for reuse (:mod:`fedcore.runtime`)."""
    import torch

    from fedcore.runtime import keep_freed_memory

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    keep_freed_memory()


def _execute(
    specs: Sequence[_RunSpec],
    *,
    jobs: int,
    threads: int | str,
    on_done: Callable[[_Outcome], None],
) -> None:
    """Run ``specs``: in this process for ``jobs == 1``, else in up to ``jobs`` spawned
    worker processes (fresh interpreters: no torch thread pools inherited by a fork).
    On any exception here (Ctrl-C included) the workers are stopped at once."""
    if jobs == 1 or len(specs) <= 1:
        for spec in specs:
            on_done(_run_one(spec))
        return
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(specs)),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        # Parallel runs already share the cores: "auto" gives each worker one thread.
        initargs=(threads if isinstance(threads, int) else 1,),
    )
    try:
        pending: dict[Future[_Outcome], _RunSpec] = {}
        with _sigint_ignored():  # the workers start now, and inherit the ignoring
            for spec in specs:
                pending[pool.submit(_run_one, spec)] = spec
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: (pending[f].group, pending[f].seed)):
                del pending[future]
                on_done(future.result())
        pool.shutdown()
    except BaseException:
        _stop(pool)
        raise


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore Ctrl-C while worker processes start: a process inherits an ignored signal,
    so a Ctrl-C that reaches a worker while it is still importing does not print its
    traceback (the sweep stops the workers itself). Only the main thread can do this."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end the workers now (Python 3.11 has no public
    ``terminate_workers``)."""
    workers = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        if process.is_alive():
            process.terminate()
    for process in workers:
        process.join(timeout=5)
