"""Fault injection: a transport wrapper that loses, delays and cuts messages reproducibly.

A :class:`FaultPlan` answers, for one message ``(sender, receiver, round, phase)``, whether
it is lost and why (random drop, partition, crashed peer) and how long it waits. Every
answer is a keyed hash of ``(run seed, faults seed, sender, receiver, round, phase)``
(:mod:`fedcore.keyed`), never a draw from shared random state, so the same plan loses the
same messages in one process and across gRPC peers, whatever the timing; and the
vectorized engine asks the same questions of every edge at once (:meth:`FaultPlan.lost_mask`)
and gets the same answers. :class:`FaultyTransport` wraps any transport:

* sending: a lost message is not sent (counted in ``stats.messages_dropped``); a delayed
  one is sent after ``asyncio.sleep``;
* receiving, with ``announce`` (the default): every peer knows the plan, so the receiver
  (the node, through :meth:`FaultyTransport.announced_lost`) does not wait for a message
  the plan lost and proceeds at once: strict mode stays strict about every *other*
  message, runs are fast, and in-process and gRPC runs agree bit for bit. Without
  ``announce`` a lost message simply never arrives and the node needs
  ``transport.mode = "deadline"`` to go on without it;
* a crashed node (:meth:`FaultyTransport.down`) skips its rounds entirely.

The node asks these questions of a transport that has them (:class:`FaultAware`); plain
transports have none.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

import torch

from fedcore import keyed
from fedcore.config import FaultsConfig
from fedcore.errors import ConfigError
from fedcore.messages import Message
from fedcore.transport.base import Transport, TransportStats

__all__ = ["FaultAware", "FaultPlan", "FaultyTransport"]

_DROP = keyed.string_id("drop")
_FOREVER = 1 << 63  # the end of a crash without ``back``
# (src, dst, their in-place versions, edge_probabilities(src, dst))
_KeptProbabilities: TypeAlias = tuple[
    "weakref.ref[torch.Tensor]", "weakref.ref[torch.Tensor]", tuple[object, object], torch.Tensor
]


@dataclass(frozen=True)
class _NodeTables:
    """What the tensor questions need of the nodes, on one device."""

    ids: torch.Tensor  # [N] int64: keyed.string_id of each node id
    senders: torch.Tensor  # [N] int64: keyed.mix64 of each id
    members: tuple[torch.Tensor, ...]  # per partition, [N] bool: the node is inside


class FaultPlan:
    """The fault decisions of one run: a pure function of the message's coordinates.

    A decision's random number is ``uniform`` of the word ``hash64(key, kind, round,
    phase, edge)`` (:mod:`fedcore.keyed`) with ``key = make_key("fedcore.faults",
    run_seed, faults.seed)``, ``kind = string_id("drop")`` (or ``"delay"``) and ``edge =
    mix64(string_id(sender)) ^ string_id(receiver)``, one coordinate for the directed
    edge (``a -> b`` and ``b -> a`` differ). The round and phase come first, so one
    prefix serves a whole round (kept for the last few thousand ``(kind, round, phase)``),
    and a message costs one :func:`~fedcore.keyed.absorb` in Python, one per edge in
    tensors.

    The scalar questions (:meth:`lost`, :meth:`down`, :meth:`delay`, :meth:`uniform`)
    serve the message engine; the tensor ones (:meth:`down_mask`, :meth:`lost_mask`,
    :meth:`edge_probabilities`, :meth:`uniform_edges`) the vectorized engine, over indices
    into :attr:`nodes`, with the same decisions element for element.
    """

    PREFIXES_KEPT = 4096
    """Hash prefixes of ``(kind, round, phase)`` kept for the scalar questions."""

    def __init__(self, faults: FaultsConfig, *, run_seed: int, nodes: Iterable[str] = ()) -> None:
        """Bind ``faults`` to ``run_seed``. ``nodes`` (if given) is the node order of the
        tensor questions, and every node id the plan names must be in it.

        Raises:
            ConfigError: the plan names a node that is not in ``nodes``.
        """
        self.faults = faults
        self.nodes: tuple[str, ...] = tuple(nodes)
        """The node ids in the order of the tensor questions' indices."""
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
        self._prefixes: dict[tuple[int, int, int], int] = {}
        self._senders: dict[str, int] = {}  # node -> mix64(string_id(node))
        self._index = {node: i for i, node in enumerate(self.nodes)}
        self._tables: dict[torch.device, _NodeTables] = {}
        self._probabilities: dict[tuple[int, int], _KeptProbabilities] = {}
        if self.nodes:
            named = {n for edge in self._edge_drop for n in edge}
            named |= {n for part in faults.partitions for n in part.nodes}
            named |= set(self._windows)
            unknown = sorted(named - set(self.nodes))
            if unknown:
                raise ConfigError(
                    f"[faults] names nodes that are not in the graph: {', '.join(unknown)}."
                )

    # --- scalar questions (the message engine, one message at a time) ---------------------

    def uniform(self, kind: str, sender: str, receiver: str, round: int, phase: int) -> float:
        """A uniform number in [0, 1) that only these coordinates (and the seeds) determine."""
        h = self._prefix(keyed.string_id(kind), round, phase)
        return (keyed.absorb(h, self._edge(sender, receiver)) >> 11) * 2.0**-53

    def down(self, node: str, round: int) -> bool:
        """Whether ``node`` is crashed in ``round``."""
        windows = self._windows.get(node)
        return windows is not None and any(at <= round < end for at, end in windows)

    def lost(self, sender: str, receiver: str, round: int, phase: int) -> str | None:
        """Why the message is lost (``"crash"``, ``"partition"``, ``"drop"``), or None."""
        windows = self._windows  # tested first: most messages touch no crashed node
        if (
            windows
            and (sender in windows or receiver in windows)
            and (self.down(sender, round) or self.down(receiver, round))
        ):
            return "crash"
        for part in self.faults.partitions:
            if part.start <= round < part.end and (sender in part.nodes) != (
                receiver in part.nodes
            ):
                return "partition"
        p = self._edge_drop.get((sender, receiver), self._drop) if self._edge_drop else self._drop
        if p > 0:
            h = self._prefixes.get((_DROP, round, phase)) or self._prefix(_DROP, round, phase)
            if (keyed.absorb(h, self._edge(sender, receiver)) >> 11) * 2.0**-53 < p:
                return "drop"
        return None

    def delay(self, sender: str, receiver: str, round: int, phase: int) -> float:
        """Seconds the message waits before it is sent."""
        if self.faults.delay_s <= 0:
            return 0.0
        return self.faults.delay_s * self.uniform("delay", sender, receiver, round, phase)

    def _edge(self, sender: str, receiver: str) -> int:
        """The edge coordinate ``mix64(string_id(sender)) ^ string_id(receiver)``."""
        word = self._senders.get(sender)
        if word is None:
            word = self._senders[sender] = keyed.mix64(keyed.string_id(sender))
        return word ^ keyed.string_id(receiver)

    def _prefix(self, kind: int, round: int, phase: int) -> int:
        """``hash64(key, kind, round, phase)``, kept for the next messages of the round."""
        coords = (kind, round, phase)
        h = self._prefixes.get(coords)
        if h is None:
            if len(self._prefixes) >= self.PREFIXES_KEPT:
                self._prefixes.clear()
            h = self._prefixes[coords] = keyed.hash64(self._key, *coords)
        return h

    # --- tensor questions (the vectorized engine, every node or edge at once) --------------

    def down_mask(self, round: int, device: torch.device | str | None = None) -> torch.Tensor:
        """``[N]`` bool over :attr:`nodes`: which nodes are crashed in ``round``
        (:meth:`down` of each)."""
        self._need_nodes()
        mask = torch.zeros(len(self.nodes), dtype=torch.bool, device=device)
        down = [self._index[node] for node in self._windows if self.down(node, round)]
        if down:
            mask[torch.tensor(down, dtype=torch.int64, device=mask.device)] = True
        return mask

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
        :attr:`nodes`) in ``(round, phase)`` is lost: ``lost(...) is not None`` of each.

        On ``src``'s device. ``probabilities`` is :meth:`edge_probabilities` of these
        edges; without it, the plan computes them (a sorted look-up, only when ``edge_drop``
        is set) and keeps them for the same ``src`` and ``dst`` tensors (the same objects,
        unchanged in place), so an engine that passes the same edges every round pays once.
        """
        self._need_nodes()
        src, dst = src.to(torch.int64), dst.to(device=src.device, dtype=torch.int64)
        lost = torch.zeros(src.shape, dtype=torch.bool, device=src.device)
        if any(self.down(node, round) for node in self._windows):
            down = self.down_mask(round, src.device)
            lost |= down.index_select(0, src)
            lost |= down.index_select(0, dst)
        tables = self._node_tables(src.device)
        for part, members in zip(self.faults.partitions, tables.members, strict=True):
            if part.start <= round < part.end:
                lost |= members.index_select(0, src) != members.index_select(0, dst)
        if probabilities is None and not self._edge_drop:
            if self._drop > 0:
                lost |= self.uniform_edges("drop", src, dst, round, phase) < self._drop
            return lost
        if probabilities is None:
            probabilities = self._kept_probabilities(src, dst)
        lost |= self.uniform_edges("drop", src, dst, round, phase) < probabilities
        return lost

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
        p = self.edge_probabilities(src, dst)
        if len(self._probabilities) >= 16:
            self._probabilities.clear()
        self._probabilities[key] = (weakref.ref(src), weakref.ref(dst), versions, p)
        return p

    def edge_probabilities(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        """``[E]`` float64: each edge's drop probability (its ``edge_drop``, else ``drop``)."""
        self._need_nodes()
        src, dst = src.to(torch.int64), dst.to(device=src.device, dtype=torch.int64)
        p = torch.full(src.shape, self._drop, dtype=torch.float64, device=src.device)
        if not self._edge_drop:
            return p
        n = len(self.nodes)
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

    def uniform_edges(
        self, kind: str, src: torch.Tensor, dst: torch.Tensor, round: int, phase: int
    ) -> torch.Tensor:
        """``[E]`` float64: :meth:`uniform` of each edge (indices into :attr:`nodes`)."""
        self._need_nodes()
        tables = self._node_tables(src.device)
        edges = tables.senders.index_select(0, src.to(torch.int64))
        edges ^= tables.ids.index_select(0, dst.to(device=src.device, dtype=torch.int64))
        prefix = self._prefix(keyed.string_id(kind), round, phase)
        return keyed.uniform_tensor(prefix, edges)

    def _node_tables(self, device: torch.device) -> _NodeTables:
        tables = self._tables.get(device)
        if tables is None:
            members = tuple(
                torch.tensor([n in part.nodes for n in self.nodes], device=device)
                for part in self.faults.partitions
            )
            ids = keyed.string_ids(self.nodes, device)
            tables = _NodeTables(ids, keyed.mix64_tensor(ids), members)
            self._tables[device] = tables
        return tables

    def _need_nodes(self) -> None:
        if not self.nodes:
            raise ValueError("the tensor questions of a FaultPlan need its nodes (nodes=...)")


@runtime_checkable
class FaultAware(Protocol):
    """What the node asks of a transport that injects faults."""

    def down(self, round: int) -> bool:
        """Whether this node is crashed in ``round``."""
        ...

    def announced_lost(self, round: int, phase: int, senders: Collection[str]) -> list[str]:
        """Which of ``senders`` the node must not wait for: the plan lost their message."""
        ...

    def pop_lost_sent(self, round: int) -> list[str]:
        """Receivers of this node's messages the plan lost in ``round`` (then forgotten)."""
        ...

    def loses(self, message: Message) -> bool:
        """Whether the plan loses ``message``."""
        ...


class FaultyTransport:
    """``inner`` with a :class:`FaultPlan` applied to what this node sends and awaits.

    Counts into the inner transport's ``stats`` (one set of counters for the metrics).
    """

    def __init__(self, inner: Transport, plan: FaultPlan) -> None:
        """Wrap ``inner`` (this node's endpoint)."""
        self.inner = inner
        self.plan = plan
        self.node_id = inner.node_id
        self.stats: TransportStats = inner.stats
        self._lost_sent: dict[int, list[str]] = {}

    def down(self, round: int) -> bool:
        """Whether this node is crashed in ``round`` (the node then skips the round)."""
        return self.plan.down(self.node_id, round)

    def announced_lost(self, round: int, phase: int, senders: Collection[str]) -> list[str]:
        """With ``announce``: the senders whose ``(round, phase)`` message the plan lost."""
        if not self.plan.faults.announce:
            return []
        lost = self.plan.lost
        return [s for s in senders if lost(s, self.node_id, round, phase) is not None]

    def pop_lost_sent(self, round: int) -> list[str]:
        """Receivers of this node's messages the plan lost in ``round``."""
        return self._lost_sent.pop(round, [])

    def loses(self, message: Message) -> bool:
        """Whether the plan loses ``message``."""
        coords = (message.sender, message.receiver, message.round, message.phase)
        return self.plan.lost(*coords) is not None

    async def send(self, message: Message) -> None:
        """Send ``message`` after its delay, or lose it."""
        coords = (message.sender, message.receiver, message.round, message.phase)
        if self.loses(message):
            self.stats.messages_dropped += 1
            self._lost_sent.setdefault(message.round, []).append(message.receiver)
            return
        wait = self.plan.delay(*coords)
        if wait > 0:
            await asyncio.sleep(wait)
        await self.inner.send(message)

    async def collect(
        self, round: int, phase: int, senders: Collection[str], timeout: float | None
    ) -> dict[str, Message]:
        """The inner inbox; the node leaves out the senders :meth:`announced_lost` names."""
        return await self.inner.collect(round, phase, senders, timeout)

    async def close(self) -> None:
        """Close the inner transport."""
        await self.inner.close()
