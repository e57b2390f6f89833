"""Dependency-free progress reporting: the rounds line, a status line, peers' stages.

:class:`Progress` shows rounds, loss, accuracy and an ETA. On a terminal it redraws one
line; otherwise (CI logs, pipes) it prints a line at every tenth of the run, so logs stay
short. :class:`StatusLine` is the same for a line of free text (``fedcore launch``'s
start-up: how many peers are up, which are still importing or connecting).

:func:`write_stage` and :func:`read_stage` are how a peer process tells its launcher how
far its start-up has got: a small ``status.json`` in the peer's folder, rewritten
atomically at each stage (see :data:`STAGES`). Nothing here imports torch, so a peer can
say ``importing`` before it does.

:func:`run_warnings` collects the warnings fedcore logs during a run, for its summary
(``warnings``); a quiet run (``-q``, the Python API by default) keeps them off the
terminal.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = [
    "MAX_NOTES",
    "PROGRESS_AFTER_S",
    "PROGRESS_NODES",
    "STAGES",
    "STATUS_FILE",
    "Note",
    "Progress",
    "RunWarnings",
    "StatusLine",
    "Ticker",
    "announce_if_slow",
    "current_warnings",
    "read_stage",
    "run_warnings",
    "write_stage",
]

PROGRESS_NODES = 1000
"""From this many nodes on, a run's set-up says that it is preparing
(:func:`announce_if_slow`) when that takes more than :data:`PROGRESS_AFTER_S`."""
PROGRESS_AFTER_S = 2.0
"""Seconds of set-up after which :func:`announce_if_slow` prints its line."""

STATUS_FILE = "status.json"
"""The file, in a peer's folder, that holds its stage (:func:`write_stage`)."""

STAGES = ("importing", "preparing", "connecting", "running", "done", "failed", "stopped")
"""A peer's stages, in order: ``importing`` (torch and fedcore's modules), ``preparing``
(the data split and the model, :func:`~fedcore.setup.prepare.prepare_run`),
``connecting`` (serving, and reaching its out-neighbours), ``running`` (its rounds), then
one of ``done``, ``failed`` (an error) or ``stopped`` (a signal, or another peer of its
process failed). Before its first stage a peer's process is still starting Python."""


def _perf_counter() -> float:
    return time.perf_counter()


def _fmt_seconds(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 60}:{s % 60:02d}" if s >= 60 else f"{s}s"


class Progress:
    """Shows ``round r/T  loss  acc  elapsed  ETA`` as rounds complete."""

    def __init__(
        self, total: int, *, label: str = "", stream: TextIO | None = None, first: int = 0
    ) -> None:
        """Start the clock for ``total`` rounds, ``first`` of them done already (a run
        resumed from a checkpoint): the ETA counts only the rounds run from now."""
        self.total = total
        self.first = first
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._next_report = 0.0

    def update(
        self, done: int, *, loss: float | None = None, accuracy: float | None = None
    ) -> None:
        """Report that ``done`` rounds are complete."""
        fraction = done / self.total
        if not self.tty and fraction < self._next_report and done != self.total:
            return
        self._next_report = fraction + 0.1
        elapsed = time.perf_counter() - self.start
        # The first rounds carry start-up costs (imports, the first batches, caches): an
        # estimate from them alone says minutes for a run of seconds, so wait for a few.
        ran = done - self.first
        settled = ran >= max(2, self.total // 50) and elapsed >= 1.0
        eta = elapsed / ran * (self.total - done) if ran > 0 else 0.0
        width = 24
        filled = int(width * fraction)
        parts = [
            f"{self.label} [{'#' * filled}{'.' * (width - filled)}] round {done}/{self.total}",
        ]
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if accuracy is not None:
            parts.append(f"acc {accuracy:.4f}")
        when = _fmt_seconds(eta) if settled or done == self.total else "--"
        parts.append(f"{_fmt_seconds(elapsed)} elapsed, ETA {when}")
        line = "  ".join(parts)
        if self.tty:
            self.stream.write("\r" + line + "\033[K")
            if done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


class StatusLine:
    """One line of changing text (and the seconds since it was made).

    On a terminal it is redrawn in place whenever the text changes (or the elapsed
    second); elsewhere it is printed every ``every_s`` seconds, changed or not (a log
    shows that the wait goes on, and for how long), and no more often, so a log gets a
    line every ``every_s`` rather than one per change. :meth:`finish` always prints.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        every_s: float = 5.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """Print on ``stream`` (default stderr); ``clock`` (default ``time.perf_counter``)
        is for tests."""
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self.clock = clock if clock is not None else _perf_counter
        self.start = self.clock()
        self._shown = ""  # the last text drawn or printed, with its elapsed seconds
        self._printed_at = -float("inf")

    def elapsed(self) -> float:
        """Seconds since the line was made."""
        return self.clock() - self.start

    def show(self, text: str) -> None:
        """Show ``text`` (redrawn on a terminal; printed every ``every_s`` elsewhere)."""
        now = self.clock()
        line = f"{text}  {_fmt_seconds(now - self.start)}"
        if self.tty:
            if line != self._shown:
                self.stream.write("\r" + line + "\033[K")
                self.stream.flush()
                self._shown = line
            return
        if now - self._printed_at >= self.every_s:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._printed_at = now

    def finish(self, text: str) -> None:
        """Show ``text`` as the line's last state and end the line."""
        line = f"{text}  {_fmt_seconds(self.elapsed())}"
        self.stream.write(("\r" + line + "\033[K" if self.tty else line) + "\n")
        self.stream.flush()


class Ticker:
    """A line every ``every_s`` seconds while a block runs, from a thread of its own:
    ``text()`` and the seconds since the block began (``n3: preparing (data and model)
    10s``). A step that blocks its caller (a data set's load, a wait for neighbours)
    still tells a log, at least every ``every_s``, that it goes on. Nothing is printed
    after the block ends."""

    def __init__(
        self, stream: TextIO | None, text: Callable[[], str], *, every_s: float = 5.0
    ) -> None:
        self.stream = stream
        self.text = text
        self.every_s = every_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.start = time.perf_counter()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                if self._stop.is_set() or self.stream is None:
                    return
                line = f"{self.text()}  {_fmt_seconds(time.perf_counter() - self.start)}"
                self.stream.write(line + "\n")
                self.stream.flush()

    def __enter__(self) -> Ticker:
        self.start = time.perf_counter()
        if self.stream is not None:
            self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # a line being written ends before the block's next words
            self._stop.set()
        if self._thread is not None:
            self._thread.join()


def write_stage(folder: Path, stage: str) -> None:
    """Record ``stage`` (one of :data:`STAGES`) in ``folder/status.json``, atomically
    (written beside it, then renamed), with this process's id and the time."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}.")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / STATUS_FILE
    tmp = path.with_name(f"{STATUS_FILE}.{os.getpid()}.tmp")
    record = {"stage": stage, "pid": os.getpid(), "time": time.time()}
    tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
    tmp.replace(path)


def read_stage(folder: Path) -> str | None:
    """The stage a peer recorded in ``folder/status.json``; None when there is none yet
    (or it cannot be read)."""
    try:
        record = json.loads((folder / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    stage = record.get("stage") if isinstance(record, dict) else None
    return stage if isinstance(stage, str) else None


@contextmanager
def announce_if_slow(stream: TextIO | None, nodes: int | None) -> Iterator[None]:
    """Print ``preparing N nodes ...`` on ``stream`` once, if the block still runs
    :data:`PROGRESS_AFTER_S` seconds after it began and the run has at least
    :data:`PROGRESS_NODES` nodes (``None``: not known yet, a graph file). Nothing is
    printed after the block ends: leaving it cancels the line (waiting for one that is
    being written)."""
    if stream is None or nodes is None or nodes < PROGRESS_NODES:
        yield
        return
    out = stream

    def say() -> None:
        out.write(f"preparing {nodes:,} nodes (graph and weights) ...\n")
        out.flush()

    timer = threading.Timer(PROGRESS_AFTER_S, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if timer.is_alive():
            timer.join()


# --- a run's warnings -------------------------------------------------------------------

MAX_NOTES = 100
"""Distinct warnings one run keeps (:class:`RunWarnings`); later ones are only counted."""


@dataclass(frozen=True, slots=True)
class Note:
    """One warning fedcore logged: the logger's name, the level and the message."""

    logger: str
    level: int
    message: str

    def log(self) -> None:
        """Log it again, as it was logged (a sweep says a worker's warning once)."""
        logging.getLogger(self.logger).log(self.level, "%s", self.message)


class RunWarnings(logging.Handler):
    """The distinct warnings fedcore logged during one run (see :func:`run_warnings`)."""

    def __init__(self, quiet: bool) -> None:
        super().__init__(logging.WARNING)
        self.quiet = quiet
        self.notes: list[Note] = []
        self.more = 0
        """Warnings logged once :data:`MAX_NOTES` distinct ones are kept, not kept (each
        time one is logged: past the cap, repeats are not told apart)."""

    @property
    def messages(self) -> list[str]:
        """The messages, in the order first said (the summary's ``warnings``)."""
        return [n.message for n in self.notes] + (
            [f"... and {self.more} more warnings"] if self.more else []
        )

    def emit(self, record: logging.LogRecord) -> None:
        note = Note(record.name, record.levelno, record.getMessage())
        if note not in self.notes:
            if len(self.notes) < MAX_NOTES:
                self.notes.append(note)
            else:
                self.more += 1
        with _LOCK:
            first = bool(_ACTIVE) and _ACTIVE[0] is self
            quiet = any(h.quiet for h in _ACTIVE)
        # This handler in the logger's chain keeps logging's last resort (stderr, when
        # nothing else handles a warning: the Python API) from printing it; a run that is
        # not quiet prints it as the last resort would have.
        if first and not quiet and not _handled(record) and logging.lastResort is not None:
            logging.lastResort.handle(record)


class _OffTerminal(logging.Filter):
    """Keeps fedcore's warnings from a handler that writes to the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name == "fedcore" or record.name.startswith("fedcore.")
        return not (ours and logging.WARNING <= record.levelno < logging.ERROR)


_LOCK = threading.Lock()
_ACTIVE: list[RunWarnings] = []
"""The collectors of the runs under way, outermost first."""


def _handled(record: logging.LogRecord) -> bool:
    """Whether a handler other than a run's collector takes ``record`` (as logging's own
    search for one, before its last resort)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        for handler in logger.handlers:
            if not isinstance(handler, RunWarnings) and record.levelno >= handler.level:
                return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def _terminal_handlers() -> list[logging.Handler]:
    """The handlers on fedcore's logger and its ancestors that write to the terminal
    (stderr or stdout: ``fedcore``'s own, a ``basicConfig`` one); not those writing to a
    file or elsewhere (a log file keeps every warning)."""
    streams = {id(s) for s in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__) if s}
    found: list[logging.Handler] = []
    logger: logging.Logger | None = logging.getLogger("fedcore")
    while logger is not None:
        for handler in logger.handlers:
            if (
                isinstance(handler, logging.StreamHandler)
                and not isinstance(handler, logging.FileHandler)
                and id(handler.stream) in streams
            ):
                found.append(handler)
        if not logger.propagate:
            break
        logger = logger.parent
    return found


@contextmanager
def run_warnings(*, quiet: bool) -> Iterator[RunWarnings]:
    """Collect the distinct warnings fedcore logs during the block (a run), for its
    summary's ``warnings``; with ``quiet``, keep them off the terminal meanwhile (the
    handlers on fedcore's logger and its ancestors that write to stderr or stdout, and
    logging's last resort), so that ``-q`` and the Python API print nothing. Other
    handlers (a log file, pytest's) still get every warning.

    Blocks nest (a sweep's run inside the sweep): each collects every warning, and any
    quiet one keeps them off the terminal."""
    handler = RunWarnings(quiet)
    ours = logging.getLogger("fedcore")
    filtered: list[tuple[logging.Handler, logging.Filter]] = []
    with _LOCK:
        _ACTIVE.append(handler)
        ours.addHandler(handler)
        if quiet:
            for target in _terminal_handlers():
                off = _OffTerminal()
                target.addFilter(off)
                filtered.append((target, off))
    try:
        yield handler
    finally:
        with _LOCK:
            ours.removeHandler(handler)
            _ACTIVE.remove(handler)
            for target, added in filtered:
                target.removeFilter(added)


def current_warnings() -> list[str]:
    """The warnings of the innermost run under way (:func:`run_warnings`), or none."""
    with _LOCK:
        return _ACTIVE[-1].messages if _ACTIVE else []
