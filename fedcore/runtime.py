"""Process-wide settings a long fedcore run wants, applied by the program that owns the
process (the CLI's ``simulate`` and ``node``, a sweep's worker processes), never on import.

:func:`keep_freed_memory`: glibc's ``malloc`` serves every block above 32 MiB with a fresh
``mmap`` and unmaps it on ``free``, so each ``[N, d]`` temporary of a large model (64 MiB
for 16 peers of 1,000,000 float32 parameters) is new memory that the kernel zero-fills page
by page on first touch. Measured on a 2-core machine, that made allocating such a tensor
cost 2.5x the arithmetic done in it (``x + y`` 40 ms against 15 ms into an existing
tensor), and the vectorized engine 1.5-2x slower than it needs to be at that shape. With
mmap off and trimming raised, freed blocks stay in the heap and the next round reuses
them; the process keeps its peak memory instead of returning it between rounds.

:func:`auto_threads`: how many torch intra-op threads a run gets when it is given
``--threads auto`` (the default of ``fedcore simulate``), from the bytes of its largest
whole-state pass (see :data:`BYTES_PER_THREAD`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator

__all__ = [
    "BYTES_PER_THREAD",
    "PARENT_ENV",
    "auto_threads",
    "end_with_parent",
    "keep_freed_memory",
    "physical_memory",
    "run_threads",
    "threads_sleep",
    "usable_cores",
]

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

TRIM_THRESHOLD = 1 << 30
"""Free memory at the top of the heap above which glibc gives it back (1 GiB)."""

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Have glibc keep freed large blocks for reuse (see the module docstring).

    Returns:
        Whether the setting is in effect (False off glibc, e.g. macOS or musl, where it is
        not needed or not available). Idempotent.
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    logger.debug("malloc keeps freed blocks: %s", _applied)
    return _applied


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where the OS does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return pages * size if pages > 0 and size > 0 else None


BYTES_PER_THREAD = 2 << 20
"""``--threads auto``'s cost model: one torch thread per 2 MiB of the run's largest
whole-state pass (the ``[N, d]`` stack of the vectorized engine, one peer's ``[d]`` model on
the message engine), up to the usable cores. An elementwise pass over 2 MiB takes about
0.2 ms at memory speed, so a thread's fork and join (tens of microseconds) stay under a
tenth of it; below that the work is too small to split, and a second thread only adds
the wake-ups. Measured in ``benchmarks/auto_engine.py`` (its ``threads`` table)."""


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity masks (macOS)
        return max(1, os.cpu_count() or 1)


def threads_sleep() -> bool:
    """Whether OpenMP's idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``, which importing
    fedcore sets unless the environment says otherwise or torch was imported first)."""
    import fedcore

    return fedcore.OPENMP_SLEEPS


def auto_threads(pass_bytes: int, cores: int | None = None) -> int:
    """Torch threads for a run whose largest whole-state pass covers ``pass_bytes``: one
    per :data:`BYTES_PER_THREAD`, at least 1, at most ``cores`` (default
    :func:`usable_cores`)."""
    limit = usable_cores() if cores is None else max(1, cores)
    return max(1, min(limit, pass_bytes // BYTES_PER_THREAD))


PARENT_ENV = "FEDCORE_PARENT_PID"
"""Set by a fedcore launcher (``fedcore launch``, ``simulate --ranks``) in the environment of
each process it starts: the launcher's pid (:func:`end_with_parent`)."""

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent() -> bool:
    """A process a fedcore launcher started (:data:`PARENT_ENV`) ends with it: the kernel
    sends it SIGTERM when the launcher dies, however it dies (``kill -9`` included), so no
    peer is left running on its own. Where the launcher is gone already, SIGTERM now.

    Returns:
        Whether the watch is set (False outside a launcher, off Linux, without glibc).
    """
    text = os.environ.get(PARENT_ENV, "")
    if not text.isdigit() or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if os.getppid() != int(text):  # the launcher died before the watch was set
        os.kill(os.getpid(), signal.SIGTERM)
    return True


@contextlib.contextmanager
def run_threads(threads: int | str | None, auto: Callable[[], int]) -> Iterator[None]:
    """torch's intra-op threads for a run (``--threads``: a count, ``"auto"``, for which
    ``auto()`` gives the count once the run's shape is known, or ``None``: left as they
    are), put back after it.

    Raises:
        ConfigError: ``threads`` is none of those.
    """
    if threads is None:
        yield
        return
    if threads == "auto":
        count = auto()
    elif isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1:
        count = threads
    else:
        from fedcore.errors import ConfigError

        raise ConfigError(f"threads must be a whole number >= 1 or 'auto', got {threads!r}.")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
