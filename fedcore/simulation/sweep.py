"""Seed sweeps: one config run once per seed, and mean ± std of the final figures.

``fedcore simulate CONFIG --seeds 0-4 [--jobs N]`` runs the config (with its ``--set``
overrides) once per seed, ``N`` runs at a time in worker processes, and writes::

    <sweep>/                  --out, or runs/<name>-seeds<spec>-<timestamp>
        sweep.json            seeds, overrides, status; per run: folder, status, final
                              figures (or why it failed); per figure: mean, std, n
        results.csv           one row per seed, then a mean and a std row
        seed-0/  seed-1/ ...  one ordinary run folder per seed (config.toml,
                              metrics.jsonl, summary.json, curves.png)

``sweep.json`` is rewritten as each run ends, so an interrupted sweep (Ctrl-C) still says
which seeds completed. ``fedcore plot <sweep>`` draws the runs of a sweep folder, and
``--bands`` their mean ± std. The standard deviation is the sample one (``ddof = 1``);
it is ``null`` (``-`` in the table) for fewer than two runs.

:func:`run_cases` runs several labelled cases (lists of overrides) over the same seeds
in one pool of workers, one sweep folder per case (the ``scripts/*_results.py`` grids).

The parts: :mod:`~fedcore.simulation.seeds` reads ``--seeds``,
:mod:`~fedcore.simulation.sweep_workers` runs the seeds (in worker processes), and
:mod:`~fedcore.simulation.sweep_figures` collects their final figures.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fedcore.algorithms.user import is_import_path
from fedcore.config import Config, load_config, parse_override
from fedcore.errors import ConfigError, FedcoreError
from fedcore.ids import child_path, clip
from fedcore.metrics import to_json_text, write_text_atomic
from fedcore.progress import Note
from fedcore.setup.plan import AlgorithmInputs, configured_algorithm
from fedcore.simulation.results import NAME_SKIPS, RUN_FILES, name_part, open_run_dir
from fedcore.simulation.seed_batch import check_batchable, run_batched
from fedcore.simulation.seeds import _SEED_FORMS, MAX_SEEDS, format_seeds
from fedcore.simulation.sweep_figures import FIGURES, _csv_text, mean_std
from fedcore.simulation.sweep_workers import _execute, _Outcome, _RunSpec

__all__ = [
    "RESULTS_CSV",
    "SWEEP_FILE",
    "resume_sweep",
    "run_cases",
    "run_sweep",
    "sweep_name",
    "sweep_table",
]

logger = logging.getLogger(__name__)


SWEEP_FILE = "sweep.json"
"""The file that makes a folder a sweep folder (``fedcore plot`` expands it to its runs)."""

RESULTS_CSV = "results.csv"
"""The sweep's table of final figures, one row per seed."""


@dataclass
class _Group:
    """One sweep folder: a label, its overrides and its seeds' outcomes."""

    label: str
    overrides: tuple[str, ...]
    folder: Path
    seeds: list[int]
    config: str | None
    outcomes: dict[int, _Outcome] = field(default_factory=dict)
    began: float = field(default_factory=time.perf_counter)
    resumed: bool = False

    def run_dir(self, seed: int) -> Path:
        """The folder of one seed's run."""
        return self.folder / f"seed-{seed}"


def _check_folder(folder: Path, seeds: Sequence[int], *, force: bool) -> None:
    """Refuse a sweep folder that holds another sweep (or runs where ours go) unless
    ``force``; with ``force``, the old sweep files go."""
    taken = [f for f in (SWEEP_FILE, RESULTS_CSV) if (folder / f).exists()]
    taken += [
        f"seed-{k}/" for k in seeds if any((folder / f"seed-{k}" / f).exists() for f in RUN_FILES)
    ]
    if taken and not force:
        shown = ", ".join(taken[:4]) + (" ..." if len(taken) > 4 else "")
        raise ConfigError(
            f"sweep folder {str(folder)!r} holds another sweep ({shown}); give another "
            "--out, or --force to replace it."
        )
    for f in (SWEEP_FILE, RESULTS_CSV):
        if (folder / f).exists():
            (folder / f).unlink()


def _validate(
    config: str | None,
    overrides: Sequence[str],
    seeds: Sequence[int],
    jobs: int,
    threads: int | str,
) -> Config:
    """Check everything that can be checked before any run; return the base config."""
    for value, option in ((jobs, "--jobs"), (threads, "--threads")):
        if option == "--threads" and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{option} must be a whole number >= 1, got {value!r}.")
    if not seeds:
        raise ConfigError(f"a sweep needs at least one seed; {_SEED_FORMS}.")
    if len(seeds) > MAX_SEEDS:
        raise ConfigError(f"a sweep runs at most {MAX_SEEDS} seeds, not {len(seeds)}.")
    if len(set(seeds)) != len(seeds):
        raise ConfigError("a sweep lists each seed once; some seed is listed twice.")
    for item in overrides:
        if parse_override(item)[0] == ["run", "seed"]:
            raise ConfigError(f"--seeds sets run.seed of each run; drop --set {clip(item, 40)}.")
    base = load_config(config, overrides)
    for seed in seeds:  # a seed the config cannot take (run.seed's range) fails here
        load_config(config, [*overrides, f"run.seed={seed}"])
    return base


def sweep_name(config: Config, overrides: Sequence[str], seeds: Sequence[int]) -> str:
    """``<name>-seeds<spec>``: the run's name (``run.name``, or ``<algorithm>-<topology>``
    followed by what ``--set`` changed, as ``simulate`` names runs), cut so that the seeds
    survive in a folder name of 100 characters, and the seeds."""
    keys = [item.partition("=")[0].strip() for item in overrides]
    if "run.name" in keys and config.run.name:
        base = config.run.name
    else:
        topo = config.topology
        graph = Path(topo.file).stem if topo.file else f"{topo.kind}-{topo.nodes}"
        # A user's algorithm ("pkg.module:factory") is named by its own name.
        algorithm = config.algorithm.name
        if is_import_path(algorithm):
            algorithm = configured_algorithm(AlgorithmInputs.of(config)).name
        changed = [
            name_part(item, algorithm)
            for item, key in zip(overrides, keys, strict=True)
            if key != "run.name" and not key.startswith(NAME_SKIPS)
        ]
        base = "-".join([config.run.name or f"{algorithm}-{graph}", *changed])
    suffix = f"-seeds{format_seeds(seeds)}"
    return base[: max(10, 100 - len(suffix))] + suffix  # folder names keep 100 characters


def _record(group: _Group, *, status: str, jobs: int) -> dict[str, Any]:
    """The sweep.json content of ``group`` as it stands."""
    runs: list[dict[str, Any]] = []
    for seed in group.seeds:
        outcome = group.outcomes.get(seed)
        run: dict[str, Any] = {"seed": seed, "out_dir": f"seed-{seed}"}
        if outcome is not None:
            run.update(status=outcome.status, final=outcome.figures)
            if outcome.reason is not None:
                run["reason"] = outcome.reason
        else:  # not finished: still to come, or stopped with the sweep
            run["status"] = "interrupted" if status == "interrupted" else "pending"
        runs.append(run)
    completed = [o for o in group.outcomes.values() if o.status == "completed"]
    stats: dict[str, dict[str, Any]] = {}
    for key, _, _ in FIGURES:
        if not any(key in o.figures for o in completed):
            continue
        values = [v for o in completed if (v := o.figures.get(key)) is not None]
        mean, std = mean_std(values)
        stats[key] = {"mean": mean, "std": std, "n": len(values)}
    return {
        "kind": "sweep",
        "name": group.label,
        "config": group.config,
        "overrides": list(group.overrides),
        "seeds": list(group.seeds),
        "jobs": jobs,
        "status": status,
        "completed": sorted(o.seed for o in completed),
        "failed": sorted(o.seed for o in group.outcomes.values() if o.status == "failed"),
        "runs": runs,
        "stats": stats,
        "wall_seconds": time.perf_counter() - group.began,
    }


def _write(group: _Group, *, status: str, jobs: int) -> dict[str, Any]:
    """Write sweep.json and results.csv of ``group``; return the record, with its
    ``out_dir``."""
    record = _record(group, status=status, jobs=jobs)
    write_text_atomic(group.folder / SWEEP_FILE, to_json_text(record, indent=2) + "\n")
    write_text_atomic(group.folder / RESULTS_CSV, _csv_text(record))
    return {**record, "out_dir": str(group.folder)}


def _run_groups(
    groups: Sequence[_Group],
    *,
    jobs: int,
    threads: int | str,
    force: bool,
    show_progress: bool,
    stream: TextIO,
    prefix: Callable[[_Group], str],
    on_update: Callable[[], None] | None = None,
    batch: bool = False,
) -> list[dict[str, Any]]:
    """Run every seed of every group that has no outcome yet (a resumed sweep keeps its
    completed runs), writing each group's files as its runs end; ``on_update`` is called
    after each write."""
    # Runs in this process take ``threads`` for their rounds; worker processes keep the
    # count :func:`_init_worker` set.
    in_process = jobs == 1 or sum(len(g.seeds) - len(g.outcomes) for g in groups) <= 1
    specs = [
        _RunSpec(
            g,
            seed,
            group.config,
            group.overrides,
            str(group.run_dir(seed)),
            force,
            threads if in_process else None,
            group.resumed,
        )
        for g, group in enumerate(groups)
        for seed in group.seeds
        if seed not in group.outcomes
    ]
    total = len(specs)
    finished = 0
    said: set[Note] = set()
    for group in groups:
        _write(group, status="running", jobs=jobs)
    if on_update is not None:
        on_update()

    def on_done(outcome: _Outcome) -> None:
        nonlocal finished
        finished += 1
        group = groups[outcome.group]
        group.outcomes[outcome.seed] = outcome
        _write(group, status="running", jobs=jobs)
        if on_update is not None:
            on_update()
        if not show_progress:
            return  # quiet: each run's summary lists its warnings
        for note in outcome.notes:  # each distinct warning once, not once a run
            if note not in said:
                said.add(note)
                note.log()
        head = f"{prefix(group)}seed {outcome.seed} [{finished}/{total}]"
        if outcome.status == "failed":
            line = f"{head}: failed: {outcome.reason}"
        else:
            acc = outcome.figures.get("avg_model_accuracy")
            wall = outcome.figures.get("wall_seconds")
            line = (
                f"{head}: avg-model accuracy "
                + ("-" if acc is None else f"{acc:.4f}")
                + ("" if wall is None else f", {wall:.1f} s")
            )
        print(line, file=stream, flush=True)

    try:
        if batch:  # the seeds as blocks of one vectorized network
            run_batched(
                specs, threads=threads, on_done=on_done, stream=stream if show_progress else None
            )
        else:
            _execute(specs, jobs=jobs, threads=threads, on_done=on_done)
    except KeyboardInterrupt:
        for group in groups:
            _write(group, status=_final_status(group, "interrupted"), jobs=jobs)
        where = groups[0].folder if len(groups) == 1 else groups[0].folder.parent
        raise KeyboardInterrupt(
            f"after {finished} of {total} runs; the sweep so far is in {where} "
            f"({SWEEP_FILE} says which seeds completed)"
        ) from None
    except BrokenProcessPool:
        for group in groups:
            _write(group, status="failed", jobs=jobs)
        raise FedcoreError(
            "a worker process of the sweep died (out of memory?); run fewer at a time "
            "(a smaller --jobs)."
        ) from None
    except BaseException:
        for group in groups:
            _write(group, status="failed", jobs=jobs)
        raise
    return [_write(group, status=_final_status(group, "failed"), jobs=jobs) for group in groups]


def _final_status(group: _Group, unfinished: str) -> str:
    """``unfinished`` while seeds have no outcome, else ``failed`` if every run failed,
    else ``completed``."""
    if len(group.outcomes) < len(group.seeds):
        return unfinished
    failed = all(o.status == "failed" for o in group.outcomes.values())
    return "failed" if failed else "completed"


def run_sweep(
    config: str | Path | None,
    overrides: Sequence[str],
    seeds: Sequence[int],
    *,
    jobs: int = 1,
    out_dir: str | Path | None = None,
    force: bool = False,
    show_progress: bool = True,
    threads: int | str = 1,
    progress_stream: TextIO | None = None,
    batch: bool = False,
) -> dict[str, Any]:
    """Run ``config`` with ``overrides`` once per seed; write the sweep folder.

    Args:
        config: The experiment TOML (None: the built-in run).
        overrides: ``--set`` items, for every run (``run.seed`` is the sweep's).
        seeds: The seeds (see :func:`parse_seeds`), each once.
        jobs: Runs at a time; 1 runs them one after another in this process, more in
            spawned worker processes.
        out_dir: The sweep folder (default ``runs/<name>-seeds<spec>-<timestamp>``).
        force: Replace the sweep an existing ``out_dir`` holds.
        show_progress: One line on ``progress_stream`` (default stderr) per run that ends.
        threads: torch threads of each run: a number, or ``"auto"`` (by the run's shape,
            :func:`~fedcore.simulation.simulate.choose_threads`; one per worker process
            when ``jobs > 1``).
        progress_stream: Where the progress lines go.
        batch: The seeds as blocks of one vectorized network in this process
            (``--batch-seeds``, :mod:`~fedcore.simulation.seed_batch`); ``jobs`` 1.

    Returns:
        The ``sweep.json`` content, plus ``out_dir`` (the sweep folder).

    Raises:
        ConfigError: invalid config, overrides, seeds, ``jobs`` or ``out_dir``, or a
            ``batch`` of a config whose seeds cannot be batched (before any run).
        FedcoreError: every run failed (the first run's error class, with its reason).
        KeyboardInterrupt: Ctrl-C; the workers are stopped and ``sweep.json`` says which
            seeds completed.
    """
    # The config by its absolute path: --resume reads it from sweep.json, maybe elsewhere.
    path = None if config is None else str(Path(config).resolve())
    seeds = list(seeds)
    base = _validate(path, overrides, seeds, jobs, threads)
    if batch:
        check_batchable(base, jobs)
    name = sweep_name(base, overrides, seeds)
    folder = open_run_dir(out_dir, name, force=force)
    _check_folder(folder, seeds, force=force)
    group = _Group(name, tuple(overrides), folder, seeds, path)
    return _run_sweep_group(
        group,
        jobs=jobs,
        threads=threads,
        force=force,
        show_progress=show_progress,
        progress_stream=progress_stream,
        batch=batch,
    )


def resume_sweep(
    folder: str | Path,
    *,
    jobs: int = 1,
    show_progress: bool = True,
    threads: int | str = 1,
    progress_stream: TextIO | None = None,
) -> dict[str, Any]:
    """Continue the stopped seed sweep in ``folder``: its completed runs are kept, a run
    stopped with checkpoints continues from them (it ends as if never stopped), the rest
    run from round 0; as configured (the config, overrides and seeds ``sweep.json``
    records). Returns and raises as :func:`run_sweep`.

    Raises:
        ConfigError: ``folder`` holds no seed sweep, a completed one, or its config file
            is gone.
    """
    folder = Path(folder)
    where = folder / SWEEP_FILE
    try:
        record = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{str(folder)!r} holds no sweep to resume (no {SWEEP_FILE}).") from None
    except (OSError, UnicodeError, ValueError):
        raise ConfigError(f"{where} is not a readable sweep file; cannot resume it.") from None
    if not isinstance(record, dict) or record.get("kind") != "sweep":
        kind = record.get("kind") if isinstance(record, dict) else None
        hint = f"; continue it with: fedcore sweep --resume {folder}" if kind == "grid" else ""
        raise ConfigError(f"{where} is not a seed sweep's{hint}.")
    if record.get("status") == "completed":
        raise ConfigError(f"the sweep in {str(folder)!r} completed; there is nothing to resume.")
    try:
        config = record["config"]
        overrides = [str(item) for item in record["overrides"]]
        seeds = [int(seed) for seed in record["seeds"]]
        name = str(record["name"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where} is not a readable sweep file; cannot resume it.") from None
    if config is not None and not Path(config).is_file():
        raise ConfigError(
            f"the sweep's config {config!r} is not there any more; the sweep cannot resume."
        )
    _validate(config, overrides, seeds, jobs, threads)
    group = _Group(name, tuple(overrides), folder, seeds, config, resumed=True)
    _keep_completed(group)
    return _run_sweep_group(
        group,
        jobs=jobs,
        threads=threads,
        force=False,
        show_progress=show_progress,
        progress_stream=progress_stream,
    )


def _run_sweep_group(
    group: _Group,
    *,
    jobs: int,
    threads: int | str,
    force: bool,
    show_progress: bool,
    progress_stream: TextIO | None,
    batch: bool = False,
) -> dict[str, Any]:
    """Run a seed sweep's group; its result, or its error when every run failed."""
    folder, seeds = group.folder, group.seeds
    try:
        (result,) = _run_groups(
            [group],
            jobs=jobs,
            threads=threads,
            force=force,
            show_progress=show_progress,
            stream=progress_stream if progress_stream is not None else sys.stderr,
            prefix=lambda _: "sweep: ",
            batch=batch,
        )
    except KeyboardInterrupt as stop:
        raise KeyboardInterrupt(
            f"{stop}; continue with: fedcore simulate --resume {folder}"
        ) from None
    if result["status"] == "failed":
        first = group.outcomes[seeds[0]]
        message = (
            f"every run of the sweep failed (see {folder / SWEEP_FILE}); "
            f"seed {first.seed}: {first.reason}"
        )
        error_type = first.error or FedcoreError
        try:
            error = error_type(message)
        except Exception:  # an error class that takes other arguments
            error = FedcoreError(message)
        raise error
    return result


def _slug(label: str) -> str:
    """A label as a folder name: ``"OPS (push-sum)"`` -> ``OPS_push-sum``."""
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", label).strip("._=-")[:100] or "case"


def run_cases(
    config: str | Path | None,
    cases: Sequence[tuple[str, Sequence[str]]],
    seeds: Sequence[int],
    *,
    out_dir: str | Path,
    jobs: int = 1,
    force: bool = False,
    show_progress: bool = True,
    threads: int | str = 1,
    progress_stream: TextIO | None = None,
    resume: bool = False,
    on_update: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Run each ``(label, overrides)`` case once per seed, all through one pool of
    ``jobs`` workers; one sweep folder per case, ``out_dir/<label as a folder name>``.

    Unlike :func:`run_sweep`, a case whose runs all fail is a result (status
    ``failed``), not an error: a method that diverges is a finding.

    With ``resume``, a case folder that already holds this case's ``sweep.json`` keeps
    its completed runs; every other run (interrupted, failed, never started) runs again,
    continuing from its checkpoints where it left some (``run.checkpoint_every``).
    ``on_update`` is called each time a case's files are rewritten (a run ended).

    Returns:
        Per case, in order, its ``sweep.json`` content plus ``label`` and ``out_dir``.

    Raises:
        ConfigError: an invalid case, seeds, ``jobs``, or a case folder that holds
            another sweep without ``force`` or ``resume`` (before any run).
    """
    path = None if config is None else str(config)
    seeds = list(seeds)
    parent = Path(out_dir)
    used: set[str] = set()
    groups: list[_Group] = []
    for label, overrides in cases:
        _validate(path, overrides, seeds, jobs, threads)
        name = _slug(label)
        k = 1
        while (name if k == 1 else f"{name}-{k}") in used:
            k += 1
        name = name if k == 1 else f"{name}-{k}"
        used.add(name)
        folder = child_path(parent, name, ConfigError)
        group = _Group(label, tuple(overrides), folder, seeds, path, resumed=resume)
        if resume and (folder / SWEEP_FILE).is_file():
            _keep_completed(group)
        else:
            _check_folder(folder, seeds, force=force)
        groups.append(group)
    for group in groups:
        group.folder.mkdir(parents=True, exist_ok=True)
        group.began = time.perf_counter()
    results = _run_groups(
        groups,
        jobs=jobs,
        threads=threads,
        force=force,
        show_progress=show_progress,
        stream=progress_stream if progress_stream is not None else sys.stderr,
        prefix=lambda g: f"{g.label}: ",
        on_update=on_update,
    )
    return [{**r, "label": g.label} for g, r in zip(groups, results, strict=True)]


def _keep_completed(group: _Group) -> None:
    """Take the completed runs of the case's ``sweep.json`` (a resumed sweep) as done.

    Raises:
        ConfigError: the file is unreadable or records another case.
    """
    where = group.folder / SWEEP_FILE
    try:
        record = json.loads(where.read_text(encoding="utf-8"))
        same = list(record["overrides"]) == list(group.overrides)
        runs = [r for r in record["runs"] if r.get("status") == "completed"]
        done = {int(r["seed"]): dict(r.get("final") or {}) for r in runs}
    except (OSError, UnicodeError, ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"{where} is not a readable sweep file; cannot resume it.") from None
    if not same:
        raise ConfigError(f"{where} records another case than {group.label!r}; cannot resume.")
    for seed, figures in done.items():
        if seed in group.seeds:
            group.outcomes[seed] = _Outcome(-1, seed, "completed", figures)


# --- the console table -----------------------------------------------------------------


def sweep_table(result: Mapping[str, Any]) -> str:
    """The console table of a sweep: per final figure, mean ± std over completed runs."""
    seeds = list(result["seeds"])
    completed = list(result.get("completed", []))
    failed = list(result.get("failed", []))
    rows: list[tuple[str, str]] = [
        ("sweep", str(result.get("name", ""))),
        (
            "runs",
            f"{len(seeds)} (seeds {format_seeds(seeds).replace('_', ',')}), "
            f"{len(completed)} completed" + (f", {len(failed)} failed" if failed else ""),
        ),
    ]
    stats = result.get("stats", {})
    for key, label, fmt in FIGURES:
        if key not in stats:
            continue
        mean, std, n = stats[key]["mean"], stats[key]["std"], stats[key]["n"]
        text = "-" if mean is None else format(mean, fmt)
        text += " ± " + ("-" if std is None else format(std, fmt))
        if n < len(completed):
            text += f" ({n} of {len(completed)} runs a number)"
        rows.append((label, text))
    for run in result.get("runs", []):
        if run.get("status") == "failed":
            rows.append((f"seed {run['seed']} failed", str(run.get("reason", ""))))
    out = Path(str(result.get("out_dir", "")))
    rows.append(("results", f"{out} ({SWEEP_FILE}, {RESULTS_CSV}, seed-*/)"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {key:<{width}}  {value}" for key, value in rows)
