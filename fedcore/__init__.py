"""fedcore: decentralized learning over directed trust graphs.

Peers that each hold private data train one model together with no central server,
talking only along a directed trust graph. See ``docs/command-line.md`` for the CLI,
``docs/api.md`` for :func:`run` and :func:`sweep`, and ``fedcore.testing`` for the
in-memory harness.
"""

from __future__ import annotations

import os
import sys

from fedcore.lazy import lazy_names

# MKL's conditional numerical reproducibility: without it, MKL's GEMM kernels round a
# product by the memory address of its operands on some CPUs (AMD EPYC among them), and a
# peer's gradient of its one row would differ in the last bits from the same row among the
# vectorized engine's N rows. MKL reads this once, at its first computation, so it is set
# before any fedcore module imports torch; fedcore.gradients checks it took effect.
os.environ.setdefault("MKL_CBWR", "AUTO")

# OpenMP threads that wait for work sleep rather than spin. Spinning threads steal the
# cores of the threads with work once a machine runs more threads than it has cores
# (another run, a sweep's workers): a run with two threads on a busy 2-core machine took
# 10x as long per round as with one. Sleeping costs a wake-up per parallel pass, which is
# nothing next to the passes `--threads auto` splits (benchmarks/threads.py). OpenMP reads
# this when torch is first imported; fedcore.runtime.threads_sleep says whether it took.
OPENMP_SLEEPS = os.environ.get("OMP_WAIT_POLICY", "PASSIVE").upper() == "PASSIVE" and (
    "OMP_WAIT_POLICY" in os.environ or "torch" not in sys.modules
)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

__all__ = ["RunResult", "SweepResult", "__version__", "run", "sweep"]

# The Python API (fedcore/api.py), loaded on first use: `import fedcore` imports no torch.
__getattr__ = lazy_names(__name__, {name: "api" for name in __all__ if name != "__version__"})
