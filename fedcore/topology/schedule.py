"""Time-varying topologies: a :class:`Schedule` is a cycle of trust graphs over one node set.

Some algorithms let each peer talk to different neighbours in different rounds (the one-peer
exponential graph of OPS and SGP sends to one peer a round). A Schedule shares the small
interface of :class:`~fedcore.topology.graph.TrustGraph` that round-running code needs
(``period``, ``at(round)``, ``union()``), so that code can take either one as a
:data:`Topology`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias

import numpy as np

from fedcore.errors import TopologyError
from fedcore.topology.graph import TrustGraph
from fedcore.topology.validation import format_nodes

__all__ = ["Schedule", "Topology"]


class Schedule:
    """A time-varying topology: a cycle of trust graphs over one node set.

    Round ``t`` uses ``graphs[t % period]``. Algorithms that need connectivity need it over a
    period: the union of one period's edges must be strongly connected ("uniformly strongly
    connected" with bound ``period``).

    Args:
        graphs: One graph a round, all over the same nodes in the same order.
        name: The schedule's name, such as ``"one-peer-exponential-16"``.

    Raises:
        TopologyError: If there are no graphs or their node lists differ.
    """

    __slots__ = ("_graphs", "_name", "_nodes")

    def __init__(self, graphs: Sequence[TrustGraph], *, name: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise TopologyError(f"A schedule needs a non-empty name, not {name!r}.")
        graphs = tuple(graphs)
        if not graphs:
            raise TopologyError(f"Schedule '{name}' has no graphs; give at least one.")
        nodes = graphs[0].nodes
        for t, graph in enumerate(graphs):
            if not isinstance(graph, TrustGraph):
                raise TopologyError(
                    f"Round {t} of schedule '{name}' is a {type(graph).__name__}, not a TrustGraph."
                )
            if graph.nodes != nodes:
                raise TopologyError(
                    f"Round {t} of schedule '{name}' has the nodes {format_nodes(graph.nodes)}, "
                    f"but round 0 has {format_nodes(nodes)}. Every round must list the same "
                    "nodes in the same order."
                )
        self._name = name
        self._graphs = graphs
        self._nodes = nodes

    @property
    def name(self) -> str:
        """The schedule's name."""
        return self._name

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node ids in their stable order, shared by every round's graph."""
        return self._nodes

    @property
    def graphs(self) -> tuple[TrustGraph, ...]:
        """The graphs of one period, round 0 first."""
        return self._graphs

    @property
    def period(self) -> int:
        """The number of rounds after which the schedule repeats."""
        return len(self._graphs)

    def at(self, round: int) -> TrustGraph:
        """The graph used in ``round``: ``graphs[round % period]``."""
        return self._graphs[round % len(self._graphs)]

    def union(self) -> TrustGraph:
        """The union of one period's edge sets, without weights, named like the schedule."""
        if len(self._graphs) == 1:
            src, dst, _ = self._graphs[0].index_edges()
        else:  # in numpy passes: a period of many graphs (an epidemic schedule's) is millions
            src = np.concatenate([g.index_edges()[0] for g in self._graphs])
            dst = np.concatenate([g.index_edges()[1] for g in self._graphs])
        # the ids are a graph's own, checked when it was made; a repeated edge counts once
        return TrustGraph.from_index_edges(
            src, dst, name=self._name, nodes=self._nodes, trusted_ids=True
        )

    def index(self, node: str) -> int:
        """The position of ``node`` in :attr:`nodes`."""
        return self._graphs[0].index(node)

    def is_strongly_connected(self) -> bool:
        """Whether the union of one period is strongly connected."""
        return self.union().is_strongly_connected()

    def strongly_connected_components(self) -> list[list[str]]:
        """Strongly connected components of the union of one period."""
        return self.union().strongly_connected_components()

    def is_symmetric(self) -> bool:
        """Whether every round's edge set is symmetric."""
        return all(g.is_symmetric() for g in self._graphs)

    def has_weights(self) -> bool:
        """Whether every round's graph carries mixing weights."""
        return all(g.has_weights() for g in self._graphs)

    def map(self, fn: Callable[[TrustGraph], TrustGraph]) -> Schedule:
        """A schedule with ``fn`` applied to each round's graph."""
        return Schedule([fn(g) for g in self._graphs], name=self._name)

    def with_weights(self, weights: Sequence[Mapping[tuple[str, str], float]]) -> Schedule:
        """A schedule whose round ``t`` graph carries ``weights[t]`` (see TrustGraph)."""
        if len(weights) != len(self._graphs):
            raise TopologyError(
                f"Schedule '{self._name}' has {len(self._graphs)} rounds, but {len(weights)} "
                "weight mappings were given. Give one mapping a round."
            )
        return Schedule(
            [g.with_weights(w) for g, w in zip(self._graphs, weights, strict=True)],
            name=self._name,
        )

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return f"Schedule({self._name!r}, {len(self)} nodes, period {self.period})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self._name == other._name and self._graphs == other._graphs

    def __hash__(self) -> int:
        return hash((self._name, self._graphs))


Topology: TypeAlias = TrustGraph | Schedule
"""Anything that gives a graph per round: a static :class:`TrustGraph` or a :class:`Schedule`."""
