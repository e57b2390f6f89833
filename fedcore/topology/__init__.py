"""Trust graphs, time-varying schedules, generators, mixing weights and graph files.

An edge ``u -> v`` of a trust graph means v trusts u: u sends to v. Mixing weights live on the
edge attribute ``weight`` (self-loops carry self weights). The usual path from a config to a
graph that an algorithm can run on is::

    topology = prepare(parse_spec("social:32"), mixing="push-sum", algorithm="ops")
    graph = load("topologies/ring-8.json")
    topology = prepare(graph, mixing="doubly-stochastic", algorithm="dpsgd")
"""

from __future__ import annotations

from fedcore.topology.analysis import describe, spectral_gap
from fedcore.topology.generators import (
    complete,
    erdos_renyi,
    exponential,
    one_peer_exponential,
    random_regular,
    ring,
    social,
    torus,
)
from fedcore.topology.graph import NodeId, TrustGraph
from fedcore.topology.io import load, save
from fedcore.topology.kinds import KINDS, build, parse_spec
from fedcore.topology.schedule import Schedule, Topology
from fedcore.topology.weights import metropolis_hastings, prepare, uniform_push_sum

__all__ = [
    "KINDS",
    "NodeId",
    "Schedule",
    "Topology",
    "TrustGraph",
    "build",
    "complete",
    "describe",
    "erdos_renyi",
    "exponential",
    "load",
    "metropolis_hastings",
    "one_peer_exponential",
    "parse_spec",
    "prepare",
    "random_regular",
    "ring",
    "save",
    "social",
    "spectral_gap",
    "torus",
    "uniform_push_sum",
]
