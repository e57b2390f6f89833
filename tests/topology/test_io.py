"""Tests of graph files: round trips in every format, every error path, the shipped files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fedcore.errors import TopologyError
from fedcore.topology import (
    TrustGraph,
    exponential,
    load,
    metropolis_hastings,
    one_peer_exponential,
    ring,
    save,
    social,
    torus,
    uniform_push_sum,
)

SHIPPED = Path(__file__).resolve().parents[2] / "topologies"
SUFFIXES = [".json", ".graphml", ".edgelist", ".txt", ".edges"]


def asymmetric_weights() -> TrustGraph:
    """A symmetric edge set with one-way weights: must be written as a directed file."""
    g = ring(3)
    weights = dict.fromkeys(g.edges(), 0.25) | {(u, u): 0.5 for u in g.nodes}
    weights[("n0", "n1")] = 0.1
    weights[("n0", "n0")] = 0.65
    return g.with_weights(weights)


def graphs() -> list[TrustGraph]:
    out = [ring(8), social(32, seed=0), torus(2, 3)]
    for t in (metropolis_hastings(torus(3, 3)), uniform_push_sum(social(16, seed=2))):
        assert isinstance(t, TrustGraph)
        out.append(t)
    return [*out, asymmetric_weights()]


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("graph", graphs(), ids=lambda g: f"{g.name}-w{int(g.has_weights())}")
def test_round_trip(tmp_path: Path, suffix: str, graph: TrustGraph) -> None:
    path = tmp_path / f"graph{suffix}"
    save(graph, path)
    loaded = load(str(path))
    assert loaded == graph
    assert loaded.nodes == graph.nodes
    assert loaded.has_weights() == graph.has_weights()
    if graph.has_weights():
        assert (loaded.mixing_matrix() == graph.mixing_matrix()).all()


def test_json_is_undirected_only_when_lossless(tmp_path: Path) -> None:
    for graph, directed in [(ring(8), False), (exponential(8), True), (asymmetric_weights(), True)]:
        save(graph, tmp_path / "g.json")
        data = json.loads((tmp_path / "g.json").read_text())
        assert data["directed"] is directed
        assert data["name"] == graph.name


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


def test_json_edge_forms(tmp_path: Path) -> None:
    content = {
        "directed": False,
        "edges": [
            {"source": 1, "target": "b", "weight": 0.5},
            ["b", "c", 0.5],
            ["1", "1", 0.5],
            ["b", "b", 0.0],
            {"source": "c", "target": "c", "weight": 0.5},
        ],
    }
    g = load(write(tmp_path, "shape.json", json.dumps(content)))
    assert g.name == "shape"
    assert g.nodes == ("1", "b", "c")
    assert set(g.edges()) == {("1", "b"), ("b", "1"), ("b", "c"), ("c", "b")}
    assert g.weight("b", "1") == 0.5
    assert g.self_weight("b") == 0.0


def test_json_node_list_fixes_order(tmp_path: Path) -> None:
    content = {"name": "ordered", "nodes": ["z", "a", "lonely"], "edges": [["a", "z"]]}
    g = load(write(tmp_path, "o.json", json.dumps(content)))
    assert g.nodes == ("z", "a", "lonely")
    assert g.out_neighbours("a") == ("z",)
    assert not g.is_strongly_connected()


def test_plain_format_comments_and_declarations(tmp_path: Path) -> None:
    text = "# name: tiny\n\na b 0.5 # trailing comment\nb a 1\na a 0.5\n  # only a comment\nc\n"
    g = load(write(tmp_path, "tiny.txt", text))
    assert g.name == "tiny"
    assert g.nodes == ("a", "b", "c")
    assert g.weight("a", "b") == 0.5
    assert g.weight("b", "a") == 1.0


def test_graphml_undirected_means_both_ways(tmp_path: Path) -> None:
    text = """<?xml version="1.0" encoding="UTF-8"?>
<graphml xmlns="http://graphml.graphdrawing.org/xmlns">
  <graph edgedefault="undirected">
    <node id="a"/><node id="b"/><node id="c"/>
    <edge source="a" target="b"/><edge source="b" target="c"/>
  </graph>
</graphml>
"""
    g = load(write(tmp_path, "u.graphml", text))
    assert g.name == "u"
    assert g.nodes == ("a", "b", "c")
    assert g.is_symmetric()
    assert len(g.edges()) == 4


GRAPHML_HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<graphml xmlns="http://graphml.graphdrawing.org/xmlns">
  <key id="w" for="edge" attr.name="weight" attr.type="{type}"/>
  <graph edgedefault="directed">
    <node id="a"/><node id="b"/>
"""

ERROR_CASES: list[tuple[str, str, str]] = [
    ("bad.json", '{"edges": [\n  ["a", "b"],\n  ["b" "a"]\n]}', "not valid JSON: line 3"),
    ("list.json", '[["a", "b"]]', "top level must be a JSON object"),
    ("key.json", '{"edge": [["a", "b"]]}', "unknown key"),
    ("noedges.json", '{"name": "x"}', "no 'edges' list"),
    ("edgesdict.json", '{"edges": {"a": "b"}}', "'edges' must be a list"),
    ("name.json", '{"name": 3, "edges": [["a", "b"]]}', "'name' must be a non-empty string"),
    ("dir.json", '{"directed": "yes", "edges": [["a", "b"]]}', "'directed' must be true or false"),
    ("nodes.json", '{"nodes": "ab", "edges": [["a", "b"]]}', "'nodes' must be a list"),
    ("dupnode.json", '{"nodes": ["a", "a"], "edges": []}', "lists the node 'a' twice"),
    ("shape.json", '{"edges": [["a"]]}', "edge entry 0 is"),
    ("extra.json", '{"edges": [{"source": "a", "target": "b", "w": 1}]}', "edge entry 0 is"),
    ("type.json", '{"edges": [["a", 1.5]]}', "node id 1.5"),
    ("null.json", '{"edges": [[null, "b"]]}', "node id None"),
    ("bool.json", '{"edges": [[true, "b"]]}', "node id True"),
    ("unknown.json", '{"nodes": ["a", "b"], "edges": [["a", "c"]]}', "node 'c', which is not in"),
    ("neg.json", '{"edges": [["a", "b", -0.5]]}', "weight -0.5"),
    ("nan.json", '{"edges": [["a", "b", NaN]]}', "finite"),
    ("strw.json", '{"edges": [["a", "b", "0.5"]]}', "weights must be numbers"),
    ("partial.json", '{"edges": [["a", "b", 0.5], ["b", "a"]]}', "has a weight but"),
    ("empty.json", '{"edges": []}', "empty"),
    ("twice.json", '{"edges": [["a", "b"], ["a", "b"]]}', "listed twice"),
    ("both.json", '{"directed": false, "edges": [["a", "b"], ["b", "a"]]}', "listed twice"),
    ("space.json", '{"edges": [["a b", "c"]]}', "whitespace"),
    ("fields.txt", "a b 0.5 extra\n", "line 1 has 4 fields"),
    ("weight.edges", "a b\nb a half\n", "line 2 has the weight 'half'"),
    ("inf.edgelist", "a b inf\n", "finite"),
    ("neg.txt", "a b -1\n", "non-negative"),
    ("partial.txt", "a b 1\nb a\n", "has a weight but"),
    ("empty.txt", "# nothing here\n\n", "empty"),
    ("dup.txt", "a b\na b\n", "listed twice"),
    ("broken.graphml", "<graphml><graph>", "not valid GraphML"),
    (
        "partial.graphml",
        GRAPHML_HEAD.format(type="double")
        + '<edge source="a" target="b"><data key="w">0.5</data></edge>'
        + '<edge source="b" target="a"/></graph></graphml>',
        "has a weight but",
    ),
    (
        "strw.graphml",
        GRAPHML_HEAD.format(type="string")
        + '<edge source="a" target="b"><data key="w">heavy</data></edge></graph></graphml>',
        "weights must be numbers",
    ),
    (
        "empty.graphml",
        GRAPHML_HEAD.format(type="double").replace('<node id="a"/><node id="b"/>', "")
        + "</graph></graphml>",
        "empty",
    ),
]


@pytest.mark.parametrize(
    ("name", "content", "needle"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES]
)
def test_file_errors(tmp_path: Path, name: str, content: str, needle: str) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(TopologyError) as info:
        load(path)
    message = str(info.value)
    assert needle in message
    assert str(path) in message


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes(b"a b\n\xff\xfe c\n")
    with pytest.raises(TopologyError, match="not UTF-8"):
        load(path)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: d / "missing.json", "does not exist"),
        (lambda d: d, "suffix"),
        (lambda d: d / "graph.csv", "suffix '.csv'"),
        (lambda d: (d / "folder.json").mkdir() or d / "folder.json", "is a directory"),
    ],
)
def test_path_errors(tmp_path: Path, make: Callable[[Path], Path], needle: str) -> None:
    with pytest.raises(TopologyError, match=needle):
        load(make(tmp_path))


def test_save_errors(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="save each round's graph"):
        save(one_peer_exponential(8), tmp_path / "s.json")  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match=r"suffix '\.csv'"):
        save(ring(4), tmp_path / "g.csv")
    with pytest.raises(TopologyError, match="Cannot write graph file"):
        save(ring(4), tmp_path / "no" / "such" / "dir.json")


SHIPPED_FILES = {
    "ring-8.json": ring(8),
    "exponential-16.json": exponential(16),
    "torus-4x4.json": torus(4, 4),
    "social-32.json": social(32, seed=0),
}


@pytest.mark.parametrize(("name", "expected"), SHIPPED_FILES.items())
def test_shipped_topologies_match_generators(name: str, expected: TrustGraph) -> None:
    loaded = load(SHIPPED / name)
    assert loaded == expected
    assert loaded.is_strongly_connected()
    assert not loaded.has_weights()
    assert name in (SHIPPED / "README.md").read_text(encoding="utf-8")
