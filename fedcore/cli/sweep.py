"""``fedcore sweep``: a grid of config values, each cell run once per seed."""

from __future__ import annotations

import argparse
import json

from fedcore.cli.common import RUN, SET, SIM_THREADS, VERBOSE, start_run
from fedcore.errors import ConfigError

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore sweep`` to ``sub``."""
    sweep = sub.add_parser(
        "sweep",
        parents=[RUN, SET, SIM_THREADS, VERBOSE],
        help="run a grid of config values, each cell once per seed",
        description="Run the cross product of the --grid values (each cell once per seed, "
        "one folder each) and write results.csv: a row per cell, mean and std of every "
        "final figure, and the best cell.",
    )
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a grid axis: a config key and its values, as --set takes them (e.g. "
        "algorithm.lr=0.1,0.3,1); give one --grid per key",
    )
    sweep.add_argument(
        "--seeds",
        default="0",
        metavar="SEEDS",
        help="the seeds of every cell (e.g. 0-2 or 0,3,7; default 0)",
    )
    sweep.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="runs in parallel worker processes"
    )
    sweep.add_argument(
        "--best",
        metavar="FIGURE",
        help="the final figure that picks the best cell (default avg_model_accuracy, else "
        "average_static_regret, else average_loss); the highest accuracy, else the lowest",
    )
    sweep.add_argument(
        "--resume",
        metavar="GRID_DIR",
        help="run what an interrupted grid in GRID_DIR did not complete (its completed runs "
        "are kept; a run with checkpoints continues from them)",
    )
    sweep.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore.simulation.grid import (
        GridAxis,
        grid_table,
        parse_grid,
        read_grid,
        validate_grid,
    )
    from fedcore.simulation.seeds import parse_seeds

    if args.resume is not None:
        given = [
            flag
            for flag, value in (
                ("CONFIG", args.config),
                ("--grid", args.grid),
                ("--set", args.overrides),
                ("--out", args.out),
                ("--name", args.name),
                ("--force", args.force),
                ("--best", args.best),
                ("--seeds", args.seeds != "0"),
            )
            if value
        ]
        if given:
            raise ConfigError(
                f"--resume continues the grid in its folder as it was configured; drop "
                f"{', '.join(given)}."
            )
        record = read_grid(args.resume)
        config = record["config"]
        overrides = list(record["overrides"])
        axes = [GridAxis(k, tuple(v)) for k, v in record["grid"].items()]
        seeds = [int(s) for s in record["seeds"]]
        best = record.get("best_metric")
        out_dir = args.resume
    else:
        if not args.grid:
            raise ConfigError(
                "fedcore sweep needs at least one --grid KEY=V1,V2 (e.g. --grid "
                "algorithm.lr=0.1,0.3); for seeds alone, fedcore simulate --seeds."
            )
        config = args.config
        overrides = list(args.overrides)
        if args.name is not None:
            overrides.append(f"run.name={json.dumps(args.name)}")
        axes = parse_grid(args.grid)
        seeds = parse_seeds(args.seeds)
        best = args.best
        out_dir = args.out
    if isinstance(args.jobs, bool) or args.jobs < 1:
        raise ConfigError(f"--jobs must be a whole number >= 1, got {args.jobs!r}.")
    # Every cell and seed checked here: a bad value answers before torch is imported.
    validate_grid(config, overrides, axes, seeds, best)
    start_run(args.threads)
    from fedcore.simulation.grid import run_grid

    result = run_grid(
        config,
        overrides,
        axes,
        seeds,
        jobs=args.jobs,
        out_dir=out_dir,
        force=args.force,
        resume=args.resume is not None,
        best=best,
        show_progress=not args.quiet,
        threads=args.threads,
    )
    print(f"results: {result['out_dir']}" if args.quiet else grid_table(result))
    return 0
