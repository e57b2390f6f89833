"""``fedcore node``: peers of a run in one process, each its own gRPC server, talking gRPC.

Every peer builds the same :class:`~fedcore.setup.prepare.RunSetup` from the same
config, so it holds exactly its partition of the data and the same initial model as in
``fedcore simulate``; then it serves its in-neighbours, connects to its out-neighbours
(retrying until ``transport.startup_timeout_s``), and runs its rounds.

One process may host several peers (:func:`run_peers`, ``fedcore node --id a,b,c``): they
share the process's torch, one :func:`prepare_run` (as ``simulate``'s nodes do) and one
event loop, and each still has its own server and port (its roster entry), identity,
transport, folder, checkpoints and records, so the run is the same as with one process a
peer. Their computation takes turns in the loop. If one of them fails, the others are
stopped and the error names it.

A peer's folder (``--out``) receives ``status.json`` (its start-up stage, see
:data:`fedcore.progress.STAGES`, rewritten at each one) and ``node.pid`` (its process id)
at start, then, as it goes, ``metrics.jsonl`` (one record per round, flushed each round)
and ``models/round-<t>.f32`` (its parameters at every evaluation round, as float32
little-endian bytes, for the launcher's evaluation), and at the end ``node.json`` (id,
rounds done, parameter digest). SIGINT and SIGTERM stop every peer of the process cleanly:
the servers stop gracefully, channels close and metrics are flushed.

The roster maps node ids to ``HOST:PORT``, as JSON (``{"n0": "10.0.0.5:7000", ...}``) or
TOML (``[peers]`` table with ``n0 = "10.0.0.5:7000"``).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch

from fedcore.algorithms.asynchronous import is_asynchronous
from fedcore.certs import load_tls
from fedcore.config import Config
from fedcore.errors import ConfigError, FedcoreError, UserCodeError
from fedcore.metrics import JsonlWriter, params_sha256
from fedcore.node import DecodeCache, Node, RoundRecord
from fedcore.progress import Progress, Ticker, write_stage
from fedcore.setup import checkpoint
from fedcore.setup.prepare import RunSetup, prepare_run, seed_torch
from fedcore.transport.grpc import GrpcTransport

__all__ = [
    "model_path",
    "run_peer",
    "run_peer_main",
    "run_peers",
    "run_peers_main",
    "tune_malloc",
    "write_params",
]

logger = logging.getLogger(__name__)


_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_MAX = -4


def tune_malloc() -> bool:
    """Keep freed memory for reuse instead of returning it to the OS (glibc only).

    A peer allocates model-sized buffers every round. By default glibc serves large blocks
    with fresh ``mmap`` pages and returns them on free, so every message pays page faults
    (about 1 ms per MiB here); serving them from a heap that is never trimmed makes those
    pages warm. Measured on loopback: 16-64 MiB messages move 1.7-2.1x faster. The cost is
    that a peer's memory stays at its peak. ``FEDCORE_MALLOC_TUNING=0`` turns it off; so do
    non-glibc platforms. Returns whether it was applied.
    """
    if os.environ.get("FEDCORE_MALLOC_TUNING", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False
    return ok


def model_path(out: Path, round: int) -> Path:
    """Where a peer stores its parameters of evaluation round ``round``."""
    return out / "models" / f"round-{round:06d}.f32"


def write_params(path: Path, params: torch.Tensor) -> None:
    """Write ``params`` as float32 little-endian bytes, atomically (write, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(params.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    tmp.replace(path)


TICK_S = 5.0
"""Seconds between a peer's start-up lines while it prepares or connects (a data set's
load, neighbours that are not up yet): a log is never silent longer while it starts."""


class _ShowsRounds(Protocol):
    """What a peer's record writer tells of its rounds: :class:`Progress`, or its share of
    the one line of a process's peers (:class:`_GroupProgress`)."""

    def update(self, done: int, *, loss: float | None = None) -> None: ...


class _GroupProgress:
    """One progress line for the peers of a process: the rounds its slowest peer has done
    (a line each would garble a terminal)."""

    def __init__(self, rounds: int, node_ids: Sequence[str], stream: TextIO) -> None:
        label = ",".join(node_ids) if len(node_ids) <= 4 else f"{node_ids[0]}..{node_ids[-1]}"
        self.progress = Progress(rounds, label=f"{label} ({len(node_ids)} peers)", stream=stream)
        self.done: dict[str, int] = {}
        self.expected = len(node_ids)
        self.shown = -1

    def member(self, node_id: str, first: int) -> _GroupMember:
        """The share of ``node_id``, which starts at round ``first``."""
        self.done[node_id] = first
        if len(self.done) == self.expected:  # every peer knows where it starts: the ETA's base
            self.progress.first = min(self.done.values())
        return _GroupMember(self, node_id)

    def update(self, node_id: str, done: int) -> None:
        self.done[node_id] = done
        slowest = min(self.done.values())
        if len(self.done) == self.expected and slowest != self.shown:
            self.shown = slowest
            self.progress.update(slowest)


class _GroupMember:
    """One peer's share of a :class:`_GroupProgress`."""

    def __init__(self, group: _GroupProgress, node_id: str) -> None:
        self.group = group
        self.node_id = node_id

    def update(self, done: int, *, loss: float | None = None) -> None:
        self.group.update(self.node_id, done)


class _PeerLog:
    """Per-round record writer, evaluation-round model snapshots and checkpoints of a peer.

    Resuming from round ``r`` keeps the records of rounds before ``r`` and drops the rest
    (those rounds run again).
    """

    def __init__(
        self,
        out: Path,
        config: Config,
        *,
        resume_round: int | None = None,
        progress: _ShowsRounds | None = None,
    ) -> None:
        self.out = out
        self.progress = progress
        self.rounds = config.run.rounds
        self.eval_every = config.run.eval_every
        self.checkpoint_every = config.run.checkpoint_every
        path = out / "metrics.jsonl"
        if resume_round is not None and path.exists():
            kept = [
                line
                for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
                if line.endswith("\n") and json.loads(line)["round"] < resume_round
            ]
            path.write_text("".join(kept), encoding="utf-8")
        self.writer = JsonlWriter(path, append=resume_round is not None)

    def __call__(self, node: Node, record: RoundRecord) -> None:
        self.writer.write(record.to_json())
        self.writer.flush()
        t = record.round
        if (t + 1) % self.eval_every == 0 or t + 1 == self.rounds:
            write_params(model_path(self.out, t), node.model())
        if self.checkpoint_every and (t + 1) % self.checkpoint_every == 0:
            checkpoint.save(self.out / "checkpoints", node)
        if self.progress is not None:
            self.progress.update(t + 1, loss=None if record.down else record.loss)


def _trust_sets(setup: RunSetup, node_id: str) -> tuple[set[str], set[str]]:
    """In- and out-neighbours of ``node_id`` over every round of the schedule."""
    ins: set[str] = set()
    outs: set[str] = set()
    for t in range(setup.graph.period):
        g = setup.graph.at(t)
        ins.update(g.in_neighbours(node_id))
        outs.update(g.out_neighbours(node_id))
    return ins, outs


def _check_peers(
    setup: RunSetup,
    node_ids: Sequence[str],
    roster: Mapping[str, str],
    listen: Mapping[str, str],
) -> None:
    """Refuse, before any peer starts, an id twice, an id not in the graph, or a roster
    without the address of a peer's out-neighbour (or of the peer itself, unless it has
    its own ``listen`` address)."""
    twice = sorted({n for n in node_ids if node_ids.count(n) > 1})
    if twice:
        raise ConfigError(f"node id {', '.join(map(repr, twice))} is given more than once.")
    unknown = [n for n in node_ids if n not in setup.graph.nodes]
    if unknown:
        what = f"node {unknown[0]!r} is" if len(unknown) == 1 else f"nodes {unknown} are"
        raise ConfigError(f"{what} not in the graph; its nodes are {', '.join(setup.graph.nodes)}.")
    missing: set[str] = set()
    for n in node_ids:
        outs = _trust_sets(setup, n)[1]
        missing |= (outs | ({n} if n not in listen else set())) - set(roster)
    if missing:
        raise ConfigError(f"the roster has no address for {', '.join(sorted(missing))}.")


def _prepare(
    config: Config,
    node_ids: Sequence[str],
    outs: Mapping[str, Path],
    roster: Mapping[str, str],
    listen: Mapping[str, str],
    *,
    stream: TextIO | None = None,
) -> RunSetup:
    """The run's set-up for the peers ``node_ids`` (checked by :func:`_check_peers`); each
    peer's stage (in ``outs[id]``) is ``preparing`` meanwhile, ``failed`` if it fails.
    With ``stream``, a line there every :data:`TICK_S` seconds while it prepares."""
    if config.adversary.active and config.adversary.targeted:
        raise ConfigError(
            f"adversary.attack = {config.adversary.attack!r} is made of what a target's other "
            "in-neighbours send it, which a real peer does not see: simulate it, or give "
            "real peers a sender attack (signflip, scale, gaussian, inflate, withhold)."
        )
    for n in node_ids:
        write_stage(outs[n], "preparing")
    who = ",".join(node_ids) if len(node_ids) <= 4 else f"{node_ids[0]}..{node_ids[-1]}"
    try:
        with Ticker(stream, lambda: f"{who}: preparing (data and model)", every_s=TICK_S):
            setup = prepare_run(config)
        _check_peers(setup, node_ids, roster, listen)
        seed_torch(config)
    except BaseException:
        for n in node_ids:
            write_stage(outs[n], "failed")
        raise
    return setup


async def run_peer(
    config: Config,
    node_id: str,
    roster: Mapping[str, str],
    *,
    out: Path,
    listen: str | None = None,
    resume: bool = False,
    progress_stream: TextIO | None = None,
) -> dict[str, Any]:
    """Run one peer to the end of the run (or until cancelled); return its ``node.json``.

    With ``resume``, continue from the newest good checkpoint in ``out/checkpoints``
    (starting from round 0 when there is none, with a warning). With ``progress_stream``,
    say there what it does: where it serves, whom it waits for, its rounds (a progress
    line) and where its results are.
    """
    setup = _prepare(
        config,
        [node_id],
        {node_id: out},
        roster,
        {node_id: listen} if listen else {},
        stream=progress_stream,
    )
    return await _serve_and_run(
        setup, node_id, roster, out=out, listen=listen, resume=resume, stream=progress_stream
    )


async def run_peers(
    config: Config,
    node_ids: Sequence[str],
    roster: Mapping[str, str],
    *,
    outs: Mapping[str, Path],
    listen: Mapping[str, str] | None = None,
    resume: bool = False,
    progress_stream: TextIO | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the peers ``node_ids`` in this event loop to the end of the run; return each
    one's ``node.json``.

    They share one :func:`prepare_run` of ``config`` (the same data split and initial
    model as one process a peer would build) and each has its own server on its roster
    address (or ``listen[id]``), its own folder ``outs[id]``, checkpoints and records. With
    ``progress_stream``, each peer's start-up and results are told there (each line starts
    with its id) and one progress line shows the rounds of the slowest. One id alone runs
    exactly as :func:`run_peer`.

    Raises:
        ConfigError: an id twice, an id not in the graph, a roster without a needed
            address (before any peer starts).
        FedcoreError: a peer failed (the others are stopped first); its message starts
            with ``peer '<id>':``.
    """
    ids = list(node_ids)
    chosen = dict(listen or {})
    if len(ids) == 1:
        only = ids[0]
        info = await run_peer(
            config,
            only,
            roster,
            out=outs[only],
            listen=chosen.get(only),
            resume=resume,
            progress_stream=progress_stream,
        )
        return {only: info}
    setup = _prepare(config, ids, outs, roster, chosen, stream=progress_stream)
    group = (
        _GroupProgress(config.run.rounds, ids, progress_stream)
        if progress_stream is not None
        else None
    )

    failed: list[str] = []  # in the order they failed

    async def one(node_id: str) -> dict[str, Any]:
        try:
            return await _serve_and_run(
                setup,
                node_id,
                roster,
                out=outs[node_id],
                listen=chosen.get(node_id),
                resume=resume,
                stream=progress_stream,
                group=group,
            )
        except FedcoreError as exc:
            # Name the peer: the process's one error line is what a launcher shows.
            failed.append(node_id)
            exc.args = (f"peer {node_id!r}: {exc}", *exc.args[1:])
            raise
        except Exception:
            failed.append(node_id)
            logger.error("peer %s failed; stopping the other peers of this process", node_id)
            raise

    tasks = {n: asyncio.ensure_future(one(n)) for n in ids}
    try:
        # The first failure stops the rest; asyncio.wait keeps the failure itself (a
        # TaskGroup would wrap it in an exception group).
        await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    if failed:  # the first to fail; the others were stopped because of it
        error = tasks[failed[0]].exception()
        assert error is not None
        raise error
    return {n: task.result() for n, task in tasks.items()}


async def _serve_and_run(
    setup: RunSetup,
    node_id: str,
    roster: Mapping[str, str],
    *,
    out: Path,
    listen: str | None,
    resume: bool,
    stream: TextIO | None,
    group: _GroupProgress | None = None,
) -> dict[str, Any]:
    """Serve, connect and run peer ``node_id`` (checked by :func:`_check_peers`) of
    ``setup``; its stages go to ``out/status.json``."""

    def say(text: str) -> None:
        if stream is not None:
            print(f"{node_id}: {text}", file=stream, flush=True)

    stage = "failed"
    try:
        info = await _peer(setup, node_id, roster, out, listen, resume, say, stream, group)
        stage = "done"
    except asyncio.CancelledError:
        stage = "stopped"
        raise
    except UserCodeError as exc:  # the traceback to the peer's folder, one line to its log
        exc.keep_traceback(out)
        raise
    finally:
        write_stage(out, stage)
    say(f"done after {info['rounds']} rounds; results: {out}")
    return info


async def _peer(
    setup: RunSetup,
    node_id: str,
    roster: Mapping[str, str],
    out: Path,
    listen: str | None,
    resume: bool,
    say: Callable[[str], None],
    stream: TextIO | None,
    group: _GroupProgress | None,
) -> dict[str, Any]:
    config = setup.config
    ins, outs = _trust_sets(setup, node_id)
    out.mkdir(parents=True, exist_ok=True)
    (out / "node.pid").write_text(f"{os.getpid()}\n", encoding="utf-8")  # for operators
    transport = GrpcTransport(
        node_id,
        listen=listen or roster[node_id],
        roster=roster,
        run_id=setup.run_id,
        trusted=ins,
        max_message_bytes=int(config.transport.max_message_mb * (1 << 20)),
        call_timeout_s=config.transport.call_timeout_s,
        tls=load_tls(config.transport.tls_dir, node_id) if config.transport.tls_dir else None,
        startup_timeout_s=config.transport.startup_timeout_s,
        chunk_timeout_s=config.transport.chunk_timeout_s,
        min_rate_bytes_s=config.transport.min_rate_mb_s * (1 << 20),
        max_streams_per_sender=config.transport.max_streams_per_sender,
        skip_ahead=config.transport.mode == "deadline",
    )
    saved = checkpoint.latest(out / "checkpoints") if resume else None
    if resume and saved is None:
        logger.warning("%s: no good checkpoint in %s; starting from round 0", node_id, out)
    first = int(saved["round"]) if saved else 0
    progress: _ShowsRounds | None = None
    if group is not None:
        progress = group.member(node_id, first)
    elif stream is not None:
        progress = Progress(config.run.rounds, label=node_id, stream=stream, first=first)
    log = _PeerLog(out, config, resume_round=first if saved else None, progress=progress)
    try:
        # The servicer validates (decodes) every message on arrival; the cache hands the
        # same tensors to the node's own decode at collect time: each is decoded once.
        node: Any
        if is_asynchronous(setup.algorithm):
            if saved is not None:
                raise ConfigError(
                    f"{node_id}: an asynchronous peer writes no checkpoints to resume from; "
                    "start it again without --resume."
                )
            node = setup.make_async_peer(node_id, transport, observer=log)
        else:
            node = setup.make_node(node_id, transport, observer=log, decode_cache=DecodeCache())
        if saved is not None:
            checkpoint.restore(node, saved)
            transport.mailbox.start_at(node.round)
            logger.warning("%s: resumed from the checkpoint of round %d", node_id, node.round)
        transport.validator = node.validate
        await transport.start()
        logger.info("%s serving on port %s", node_id, transport.port)
        write_stage(out, "connecting")
        say(
            f"serving on {listen or roster[node_id]} (port {transport.port}), run "
            f"{setup.run_id[:12]}, {config.run.rounds} rounds; connecting to "
            f"{', '.join(sorted(outs)) or 'nobody'}"
        )

        # Deadline mode goes on without a peer that never answers (its messages go
        # missing); strict mode would only wait for it in vain.
        def waiting() -> str:
            left = transport.connecting
            if left:  # at most 6 names, then how many more
                names = ", ".join(left[:6]) + (f" +{len(left) - 6}" if len(left) > 6 else "")
                return f"{node_id}: connecting; no handshake yet with {names}"
            return f"{node_id}: connecting; waiting for in-neighbours to say hello"

        with Ticker(stream, waiting, every_s=TICK_S):
            await transport.connect(
                sorted(outs),
                timeout_s=config.transport.startup_timeout_s,
                required=config.transport.mode == "strict",
                together=is_asynchronous(setup.algorithm),
            )
        write_stage(out, "running")
        say(f"connected; running from round {node.round}")
        await node.run(config.run.rounds)
    finally:
        log.writer.close()
        await transport.close()
    info = {
        "node": node_id,
        "rounds": node.round,
        "params_sha256": params_sha256(node.model()),
        "stats": asdict(transport.stats),
    }
    (out / "node.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def run_peer_main(
    config: Config,
    node_id: str,
    roster: Mapping[str, str],
    *,
    out: Path,
    listen: str | None,
    resume: bool = False,
    show_progress: bool = True,
) -> int:
    """Run a peer in a fresh event loop with SIGINT/SIGTERM stopping it cleanly; with
    ``show_progress``, its start-up, rounds and results are told on stderr."""
    return run_peers_main(
        config,
        [node_id],
        roster,
        outs={node_id: out},
        listen={node_id: listen} if listen else None,
        resume=resume,
        show_progress=show_progress,
    )


def run_peers_main(
    config: Config,
    node_ids: Sequence[str],
    roster: Mapping[str, str],
    *,
    outs: Mapping[str, Path],
    listen: Mapping[str, str] | None = None,
    resume: bool = False,
    show_progress: bool = True,
) -> int:
    """Run the peers ``node_ids`` (:func:`run_peers`) in a fresh event loop, SIGINT and
    SIGTERM stopping all of them cleanly (exit status 130); with ``show_progress``, their
    start-up, rounds and results are told on stderr."""

    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await run_peers(
                config,
                node_ids,
                roster,
                outs=outs,
                listen=listen,
                resume=resume,
                progress_stream=sys.stderr if show_progress else None,
            )
        except asyncio.CancelledError:
            if len(node_ids) == 1:
                where = str(outs[node_ids[0]])
            else:
                parents = {str(outs[n].parent) for n in node_ids}
                where = parents.pop() if len(parents) == 1 else "their folders"
            logger.warning(
                "%s stopped by a signal; metrics flushed in %s", ", ".join(node_ids), where
            )
            return 130
        return 0

    return asyncio.run(main())
