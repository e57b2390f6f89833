"""``fedcore simulate``: run a config in one process and write a results folder.

The folder holds ``config.toml`` (the effective config), ``metrics.jsonl`` (one
``"kind": "node"`` record per node per round and one ``"kind": "eval"`` record per
evaluation round), ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch

from fedcore.algorithms.asynchronous import is_asynchronous
from fedcore.config import Config, config_to_dict, dumps_toml, load_config
from fedcore.engines.clock import virtual_clock
from fedcore.engines.events import EventNetwork
from fedcore.engines.messages import Network, build_network
from fedcore.engines.vectorized import (
    Flusher,
    VectorizedNetwork,
    node_records_mode,
    resolve_device,
    unsupported,
)
from fedcore.errors import ConfigError, UserCodeError
from fedcore.ids import first_line
from fedcore.metrics import JsonlWriter, to_json_text, write_text_atomic
from fedcore.progress import Progress, announce_if_slow, current_warnings, run_warnings
from fedcore.runtime import auto_threads, threads_sleep
from fedcore.setup import checkpoint
from fedcore.setup.plan import check_engine, engine_error, planned_nodes
from fedcore.setup.prepare import RunSetup, prepare_run, seed_torch
from fedcore.simulation.results import (
    CHECKPOINTS,
    RunObserver,
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
    "run_vectorized",
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
            check_engine(setup.config, setup.algorithm)  # its refusal
        return "events", None
    if engine == "messages":
        return "messages", None
    reason = unsupported(setup)
    if reason is None:
        return "vectorized", None
    # The message engine would run on the CPU, a device other than it unused.
    if engine == "vectorized" or setup.config.simulate.device != "cpu":
        raise engine_error(setup.config, reason)
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
    stream = progress_stream if progress_stream is not None else sys.stderr
    with announce_if_slow(stream if show_progress else None, planned_nodes(config)):
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


@contextlib.contextmanager
def _threads_for(setup: RunSetup, engine: str, threads: int | str | None) -> Iterator[None]:
    """torch's intra-op threads for the run (see :func:`simulate`), put back after it."""
    if threads is None:
        yield
        return
    if threads == "auto":
        count, why = choose_threads(setup, engine)
        logger.info("threads: %d (%s)", count, why)
    elif isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1:
        count = threads
    else:
        raise ConfigError(f"threads must be a whole number >= 1 or 'auto', got {threads!r}.")
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    config = load_config(out / "config.toml")
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
            _build(setup, engine),
            out,
            name=name,
            overrides=overrides,
            stream=stream,
            show_progress=show_progress,
            saved=saved,
        )


Save = Callable[[int, dict[str, Any]], None]
"""Write a checkpoint of ``round`` holding the engine's ``state`` (and the run's own)."""


class Engine(Protocol):
    """What :func:`simulate` asks of an engine's network, whichever engine it is."""

    name: str
    """``"messages"``, ``"vectorized"`` or ``"events"`` (the checkpoint and summary say it)."""
    nodes: Sequence[str]
    """Every node, in graph order."""

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        """Run (or continue, from checkpoint ``saved``) to ``run.rounds``, accounting into
        ``observer`` and checkpointing through ``save``; every node's final parameters
        where the engine has them at hand (``None``: :meth:`final` reads them)."""
        ...

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        """Every node's parameters now, on the CPU."""
        ...

    def summary(self) -> dict[str, Any]:
        """The summary's keys that say how this engine ran (engine, device, gradients)."""
        ...


class _Messages:
    """The message engine: a :class:`~fedcore.node.Node` per peer, in-process."""

    name = "messages"

    def __init__(self, network: Network) -> None:
        self.network = network
        self.nodes: Sequence[str] = list(network.nodes)

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        network = self.network
        if saved is not None:
            for nid, node in network.nodes.items():
                checkpoint.restore(node, saved["nodes"][nid])
        observer.attach(network)
        config = network.config
        asyncio.run(_run_messages(network, config.run.rounds, config.run.checkpoint_every, save))
        return None

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        return {nid: node.model() for nid, node in self.network.nodes.items()}

    def summary(self) -> dict[str, Any]:
        # One module per node on the CPU.
        return {"engine": self.name, "device": "cpu", "gradients": "per-node"}


class _Vectorized:
    """The vectorized engine: every peer a row of one stack."""

    name = "vectorized"

    def __init__(self, net: VectorizedNetwork) -> None:
        self.net = net
        self.nodes: Sequence[str] = list(net.nodes)

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        return run_vectorized(self.net, observer, writer, progress, save=save, saved=saved)

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        return _vectorized_final(self.net, observer)

    def summary(self) -> dict[str, Any]:
        net = self.net
        return {"engine": self.name, "device": str(net.device), "gradients": net.objective.mode}


class _Events:
    """The event engine: the asynchronous algorithms in virtual time."""

    name = "events"

    def __init__(self, net: EventNetwork) -> None:
        self.net = net
        self.nodes: Sequence[str] = list(net.nodes)

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        return run_events(self.net, observer)

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        models = self.net.models()
        return {nid: models[i] for i, nid in enumerate(self.net.nodes)}

    def summary(self) -> dict[str, Any]:
        return {"engine": self.name, "device": "cpu", "gradients": self.net.objective.mode}


def _build(setup: RunSetup, engine: str) -> Engine:
    """The network of ``engine`` (a name :func:`choose_engine` gave) for ``setup``."""
    if engine == "events":
        return _Events(EventNetwork(setup))
    if engine == "vectorized":
        device = resolve_device(setup.config.simulate.device)
        return _Vectorized(VectorizedNetwork(setup, device=device))
    return _Messages(build_network(setup.config, setup=setup))


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
) -> dict[str, Any]:
    """Run (or continue, from checkpoint ``saved``) a run in its folder ``out``.

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


def run_events(net: EventNetwork, observer: RunObserver) -> dict[str, torch.Tensor]:
    """Run an asynchronous network's rounds (see :mod:`fedcore.engines.events`) into
    ``observer``; every node's final parameters."""
    lr = net.setup.options.lr
    while net.round < observer.rounds:
        figures = net.run_round()
        evaluating = observer.is_eval_round(figures.round)
        models = net.models() if evaluating else None
        for i, record in enumerate(net.records(figures, lr)):
            observer.observe(record, None if models is None else models[i].clone())
    models = net.models()
    return {nid: models[i] for i, nid in enumerate(net.nodes)}


def _vectorized_final(net: VectorizedNetwork, observer: RunObserver) -> dict[str, torch.Tensor]:
    """Every node's parameters (on the CPU), with the fault tables put into ``observer``."""
    missing, dropped = net.fault_counts()
    observer.missing_edges.update(missing)
    observer.dropped_edges.update(dropped)
    final = net.model().cpu()
    return {nid: final[i] for i, nid in enumerate(net.nodes)}
