"""Mixing weights: uniform push-sum, Metropolis–Hastings, and their validation.

Two families of decentralized algorithms need two kinds of weights (``weight(u, v)`` is the
share of u's value that v receives; ``W[i, j] = weight(nodes[i], nodes[j])``):

* **Push-sum** (OPS, SGP) needs each *sender's* weights, self included, to sum to 1, so the
  total mass is preserved on any strongly connected digraph, one-way edges included.
* **Gossip averaging** (D-PSGD, DOG, DeepSqueeze, CHOCO) needs doubly stochastic weights, which
  keep the plain average; the standard Metropolis–Hastings rule gives them on undirected graphs.

:func:`prepare` checks that a topology fits an algorithm's mixing family and returns it with
valid weights: the graph's own (from a file, checked) or the family's default.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from fedcore.errors import TopologyError
from fedcore.topology.graph import TrustGraph
from fedcore.topology.schedule import Schedule, Topology
from fedcore.topology.validation import format_components, format_nodes

__all__ = [
    "MAX_MIXING_PAIRS",
    "MIXINGS",
    "TOLERANCE",
    "check_doubly_stochastic",
    "check_mixing_size",
    "check_push_sum",
    "metropolis_hastings",
    "prepare",
    "require_strongly_connected",
    "uniform_push_sum",
]

TOLERANCE = 1e-9
"""How far a weight sum may stray from 1 and still count as 1."""

MIXINGS: tuple[str, ...] = (
    "push-sum",
    "doubly-stochastic",
    "complete",
    "all-pairs",
    "none",
    "star",
)

MAX_MIXING_PAIRS = 10**7
"""Most ordered pairs the ``complete`` and ``all-pairs`` mixings may weigh (3,162 nodes):
each is an edge of the weighted graph, a few hundred bytes, so 10**7 are gigabytes already
(the bound of :func:`fedcore.topology.complete` too)."""


def check_mixing_size(n: int, *, mixing: str, algorithm: str) -> None:
    """Refuse, from the node count alone, a mixing whose graph would be too large to build.

    The ``complete`` and ``all-pairs`` mixings weigh every ordered pair of nodes, so they
    grow as ``n**2``; the others keep the trust graph's edges.

    Raises:
        TopologyError: ``n * (n - 1)`` pairs above :data:`MAX_MIXING_PAIRS`, naming the
            largest node count that fits.
    """
    if mixing not in ("complete", "all-pairs") or n * (n - 1) <= MAX_MIXING_PAIRS:
        return
    most = (1 + math.isqrt(1 + 4 * MAX_MIXING_PAIRS)) // 2
    while most * (most - 1) > MAX_MIXING_PAIRS:
        most -= 1
    raise TopologyError(
        f"The algorithm '{algorithm}' mixes over every pair of nodes: {n:,} nodes make "
        f"{n * (n - 1):,} ordered pairs, more than the {MAX_MIXING_PAIRS:,} a graph may hold. "
        f"Use at most {most:,} nodes, or an algorithm that mixes over the trust graph's edges."
    )


def _per_graph(t: Topology, fn: Callable[[TrustGraph], TrustGraph]) -> Topology:
    if isinstance(t, Schedule):
        return t.map(fn)
    if isinstance(t, TrustGraph):
        return fn(t)
    raise TopologyError(f"Expected a TrustGraph or Schedule, not {type(t).__name__}.")


def _out_degrees(g: TrustGraph) -> npt.NDArray[np.int64]:
    src, _, _ = g.index_edges()
    return np.bincount(src, minlength=len(g.nodes))


def _push_sum_graph(g: TrustGraph) -> TrustGraph:
    src, _, _ = g.index_edges()
    share = 1.0 / (_out_degrees(g) + 1)
    return g.with_weight_arrays(share[src], share)


def _sender_sums(
    w: npt.NDArray[np.float64], degree: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Each sender's weights summed one after another in edge order (edges grouped by
    sender, ``degree`` of them each), as
    a per-sender Python loop ``total += w`` adds them: the same float, bit for bit."""
    n = degree.size
    start = np.zeros(n, dtype=np.int64)
    np.cumsum(degree[:-1], out=start[1:])
    by_degree = np.argsort(-degree, kind="stable")
    ranked = degree[by_degree]
    total = np.zeros(n, dtype=np.float64)
    for k in range(int(ranked[0]) if n else 0):
        rows = by_degree[: int(np.searchsorted(-ranked, -k, side="left"))]  # degree > k
        total[rows] += w[start[rows] + k]
    return total


def uniform_push_sum(t: Topology) -> Topology:
    """Uniform push-sum weights: each sender splits its value evenly over itself and its
    out-neighbours, ``1 / (out-degree + 1)`` each. Works on any digraph; a Schedule gets them
    round by round. Existing weights are replaced."""
    return _per_graph(t, _push_sum_graph)


def _one_way_message(g: TrustGraph, edge: tuple[str, str], need: str, fix: str) -> str:
    u, v = edge
    return f"{need}, but graph '{g.name}' is one-way: {u} -> {v} has no {v} -> {u}. {fix}"


def _mh_graph(g: TrustGraph) -> TrustGraph:
    edge = g.first_one_way_edge()
    if edge is not None:
        raise TopologyError(
            _one_way_message(
                g,
                edge,
                "Metropolis–Hastings weights need an undirected (symmetric) trust graph",
                "Use push-sum weights (uniform_push_sum) and a push-sum algorithm on one-way "
                "graphs.",
            )
        )
    src, dst, _ = g.index_edges()
    degree = _out_degrees(g)
    w = 1.0 / (1 + np.maximum(degree[src], degree[dst]))
    return g.with_weight_arrays(w, 1.0 - _sender_sums(w, degree))


def metropolis_hastings(t: Topology) -> Topology:
    """Metropolis–Hastings weights ``w_uv = 1 / (1 + max(deg u, deg v))``, self = 1 - the rest.

    They are symmetric and doubly stochastic with a positive self weight, the usual default of
    gossip averaging (Xiao and Boyd, 2004). Needs a symmetric edge set.

    Raises:
        TopologyError: If a graph has a one-way edge; the message points to push-sum.
    """
    return _per_graph(t, _mh_graph)


def require_strongly_connected(t: Topology) -> None:
    """Raise TopologyError naming the components if ``t`` (its union) is not strongly connected."""
    if t.is_strongly_connected():
        return
    components = t.strongly_connected_components()
    if len(components) > 1:
        union = (
            " For a schedule this is the union of the rounds of one period."
            if isinstance(t, Schedule)
            else ""
        )
        raise TopologyError(
            f"The trust graph '{t.name}' is not strongly connected: it has {len(components)} "
            f"strongly connected components: {format_components(components)}; every peer's "
            "model must be able to reach every other peer. Add edges so that every node can "
            f"reach every other, for example a cycle through one member of each component.{union}"
        )


def _sums(g: TrustGraph) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Total weight each node sends and receives, self included, per node index, without
    a dense matrix.

    Raises:
        TopologyError: If the graph has no weights.
    """
    selfs = g.self_weights()  # raises the standard "no mixing weights" error
    src, dst, w = g.index_edges()
    assert w is not None
    n = len(g.nodes)
    sent = np.bincount(src, weights=w, minlength=n) + selfs
    received = np.bincount(dst, weights=w, minlength=n) + selfs
    return sent, received


def _first_off_one(sums: npt.NDArray[np.float64]) -> int | None:
    """The first index whose sum strays from 1 by more than :data:`TOLERANCE`."""
    off = np.abs(sums - 1.0) > TOLERANCE
    return int(np.argmax(off)) if off.any() else None


def check_push_sum(g: TrustGraph) -> None:
    """Check that ``g``'s weights are push-sum weights.

    Weights are non-negative (TrustGraph guarantees it), each sender's weights (self included)
    sum to 1 within :data:`TOLERANCE`, and every self weight is positive (push-sum divides by
    the weight a node keeps, so a node must keep some). Works without a dense matrix, so it
    scales to graphs of many thousand nodes.

    Raises:
        TopologyError: Naming the first sender (in node order) that breaks a rule.
    """
    sent, _ = _sums(g)
    selfs = g.self_weights()
    fix = "Fix the weights in the graph, or remove them all to use uniform push-sum weights."
    off = np.abs(sent - 1.0) > TOLERANCE
    bad = off | (selfs <= 0.0)
    if not bad.any():
        return
    i = int(np.argmax(bad))
    u = g.nodes[i]
    if off[i]:
        raise TopologyError(
            f"Push-sum weights of graph '{g.name}' are invalid: sender {u}'s weights, self "
            f"included, sum to {float(sent[i])!r} instead of 1 (within {TOLERANCE:g}). {fix}"
        )
    raise TopologyError(
        f"Push-sum weights of graph '{g.name}' are invalid: node {u} has self weight "
        f"{float(selfs[i])!r}, but push-sum needs a positive self weight on every "
        f"node (a self-loop {u} -> {u} with a weight above 0). {fix}"
    )


def check_doubly_stochastic(g: TrustGraph) -> None:
    """Check that ``g``'s weights are doubly stochastic: rows and columns sum to 1.

    Weights are non-negative (TrustGraph guarantees it); what each node sends and what it
    receives, self included, must each sum to 1 within :data:`TOLERANCE`.

    Raises:
        TopologyError: Naming the first node whose sent or received weights do not sum to 1.
    """
    sent, received = _sums(g)
    fix = "Fix the weights in the graph, or remove them all to use Metropolis–Hastings weights."
    for sums, role in ((sent, "sends"), (received, "receives")):
        i = _first_off_one(sums)
        if i is not None:
            raise TopologyError(
                f"Weights of graph '{g.name}' are not doubly stochastic: the weights node "
                f"{g.nodes[i]} {role}, self included, sum to {float(sums[i])!r} instead of 1 "
                f"(within {TOLERANCE:g}). {fix}"
            )


def _require_all_pairs(t: Topology, algorithm: str) -> None:
    """Raise TopologyError naming the first ordered pair that is not an edge in some round."""
    graphs = t.graphs if isinstance(t, Schedule) else (t,)
    nodes = t.nodes
    for r, g in enumerate(graphs):
        for u in nodes:
            out = g.out_neighbours(u)
            if len(out) == len(nodes) - 1:
                continue
            targets = set(out)
            v = next(v for v in nodes if v != u and v not in targets)
            where = f"graph '{g.name}'"
            if isinstance(t, Schedule):
                where += f" (round {r} of schedule '{t.name}')"
            raise TopologyError(
                f"The algorithm '{algorithm}' needs every worker to reach every block owner: "
                f"every ordered pair of distinct nodes must be an edge in every round, but "
                f"{where} has no edge {u} -> {v}. Use a complete trust graph: "
                'topology.kind = "complete" has every pair.'
            )


def _prepare_push_sum(g: TrustGraph) -> TrustGraph:
    if g.has_weights():
        check_push_sum(g)
        return g
    return _push_sum_graph(g)


def _prepare_doubly_stochastic(g: TrustGraph) -> TrustGraph:
    if g.has_weights():
        check_doubly_stochastic(g)
        return g
    return _mh_graph(g)


def _prepare_star(t: Topology, server: str | None, algorithm: str) -> TrustGraph:
    """The star around ``server`` in ``t``: every other node a worker with an edge to the
    server and one back; worker-to-worker edges are dropped (the family never uses them).
    Weights: ``1 / workers`` on each worker -> server edge (the server's plain average),
    1 on each server -> worker edge, no self-loops."""
    if isinstance(t, Schedule):
        raise TopologyError(
            f"The algorithm '{algorithm}' runs on a fixed star, not on the schedule '{t.name}'."
        )
    if not server or server not in t.nodes:
        raise TopologyError(
            f"The algorithm '{algorithm}' needs its server {server!r} (topology.server) in the "
            f"graph '{t.name}', whose nodes are {format_nodes(t.nodes)}. Use topology.kind = "
            "'star', or name the graph's server with topology.server."
        )
    workers = [v for v in t.nodes if v != server]
    if not workers:
        raise TopologyError(f"The star '{t.name}' has a server and no worker.")
    edges = set(t.edges())
    for w in workers:
        for edge in ((w, server), (server, w)):
            if edge not in edges:
                raise TopologyError(
                    f"The algorithm '{algorithm}' needs edges both ways between its server "
                    f"{server!r} and every worker, but graph '{t.name}' has no edge "
                    f"{edge[0]} -> {edge[1]}."
                )
    star = [pair for w in workers for pair in ((w, server), (server, w))]
    graph = TrustGraph.from_edges(star, name=t.name, nodes=t.nodes)
    share = 1.0 / len(workers)
    weights = {(w, server): share for w in workers} | {(server, w): 1.0 for w in workers}
    return graph.with_weights(weights)


def prepare(t: Topology, *, mixing: str, algorithm: str, server: str | None = None) -> Topology:
    """Check that ``t`` suits an algorithm and return it with valid mixing weights.

    Args:
        t: A graph or schedule, with or without weights.
        mixing: The algorithm's mixing family: ``"push-sum"`` (needs strong connectivity; the
            graph's weights are checked with :func:`check_push_sum`, else uniform push-sum),
            ``"doubly-stochastic"`` (needs a symmetric edge set in every round and strong
            connectivity; weights are checked with :func:`check_doubly_stochastic`, else
            Metropolis–Hastings), ``"complete"`` (uniform ``1/n`` between every pair of nodes,
            ignoring the edges: the CENTRAL reference point), ``"all-pairs"`` (every ordered
            pair of distinct nodes must be an edge in every round, as RPS sends to every
            block owner; the result is the complete graph with uniform ``1/n`` weights, which
            RPS does not use for mixing), ``"none"`` (self-loops only: local training) or
            ``"star"`` (the server family: edges both ways between ``server`` and every
            other node, see :func:`_prepare_star`).
        algorithm: The algorithm's registry name, used in messages.
        server: The server's id (``"star"`` mixing only).

    Raises:
        TopologyError: On an unknown mixing, a one-way graph for doubly stochastic mixing, a
            missing pair for all-pairs mixing (the first one is named), a topology that is not
            strongly connected (over one period for a Schedule), invalid weights, or too many
            nodes for a complete or all-pairs mixing (:func:`check_mixing_size`).
    """
    if mixing == "star":
        return _prepare_star(t, server, algorithm)
    if mixing in ("complete", "all-pairs", "none"):
        nodes = t.nodes
        n = len(nodes)
        check_mixing_size(n, mixing=mixing, algorithm=algorithm)
        if mixing == "all-pairs":
            _require_all_pairs(t, algorithm)
        if mixing in ("complete", "all-pairs"):
            src, dst = np.divmod(np.arange(n * n, dtype=np.int64), n)
            pairs = src != dst
            name = t.name if mixing == "all-pairs" else f"complete-{n}"
            graph = TrustGraph.from_index_edges(src[pairs], dst[pairs], name=name, nodes=nodes)
            return graph.with_weight_arrays(np.full(n * (n - 1), 1.0 / n), np.full(n, 1.0 / n))
        graph = TrustGraph.from_index_edges([], [], name=f"isolated-{n}", nodes=nodes)
        return graph.with_weight_arrays(np.zeros(0), np.ones(n))
    if mixing == "push-sum":
        require_strongly_connected(t)
        return _per_graph(t, _prepare_push_sum)
    if mixing == "doubly-stochastic":
        graphs = t.graphs if isinstance(t, Schedule) else (t,)
        for g in graphs:
            edge = g.first_one_way_edge()
            if edge is not None:
                raise TopologyError(
                    _one_way_message(
                        g,
                        edge,
                        f"The algorithm '{algorithm}' needs an undirected (symmetric) trust graph "
                        "with doubly stochastic weights",
                        "Use a push-sum algorithm such as 'ops' on one-way graphs.",
                    )
                )
        require_strongly_connected(t)
        return _per_graph(t, _prepare_doubly_stochastic)
    raise TopologyError(
        f"Algorithm '{algorithm}' asks for the unknown mixing {mixing!r}. "
        f"Use one of: {', '.join(MIXINGS)}."
    )
