"""The seeds of a sweep as one batch (``fedcore simulate CONFIG --seeds 0-7 --batch-seeds``).

A small config does not fill a core: its round is a few small tensor operations, most of
its time Python. :func:`run_batched` runs a sweep's seeds as the blocks of rows of one
vectorized network (:class:`~fedcore.engines.seed_blocks.SeedBlocks`), each block its
seed's run, then writes each seed's run folder as its separate run would have
(``config.toml``, ``metrics.jsonl``, ``summary.json``, ``curves.png``): the same
parameters (``params_sha256``), records and figures; only the wall times differ (each
seed's is the batch's).

What cannot be batched exactly is refused before any round
(:func:`~fedcore.engines.seed_blocks.config_refusal` and
:func:`~fedcore.engines.seed_blocks.block_refusal`, one line naming the plain sweep
instead). A batch that fails otherwise (a seed's data that cannot be loaded, a seed that
diverges in strict mode, a draw from torch's global generator) runs its seeds again one by
one, so that each seed's failure is its own, as in a plain sweep.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from fedcore.config import Config, config_to_dict, dumps_toml, load_config
from fedcore.engines.clock import virtual_clock
from fedcore.engines.seed_blocks import (
    SeedBlocks,
    block_figures,
    block_refusal,
    config_refusal,
)
from fedcore.engines.stacked_eval import evaluate_rows
from fedcore.engines.vectorized import Flusher, node_records_mode, resolve_device
from fedcore.errors import ConfigError
from fedcore.ids import first_line
from fedcore.metrics import JsonlWriter
from fedcore.progress import Note, Progress, run_warnings
from fedcore.setup.prepare import RunSetup, prepare_run, seed_torch
from fedcore.simulation.observer import RunObserver
from fedcore.simulation.results import open_run_dir, regret_tracker, run_name
from fedcore.simulation.simulate import _finish, _threads_for, choose_engine
from fedcore.simulation.sweep_figures import final_figures
from fedcore.simulation.sweep_workers import _execute, _Outcome, _RunSpec
from fedcore.simulation.tracking import make_tracker

__all__ = ["check_batchable", "run_batched"]

logger = logging.getLogger(__name__)


class BatchRefused(ConfigError):
    """A config or set-up whose seeds cannot be batched exactly."""


def check_batchable(config: Config, jobs: int = 1) -> None:
    """Refuse a config whose seeds cannot be batched exactly, from what it says, and
    ``jobs`` other than 1 (a batch runs in this process).

    Raises:
        ConfigError: one line naming why, and the plain sweep to run instead.
    """
    if jobs != 1:
        raise BatchRefused(
            "--batch-seeds runs every seed in this process; drop --jobs (or drop "
            "--batch-seeds to run the seeds in worker processes)."
        )
    why = config_refusal(config)
    if why is not None:
        raise BatchRefused(
            f"--batch-seeds cannot batch this config: {why}; run its seeds without "
            "--batch-seeds (--jobs N runs them in parallel)."
        )


class _Block:
    """One seed's run inside the batch: what the flusher, the evaluation and the summary
    ask of an engine (:class:`~fedcore.simulation.drivers.Engine`), on its block's rows."""

    name = "vectorized"

    def __init__(self, net: SeedBlocks, k: int) -> None:
        self.net = net
        self.setup: RunSetup = net.blocks[k]
        self.k = k
        self.rows = net.block_rows(k)
        self.nodes = self.setup.graph.nodes
        self.device = net.device
        self.objective = net.objective

    def model(self) -> torch.Tensor:
        """``[N, d]``: this block's models."""
        return self.net.model()[self.rows]

    def evaluate(self) -> dict[str, Any]:
        """The evaluation record of this block's models, as its own run makes it."""
        return evaluate_rows(self.setup, self.objective, self.nodes, self.model())

    def check(self) -> None:
        """The network's deferred checks."""
        self.net.check()

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        """Every node's parameters now, on the CPU, with the block's fault tables put into
        ``observer`` (as a vectorized run's end does)."""
        missing, dropped = self.net.block_fault_counts(self.k)
        observer.missing_edges.update(missing)
        observer.dropped_edges.update(dropped)
        final = self.model().cpu()
        return {nid: final[i] for i, nid in enumerate(self.nodes)}

    def summary(self) -> dict[str, Any]:
        """What a vectorized run's summary says of its engine."""
        return {
            "engine": self.name,
            "device": str(self.device),
            "gradients": self.objective.mode,
        }


@dataclasses.dataclass
class _Seed:
    """One seed of the batch: its spec, config, set-up, folder and what it said."""

    spec: _RunSpec
    config: Config
    setup: RunSetup
    overrides: list[str]
    notes: list[Note]
    name: str = ""
    out: Path | None = None


def run_batched(
    specs: Sequence[_RunSpec],
    *,
    threads: int | str,
    on_done: Callable[[_Outcome], None],
    stream: TextIO | None = None,
) -> None:
    """Run ``specs`` (one sweep's seeds) as one batch, ``on_done`` called with each seed's
    outcome as its folder is written. A batch that fails otherwise than by a refusal (a
    seed's data that cannot be loaded, a seed that diverges) runs the seeds without an
    outcome one by one (:func:`~fedcore.simulation.sweep_workers._execute`), so that
    each seed's failure is its own, as in a plain sweep. ``stream``: where the batch's
    progress (the rounds, with its first seed's loss and accuracy) and its fallback go.

    Raises:
        BatchRefused: a config or set-up that cannot be batched (before any round).
    """
    if not specs:
        return
    done: set[int] = set()

    def said(outcome: _Outcome) -> None:
        done.add(outcome.seed)
        on_done(outcome)

    with run_warnings(quiet=True):
        try:
            _run(_set_up(specs), threads, said, stream)
        except (KeyboardInterrupt, BatchRefused):
            raise
        except Exception as exc:
            why = first_line(str(exc)) or type(exc).__name__
            logger.info("the batch of seeds stopped (%s); its seeds run one by one", why)
            if stream is not None:
                print(f"sweep: the batch stopped ({why}); its seeds run one by one", file=stream)
            rest = [dataclasses.replace(s, force=True) for s in specs if s.seed not in done]
            _execute(rest, jobs=1, threads=threads, on_done=on_done)


def _set_up(specs: Sequence[_RunSpec]) -> list[_Seed]:
    """Each seed's config and set-up, each with the warnings it said (its own run's)."""
    seeds: list[_Seed] = []
    for spec in specs:
        overrides = [*spec.overrides, f"run.seed={spec.seed}"]
        config = load_config(spec.config, overrides)
        check_batchable(config)
        with run_warnings(quiet=True) as handler:
            setup = prepare_run(config, hosts_all=True, simulated=True)
            setup.clock = virtual_clock(setup)
            engine, why = choose_engine(setup, config.simulate.engine)
        why = why or block_refusal(setup)
        if engine != "vectorized" or why is not None:
            raise BatchRefused(
                f"--batch-seeds cannot batch this config: {why or engine}; run its seeds "
                "without --batch-seeds."
            )
        seeds.append(_Seed(spec, config, setup, overrides, list(handler.notes)))
    return seeds


def _run(
    seeds: list[_Seed],
    threads: int | str,
    on_done: Callable[[_Outcome], None],
    stream: TextIO | None,
) -> None:
    """Build the batch, run its rounds, write each seed's folder."""
    setups = [s.setup for s in seeds]
    with run_warnings(quiet=True) as rounds_said, _threads_for(setups[0], "vectorized", threads):
        net = SeedBlocks(setups, device=resolve_device(setups[0].config.simulate.device))
        blocks = [_Block(net, k) for k in range(len(seeds))]
        observers: list[RunObserver] = []
        writers: list[JsonlWriter] = []
        flushers: list[Flusher] = []
        rounds = seeds[0].config.run.rounds
        label = f"batch, seed {seeds[0].spec.seed}"  # the bar's loss and accuracy: its
        progress = None if stream is None else Progress(rounds, label=label, stream=stream)
        for seed, block in zip(seeds, blocks, strict=True):
            seed.name = run_name(seed.config, seed.setup, seed.overrides)
            seed.out = out = open_run_dir(seed.spec.out_dir, seed.name, force=seed.spec.force)
            text = dumps_toml(config_to_dict(seed.config))
            (out / "config.toml").write_text(text, encoding="utf-8")
            writer = JsonlWriter(out / "metrics.jsonl", append=False)
            setup = seed.setup
            observer = RunObserver(
                nodes=block.nodes,
                config=seed.config,
                evaluator=setup.evaluator,
                dataset=setup.dataset,
                writer=writer,
                progress=None,
                records=node_records_mode(seed.config, len(block.nodes)),
                server=setup.algorithm.server,
                own_tests=setup.own_tests(),
                regret=regret_tracker(setup),
                tracker=make_tracker(seed.config, out, text),
            )
            observers.append(observer)
            writers.append(writer)
            flusher = Flusher(
                block,  # type: ignore[arg-type]  # what a flusher reads of a network
                observer=observer,
                writer=writer,
                records=observer.records,
                progress=progress if not flushers else None,
            )
            flushers.append(flusher)
        seed_torch(seeds[0].config)
        before = torch.get_rng_state()
        began = time.perf_counter()
        try:
            while net.round < rounds:
                figures = net.run_round()
                for block, flusher in zip(blocks, flushers, strict=True):
                    flusher.add(block_figures(figures, block.rows))
            for flusher in flushers:
                flusher.flush()
        finally:
            for writer in writers:
                writer.close()
        _check_global_generator(before)
        wall = time.perf_counter() - began
        late = list(rounds_said.notes)
    for seed, block, observer in zip(seeds, blocks, observers, strict=True):
        on_done(_write(seed, block, observer, wall, late))


def _check_global_generator(before: torch.Tensor) -> None:
    """Refuse the batch's results if anything drew from torch's global generator: a
    separate run seeds it with its own seed, so such a draw is not its run's."""
    if not torch.equal(before, torch.get_rng_state()):
        raise RuntimeError(
            "the batch drew from torch's global random generator, which every seed's run "
            "seeds with its own seed"
        )


def _write(
    seed: _Seed, block: _Block, observer: RunObserver, wall: float, late: list[Note]
) -> _Outcome:
    """Write one seed's summary (and picture); its outcome for the sweep."""
    assert seed.out is not None
    with run_warnings(quiet=True) as handler:
        for note in [*seed.notes, *late]:  # its set-up's warnings, then the rounds'
            if note not in handler.notes:
                handler.notes.append(note)
        summary = _finish(
            seed.setup,
            block,  # type: ignore[arg-type]
            observer,
            seed.out,
            seed.name,
            seed.overrides,
            wall,
            "completed",
            None,
            final=block.final(observer),
        )
    return _Outcome(
        seed.spec.group,
        seed.spec.seed,
        "completed",
        final_figures(summary),
        notes=tuple(handler.notes),
    )
