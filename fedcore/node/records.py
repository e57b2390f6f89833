"""What a node records of each round (:class:`RoundRecord`): one line of a run's
``metrics.jsonl``."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from fedcore.transport.base import TransportStats

__all__ = ["Counts", "RoundRecord", "counted", "traffic"]


class Counts(TypedDict):
    """A round's traffic, as its record counts it (:func:`counted`)."""

    messages_sent: int
    bytes_sent: int
    messages_received: int
    bytes_received: int
    messages_late: int
    messages_rejected: int


def traffic(stats: TransportStats) -> tuple[int, ...]:
    """A transport's counters so far (messages and bytes sent and received, messages late
    and rejected), taken as a round begins: its record counts what they grew by."""
    return (
        stats.messages_sent,
        stats.bytes_sent,
        stats.messages_received,
        stats.bytes_received,
        stats.messages_late,
        stats.messages_rejected,
    )


def counted(stats: TransportStats, before: tuple[int, ...]) -> Counts:
    """What each of :func:`traffic`'s counters grew by since ``before``."""
    grew = [a - b for a, b in zip(traffic(stats), before, strict=True)]
    return Counts(
        messages_sent=grew[0],
        bytes_sent=grew[1],
        messages_received=grew[2],
        bytes_received=grew[3],
        messages_late=grew[4],
        messages_rejected=grew[5],
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRecord:
    """What one node did in one round (one line of ``metrics.jsonl``)."""

    node: str
    round: int
    loss: float
    lr: float
    messages_sent: int
    """Messages this node sent (those fault injection lost excepted; late ones included)."""
    bytes_sent: int
    """Their encoded bytes."""
    messages_received: int
    """Messages that reached this node in time and went into its inbox (a late one never
    does: the same on both engines and on gRPC peers)."""
    bytes_received: int
    """Their encoded bytes."""
    messages_missing: int
    """Expected senders whose message this node went on without (lost, late or rejected)."""
    messages_late: int
    """Messages that came after this node's deadline: sent, and missing here, but not
    received (in a simulation: past the virtual deadline of the run's
    :class:`~fedcore.timing.RoundClock`; on a gRPC peer: after its collect)."""
    messages_rejected: int
    missing: tuple[str, ...]
    wall_s: float
    messages_dropped: int = 0
    """Messages this node sent that fault injection lost."""
    dropped_out: tuple[str, ...] = ()
    """Receivers of those lost messages (one entry per message)."""
    dropped_in: tuple[str, ...] = ()
    """Senders whose message to this node fault injection lost (announced; also missing)."""
    fp32_bytes_sent: int = 0
    """What the tensors sent would have taken as float32 (for compression ratios)."""
    down: bool = False
    """This node was crashed (fault injection) and skipped the round; ``loss`` is NaN."""
    unreachable: tuple[str, ...] = ()
    """Receivers a send failed to (deadline mode only: a dead or unreachable peer)."""
    idle: bool = False
    """The node took no training step this round (a server, or a worker the round did not
    sample: its algorithm's ``trains`` said no); ``loss`` is NaN. Written only when set."""
    vtime: float | None = None
    """The node's virtual clock at the end of the round, in seconds (a simulation's
    :class:`~fedcore.timing.RoundClock`, or the event engine's); None: no virtual time (a
    run over gRPC). Written only when set, with ``compute_s``."""
    compute_s: float = 0.0
    """Virtual seconds the node computed in the round (it waited for the rest)."""

    def to_json(self) -> dict[str, Any]:
        """The record as one ``metrics.jsonl`` line (``kind = "node"``; strict JSON)."""
        # Field by field (every value a number, a string or a tuple of strings): what
        # ``asdict`` gives, without its deep copy (a large run writes millions of lines).
        line = {name: getattr(self, name) for name in _FIELDS}
        if not self.idle:
            del line["idle"]
        if self.vtime is None:
            del line["vtime"], line["compute_s"]
        for key in ("missing", "dropped_out", "dropped_in", "unreachable"):
            line[key] = list(line[key])
        if math.isnan(self.loss):
            line["loss"] = None
        line["kind"] = "node"
        return line

    @classmethod
    def down_round(cls, node: str, round: int, *, lr: float, wall_s: float) -> RoundRecord:
        """The record of a round a crashed or dead node did not run (``loss`` NaN)."""
        return cls(
            node=node,
            round=round,
            loss=math.nan,
            lr=lr,
            messages_sent=0,
            bytes_sent=0,
            messages_received=0,
            bytes_received=0,
            messages_missing=0,
            messages_late=0,
            messages_rejected=0,
            missing=(),
            wall_s=wall_s,
            down=True,
        )

    @classmethod
    def from_json(cls, line: dict[str, Any]) -> RoundRecord:
        """The record of a line written by :meth:`to_json`."""
        raw = {k: v for k, v in line.items() if k != "kind"}
        for key in ("missing", "dropped_out", "dropped_in", "unreachable"):
            raw[key] = tuple(raw.get(key, ()))
        if raw["loss"] is None:
            raw["loss"] = math.nan
        return cls(**raw)


_FIELDS = tuple(f.name for f in fields(RoundRecord))
"""The record's fields, in their order (the keys of a line)."""
