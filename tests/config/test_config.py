"""Tests of the experiment config: defaults, overrides, types, options, TOML round trip."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from fedcore.config import (
    AlgorithmConfig,
    Config,
    DataConfig,
    ModelConfig,
    RunConfig,
    TopologyConfig,
    TransportConfig,
    config_from_dict,
    config_to_dict,
    dumps_toml,
    fingerprint,
    load_config,
    parse_override,
)
from fedcore.errors import ConfigError, FedcoreError

EDGES = [("n0", "n1", 0.5), ("n1", "n0", 0.5), ("n0", "n0", 0.5), ("n1", "n1", 0.5)]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def round_trip(config: Config) -> Config:
    return config_from_dict(tomllib.loads(dumps_toml(config_to_dict(config))))


# --- defaults -------------------------------------------------------------------------


def test_defaults_are_the_built_in_run() -> None:
    c = Config()
    assert c.run == RunConfig(name="", seed=0, rounds=300, eval_every=25)
    assert (c.topology.kind, c.topology.nodes, c.topology.seed, c.topology.file) == (
        "social",
        16,
        0,
        "",
    )
    assert (c.algorithm.name, c.algorithm.lr, c.algorithm.lr_schedule) == ("ops", 0.5, "constant")
    assert dict(c.algorithm.options) == {}
    assert (c.data.dataset, c.data.partition, c.data.alpha) == ("digits", "dirichlet", 0.3)
    assert (c.data.batch_size, c.data.test_fraction, c.data.shards_per_node) == (32, 0.2, 2)
    assert (c.model.name, c.model.hidden, c.model.dtype) == ("logreg", 64, "float32")
    assert dict(c.model.options) == {}
    assert c.transport.mode == "strict"


def test_load_config_without_file_or_overrides_is_the_default() -> None:
    assert load_config() == Config()
    assert load_config(None, []) == Config()
    assert config_from_dict({}) == Config()


def test_empty_file_and_empty_tables_give_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path / "e.toml", "")) == Config()
    assert load_config(write(tmp_path / "t.toml", "[run]\n[model]\n")) == Config()


def test_config_is_frozen() -> None:
    c = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.run.rounds = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.run = RunConfig()  # type: ignore[misc]


# --- overrides ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "path", "value"),
    [
        ("run.rounds=50", ["run", "rounds"], 50),
        ("algorithm.lr=0.1", ["algorithm", "lr"], 0.1),
        ("algorithm.name=dpsgd", ["algorithm", "name"], "dpsgd"),
        ('run.name="quoted name"', ["run", "name"], "quoted name"),
        ("run.name=hello world", ["run", "name"], "hello world"),
        ("algorithm.flag=true", ["algorithm", "flag"], True),
        ("algorithm.sizes=[1, 2, 3]", ["algorithm", "sizes"], [1, 2, 3]),
        ("model.name=pkg.mod:make", ["model", "name"], "pkg.mod:make"),
        ("run.name=a=b", ["run", "name"], "a=b"),
        (" run.rounds = 7 ", ["run", "rounds"], 7),
        ("run.name=", ["run", "name"], ""),
    ],
)
def test_parse_override_reads_toml_and_falls_back_to_string(
    item: str, path: list[str], value: object
) -> None:
    got_path, got_value = parse_override(item)
    assert got_path == path
    assert got_value == value
    assert type(got_value) is type(value)


@pytest.mark.parametrize(
    "item", ["run.rounds", "rounds=3", "a.b.c.d=1", ".rounds=1", "run.=1", "a..c=1", "=1", ""]
)
def test_parse_override_rejects_bad_syntax(item: str) -> None:
    with pytest.raises(ConfigError, match=r"TABLE\.KEY=VALUE"):
        parse_override(item)


def test_an_override_reaches_a_sub_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "c.toml", '[run]\nrounds = 3\n[transport.tls]\ndir = "a"\n')
    assert load_config(path).transport.tls_dir == tmp_path / "a"  # beside the file
    monkeypatch.chdir(tmp_path / "..")
    # A path given with --set is the cwd's.
    assert load_config(path, ["transport.tls.dir=b"]).transport.tls_dir == tmp_path.parent / "b"
    with pytest.raises(ConfigError, match=r"\[run\.rounds\] must be a table"):
        load_config(path, ["run.rounds.x=1"])


def test_overrides_take_effect_and_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[run]\nrounds = 10\nname = "file"\n[model]\nname = "mlp"\n')
    c = load_config(path, ["run.rounds=5", "algorithm.name=dpsgd", "topology.kind=ring"])
    assert c.run.rounds == 5
    assert c.run.name == "file"
    assert c.model.name == "mlp"
    assert c.algorithm.name == "dpsgd"
    assert c.topology.kind == "ring"
    assert load_config(path).run.rounds == 10  # the file is untouched


def test_later_override_wins() -> None:
    assert load_config(None, ["run.rounds=5", "run.rounds=6"]).run.rounds == 6


def test_override_of_a_non_table_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", "run = 3\n")
    with pytest.raises(ConfigError, match=r"\[run\]"):
        load_config(path, ["run.rounds=2"])
    with pytest.raises(ConfigError, match=r"\[run\] must be a table"):
        load_config(path)


# --- types ----------------------------------------------------------------------------


def test_int_is_accepted_for_float() -> None:
    c = load_config(None, ["algorithm.lr=1", "data.alpha=2", "transport.deadline_s=3"])
    assert c.algorithm.lr == 1.0 and type(c.algorithm.lr) is float
    assert c.data.alpha == 2.0 and type(c.data.alpha) is float
    assert type(c.transport.deadline_s) is float


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [
        ("run", "rounds", True),
        ("run", "seed", False),
        ("algorithm", "lr", True),
        ("run", "rounds", 3.5),
        ("run", "rounds", "abc"),
        ("topology", "nodes", "4"),
        ("run", "name", 3),
        ("data", "alpha", "0.5"),
        ("model", "hidden", [8]),
    ],
)
def test_wrong_types_are_rejected_naming_the_key(table: str, key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{table}.{key}")):
        config_from_dict({table: {key: value}})


def test_bool_rejected_for_int_through_override() -> None:
    with pytest.raises(ConfigError, match=r"run\.rounds"):
        load_config(None, ["run.rounds=true"])


@pytest.mark.parametrize(
    "override",
    [
        "run.rounds=0",
        "run.eval_every=0",
        "run.name=a/b",
        "topology.nodes=0",
        "topology.p=0",
        "topology.p=1.5",
        "algorithm.lr=-0.1",
        "algorithm.lr=nan",
        "algorithm.lr_schedule=step",
        "data.partition=nope",
        "data.alpha=0",
        "data.batch_size=0",
        "data.test_fraction=1",
        "data.test_fraction=0",
        "model.hidden=0",
        "model.dtype=float16",
        "transport.mode=eager",
        "transport.deadline_s=0",
        "transport.strict_timeout_s=-1",
    ],
)
def test_out_of_range_values_are_rejected_naming_the_key(override: str) -> None:
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=re.escape(key)) as info:
        load_config(None, [override])
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, FedcoreError)


# --- unknown tables and keys ------------------------------------------------------------


def test_unknown_table_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"unknown config table \[foo\]"):
        config_from_dict({"foo": {}})


@pytest.mark.parametrize("table", ["run", "topology", "data", "transport"])
def test_unknown_key_in_a_closed_table_is_rejected(table: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"unknown key {table}.bogus")):
        load_config(None, [f"{table}.bogus=1"])


def test_unknown_keys_of_algorithm_and_model_go_to_options() -> None:
    c = config_from_dict(
        {
            "algorithm": {"name": "ops", "beta": 0.9, "tags": ["a"]},
            "model": {"name": "pkg.mod:f", "width": 8, "hidden": 4},
        }
    )
    assert dict(c.algorithm.options) == {"beta": 0.9, "tags": ["a"]}
    assert c.algorithm.name == "ops"
    assert dict(c.model.options) == {"width": 8}
    assert c.model.hidden == 4
    c2 = load_config(None, ["algorithm.momentum=0.5", "model.width=12"])
    assert dict(c2.algorithm.options) == {"momentum": 0.5}
    assert dict(c2.model.options) == {"width": 12}


# --- files ------------------------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        load_config(missing)


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.toml", "[run\nrounds = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[run]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin1\.toml"):
        load_config(path)


# --- TOML round trip ------------------------------------------------------------------


def test_dumps_toml_round_trips_the_default() -> None:
    assert round_trip(Config()) == Config()


def test_dumps_toml_round_trips_every_value_kind() -> None:
    c = config_from_dict(
        {
            "run": {"name": 'it\'s "quoted"', "seed": 7, "rounds": 3, "eval_every": 1},
            "topology": {"kind": "erdos-renyi", "nodes": 5, "p": 0.25, "file": "g\\é.json"},
            "algorithm": {
                "name": "ops",
                "lr": 1e-05,
                "lr_schedule": "sqrt",
                "flag": True,
                "off": False,
                "sizes": [1, 2, 3],
                "big": 1e300,
                "tiny": 5e-324,
            },
            "data": {"partition": "shards", "alpha": 0.1, "shards_per_node": 1},
            "model": {"name": "mlp", "hidden": 8, "dtype": "float64", "width": 3},
            "transport": {"mode": "deadline", "deadline_s": 0.25},
        }
    )
    text = dumps_toml(config_to_dict(c))
    assert round_trip(c) == c
    assert tomllib.loads(text)["algorithm"]["flag"] is True
    assert "[run]" in text and "[transport]" in text


def test_dumps_toml_round_trips_unicode_and_tabs() -> None:
    c = load_config(None, ['run.name="tab\there ünï"'])
    assert c.run.name == "tab\there ünï"
    assert round_trip(c) == c


def test_dumps_toml_round_trips_control_characters() -> None:
    c = load_config(None, ['run.name="a\\u007fb\\u0001c\\nd"'])
    assert c.run.name == "a\x7fb\x01c\nd"
    assert round_trip(c) == c


def test_dumps_toml_writes_inline_tables_and_rejects_other_values() -> None:
    import tomllib

    text = dumps_toml({"algorithm": {"nested": {"a": 1, "b->c": [{"d": "e"}]}}})
    assert tomllib.loads(text) == {"algorithm": {"nested": {"a": 1, "b->c": [{"d": "e"}]}}}
    with pytest.raises(ConfigError, match="TOML value"):
        dumps_toml({"algorithm": {"nothing": None}})


def test_config_to_dict_flattens_options_into_their_table() -> None:
    c = load_config(None, ["algorithm.beta=0.9", "model.width=4"])
    tables = config_to_dict(c)
    assert tables["algorithm"]["beta"] == 0.9
    assert "options" not in tables["algorithm"]
    assert tables["model"]["width"] == 4
    assert list(tables) == [
        "run",
        "topology",
        "algorithm",
        "optimizer",
        "data",
        "model",
        "compression",
        "transport",
        "faults",
        "time",
        "adversary",
        "privacy",
        "personal",
        "simulate",
    ]


def test_section_classes_validate_directly() -> None:
    assert TopologyConfig(nodes=3).nodes == 3
    with pytest.raises(ConfigError):
        AlgorithmConfig(lr=-1.0)
    with pytest.raises(ConfigError):
        DataConfig(partition="x")
    with pytest.raises(ConfigError):
        ModelConfig(dtype="int8")
    with pytest.raises(ConfigError):
        TransportConfig(mode="eager")


# --- fingerprint ------------------------------------------------------------------------


def test_fingerprint_is_a_stable_sha256() -> None:
    a = fingerprint(Config(), EDGES)
    assert re.fullmatch(r"[0-9a-f]{64}", a)
    assert fingerprint(Config(), EDGES) == a
    assert fingerprint(load_config(), list(reversed(EDGES))) == a  # edge order is irrelevant


@pytest.mark.parametrize(
    "override",
    ["run.seed=1", "run.rounds=299", "algorithm.lr=0.25", "model.width=3", "data.alpha=0.31"],
)
def test_fingerprint_changes_with_the_config(override: str) -> None:
    assert fingerprint(load_config(None, [override]), EDGES) != fingerprint(Config(), EDGES)


def test_fingerprint_changes_with_the_graph() -> None:
    base = fingerprint(Config(), EDGES)
    reweighted = [(u, v, 0.25 if (u, v) == ("n0", "n1") else w) for u, v, w in EDGES]
    assert fingerprint(Config(), reweighted) != base
    assert fingerprint(Config(), [*EDGES, ("n1", "n2", 0.1)]) != base
    assert fingerprint(Config(), EDGES[:-1]) != base
    renamed = [(u.replace("n", "m"), v.replace("n", "m"), w) for u, v, w in EDGES]
    assert fingerprint(Config(), renamed) != base


def test_undirected_topology_adds_reverse_edges() -> None:
    from fedcore.setup.graph import build_topology

    one_way = build_topology(load_config(None, ["topology.kind=exponential"]).topology)
    both = build_topology(
        load_config(None, ["topology.kind=exponential", "topology.undirected=true"]).topology
    )
    assert not one_way.at(0).is_symmetric() and both.at(0).is_symmetric()
    assert set(one_way.at(0).edges()) < set(both.at(0).edges())
    assert both.name == "exponential-16-undirected"


def test_a_removed_key_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """``transport.kind`` did nothing (the command chooses the transport): a config that
    still sets it is refused in one line that says so, from a file or from --set."""
    with pytest.raises(ConfigError, match=r"transport\.kind was removed: the command chooses"):
        load_config(None, ["transport.kind=grpc"])
    path = tmp_path / "old.toml"
    path.write_text('[transport]\nkind = "inproc"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="Delete the line"):
        load_config(path)
