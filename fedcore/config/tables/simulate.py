"""``[simulate]``: how ``fedcore simulate`` runs a config in one process (not part of the
experiment: left out of the run fingerprint)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fedcore.config.constants import DEVICES, ENGINES, NODE_RECORDS, RANK_PARTITIONS
from fedcore.config.rules import Table, choice, require, rule
from fedcore.registry import did_you_mean

__all__ = ["SimulateConfig"]


def _device(key: str, device: str) -> None:
    """``"cpu"``, ``"cuda"`` or ``"cuda:K"``."""
    kind, colon, index = device.partition(":")
    hint = did_you_mean(kind, DEVICES) if kind not in DEVICES else ""
    require(
        kind in DEVICES and (not colon or (kind == "cuda" and index.isascii() and index.isdigit())),
        key,
        device,
        "must be 'cpu', 'cuda' or 'cuda:K' (K a GPU's number)" + (f"; {hint}" if hint else ""),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateConfig(Table):
    """``[simulate]``: how ``fedcore simulate`` runs a config in one process.

    ``engine``: ``"messages"`` runs one asyncio node per peer exchanging encoded messages
    (the reference, and what gRPC peers do); ``"vectorized"`` holds every node's state
    stacked and applies each round to all nodes at once; ``"auto"`` (the default) takes
    ``vectorized`` whenever it supports the config and says why not otherwise;
    ``"cohort"`` runs FedAvg over a population with only the round's cohort in memory
    (:mod:`fedcore.engines.cohort`).
    ``device``: ``"cpu"``, ``"cuda"`` or ``"cuda:K"`` (the vectorized engine only).
    ``node_records``: the per-node lines of ``metrics.jsonl``: ``"all"`` (one a node a
    round), ``"eval"`` (on evaluation rounds only), ``"none"``; ``"auto"`` is ``all`` up to
    ``AUTO_RECORDS_NODES`` nodes and ``eval`` above. Per-round network aggregates
    (``"kind": "round"``) are written whatever this says.
    ``partition``: which peers each rank of a sharded run (``--ranks``) holds:
    ``"blocks"`` (contiguous blocks of graph order), ``"graph"`` (a balanced partition
    grown by breadth-first search that cuts few edges, block sizes those of ``blocks``),
    ``"metis"`` (METIS, the ``fedcore[partition]`` extra); ``"auto"`` (the default) is
    ``graph`` up to ``AUTO_GRAPH_EDGES`` edges and ``blocks`` above
    (:mod:`fedcore.engines.partition`). One process ignores it.
    """

    TABLE: ClassVar[str] = "simulate"

    engine: str = field(default="auto", metadata=choice(ENGINES))
    device: str = field(default="cpu", metadata=rule(_device))
    node_records: str = field(default="auto", metadata=choice(NODE_RECORDS))
    partition: str = field(default="auto", metadata=choice(RANK_PARTITIONS))

    def check(self) -> None:
        """The messages engine runs on the CPU."""
        require(
            self.engine != "messages" or self.device.partition(":")[0] == "cpu",
            "simulate.device",
            self.device,
            "needs the vectorized engine (simulate.engine = 'messages' runs on the CPU): set "
            "simulate.engine = 'vectorized', or simulate.device = 'cpu'",
        )
