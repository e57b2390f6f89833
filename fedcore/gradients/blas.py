"""What the CPU's kernels are asked for and checked for, so that a row's gradient has the same
bits whatever the number of rows: MKL's conditional numerical reproducibility mode
(:func:`reproducible_blas`), one intra-op thread (:func:`one_thread`), and whether MKL's
kernels are those zero padding was measured exact on (:func:`_padding_kernels`)."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


_CBWR_AVX2 = 10
"""MKL's number for its AVX2 kernels (``MKL_CBWR_AVX2``; SSE4.2's is 8, AVX-512's 12)."""

_padding_kernels_checked: bool | None = None


_CBWR_BRANCH = 1  # mkl_cbwr_get's option: the current branch
_CBWR_OFF = (0, 1)  # no reproducibility mode (unset, or branch off)
_CBWR_AUTO = 2

_blas_checked: bool | None = None


def reproducible_blas() -> bool:
    """Whether MKL computes in its conditional numerical reproducibility mode (switching it
    on if MKL has not computed anything yet); ``True`` where torch uses no MKL. Warns once
    if it is off and can no longer be switched on (torch ran a product before fedcore was
    imported with ``MKL_CBWR`` unset): the engines may then differ in the last bits on
    CPUs whose kernels round by memory address."""
    global _blas_checked
    if _blas_checked is not None:
        return _blas_checked
    library = _mkl()
    ok = True
    if library is not None:
        get, set_ = library
        chosen = os.environ.get("MKL_CBWR", "AUTO") != "AUTO"  # the user's own setting
        if chosen:
            ok = get(_CBWR_BRANCH) not in _CBWR_OFF
        elif get(_CBWR_BRANCH) in _CBWR_OFF and set_(_CBWR_AUTO) != 0:
            ok = False
            logger.warning(
                "MKL's reproducibility mode is off (torch computed before fedcore was "
                "imported, and MKL_CBWR is unset): a peer's gradient may differ from the "
                "vectorized engine's in the last bits on some CPUs. Import fedcore first or "
                "set MKL_CBWR=AUTO."
            )
    _blas_checked = ok
    return ok


def _mkl() -> tuple[Callable[[int], int], Callable[[int], int]] | None:
    """MKL's ``(cbwr_get, cbwr_set)`` inside torch's CPU library, or ``None``."""
    library = _torch_cpu_library()
    if library is None:
        return None
    get, set_ = library.mkl_serv_cbwr_get, library.mkl_serv_cbwr_set
    for function in (get, set_):
        function.restype = ctypes.c_int
        function.argtypes = [ctypes.c_int]
    return get, set_


def _torch_cpu_library() -> ctypes.CDLL | None:
    """torch's CPU library where it holds MKL's service functions, else ``None``."""
    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
        return None
    folder = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib"):
        try:
            library = ctypes.CDLL(str(folder / name))
            library.mkl_serv_cbwr_get, library.mkl_serv_cbwr_set  # noqa: B018
        except (OSError, AttributeError):
            continue
        return library
    return None


def _padding_kernels() -> bool:
    """Whether MKL's kernels are those padding was measured exact on (AVX2 or later, or no
    MKL: torch's own kernels), checked once a process. MKL's SSE4.2 kernels (a CPU
    without AVX2, or ``MKL_ENABLE_INSTRUCTIONS=SSE4_2``) add a product's last examples by
    the operands' memory alignment even in the reproducibility mode: a row of 41 examples
    padded to 46 got the lone row's bits at one offset of the stacked rows and not at
    another (7e-9 apart), which a check of one row per size cannot see."""
    global _padding_kernels_checked
    if _padding_kernels_checked is None:
        library = _torch_cpu_library()
        ok = True
        if library is not None:
            try:
                auto = library.mkl_serv_cbwr_get_auto_branch
            except AttributeError:
                ok = False  # an MKL that cannot say which kernels it runs
            else:
                auto.restype = ctypes.c_int
                auto.argtypes = []
                ok = int(auto()) >= _CBWR_AVX2
        _padding_kernels_checked = ok
    return _padding_kernels_checked


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the block with one intra-op thread (then restore the count)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


REDUCE_GRAIN = 32768
"""``at::internal::GRAIN_SIZE``: a CPU reduction shorter than this runs serially."""


def row_reduce(
    values: torch.Tensor, length: int, op: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``op`` (a reduction over the last dim) of ``values``, each row in the order it has
    alone (one message, one peer).

    ``values[r]`` holds row ``r``'s operands. A CPU reduction shorter than torch's grain
    is serial whatever the other dims; a longer one is split among threads by its own
    length (so its bits would depend on the thread count), so those rows are reduced one
    at a time on one thread, each as a lone row is with any number of threads.
    """
    if values.device.type == "cpu" and length >= REDUCE_GRAIN:
        with one_thread():
            if len(values) == 1:
                return op(values[0])[None]
            return torch.stack([op(row) for row in values])
    return op(values)
