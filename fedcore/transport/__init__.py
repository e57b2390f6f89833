"""Transports: the in-process one here; gRPC lives in ``fedcore.transport.grpc``.

Names load on first use, so that a submodule that needs no torch imports without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedcore.lazy import lazy_names

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


__getattr__ = lazy_names(__name__, _HOMES)
