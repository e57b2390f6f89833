"""The graphs of a run's set-up: the trust graph ``[topology]`` names (a graph file, or its
kind's generator), what building it will cost (:func:`estimated_edges`, from the counts
alone), the weighted graph an algorithm communicates over (:func:`communication_graph`)
and the checks of that graph against the config (:func:`check_graph`, of the
:class:`GraphInputs`: what this stage reads of a config).

:mod:`fedcore.setup.plan` decides when each is built and checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedcore import registry, topology
from fedcore.algorithms import Algorithm
from fedcore.config import Config, FaultsConfig, TopologyConfig
from fedcore.errors import ConfigError, TopologyError
from fedcore.topology import Topology

__all__ = [
    "GraphInputs",
    "build_topology",
    "check_graph",
    "communication_graph",
    "estimated_edges",
    "period_graphs",
    "with_rounds",
]


@dataclass(frozen=True, slots=True)
class GraphInputs:
    """What the graph stage reads of a config (:func:`GraphInputs.of`).

    Attributes:
        topology: ``[topology]``, the trust graph to build.
        faults: ``[faults]``, whose ``edge_drop`` must name edges of the weighted graph.
        algorithm_name: ``algorithm.name`` as configured, which the refusals name.
    """

    topology: TopologyConfig
    faults: FaultsConfig
    algorithm_name: str

    @classmethod
    def of(cls, config: Config) -> GraphInputs:
        """The graph stage's part of ``config`` (``topology.period`` 0 read as the rounds)."""
        return cls(
            with_rounds(config.topology, config.run.rounds), config.faults, config.algorithm.name
        )


def with_rounds(cfg: TopologyConfig, rounds: int) -> TopologyConfig:
    """``cfg`` with ``period = 0`` read as ``rounds`` for a kind that takes a period (an
    epidemic schedule: a fresh graph every round of the run); any other ``cfg`` as it is."""
    if cfg.period or cfg.file or "period" not in registry.TOPOLOGY_KINDS.entry(cfg.kind).keys:
        return cfg
    return dataclasses.replace(cfg, period=rounds)


def build_topology(cfg: TopologyConfig) -> Topology:
    """The trust graph of ``[topology]``: the file if one is given, else the generator."""
    if cfg.file:
        if cfg.undirected:
            raise ConfigError("topology.undirected applies to generated graphs, not to files.")
        return topology.load(cfg.file)
    kind = registry.TOPOLOGY_KINDS.entry(cfg.kind)
    params = {k: getattr(cfg, k) for k in kind.keys}  # its parameters: [topology]'s keys
    if "unset-at-0" in kind.tags:
        params = {k: v for k, v in params.items() if v}
    built = topology.build(cfg.kind, nodes=cfg.nodes, seed=cfg.seed, **params)
    if not cfg.undirected:
        return built
    if not isinstance(built, topology.TrustGraph):
        raise ConfigError(f"topology.undirected does not apply to the schedule {cfg.kind!r}.")
    if not built.is_symmetric():
        edges = built.edges()
        return topology.TrustGraph.from_edges(
            [*edges, *((v, u) for u, v in edges)],
            name=f"{built.name}-undirected",
            nodes=built.nodes,
        )
    return built


def estimated_edges(cfg: TopologyConfig, nodes: int) -> int:
    """About how many edges (over one period, self-loops included) the generator of
    ``[topology]`` makes for ``nodes`` nodes, from the counts alone: what building the graph
    will cost before it is built. A ``file`` is not estimated (0)."""
    if cfg.file:
        return 0
    edges = registry.TOPOLOGY_KINDS.entry(cfg.kind).edges
    assert edges is not None  # every kind says its estimate
    return edges(nodes, cfg)


def period_graphs(t: Topology) -> tuple[topology.TrustGraph, ...]:
    """The graphs of one period of ``t`` (a TrustGraph is its own one)."""
    return tuple(t.at(r) for r in range(t.period))


def communication_graph(algorithm: Algorithm, trust: Topology) -> Topology:
    """The weighted graph ``algorithm`` communicates over, validated for it."""
    return topology.prepare(
        trust,
        mixing=algorithm.mixing,
        algorithm=algorithm.name,
        server=algorithm.server,
    )


def check_graph(
    inputs: GraphInputs, algorithm: Algorithm, trust: Topology, graph: Topology, nodes: int
) -> None:
    """Refuse a weighted graph the config cannot run on: a schedule for an algorithm of
    one fixed graph, a dropped edge that is no edge, or a node count other than the one
    the run was shaped (and its data split) for (``nodes``)."""
    if graph.period > 1 and algorithm.fixed_graph:
        raise ConfigError(
            f"algorithm {inputs.algorithm_name!r} runs on a fixed graph, but the topology "
            f"{trust.name!r} changes every round (a schedule of {graph.period} graphs). "
            "Use a static topology kind (fedcore topology show lists a schedule's)."
        )
    edge_drop = inputs.faults.edge_drop
    edges_used = (
        {e for t in range(graph.period) for e in graph.at(t).edges()} if edge_drop else set()
    )
    for text in edge_drop:
        sender, _, receiver = (part.strip() for part in text.partition("->"))
        known = sender in graph.nodes and receiver in graph.nodes  # else the plan says so
        if known and (sender, receiver) not in edges_used:
            raise ConfigError(
                f"faults.edge_drop names {text!r}, but {sender} sends {receiver} nothing: it "
                f"is not an edge of the graph {inputs.algorithm_name!r} communicates over. "
                "Name an edge of the graph (fedcore topology show prints them)."
            )
    if len(graph.nodes) != nodes:  # a generator always makes n nodes; never split wrongly
        raise TopologyError(
            f"topology.nodes = {nodes}, but the graph {trust.name!r} has {len(graph.nodes)} nodes."
        )
