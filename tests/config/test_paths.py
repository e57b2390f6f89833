"""Paths in a config are relative to the config file, paths in ``--set`` to the current
directory, and both come back absolute, so a saved ``config.toml`` re-runs from anywhere."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from fedcore import topology
from fedcore.certs import init_certs
from fedcore.config import PATH_KEYS, load_config
from fedcore.errors import ConfigError
from fedcore.setup.prepare import prepare_run
from tests.clitools import cli

SMALL = '[run]\nrounds = 2\neval_every = 1\n[data]\nbatch_size = 16\n[algorithm]\nname = "dpsgd"\n'
"""A tiny run (two rounds on the graph file) for the simulate tests."""


def experiment(folder: Path, *, certs: bool = True) -> Path:
    """``folder/exp.toml`` naming ``graph.json`` and ``certs`` beside it (both made)."""
    folder.mkdir(parents=True, exist_ok=True)
    topology.save(topology.ring(4), folder / "graph.json")
    text = SMALL + '[topology]\nfile = "graph.json"\n'
    if certs:
        init_certs([f"n{i}" for i in range(4)], folder / "certs")
        text += '[transport.tls]\ndir = "certs"\n'
    path = folder / "exp.toml"
    path.write_text(text, encoding="utf-8")
    return path


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def same(a: str | Path | None, b: Path) -> bool:
    """Whether ``a`` is absolute and names the same place as ``b``."""
    assert a is not None
    return Path(a).is_absolute() and Path(a).resolve() == b.resolve()


def test_paths_in_a_file_are_relative_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = experiment(tmp_path / "exp")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(path)
    assert same(config.topology.file, tmp_path / "exp" / "graph.json")
    assert same(config.transport.tls_dir, tmp_path / "exp" / "certs")
    # A config named by a relative path: its folder is still the base.
    monkeypatch.chdir(tmp_path)
    again = load_config(Path("exp") / "exp.toml")
    assert same(again.topology.file, tmp_path / "exp" / "graph.json")
    assert prepare_run(again).graph == prepare_run(config).graph


def test_paths_in_overrides_and_without_a_file_are_relative_to_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = experiment(tmp_path / "exp", certs=False)
    monkeypatch.chdir(tmp_path)
    config = load_config(path, ["topology.file=rel.json", "transport.tls.dir=pki"])
    assert same(config.topology.file, tmp_path / "rel.json")
    assert same(config.transport.tls_dir, tmp_path / "pki")
    default = load_config(None, ["topology.file=rel.json", 'transport.tls={ dir = "pki" }'])
    assert same(default.topology.file, tmp_path / "rel.json")
    assert same(default.transport.tls_dir, tmp_path / "pki")


def test_absolute_home_and_absent_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = tmp_path / "c.toml"
    path.write_text(
        f'[topology]\nfile = "{tmp_path / "g.json"}"\n[transport.tls]\ndir = "~/certs"\n',
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.topology.file == str(tmp_path / "g.json")
    assert same(config.transport.tls_dir, tmp_path / "home" / "certs")
    # No path: nothing is made up; a path of the wrong type is reported as before.
    plain = load_config(write(tmp_path / "p.toml", "[run]\nrounds = 3\n"))
    assert plain.topology.file == "" and plain.transport.tls_dir is None
    with pytest.raises(ConfigError, match=r"topology\.file must be of type str"):
        load_config(write(tmp_path / "bad.toml", "[topology]\nfile = 3\n"))
    assert PATH_KEYS == (
        ("topology", "file"),
        ("transport", "tls", "dir"),
        ("data", "root"),
        ("time", "compute_trace"),
        ("time", "availability_trace"),
    )


def test_the_fingerprint_does_not_depend_on_where_the_files_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = experiment(tmp_path / "a")
    second = tmp_path / "b" / "deeper"
    shutil.copytree(tmp_path / "a", second)
    monkeypatch.chdir(tmp_path)
    one = prepare_run(load_config(first))
    two = prepare_run(load_config(second / "exp.toml"))
    assert load_config(first).topology.file != load_config(second / "exp.toml").topology.file
    assert one.run_id == two.run_id


def test_simulate_from_elsewhere_and_rerun_of_its_saved_config_from_a_third_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = experiment(tmp_path / "exp")
    second = tmp_path / "second"
    second.mkdir()
    monkeypatch.chdir(second)
    status, _, err = cli(capsys, "simulate", str(path), "-q", "--out", "run")
    assert status == 0, err
    saved = second / "run" / "config.toml"
    tables = tomllib.loads(saved.read_text(encoding="utf-8"))
    assert same(tables["topology"]["file"], tmp_path / "exp" / "graph.json")
    assert same(tables["transport"]["tls"]["dir"], tmp_path / "exp" / "certs")
    third = tmp_path / "third"
    third.mkdir()
    monkeypatch.chdir(third)
    status, _, err = cli(capsys, "simulate", str(saved), "-q", "--out", "again")
    assert status == 0, err
    runs = [
        json.loads((d / "summary.json").read_text(encoding="utf-8"))
        for d in (
            second / "run",
            third / "again",
        )
    ]
    assert runs[0]["run_id"] == runs[1]["run_id"]
    assert runs[0]["final"] == runs[1]["final"]


def test_certs_init_with_a_config_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = experiment(tmp_path / "exp", certs=False)
    monkeypatch.chdir(tmp_path)
    status, _, err = cli(capsys, "certs", "init", "--config", str(path), "--out", "pki")
    assert status == 0, err
    assert sorted(p.name for p in (tmp_path / "pki").glob("n*.crt")) == [
        f"n{i}.crt" for i in range(4)
    ]


def test_a_compose_config_finds_its_graph_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fedcore compose`` writes ``topology.file = "topology/<file>"`` into DIR/config.toml:
    relative to that file, it is DIR/topology/<file> on the host, from any directory, and
    /fedcore/topology/<file> in a container (whose config is /fedcore/config.toml)."""
    from fedcore.deploy.compose import write_compose

    config = load_config(experiment(tmp_path / "exp", certs=False))
    out = tmp_path / "deploy"
    write_compose(config, out, build_context=False)
    written = tomllib.loads((out / "config.toml").read_text(encoding="utf-8"))
    assert written["topology"]["file"] == "topology/graph.json"
    monkeypatch.chdir(tmp_path / "exp")
    inside = load_config(out / "config.toml")
    assert same(inside.topology.file, out / "topology" / "graph.json")
    assert prepare_run(inside).run_id == prepare_run(config).run_id
    assert os.path.isfile(inside.topology.file)


def test_data_paths_are_relative_to_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """data.root and folder:PATH: beside the config in a file, the current folder in --set."""
    from fedcore.data.standin import write_standin

    exp = tmp_path / "exp"
    write_standin("fashion-mnist", exp / "data", samples=200)
    text = '[topology]\nnodes = 4\n[data]\ndataset = "fashion-mnist"\nroot = "data"\n'
    path = write(exp / "run.toml", text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(path)
    assert config.data.root == str(exp / "data")
    assert prepare_run(config).dataset.name == "fashion-mnist"
    assert load_config(path, ["data.root=mine"]).data.root == str(elsewhere / "mine")
    folder = load_config(None, ["data.dataset=folder:sets/a.npz"]).data.dataset
    assert folder == f"folder:{elsewhere / 'sets' / 'a.npz'}"
    written = write(exp / "folder.toml", '[data]\ndataset = "folder:sets/a.npz"\n')
    assert load_config(written).data.dataset == f"folder:{exp / 'sets' / 'a.npz'}"
    assert load_config(None).data.root == ""  # the default stays the default
