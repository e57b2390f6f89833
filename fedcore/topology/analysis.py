"""Spectral gap and the human-readable summary behind ``fedcore topology show``.

The spectral gap ``1 - |lambda_2(W)|`` of a mixing matrix bounds how fast repeated mixing
reaches consensus: the distance to the average shrinks roughly by ``|lambda_2|`` a round, so a
gap near 1 mixes in a few rounds and a gap near 0 needs many.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import numpy.typing as npt

from fedcore.errors import TopologyError
from fedcore.topology.graph import TrustGraph
from fedcore.topology.schedule import Schedule, Topology
from fedcore.topology.validation import format_components, format_nodes
from fedcore.topology.weights import (
    check_doubly_stochastic,
    check_push_sum,
    metropolis_hastings,
    uniform_push_sum,
)

__all__ = ["describe", "spectral_gap"]

logger = logging.getLogger(__name__)

_MAX_SPECTRAL_NODES = 2000
"""describe() skips the spectral gap above this many nodes."""

_DENSE_GAP_NODES = 500
"""Up to this many nodes the gap comes from every eigenvalue of the dense matrix (O(n**3):
a tenth of a second at 500 nodes, tens of seconds at 2,000 for a one-way graph); above it
from the three largest of the sparse matrix (ARPACK, agreeing to about 1e-12)."""

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


def _sparse(g: TrustGraph) -> object:
    """``g``'s mixing matrix (weights as :func:`spectral_gap` takes them) as a CSR matrix."""
    from scipy import sparse

    g = _default_weighted(g)
    index = {node: i for i, node in enumerate(g.nodes)}
    rows, cols, values = [], [], []
    for u, v, w in g.weighted_edges():
        rows.append(index[u])
        cols.append(index[v])
        values.append(w or 0.0)
    n = len(g.nodes)
    return sparse.csr_matrix((values, (rows, cols)), shape=(n, n), dtype=np.float64)


def _second_modulus_sparse(graphs: tuple[TrustGraph, ...]) -> float | None:
    """The second-largest eigenvalue modulus of ``W_0 W_1 ... W_{B-1}`` from ARPACK, or
    None where ARPACK does not converge (the caller then takes the dense way).

    ARPACK converges in milliseconds to a second on graphs whose second modulus stands
    apart (social, random-regular, torus, exponential, a one-peer schedule); moduli that
    cluster near 1 (a directed ring of thousands of nodes) make it give up instead.
    """
    from scipy.sparse.linalg import ArpackError, LinearOperator, eigs

    matrices = [_sparse(g) for g in graphs]
    n = len(graphs[0].nodes)

    def apply(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        for matrix in reversed(matrices):
            x = matrix @ x  # type: ignore[operator]
        return x

    operator = LinearOperator((n, n), matvec=apply, dtype=np.float64)
    start = np.random.default_rng(0).random(n)  # seeded: the same gap every run
    try:
        values = eigs(
            operator, k=3, which="LM", v0=start, tol=1e-12, maxiter=1000, return_eigenvectors=False
        )
    except ArpackError:  # clustered moduli (a long directed ring): give up in a second or two
        logger.info("ARPACK found no gap of %s; computing every eigenvalue", graphs[0].name)
        return None
    moduli = np.sort(np.abs(values))
    second = float(moduli[-2])
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
    Above ``_DENSE_GAP_NODES`` nodes only the three largest eigenvalues of the sparse
    matrices are computed (seconds at most where the dense way takes minutes).
    """
    if not isinstance(t, Schedule | TrustGraph):
        raise TopologyError(f"Expected a TrustGraph or Schedule, not {type(t).__name__}.")
    began = time.perf_counter()
    modulus = None
    if len(t) > _DENSE_GAP_NODES:
        graphs = t.graphs if isinstance(t, Schedule) else (t,)
        modulus = _second_modulus_sparse(graphs)
        if modulus is not None and isinstance(t, Schedule):
            modulus = float(modulus ** (1.0 / t.period))
    if modulus is None:
        modulus = _dense_modulus(t)
    logger.info(
        "spectral gap of %s (%d nodes): %.3g s", t.name, len(t), time.perf_counter() - began
    )
    return min(1.0, max(0.0, 1.0 - modulus))


def _dense_modulus(t: Topology) -> float:
    """``|lambda_2|`` (a Schedule: per round) from every eigenvalue of the dense matrix."""
    if isinstance(t, Schedule):
        product = np.eye(len(t), dtype=np.float64)
        for g in t.graphs:
            product = product @ _default_weighted(g).mixing_matrix()
        return float(_second_modulus(product) ** (1.0 / t.period))
    assert isinstance(t, TrustGraph)
    return _second_modulus(_default_weighted(t).mixing_matrix())


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
