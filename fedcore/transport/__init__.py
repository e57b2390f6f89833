"""Transports: the in-process one here; gRPC lives in ``fedcore.transport.grpc``."""

from __future__ import annotations

from fedcore.transport.base import Transport, TransportStats
from fedcore.transport.inproc import InProcessNetwork, InProcessTransport

__all__ = ["InProcessNetwork", "InProcessTransport", "Transport", "TransportStats"]
