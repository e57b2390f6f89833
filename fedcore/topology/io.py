"""Reading and writing trust graph files: JSON edge lists, plain edge lists and GraphML.

The format follows the file suffix.

**JSON edge list** (``.json``), the format of the shipped ``topologies/`` files::

    {"name": "ring-8", "directed": true, "nodes": ["n0", "n1", ...],
     "edges": [["n0", "n1"], ["n1", "n0", 0.5], {"source": "n0", "target": "n0", "weight": 0.5}]}

* ``edges`` (required) lists ``[u, v]``, ``[u, v, weight]`` or objects with ``source``,
  ``target`` and optional ``weight``. An edge ``u -> v`` means v trusts u: u sends to v.
* ``directed`` (default true): false means each edge goes both ways, a weight then applying to
  both directions.
* A self-loop ``[u, u, w]`` gives u's self weight. Weights are on every edge and self-loop or on
  none; each is a finite number >= 0.
* ``nodes`` (optional) fixes the node order; without it nodes come in order of first use in
  ``edges``. When given, edges may only use listed nodes. Ids are strings (integers are turned
  into strings) that are safe names: 1 to 63 ASCII letters, digits, ``.``, ``_`` or ``-``,
  starting with a letter or digit (:mod:`fedcore.ids`).
* ``name`` (optional, default the file's stem) and ``description`` (optional, free text).

**Plain edge list** (``.edgelist``, ``.txt``, ``.edges``), always directed: one ``u v`` or
``u v weight`` a line; a line with a single id declares a node (which fixes its place in the
node order); ``#`` starts a comment and blank lines are skipped. A first line ``# name: NAME``
names the graph.

**GraphML** (``.graphml``) through networkx: directed or undirected (each undirected edge is
taken both ways), with an optional numeric ``weight`` edge attribute and ``name`` graph
attribute.

Every problem (missing file, bad syntax, wrong types, unsafe or unknown node ids, bad or partial
weights, an empty or single-node graph) raises :class:`~fedcore.errors.TopologyError` naming the
file and the problem.
"""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from fedcore.errors import TopologyError
from fedcore.ids import clip, unsafe_id
from fedcore.topology.graph import TrustGraph
from fedcore.topology.schedule import Schedule

__all__ = ["SUFFIXES", "load", "save"]

_PLAIN = (".edgelist", ".txt", ".edges")
SUFFIXES: tuple[str, ...] = (".json", ".graphml", *_PLAIN)
_JSON_KEYS = ("name", "directed", "nodes", "edges", "description")

_Edge = tuple[str, str, float | None]


class _FileProblem(Exception):
    """A problem in a file's content; load() turns it into a TopologyError naming the file."""


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TopologyError(
            f"Graph file '{path}' has the suffix {suffix or '(none)'!r}, which names no known "
            f"format. Use one of: {', '.join(SUFFIXES)}."
        )
    return suffix


def _node_id(value: object, where: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise _FileProblem(
            f"{where} has the node id {clip(value, 40)}, but node ids must be strings"
        )
    message = unsafe_id(value, where)
    if message is not None:
        raise _FileProblem(message)
    return value


def _weight(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _FileProblem(f"{where} has the weight {value!r}, but weights must be numbers.")
    weight = float(value)
    if not math.isfinite(weight) or weight < 0:
        raise _FileProblem(
            f"{where} has the weight {weight!r}, but weights must be finite and non-negative."
        )
    return weight


def _assemble(name: str, nodes: list[str], edges: list[_Edge], labels: list[str]) -> TrustGraph:
    """Check edges for duplicates and partial weights and build the graph.

    ``labels[i]`` says where edge i came from ("entry 3", "line 7") for messages.
    """
    import networkx as nx  # here: `topology show` of a generated kind needs none

    if not nodes:
        raise _FileProblem("the graph is empty: it has no nodes and no edges")
    if len(nodes) == 1:
        raise _FileProblem(
            f"the graph has a single node ({nodes[0]}), but a trust graph needs at least two "
            "nodes (the generators refuse one as well); add the other peers"
        )
    weighted = [i for i, e in enumerate(edges) if e[2] is not None]
    if weighted and len(weighted) != len(edges):
        first = edges[weighted[0]]
        bare = next(i for i, e in enumerate(edges) if e[2] is None)
        raise _FileProblem(
            f"{labels[weighted[0]]} ({first[0]} -> {first[1]}) has a weight but {labels[bare]} "
            f"({edges[bare][0]} -> {edges[bare][1]}) has none; give weights on every edge and "
            "self-loop or on none"
        )
    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    seen: dict[tuple[str, str], str] = {}
    for (u, v, w), label in zip(edges, labels, strict=True):
        if (u, v) in seen:
            raise _FileProblem(
                f"the edge {u} -> {v} is listed twice ({seen[(u, v)]} and {label}); list each "
                "edge once (in an undirected file one entry stands for both directions)"
            )
        seen[(u, v)] = label
        if w is None:
            graph.add_edge(u, v)
        else:
            graph.add_edge(u, v, weight=w)
    return TrustGraph(graph, name=name, nodes=nodes)


def _read_json(path: Path, text: str) -> TrustGraph:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _FileProblem(
            f"it is not valid JSON: line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None
    if not isinstance(data, dict):
        raise _FileProblem(f"the top level must be a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - set(_JSON_KEYS))
    if unknown:
        raise _FileProblem(
            f"it has the unknown key(s) {', '.join(unknown)}; the keys are {', '.join(_JSON_KEYS)}"
        )
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise _FileProblem(f"'name' must be a non-empty string, not {name!r}")
    directed = data.get("directed", True)
    if not isinstance(directed, bool):
        raise _FileProblem(f"'directed' must be true or false, not {directed!r}")
    if "edges" not in data:
        raise _FileProblem("it has no 'edges' list")
    raw_edges = data["edges"]
    if not isinstance(raw_edges, list):
        raise _FileProblem(f"'edges' must be a list, not {type(raw_edges).__name__}")
    listed: list[str] | None = None
    if "nodes" in data:
        raw_nodes = data["nodes"]
        if not isinstance(raw_nodes, list):
            raise _FileProblem(f"'nodes' must be a list, not {type(raw_nodes).__name__}")
        listed = [_node_id(n, f"node entry {i}") for i, n in enumerate(raw_nodes)]
        if len(set(listed)) != len(listed):
            dup = next(n for n in listed if listed.count(n) > 1)
            raise _FileProblem(f"'nodes' lists the node {dup!r} twice")
    nodes: dict[str, None] = dict.fromkeys(listed or [])
    edges: list[_Edge] = []
    labels: list[str] = []
    for i, entry in enumerate(raw_edges):
        where = f"edge entry {i}"
        if isinstance(entry, list) and len(entry) in (2, 3):
            u, v, w = entry[0], entry[1], entry[2] if len(entry) == 3 else None
        elif isinstance(entry, dict) and {"source", "target"} <= set(entry) <= {
            "source",
            "target",
            "weight",
        }:
            u, v, w = entry["source"], entry["target"], entry.get("weight")
        else:
            raise _FileProblem(
                f"{where} is {json.dumps(entry)}, but an edge is [u, v], [u, v, weight] or "
                '{"source": u, "target": v, "weight": w} with the weight optional'
            )
        u, v = _node_id(u, where), _node_id(v, where)
        weight = None if w is None else _weight(w, where)
        for node in (u, v):
            if listed is not None and node not in nodes:
                raise _FileProblem(
                    f"{where} uses the node {node!r}, which is not in 'nodes'; add it there or "
                    "fix the edge"
                )
            nodes.setdefault(node)
        edges.append((u, v, weight))
        labels.append(where)
        if not directed and u != v:
            edges.append((v, u, weight))
            labels.append(f"{where} (reversed)")
    return _assemble(name, list(nodes), edges, labels)


def _read_plain(path: Path, text: str) -> TrustGraph:
    name = path.stem
    nodes: dict[str, None] = {}
    edges: list[_Edge] = []
    labels: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        content, _, comment = line.partition("#")
        if number == 1 and not content.strip() and comment.strip().startswith("name:"):
            name = comment.strip()[len("name:") :].strip() or name
        fields = content.split()
        where = f"line {number}"
        if not fields:
            continue
        if len(fields) > 3:
            raise _FileProblem(
                f"{where} has {len(fields)} fields, but a line is 'u v', 'u v weight' or a "
                "single node id"
            )
        weight = None
        if len(fields) == 3:
            try:
                value = float(fields[2])
            except ValueError:
                raise _FileProblem(
                    f"{where} has the weight {fields[2]!r}, which is not a number"
                ) from None
            weight = _weight(value, where)
        for node in fields[:2]:
            nodes.setdefault(_node_id(node, where))
        if len(fields) >= 2:
            edges.append((fields[0], fields[1], weight))
            labels.append(where)
    return _assemble(name, list(nodes), edges, labels)


def _read_graphml(path: Path) -> TrustGraph:
    import networkx as nx

    try:
        graph = nx.read_graphml(path)
    except (ET.ParseError, nx.NetworkXError, ValueError, KeyError, TypeError) as e:
        raise _FileProblem(f"it is not valid GraphML: {e}") from None
    if graph.is_multigraph():
        raise _FileProblem("it has parallel edges; list each edge once")
    name = graph.graph.get("name") or path.stem
    if not isinstance(name, str):
        name = str(name)
    directed = bool(graph.is_directed())
    edges: list[_Edge] = []
    labels: list[str] = []
    ids = {n: _node_id(n, "the GraphML node list") for n in graph.nodes}
    for u, v, attrs in graph.edges(data=True):
        where = f"the edge {ids[u]} -> {ids[v]}"
        value = attrs.get("weight")
        weight = None if value is None else _weight(value, where)
        edges.append((ids[u], ids[v], weight))
        labels.append(where)
        if not directed and u != v:
            edges.append((ids[v], ids[u], weight))
            labels.append(f"the edge {ids[v]} -> {ids[u]}")
    return _assemble(name, list(ids.values()), edges, labels)


def load(path: str | os.PathLike[str]) -> TrustGraph:
    """Read a trust graph from a file; the suffix picks the format (see the module docstring).

    Raises:
        TopologyError: If the file is missing or unreadable, or its content is not a valid
            graph; the message names the file and the problem.
    """
    file = Path(path)
    suffix = _suffix(file)
    if not file.is_file():
        what = "is a directory, not a file" if file.is_dir() else "does not exist"
        raise TopologyError(f"Graph file '{file}' {what}. Check the path.")
    try:
        if suffix == ".graphml":
            return _read_graphml(file)
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise _FileProblem(f"it is not UTF-8 text ({e.reason} at byte {e.start})") from None
        return _read_json(file, text) if suffix == ".json" else _read_plain(file, text)
    except (_FileProblem, TopologyError) as e:
        raise TopologyError(f"Cannot load graph file '{file}': {str(e).rstrip('.')}.") from None
    except OSError as e:
        raise TopologyError(f"Cannot read graph file '{file}': {e.strerror or e}.") from None


def _undirected_form(g: TrustGraph) -> bool:
    """Whether the graph can be written as an undirected file without losing anything."""
    if not g.is_symmetric():
        return False
    if not g.has_weights():
        return True
    return all(g.weight(u, v) == g.weight(v, u) for u, v in g.edges())


def _json_text(g: TrustGraph) -> str:
    undirected = _undirected_form(g)
    entries: list[list[Any]] = []
    for u, v, w in g.weighted_edges():
        if undirected and g.index(u) > g.index(v):
            continue
        entries.append([u, v] if w is None else [u, v, w])
    lines = [
        "{",
        f'  "name": {json.dumps(g.name)},',
        f'  "directed": {json.dumps(not undirected)},',
        f'  "nodes": {json.dumps(list(g.nodes))},',
        '  "edges": [',
        ",\n".join(f"    {json.dumps(e)}" for e in entries),
        "  ]",
        "}",
    ]
    if not entries:
        del lines[5]
    return "\n".join(lines) + "\n"


def _plain_text(g: TrustGraph) -> str:
    lines = [f"# name: {g.name}", "# nodes, in order"]
    lines += list(g.nodes)
    lines.append("# edges: sender receiver [weight]")
    for u, v, w in g.weighted_edges():
        lines.append(f"{u} {v}" if w is None else f"{u} {v} {w!r}")
    return "\n".join(lines) + "\n"


def save(t: TrustGraph, path: str | os.PathLike[str]) -> None:
    """Write a trust graph to a file; the suffix picks the format (see the module docstring).

    JSON files are written undirected (each pair once) when that loses nothing: the edge set
    and any weights are symmetric. Weights are written exactly (``repr`` of the float).

    Raises:
        TopologyError: For a Schedule (save one graph a round), an unknown suffix or a file
            that cannot be written.
    """
    if isinstance(t, Schedule):
        raise TopologyError(
            f"Schedule '{t.name}' cannot be saved as one graph file; save each round's graph "
            "(schedule.graphs) or its union (schedule.union()) instead."
        )
    if not isinstance(t, TrustGraph):
        raise TopologyError(f"Only a TrustGraph can be saved, not {type(t).__name__}.")
    file = Path(path)
    suffix = _suffix(file)
    try:
        if suffix == ".graphml":
            import networkx as nx

            nx.write_graphml(t.digraph, file)
        elif suffix == ".json":
            file.write_text(_json_text(t), encoding="utf-8")
        else:
            file.write_text(_plain_text(t), encoding="utf-8")
    except OSError as e:
        raise TopologyError(f"Cannot write graph file '{file}': {e.strerror or e}.") from None
