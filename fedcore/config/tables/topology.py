"""``[topology]``: the graph of the peers, generated or read from a file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fedcore import registry
from fedcore.config.constants import MAX_NODES, MAX_ROUNDS, SEED_LIMIT
from fedcore.config.rules import Table, named, node_id, number, whole

__all__ = ["TopologyConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyConfig(Table):
    """``[topology]``: a generator (kind, nodes, seed and its parameters) or a file.

    ``file``: a graph file; :func:`~fedcore.config.load_config` makes it absolute (a
    relative path in a config file is relative to that file's folder, one given with
    ``--set`` to the current directory). ``undirected = true`` adds the reverse of every
    one-way edge (an undirected exponential or Erdos-Renyi graph, for algorithms that need
    a symmetric one). ``server``: the parameter server's node id, of a ``star`` (``nodes``
    workers and the server) or of a graph file, for the server family (``fedavg``, ...); it
    holds no data. ``period``: the rounds of fresh graphs of an epidemic schedule
    (``epidemic-local``, ``epidemic-oracle``) before it repeats; 0 is the run's rounds
    (:func:`~fedcore.setup.graph.with_rounds`).
    """

    TABLE: ClassVar[str] = "topology"

    kind: str = field(default="social", metadata=named(registry.TOPOLOGY_KINDS, user=False))
    nodes: int = field(default=16, metadata=whole(1, MAX_NODES))
    seed: int = field(default=0, metadata=whole(0, SEED_LIMIT - 1))
    file: str = ""
    p: float = field(default=0.3, metadata=number("(0, 1]"))
    rows: int = field(default=0, metadata=whole(0, MAX_NODES))
    cols: int = field(default=0, metadata=whole(0, MAX_NODES))
    degree: int = field(default=4, metadata=whole(1, MAX_NODES - 1))
    period: int = field(default=0, metadata=whole(0, MAX_ROUNDS))
    undirected: bool = False
    server: str = field(default="server", metadata=node_id())
