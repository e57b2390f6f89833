"""Logging as a plain process has it, inside a test (shared by the tests of issue 40's
quiet runs)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def plain_logging() -> Iterator[None]:
    """No handler on the root logger (pytest's taken off for the block), as in a process
    of its own: the CLI's ``basicConfig`` then writes to the (captured) stderr, and a
    library call's warnings reach logging's last resort (stderr), so that a test sees what
    a user's terminal would. Put back before the test ends (pytest takes its handlers off
    when the test's call ends)."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in saved:
                handler.close()
        root.handlers[:] = saved
        root.setLevel(level)
