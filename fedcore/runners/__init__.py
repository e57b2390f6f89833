"""Runners: how a config becomes a run (in-process simulation here)."""

from __future__ import annotations

from fedcore.runners.network import Network, build_network, build_topology, communication_graph
from fedcore.runners.simulate import simulate

__all__ = ["Network", "build_network", "build_topology", "communication_graph", "simulate"]
