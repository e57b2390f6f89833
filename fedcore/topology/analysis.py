"""Spectral gap and the human-readable summary behind ``fedcore topology show``.

The spectral gap ``1 - |lambda_2(W)|`` of a mixing matrix bounds how fast repeated mixing
reaches consensus: the distance to the average shrinks roughly by ``|lambda_2|`` a round, so a
gap near 1 mixes in a few rounds and a gap near 0 needs many.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fedcore.errors import TopologyError
from fedcore.topology.graph import TrustGraph, format_components, format_nodes
from fedcore.topology.schedule import Schedule, Topology
from fedcore.topology.weights import (
    check_doubly_stochastic,
    check_push_sum,
    metropolis_hastings,
    uniform_push_sum,
)

__all__ = ["describe", "spectral_gap"]

_MAX_SPECTRAL_NODES = 2000
"""describe() skips the O(n^3) eigenvalue computation above this many nodes."""

_MAX_LISTED_NODES = 20

_NOISE = 1e-12
"""Eigenvalue moduli below this are rounding noise and count as 0 (a Schedule takes a root)."""


def _default_weighted(g: TrustGraph) -> TrustGraph:
    """``g`` itself if it has weights, else ``g`` with its family's default weights."""
    if g.has_weights():
        return g
    result = metropolis_hastings(g) if g.is_symmetric() else uniform_push_sum(g)
    assert isinstance(result, TrustGraph)
    return result


def _second_modulus(matrix: npt.NDArray[np.float64]) -> float:
    if matrix.shape[0] < 2:
        return 0.0
    if np.array_equal(matrix, matrix.T):
        values = np.abs(np.linalg.eigvalsh(matrix))
    else:
        values = np.abs(np.linalg.eigvals(matrix))
    values.sort()
    second = float(values[-2])
    return 0.0 if second < _NOISE else second


def spectral_gap(t: Topology) -> float:
    """The spectral gap ``1 - |lambda_2|`` of a topology's mixing matrix, in [0, 1].

    For a TrustGraph, ``lambda_2`` is the eigenvalue of second-largest modulus of
    :meth:`TrustGraph.mixing_matrix`. A graph without weights is measured with the weights
    :func:`prepare` would give it: Metropolis–Hastings on a symmetric edge set, uniform push-sum
    on a one-way one.

    For a Schedule the mixing of one period is the product ``P = W_0 W_1 ... W_{B-1}`` (rows
    are senders, so B rounds map ``x`` to ``P.T @ x``), and the gap is reported per round:
    ``1 - |lambda_2(P)| ** (1 / B)``, comparable with a static graph's gap.

    A single node has gap 1. A graph that is not strongly connected has gap 0 (or close).
    Moduli below 1e-12 count as 0, so exact averaging in one period gives a gap of exactly 1.
    """
    if isinstance(t, Schedule):
        product = np.eye(len(t), dtype=np.float64)
        for g in t.graphs:
            product = product @ _default_weighted(g).mixing_matrix()
        modulus = float(_second_modulus(product) ** (1.0 / t.period))
    elif isinstance(t, TrustGraph):
        modulus = _second_modulus(_default_weighted(t).mixing_matrix())
    else:
        raise TopologyError(f"Expected a TrustGraph or Schedule, not {type(t).__name__}.")
    return min(1.0, max(0.0, 1.0 - modulus))


def _weights_line(t: Topology) -> str:
    graphs = t.graphs if isinstance(t, Schedule) else (t,)
    if not all(g.has_weights() for g in graphs):
        default = (
            "Metropolis–Hastings for gossip algorithms"
            if all(g.is_symmetric() for g in graphs)
            else "uniform push-sum (the graph is one-way, so only push-sum algorithms fit)"
        )
        return f"weights: none in the graph (or its file); the default is {default}"
    fits = []
    for label, check in (
        ("push-sum", check_push_sum),
        ("doubly stochastic", check_doubly_stochastic),
    ):
        try:
            for g in graphs:
                check(g)
        except TopologyError:
            continue
        fits.append(label)
    return (
        "weights: given in the graph (or its file), valid as "
        f"{' and '.join(fits) if fits else 'neither push-sum nor doubly stochastic weights'}"
    )


def describe(t: Topology, *, gap_max_nodes: int = _MAX_SPECTRAL_NODES) -> str:
    """A multi-line summary of a topology for ``fedcore topology show``.

    Lists the name, whether edges are one-way, the nodes, edge count, strong connectivity (and
    the components when it fails), degree ranges, spectral gap, the period of a Schedule and
    where the mixing weights come from.

    Args:
        t: The graph or schedule.
        gap_max_nodes: Skip the spectral gap, an O(n^3) computation, above this many nodes.
    """
    union = t.union()
    symmetric = t.is_symmetric()
    lines = [f"name: {t.name}"]
    if isinstance(t, Schedule):
        lines.append(f"kind: schedule repeating every {t.period} rounds")
    lines.append(
        "directed: no (undirected: every edge goes both ways)"
        if symmetric
        else "directed: yes (one-way edges)"
    )
    listed = (
        ", ".join(t.nodes) if len(t.nodes) <= _MAX_LISTED_NODES else format_nodes(t.nodes, limit=8)
    )
    lines.append(f"nodes: {len(t)} ({listed})")
    edges = len(union.edges())
    pairs = f" ({edges // 2} undirected pairs)" if symmetric else ""
    if isinstance(t, Schedule):
        low = min(len(g.edges()) for g in t.graphs)
        high = max(len(g.edges()) for g in t.graphs)
        counts = str(low) if low == high else f"{low}-{high}"
        lines.append(f"edges: {counts} a round, {edges} over one period{pairs}")
    else:
        lines.append(f"edges: {edges} directed{pairs}")
    components = union.strongly_connected_components()
    if len(components) == 1:
        lines.append(
            "strongly connected: yes" + (" (over one period)" if isinstance(t, Schedule) else "")
        )
    else:
        lines.append(
            f"strongly connected: no, {len(components)} components: {format_components(components)}"
        )
    lo_in, hi_in, lo_out, hi_out = union.degree_range()
    scope = " (union of one period)" if isinstance(t, Schedule) else ""
    lines.append(f"in-degree: {lo_in}..{hi_in}, out-degree: {lo_out}..{hi_out}{scope}")
    if len(t) <= gap_max_nodes:
        rate = " per round over one period" if isinstance(t, Schedule) else ""
        lines.append(f"spectral gap: {spectral_gap(t):.6f}{rate}")
    else:
        lines.append(f"spectral gap: not computed for more than {gap_max_nodes} nodes")
    lines.append(_weights_line(t))
    return "\n".join(lines)
