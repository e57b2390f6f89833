"""A dependency-free progress line for long runs: rounds, loss, accuracy, ETA.

On a terminal it redraws one line; otherwise (CI logs, pipes) it prints a line at
every tenth of the run, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


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
