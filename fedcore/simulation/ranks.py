"""``fedcore simulate`` over several ranks: one rank's program (:func:`simulate_rank`) and the
local launcher of ``--ranks R`` (:func:`launch_local`, from
:mod:`fedcore.simulation.rank_launch`, which imports no torch).

Every rank runs the same program: it reads the config, builds the same set-up (the same
graph, data split and start, by the run's seeds), joins the others
(:func:`fedcore.engines.ranks.join`, gloo) and runs its block of peers
(:class:`~fedcore.engines.sharded.ShardedNetwork`). Rank 0 writes the results folder
(``config.toml``, ``metrics.jsonl``, ``summary.json``) through the one-process run's own
code, with the figures and models the others send it; the other ranks write nothing.

``fedcore simulate --ranks R CONFIG`` starts R such processes on this machine
(``python -m fedcore`` with the same arguments, the environment torchrun would set, the
rendezvous on a free port of 127.0.0.1); ``torchrun ... -m fedcore simulate CONFIG`` starts
them itself. A rank that fails ends the others: they lose contact within
``transport.strict_timeout_s`` (the group's timeout) at most, the launcher stops any
rank still running after that, and says in one line which rank failed first and why.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from fedcore.config import Config, config_to_dict, dumps_toml
from fedcore.engines.clock import virtual_clock
from fedcore.engines.ranks import Ranks, join, leave
from fedcore.engines.shard_reshard import Part, merge_parts, placement_rows
from fedcore.engines.sharded import ShardedNetwork, is_eval_round, setup_refusal
from fedcore.engines.vectorized import Flusher
from fedcore.errors import ConfigError, FedcoreError
from fedcore.metrics import JsonlWriter, ParamDigests
from fedcore.progress import Progress, run_warnings
from fedcore.runtime import auto_threads, usable_cores
from fedcore.setup import checkpoint
from fedcore.setup.prepare import RunSetup, prepare_run, seed_torch
from fedcore.simulation.drivers import Save
from fedcore.simulation.observer import RunObserver
from fedcore.simulation.rank_checkpoints import (
    due,
    load_parts,
    load_rank,
    rank_folder,
    read_manifest,
    resumed_name,
    seal,
    share_folder,
)
from fedcore.simulation.rank_launch import LOST, launch_local
from fedcore.simulation.rank_launch import _cause as _cause  # the tests read them here
from fedcore.simulation.rank_launch import _Child as _Child
from fedcore.simulation.rank_launch import free_port as free_port
from fedcore.simulation.results import open_run_dir, run_name
from fedcore.simulation.simulate import _execute, _threads_for

__all__ = ["LOST", "launch_local", "rank_threads", "simulate_rank"]

logger = logging.getLogger(__name__)


class _Sharded:
    """Rank 0's side of a sharded run, as :func:`~fedcore.simulation.simulate.simulate`
    drives an engine (:class:`~fedcore.simulation.drivers.Engine`)."""

    name = "vectorized"

    def __init__(self, net: ShardedNetwork, out: Path) -> None:
        self.net = net
        self.out = out
        self.nodes: Sequence[str] = list(net.nodes)

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Any,
    ) -> ParamDigests:
        net = self.net
        # The flusher reads of its network only what a ShardedNetwork answers on rank 0
        # (nodes, setup, device, objective, check, evaluate).
        flusher = Flusher(
            net,  # type: ignore[arg-type]
            observer=observer,
            writer=writer,
            records=observer.records,
            progress=progress,
        )
        if saved is not None:  # this rank's file holds the run's figures too
            net.load_state_dict(saved["network"])
            flusher.load_state_dict(saved["flusher"])
            net.digests()  # what a failed run's summary holds (a collective)
        every = net.setup.config.run.checkpoint_every
        try:
            while net.round < observer.rounds:
                figures = net.run_round()
                assert figures is not None  # rank 0's
                flusher.add(figures)
                if due(every, net.round, observer.rounds):
                    flusher.flush()
                    state = {"network": net.state_dict(), "flusher": flusher.state_dict()}
                    save(net.round, {**state, "rank": 0, "world": net.ranks.world})
                    _seal(net, self.out)
        except BaseException:
            with contextlib.suppress(Exception):  # account what ran, for the partial summary
                flusher.flush()
            raise
        flusher.flush()
        return self.final(observer, gather=True)

    def final(self, observer: RunObserver, gather: bool = False) -> ParamDigests:
        """The digests of every node's parameters, hashed where they are (a collective) at
        the end of a run, with the fault tables, else (a run that failed, which no
        collective may wait on) those of the last such digests."""
        digests = self.net.digests() if gather else self.net.last
        assert digests is not None  # rank 0's
        if gather:  # the fault tables and halo bytes, added up over the ranks
            ended = self.net.finish()
            assert ended is not None  # rank 0's
            observer.missing_edges.update(ended[0])
            observer.dropped_edges.update(ended[1])
        return digests

    def summary(self) -> dict[str, Any]:
        net = self.net
        return {
            "engine": self.name,
            "device": str(net.device),
            "gradients": net.objective.mode,
            "ranks": net.ranks.world,
            "halo_bytes": net.halo_total,
            "partition": net.placement.method,
            "cut_fraction": net.cut_fraction,
            "halo_bytes_per_round": net.halo_bytes_per_round,
        }


def _follow(
    net: ShardedNetwork, config: Config, out: Path | None, saved: dict[str, Any] | None
) -> None:
    """A rank other than 0: every round, its peers' evaluation at each evaluation round,
    the models' digests at the end, then the fault tables and halo bytes, in the order rank 0's
    run asks for them; its
    checkpoints in the run folder ``out`` (continuing from ``saved``, its own)."""
    if saved is not None:
        net.load_state_dict(saved["network"])
        net.digests()  # as rank 0 makes them
    rounds, every = config.run.rounds, config.run.checkpoint_every
    while net.round < rounds:
        t = net.round
        net.run_round()
        if is_eval_round(config, t):
            net.evaluate()
        if out is not None and due(every, net.round, rounds):
            ranks = net.ranks
            checkpoint.write(
                rank_folder(out, ranks.rank, ranks.world),
                net.round,
                {
                    "kind": "sharded-rank",
                    "rank": ranks.rank,
                    "world": ranks.world,
                    "round": net.round,
                    "run_id": net.setup.run_id,
                    "network": net.state_dict(),
                },
            )
            _seal(net, out)
    net.digests()
    net.finish()  # as rank 0's run ends (a collective)


def _seal(net: ShardedNetwork, out: Path) -> None:
    """Every rank wrote its checkpoint of this round: rank 0 writes the manifest."""
    seal(net.ranks, out, net.round, run_id=net.setup.run_id, placement=net.placement)


def simulate_rank(
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
    """Run this rank's block of ``config`` (see the module docstring); rank 0 writes the
    results folder and returns the summary, the others return ``None``. Arguments as
    :func:`~fedcore.simulation.simulate.simulate`'s; with ``resume``, continue the run in
    ``out_dir`` from the round of its manifest
    (:mod:`fedcore.simulation.rank_checkpoints`), or from round 0 where it has none; a
    manifest of another number of ranks is re-sharded: each rank reads the rows it holds
    now from the old ranks' files (:mod:`fedcore.engines.shard_reshard`).

    Raises:
        ConfigError: what a sharded run cannot run
            (:func:`~fedcore.engines.sharded.setup_refusal`), before joining the others.
        PeerUnavailableError: another rank failed or stopped answering.
    """
    try:
        with run_warnings(quiet=not show_progress):
            return _simulate_rank(
                config,
                ranks,
                out_dir=out_dir,
                progress_stream=progress_stream,
                show_progress=show_progress and ranks.rank == 0,
                force=force,
                overrides=overrides,
                threads=threads,
                resume=resume,
            )
    except FedcoreError as exc:  # the one line names the rank
        if exc.args and isinstance(exc.args[0], str):
            exc.args = (f"{ranks.label}: {exc.args[0]}", *exc.args[1:])
        raise


def _simulate_rank(
    config: Config,
    ranks: Ranks,
    *,
    out_dir: str | Path | None,
    progress_stream: TextIO | None,
    show_progress: bool,
    force: bool,
    overrides: Sequence[str],
    threads: int | str | None,
    resume: bool,
) -> dict[str, Any] | None:
    if config.simulate.engine == "cohort":  # a population: no graph, no part per client
        from fedcore.simulation.population import simulate_cohort_rank

        return simulate_cohort_rank(
            config,
            ranks,
            out_dir=out_dir,
            progress_stream=progress_stream,
            show_progress=show_progress,
            force=force,
            overrides=overrides,
            threads=threads,
            resume=resume,
        )
    setup: RunSetup = prepare_run(config, hosts_all=True, simulated=True)
    setup.clock = virtual_clock(setup)
    why = setup_refusal(setup)
    if why is not None:
        raise ConfigError(f"a sharded run cannot run this config: {why}.")
    peers = len(setup.graph.nodes)
    if ranks.world > peers:
        raise ConfigError(
            f"{ranks.world} ranks for {peers} peers: every rank holds a block of peers, so "
            f"run at most {peers} ranks."
        )
    saved: dict[str, Any] | None = None
    parts: list[Part] | None = None  # re-sharding: the old ranks' files this rank reads
    old_world = ranks.world
    if resume:  # every rank checks its own file(s) before it joins the others
        assert out_dir is not None
        manifest = read_manifest(Path(out_dir))
        if manifest is not None and manifest.world == ranks.world:
            saved = load_rank(Path(out_dir), manifest, ranks, setup.run_id)
        elif manifest is not None:  # written by another number of ranks
            rows = placement_rows(setup, ranks.world)[ranks.rank]
            saved, parts = load_parts(Path(out_dir), manifest, ranks, setup.run_id, rows)
            old_world = manifest.world
    seed_torch(config)
    join(ranks, config.transport.strict_timeout_s)
    try:
        with _threads_for(setup, "vectorized", rank_threads(setup, ranks, threads)):
            net = ShardedNetwork(setup, ranks)
            if saved is not None and parts is not None:
                saved["network"] = merge_parts(net, parts, old_world)
            every = config.run.checkpoint_every
            if ranks.rank != 0:
                _follow(net, config, share_folder(ranks, None) if every else None, saved)
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
                    lambda sets: run_name(config, setup, sets),
                )
            else:
                name = run_name(config, setup, overrides)
                out = open_run_dir(out_dir, name, force=force)
                text = dumps_toml(config_to_dict(config))
                (out / "config.toml").write_text(text, encoding="utf-8")
            if every:
                share_folder(ranks, out)
            summary: dict[str, Any] = _execute(
                setup,
                _Sharded(net, out),
                out,
                name=name,
                overrides=overrides,
                stream=stream,
                show_progress=show_progress,
                saved=saved,
                checkpoints=rank_folder(out, 0, ranks.world),
            )
            return summary
    finally:
        leave()


def rank_threads(setup: RunSetup, ranks: Ranks, threads: int | str | None) -> int | str | None:
    """``threads`` for one rank: ``"auto"`` is one thread per
    :data:`~fedcore.runtime.BYTES_PER_THREAD` of the rank's own block of the stack, up to
    its share of this machine's cores (the usable cores over the ranks on this machine,
    ``LOCAL_WORLD_SIZE`` as torchrun sets it, else all of them)."""
    if threads != "auto":
        return threads
    local = ranks.on_this_machine
    rows = -(-len(setup.graph.nodes) // ranks.world)
    size = rows * setup.start.numel() * setup.start.element_size()
    count = auto_threads(size, max(1, usable_cores() // max(1, local)))
    logger.info("threads: %d (%s of %d on this machine)", count, ranks.label, local)
    return count
