"""Node ids are safe names everywhere they enter, and paths built from them stay inside.

Entry points: graphs (``TrustGraph`` from networkx or from edges, each graph file format),
rosters (JSON and TOML), certificates (``certs init --nodes``, ``load_tls``), the peer
folders of ``launch`` and ``summarize`` (``nodes/<id>/``), the command line (``--id``,
``--nodes``) and the fault plan (``faults.edge_drop``, ``partitions``, ``crashes``).
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcore.certs import init_certs, load_tls
from fedcore.config import FaultsConfig, load_config
from fedcore.deploy.roster import load_roster
from fedcore.deploy.summarize import peer_dir, summarize
from fedcore.errors import ConfigError, FedcoreError, TopologyError
from fedcore.ids import MAX_ID_LENGTH, check_node_id, child_path, clip, error_text, id_problem
from fedcore.simulation.results import default_out_dir
from fedcore.topology import TrustGraph, load
from tests.clitools import one_line_error

UNSAFE = ["../../esc", "..", ".", "a/b", "a\\b", "", " n0", "n 0", "-n0", ".n0", "_n0", "n0:1"]
UNSAFE += ["ünï", "n\x00", "n\n", "x" * (MAX_ID_LENGTH + 1)]
SAFE = ["n0", "alice", "server", "Bob", "n.1", "n_1", "n-1", "0", "x" * MAX_ID_LENGTH]
TINY = ["--set", "run.rounds=2", "--set", "topology.kind=ring", "--set", "topology.nodes=4"]


# --- the rule -------------------------------------------------------------------------------


@pytest.mark.parametrize("node", SAFE)
def test_safe_ids_are_accepted(node: str) -> None:
    assert id_problem(node) is None
    assert check_node_id(node, "here") == node


@pytest.mark.parametrize("node", UNSAFE)
def test_unsafe_ids_are_refused_naming_where_and_the_rule(node: str) -> None:
    with pytest.raises(ConfigError, match=r"the roster has the node id .* not a safe name") as info:
        check_node_id(node, "the roster", ConfigError)
    assert "ASCII letters, digits" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        ("a/b", "path separator '/'"),
        ("..", "parent folder"),
        ("n 0", "whitespace"),
        ("ünï", "non-ASCII character 'ü', which a certificate cannot carry in a DNS name"),
        ("n\x07", "control character"),
        ("-n0", "starts with '-'"),
        ("n0:1", "contains ':'"),
        ("", "empty"),
        ("x" * 64, "64 characters (at most 63)"),
        (3, "strings, not int"),
    ],
)
def test_the_reason_names_what_to_change(node: object, reason: str) -> None:
    problem = id_problem(node)
    assert problem is not None and reason in problem


def test_a_huge_id_costs_one_short_line() -> None:
    with pytest.raises(FedcoreError) as info:
        check_node_id("x" * 1_000_000, "the roster")
    assert len(str(info.value)) < 400
    assert clip("y" * 500, 20).endswith("more characters)")


def test_error_text_is_one_bounded_line() -> None:
    text = error_text(RuntimeError("first line\nframe #0 ...\nframe #1 ..."))
    assert text == "RuntimeError: first line [...]"
    assert len(error_text(ValueError("z" * 10_000))) < 400
    assert error_text(KeyError()) == "KeyError"


@given(st.text(max_size=80))
def test_accepted_ids_give_paths_inside_their_parent(node: str) -> None:
    parent = Path("/srv/run/nodes")
    if id_problem(node) is None:
        path = child_path(parent, node)
        assert path.parent == parent
        assert path.name == node
    if "/" in node or node in (".", ".."):
        assert id_problem(node) is not None
        with pytest.raises(FedcoreError):
            child_path(parent, node)


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", fullmatch=True))
def test_every_id_of_the_rule_is_accepted_and_stays_inside(node: str) -> None:
    assert check_node_id(node, "x") == node
    assert child_path(Path("runs"), node).parent == Path("runs")


@given(st.lists(st.sampled_from(["..", ".", "a", "/", "\\"]), min_size=1, max_size=6))
def test_names_with_separators_or_dots_never_leave_the_parent(parts: list[str]) -> None:
    name = "".join(parts)
    try:
        path = child_path(Path("base"), name)
    except FedcoreError:
        return
    assert path.parent == Path("base") and name not in (".", "..")


@pytest.mark.parametrize("name", ["..", ".", "a/b", "../x", "/etc", "a\\b", "", "a\x00"])
def test_child_path_refuses_what_is_not_one_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a file or folder"):
        child_path(tmp_path, name, ConfigError)


# --- trust graphs and graph files -----------------------------------------------------------


@pytest.mark.parametrize("node", ["../../esc", "..", "a/b", "ünï", "n0 "])
def test_graphs_from_edges_and_networkx_refuse_unsafe_ids(node: str) -> None:
    with pytest.raises(TopologyError, match="not a safe name"):
        TrustGraph.from_edges([("n1", node), (node, "n1")], name="g", nodes=["n1", node])
    with pytest.raises(TopologyError, match="not a safe name"):
        TrustGraph(nx.DiGraph([("n1", node), (node, "n1")]), name="g")
    # A node the order leaves out is checked too, before it shows up in a message.
    with pytest.raises(TopologyError, match="not a safe name"):
        TrustGraph(nx.DiGraph([("n1", node), (node, "n1")]), name="g", nodes=["n1"])


def test_ids_that_differ_only_in_case_are_refused() -> None:
    with pytest.raises(TopologyError, match="'n0' and 'N0', which differ only in case"):
        TrustGraph.from_edges([("n0", "N0"), ("N0", "n0")], name="g", nodes=["n0", "N0"])


GRAPHML = (
    '<?xml version="1.0" encoding="UTF-8"?>'
    '<graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
    '<graph edgedefault="directed"><node id="n0"/><node id="{bad}"/>'
    '<edge source="n0" target="{bad}"/><edge source="{bad}" target="n0"/></graph></graphml>'
)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("edges.json", json.dumps({"edges": [["n0", "../../esc"], ["../../esc", "n0"]]})),
        ("nodes.json", json.dumps({"nodes": ["n0", ".."], "edges": [["n0", ".."]]})),
        ("objects.json", json.dumps({"edges": [{"source": "a/b", "target": "n0"}]})),
        ("plain.edgelist", "n0 ../../esc\n../../esc n0\n"),
        ("plain.txt", "n0\n..\nn0 .. 0.5\n.. n0 0.5\n"),
        ("plain.edges", "ünï n0\n"),
        ("file.graphml", GRAPHML.format(bad="../../esc")),
    ],
)
def test_every_graph_file_format_refuses_unsafe_ids(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TopologyError, match=rf"Cannot load graph file .*{name}.*not a safe name"):
        load(path)


def test_graph_files_with_safe_ids_still_load(tmp_path: Path) -> None:
    path = tmp_path / "g.graphml"
    path.write_text(GRAPHML.format(bad="alice"), encoding="utf-8")
    assert load(path).nodes == ("n0", "alice")
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"edges": [[0, 1], [1, 0]]}), encoding="utf-8")
    assert load(path).nodes == ("0", "1")


def test_cli_refuses_a_graph_file_with_an_escaping_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.json").write_text(
        json.dumps({"edges": [["n0", "../../esc"], ["../../esc", "n0"]]}), encoding="utf-8"
    )
    for command in ("simulate", "launch"):
        argv = [command, "-q", "--out", "run", "--set", "topology.file=g.json"]
        one_line_error(capsys, argv, "'../../esc'", "not a safe name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]  # nothing written


def test_a_graph_name_cannot_move_the_default_run_folder() -> None:
    for name in ("ops-../../../esc", "../..", "a/b\\c", "", "ü" * 300):
        path = default_out_dir(name)
        assert path.parent == Path("runs"), path
        assert ".." not in path.parts and len(path.name) <= 120


# --- rosters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("r.json", json.dumps({"n0": "10.0.0.1:7000", "../x": "10.0.0.2:7000"})),
        ("r.toml", '[peers]\nn0 = "10.0.0.1:7000"\n"a/b" = "10.0.0.2:7000"\n'),
        ("u.toml", '[peers]\n"ünï" = "10.0.0.2:7000"\n'),
    ],
)
def test_rosters_refuse_unsafe_ids(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"roster .*{name}.* has the node id .*not a safe name"):
        load_roster(path)


def test_rosters_with_safe_ids_load_and_bad_ports_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "r.toml"
    good.write_text('[peers]\nn0 = "10.0.0.1:7000"\nalice = "host.lan:7001"\n', "utf-8")
    assert load_roster(good) == {"n0": "10.0.0.1:7000", "alice": "host.lan:7001"}
    for address in ("host:70000", "host:0", "host:٣", "host:" + "9" * 5000, "host", 7000):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"n0": address}), encoding="utf-8")
        with pytest.raises(ConfigError, match="is not 'HOST:PORT'"):
            load_roster(bad)


# --- certificates ---------------------------------------------------------------------------


@pytest.mark.parametrize("node", ["../esc", "..", "a/b", "ünï", "n 0"])
def test_certs_init_refuses_unsafe_ids_and_writes_nothing(tmp_path: Path, node: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a certificate"):
        init_certs(["n0", node], tmp_path / "certs")
    assert not list(tmp_path.iterdir())


def test_certs_init_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    line = one_line_error(capsys, ["certs", "init", "--nodes", "n0", "../esc", "--out", str(out)])
    assert "'../esc'" in line and "not a safe name" in line
    line = one_line_error(capsys, ["certs", "init", "--nodes", "ünï", "--out", str(out)])
    assert "non-ASCII" in line and "DNS name" in line
    assert not out.exists()


def test_load_tls_refuses_an_unsafe_id_before_reading(tmp_path: Path) -> None:
    init_certs(["n0"], tmp_path / "certs")
    (tmp_path / "esc.crt").write_bytes((tmp_path / "certs" / "n0.crt").read_bytes())
    (tmp_path / "esc.key").write_bytes((tmp_path / "certs" / "n0.key").read_bytes())
    with pytest.raises(ConfigError, match="cannot name a certificate"):
        load_tls(tmp_path / "certs", "../esc")
    assert load_tls(tmp_path / "certs", "n0").cert


def test_certs_force_skips_stray_files_that_are_no_node_id(tmp_path: Path) -> None:
    init_certs(["n0"], tmp_path)
    (tmp_path / "not an id.crt").write_text("stray", encoding="utf-8")
    written = {p.name for p in init_certs(["n0"], tmp_path, force=True)}
    assert written == {"ca.crt", "ca.key", "n0.crt", "n0.key"}


# --- launch, summarize, compose: peer folders -----------------------------------------------


@pytest.mark.parametrize("node", ["..", "../x", "a/b", "", "."])
def test_peer_folders_stay_inside_the_run_folder(tmp_path: Path, node: str) -> None:
    with pytest.raises(ConfigError, match="cannot name a file or folder"):
        peer_dir(tmp_path, node)
    assert peer_dir(tmp_path, "n0") == tmp_path / "nodes" / "n0"


def test_summarize_refuses_a_graph_with_unsafe_ids(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(
        json.dumps({"edges": [["n0", ".."], ["..", "n0"]]}), encoding="utf-8"
    )
    config = load_config(None, [f"topology.file={tmp_path / 'g.json'}", "run.rounds=2"])
    with pytest.raises(TopologyError, match="not a safe name"):
        summarize(tmp_path, config)


def test_compose_nodes_refuses_unsafe_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roster = tmp_path / "roster.json"
    roster.write_text(json.dumps({f"n{i}": f"10.0.0.{i + 1}:7000" for i in range(4)}), "utf-8")
    argv = ["compose", "--out", str(tmp_path / "c"), "--nodes", "n0,../x", "--roster", str(roster)]
    one_line_error(capsys, [*argv, *TINY], "--nodes", "'../x'")
    assert not (tmp_path / "c").exists()


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize("node", ["../x", "..", "a/b", "ünï"])
def test_fedcore_node_refuses_an_unsafe_id_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    node: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text("[run]\nrounds = 2\n", encoding="utf-8")
    (tmp_path / "r.json").write_text(json.dumps({"n0": "127.0.0.1:7000"}), encoding="utf-8")
    argv = ["node", "--config", "c.toml", "--id", node, "--roster", "r.json"]
    one_line_error(capsys, argv, "--id has the node id", "not a safe name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "r.json"]


def test_fedcore_health_refuses_an_unsafe_id(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(capsys, ["health", "127.0.0.1:1", "--id", "../x"], "--id", "'../x'")


# --- the fault plan -------------------------------------------------------------------------


def test_a_self_loop_in_edge_drop_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"'n0->n0' is a self-loop"):
        FaultsConfig(edge_drop={"n0->n0": 0.5})
    with pytest.raises(ConfigError, match="self-loop"):
        load_config(None, ['faults.edge_drop={" n1 -> n1 " = 0.1}'])


def test_the_same_edge_twice_in_edge_drop_is_refused() -> None:
    with pytest.raises(ConfigError, match="names the edge n0->n1 twice"):
        FaultsConfig(edge_drop={"n0->n1": 0.5, "n0 -> n1": 0.1})


@pytest.mark.parametrize(
    "faults",
    [
        {"edge_drop": {"../x->n0": 0.5}},
        {"edge_drop": {"n0->a/b": 0.5}},
        {"partitions": [{"nodes": ["n0", ".."], "start": 1, "end": 2}]},
        {"partitions": [{"nodes": [0, 1], "start": 1, "end": 2}]},
        {"crashes": [{"node": "../x", "at": 1}]},
        {"crashes": [{"node": 3, "at": 1}]},
    ],
)
def test_fault_plans_refuse_unsafe_ids(faults: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="not a safe name"):
        FaultsConfig(**faults)  # type: ignore[arg-type]


def test_fault_plans_name_only_nodes_of_the_graph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["simulate", "-q", *TINY, "--set", 'faults.edge_drop={"n0->n9" = 0.5}']
    one_line_error(capsys, argv, "not in the graph", "n9")
    argv = ["simulate", "-q", *TINY, "--set", 'faults.edge_drop={"n0->n0" = 0.5}']
    one_line_error(capsys, argv, "self-loop")
    argv = [
        "simulate", "-q", *TINY, "--set", "topology.kind=directed-ring",
        "--set", 'faults.edge_drop={"n1->n0" = 0.5}',
    ]  # fmt: skip
    one_line_error(capsys, argv, "not an edge")
    assert not list(tmp_path.iterdir())
