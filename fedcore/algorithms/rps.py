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

The block-level form above is a reconstruction of the paper's (partly unverified against
it); the invariants I-RPS-1..5 (``tests/algorithms/test_rps.py``) hold for it.

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
phases. The owner encodes its average once (``rows.compress``) and keeps, as its own block,
exactly what the receivers decode, so with no loss every replica is bit-identical whatever
the codec.

One :class:`~fedcore.algorithms.rule.Rule` over a leading peer axis serves every engine. Its
pattern is ``"edges"`` (RPS sends each owner a different block) with per-edge ``widths``: a
message is a block, as long as the block it carries, padded to the longest block in the
rule's ``[E, w]`` tensors. On the vectorized engine a stochastic codec (``qsgd``, ``randk``)
is refused: a worker encodes blocks of two lengths in receiver order, and the engine's
codec calls go one length at a time.

When the model has fewer entries than there are nodes, the last blocks are empty: their
owners receive no scatter messages and send no gather messages (their edges' width is 0).

With a node optimizer (``[optimizer]``), its direction ``u_i``, from the gradient at
``x_i``, replaces ``lr * g`` in ``x_half_i``; the optimizer state (momentum, moments) is
each worker's own and covers the whole model, not only its block.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedcore.algorithms.rule import EdgeInbox, Edges, Rows, Rule, Send, spent
from fedcore.errors import AlgorithmError
from fedcore.messages import MessageSchema

__all__ = ["RPS", "RPSRule", "RPSState", "block_bounds", "block_sizes"]


class RPSState(NamedTuple):
    """The models ``x [B, d]`` (between the scatter and the gather phase the post-step
    models ``x_half``) and each row's average of its own block, as receivers decode it,
    padded to the longest block (``[B, w]`` between the phases, ``[B, 0]`` between
    rounds)."""

    x: torch.Tensor
    y: torch.Tensor


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


class _Layout(NamedTuple):
    """The blocks of a run's model over ``n`` owners: the first ``r``
    hold ``q + 1`` entries, the others ``q``; ``w`` is the longest; ``size`` each owner's
    (``[n]`` long)."""

    n: int
    q: int
    r: int
    w: int
    size: torch.Tensor

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, d]`` as ``[B, n, w]``, each owner's block padded with zeros (a copy)."""
        b, cut = x.shape[0], self.r * (self.q + 1)
        long = x[:, :cut].reshape(b, self.r, self.q + 1)
        short = x[:, cut:].reshape(b, self.n - self.r, self.q)
        if self.w > self.q:
            short = torch.cat([short, short.new_zeros((b, self.n - self.r, 1))], dim=2)
        if self.r == 0:
            return short.clone()
        return torch.cat([long, short], dim=1)

    def own(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``[B, w]``: row ``i``'s block ``index[i]`` of ``x [B, d]``, padded with zeros."""
        if x.shape[0] == 1:  # a peer: one slice
            j = int(index[0])
            start = j * self.q + min(j, self.r)
            size = self.q + (j < self.r)
            out = x.new_zeros((1, self.w))
            out[0, :size] = x[0, start : start + size]
            return out
        return (
            self.blocks(x)
            .view(-1, self.w)
            .index_select(0, torch.arange(x.shape[0], device=x.device) * self.n + index)
        )

    def model(self, blocks: torch.Tensor) -> torch.Tensor:
        """``[B, n, w]`` blocks back as ``[B, d]`` (padding dropped)."""
        b = blocks.shape[0]
        long = blocks[:, : self.r, : self.q + 1].reshape(b, -1)
        short = blocks[:, self.r :, : self.q].reshape(b, -1)
        return torch.cat([long, short], dim=1)


class RPSRule(Rule):
    """RPS, the Robust Parameter Server (see the module docstring for the update rule).

    Two phases a round: scatter (phase 0, tensor ``"block"``: the sender's ``x_half`` on the
    receiver's block) and gather (phase 1, tensor ``"avg"``: the sender's averaged block).
    Every worker addresses every block owner, so the trust graph must hold every ordered
    pair of nodes (mixing ``"all-pairs"``, e.g. ``topology.kind = "complete"``); the mixing
    weights are not used. It takes no options.

    The block layout depends on the model size, which :meth:`init` records: one rule serves
    the peers of one run, which share one model size.
    """

    name = "rps"
    mixing = "all-pairs"
    phases = 2
    pattern = "edges"

    def __init__(self) -> None:
        """Create it; the model size is learnt from :meth:`init`."""
        self._numel: int | None = None
        self._layouts: dict[tuple[int, torch.device], _Layout] = {}

    def init(self, params: torch.Tensor) -> RPSState:
        """Start from ``params [B, d]`` and record the model size that fixes the blocks."""
        self._numel = int(params.shape[1])
        return RPSState(params.clone(), params.new_zeros((params.shape[0], 0)))

    def model(self, state: RPSState) -> torch.Tensor:
        """The models ``x``."""
        return state.x

    def _layout(self, rows: Rows) -> _Layout:
        device = rows.self_weight.device
        layout = self._layouts.get((rows.n, device))
        if layout is None:
            if self._numel is None:
                raise AlgorithmError(
                    "RPS does not know the model size yet: call init(params) before asking "
                    "for message shapes."
                )
            q, r = divmod(self._numel, rows.n)
            sizes = block_sizes(self._numel, rows.n)
            size = torch.tensor(sizes, dtype=torch.long, device=device)
            layout = _Layout(rows.n, q, r, q + (r > 0), size)
            self._layouts[(rows.n, device)] = layout
        return layout

    def _checked(self, rows: Rows, d: int) -> tuple[_Layout, Edges]:
        """The layout and the rows' edges (checked: the model size, every row a node)."""
        if d != self._numel:
            raise AlgorithmError(
                f"RPS: the model has {d} entries, but this rule was initialised for "
                f"{self._numel}. Use one RPS rule per model size."
            )
        if rows.b == 1 and int(rows.index[0]) < 0:  # a peer (all peers' rows are all nodes)
            raise AlgorithmError(
                f"RPS: peer {rows.ids[0] if rows.ids else '?'} is not in the round's node "
                f"list ({rows.n} nodes); RPS needs every node of the run in it."
            )
        assert rows.edges is not None
        return self._layout(rows), rows.edges

    def widths(self, phase: int, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Each edge's block: the receiver's in the scatter (phase 0), the sender's in the
        gather (phase 1); 0 for an empty block (no message)."""
        size = self._layout(rows).size
        edges = rows.edges
        assert edges is not None
        if phase == 0:
            return size[edges.out_peer], size[rows.index[edges.in_row]]
        return size[rows.index[edges.out_row]], size[edges.in_peer]

    def schema(self, phase: int, rows: Rows) -> MessageSchema:
        """Phase 0 a ``"block"``, phase 1 an ``"avg"``: one 1-D block of the model's dtype,
        the longest block's length here and each edge's own in :meth:`widths`. No
        scalars. The block a message fills is fixed by who sends it (no index travels)."""
        w = self._layout(rows).w
        return MessageSchema(tensors={"block" if phase == 0 else "avg": (w,)})

    def step(self, state: RPSState, grad: torch.Tensor, rows: Rows) -> tuple[RPSState, Send]:
        """Local SGD step; send each other owner its block of ``x_half`` (the scatter)."""
        x_half = state.x - rows.lr * grad
        layout, edges = self._checked(rows, x_half.shape[1])
        blocks = layout.blocks(x_half).view(-1, layout.w)  # [B * n, w]
        sent = blocks.index_select(0, edges.out_row * layout.n + edges.out_peer)
        return RPSState(x_half, state.y), Send({"block": sent})

    def mix(
        self, state: RPSState, phase: int, inbox: EdgeInbox, rows: Rows
    ) -> tuple[RPSState, Send | None]:
        """Phase 0: average the own block with the blocks that arrived and send the average
        to every other worker. Phase 1: take every averaged block that arrived; a missing
        one keeps the local ``x_half`` value."""
        layout, edges = self._checked(rows, state.x.shape[1])
        if phase == 0:
            # The own block, then every block that arrived in sender order (adding 0 for
            # one that did not), divided by how many there were.
            arrived = inbox.arrived.unsqueeze(1)
            block = torch.where(arrived, inbox.tensors["block"], 0.0)
            total = edges.in_total(block, start=layout.own(state.x, rows.index))
            count = 1.0 + edges.in_total(inbox.arrived.to(torch.float64))
            y = total / count.to(total.dtype).unsqueeze(1)
            size = layout.size[rows.index]
            y = rows.compress(y, where=size > 0, width=size)  # what every receiver decodes
            return RPSState(state.x, y), Send({"avg": y}, shared=True)
        if state.y.shape[1] != layout.w:
            raise AlgorithmError(
                "RPS: gather phase without a scatter phase before it (mix phase 0 first)."
            )
        blocks = layout.blocks(state.x).view(-1, layout.w)  # [B * n, w]
        own = torch.arange(rows.b, device=state.x.device) * layout.n + rows.index
        blocks.index_copy_(0, own, state.y)
        got = torch.nonzero(inbox.arrived).squeeze(1)  # a lost block keeps x_half
        senders = edges.in_row.index_select(0, got) * layout.n + edges.in_peer.index_select(0, got)
        blocks.index_copy_(0, senders, inbox.tensors["avg"].index_select(0, got))
        return RPSState(layout.model(blocks.view(rows.b, layout.n, -1)), spent(state.y)), None


RPS = RPSRule
