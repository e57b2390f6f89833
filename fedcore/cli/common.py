"""What the subcommands share: options declared once (argparse parent parsers), exit
statuses, the results table, and what a process that runs rounds sets first.

Nothing here imports torch: a subcommand imports what it needs when it runs, after its
arguments and config have been checked, so a bad command line answers at once.
"""

from __future__ import annotations

import argparse
import math
import signal
from typing import Any

from fedcore.errors import ConfigError, UserCodeError

__all__ = [
    "CONFIG",
    "DEPLOY",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "EXIT_USER_CODE",
    "RUN",
    "SET",
    "SIM_THREADS",
    "THREADS",
    "VERBOSE",
    "VERBOSE_HELP",
    "HelpFormatter",
    "deployment_targets",
    "print_table",
    "set_threads",
    "start_run",
    "thread_count",
    "tracking_overrides",
]

EXIT_USAGE = 2
"""Invalid input: a bad config, an unknown name, an invalid graph file, an unwritable path."""
EXIT_RUNTIME = 1
"""A run that failed on its way (a strict-mode peer that never answered)."""
EXIT_USER_CODE = UserCodeError.EXIT_STATUS
"""A user's algorithm failed at run time: its code raised, or returned what no engine can
use (:class:`~fedcore.errors.UserCodeError`; the traceback is in the run's ``error.log``)."""

VERBOSE_HELP = (
    "more logging: -v fedcore's steps and the traceback behind an error, -vv fedcore's "
    "debug lines, -vvv every library's"
)


def deployment_targets() -> str:
    """Every deployment target ``fedcore deploy --target`` may name: the built-in ones,
    those registered in this process, then those installed packages declare (from their
    metadata alone: none is imported)."""
    from fedcore import registry

    family = registry.DEPLOY_TARGETS
    return ", ".join(dict.fromkeys((*family.names, *family.installed())))


class HelpFormatter(argparse.HelpFormatter):
    """argparse's, but a help text's ``{targets}`` becomes :func:`deployment_targets` when
    help is shown, not when the parser is built (finding the installed targets reads every
    distribution's metadata: as long as building the whole parser takes)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text and "{targets}" in text:
            return text.replace("{targets}", deployment_targets())
        return text


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


VERBOSE = _parent()
"""``-v`` after the subcommand (as before it, on the main parser)."""
VERBOSE.add_argument(
    "-v", "--verbose", dest="sub_verbose", action="count", default=0, help=VERBOSE_HELP
)

CONFIG = _parent()
"""The experiment file, optional: the built-in run without one."""
CONFIG.add_argument("config", nargs="?", help="experiment TOML (default: built-in)")

SET = _parent()
"""``--set KEY=VALUE``, any number of times."""
SET.add_argument(
    "--set",
    dest="overrides",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="override a config key by dotted path, e.g. --set algorithm.name=dpsgd",
)

THREADS = _parent()
"""``--threads`` of a process that runs rounds."""
THREADS.add_argument(
    "--threads",
    type=int,
    default=1,
    help="torch intra-op threads (default 1: many small models gain nothing from more)",
)


def thread_count(text: str) -> int | str:
    """``--threads`` of ``simulate``: a whole number >= 1, or ``auto``."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 or auto, got {text!r}")
    return value


SIM_THREADS = _parent()
"""``simulate``'s ``--threads``: by default as many as the run's shape pays for."""
SIM_THREADS.add_argument(
    "--threads",
    type=thread_count,
    default="auto",
    metavar="N|auto",
    help="torch intra-op threads for the rounds (default auto: one per 2 MiB of the "
    "largest whole-state pass, up to the usable cores; the summary's threads says how many)",
)

DEPLOY = _parent()
"""What every deployment writer takes: the folder, and the peers' image and port."""
DEPLOY.add_argument("--out", required=True, metavar="DIR", help="folder to write")
DEPLOY.add_argument(
    "--image", default="fedcore:latest", metavar="NAME", help="default fedcore:latest"
)
DEPLOY.add_argument(
    "--port", type=int, default=7000, metavar="N", help="each peer's port (default 7000)"
)

RUN = argparse.ArgumentParser(add_help=False, parents=[CONFIG])
"""What ``simulate`` and ``launch`` both take: a run and its results folder."""
RUN.add_argument("--out", help="results folder (default: runs/<name>-<timestamp>)")
RUN.add_argument(
    "--name", help="the run's name (run.name; default: algorithm-topology, plus what --set changed)"
)
RUN.add_argument(
    "--force", action="store_true", help="replace the run an existing --out folder holds"
)
RUN.add_argument(
    "--tensorboard",
    action="store_true",
    help="run.tensorboard: also write TensorBoard event files into <results>/tensorboard/ "
    "(needs pip install 'fedcore[tensorboard]')",
)
RUN.add_argument(
    "--csv",
    action="store_true",
    help="run.csv: also write <results>/rounds.csv, one row of round aggregates a round",
)
RUN.add_argument(
    "-q",
    "--quiet",
    action="store_true",
    help="no progress or table; print only where the results are",
)


def tracking_overrides(args: argparse.Namespace) -> list[str]:
    """``--tensorboard`` and ``--csv`` as the ``--set`` items they stand for."""
    return [f"run.{key}=true" for key in ("tensorboard", "csv") if getattr(args, key, False)]


def refuse_beside_resume(args: argparse.Namespace, what: str, *more: tuple[str, object]) -> None:
    """``--resume`` continues ``what`` (a run, a launch, a sweep) as its folder says: refuse,
    in one line, the flags that would configure it again (``more``: a command's own
    ``(flag, value)`` pairs, refused when the value is truthy).

    Raises:
        ConfigError: such a flag was given.
    """
    given = [
        flag
        for flag, value in (
            ("CONFIG", args.config),
            ("--set", args.overrides),
            ("--out", args.out),
            ("--name", args.name),
            ("--force", args.force),
            ("--tensorboard", args.tensorboard),
            ("--csv", args.csv),
            *more,
        )
        if value
    ]
    if given:
        raise ConfigError(
            f"--resume continues the {what} in its folder as it was configured; drop "
            f"{', '.join(given)}."
        )


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: a run stops as it does on Ctrl-C (its summary says so)."""
    raise KeyboardInterrupt


def set_threads(threads: int | str) -> None:
    """``--threads``, and freed large blocks kept for reuse (:mod:`fedcore.runtime`): this
    process runs the rounds. ``auto`` sets one thread here: the run picks its count once
    its shape is known (:func:`fedcore.simulation.simulate.choose_threads`)."""
    if threads == "auto":
        threads = 1
    if not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}.")
    import torch

    from fedcore.runtime import keep_freed_memory

    torch.set_num_threads(threads)
    keep_freed_memory()


def start_run(threads: int | str) -> None:
    """What a process that runs rounds sets first: its torch threads, freed memory kept,
    and SIGTERM stopping a run as Ctrl-C does (its summary says so; it can be resumed)."""
    set_threads(threads)
    signal.signal(signal.SIGTERM, interrupt)


def _time_rows(summary: dict[str, Any], traffic: dict[str, Any]) -> list[tuple[str, str]]:
    """The results table's virtual time, late messages and time to the target accuracy."""
    rows = []
    time = summary.get("time")
    if time:
        mean = time.get("mean_utilisation")
        use = f" (mean utilisation {mean:.0%})" if isinstance(mean, float) else ""
        rows.append(("virtual time", f"{time['virtual_seconds']:.4g} s{use}"))
    if traffic.get("messages_late"):
        rows.append(("messages late", str(traffic["messages_late"])))
    if "time_to_target" in summary:
        hit = summary["time_to_target"]
        target = summary.get("target_accuracy")
        if hit is None:
            text = "not reached" + (f" ({target:g})" if target else "")
        else:
            # summary.json's round, as metrics.jsonl counts rounds: from 0.
            text = f"round {hit['round']}, accuracy {hit['accuracy']:.4f}"
            if hit.get("vtime") is not None:
                text += f", {hit['vtime']:.4g} virtual s"
        rows.append(("time to target", text))
    return rows


def _privacy_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The results table's epsilon of a private run (``summary["privacy"]``)."""
    p = summary.get("privacy")
    if not isinstance(p, dict):
        return []
    eps = p.get("epsilon")
    who = (
        f"cohort {p['cohort']} of {p['population']} users"
        if "cohort" in p
        else f"peer {p.get('peer')}, sampling rate {p['sampling_rate']:.3g}"
    )
    text = (f"{eps:.4g}" if isinstance(eps, float) else "infinite (no noise)") + (
        f" at delta {p['delta']:g} ({p['mechanism']}, {p['accountant']}; {who})"
    )
    if p.get("stopped_at_target"):
        text += f"; stopped at target {p['target_epsilon']:g}"
    return [("privacy epsilon", text)]


def _personal_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The results table's personal models (``[personal]``; ``summary["personal"]``): the
    mean and worst peer's accuracy of the shared and the personal models, each on the
    peer's own test set."""
    p = summary.get("personal")
    if not isinstance(p, dict):
        return []

    def pair(which: str) -> str:
        mean, worst = (p.get(f"{which}_{k}_accuracy") for k in ("mean", "worst"))
        return " / ".join(f"{v:.4f}" if isinstance(v, float) else "-" for v in (mean, worst))

    sets = "own test sets" if p.get("test_sets") == "own" else "test split by each peer's classes"
    how = f"{p.get('steps')} steps at lr {p.get('lr', math.nan):.4g}"
    return [
        ("shared mean / worst peer", pair("shared") + f" ({p.get('peers')} peers, {sets})"),
        ("personal mean / worst peer", pair("personal") + f" ({how})"),
    ]


def _engine(summary: dict[str, Any]) -> str:
    """What ran the run: an in-process engine (``messages``, ``vectorized``), or gRPC
    peers (``grpc peers (4 processes)`` for a ``launch``; peers that ran elsewhere and
    were merged by ``summarize`` have no process count)."""
    if summary.get("transport") != "grpc":
        return str(summary.get("engine", "messages"))
    per = summary.get("peers_per_process")
    if not isinstance(per, int) or per < 1:
        return "grpc peers"
    processes = -(-int(summary["nodes"]) // per)
    return f"grpc peers ({processes} process{'es' if processes != 1 else ''})"


def print_table(summary: dict[str, Any]) -> None:
    # Figures that are not numbers (a diverged run) are null in summary.json.
    final = {k: math.nan if v is None else v for k, v in summary.get("final", {}).items()}
    traffic = summary.get("traffic", {})
    gap = summary["topology"]["spectral_gap"]
    own = " (own test sets)" if final.get("node_test_sets") == "own" else ""
    sample = final.get("eval_peers")  # run.eval_peers: the per-node figures are a sample's
    if isinstance(sample, dict):
        own += f" (a sample of {sample.get('sampled')} of {sample.get('of')} peers)"
    rows = [
        ("algorithm", summary["algorithm"]),
        (
            "topology",
            f"{summary['topology']['name']} "
            + (f"(gap {gap:.3f})" if gap is not None else "(gap not computed: too many nodes)"),
        ),
        ("nodes x rounds", f"{summary['nodes']} x {summary['rounds']}"),
        *(
            [("status", f"{status} after round {summary.get('rounds_completed')}")]
            if (status := summary.get("status", "completed")) != "completed"
            else []
        ),
        ("avg-model accuracy", f"{final.get('avg_model_accuracy', float('nan')):.4f}"),
        *(
            [  # a cohort run holds no other client's model: the global model's figures only
                (
                    "clients",
                    f"{summary['population']}, {summary['cohort']} a round, "
                    f"{summary['clients_held']} held at the end",
                ),
            ]
            if "population" in summary
            else [
                ("mean node accuracy", f"{final.get('mean_node_accuracy', math.nan):.4f}{own}"),
                ("min node accuracy", f"{final.get('min_node_accuracy', math.nan):.4f}{own}"),
                ("consensus distance", f"{final.get('consensus_distance', math.nan):.4g}"),
                *_personal_rows(summary),
            ]
        ),
        ("average loss", f"{final.get('average_loss', float('nan')):.4f}"),
        *(
            (label, f"{final[key]:.4g} (average {final[f'average_{key}']:.4g})")
            for key, label in (
                ("static_regret", "static regret"),
                ("dynamic_regret", "dynamic regret"),
            )
            if isinstance(final.get(key), float) and math.isfinite(final[key])
        ),
        ("bytes / node / round", f"{traffic.get('bytes_per_node_per_round', 0):.0f}"),
        *(
            [("bytes / node / local step", f"{traffic['bytes_per_node_per_local_step']:.0f}")]
            if traffic.get("local_steps", 1) > 1
            else []
        ),
        (
            "messages missing",
            f"{traffic.get('messages_missing', 0)} (the fault plan lost "
            f"{traffic.get('messages_dropped', 0)} at their senders)",
        ),
        *_time_rows(summary, traffic),
        *_privacy_rows(summary),
        ("wall time", f"{summary['wall_seconds']:.1f} s"),
        ("engine", _engine(summary)),
        ("results", summary.get("out_dir", "")),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
