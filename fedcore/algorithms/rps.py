"""RPS: the Robust Parameter Server, SGD over an unreliable network.

Yu, Tang, Renggli, Kassing, Singla, Alistarh, Zhang, Liu, "Distributed Learning over
Unreliable Networks" (ICML 2019, arXiv 1810.07766). Every one of the ``n`` workers holds a
replica of the whole model and also serves one block of it: the flattened model is split
into ``n`` contiguous blocks ``B_1..B_n`` (sizes as ``numpy.array_split``: the first
``numel % n`` blocks are one longer), block ``j`` owned by ``ctx.nodes[j]``. Per round::

    g        = grad f_i(x_i)
    x_half_i = x_i - lr * g                                    # local SGD step
    phase 0 (scatter): send x_half_i[B_j] to every owner j != i
    owner j: S_j = {j} + {i : the block from i arrived}
             y_j = (1 / |S_j|) * sum_{i in S_j} x_half_i[B_j]
    phase 1 (gather):  owner j sends y_j to every i != j
    worker i: x_i[B_j] = y_j if it arrived (and for its own block), else x_half_i[B_j]

The block-level form above is the one reconstructed in ``reference/algorithms.md``
(section 4.2, partly [unverified]); the invariants I-RPS-1..5 hold for it.

A missing message is a legal input. A lost scatter message just leaves that worker's
block out of the owner's average (the owner's own block is always in it, so ``|S_j| >= 1``
and nothing is ever divided by zero). A lost gather message leaves the receiver's local
``x_half`` value in that block. Either way every new coordinate is a convex combination
of the workers' ``x_half`` values: the consensus diameter never grows.

With no loss (drop probability ``p = 0``) every worker ends each round with exactly
``mean_i x_half_i``: RPS is then synchronous all-reduce SGD (model averaging every step),
with the traffic of a reduce-scatter plus an all-gather, ``2 (n - 1) d / n`` values per
worker a round. With ``p = 1`` it is pure local SGD. For ``0 < p < 1`` the per-block
mixing is row-stochastic but not column-stochastic, so the **mean of the models is not
preserved** (an owner's own value gets more than its share); do not expect it to be.

Compression is orthogonal (the paper is about loss): the node's codec encodes messages of both
phases. The owner encodes its average once with ``ctx.codec`` and keeps, as its own block,
exactly what the receivers decode, so with no loss every replica is bit-identical whatever
the codec.

When the model has fewer entries than there are nodes, the last blocks are empty: their
owners receive no scatter messages and send no gather messages, and
:meth:`RPS.expected_senders` leaves them out.

With a node optimizer (``[optimizer]``), its direction ``u_i``, from the gradient at
``x_i``, replaces ``lr * g`` in ``x_half_i``; the optimizer state (momentum, moments) is
each worker's own and covers the whole model, not only its block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from fedcore.algorithms.base import Inbox, Outbox, RoundContext, check_phase
from fedcore.algorithms.compressed import compress
from fedcore.errors import AlgorithmError
from fedcore.messages import EncodedTensor, MessageSchema, Payload

__all__ = ["RPS", "RPSState", "assemble_blocks", "average_block", "block_bounds", "block_sizes"]


class RPSState(NamedTuple):
    """The full model ``x`` and this node's averaged block ``y``.

    Between rounds ``y`` is ``None``; between the scatter and the gather phase ``x`` is the
    post-step model ``x_half`` and ``y`` the owner's average of its block.
    """

    x: torch.Tensor
    y: torch.Tensor | None


def block_sizes(numel: int, n: int) -> tuple[int, ...]:
    """Sizes of the ``n`` contiguous blocks of a model of ``numel`` entries.

    As ``numpy.array_split`` and ``torch.tensor_split``: the first ``numel % n`` blocks are
    one entry longer; blocks are empty when ``numel < n``.
    """
    q, r = divmod(numel, n)
    return tuple(q + 1 if j < r else q for j in range(n))


def block_bounds(numel: int, n: int) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` of each of the ``n`` blocks in the flattened model."""
    bounds: list[tuple[int, int]] = []
    start = 0
    for size in block_sizes(numel, n):
        bounds.append((start, start + size))
        start += size
    return tuple(bounds)


def average_block(own: torch.Tensor, received: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(own + sum(received)) / (1 + len(received))``: the owner's average of its block.

    The own block is always included, so the divisor is at least 1. Returns a new tensor;
    the inputs are not modified.
    """
    total = own.clone()
    for block in received:
        total.add_(block)
    return total.div_(1 + len(received))


def assemble_blocks(
    x_half: torch.Tensor,
    bounds: Sequence[tuple[int, int]],
    blocks: Mapping[int, torch.Tensor],
) -> torch.Tensor:
    """A copy of ``x_half`` with block ``j`` replaced by ``blocks[j]`` for each given ``j``.

    Blocks not given keep their ``x_half`` values (a lost gather message). The inputs are not
    modified.
    """
    flat = x_half.reshape(-1).clone()
    for j, block in blocks.items():
        start, stop = bounds[j]
        flat[start:stop] = block
    return flat.reshape(x_half.shape)


class RPS:
    """RPS, the Robust Parameter Server (see the module docstring for the update rule).

    Two phases a round: scatter (phase 0, tensor ``"block"``: the sender's ``x_half`` on the
    receiver's block) and gather (phase 1, tensor ``"avg"``: the sender's averaged block).
    Every worker addresses every block owner, so the trust graph must hold every ordered
    pair of nodes (mixing ``"all-pairs"``, e.g. ``topology.kind = "complete"``); the mixing
    weights are not used. It takes no options.

    The block layout depends on the model size, which :meth:`init` records: one ``RPS``
    object serves the nodes of one run, which share one model size. :meth:`message_schema`
    tells a receiver the name and shape of each incoming tensor, which is a block, not the
    model.
    """

    name = "rps"
    mixing = "all-pairs"
    phases = 2

    def __init__(self) -> None:
        """Create it; the model size is learnt from :meth:`init`."""
        self._numel: int | None = None

    def init(self, params: torch.Tensor) -> RPSState:
        """Start from ``params`` and record the model size that fixes the blocks."""
        self._numel = params.numel()
        return RPSState(params.clone(), None)

    def model(self, state: RPSState) -> torch.Tensor:
        """The model ``x``."""
        return state.x

    def step(
        self, state: RPSState, grad: torch.Tensor, ctx: RoundContext
    ) -> tuple[RPSState, Outbox]:
        """Local SGD step; send each other owner its block of ``x_half`` (the scatter)."""
        x_half = state.x - ctx.lr * grad
        bounds = self._bounds(x_half.numel(), ctx)
        me = _index(ctx)
        flat = x_half.reshape(-1)
        outbox: dict[str, Payload] = {}
        for j, dst in enumerate(ctx.nodes):
            start, stop = bounds[j]
            if j != me and stop > start:
                outbox[dst] = Payload({"block": flat[start:stop].clone()})
        return RPSState(x_half, None), outbox

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        """Phase 0: every other node, if this node's block is not empty; phase 1: every
        other owner of a non-empty block. Sorted."""
        me = _index(ctx)
        sizes = block_sizes(self._require_numel(), len(ctx.nodes))
        if phase == 0:
            if sizes[me] == 0:
                return ()
            return tuple(sorted(s for j, s in enumerate(ctx.nodes) if j != me))
        if phase == 1:
            return tuple(sorted(s for j, s in enumerate(ctx.nodes) if j != me and sizes[j] > 0))
        raise AlgorithmError(f"RPS has phases 0 and 1, not {phase}.")

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        """What ``sender`` sends this node in ``phase``: one 1-D block of the model's dtype.

        Phase 0 (scatter): tensor ``"block"``, this node's own block, ``(len(B_me),)``;
        phase 1 (gather): tensor ``"avg"``, the sender's block, ``(len(B_sender),)``. No
        scalars. The block a message fills is fixed by who sends it (no index travels).

        Raises:
            AlgorithmError: another phase; a sender that is this node or not in
                ``ctx.nodes``; a block that is empty (nothing is sent for it); or before
                :meth:`init` recorded the model size.
        """
        check_phase(self.name, phase, self.phases)
        me = _index(ctx)
        if sender not in ctx.nodes or sender == ctx.node:
            raise AlgorithmError(
                f"RPS node {ctx.node}: {sender!r} is not another node of this run, so it "
                "sends this node no block."
            )
        sizes = block_sizes(self._require_numel(), len(ctx.nodes))
        if phase == 0:
            name, size = "block", sizes[me]
        else:
            name, size = "avg", sizes[ctx.nodes.index(sender)]
        if size == 0:
            whose = "this node's block" if phase == 0 else f"the block of {sender!r}"
            raise AlgorithmError(
                f"RPS node {ctx.node}: {whose} is empty, so nothing is sent for it in phase "
                f"{phase}."
            )
        return MessageSchema(tensors={name: (size,)})

    def mix(
        self, state: RPSState, phase: int, inbox: Inbox, ctx: RoundContext
    ) -> tuple[RPSState, Outbox]:
        """Phase 0: average the own block with the blocks that arrived and send the average
        to every other node. Phase 1: take every averaged block that arrived; a missing one
        keeps the local ``x_half`` value."""
        bounds = self._bounds(state.x.numel(), ctx)
        me = _index(ctx)
        owner = {s: j for j, s in enumerate(ctx.nodes)}
        for sender in inbox:
            if owner.get(sender, me) == me:
                raise AlgorithmError(
                    f"RPS node {ctx.node}, round {ctx.round}: phase {phase} message from "
                    f"{sender!r}, which is not another node of this run."
                )
        if phase == 0:
            start, stop = bounds[me]
            received = [
                _tensor(payload, "block", sender, stop - start, ctx)
                for sender, payload in inbox.items()
            ]
            flat = state.x.reshape(-1)
            y = average_block(flat[start:stop], received)
            outbox: dict[str, Payload] = {}
            if stop > start:
                avg: torch.Tensor | EncodedTensor = y
                if ctx.codec is not None:
                    # Keep exactly what the receivers decode, so replicas stay identical.
                    avg, y = compress(ctx.codec, y, ctx)
                payload = Payload({"avg": avg})
                outbox = {dst: payload for j, dst in enumerate(ctx.nodes) if j != me}
            return RPSState(state.x, y), outbox
        if phase == 1:
            if state.y is None:
                raise AlgorithmError(
                    f"RPS node {ctx.node}, round {ctx.round}: gather phase without a scatter "
                    "phase before it (mix phase 0 first)."
                )
            blocks: dict[int, torch.Tensor] = {me: state.y}
            for sender, payload in inbox.items():
                j = owner[sender]
                start, stop = bounds[j]
                blocks[j] = _tensor(payload, "avg", sender, stop - start, ctx)
            return RPSState(assemble_blocks(state.x, bounds, blocks), None), {}
        raise AlgorithmError(f"RPS has phases 0 and 1, not {phase}.")

    def _require_numel(self) -> int:
        if self._numel is None:
            raise AlgorithmError(
                "RPS does not know the model size yet: call init(params) before asking for "
                "expected senders or message shapes."
            )
        return self._numel

    def _bounds(self, numel: int, ctx: RoundContext) -> tuple[tuple[int, int], ...]:
        if self._numel is None:
            self._numel = numel
        elif numel != self._numel:
            raise AlgorithmError(
                f"RPS node {ctx.node}: the model has {numel} entries, but this RPS object was "
                f"initialised for {self._numel}. Use one RPS object per model size."
            )
        return block_bounds(numel, len(ctx.nodes))


def _index(ctx: RoundContext) -> int:
    """This node's block index: its position in ``ctx.nodes``."""
    try:
        return ctx.nodes.index(ctx.node)
    except ValueError:
        raise AlgorithmError(
            f"RPS node {ctx.node!r} is not in the round context's node list "
            f"({len(ctx.nodes)} nodes); RPS needs every node of the run in ctx.nodes."
        ) from None


def _tensor(payload: Payload, name: str, sender: str, size: int, ctx: RoundContext) -> torch.Tensor:
    """The block ``name`` of ``payload``, checked to hold ``size`` entries."""
    try:
        tensor = payload.tensor(name)
    except KeyError:
        raise AlgorithmError(
            f"RPS node {ctx.node}, round {ctx.round}: the message from {sender!r} lacks the "
            f"tensor {name!r}."
        ) from None
    if tensor.numel() != size:
        raise AlgorithmError(
            f"RPS node {ctx.node}, round {ctx.round}: the {name!r} block from {sender!r} has "
            f"{tensor.numel()} entries; expected {size}."
        )
    return tensor.reshape(-1)
