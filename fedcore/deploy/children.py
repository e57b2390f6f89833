"""The peer processes of one launch: started with their logs, polled for the rounds and
start-up stage of each of their peers, stopped together; and the start-up line that says
which peers are still starting."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import IO

from fedcore.progress import STATUS_FILE, read_stage
from fedcore.runtime import PARENT_ENV

_UP = ("running", "done")
"""Stages of a peer that is up: connected, in its rounds or through them."""


class _Children:
    """The peer processes of one launch (each hosting one peer or several), and how far
    each peer has got."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.members: dict[int, list[str]] = {}
        self.log_paths: dict[int, Path] = {}
        self._logs: dict[int, IO[bytes]] = {}
        self.dirs: dict[str, Path] = {}
        self._offsets: dict[str, int] = {}
        self.rounds_done: dict[str, int] = {}
        self.stages: dict[str, str | None] = {}

    def start(
        self,
        index: int,
        peers: Mapping[str, Path],
        argv: list[str],
        log_path: Path,
        env: dict[str, str],
    ) -> None:
        """Start process ``index`` of the peers ``peers`` (id -> folder), its output in
        ``log_path``."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        for node, folder in peers.items():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / STATUS_FILE).unlink(missing_ok=True)  # a replaced run's (--force)
            self.dirs[node] = folder
            self.rounds_done[node] = 0
            self._offsets[node] = 0
            self.stages[node] = None
        log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._logs[index] = log
        self.log_paths[index] = log_path
        self.members[index] = list(peers)
        env = {**env, PARENT_ENV: str(os.getpid())}  # the peers end with this process
        self.procs[index] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def poll_progress(self, skip: Collection[str] = ()) -> int:
        """Rounds every peer not in ``skip`` has finished (reading only what is new)."""
        for node, folder in self.dirs.items():
            path = folder / "metrics.jsonl"
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._offsets[node])
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            complete = chunk.rfind(b"\n") + 1
            self._offsets[node] += complete
            self.rounds_done[node] += chunk[:complete].count(b"\n")
        return min((r for n, r in self.rounds_done.items() if n not in skip), default=0)

    def poll_stages(self) -> dict[str, str | None]:
        """Each peer's start-up stage (None: its process has not said one yet); a peer
        with a round record is up whatever its file says."""
        for node, folder in self.dirs.items():
            if self.stages[node] in _UP:
                continue
            self.stages[node] = "running" if self.rounds_done[node] else read_stage(folder)
        return dict(self.stages)

    def exited(self) -> dict[int, int]:
        """Exit status of every child that has ended."""
        return {i: p.returncode for i, p in self.procs.items() if p.poll() is not None}

    def error_line(self, index: int) -> str | None:
        """The last ``fedcore: error:`` line in child ``index``'s log, if any."""
        try:
            with open(self.log_paths[index], "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - 16384))
                tail = fh.read().decode("utf-8", "replace")
        except OSError:
            return None
        lines = [ln for ln in tail.splitlines() if ln.startswith("fedcore: error: ")]
        return lines[-1].removeprefix("fedcore: error: ") if lines else None

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate every child still running (SIGTERM, then SIGKILL after ``grace_s``)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs.values():
            log.close()


def _names(peers: Sequence[str], most: int = 6) -> str:
    """``n0, n1, n2`` (at most ``most``, then how many more)."""
    shown = ", ".join(peers[:most])
    return shown + (f" +{len(peers) - most}" if len(peers) > most else "")


def _startup_text(stages: Mapping[str, str | None], dead: Collection[str]) -> str:
    """``launch: 5/16 peers up; importing 8 (n4, n5, ...), connecting 3 (n1, ...)``."""
    alive = [n for n in stages if n not in dead]
    up = [n for n in alive if stages[n] in _UP]
    waiting: dict[str, list[str]] = {}
    for n in alive:
        stage = stages[n]
        if stage not in _UP:
            waiting.setdefault(stage or "starting", []).append(n)
    order = ("starting", "importing", "preparing", "connecting", "failed", "stopped")
    parts = [f"{k} {len(waiting[k])} ({_names(waiting[k])})" for k in order if k in waiting]
    head = f"launch: {len(up)}/{len(alive)} peers up"
    return head + ("; " + ", ".join(parts) if parts else "")
