"""fedcore: decentralized learning over directed trust graphs.

Peers that each hold private data train one model together with no central server,
talking only along a directed trust graph. See the README for the CLI and
``fedcore.testing`` for the in-memory harness.
"""

from __future__ import annotations

import os

from fedcore.lazy import lazy_names

# MKL's conditional numerical reproducibility: without it, MKL's GEMM kernels round a
# product by the memory address of its operands on some CPUs (AMD EPYC among them), and a
# peer's gradient of its one row would differ in the last bits from the same row among the
# vectorized engine's N rows. MKL reads this once, at its first computation, so it is set
# before any fedcore module imports torch; fedcore.gradients checks it took effect.
os.environ.setdefault("MKL_CBWR", "AUTO")

__version__ = "0.1.0"

__all__ = ["RunResult", "SweepResult", "__version__", "run", "sweep"]

# The Python API (fedcore/api.py), loaded on first use: `import fedcore` imports no torch.
__getattr__ = lazy_names(__name__, {name: "api" for name in __all__ if name != "__version__"})
