"""gRPC transport: the only package that imports grpc and the generated protobuf code.

Names load on first use, so that ``fedcore.transport.grpc.channel`` (the health probe)
imports without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedcore.lazy import lazy_names

if TYPE_CHECKING:
    from fedcore.transport.grpc.channel import GRPC_OPTIONS, probe_health
    from fedcore.transport.grpc.serde import CHUNK_BYTES, PROTOCOL_VERSION
    from fedcore.transport.grpc.transport import GrpcTransport

__all__ = ["CHUNK_BYTES", "GRPC_OPTIONS", "PROTOCOL_VERSION", "GrpcTransport", "probe_health"]

_HOMES = {
    "CHUNK_BYTES": "serde",
    "PROTOCOL_VERSION": "serde",
    "GRPC_OPTIONS": "channel",
    "probe_health": "channel",
    "GrpcTransport": "transport",
}


__getattr__ = lazy_names(__name__, _HOMES)
