"""What goes over the links: ``[compression]`` (the codec of every tensor a node sends)
and ``[transport]`` (how peers talk and how long a node waits for its inbox)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fedcore import registry
from fedcore.config.constants import CODECS, MAX_CHUNK, MODES
from fedcore.config.rules import Table, check_choice, choice, holds, number, require, rule, whole
from fedcore.errors import ConfigError
from fedcore.registry import did_you_mean

__all__ = ["CompressionConfig", "TransportConfig"]


def _codec(key: str, value: object) -> None:
    """One of ``CODECS``, or a plug-in's codec (:data:`fedcore.registry.CODECS`)."""
    if value not in registry.CODECS:
        check_choice(key, value, CODECS)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressionConfig(Table):
    """``[compression]``: the codec of every tensor a node sends.

    ``codec`` is one of ``CODECS``; ``bits`` applies to ``qsgd`` (2, 4 or 8), ``ratio`` (the
    fraction of values kept) to ``topk`` and ``randk``, ``chunk`` (values per scale, 0 for
    one scale per tensor) to ``sign``, ``qsgd`` and ``fp8``; ``scaled`` makes ``qsgd``
    contractive (shrunk by ``1 + omega``), as error-feedback methods need. ``format``
    (``e4m3`` or ``e5m2``) applies to ``fp8``; ``exp_bits`` (2..8), ``man_bits`` (0..23) and
    ``scaling`` (``none``, or ``aps``: each layer shifted by a power of two before the cast,
    the shifts sent) to ``float``. ``fp32`` is lossless for float32 models; ``raw`` keeps
    any dtype exactly.
    """

    TABLE: ClassVar[str] = "compression"

    codec: str = field(default="fp32", metadata=rule(_codec))
    bits: int = field(default=8, metadata=holds(lambda v: v in (2, 4, 8), "must be 2, 4 or 8"))
    ratio: float = field(default=0.01, metadata=number("(0, 1]"))
    chunk: int = field(default=0, metadata=whole(0, MAX_CHUNK))
    scaled: bool = False
    format: str = field(default="e4m3", metadata=choice(("e4m3", "e5m2")))
    exp_bits: int = field(default=4, metadata=whole(2, 8))
    man_bits: int = field(default=3, metadata=whole(0, 23))
    scaling: str = field(default="none", metadata=choice(("none", "aps")))


def _tls(key: str, tls: object) -> None:
    """``[transport.tls]``: empty, or ``dir`` alone, a non-empty string."""
    if not isinstance(tls, Mapping):
        raise ConfigError(f"{key} must be a table (dir = ...), got {tls!r}.")
    unknown = sorted(set(tls) - {"dir"})
    if unknown:
        hint = did_you_mean(unknown[0], ["dir"])
        raise ConfigError(
            f"unknown key {key}.{unknown[0]}"
            + (f"; {hint}" if hint else "")
            + f" (keys of [{key}]: dir)."
        )
    if tls:
        require(
            isinstance(tls.get("dir"), str) and bool(tls["dir"]),
            f"{key}.dir",
            tls.get("dir"),
            "must be the certificate folder (fedcore certs init --out DIR)",
        )


_POSITIVE = number("> 0", why="must be a number > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig(Table):
    """``[transport]``: how peers talk and how long a node waits for its inbox.

    The command chooses the transport: ``fedcore simulate`` runs in-process, ``fedcore
    launch`` and ``fedcore node`` over gRPC (:data:`~fedcore.config.REMOVED_KEYS`: ``kind``
    said so and did nothing, and is refused).
    """

    TABLE: ClassVar[str] = "transport"

    mode: str = field(default="strict", metadata=choice(MODES))
    deadline_s: float = field(default=5.0, metadata=number("> 0", finite=False))
    strict_timeout_s: float = field(default=300.0, metadata=number("> 0", finite=False))
    startup_timeout_s: float = field(default=60.0, metadata=_POSITIVE)
    call_timeout_s: float = field(default=60.0, metadata=_POSITIVE)
    max_message_mb: float = field(default=1024.0, metadata=_POSITIVE)
    round_window: int = field(default=32, metadata=whole(0, 10**6))
    """Deadline mode: rounds a sender may run ahead of a receiver beyond what lock-step
    allows; a message further ahead is refused (FAILED_PRECONDITION) and changes nothing."""
    chunk_timeout_s: float = field(default=10.0, metadata=_POSITIVE)
    """gRPC: longest wait for the next chunk of a message (and for its header)."""
    min_rate_mb_s: float = field(default=1.0, metadata=_POSITIVE)
    """gRPC: slowest transfer a receiver waits for; a message of S MiB may take
    ``chunk_timeout_s + S / min_rate_mb_s`` seconds in all."""
    max_streams_per_sender: int = field(default=4, metadata=whole(1, 1024))
    """gRPC: message streams one sender may have open at once at a receiver."""
    tls: Mapping[str, Any] = field(default_factory=dict, metadata=rule(_tls))
    """``[transport.tls]``: ``dir`` holds ``ca.crt`` and each node's ``<id>.crt`` and
    ``<id>.key`` (as ``fedcore certs init`` writes them). Set: every gRPC channel is
    mutual TLS and a sender's identity is the node id in its certificate. Empty: plaintext.
    A local path, so it is not part of the run fingerprint (hosts may keep certificates
    in different places); :func:`~fedcore.config.load_config` makes it absolute, as
    ``topology.file``."""

    @property
    def tls_dir(self) -> Path | None:
        """The certificate folder, or None when TLS is off."""
        return Path(self.tls["dir"]) if self.tls else None
