"""A rule on one peer: the message engine's and a gRPC peer's adapter of an update rule.

:class:`NodeRule` runs a :class:`~fedcore.algorithms.rule.Rule` with ``B = 1`` through the
node's per-message :class:`~fedcore.algorithms.base.Algorithm` protocol: a dict inbox
becomes slots (or a :class:`~fedcore.algorithms.rule.Gathered` list, an
:class:`~fedcore.algorithms.rule.EdgeInbox`) in sorted sender order, a
:class:`~fedcore.algorithms.rule.Send` one payload for every out-neighbour. A
:class:`~fedcore.node.loop.Node` wraps a rule it is given in one (:func:`per_node`); the
vectorized engine runs the same rule on every peer at once
(:class:`fedcore.engines.batched.BatchedRule`), so the engines agree by construction.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from fedcore.algorithms.base import Algorithm, RoundContext, check_phase
from fedcore.algorithms.rule import (
    RULE_MEMBERS,
    EdgeInbox,
    Edges,
    Gathered,
    Rows,
    Send,
    Slot,
    is_rule,
    lossless,
    schema_of,
    schema_takes_rows,
    widths_of,
)
from fedcore.compression import RawCodec
from fedcore.errors import AlgorithmError
from fedcore.messages import EncodedTensor, MessageSchema, Payload

__all__ = ["NodeRule", "per_node"]

_TOTAL = torch.float64

_RAW = RawCodec()

_YES = torch.ones(1, dtype=torch.bool)
_NO = torch.zeros(1, dtype=torch.bool)
"""A peer's slot arrived or not (read only)."""


def per_node(algorithm: Any) -> Algorithm:
    """What a node runs of ``algorithm``: a declared rule in a :class:`NodeRule`, anything
    else (a per-message algorithm, a :class:`NodeRule` already) as it is."""
    if isinstance(algorithm, NodeRule) or not is_rule(algorithm):
        out: Algorithm = algorithm
        return out
    return NodeRule(algorithm)


class NodeRule:
    """A :class:`~fedcore.algorithms.rule.Rule` run by one peer (``B = 1``), as the node's
    per-message :class:`~fedcore.algorithms.base.Algorithm`: dict inboxes become slots in
    sorted sender order, a :class:`Send` becomes one payload for every out-neighbour.

    Attributes:
        rule: The rule.
    """

    def __init__(self, rule: Any) -> None:
        """Wrap ``rule``."""
        if isinstance(rule, NodeRule):
            raise AlgorithmError(f"{rule!r} is already a rule on one peer; wrap its .rule.")
        missing = [a for a in RULE_MEMBERS if not hasattr(rule, a)]
        if missing:  # the caller wrapping it says it is a rule; this names what it lacks
            raise AlgorithmError(
                f"{rule!r} is not an update rule: it lacks {', '.join(missing)} of "
                "fedcore.algorithms.rule.Rule."
            )
        self.rule = rule
        self.name: str = rule.name
        self.mixing: str = rule.mixing
        self.phases: int = int(rule.phases)
        self._encoded: dict[int, Any] = {}  # id of a compressed tensor -> its encoding(s)
        self._zeros: dict[tuple[int, ...], torch.Tensor] = {}
        self._contexts: OrderedDict[int, tuple[RoundContext, Rows]] = OrderedDict()
        self._weights: dict[float, torch.Tensor] = {}
        self._known: dict[tuple[float, int, float], tuple[torch.Tensor, ...]] = {}
        self._senders: dict[int, tuple[Mapping[str, float], list[tuple[str, float, Any]]]] = {}
        self._positions: tuple[Any, dict[str, int]] = (None, {})  # node list, id -> index
        self._index: dict[int, torch.Tensor] = {}  # a node's index in it, as [1] long
        self._widths: dict[tuple[int, int], tuple[Rows, dict[str, MessageSchema]]] = {}
        if rule.accept is not None:  # a peer's check of what its state makes impossible
            self.accept = rule.accept
        if rule.trains is not None:
            self.trains = self._trains

    def __getattr__(self, name: str) -> Any:
        """The rule's own options (``eta``, ``gamma``, ...) read through the adapter."""
        if name == "rule":
            raise AttributeError(name)
        return getattr(self.rule, name)

    def __repr__(self) -> str:
        return f"NodeRule({self.rule!r})"

    def _trains(self, ctx: RoundContext) -> bool:
        """Whether this peer computes a gradient this round (the rule's ``trains``)."""
        return bool(self.rule.trains(self._rows(ctx))[0])

    def _talks(self, phase: int, ctx: RoundContext) -> tuple[Any, Any]:
        """``(senders, receivers)`` of ``phase`` (pattern ``"chosen"``)."""
        senders, receivers = self.rule.talks(phase, self._rows(ctx))
        return senders, receivers

    def _rows(self, ctx: RoundContext) -> Rows:
        """The rule's view of ``ctx`` (one per round context: a node asks many times)."""
        cached = self._contexts.get(id(ctx))
        if cached is not None and cached[0] is ctx:
            return cached[1]
        rows = self._make_rows(ctx)
        self._contexts[id(ctx)] = (ctx, rows)
        # The newest few per node of the process (a node asks for a round's context from
        # its step to its last mix, while the other nodes start theirs): oldest out first.
        while len(self._contexts) > 64 + 2 * len(ctx.nodes):
            self._contexts.popitem(last=False)
        return rows

    def _make_rows(self, ctx: RoundContext) -> Rows:
        codec = ctx.codec

        def compress(
            v: torch.Tensor,
            where: torch.Tensor | None,
            owners: torch.Tensor | None,
            width: torch.Tensor | None,
        ) -> torch.Tensor:
            if codec is None:
                return v.clone()
            if owners is None:  # the peer's one row
                if where is not None and not bool(where[0]):
                    return v.clone()
                if width is not None:  # its first values only
                    w = int(width[0])
                    encoded = codec.encode(v[0, :w])
                    decoded = v.clone()
                    decoded[0, :w] = codec.decode(encoded)
                else:
                    encoded = codec.encode(v[0])
                    decoded = codec.decode(encoded).unsqueeze(0)
                self._encoded[id(decoded)] = encoded
                return decoded
            out = v.clone()  # one row per out-edge, encoded in edge order
            each: list[EncodedTensor | None] = [None] * v.shape[0]
            for e in range(v.shape[0]):
                if where is None or bool(where[e]):
                    encoded = each[e] = codec.encode(v[e])
                    out[e] = codec.decode(encoded)
            self._encoded[id(out)] = each
            return out

        def fail(bad: torch.Tensor, why: str) -> None:
            if bool(bad[0]):
                raise AlgorithmError(why.format(node=repr(ctx.node), round=ctx.round))

        key = (ctx.self_weight, len(ctx.in_weights), float(ctx.samples))
        known = self._known.get(key)
        if known is None:  # a few distinct ones a run: made once (read only)
            if len(self._known) > 256:
                self._known.clear()
            known = self._known[key] = (
                torch.tensor([ctx.self_weight], dtype=_TOTAL),
                torch.tensor([len(ctx.in_weights)]),
                torch.tensor([float(ctx.samples)], dtype=_TOTAL),
            )
        if self._positions[0] is not ctx.nodes:  # one node list a run: indexed once
            self._positions = (ctx.nodes, {v: i for i, v in enumerate(ctx.nodes)})
        positions = self._positions[1]
        at = positions.get(ctx.node, -1)
        index = self._index.get(at)
        if index is None:
            index = self._index[at] = torch.tensor([at])
        return Rows(
            round=ctx.round,
            lr=ctx.lr,
            self_weight=known[0],
            compress=compress,
            fail=fail,
            in_degree=known[1],
            n=len(ctx.nodes),
            deadline=ctx.deadline,
            ids=(ctx.node,),
            nodes=tuple(ctx.nodes),
            samples=known[2],
            edges=_edges_of(ctx, positions) if self.rule.pattern == "edges" else None,
            codec="" if codec is None else codec.name,
            index=index,
        )

    def init(self, params: torch.Tensor) -> Any:
        """The rule's state of one row."""
        return self.rule.init(params.unsqueeze(0))

    def model(self, state: Any) -> torch.Tensor:
        """The row's model."""
        out: torch.Tensor = self.rule.model(state)[0]
        return out

    def _outbox(self, send: Send | None, ctx: RoundContext, phase: int) -> dict[str, Payload]:
        if send is None or not ctx.out_weights or (send.to is not None and not bool(send.to[0])):
            self._encoded.clear()
            return {}
        receivers: Any = ctx.out_weights
        if self.rule.pattern == "chosen":
            senders, chosen = self._talks(phase, ctx)
            if ctx.node not in senders:
                self._encoded.clear()
                return {}
            receivers = [j for j in ctx.out_weights if j in chosen]
        if self.rule.pattern == "edges":
            edge_outbox = self._edge_payloads(send, ctx, phase)
            self._encoded.clear()
            return edge_outbox
        if send.weighted:  # one payload per distinct share, in receiver order
            by_weight: dict[float, Payload] = {}
            outbox: dict[str, Payload] = {}
            for dst, w in ctx.out_weights.items():
                payload = by_weight.get(w)
                if payload is None:
                    payload = by_weight[w] = Payload(
                        {name: value[0] * w for name, value in send.tensors.items()},
                        {name: float(value[0]) * w for name, value in send.scalars.items()},
                    )
                outbox[dst] = payload
            self._encoded.clear()
            return outbox
        tensors: dict[str, torch.Tensor | EncodedTensor] = {}
        raw = lossless(self.rule, phase, self._rows(ctx))
        for name, value in send.tensors.items():
            encoded = _RAW.encode(value[0]) if raw else self._encoded.get(id(value))
            tensors[name] = encoded if encoded is not None else value[0]
        scalars = {name: float(value[0]) for name, value in send.scalars.items()}
        self._encoded.clear()
        payload = Payload(tensors, scalars)
        return dict.fromkeys(receivers, payload)

    def _edge_payloads(self, send: Send, ctx: RoundContext, phase: int) -> dict[str, Payload]:
        """One payload per out-edge of this round: row ``e`` of the send's tensors goes to
        the receiver of out-edge ``e`` (the union's out-neighbours in sorted order), its
        first ``width`` values if the rule says ``widths`` (none where that is 0); a
        shared send's one row goes to every receiver, as one payload if it can."""
        position = {j: e for e, j in enumerate(_out_union(ctx))}
        widths = widths_of(self.rule, phase, self._rows(ctx)) if send.tensors else None
        outbox: dict[str, Payload] = {}
        last: tuple[Payload, int | None] | None = None  # a shared send's payload, its width
        for dst in ctx.out_weights:
            e = position[dst]
            w = None if widths is None else int(widths[0][e])
            if w == 0:
                continue
            if last is not None and w == last[1]:
                outbox[dst] = last[0]  # the same message: encoded once
                continue
            row = 0 if send.shared else e
            tensors: dict[str, torch.Tensor | EncodedTensor] = {}
            for name, value in send.tensors.items():
                each = self._encoded.get(id(value))
                encoded = None if each is None else each if send.shared else each[e]
                tensors[name] = (
                    encoded if encoded is not None else value[row] if w is None else value[row, :w]
                )
            scalars = {name: float(value[row]) for name, value in send.scalars.items()}
            outbox[dst] = Payload(tensors, scalars)
            if send.shared:
                last = (outbox[dst], w)
        return outbox

    @staticmethod
    def _edge_inbox(
        inbox: Mapping[str, Payload],
        senders: tuple[str, ...],
        schema: MessageSchema,
        model: torch.Tensor,
        ragged: bool,
    ) -> EdgeInbox:
        """The dict inbox as one message per in-edge of the union (``senders``, sorted);
        an edge with no message holds zeros, and a ``ragged`` message (a rule's
        ``widths``) fills the first values of its row."""
        tensors: dict[str, torch.Tensor] = {}
        for name, shape in schema.tensors.items():
            size = tuple(model.shape[1:]) if shape is None else shape
            out = model.new_zeros((len(senders), *size))
            for e, j in enumerate(senders):
                payload = inbox.get(j)
                if payload is not None:
                    value = payload.tensor(name)
                    if ragged:
                        out[e, : value.numel()] = value
                    else:
                        out[e] = value
            tensors[name] = out
        scalars = {
            name: torch.tensor(
                [float(inbox[j].scalars[name]) if j in inbox else 0.0 for j in senders],
                dtype=_TOTAL,
            )
            for name in schema.scalars
        }
        arrived = torch.tensor([j in inbox for j in senders], dtype=torch.bool)
        return EdgeInbox(tensors, scalars, arrived)

    def step(self, state: Any, grad: torch.Tensor, ctx: RoundContext) -> tuple[Any, Any]:
        """The rule's step on one row; its send as one payload for every out-neighbour."""
        state, send = self.rule.step(state, grad[None], self._rows(ctx))
        return state, self._outbox(send, ctx, 0)

    def local_step(self, state: Any, grad: torch.Tensor, ctx: Any) -> Any:
        """A local step between communications (``run.local_steps``)."""
        own = self.rule.local_step
        if own is not None:
            return own(state, grad.unsqueeze(0), self._rows(ctx))
        return state._replace(x=state.x - ctx.lr * grad.unsqueeze(0))

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Every in-neighbour (pattern ``"neighbours"``), or those the rule's ``talks``
        names as senders of ``phase`` if it names this peer a receiver (``"chosen"``)."""
        if self.rule.pattern == "edges":
            widths = self._in_widths(phase, ctx)
            if widths is not None:  # none from a sender whose edge carries nothing
                return tuple(j for j in ctx.in_weights if j in widths)
        if self.rule.pattern in ("neighbours", "edges"):
            return tuple(ctx.in_weights)
        if self.rule.pattern == "chosen":
            senders, receivers = self._talks(phase, ctx)
            if ctx.node in receivers:
                return tuple(sorted(j for j in ctx.in_weights if j in senders))
        return ()

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """The rule's schema of ``phase`` (for a sender that sends this peer something)."""
        if self.rule.pattern == "none":
            raise AlgorithmError(f"{self.name!r} sends no messages; {sender!r} sent one.")
        check_phase(self.name, phase, self.phases)
        if self.rule.pattern == "chosen":  # membership: one check a message
            senders, receivers = self._talks(phase, ctx)
            if sender not in senders or ctx.node not in receivers:
                raise AlgorithmError(
                    f"{sender!r} sends {ctx.node!r} nothing in phase {phase} of round {ctx.round}."
                )
        if not schema_takes_rows(self.rule):  # asked once a message: no rows needed
            schema: MessageSchema = self.rule.schema(phase)
            return schema
        widths = self._in_widths(phase, ctx) if self.rule.pattern == "edges" else None
        if widths is None:
            return schema_of(self.rule, phase, self._rows(ctx))
        sized = widths.get(sender)
        if sized is None:
            raise AlgorithmError(
                f"{sender!r} sends {ctx.node!r} nothing in phase {phase} of round {ctx.round}."
            )
        return sized

    def _in_widths(self, phase: int, ctx: RoundContext) -> dict[str, MessageSchema] | None:
        """Sender -> its message of ``phase``, its tensors of the width the rule's ``widths``
        gives (only senders of a message), made once per round context and phase (a peer
        asks once a message); ``None``: the rule says no widths."""
        if self.rule.widths is None:
            return None
        rows = self._rows(ctx)
        key = (id(rows), phase)
        cached = self._widths.get(key)
        if cached is not None and cached[0] is rows:
            return cached[1]
        widths = widths_of(self.rule, phase, rows)
        assert widths is not None
        schema = schema_of(self.rule, phase, rows)
        shaped: dict[int, MessageSchema] = {}
        by_sender: dict[str, MessageSchema] = {}
        for sender, w in zip(_in_union(ctx), widths[1].tolist(), strict=True):
            if w > 0:
                if w not in shaped:
                    tensors = dict.fromkeys(schema.tensors, (w,))
                    shaped[w] = MessageSchema(tensors=tensors, scalars=schema.scalars)
                by_sender[sender] = shaped[w]
        if len(self._widths) > 4 * len(self._contexts) + 8:
            self._widths.clear()
        self._widths[key] = (rows, by_sender)
        return by_sender

    def _zero(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        zero = self._zeros.get(shape)
        if zero is None or zero.dtype != dtype:
            zero = self._zeros[shape] = torch.zeros((1, *shape), dtype=dtype)
        return zero

    def mix(self, state: Any, phase: int, inbox: Mapping[str, Payload], ctx: RoundContext) -> Any:
        """The rule's mix of one row, over slots in sorted sender order."""
        rows = self._rows(ctx)
        if self.rule.pattern == "chosen":
            model = self.rule.model(state)
            chosen = _gathered(inbox, schema_of(self.rule, phase, rows), model, self._positions[1])
            state, send = self.rule.mix(state, phase, chosen, rows)
            return state, self._outbox(send, ctx, phase + 1)
        if self.rule.pattern == "edges":
            edge_schema = schema_of(self.rule, phase, rows)
            model = self.rule.model(state)
            ragged = self.rule.widths is not None
            edge_inbox = self._edge_inbox(inbox, _in_union(ctx), edge_schema, model, ragged)
            state, send = self.rule.mix(state, phase, edge_inbox, rows)
            return state, self._outbox(send, ctx, phase + 1)
        slots: list[Slot] = []
        for sender, w, weight in self._in_neighbours(ctx.in_weights):
            payload = inbox.get(sender)
            if payload is not None:
                tensors: dict[str, torch.Tensor] = {}
                for n, value in payload.tensors.items():
                    row = value if isinstance(value, torch.Tensor) else payload.tensor(n)
                    tensors[n] = row[None]  # unsqueeze(0), a little cheaper
                scalars = (
                    {n: torch.tensor([v], dtype=_TOTAL) for n, v in payload.scalars.items()}
                    if payload.scalars
                    else {}
                )
                slots.append(Slot(tensors, scalars, weight, _YES, (w, True), self._sender(sender)))
                continue
            x = self.rule.model(state)
            schema = schema_of(self.rule, phase, rows) if self.rule.pattern != "none" else None
            names = schema.tensors if schema is not None else {}
            tensors = {
                n: self._zero(tuple(x.shape[1:]) if s is None else s, x.dtype)
                for n, s in names.items()
            }
            scalars = {n: torch.zeros(1, dtype=_TOTAL) for n in (schema.scalars if schema else ())}
            slots.append(Slot(tensors, scalars, weight, _NO, (w, False), self._sender(sender)))
        state, send = self.rule.mix(state, phase, slots, rows)
        return state, self._outbox(send, ctx, phase + 1)

    def _sender(self, sender: str) -> torch.Tensor:
        """``[1]`` long: ``sender``'s index in the run's node order (a slot's sender)."""
        at = self._positions[1].get(sender, -1)
        index = self._index.get(at)
        if index is None:
            index = self._index[at] = torch.tensor([at])
        return index

    def _in_neighbours(self, in_weights: Mapping[str, float]) -> list[tuple[str, float, Any]]:
        """``(sender, W_ji, W_ji as a [1] float64 tensor)`` in sorted sender order, made
        once per in-weights mapping (a node keeps one per graph of its schedule)."""
        cached = self._senders.get(id(in_weights))
        if cached is not None and cached[0] is in_weights:
            return cached[1]
        listed: list[tuple[str, float, Any]] = []
        for sender in sorted(in_weights):
            w = in_weights[sender]
            weight = self._weights.get(w)
            if weight is None:  # a few distinct weights a run: made once
                if len(self._weights) > 256:
                    self._weights.clear()
                weight = self._weights[w] = torch.tensor([w], dtype=_TOTAL)
            listed.append((sender, w, weight))
        if len(self._senders) > 256:
            self._senders.clear()
        self._senders[id(in_weights)] = (in_weights, listed)
        return listed


def _out_union(ctx: RoundContext) -> tuple[str, ...]:
    """The peer's out-neighbours over the run's graphs, sorted (this round's if the
    context does not say)."""
    return ctx.out_union or tuple(sorted(ctx.out_weights))


def _in_union(ctx: RoundContext) -> tuple[str, ...]:
    """The peer's in-neighbours over the run's graphs, sorted."""
    return ctx.in_union or tuple(sorted(ctx.in_weights))


def _edges_of(ctx: RoundContext, positions: Mapping[str, int]) -> Edges:
    """The one peer's :class:`Edges` in round ``ctx`` (``positions``: node id -> index in
    ``ctx.nodes``)."""
    outs, ins = _out_union(ctx), _in_union(ctx)
    return Edges(
        out_row=torch.zeros(len(outs), dtype=torch.long),
        out_weight=torch.tensor([ctx.out_weights.get(j, 0.0) for j in outs], dtype=_TOTAL),
        out_live=torch.tensor([j in ctx.out_weights for j in outs], dtype=torch.bool),
        in_row=torch.zeros(len(ins), dtype=torch.long),
        in_weight=torch.tensor([ctx.in_weights.get(j, 0.0) for j in ins], dtype=_TOTAL),
        in_live=torch.tensor([j in ctx.in_weights for j in ins], dtype=torch.bool),
        out_peer=torch.tensor([positions.get(j, -1) for j in outs], dtype=torch.long),
        in_peer=torch.tensor([positions.get(j, -1) for j in ins], dtype=torch.long),
        b=1,
    )


def _gathered(
    inbox: Mapping[str, Payload],
    schema: MessageSchema,
    model: torch.Tensor,
    positions: Mapping[str, int],
) -> Gathered:
    """A peer's dict inbox as one list, in sorted sender order, every message to row 0
    (an empty inbox holds empty tensors of the schema's shapes); ``positions``: node id
    -> index in the run's node order."""
    senders = sorted(inbox)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in schema.tensors.items():
        if senders:
            tensors[name] = torch.stack([inbox[j].tensor(name) for j in senders])
        else:
            size = tuple(model.shape[1:]) if shape is None else shape
            tensors[name] = model.new_zeros((0, *size))
    scalars = {
        name: torch.tensor([float(inbox[j].scalars[name]) for j in senders], dtype=_TOTAL)
        for name in schema.scalars
    }
    src = torch.tensor([positions.get(j, -1) for j in senders], dtype=torch.long)
    return Gathered(tensors, scalars, torch.zeros(len(senders), dtype=torch.long), 1, src)
