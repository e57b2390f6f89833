"""Transports: the in-process one here; gRPC lives in ``fedcore.transport.grpc``.

Names load on first use, so that a submodule that needs no torch imports without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedcore.transport.base import Transport, TransportStats
    from fedcore.transport.inproc import InProcessNetwork, InProcessTransport

__all__ = ["InProcessNetwork", "InProcessTransport", "Transport", "TransportStats"]

_HOMES = {
    "Transport": "base",
    "TransportStats": "base",
    "InProcessNetwork": "inproc",
    "InProcessTransport": "inproc",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
