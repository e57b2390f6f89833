"""gRPC transport: the only package that imports grpc and the generated protobuf code."""

from __future__ import annotations

from fedcore.transport.grpc.serde import CHUNK_BYTES, PROTOCOL_VERSION
from fedcore.transport.grpc.transport import GRPC_OPTIONS, GrpcTransport

__all__ = ["CHUNK_BYTES", "GRPC_OPTIONS", "PROTOCOL_VERSION", "GrpcTransport"]
