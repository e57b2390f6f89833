"""Client channels and the health probe: the part of the gRPC transport that needs no
torch, so that ``fedcore health`` (a container's health check, run every few seconds)
starts in a fraction of a second."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedcore.certs import TlsFiles
from fedcore.errors import PeerUnavailableError

__all__ = ["GRPC_OPTIONS", "open_channel", "probe_health"]

GRPC_OPTIONS: list[tuple[str, int]] = [
    # Messages travel as 1 MiB chunks, so no single gRPC message needs more than a few MiB;
    # the bound on a whole fedcore message is enforced by the assembler instead.
    ("grpc.max_send_message_length", 8 << 20),
    ("grpc.max_receive_message_length", 8 << 20),
    # Keep long-lived peer channels alive through long local steps (idle proxies and NATs
    # drop silent connections); ping every 20 s, give up after 10 s without an answer.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Servers must accept those pings, or they answer with GOAWAY "too_many_pings".
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    # Retry a peer that is not up yet every 0.1-1 s, not after gRPC's default backoff (1 s
    # growing to 120 s): peers start at different times, and one that comes up must be
    # reached (and greeted) at once, before its neighbours' first deadline passes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # The same for a peer's name that does not resolve yet (a container, a swarm service or
    # a pod whose DNS entry appears only once it runs): look it up again after 1 s, not
    # gRPC's default 30 s (measured: a swarm stack of 4 peers connected 25 s late).
    ("grpc.dns_min_time_between_resolutions_ms", 1_000),
]


def open_channel(address: str, tls: TlsFiles | None, peer: str) -> Any:
    """A channel to ``address``; with ``tls``, mutual TLS that expects ``peer``'s certificate."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=GRPC_OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )
    # The server must prove it is `peer`, whatever host name or address reaches it.
    options: list[tuple[str, Any]] = [*GRPC_OPTIONS, ("grpc.ssl_target_name_override", peer)]
    return grpc.aio.secure_channel(address, credentials, options=options)


async def probe_health(
    address: str, *, tls: TlsFiles | None = None, peer: str = "", timeout_s: float = 5.0
) -> str:
    """Ask the gRPC health service at ``address`` for its status (``"SERVING"`` when a peer
    is up); with ``tls``, over mutual TLS, expecting the certificate of ``peer``.

    Raises:
        PeerUnavailableError: no answer within ``timeout_s`` (with the reason).
    """
    channel = open_channel(address, tls, peer)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        raise PeerUnavailableError(f"{address}: {exc.code().name}: {exc.details()}") from exc
    finally:
        await channel.close()
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
