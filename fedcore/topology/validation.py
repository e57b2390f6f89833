"""What a trust graph is built from must be: safe node ids, none differing from another only
in case, a node order that lists each node once, finite non-negative weights; and node
lists as the error messages show them (:func:`format_nodes`, :func:`format_components`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

from fedcore.errors import TopologyError
from fedcore.ids import clip, unsafe_id

_Ints: TypeAlias = npt.NDArray[np.int64]
_Floats: TypeAlias = npt.NDArray[np.float64]

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["format_components", "format_nodes"]


def format_nodes(nodes: Sequence[str], limit: int = 8) -> str:
    """Join node ids for a message, keeping long listings short.

    Args:
        nodes: The ids to list, in the order to show them.
        limit: How many ids to show before summarising the rest as ``... (+N more)``.

    Returns:
        Text such as ``"n0, n1, n2"`` or ``"n0, n1, ... (+30 more)"``.
    """
    shown = ", ".join(nodes[:limit])
    if len(nodes) > limit:
        return f"{shown}, ... (+{len(nodes) - limit} more)"
    return shown


def format_components(components: Sequence[Sequence[str]], limit: int = 10) -> str:
    """Format strongly connected components as ``[n0, n1], [n2], ...`` for error messages."""
    parts = [f"[{format_nodes(c)}]" for c in components[:limit]]
    if len(components) > limit:
        parts.append(f"... (+{len(components) - limit} more components)")
    return ", ".join(parts)


def _check_node_id(node: object, graph_name: str) -> str:
    message = unsafe_id(node, f"Graph {clip(graph_name, 60)}")
    if message is not None:
        raise TopologyError(
            f"{message}. Relabel the nodes, for example with "
            "networkx.relabel_nodes(graph, lambda i: f'n{i}')."
        )
    assert isinstance(node, str)
    return node


def _check_case_collisions(order: Sequence[str], graph_name: str) -> None:
    """Refuse ids that differ only in case: they name one folder on case-insensitive file
    systems and one DNS name in certificates (which compare without case)."""
    seen: dict[str, str] = {}
    for node in order:
        other = seen.setdefault(node.lower(), node)
        if other != node:
            raise TopologyError(
                f"Graph {clip(graph_name, 60)} has the node ids {other!r} and {node!r}, which "
                "differ only in case: they would share a folder on case-insensitive file "
                "systems and a DNS name in certificates. Rename one of them."
            )


def _check_weight(value: object, u: str, v: str, graph_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TopologyError(
            f"Graph '{graph_name}' has weight {value!r} on edge {u} -> {v}, but weights must be "
            "numbers. Give a number between 0 and 1."
        )
    weight = float(value)
    if not math.isfinite(weight) or weight < 0.0:
        raise TopologyError(
            f"Graph '{graph_name}' has weight {weight!r} on edge {u} -> {v}, but weights must be "
            "finite and non-negative. Give a number between 0 and 1."
        )
    return weight


def _check_order(order: tuple[str, ...], name: str, *, empty_ok: bool = False) -> None:
    """Refuse a node order with a repeated id, ids differing only in case, or (unless
    ``empty_ok``) no node."""
    if len(set(order)) != len(order):
        dups = sorted({n for n in order if order.count(n) > 1})
        raise TopologyError(f"Graph '{name}' lists the nodes {format_nodes(dups)} twice.")
    _check_case_collisions(order, name)
    if not order and not empty_ok:
        raise TopologyError(f"Graph '{name}' has no nodes; a trust graph needs at least one.")


def _node_order(graph: nx.DiGraph, nodes: Sequence[str] | None, name: str) -> tuple[str, ...]:
    """The node order of ``graph`` (``nodes``, or the graph's insertion order), its ids
    checked: safe, distinct, at least one, and exactly the graph's nodes."""
    order = tuple(graph.nodes) if nodes is None else tuple(nodes)
    for node in order if nodes is None else (*order, *graph.nodes):
        _check_node_id(node, name)
    _check_order(order, name, empty_ok=True)
    if set(order) != set(graph.nodes):
        missing = [str(n) for n in graph.nodes if n not in set(order)]
        extra = [n for n in order if not graph.has_node(n)]
        raise TopologyError(
            f"The node order given for graph '{name}' does not match its nodes: "
            f"missing {format_nodes(missing) or 'none'}, "
            f"unknown {format_nodes(extra) or 'none'}. "
            "List every node of the graph exactly once."
        )
    if not order:
        _check_order(order, name)  # no node at all
    return order


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise TopologyError(f"A trust graph needs a non-empty name, not {name!r}.")


def _edge_arrays(
    src: npt.ArrayLike,
    dst: npt.ArrayLike,
    weight: npt.ArrayLike | None,
    order: tuple[str, ...],
    name: str,
) -> tuple[_Ints, _Ints, _Floats]:
    """Edge arrays as :meth:`TrustGraph.from_index_edges` takes them, checked: as many
    senders as receivers (and weights), indices into ``order``, weights finite and
    non-negative or NaN (none); the weights NaN where ``weight`` is None."""
    n = len(order)
    s = np.asarray(src, dtype=np.int64).reshape(-1)
    d = np.asarray(dst, dtype=np.int64).reshape(-1)
    if s.shape != d.shape:
        raise TopologyError(f"Graph '{name}': {s.size} senders but {d.size} receivers.")
    if s.size and (min(int(s.min()), int(d.min())) < 0 or max(int(s.max()), int(d.max())) >= n):
        raise TopologyError(f"Graph '{name}' has an edge index outside its {n} nodes.")
    if weight is None:
        w = np.full(s.size, math.nan)
    else:
        w = np.array(weight, dtype=np.float64).reshape(-1)
        if w.shape != s.shape:
            raise TopologyError(f"Graph '{name}': {w.size} weights for {s.size} edges.")
        bad = ~np.isnan(w) & ~(np.isfinite(w) & (w >= 0.0))
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            _check_weight(float(w[e]), order[s[e]], order[d[e]], name)
    return s, d, w
