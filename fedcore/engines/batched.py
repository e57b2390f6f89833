"""The vectorized engine's adapter of an update rule: a rule run on every node at once.

The vectorized engine (:mod:`fedcore.engines.vectorized`) holds every node's state
stacked along a leading node dimension (parameters as one ``[N, d]`` tensor, push-sum
weights as ``[N]``, state per edge as ``[E, ...]``) and calls :meth:`BatchedAlgorithm.round`
once per round. :class:`BatchedRule` runs a :class:`~fedcore.algorithms.rule.Rule` with
``B = N``: the same code a peer runs on its one row (through
:class:`~fedcore.node.rule.NodeRule`, the message engine's adapter), so the engines agree
by construction. Every built-in synchronous algorithm is one rule; the contract test
``tests/engines/test_vectorized.py`` holds the engines equal for each.

What a round sees (:class:`BatchRound`): the round's weighted graph as edge lists and a
padded neighbour table (:class:`~fedcore.engines.stacked_graph.StackedGraph`, in-neighbours
sorted by sender id as a per-node inbox is), the step size, which nodes are up, which
messages of each phase arrive (the fault plan's announced decisions), and the codec as a
:class:`RowCodec`, which round-trips many messages at once bit for bit as the per-message
codec would. Messages lost or from a crashed node are absent inputs; a crashed node keeps
its state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from fedcore.algorithms.rule import (
    EdgeInbox,
    Edges,
    Gathered,
    Rows,
    SenderRows,
    Slot,
    is_rule,
    lossless,
    schema_of,
    widths_of,
)
from fedcore.compression.batched import RowCodec
from fedcore.engines.stacked_graph import StackedGraph
from fedcore.errors import AlgorithmError, ProtocolError

__all__ = [
    "BatchRound",
    "BatchedAlgorithm",
    "BatchedRule",
    "Messages",
    "batched_form",
    "has_batched_form",
    "raise_bad",
]

_TOTAL = torch.float64

Size = Callable[[int], int]
"""Bytes one encoded tensor of ``n`` values takes on the wire (the codec's, for the
model's dtype)."""


class Messages(NamedTuple):
    """The messages of one phase: ``src[m] -> dst[m]``, each ``nbytes[m]`` on the wire and
    ``fp32[m]`` bytes as float32 (for the compression ratio)."""

    src: torch.Tensor
    dst: torch.Tensor
    nbytes: torch.Tensor
    fp32: torch.Tensor


@dataclass(frozen=True, eq=False)
class BatchRound:
    """What every node knows about one round (the batched :class:`RoundContext`).

    Attributes:
        round: Round index.
        lr: Step size of the round (after the schedule): only the factor of ``grad`` in
            the local step; with a node optimizer the engine passes its direction ``u`` as
            ``grad`` and 1.0 here, as a :class:`~fedcore.node.Node` does.
        graph: The round's communication graph.
        up: ``[N]`` bool, the nodes that run this round (the others are crashed).
        arrived: Per phase, ``[M]`` bool over :meth:`BatchedAlgorithm.messages` of that
            phase: whether the message arrives (sender and receiver up, not lost).
        codec: The nodes' codec, batched.
        nodes: Node ids, graph order.
    """

    round: int
    lr: float
    graph: StackedGraph
    up: torch.Tensor
    arrived: Sequence[torch.Tensor]
    codec: RowCodec
    nodes: tuple[str, ...]
    every_message: bool = False
    """No fault plan: every message of the round arrives (known on the host)."""
    defer_checks: bool = False
    """Keep the checks' flags on the device (:meth:`check`) instead of reading them now."""
    active: Sequence[torch.Tensor | None] = ()
    """Per phase, the messages of this round (a rule that chooses who talks), or ``None``:
    every message of :meth:`BatchedAlgorithm.messages`."""
    deferred: list[tuple[torch.Tensor, str, type[Exception]]] = field(default_factory=list)

    everyone_up: bool = True
    """No node is crashed this round (known on the host)."""

    def keep(self, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """Rows (along the node dimension) of ``new`` for up nodes, of ``old`` for crashed
        ones: a crashed node keeps its state."""
        return new if self.everyone_up else _keep_down(self.up, new, old)

    def roundtrip(self, values: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        """What receivers decode of the messages ``values`` (rows, sent by ``owners``): only
        the rows of up senders go through the codec, as a crashed node encodes nothing (its
        codec's random generator does not advance); the other rows come back as given.

        A decoded message that is not finite stops the run with the
        :class:`~fedcore.errors.ProtocolError` a receiving node raises in strict mode
        (:meth:`finite`). A lossless codec returns ``values`` itself, uncopied (what a
        receiver decodes is what was sent): callers only read the result."""
        if self.codec.lossless(values.dtype):
            out = values
        elif self.everyone_up:
            out = self.codec.roundtrip(values, owners)
        else:
            sending = self.up[owners]
            out = values.clone()
            out[sending] = self.codec.roundtrip(values[sending], owners[sending])
        self.finite(out, owners)
        return out

    def finite(
        self, decoded: torch.Tensor, owners: torch.Tensor, rows: torch.Tensor | None = None
    ) -> None:
        """Stop the run, as a strict-mode receiver does, if an up sender's decoded message
        (a row of ``decoded``, sent by ``owners``; only the rows ``rows`` of ``decoded``
        if given, row ``rows[i]`` sent by ``owners[i]``) holds a value that is not finite.

        Raises:
            ProtocolError: such a message (at once, or with ``defer_checks`` later).
        """
        flat = decoded.reshape(decoded.shape[0], -1)
        # A row whose sum is finite holds only finite values (a NaN or an infinity makes
        # the sum NaN or infinite), so the exact test runs only on rows whose sum is not
        # (an overflow of large finite values); read on the host unless checks are deferred.
        suspect = ~torch.isfinite(flat.sum(dim=1))
        if rows is not None:
            suspect = suspect[rows]
        if not (self.defer_checks or bool(suspect.any())):
            return
        exact = torch.isfinite(flat).all(dim=1)
        bad_rows = suspect & ~(exact if rows is None else exact[rows])
        hits = torch.zeros(len(self.nodes), dtype=torch.long, device=decoded.device)
        bad = hits.index_add_(0, owners, (bad_rows & self.up[owners]).long()) > 0
        self.check(
            bad,
            "the messages of node {node} in round {round} were rejected: a tensor holds "
            "non-finite values (the run diverged; strict mode stops here). Lower "
            "algorithm.lr.",
            ProtocolError,
        )

    def check(self, bad: torch.Tensor, why: str, error: type[Exception] = AlgorithmError) -> None:
        """Fail the run if any node of ``bad`` (``[N]`` bool) is set: at once, or, with
        ``defer_checks`` (a GPU, where reading a flag back stalls the round loop), when the
        engine next reads its figures back. ``why`` is formatted with ``node`` and ``round``.

        Raises:
            AlgorithmError: some node is bad (``defer_checks`` off).
        """
        if self.defer_checks:
            self.deferred.append((bad, why, error))
            return
        raise_bad(bad, why, self.nodes, self.round, error)


def raise_bad(
    bad: torch.Tensor,
    why: str,
    nodes: Sequence[str],
    round: int,
    error: type[Exception] = AlgorithmError,
) -> None:
    """Raise ``error`` with ``why`` about the first node set in ``bad``."""
    if bool(bad.any()):
        first = int(torch.nonzero(bad)[0])
        raise error(why.format(node=repr(nodes[first]), round=round))


class BatchedAlgorithm(Protocol):
    """The batched twin of an :class:`~fedcore.algorithms.base.Algorithm`."""

    name: str
    phases: int

    def init(self, params: torch.Tensor) -> Any:
        """The stacked initial state for ``[N, d]`` initial parameters."""
        ...

    def model(self, state: Any) -> torch.Tensor:
        """``[N, d]``: the parameters every node predicts with and takes its gradient at."""
        ...

    def messages(self, phase: int, graph: StackedGraph, nbytes: Size, d: int) -> Messages:
        """Every message of ``phase`` when every node is up (the fault plan then says which
        arrive), with its wire size (``nbytes(n)``: one encoded tensor of ``n`` values)."""
        ...

    def round(self, state: Any, grad: torch.Tensor, ctx: BatchRound) -> Any:
        """Apply one whole round (step and every phase's mix) to every up node."""
        ...


def _keep_down(up: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Rows of ``new`` for up nodes, of ``old`` for crashed ones."""
    mask = up.reshape(-1, *([1] * (new.dim() - 1)))
    return torch.where(mask, new, old)


def _slot_weights(g: StackedGraph) -> torch.Tensor:
    """``W_ji`` on the neighbour table (padding 0), float64; built once per graph."""
    w = g.cache.get("slot_weights")
    if w is None:
        w = g.cache["slot_weights"] = g.slots(g.weight)
    return w


def _share_units(g: StackedGraph) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Push-sum payloads: one per (sender, distinct out-weight), in the order the sender
    encodes them (its receivers in sorted-id order, a payload when first met).

    Returns ``(unit of each edge, sender of each unit, weight of each unit)``.
    """
    cached = g.cache.get("units")
    if cached is None:
        src, w = g.src.tolist(), g.weight.tolist()
        dst = g.dst.tolist()
        order = sorted(range(len(src)), key=lambda e: (src[e], g.cache["rank"][dst[e]]))
        unit_of: dict[tuple[int, float], int] = {}
        unit_edge = [0] * len(src)
        senders: list[int] = []
        weights: list[float] = []
        for e in order:
            key = (src[e], w[e])
            u = unit_of.get(key)
            if u is None:
                u = unit_of[key] = len(senders)
                senders.append(src[e])
                weights.append(w[e])
            unit_edge[e] = u
        device = g.src.device
        cached = (
            torch.tensor(unit_edge, dtype=torch.long, device=device),
            torch.tensor(senders, dtype=torch.long, device=device),
            torch.tensor(weights, dtype=_TOTAL, device=device),
        )
        g.cache["units"] = cached
    return cached


class BatchedRule:
    """A :class:`~fedcore.algorithms.rule.Rule` run on every node at once (``B = N``): the
    inbox of each phase gathered from the neighbour table, every sent tensor round-tripped
    through the nodes' codecs (unless the rule compressed it itself), crashed nodes' rows
    of the state kept as they were."""

    def __init__(self, rule: Any, codec: str = "", itemsize: int = 4) -> None:
        """Wrap ``rule``; ``codec`` is the nodes' codec name (:attr:`Rows.codec`),
        ``itemsize`` the bytes of one model value (a ``raw`` tensor's on the wire)."""
        self.rule = rule
        self.name: str = rule.name
        self.phases: int = int(rule.phases)
        self.codec = codec
        self.itemsize = itemsize
        self.by_round = rule.lossless is not None
        """The messages' sizes may change from round to round (:meth:`messages`)."""
        self.samples: torch.Tensor | None = None
        """``[N]`` float64: every node's training examples (the engine sets it)."""
        self.union: _Union | None = None
        """The edges over all rounds' graphs (pattern ``"edges"``; :meth:`use_graphs`)."""

    def use_graphs(self, graphs: Sequence[StackedGraph]) -> None:
        """Learn the union of the run's graphs (every round of a schedule), where a rule
        whose pattern is ``"edges"`` keeps its state per edge."""
        if self.rule.pattern == "edges":
            self.union = _Union(graphs)

    def init(self, params: torch.Tensor) -> Any:
        """The rule's state of every node."""
        return self.rule.init(params)

    def _stub(self, t: int, nodes: tuple[str, ...], device: torch.device) -> Any:
        """What a rule's ``trains`` and ``talks`` read of a round (ids, nodes, samples)."""
        samples = self.samples
        if samples is None:
            samples = torch.zeros(len(nodes), dtype=_TOTAL, device=device)
        return Rows(
            round=t,
            lr=0.0,
            self_weight=samples,
            n=len(nodes),
            ids=nodes,
            nodes=nodes,
            samples=samples,
        )

    def trains(self, t: int, nodes: tuple[str, ...], device: torch.device) -> torch.Tensor | None:
        """``[N]`` bool: the nodes that compute a gradient in round ``t`` (``None``: all)."""
        trains = self.rule.trains
        if trains is None:
            return None
        mask: torch.Tensor = trains(self._stub(t, nodes, device))
        return mask

    def _edge_stub(self, t: int, graph: StackedGraph) -> Rows:
        """What a rule's ``widths`` reads of a round (the edges, the network size)."""
        union = self.union
        return Rows(
            round=t,
            lr=0.0,
            self_weight=graph.self_weight,
            n=graph.n,
            edges=None if union is None else union.edges(graph),
            codec=self.codec,
            index=torch.arange(graph.n, device=graph.src.device),
        )

    def _widths(self, phase: int, t: int, graph: StackedGraph) -> torch.Tensor | None:
        """``[M]`` long: the width of every message of :meth:`messages` (a rule that says
        ``widths``), or ``None``."""
        if self.union is None or self.rule.widths is None:
            return None
        widths = widths_of(self.rule, phase, self._edge_stub(t, graph))
        assert widths is not None
        return widths[0][self.union.positions(graph)[0]]

    def active(self, phase: int, t: int, graph: StackedGraph, nodes: tuple[str, ...]) -> Any:
        """``[M]`` bool over :meth:`messages` of ``phase``: the messages of round ``t`` (a
        rule that chooses who talks, ``"chosen"``; the edges a rule's ``widths`` gives
        values), or ``None`` (every one)."""
        widths = self._widths(phase, t, graph)
        if widths is not None:
            carried = widths > 0
            return None if bool(carried.all()) else carried
        if self.rule.pattern != "chosen":
            return None
        senders, receivers = self.rule.talks(phase, self._stub(t, nodes, graph.src.device))
        device = graph.src.device
        sends = torch.tensor([v in senders for v in nodes], dtype=torch.bool).to(device)
        hears = torch.tensor([v in receivers for v in nodes], dtype=torch.bool).to(device)
        return sends[graph.src] & hears[graph.dst]

    def model(self, state: Any) -> torch.Tensor:
        """The models."""
        x: torch.Tensor = self.rule.model(state)
        return x

    def messages(
        self, phase: int, graph: StackedGraph, nbytes: Size, d: int, round: int = 0
    ) -> Messages:
        """Every edge of the graph, each message as large as the rule's schema for
        ``round`` says (a rule with ``by_round`` set says it per round)."""
        if self.rule.pattern == "none":
            empty = graph.src[:0]
            return Messages(empty, empty, empty, empty)
        stub = Rows(round=round, lr=0.0, self_weight=graph.self_weight, n=graph.n, codec=self.codec)
        schema = schema_of(self.rule, phase, stub)
        raw = lossless(self.rule, phase, stub)
        size = 8 * len(schema.scalars)
        widths = self._widths(phase, round, graph)
        if widths is not None:  # every tensor (w,) of its edge's width
            count = len(schema.tensors)
            wire = torch.full_like(widths, size)
            for w in torch.unique(widths).tolist():
                wire[widths == w] += count * (w * self.itemsize if raw else nbytes(w))
            return Messages(graph.src, graph.dst, wire, 4 * count * widths)
        fp32 = 0
        for shape in schema.tensors.values():
            n = d if shape is None else int(np.prod(shape, dtype=np.int64))
            size += n * self.itemsize if raw else nbytes(n)
            fp32 += 4 * n
        return Messages(
            graph.src, graph.dst, torch.full_like(graph.src, size), torch.full_like(graph.src, fp32)
        )

    def _rows(self, ctx: BatchRound, compressed: set[int]) -> Any:
        everyone = torch.arange(ctx.graph.n, device=ctx.up.device)

        def compress(
            v: torch.Tensor,
            where: torch.Tensor | None,
            owners: torch.Tensor | None,
            width: torch.Tensor | None,
        ) -> torch.Tensor:
            who = everyone if owners is None else owners
            if where is None and width is None:
                out = ctx.roundtrip(v, who)
            else:  # only the rows that are sent draw from their senders' codecs
                rows = everyone if where is None else torch.nonzero(where).squeeze(1)
                if width is not None:
                    out = v.clone()
                    out[rows] = _ragged(ctx, v[rows], who[rows], width[rows])
                elif ctx.codec.lossless(v.dtype):  # decoded as sent: nothing to copy
                    ctx.finite(v, who[rows], rows)
                    out = v
                else:
                    out = v.clone()
                    if rows.numel():
                        out[rows] = ctx.roundtrip(v[rows], who[rows])
            compressed.add(id(out))
            return out

        def fail(bad: torch.Tensor, why: str) -> None:
            ctx.check(bad & ctx.up, why)

        samples = self.samples
        if samples is None:
            samples = torch.zeros(ctx.graph.n, dtype=_TOTAL, device=ctx.up.device)
        return Rows(
            round=ctx.round,
            lr=ctx.lr,
            self_weight=ctx.graph.self_weight,
            compress=compress,
            fail=fail,
            in_degree=_in_degree(ctx.graph),
            n=ctx.graph.n,
            ids=ctx.nodes,
            nodes=ctx.nodes,
            samples=samples,
            edges=None if self.union is None else self.union.edges(ctx.graph),
            codec=self.codec,
            index=everyone,
        )

    def _gathered(self, send: Any, phase: int, ctx: BatchRound, compressed: set[int]) -> Gathered:
        """The messages of ``phase`` that arrived, as one list grouped by receiver in sorted
        sender order (the graph's edge order); only senders that send go through the
        codec, once each (as a peer encodes its one payload once)."""
        g = ctx.graph
        edges = torch.nonzero(ctx.arrived[phase]).squeeze(1)
        src, dst = g.src[edges], g.dst[edges]
        tensors: dict[str, torch.Tensor] = {}
        if send is not None:
            active = ctx.active[phase] if ctx.active else None
            talking = g.src if active is None else g.src[active]
            owners = torch.unique(talking)
            owners = owners[ctx.up[owners]]
            where = torch.full((g.n,), -1, dtype=torch.long, device=g.src.device)
            where[owners] = torch.arange(owners.numel(), device=g.src.device)
            raw = lossless(self.rule, phase, self._stub(ctx.round, ctx.nodes, g.src.device))
            rows: dict[str, torch.Tensor] = {}  # each message's row of tensors[name]
            for name, value in send.tensors.items():
                if id(value) in compressed:  # the rule compressed it: decoded already
                    tensors[name], rows[name] = value, src
                    continue
                if owners.numel() == 0:  # nobody up sends: nothing can have arrived
                    tensors[name], rows[name] = value, src[:0]
                    continue
                if raw or ctx.codec.lossless(value.dtype):  # sent as it is
                    ctx.finite(value, owners, owners)
                    tensors[name], rows[name] = value, src
                    continue
                decoded = ctx.codec.roundtrip(value[owners], owners)
                ctx.finite(decoded, owners)
                tensors[name], rows[name] = decoded, where[src]
            scalars = {name: value[src].to(_TOTAL) for name, value in send.scalars.items()}
        else:
            scalars = {}
        tensors_of = SenderRows(tensors, rows) if send is not None else {}
        return Gathered(tensors_of, scalars, dst, g.n, src)

    def _edge_inbox(
        self, send: Any, phase: int, ctx: BatchRound, compressed: set[int], rows: Rows
    ) -> EdgeInbox:
        """What arrived on every in-edge of the union: the message its sender sent on that
        edge (decoded once, by the sender's codec, in edge order; a shared send's row once
        per sender), of the edge's width if the rule says ``widths``."""
        union = self.union
        assert union is not None, "use_graphs() first"
        g = ctx.graph
        at_in = union.positions(g)[1]
        arrived = torch.zeros(union.in_row.numel(), dtype=torch.bool, device=g.src.device)
        arrived[at_in] = ctx.arrived[phase]
        tensors: dict[str, torch.Tensor] = {}
        scalars: dict[str, torch.Tensor] = {}
        if send is not None:
            sent = union.edges(g).out_live & ctx.up[union.out_row]
            widths = widths_of(self.rule, phase, rows)
            width = None if widths is None else widths[0]
            if width is not None:
                sent &= width > 0
            senders, owners = union.out_row, union.out_row
            if send.shared:  # one message a sender: its row, of its edges' width
                senders = torch.zeros(g.n, dtype=torch.bool, device=g.src.device)
                senders[union.out_row[sent]] = True
                owners = torch.arange(g.n, device=g.src.device)
                if width is not None:
                    width = torch.zeros_like(owners).index_copy_(0, union.out_row, width)
                sent = senders
            picked = torch.nonzero(sent).squeeze(1)
            for name, value in send.tensors.items():
                if id(value) not in compressed and picked.numel():  # as a peer encodes it
                    who = owners[picked]
                    if width is None and ctx.codec.lossless(value.dtype):  # decoded as sent
                        ctx.finite(value, who, picked)
                    else:
                        chosen, value = value[picked], value.clone()
                        if width is None:
                            value[picked] = ctx.roundtrip(chosen, who)
                        else:
                            value[picked] = _ragged(ctx, chosen, who, width[picked])
                if send.shared:
                    value = value.index_select(0, union.out_row)
                tensors[name] = value.index_select(0, union.in_to_out)
            scalars = {
                name: (value.index_select(0, union.out_row) if send.shared else value)
                .index_select(0, union.in_to_out)
                .to(_TOTAL)
                for name, value in send.scalars.items()
            }
        return EdgeInbox(tensors, scalars, arrived)

    def _inbox(
        self, send: Any, phase: int, ctx: BatchRound, compressed: set[int], rows: Rows
    ) -> Any:
        if self.rule.pattern == "chosen":
            return self._gathered(send, phase, ctx, compressed)
        if self.rule.pattern == "edges":
            return self._edge_inbox(send, phase, ctx, compressed, rows)
        if self.rule.pattern == "none" or send is None:
            return []
        if send.to is not None and not bool(send.to.all()):
            raise AlgorithmError(
                f"{self.name!r}: a peer that sends nothing (Send.to) is deadline mode's, "
                "which the vectorized engine does not run."
            )
        g = ctx.graph
        arrived = g.slots(ctx.arrived[phase])
        weights = _slot_weights(g)
        if send.weighted:  # push-sum shares: one message per (sender, distinct share)
            unit_of_edge, unit_sender, unit_weight = _share_units(g)
            units = torch.cat([unit_of_edge, unit_of_edge[:1]])[g.slot_edge]  # padding: any
            tensors = {
                name: ctx.roundtrip(
                    value[unit_sender] * unit_weight.to(value.dtype).unsqueeze(1), unit_sender
                )
                for name, value in send.tensors.items()
            }
            scalars = {
                name: g.slots(value[g.src] * g.weight) for name, value in send.scalars.items()
            }
            return [
                Slot(
                    {name: value.index_select(0, units[:, k]) for name, value in tensors.items()},
                    {name: value[:, k] for name, value in scalars.items()},
                    weights[:, k],
                    arrived[:, k],
                    sender=g.nbr[:, k],
                )
                for k in range(g.nbr.shape[1])
            ]
        everyone = torch.arange(g.n, device=ctx.up.device)
        decoded = {
            name: value if id(value) in compressed else ctx.roundtrip(value, everyone)
            for name, value in send.tensors.items()
        }
        return [
            Slot(
                SenderRows(decoded, g.nbr[:, k]),
                {name: value.index_select(0, g.nbr[:, k]) for name, value in send.scalars.items()},
                weights[:, k],
                arrived[:, k],
                sender=g.nbr[:, k],
            )
            for k in range(g.nbr.shape[1])
        ]

    def local_step(self, state: Any, grad: torch.Tensor, ctx: BatchRound) -> Any:
        """A local step between communications, on the up nodes."""
        own = self.rule.local_step
        if own is not None:
            new = own(state, grad, self._rows(ctx, set()))
        else:
            new = state._replace(x=state.x - ctx.lr * grad)
        return self._keep(ctx, new, state)

    def round(self, state: Any, grad: torch.Tensor, ctx: BatchRound) -> Any:
        """The rule's step, then each phase's mix over what arrived."""
        compressed: set[int] = set()
        rows = self._rows(ctx, compressed)
        new, send = self.rule.step(state, grad, rows)
        for phase in range(self.phases):
            inbox = self._inbox(send, phase, ctx, compressed, rows)
            new, send = self.rule.mix(new, phase, inbox, rows)
        return self._keep(ctx, new, state)

    def _keep(self, ctx: BatchRound, new: Any, old: Any) -> Any:
        """``new`` for the up nodes, ``old`` for the crashed ones: rows, and the edges of
        the rule's ``edge_fields`` (out-edges by sender, in-edges by receiver)."""
        if ctx.everyone_up:
            return new
        fields: Mapping[str, str] = self.rule.edge_fields
        if fields and self.union is not None:
            kept = {}
            for name, side in fields.items():
                a, b = getattr(new, name), getattr(old, name)
                if b.shape != a.shape:  # the edges' state starts at the first step
                    b = torch.zeros_like(a)
                owner = self.union.out_row if side == "out" else self.union.in_row
                kept[name] = _keep_down(ctx.up[owner], a, b)
            new = new._replace(**kept)
        return _keep_state(ctx, new, old, skip=set(fields))


def _ragged(
    ctx: BatchRound, values: torch.Tensor, owners: torch.Tensor, width: torch.Tensor
) -> torch.Tensor:
    """What receivers decode of messages that are each row's first ``width`` values (the
    rest come back as given; a width of 0 is no message): one codec call per distinct
    width, so each owner's rows must be of one width, or its codec deterministic."""
    out = values.clone()
    for w in torch.unique(width).tolist():
        if w > 0:
            rows = torch.nonzero(width == w).squeeze(1)
            out[rows, :w] = ctx.roundtrip(values[rows, :w], owners[rows])
    return out


def _in_degree(g: StackedGraph) -> torch.Tensor:
    """In-neighbours of every node (``[N]`` long); built once per graph."""
    degree = g.cache.get("in_degree")
    if degree is None:
        degree = g.cache["in_degree"] = torch.bincount(g.dst, minlength=g.n)
    return degree


def _keep_state(ctx: BatchRound, new: Any, old: Any, skip: set[str] | None = None) -> Any:
    """``new`` for the up nodes, ``old`` for the crashed ones, field by field (but the
    fields named in ``skip``)."""
    if ctx.everyone_up:
        return new
    n = ctx.up.shape[0]
    return type(new)(
        *(
            ctx.keep(a, b)
            if isinstance(a, torch.Tensor)
            and a.dim() > 0
            and a.shape[0] == n
            and not (skip and name in skip)
            else a
            for name, a, b in zip(new._fields, new, old, strict=True)
        )
    )


class _Union:
    """The edges of every round's graph of a run, each at a fixed position (the
    :class:`~fedcore.algorithms.rule.Edges` of a rule whose pattern is ``"edges"``):
    out-edges grouped by sender in sorted receiver order, in-edges grouped by receiver in
    sorted sender order."""

    def __init__(self, graphs: Sequence[StackedGraph]) -> None:
        """Index the union of ``graphs`` (their ``edge_id`` numbers the union)."""
        pairs: dict[int, tuple[int, int]] = {}
        for g in graphs:
            for u, i, j in zip(g.edge_id.tolist(), g.src.tolist(), g.dst.tolist(), strict=True):
                pairs.setdefault(u, (i, j))
        rank = graphs[0].cache["rank"]
        ids = sorted(pairs)
        by_out = sorted(ids, key=lambda u: (pairs[u][0], rank[pairs[u][1]]))
        by_in = sorted(ids, key=lambda u: (pairs[u][1], rank[pairs[u][0]]))
        size = max(ids, default=-1) + 1
        out_at, in_at = [0] * size, [0] * size
        for p, u in enumerate(by_out):
            out_at[u] = p
        for p, u in enumerate(by_in):
            in_at[u] = p
        device = graphs[0].src.device

        def put(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        self.n = graphs[0].n
        self.out_row = put([pairs[u][0] for u in by_out])
        self.in_row = put([pairs[u][1] for u in by_in])
        self.out_peer = put([pairs[u][1] for u in by_out])
        self.in_peer = put([pairs[u][0] for u in by_in])
        self.in_to_out = put([out_at[u] for u in by_in])
        self._out_at = put(out_at)
        self._in_at = put(in_at)

    def positions(self, g: StackedGraph) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each edge of the round's graph ``g`` sits among the out- and in-edges."""
        return self._out_at[g.edge_id], self._in_at[g.edge_id]

    def edges(self, g: StackedGraph) -> Edges:
        """The :class:`Edges` of round graph ``g`` (built once per graph)."""
        cached = g.cache.get("union_edges")
        if cached is None:
            at_out, at_in = self.positions(g)
            out_weight = torch.zeros(self.out_row.numel(), dtype=_TOTAL, device=g.src.device)
            in_weight = torch.zeros(self.in_row.numel(), dtype=_TOTAL, device=g.src.device)
            out_weight[at_out] = g.weight
            in_weight[at_in] = g.weight
            out_live = torch.zeros_like(out_weight, dtype=torch.bool)
            in_live = torch.zeros_like(in_weight, dtype=torch.bool)
            out_live[at_out] = True
            in_live[at_in] = True
            cached = g.cache["union_edges"] = Edges(
                self.out_row,
                out_weight,
                out_live,
                self.in_row,
                in_weight,
                in_live,
                self.out_peer,
                self.in_peer,
                self.n,
            )
        edges: Edges = cached
        return edges


def batched_form(algorithm: Any, *, codec: str = "", itemsize: int = 4) -> BatchedRule:
    """The batched form of ``algorithm``, a rule (:func:`has_batched_form`):
    :class:`BatchedRule` around it (``codec`` and ``itemsize`` as it takes them)."""
    if is_rule(algorithm):
        return BatchedRule(algorithm, codec, itemsize)
    raise AlgorithmError(f"no batched form of {algorithm!r}.")


def has_batched_form(algorithm: Any) -> bool:
    """Whether ``algorithm`` (an instance) runs on the vectorized engine: every rule does
    (a user's per-message algorithm does not)."""
    return is_rule(algorithm)
