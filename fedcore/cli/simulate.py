"""``fedcore simulate``: every peer of a run in this process (a run, a seed sweep, or a
resumed run)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from fedcore.cli.common import (
    RUN,
    SET,
    SIM_THREADS,
    VERBOSE,
    print_table,
    refuse_beside_resume,
    start_run,
    tracking_overrides,
)
from fedcore.config import ENGINES
from fedcore.errors import ConfigError

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore simulate`` to ``sub``."""
    sim = sub.add_parser(
        "simulate",
        parents=[RUN, SET, SIM_THREADS, VERBOSE],
        help="run every peer in this process",
        description="Run every peer of CONFIG in this process (default: the built-in run, "
        "OPS on a 16-node directed social trust graph with digits).",
    )
    sim.add_argument(
        "--engine",
        choices=ENGINES,
        help="simulate.engine: 'vectorized' (every node's round at once), 'messages' (one "
        "node object per peer, exchanging encoded messages), 'auto' (vectorized where "
        "it supports the config; the default) or 'cohort' (FedAvg over a population, only "
        "the round's cohort in memory)",
    )
    sim.add_argument(
        "--device", metavar="DEV", help="simulate.device: cpu (default), cuda or cuda:K"
    )
    sim.add_argument(
        "--seeds",
        metavar="SEEDS",
        help="a seed sweep: run the config once per seed (e.g. 0-4 or 0,3,7), one folder "
        "each, and a table and results.csv of mean +- std of the final figures",
    )
    sim.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="with --seeds: runs in parallel worker processes (default 1)",
    )
    sim.add_argument(
        "--batch-seeds",
        action="store_true",
        help="with --seeds: run the seeds as blocks of rows of one vectorized network in "
        "this process (a small config's seeds several times faster), each seed's folder "
        "as its separate run's (docs/command-line.md)",
    )
    sim.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the interrupted run in RUN_DIR from its last checkpoint "
        "(run.checkpoint_every); it ends as the uninterrupted run would. A sharded run's "
        "folder (--ranks): its ranks start again, each from its own checkpoint (--ranks R': "
        "a vectorized run's peers re-sharded on R' ranks). A seed sweep's folder: run the "
        "seeds that did not complete (--jobs allowed)",
    )
    sim.add_argument(
        "--ranks",
        type=int,
        metavar="R",
        help="shard the vectorized engine over R local processes (torch.distributed, gloo "
        "on 127.0.0.1); rank 0 writes the results. Under torchrun, rank and world size "
        "come from its environment (docs/engines.md, 'Several processes')",
    )
    sim.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.ranks is not None or _torchrun_environment():
        return _ranked(args)
    if args.device is not None and not args.device.strip():
        raise ConfigError(
            f"--device {args.device!r} names no device; give cpu, cuda or cuda:K, or leave "
            "--device out (simulate.device, default cpu)."
        )
    if args.resume is not None:
        from fedcore.simulation.sweep import SWEEP_FILE

        sweep = (Path(args.resume) / SWEEP_FILE).is_file()
        refuse_beside_resume(
            args,
            "sweep" if sweep else "run",
            ("--seeds", args.seeds),
            ("--engine", args.engine),
            ("--device", args.device),
            ("--jobs", args.jobs != 1 and not sweep),
            ("--batch-seeds", args.batch_seeds),
        )
        if not sweep:
            from fedcore.simulation.rank_checkpoints import sharded_world

            if sharded_world(Path(args.resume)) is not None:  # its ranks resume it
                return _ranked(args)
        start_run(args.threads)
        if sweep:
            from fedcore.simulation.sweep import resume_sweep, sweep_table

            result = resume_sweep(
                args.resume, jobs=args.jobs, show_progress=not args.quiet, threads=args.threads
            )
            print(f"results: {result['out_dir']}" if args.quiet else sweep_table(result))
            return 0
        from fedcore.simulation.simulate import resume

        summary: dict[str, Any] | None = resume(
            args.resume, show_progress=not args.quiet, threads=args.threads
        )
    elif args.jobs != 1 and args.seeds is None:
        raise ConfigError("--jobs runs the seeds of a sweep in parallel; give --seeds too.")
    elif args.batch_seeds and args.seeds is None:
        raise ConfigError("--batch-seeds runs the seeds of a sweep as one batch; give --seeds too.")
    else:
        summary = _simulate_new(args)
    if summary is None:  # a sweep, which printed its own table
        return 0
    if args.quiet:
        print(f"results: {summary['out_dir']}")
    else:
        print_table(summary)
    return 0


def _overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` items and those the flags stand for."""
    overrides = [*args.overrides, *tracking_overrides(args)]
    if args.engine:
        overrides.append(f"simulate.engine={args.engine}")
    if args.device is not None:
        overrides.append(f"simulate.device={json.dumps(args.device)}")
    if args.name is not None:
        overrides.append(f"run.name={json.dumps(args.name)}")
    return overrides


_TORCHRUN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""The variables torchrun sets (fedcore.engines.ranks.ENVIRONMENT, named here so that a
plain run imports no torch before its config is checked)."""


RANKS_PER_CORE = 4
"""``--ranks R`` starts at most this many local processes per usable core."""


def _torchrun_environment() -> bool:
    return any(os.environ.get(name) for name in _TORCHRUN)


def _ranked(args: argparse.Namespace) -> int:
    """``--ranks R``: start R local ranks; or, under torchrun's environment, be one (of a
    new run, or of the sharded run ``--resume`` continues)."""
    given = [
        flag
        for flag, value in (
            ("--seeds", args.seeds),
            ("--jobs", args.jobs != 1),
            ("--batch-seeds", args.batch_seeds),
        )
        if value
    ]
    if given:
        raise ConfigError(
            f"a sharded run (--ranks, or torchrun's environment) runs one run; drop "
            f"{', '.join(given)}."
        )
    if args.resume is not None:
        return _resume_ranked(args)
    if args.ranks is not None and args.ranks < 1:
        raise ConfigError(f"--ranks must be at least 1, got {args.ranks}.")
    if args.ranks is not None and not _torchrun_environment():
        _check_local_ranks(args.ranks)
    from fedcore.config import load_config

    overrides = _overrides(args)
    config = load_config(args.config, overrides)
    return _rank_or_launch(args, config, overrides, args.ranks, resume=None)


def _check_local_ranks(count: int) -> None:
    """Refuse to start more local ranks than :data:`RANKS_PER_CORE` a usable core."""
    from fedcore.runtime import usable_cores

    most = RANKS_PER_CORE * usable_cores()
    if count > most:
        raise ConfigError(
            f"--ranks {count} would start {count} processes on this machine's "
            f"{usable_cores()} cores; at most {most} ({RANKS_PER_CORE} a core: each rank "
            "loads torch and the data, and more only wait on each other). Across "
            "machines, start them with torchrun."
        )


def _resume_ranked(args: argparse.Namespace) -> int:
    """``--resume RUN_DIR`` of a sharded run: start its ranks (``--ranks``, else as many
    as wrote its checkpoints; another number re-shards a vectorized run's rows), or,
    under torchrun's environment, be one."""
    refuse_beside_resume(args, "run", ("--engine", args.engine), ("--device", args.device))
    if args.ranks is not None and args.ranks < 1:
        raise ConfigError(f"--ranks must be at least 1, got {args.ranks}.")
    from fedcore.config import load_config
    from fedcore.simulation.rank_checkpoints import (
        check_world,
        read_manifest,
        sharded_world,
        verify_files,
    )

    run_dir = Path(args.resume)
    world = sharded_world(run_dir)
    if world is None:
        raise ConfigError(
            f"{str(run_dir)!r} holds a one-process run: resume it without --ranks "
            f"(fedcore simulate --resume {run_dir})."
        )
    config = load_config(run_dir / "config.toml")
    manifest = read_manifest(run_dir)
    if not _torchrun_environment():
        if manifest is not None:
            if config.simulate.engine == "cohort":  # a vectorized run's rows are re-sharded
                check_world(manifest, args.ranks or world, run_dir, torchrun=False, held="clients")
            verify_files(manifest)
        _check_local_ranks(args.ranks or world)
    return _rank_or_launch(args, config, [], args.ranks or world, resume=run_dir)


def _rank_or_launch(
    args: argparse.Namespace,
    config: Any,
    overrides: list[str],
    world: int | None,
    *,
    resume: Path | None,
) -> int:
    """Start ``world`` local ranks of ``config`` (or the run ``resume`` continues), or,
    under torchrun's environment, be one."""
    from fedcore.engines.shard_refusal import config_refusal

    why = config_refusal(config)
    if why is not None:
        raise ConfigError(f"a sharded run cannot run this config: {why}.")
    if not _torchrun_environment():  # the launcher of --ranks R: it imports no torch
        import signal

        from fedcore.cli.common import interrupt
        from fedcore.simulation.rank_launch import launch_local

        assert world is not None
        signal.signal(signal.SIGTERM, interrupt)  # SIGTERM stops the ranks as Ctrl-C does
        return launch_local(args.argv, world, timeout_s=config.transport.strict_timeout_s)
    from fedcore.engines.ranks import from_environment

    ranks = from_environment()
    assert ranks is not None  # torchrun's environment is set
    if args.ranks is not None and args.ranks != ranks.world:
        raise ConfigError(
            f"--ranks {args.ranks} but the environment says WORLD_SIZE = {ranks.world}; "
            "drop --ranks under torchrun."
        )
    from fedcore.runtime import end_with_parent

    end_with_parent()  # a rank of `--ranks R`: not left running when its launcher dies
    start_run(args.threads)
    from fedcore.simulation.ranks import simulate_rank

    summary = simulate_rank(
        config,
        ranks,
        out_dir=args.out if resume is None else resume,
        show_progress=not args.quiet,
        force=args.force,
        overrides=overrides,
        threads=args.threads,
        resume=resume is not None,
    )
    if summary is None:  # not rank 0: rank 0 says how the run went
        return 0
    if args.quiet:
        print(f"results: {summary['out_dir']}")
    else:
        print_table(summary)
    return 0


def _simulate_new(args: argparse.Namespace) -> dict[str, Any] | None:
    from fedcore.config import load_config

    overrides = _overrides(args)
    # The config first: a bad file or --set answers before torch is imported.
    config = load_config(args.config, overrides)
    if args.seeds is not None:
        from fedcore.simulation.seeds import parse_seeds

        seeds = parse_seeds(args.seeds)
        start_run(args.threads)
        from fedcore.simulation.sweep import run_sweep, sweep_table

        result = run_sweep(
            args.config,
            overrides,
            seeds,
            jobs=args.jobs,
            out_dir=args.out,
            force=args.force,
            show_progress=not args.quiet,
            threads=args.threads,
            batch=args.batch_seeds,
        )
        print(f"results: {result['out_dir']}" if args.quiet else sweep_table(result))
        return None
    start_run(args.threads)
    from fedcore.simulation.simulate import simulate

    return simulate(
        config,
        out_dir=args.out,
        show_progress=not args.quiet,
        force=args.force,
        overrides=overrides,
        threads=args.threads,
    )
