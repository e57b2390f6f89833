"""``fedcore launch``: the peers of a run as ``fedcore node`` processes on this machine,
over gRPC.

The launcher validates the config (the same checks as ``simulate``), picks free ports on
127.0.0.1, writes ``roster.json`` and the effective ``config.toml``, and starts one child
per peer (its output in ``nodes/<id>/node.log``), or with ``peers_per_process = K`` one
child per K peers in graph order (``fedcore node --id a,b,c``; the child's output in
``procs/<i>.log``, and ``procs.json`` says which peers each process hosts). Each peer keeps
its own server, port and folder ``nodes/<id>/`` either way, and the run is the same.

While the peers start, one line says how many are up and which are still starting,
importing, preparing or connecting (each peer's ``nodes/<id>/status.json``); then one
progress line shows the rounds of the whole run. It supervises: a child that dies stops
the run, naming its peers, exit status and log (in deadline mode the others go on
without them, and the summary's ``peer_exits`` and ``faults.down_rounds`` name each of
its peers and when it died); Ctrl-C stops every child. At the end it merges the peers'
records and evaluation-round models into the same ``metrics.jsonl``, ``summary.json``
(with ``"transport": "grpc"``) and ``curves.png`` that ``simulate`` writes.

A stopped launch continues with :func:`resume_launch` (``fedcore launch --resume``): every
peer restarts from its checkpoint of the newest round all of them have one of.

The peer processes themselves are :mod:`fedcore.deploy.children`'s; the merging of their
records, :mod:`fedcore.deploy.summarize`'s.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import fedcore
from fedcore.certs import check_tls_dir
from fedcore.config import Config, config_to_dict, dumps_toml, load_config
from fedcore.deploy.children import _UP, _Children, _names, _startup_text
from fedcore.deploy.plugins import refuse_registered_here
from fedcore.deploy.summarize import LAUNCH_FILE, _launch_name, _merge, _read_record, peer_dir
from fedcore.errors import ConfigError, TransportError, UserCodeError
from fedcore.progress import (
    STATUS_FILE,
    Progress,
    StatusLine,
    announce_if_slow,
    read_stage,
    run_warnings,
)
from fedcore.setup import checkpoint
from fedcore.setup.plan import planned_nodes
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.simulation.results import open_run_dir, run_name

__all__ = [
    "free_ports",
    "launch",
    "resume_launch",
    "user_code_roots",
]

logger = logging.getLogger(__name__)


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while picked)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def user_code_roots(config: Config) -> list[str]:
    """The folders on ``sys.path`` from which this process imported the users' code that
    ``config`` names by import path (``algorithm.name``, ``model.name``, ``data.dataset``,
    ``data.stream``: ``"pkg.module:factory"``), so that a child process given them on its
    ``PYTHONPATH`` imports the same files (a folder added to ``sys.path`` in this process
    only, say). Modules not imported, or without a file, give none."""
    roots: list[str] = []
    for name in (config.algorithm.name, config.model.name, config.data.dataset, config.data.stream):
        module_name, colon, _ = name.partition(":")
        module = sys.modules.get(module_name) if colon else None
        file = getattr(module, "__file__", None)
        if not file:
            continue
        where = Path(file).resolve()
        depth = module_name.count(".") + (where.name == "__init__.py")
        if depth < len(where.parents):
            roots.append(str(where.parents[depth]))
    return roots


def launch(
    config: Config,
    *,
    out_dir: str | Path | None = None,
    show_progress: bool = True,
    progress_stream: TextIO | None = None,
    threads: int = 1,
    force: bool = False,
    overrides: Sequence[str] = (),
    peers_per_process: int = 1,
) -> dict[str, Any]:
    """Run the peers of ``config`` as processes over gRPC; return the summary.

    ``overrides`` (the ``--set`` items ``config`` was loaded with) name the run, as in
    :func:`~fedcore.simulation.simulate.simulate`, and the summary keeps them. With
    ``peers_per_process`` K > 1, each process hosts K peers (the last one fewer), in graph
    order: ceil(N / K) processes, each one torch and one event loop, every peer still its
    own server and folder; the results are the same as with one process a peer.
    ``threads`` is each process's torch threads.

    Raises:
        ConfigError, TopologyError, DataError: invalid experiment (before any process starts).
        TransportError: a peer process failed (its peers, exit status and log are named).
    """
    _check_per_process(peers_per_process)
    with run_warnings(quiet=not show_progress):  # -q: none on the terminal; the summary's
        setup = _prepare(config, show_progress, progress_stream)
        name = run_name(config, setup, overrides)
        out = open_run_dir(out_dir, name, force=force)  # see simulate's: never a shared folder
        (out / "config.toml").write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
        return _supervise(
            setup,
            out,
            name,
            show_progress=show_progress,
            progress_stream=progress_stream,
            threads=threads,
            overrides=overrides,
            peers_per_process=peers_per_process,
        )


def _check_per_process(peers_per_process: object) -> None:
    if isinstance(peers_per_process, bool) or not isinstance(peers_per_process, int):
        raise ConfigError(f"peers_per_process must be an integer, got {peers_per_process!r}.")
    if peers_per_process < 1:
        raise ConfigError(
            f"--peers-per-process must be at least 1, got {peers_per_process}: each process "
            "hosts that many peers (1, the default: a process each)."
        )


def _prepare(config: Config, show_progress: bool, progress_stream: TextIO | None) -> RunSetup:
    """The run's set-up (every check, before any process starts)."""
    refuse_registered_here(config, "the peers fedcore launch starts")  # before any starts
    stream = (progress_stream or sys.stderr) if show_progress else None
    with announce_if_slow(stream, planned_nodes(config.topology)):
        setup = prepare_run(config, hosts_all=True)
    if config.transport.tls_dir is not None:  # before any peer starts (and fails on it)
        check_tls_dir(config.transport.tls_dir, setup.graph.nodes)
    return setup


def resume_launch(
    run_dir: str | Path,
    *,
    show_progress: bool = True,
    progress_stream: TextIO | None = None,
    threads: int = 1,
    peers_per_process: int | None = None,
) -> dict[str, Any]:
    """Continue the stopped ``fedcore launch`` in ``run_dir``; return the summary.

    Every peer starts again (``fedcore node --resume``, on new ports) from the newest round
    that every peer has a good checkpoint of (``run.checkpoint_every``); their newer
    checkpoints are dropped, and the rounds after it run again, the same. Without such a
    round the peers start again from round 0, with a warning. The records are merged as
    :func:`summarize` does, and the run ends with the parameters of the launch that was
    never stopped. ``peers_per_process`` (default: the launch's own) and ``threads`` are
    how it runs, not what.

    Raises:
        ConfigError: ``run_dir`` holds no launch (a ``simulate`` run, or nothing), or one
            that completed.
    """
    with run_warnings(quiet=not show_progress):
        return _resume_launch(
            Path(run_dir),
            show_progress=show_progress,
            progress_stream=progress_stream,
            threads=threads,
            peers_per_process=peers_per_process,
        )


def _resume_launch(
    out: Path,
    *,
    show_progress: bool,
    progress_stream: TextIO | None,
    threads: int,
    peers_per_process: int | None,
) -> dict[str, Any]:
    """:func:`resume_launch`, its warnings collected."""
    prior = _read_record(out / "summary.json")
    started = _read_record(out / LAUNCH_FILE)  # the launcher may have died before a summary
    if not (out / "config.toml").is_file():
        raise ConfigError(f"{str(out)!r} holds no launch to resume: it has no config.toml.")
    if prior.get("transport") == "inproc" or not (out / "roster.json").is_file():
        raise ConfigError(
            f"{str(out)!r} is not a `fedcore launch` run (it has no roster.json"
            + ("; it is a `fedcore simulate` run: resume it with `fedcore simulate --resume`"
               if prior.get("transport") == "inproc" else "")
            + ")."
        )  # fmt: skip
    if prior.get("status", "completed") == "completed" and prior:
        raise ConfigError(f"the launch in {str(out)!r} completed; there is nothing to resume.")
    k = _launched_per_process(prior, started) if peers_per_process is None else peers_per_process
    _check_per_process(k)
    config = load_config(out / "config.toml")
    setup = _prepare(config, show_progress, progress_stream)
    nodes = setup.graph.nodes
    absent = [n for n in nodes if not peer_dir(out, n).is_dir()]
    if absent:
        raise ConfigError(
            f"{out / 'nodes'} has no folder for {', '.join(_names(absent))}: it is not the "
            "launch of its config.toml."
        )
    alive = {n: pid for n in nodes if (pid := _still_running(peer_dir(out, n))) is not None}
    if alive:  # the launcher died, its peers did not: new peers would share their folders
        n, pid = next(iter(alive.items()))
        raise ConfigError(
            f"peer {n} of {str(out)!r} is still running (process {pid}"
            + (f"; {len(alive) - 1} more peers too" if len(alive) > 1 else "")
            + "); wait until the peers finish (then --resume writes the results) or stop "
            "them, then resume."
        )
    held = [set(checkpoint.good_rounds(peer_dir(out, n) / "checkpoints")) for n in nodes]
    common = set.intersection(*held) if held else set()
    start = max(common) if common else None
    stream = progress_stream or sys.stderr
    overrides, name = _launch_name(config, setup, prior, started)
    unfinished = [n for n in nodes if not (peer_dir(out, n) / "node.json").is_file()]
    if not unfinished or (start is not None and start >= config.run.rounds):
        # The launcher stopped (killed, say) after its peers had run every round: nothing
        # is left to run (restarted peers with no round to run would stop at once, and the
        # others would wait for them in vain). Merge what they wrote, as summarize does.
        if show_progress:
            print(
                f"launch: every peer of {out} had finished its rounds; writing the results",
                file=stream,
                flush=True,
            )
        summary = _merge(
            setup,
            out,
            name,
            None,
            dict.fromkeys(unfinished),
            overrides=overrides,
            peers_per_process=k,
        )
        summary["out_dir"] = str(out)
        return summary
    for n in nodes:
        folder = peer_dir(out, n)
        checkpoint.drop_after(folder / "checkpoints", start)
        (folder / "node.json").unlink(missing_ok=True)  # a finished peer's
        _keep_records(folder / "metrics.jsonl", start or 0)
    if start is None:
        logger.warning(
            "%s has no round that every peer has a checkpoint of (run.checkpoint_every = %d); "
            "starting again from round 0",
            out,
            config.run.checkpoint_every,
        )
    elif show_progress:
        print(f"launch: resuming {out} after round {start}", file=stream, flush=True)
    return _supervise(
        setup,
        out,
        name,
        show_progress=show_progress,
        progress_stream=progress_stream,
        threads=threads,
        overrides=overrides,
        peers_per_process=k,
        first=start or 0,
        wall_before=_seconds(prior.get("wall_seconds")) if start is not None else 0.0,
    )


def _seconds(value: object) -> float:
    """``value`` (a summary's ``wall_seconds``) if it is a finite number >= 0, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if 0 <= value < float("inf") else 0.0


def _still_running(folder: Path) -> int | None:
    """The process id of the peer in ``folder`` if it is still in its start-up or rounds
    and its process (the one its ``status.json`` names) is alive and a fedcore one, else
    None. A peer killed on its way left its stage behind, and its id may name another
    process since: that is why the process's command line is read (on Linux)."""
    stage = read_stage(folder)
    if stage not in ("importing", "preparing", "connecting", "running"):
        return None
    pid = _read_record(folder / STATUS_FILE).get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except (PermissionError, OSError, OverflowError):
        pass  # alive, another user's: tell by its command line, where it can be read
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid if not Path("/proc/self").exists() else None
    return pid if b"fedcore" in cmdline else None


def _launched_per_process(*records: Mapping[str, Any]) -> int:
    """The first valid ``peers_per_process`` of ``records`` (the summary, then
    ``launch.json``), else 1."""
    for record in records:
        given = record.get("peers_per_process")
        if isinstance(given, int) and not isinstance(given, bool) and given >= 1:
            return given
    return 1


def _keep_records(path: Path, first: int) -> None:
    """Keep the records of rounds before ``first`` in a peer's ``metrics.jsonl`` (as the
    peer itself does when it resumes), so that the launcher counts its rounds from there."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as fh:
        kept = [ln for ln in fh if ln.endswith("\n") and json.loads(ln)["round"] < first]
    path.write_text("".join(kept), encoding="utf-8")


def _supervise(
    setup: RunSetup,
    out: Path,
    name: str,
    *,
    show_progress: bool,
    progress_stream: TextIO | None,
    threads: int,
    overrides: Sequence[str],
    peers_per_process: int,
    first: int | None = None,
    wall_before: float = 0.0,
) -> dict[str, Any]:
    """Start the peers of ``setup`` in ``out`` (which holds its ``config.toml``), supervise
    them and merge their records. ``first`` (a resumed launch's): every peer continues
    from its checkpoint of that round (``fedcore node --resume``); ``wall_before``: the
    time the launch ran before."""
    config = setup.config
    nodes = setup.graph.nodes
    config_path = out / "config.toml"
    roster = {n: f"127.0.0.1:{p}" for n, p in zip(nodes, free_ports(len(nodes)), strict=True)}
    roster_path = out / "roster.json"
    roster_path.write_text(json.dumps(roster, indent=2) + "\n", encoding="utf-8")
    # What names the launch, for --resume if the launcher dies before its summary.
    record = {"name": name, "overrides": list(overrides), "peers_per_process": peers_per_process}
    (out / LAUNCH_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    k = peers_per_process
    groups = [list(nodes[i : i + k]) for i in range(0, len(nodes), k)]
    (out / "procs.json").unlink(missing_ok=True)  # a resumed launch's, of another K
    if k > 1:
        (out / "procs").mkdir(exist_ok=True)
        procs = [{"log": f"procs/{i}.log", "peers": g} for i, g in enumerate(groups)]
        (out / "procs.json").write_text(json.dumps(procs, indent=2) + "\n", encoding="utf-8")

    env = dict(os.environ)
    package_root = str(Path(fedcore.__file__).resolve().parents[1])
    # The peers import this fedcore, and users' code (algorithm, model, data) from the
    # folders this process imported it from; they also start in this working directory,
    # which `python -m fedcore` puts first on their path.
    path = (package_root, *user_code_roots(config), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in path if p))
    children = _Children()
    # In deadline mode the peers go on without a dead one; strict mode stops the run.
    tolerate = config.transport.mode == "deadline"
    dead: dict[str, int] = {}
    stream = progress_stream or sys.stderr
    startup = StatusLine(stream) if show_progress else None
    progress: Progress | None = None
    began = time.perf_counter()
    outcome, error = "completed", None
    try:
        for i, group in enumerate(groups):
            argv = [
                sys.executable, "-m", "fedcore", "node",
                "--config", str(config_path), "--id", ",".join(group),
                "--roster", str(roster_path), "--threads", str(threads),
                # One peer (a group of one, also the last of an uneven split): its folder;
                # several: the folder of their folders nodes/<id>/.
                "--out", str(peer_dir(out, group[0]) if len(group) == 1 else out / "nodes"),
                *(["--resume"] if first is not None else []),
            ]  # fmt: skip
            folders = {n: peer_dir(out, n) for n in group}
            log_path = folders[group[0]] / "node.log" if k == 1 else out / "procs" / f"{i}.log"
            children.start(i, folders, argv, log_path, env)
        shown = -1
        while True:
            ended = children.exited()
            for index, status in ended.items():
                peers = children.members[index]
                if status == 0 or peers[0] in dead:
                    continue
                log_path = children.log_paths[index]
                if not tolerate or len(dead) + len(peers) == len(nodes):
                    said = children.error_line(index)
                    who = f"peer {peers[0]!r}" if len(peers) == 1 else _process_of(peers)
                    line = f"{who} exited with status {status}; see its log {log_path}"
                    said = (said or "").rstrip(".")
                    if status == UserCodeError.EXIT_STATUS:  # the user's rule failed there
                        raise UserCodeError(line + (f" (it said: {said})." if said else "."))
                    raise TransportError(line + (f" (it said: {said})" if said else "") + ".")
                for node in peers:
                    dead[node] = status
                logger.warning(
                    "%s exited with status %s after round %d; the others go on without "
                    "it (deadline mode). Its log: %s",
                    f"peer {peers[0]}" if len(peers) == 1 else _process_of(peers, quote=False),
                    status,
                    min(children.rounds_done[n] for n in peers) - 1,
                    log_path,
                )
            done = children.poll_progress(skip=dead)
            if startup is not None and progress is None:
                stages = children.poll_stages()
                text = _startup_text(stages, dead)
                if all(stages[n] in _UP for n in nodes if n not in dead):
                    startup.finish(text)
                    progress = Progress(
                        config.run.rounds, label="launch", stream=stream, first=first or 0
                    )
                else:
                    startup.show(text)
            if progress is not None and done != shown:
                progress.update(done)
                shown = done
            if len(ended) == len(groups):
                break
            time.sleep(0.1)
        if show_progress and shown != config.run.rounds:
            if progress is None:
                progress = Progress(
                    config.run.rounds, label="launch", stream=stream, first=first or 0
                )
            progress.update(config.run.rounds)
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    except (TransportError, UserCodeError) as exc:
        outcome, error = "failed", str(exc)
        raise
    finally:
        children.stop()
        if startup is not None and progress is None and startup.tty:
            stream.write("\n")  # end the start-up line before what follows
        if outcome != "completed":
            # What the peers did before the run stopped still makes a summary.
            unfinished = {n: None for n in nodes if not (peer_dir(out, n) / "node.json").exists()}
            try:
                summary = _merge(
                    setup,
                    out,
                    name,
                    wall_before + time.perf_counter() - began,
                    {**unfinished, **dead},
                    status=outcome,
                    error=error,
                    overrides=overrides,
                    peers_per_process=peers_per_process,
                    threads=threads,
                )
            except Exception as exc:  # the run's own error says more
                logger.warning("could not write the summary of the %s run: %s", outcome, exc)
            else:
                if outcome == "interrupted":
                    done, every = summary["rounds_completed"], config.run.checkpoint_every
                    raise KeyboardInterrupt(
                        f"after round {done} of {config.run.rounds}; the results so far are "
                        f"in {out}"
                        + (
                            f"; continue with: fedcore launch --resume {out}"
                            if every and done >= every
                            else " (set run.checkpoint_every to make a launch resumable)"
                            if not every
                            else ""
                        )
                    ) from None
    wall = wall_before + time.perf_counter() - began
    summary = _merge(
        setup,
        out,
        name,
        wall,
        dead,
        overrides=overrides,
        peers_per_process=peers_per_process,
        threads=threads,
    )
    summary["out_dir"] = str(out)
    return summary


def _process_of(peers: Sequence[str], *, quote: bool = True) -> str:
    """``the process of peers 'n0', 'n1', 'n2'``."""
    return "the process of peers " + ", ".join(repr(n) if quote else n for n in peers)
