"""gRPC transport: the only package that imports grpc and the generated protobuf code.

Names load on first use, so that ``fedcore.transport.grpc.channel`` (the health probe)
imports without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
