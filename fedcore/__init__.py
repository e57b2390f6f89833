"""fedcore: decentralized learning over directed trust graphs.

Peers that each hold private data train one model together with no central server,
talking only along a directed trust graph. See the README for the CLI and
``fedcore.testing`` for the in-memory harness.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
