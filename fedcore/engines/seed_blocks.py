"""Several runs of one config that differ only in ``run.seed`` as blocks of rows of one
vectorized network (``fedcore simulate --seeds ... --batch-seeds``).

Run ``k`` of ``S`` is rows ``k N .. (k + 1) N - 1`` of a :class:`SeedBlocks` network: its
graph is the disjoint union of the runs' weighted graphs (so mixing is block-diagonal: no
row reads another block's row), and each block's rows start from their own run's
initial model, draw their own run's batches (its data split, its stream seeds) and their
own run's codec seeds, and the messages of each block are lost or its nodes crashed as its
own run's fault plan says. Every computation of a round is a row's own (its gradient, its
in-neighbours' sum in sorted-id order, its codec's draws), so each block computes what its
separate run computes, bit for bit; ``tests/simulation/test_seed_batch.py`` holds them
equal. :func:`block_refusal` names what cannot be batched so (the algorithms whose round
reads the whole network, virtual time, models with their own randomness, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedcore.compression import CodecOptions, codec_seed
from fedcore.compression.batched import make_row_codec
from fedcore.config import Config
from fedcore.data import StackedBatches
from fedcore.engines.batched import Messages
from fedcore.engines.vectorized import RoundFigures, VectorizedNetwork, stacked_batches
from fedcore.errors import ConfigError
from fedcore.faults import FaultPlan
from fedcore.setup.prepare import RunSetup
from fedcore.topology import Schedule, TrustGraph

__all__ = ["BATCHED_ALGORITHMS", "SeedBlocks", "block_figures", "block_refusal", "union_graph"]

BATCHED_ALGORITHMS = ("ops", "dpsgd", "dog", "dol", "local", "deepsqueeze", "choco")
"""The algorithms whose round is row by row over in-neighbours (no row reads the network's
size, its ids or another block): those :class:`SeedBlocks` runs. ``central`` (every node's
sorted ids), ``rps`` (blocks of the model by the network's size) and the server family
(a sample of the network's ids) are not. (OPS reads the network's size only as the bound it
checks a share's weight against, ``(0, n]``: a batch checks against ``S n``, so a share
that broke it would stop a separate run but not the batch; no correct run breaks it.)"""


def config_refusal(config: Config) -> str | None:
    """Why the runs of ``config`` cannot be batched, from what the config says (one
    clause), or None. :func:`block_refusal` checks the rest once the runs are set up."""
    if config.simulate.engine == "messages":
        return "simulate.engine = 'messages' runs one node object per peer"
    if config.algorithm.name not in BATCHED_ALGORITHMS:
        return (
            f"algorithm {config.algorithm.name!r} is not batched (batched: "
            f"{', '.join(BATCHED_ALGORITHMS)})"
        )
    if config.time.active:
        return "virtual time ([time]) is not batched"
    if config.adversary.active:
        return "Byzantine peers ([adversary]) are not batched"
    if config.transport.mode == "deadline":
        return "deadline mode (transport.mode) runs on the message engine"
    if config.data.stream:
        return "an online data stream (data.stream) is not batched"
    if config.run.checkpoint_every:
        return "run.checkpoint_every: a batch of seeds is not checkpointed"
    if config.privacy.active:
        return "[privacy] runs one seed at a time"
    return None


def block_refusal(setup: RunSetup) -> str | None:
    """Why a set-up run cannot be a block of a :class:`SeedBlocks` network (one clause),
    or None."""
    why = config_refusal(setup.config)
    if why is not None:
        return why
    if setup.algorithm.server is not None:
        return f"the server family ({setup.algorithm.name!r}) is not batched"
    module = setup.evaluator.module
    if next(module.buffers(), None) is not None:
        return "a model with buffers (BatchNorm's running statistics) is not batched"
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in module.modules()):
        return "a model with dropout draws from torch's one global generator: not batched"
    if setup.evaluator.rows.mode == "module":
        return "a model whose gradients are computed one module per node is not batched"
    return None


def union_graph(graphs: Sequence[TrustGraph]) -> TrustGraph:
    """The disjoint union of ``graphs`` (weighted, static), graph ``k``'s node ``v`` named
    ``"b{k}.{v}"`` and at index ``k N + i``: one common prefix a block keeps each block's
    sorted-id order, the order an inbox is summed in."""
    srcs, dsts, weights, names = [], [], [], []
    offset = 0
    for k, graph in enumerate(graphs):
        src, dst, w = graph.index_edges()
        loops = np.arange(len(graph.nodes), dtype=np.int64)
        assert w is not None, "a run's communication graph has weights"
        srcs += [src + offset, loops + offset]
        dsts += [dst + offset, loops + offset]
        weights += [w, graph.self_weights()]
        names += [f"b{k}.{v}" for v in graph.nodes]
        offset += len(graph.nodes)
    return TrustGraph.from_index_edges(
        np.concatenate(srcs),
        np.concatenate(dsts),
        weight=np.concatenate(weights),
        name=f"{graphs[0].name}-x{len(graphs)}",
        nodes=names,
        trusted_ids=True,
    )


class SeedBlocks(VectorizedNetwork):
    """The runs ``setups`` (one config, seeds apart) as blocks of one network (see the
    module docstring); :meth:`block_figures` splits a round's figures by run.

    Raises:
        ConfigError: a run that :func:`block_refusal` refuses, runs of different sizes,
            or the union that the vectorized engine cannot run (its memory).
    """

    def __init__(self, setups: Sequence[RunSetup], *, device: torch.device) -> None:
        """Build the union network, then give each block its run's start, batches and
        codec seeds."""
        first = setups[0]
        for setup in setups:
            why = block_refusal(setup)
            if why is not None:
                raise ConfigError(f"--batch-seeds cannot batch this config: {why}.")
        self.block_n = len(first.graph.nodes)
        period = first.graph.period
        if any(len(s.graph.nodes) != self.block_n or s.graph.period != period for s in setups):
            raise ConfigError(
                "--batch-seeds: the seeds' runs have graphs of different sizes or periods."
            )
        self.blocks = list(setups)
        # A schedule: round t's union is the union of the seeds' round-t graphs.
        unions = [union_graph([s.graph.at(t) for s in setups]) for t in range(period)]
        graph: TrustGraph | Schedule = (
            unions[0] if period == 1 else Schedule(unions, name=unions[0].name)
        )
        union = dataclasses.replace(
            first, graph=graph, trust=graph, parts=[p for s in setups for p in s.parts]
        )
        super().__init__(union, device=device)
        starts = torch.stack([s.start for s in setups]).to(device)
        self.state = self.form.init(starts.repeat_interleave(self.block_n, dim=0))
        self.opt_state = (
            self.optimizer.init(self.form.model(self.state)) if self.optimizer else None
        )
        c = first.config.compression
        seeds = [codec_seed(s.config.run.seed, i) for s in setups for i in range(self.block_n)]
        self.codec = make_row_codec(c.codec, CodecOptions.of(c, first.layers), seeds=seeds)
        self.block_batches = [stacked_batches(s, device) for s in setups]
        plans = [s.faults for s in setups]
        if any(plan is not None for plan in plans):
            self.plan = _BlockPlans(plans, self.block_n)  # type: ignore[assignment]

    def _stacked_batches(self) -> StackedBatches | None:
        return None  # each block draws its own run's (:meth:`_data`)

    def _data(
        self, t: int, up: np.ndarray[Any, np.dtype[np.bool_]]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Each block's batches as its run draws them, as one group where their batches
        have one shape (a block without a mask given one of every example: a row gets the
        bits of its own examples alone either way, :meth:`~fedcore.gradients.RowGradient.
        loss_and_grad`), else a group a block."""
        n = self.block_n
        groups = []
        for k, batches in enumerate(self.block_batches):
            rows, x, y, mask = batches.next(up[k * n : (k + 1) * n])
            groups.append((rows + k * n, x, y, mask))
        if len({g[1].shape[1:] for g in groups}) > 1:
            return groups
        masks = [g[3] for g in groups]
        mask = None
        if any(m is not None for m in masks):
            mask = torch.cat(
                [
                    torch.ones(g[2].shape, dtype=torch.bool, device=self.device) if m is None else m
                    for g, m in zip(groups, masks, strict=True)
                ]
            )
        return [
            (
                torch.cat([g[0] for g in groups]),
                torch.cat([g[1] for g in groups]),
                torch.cat([g[2] for g in groups]),
                mask,
            )
        ]

    def block_rows(self, k: int) -> slice:
        """The rows of block ``k``."""
        return slice(k * self.block_n, (k + 1) * self.block_n)

    def block_fault_counts(self, k: int) -> tuple[dict[str, int], dict[str, int]]:
        """Block ``k``'s :meth:`~fedcore.engines.vectorized.VectorizedNetwork.fault_counts`
        (its messages in their order, its own node ids)."""
        nodes, rows = self.blocks[k].graph.nodes, self.block_rows(k)
        missing: dict[str, int] = {}
        dropped: dict[str, int] = {}
        for phases in self.phases:
            for phase in phases:
                src, dst = phase.messages.src.cpu(), phase.messages.dst.cpu()
                mine = (src >= rows.start) & (src < rows.stop)
                for table, counts in ((missing, phase.missing), (dropped, phase.dropped)):
                    hits = torch.nonzero(mine & (counts.cpu() != 0)).flatten().tolist()
                    for e in hits:
                        u, v = int(src[e]) - rows.start, int(dst[e]) - rows.start
                        key = f"{nodes[u]}->{nodes[v]}"
                        table[key] = table.get(key, 0) + int(counts[e])
        return missing, dropped


class _BlockPlans:
    """The blocks' fault plans as one, over the union's rows (what the vectorized engine
    asks of a :class:`~fedcore.faults.FaultPlan`): each block's nodes and messages as its
    own run's plan decides them, by its own node indices."""

    def __init__(self, plans: Sequence[FaultPlan | None], n: int) -> None:
        self.plans = plans
        self.n = n

    def down_mask(self, round: int, device: torch.device | str | None = None) -> torch.Tensor:
        """``[S N]`` bool: the crashed nodes of every block."""
        return torch.cat(
            [
                torch.zeros(self.n, dtype=torch.bool, device=device)
                if plan is None
                else plan.down_mask(round, device)
                for plan in self.plans
            ]
        )

    def lost_mask(
        self, src: torch.Tensor, dst: torch.Tensor, round: int, phase: int
    ) -> torch.Tensor:
        """``[E]`` bool: the messages ``src[e] -> dst[e]`` (union rows) their block's plan
        loses in ``(round, phase)``."""
        lost = torch.zeros(src.shape, dtype=torch.bool, device=src.device)
        block = torch.div(src, self.n, rounding_mode="floor")
        for k, plan in enumerate(self.plans):
            at = torch.nonzero(block == k).flatten()
            if plan is not None and at.numel():
                offset = k * self.n
                lost[at] = plan.lost_mask(src[at] - offset, dst[at] - offset, round, phase)
        return lost


def block_figures(figures: RoundFigures, rows: slice) -> RoundFigures:
    """One block's part of a round's figures: its rows, and its lost messages by its own
    node indices."""
    lost = []
    for m, mask, late in figures.lost:
        at = torch.nonzero((m.src >= rows.start) & (m.src < rows.stop)).flatten()
        mine = Messages(m.src[at] - rows.start, m.dst[at] - rows.start, m.nbytes[at], m.fp32[at])
        lost.append((mine, mask[at], late))
    return dataclasses.replace(
        figures,
        lost=tuple(lost),
        **{
            f.name: getattr(figures, f.name)[rows]
            for f in dataclasses.fields(figures)
            if f.name not in ("round", "lost")
        },
    )
