"""The fault plan: the one source of a run's fault decisions, as masks over nodes and edges.

A :class:`FaultPlan` answers, for a round (and phase), which nodes are crashed
(:meth:`~FaultPlan.down_mask`, ``[N]`` over its nodes) and which messages of a set of
directed edges are lost and why (:meth:`~FaultPlan.loss_reasons`,
:meth:`~FaultPlan.lost_mask`, ``[E]`` over edges given as node indices): a random drop, a
partition window or a crashed end. Everyone who needs a fault decision asks it:

* the vectorized engine, for every node and edge of a round at once (B = N);
* a :class:`~fedcore.node.Node`, given the plan explicitly, whether it is crashed in a round
  and which messages to and from it the plan lost (its own row, B = 1);
* the transport wrapper :class:`~fedcore.transport.faults.FaultyTransport`, which loses and
  delays the messages on the wire.

The node-id questions (:meth:`~FaultPlan.down`, :meth:`~FaultPlan.lost`,
:meth:`~FaultPlan.announced_lost`, :meth:`~FaultPlan.delay`) read the same masks: a
sender's row of reasons to every node, computed once per ``(round, phase)``. So the
message engine, gRPC peers and the vectorized engine agree by construction, not by a second
implementation kept equal by tests.

Every random number is a keyed hash of ``(run seed, faults seed, kind, round, phase,
edge)`` (:mod:`fedcore.counter_random`), never a draw from shared random state, so the same plan
loses the same messages in one process and across gRPC peers, whatever the timing.

The plan is pure (the config, the keyed hash, torch): it sits below the algorithms and
transports, since the node and the vectorized engine ask it as much as the transport
wrapper does.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TypeAlias

import torch

from fedcore import counter_random as keyed
from fedcore.config import FaultsConfig
from fedcore.errors import ConfigError

__all__ = ["REASONS", "FaultPlan"]

REASONS: tuple[str | None, ...] = (None, "crash", "partition", "drop")
"""What each code of :meth:`FaultPlan.loss_reasons` means (0: the message is not lost)."""

_CRASH, _PARTITION, _DROP_CODE = 1, 2, 3
_DROP = keyed.string_id("drop")
_FOREVER = 1 << 63  # the end of a crash without ``back``
# (src, dst, their in-place versions, edge_probabilities(src, dst))
_KeptProbabilities: TypeAlias = tuple[
    "weakref.ref[torch.Tensor]", "weakref.ref[torch.Tensor]", tuple[object, object], torch.Tensor
]


@dataclass(frozen=True)
class _NodeTables:
    """What the masks need of the known nodes, on one device."""

    size: int  # how many known nodes the tables cover
    ids: torch.Tensor  # [K] int64: keyed.string_id of each node id
    senders: torch.Tensor  # [K] int64: keyed.mix64 of each id
    members: tuple[torch.Tensor, ...]  # per partition, [K] bool: the node is inside


class FaultPlan:
    """The fault decisions of one run: a pure function of the message's coordinates.

    A drop's random number is ``uniform`` of the word ``hash64(key, kind, round, phase,
    edge)`` (:mod:`fedcore.counter_random`) with ``key = make_key("fedcore.faults", run_seed,
    faults.seed)``, ``kind = string_id("drop")`` (or ``"delay"``) and ``edge =
    mix64(string_id(sender)) ^ string_id(receiver)``, one coordinate for the directed edge
    (``a -> b`` and ``b -> a`` differ). A message is lost to a crash if either end is
    down, else to a partition if a window that is open separates its ends, else to a drop
    if its number is below the edge's probability (its ``edge_drop``, else ``drop``).

    The masks index :attr:`nodes`. The node-id questions take any node ids (a plan without
    ``nodes`` answers them too); they read a row of :meth:`loss_reasons` per sender, kept
    for the last few ``(round, phase)``.
    """

    ROWS_KEPT = 8
    """``(round, phase)`` pairs whose sender rows the node-id questions keep."""

    def __init__(self, faults: FaultsConfig, *, run_seed: int, nodes: Iterable[str] = ()) -> None:
        """Bind ``faults`` to ``run_seed``.

        Args:
            faults: The ``[faults]`` table.
            run_seed: The run's seed (``run.seed``).
            nodes: The node order of the masks; every node id the plan names must be in it.
                Empty: only the node-id questions.

        Raises:
            ConfigError: the plan names a node that is not in ``nodes``.
        """
        self.faults = faults
        self.nodes: tuple[str, ...] = tuple(nodes)
        """The node ids in the order of the masks' indices."""
        self._key = keyed.make_key("fedcore.faults", run_seed, faults.seed)
        self._drop = float(faults.drop)
        self._edge_drop: dict[tuple[str, str], float] = {}
        for text, p in faults.edge_drop.items():
            sender, receiver = (part.strip() for part in text.split("->"))
            self._edge_drop[(sender, receiver)] = float(p)
        self._windows: dict[str, list[tuple[int, int]]] = {}
        for crash in faults.crashes:
            end = _FOREVER if crash.back < 0 else crash.back
            self._windows.setdefault(crash.node, []).append((crash.at, end))
        # The masks' rows: ``nodes``, then the ids the node-id questions met besides.
        self._known: list[str] = list(self.nodes)
        self._index = {node: i for i, node in enumerate(self._known)}
        self._tables: dict[torch.device, _NodeTables] = {}
        self._probabilities: dict[tuple[int, int], _KeptProbabilities] = {}
        self._rows: dict[tuple[int, int], dict[str, bytes]] = {}
        if self.nodes:
            named = {n for edge in self._edge_drop for n in edge}
            named |= {n for part in faults.partitions for n in part.nodes}
            named |= set(self._windows)
            unknown = sorted(named - set(self.nodes))
            if unknown:
                raise ConfigError(
                    f"[faults] names nodes that are not in the graph: {', '.join(unknown)}."
                )

    @property
    def announce(self) -> bool:
        """Whether every peer knows the plan (``faults.announce``): a receiver then does not
        wait for a message the plan lost."""
        return self.faults.announce

    # --- masks (the vectorized engine: every node or edge at once) -------------------------

    def down_mask(self, round: int, device: torch.device | str | None = None) -> torch.Tensor:
        """``[N]`` bool over :attr:`nodes`: which nodes are crashed in ``round``."""
        self._need_nodes()
        return self._down_rows(round, torch.device(device or "cpu"))[: len(self.nodes)]

    def lost_mask(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        round: int,
        phase: int,
        *,
        probabilities: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[E]`` bool: whether the message of each edge ``src[e] -> dst[e]`` (indices into
        :attr:`nodes`) in ``(round, phase)`` is lost (:meth:`loss_reasons` is not 0)."""
        src, dst, p = self._edges(src, dst, probabilities)
        lost = torch.zeros(src.shape, dtype=torch.bool, device=src.device)
        for _, mask in self._causes(src, dst, round, phase, p):
            lost |= mask
        return lost

    def loss_reasons(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        round: int,
        phase: int,
        *,
        probabilities: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[E]`` int8: why the message of each edge ``src[e] -> dst[e]`` (indices into
        :attr:`nodes`) in ``(round, phase)`` is lost, as an index into :data:`REASONS`.

        On ``src``'s device. ``probabilities`` is :meth:`edge_probabilities` of these
        edges; without it, the plan computes them (a sorted look-up, only when ``edge_drop``
        is set) and keeps them for the same ``src`` and ``dst`` tensors (the same objects,
        unchanged in place), so an engine that passes the same edges every round pays once.
        """
        return self._reasons(*self._edges(src, dst, probabilities), round, phase)

    def edge_probabilities(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """``[E]`` float64: each edge's drop probability (its ``edge_drop``, else ``drop``)."""
        self._need_nodes()
        return self._edge_probabilities(src, dst)

    def uniform_edges(
        self, kind: str, src: torch.Tensor, dst: torch.Tensor, round: int, phase: int
    ) -> torch.Tensor:
        """``[E]`` float64: the uniform number in [0, 1) of ``kind`` of each edge (indices
        into :attr:`nodes`) in ``(round, phase)``."""
        self._need_nodes()
        return self._uniform(keyed.string_id(kind), src, dst, round, phase)

    # --- node-id questions (a node, the transport wrapper): rows of the masks --------------

    def down(self, node: str, round: int) -> bool:
        """Whether ``node`` is crashed in ``round``."""
        windows = self._windows.get(node)
        return windows is not None and any(at <= round < end for at, end in windows)

    def lost(self, sender: str, receiver: str, round: int, phase: int) -> str | None:
        """Why the message is lost (``"crash"``, ``"partition"``, ``"drop"``), or None."""
        j = self._at(receiver)
        rows = self._rows.get((round, phase))
        if rows is None:
            if len(self._rows) >= self.ROWS_KEPT:
                self._rows.clear()
            rows = self._rows[(round, phase)] = {}
        row = rows.get(sender)
        if row is None or j >= len(row):
            i = self._at(sender)
            dst = torch.arange(len(self._known), device="cpu")
            src = torch.full_like(dst, i)
            p = self._edge_probabilities(src, dst) if self._edge_drop else self._drop
            reasons = self._reasons(src, dst, p, round, phase)
            row = rows[sender] = reasons.to(torch.uint8).numpy().tobytes()
        return REASONS[row[j]]

    def announced_lost(
        self, receiver: str, round: int, phase: int, senders: Collection[str]
    ) -> list[str]:
        """Which of ``senders`` ``receiver`` must not wait for in ``(round, phase)``: those
        whose message the plan lost, when the plan is announced (else none)."""
        if not self.announce:
            return []
        return [s for s in senders if self.lost(s, receiver, round, phase) is not None]

    def delay(self, sender: str, receiver: str, round: int, phase: int) -> float:
        """Seconds the message waits before it is sent."""
        if self.faults.delay_s <= 0:
            return 0.0
        return self.faults.delay_s * self.uniform("delay", sender, receiver, round, phase)

    def uniform(self, kind: str, sender: str, receiver: str, round: int, phase: int) -> float:
        """The uniform number of ``kind`` of one message: :meth:`uniform_edges` of its edge."""
        src = torch.tensor([self._at(sender)], device="cpu")
        dst = torch.tensor([self._at(receiver)], device="cpu")
        return float(self._uniform(keyed.string_id(kind), src, dst, round, phase).item())

    # --- the decisions ----------------------------------------------------------------------

    def _edges(
        self, src: torch.Tensor, dst: torch.Tensor, probabilities: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float]:
        """The masks' edges as int64 indices on ``src``'s device, and their drop
        probabilities: ``probabilities``, else the kept ones (with ``edge_drop``), else
        ``drop`` for all."""
        self._need_nodes()
        src, dst = src.to(torch.int64), dst.to(device=src.device, dtype=torch.int64)
        p: torch.Tensor | float = self._drop
        if probabilities is not None:
            p = probabilities
        elif self._edge_drop:
            p = self._kept_probabilities(src, dst)
        return src, dst, p

    def _reasons(
        self, src: torch.Tensor, dst: torch.Tensor, p: torch.Tensor | float, round: int, phase: int
    ) -> torch.Tensor:
        """:meth:`loss_reasons` of :meth:`_causes`: the strongest cause of each edge."""
        why = torch.zeros(src.shape, dtype=torch.int8, device=src.device)
        for code, mask in self._causes(src, dst, round, phase, p):
            why.masked_fill_(mask, code)
        return why

    def _causes(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        round: int,
        phase: int,
        p: torch.Tensor | float,
    ) -> list[tuple[int, torch.Tensor]]:
        """Every fault decision: ``(reason code, [E] bool)`` per cause that loses messages in
        ``(round, phase)``, weakest first (drop, partition, crash), over int64 indices into
        the known nodes, given each edge's drop probability ``p`` (or one for all)."""
        causes: list[tuple[int, torch.Tensor]] = []
        if isinstance(p, torch.Tensor) or p > 0:
            causes.append((_DROP_CODE, self._uniform(_DROP, src, dst, round, phase) < p))
        tables = self._node_tables(src.device)
        for part, members in zip(self.faults.partitions, tables.members, strict=True):
            if part.start <= round < part.end:
                cut = members.index_select(0, src) != members.index_select(0, dst)
                causes.append((_PARTITION, cut))
        if any(self.down(node, round) for node in self._windows):
            down = self._down_rows(round, src.device)
            causes.append((_CRASH, down.index_select(0, src) | down.index_select(0, dst)))
        return causes

    def _uniform(
        self, kind: int, src: torch.Tensor, dst: torch.Tensor, round: int, phase: int
    ) -> torch.Tensor:
        """``uniform(hash64(key, kind, round, phase, edge))`` of each edge (float64)."""
        tables = self._node_tables(src.device)
        edges = tables.senders.index_select(0, src.to(torch.int64))
        edges ^= tables.ids.index_select(0, dst.to(device=src.device, dtype=torch.int64))
        return keyed.uniform_tensor(self._key, kind, round, phase, edges)

    def _down_rows(self, round: int, device: torch.device) -> torch.Tensor:
        """``[K]`` bool over the known nodes: crashed in ``round``."""
        mask = torch.zeros(len(self._known), dtype=torch.bool, device=device)
        down = [
            self._index[node]
            for node in self._windows
            if node in self._index and self.down(node, round)
        ]
        if down:
            mask[torch.tensor(down, dtype=torch.int64, device=device)] = True
        return mask

    def _kept_probabilities(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """:meth:`edge_probabilities`, kept per pair of index tensors (by identity and
        torch's in-place version counter, so a changed tensor is looked up again)."""
        key = (id(src), id(dst))
        versions = (getattr(src, "_version", None), getattr(dst, "_version", None))
        kept = self._probabilities.get(key)
        if kept is not None:
            src_ref, dst_ref, kept_versions, p = kept
            if src_ref() is src and dst_ref() is dst and kept_versions == versions:
                return p
        p = self._edge_probabilities(src, dst)
        if len(self._probabilities) >= 16:
            self._probabilities.clear()
        self._probabilities[key] = (weakref.ref(src), weakref.ref(dst), versions, p)
        return p

    def _edge_probabilities(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        src, dst = src.to(torch.int64), dst.to(device=src.device, dtype=torch.int64)
        p = torch.full(src.shape, self._drop, dtype=torch.float64, device=src.device)
        if not self._edge_drop:
            return p
        n = len(self._known)
        table = sorted(
            (self._index[s] * n + self._index[r], q)
            for (s, r), q in self._edge_drop.items()
            if s in self._index and r in self._index
        )
        if not table:
            return p
        codes = torch.tensor([c for c, _ in table], dtype=torch.int64, device=src.device)
        values = torch.tensor([q for _, q in table], dtype=torch.float64, device=src.device)
        edges = src * n + dst
        at = torch.searchsorted(codes, edges).clamp_(max=len(table) - 1)
        return torch.where(codes[at] == edges, values[at], p)

    def _node_tables(self, device: torch.device) -> _NodeTables:
        tables = self._tables.get(device)
        if tables is None or tables.size != len(self._known):
            members = tuple(
                torch.tensor([n in part.nodes for n in self._known], dtype=torch.bool).to(device)
                for part in self.faults.partitions
            )
            ids = keyed.string_ids(self._known, device)
            tables = _NodeTables(len(self._known), ids, keyed.mix64_tensor(ids), members)
            self._tables[device] = tables
        return tables

    def _at(self, node: str) -> int:
        """``node``'s row in the masks, a new one after the known nodes if need be."""
        i = self._index.get(node)
        if i is None:
            i = self._index[node] = len(self._known)
            self._known.append(node)
        return i

    def _need_nodes(self) -> None:
        if not self.nodes:
            raise ValueError("the masks of a FaultPlan need its nodes (nodes=...)")
