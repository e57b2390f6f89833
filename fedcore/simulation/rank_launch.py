"""The local launcher of ``fedcore simulate --ranks R`` (:func:`launch_local`): R processes
of ``python -m fedcore`` on this machine, each one rank
(:func:`fedcore.simulation.ranks.simulate_rank`), with the environment torchrun would set
and the rendezvous on a free port of 127.0.0.1.

It imports no torch: each rank loads its own, and the launcher's would be seconds before
any rank starts. A rank that fails ends the others: they lose contact within
``transport.strict_timeout_s`` (the group's timeout) at most, the launcher stops any rank
still running after that, and says in one line which rank failed first and why.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from fedcore.runtime import PARENT_ENV

__all__ = ["GRACE_S", "INTERRUPTED", "INTERRUPT_GRACE_S", "LOST", "free_port", "launch_local"]

LOST = "lost contact with the other ranks"
"""What the error line of a rank that failed only because another did says."""

GRACE_S = 5.0
"""Seconds the launcher gives the other ranks, beyond the group's timeout, to stop on their
own once one failed, before it stops them."""


INTERRUPT_GRACE_S = 60.0
"""Seconds the launcher gives rank 0, once interrupted, to write the interrupted run's
summary and end."""

INTERRUPTED = "fedcore: interrupted"
"""How an interrupted rank's line begins (what the launcher says once for the run)."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the rendezvous of local ranks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class _Child:
    rank: int
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    error: str | None = None
    interrupted: str | None = None
    ended: float | None = None
    stopped: bool = False


def _read(child: _Child, relay: TextIO | None) -> None:
    """Keep a rank's stderr; rank 0's goes on to ``relay`` as it comes, but its error line,
    which the launcher says once for the run."""
    stream = child.process.stderr
    assert stream is not None
    for line in stream:
        if line.startswith("fedcore: error:"):
            child.error = line.rstrip("\n")
            continue
        if line.startswith(INTERRUPTED):  # the launcher says it, once for the run
            child.interrupted = line.rstrip("\n").removeprefix(INTERRUPTED).strip()
            continue
        child.lines.append(line)
        del child.lines[:-20]
        if relay is not None:
            relay.write(line)
            relay.flush()


def launch_local(
    argv: Sequence[str], world: int, *, timeout_s: float, stderr: TextIO | None = None
) -> int:
    """Run ``python -m fedcore ARGV`` as ``world`` local ranks (rendezvous on a free port of
    127.0.0.1); return the exit status: 0 when every rank ended well, else the first
    failed rank's, after one line on ``stderr`` (default ``sys.stderr``) naming it.

    Rank 0 keeps this process's stdout (the results table); its stderr comes through as it
    comes. A failed rank's peers stop within ``timeout_s`` (the group's timeout), plus
    :data:`GRACE_S`, or are stopped."""
    err = stderr if stderr is not None else sys.stderr
    port = free_port()
    children: list[_Child] = []
    readers: list[threading.Thread] = []
    try:
        for rank in range(world):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            env[PARENT_ENV] = str(os.getpid())  # the ranks end with this process
            process = subprocess.Popen(
                [sys.executable, "-m", "fedcore", *argv],
                env=env,
                stdout=None if rank == 0 else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # Ctrl-C reaches the launcher, which tells them in turn
            )
            child = _Child(rank, process)
            children.append(child)
            reader = threading.Thread(
                target=_read, args=(child, err if rank == 0 else None), daemon=True
            )
            reader.start()
            readers.append(reader)
        _wait(children, timeout_s + GRACE_S)
    except KeyboardInterrupt:
        _interrupt(children)
        for reader in readers:
            reader.join(timeout=5)
        said = children[0].interrupted if children else None
        raise KeyboardInterrupt(said or "") from None
    finally:  # a launcher that failed leaves no rank running
        for child in children:
            _stop(child)
        for reader in readers:
            reader.join(timeout=5)
        for child in children:
            if child.process.stderr is not None:
                child.process.stderr.close()
    failed = [c for c in children if c.process.returncode != 0]
    if not failed:
        return 0
    cause = _cause(failed)
    line = cause.error or (cause.lines[-1].strip() if cause.lines else "")
    if cause.stopped:
        text = (
            f"fedcore: error: rank {cause.rank} of {world} stopped answering; it was stopped "
            f"after the others gave up (transport.strict_timeout_s = {timeout_s:g})."
        )
    elif line.startswith("fedcore: error:"):
        text = line
    else:
        text = (
            f"fedcore: error: rank {cause.rank} of {world} failed (exit status "
            f"{cause.process.returncode}): {line or 'no message'}"
        )
    print(text, file=err)
    status = cause.process.returncode
    return status if status and status > 0 else 1


def _wait(children: list[_Child], grace_s: float) -> None:
    """Wait for every rank; once one failed, give the others ``grace_s``, then stop them."""
    first_failure: float | None = None
    while True:
        running = False
        for child in children:
            if child.ended is None and child.process.poll() is not None:
                child.ended = time.monotonic()
                if child.process.returncode != 0 and first_failure is None:
                    first_failure = child.ended
            running = running or child.ended is None
        if not running:
            return
        if first_failure is not None and time.monotonic() - first_failure > grace_s:
            for child in children:
                if child.ended is None:
                    child.stopped = True
                    _stop(child)
        time.sleep(0.05)


def _interrupt(children: list[_Child]) -> None:
    """Ctrl-C or SIGTERM to the launcher: SIGTERM (a rank's Ctrl-C) to rank 0 first, which
    stops between two collectives, writes the summary of the interrupted run and names its
    ``--resume`` (:data:`INTERRUPT_GRACE_S` at most), then to the others (:data:`GRACE_S`
    at most); a rank still running after that is killed."""
    for group, grace in ((children[:1], INTERRUPT_GRACE_S), (children[1:], GRACE_S)):
        for child in group:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.terminate()
        deadline = time.monotonic() + grace
        for child in group:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
    for child in children:
        _stop(child)


def _stop(child: _Child) -> None:
    """End one rank this launcher started: SIGTERM, then SIGKILL after 5 s."""
    process = child.process
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _cause(failed: list[_Child]) -> _Child:
    """The rank whose failure ended the run: the first to fail for a reason of its own
    (not a lost contact); else one that had to be stopped (it hung); else the first."""
    by_time = sorted(failed, key=lambda c: (c.ended or float("inf"), c.rank))
    own = [c for c in by_time if not c.stopped and LOST not in (c.error or "")]
    if own:
        return own[0]
    stopped = [c for c in by_time if c.stopped]
    return stopped[0] if stopped else by_time[0]
