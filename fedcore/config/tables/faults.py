"""``[faults]``: reproducible message loss, delay, partitions and crashes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedcore.config.constants import MAX_ROUNDS, SEED_LIMIT
from fedcore.config.rules import Table, is_int, number, parse_edge, require, rule, shown, whole
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id
from fedcore.registry import did_you_mean

__all__ = ["Crash", "FaultsConfig", "Partition"]


def _entry_hint(item: object, keys: tuple[str, ...]) -> str:
    """``"; bakc: did you mean `back`?."`` for the unknown keys of a fault entry (else ".")."""
    if not isinstance(item, Mapping):
        return "."
    hints = [(k, did_you_mean(k, keys)) for k in item if k not in keys]
    shown = [f"{k}: {h}" for k, h in hints if h]
    return f" ({'; '.join(shown)})." if shown else "."


def _round(key: str, value: object) -> int:
    if not is_int(value) or not 0 <= value <= MAX_ROUNDS:  # type: ignore[operator]
        raise ConfigError(
            f"{key} must be a round number from 0 to {MAX_ROUNDS:,}, got {shown(value)}."
        )
    assert isinstance(value, int)
    return value


def _edge_drop(key: str, table: object) -> None:
    """``{ "u->v" = p }``: each edge once, each p a probability."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{key} must be a table, got {shown(table)}.")
    edges: dict[tuple[str, str], str] = {}
    for edge, p in table.items():
        pair = parse_edge(key, edge)
        if pair in edges:
            raise ConfigError(
                f"{key} names the edge {pair[0]}->{pair[1]} twice ({edges[pair]!r} "
                f"and {edge!r}); give it once."
            )
        edges[pair] = edge
        ok = isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 1
        require(ok, f"{key}.{edge!r}", p, "must be a probability in [0, 1]")


@dataclass(frozen=True, slots=True)
class Partition:
    """``nodes`` are cut off from every other node for rounds ``start <= t < end``."""

    nodes: frozenset[str]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Crash:
    """``node`` is down for rounds ``at <= t < back`` (``back = -1``: for good)."""

    node: str
    at: int
    back: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultsConfig(Table):
    """``[faults]``: reproducible message loss, delay, partitions and crashes.

    Every decision is a function of ``(run.seed, faults.seed, sender, receiver, round,
    phase)``, so a fault plan gives the same run in-process and over gRPC.

    * ``drop``: probability that any message is lost; ``edge_drop`` overrides it per edge:
      ``{ "n0->n1" = 0.5 }`` (two different nodes: a self-loop carries no message).
    * ``delay_s``: each message waits uniformly in ``[0, delay_s]`` before it is sent (a
      node sends one message after another, so its delays add up within a phase).
    * ``partitions``: ``[{ nodes = ["n0", "n1"], start = 10, end = 20 }]``: messages between
      those nodes and the rest are lost in rounds 10-19.
    * ``crashes``: ``[{ node = "n3", at = 50, back = 80 }]``: n3 does nothing in rounds
      50-79 (no step, no message) and resumes with the state it had; omit ``back`` to keep
      it down.
    * ``announce`` (default true): a lost message is replaced by a tiny drop notice, so
      receivers never wait for it (runs are fast and deterministic in strict mode); false:
      it vanishes and receivers need ``transport.mode = "deadline"``.
    """

    TABLE: ClassVar[str] = "faults"

    seed: int = field(default=0, metadata=whole(0, SEED_LIMIT - 1))
    drop: float = field(default=0.0, metadata=number("[0, 1]"))
    edge_drop: Mapping[str, float] = field(default_factory=dict, metadata=rule(_edge_drop))
    delay_s: float = field(default=0.0, metadata=number(">= 0"))
    partitions: tuple[Any, ...] = ()
    crashes: tuple[Any, ...] = ()
    announce: bool = True

    def check(self) -> None:
        """Parse ``partitions`` and ``crashes`` into typed records."""
        for key in ("partitions", "crashes"):
            value = getattr(self, key)
            if not isinstance(value, list | tuple):
                raise ConfigError(f"faults.{key} must be a list of tables, got {value!r}.")
        object.__setattr__(self, "partitions", tuple(map(self._partition, self.partitions)))
        object.__setattr__(self, "crashes", tuple(map(self._crash, self.crashes)))

    @property
    def active(self) -> bool:
        """Whether any fault is configured."""
        return bool(self.drop or self.edge_drop or self.delay_s or self.partitions or self.crashes)

    @staticmethod
    def _partition(item: object) -> Partition:
        if isinstance(item, Partition):
            return item
        key = "faults.partitions"
        if not isinstance(item, Mapping) or set(item) != {"nodes", "start", "end"}:
            raise ConfigError(
                f"{key}: each entry is {{ nodes = [...], start = R, end = R }}"
                + _entry_hint(item, ("nodes", "start", "end"))
            )
        nodes = item["nodes"]
        if not isinstance(nodes, list | tuple) or not nodes:
            raise ConfigError(f"{key}: nodes must be a non-empty list of node ids.")
        for node in nodes:
            check_node_id(node, f"{key}.nodes", ConfigError)
        start, end = _round(f"{key}.start", item["start"]), _round(f"{key}.end", item["end"])
        require(end > start, f"{key}.end", end, f"must be after start ({start})")
        return Partition(frozenset(nodes), start, end)

    @staticmethod
    def _crash(item: object) -> Crash:
        if isinstance(item, Crash):
            return item
        key = "faults.crashes"
        if not isinstance(item, Mapping) or not {"node", "at"} <= set(item) <= {
            "node",
            "at",
            "back",
        }:
            raise ConfigError(
                f"{key}: each entry is {{ node = ID, at = R, back = R }}"
                + _entry_hint(item, ("node", "at", "back"))
            )
        node = check_node_id(item["node"], f"{key}.node", ConfigError)
        at = _round(f"{key}.at", item["at"])
        back = item.get("back", -1)
        if back != -1:
            back = _round(f"{key}.back", back)
            require(back > at, f"{key}.back", back, f"must be after at ({at})")
        return Crash(node, at, back)
