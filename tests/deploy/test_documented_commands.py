"""The deployment page's commands run as written: ``fedcore certs init``, ``fedcore compose``
on one host, on two hosts with the page's roster, as a swarm stack, and ``fedcore k8s``,
each read from the docs (the section "Deploying across hosts: mutual TLS and containers",
through ``tests.docs_text``, on whichever page holds it) and run through the CLI's ``main``
in a scratch folder, and what it writes checked as the compose, swarm and k8s tests check
their own (generation only: no container, stack or cluster is started).

``fedcore deploy`` on that page has its own test (``tests/test_readme_commands.py``)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from fedcore.cli.app import main
from fedcore.config import Config, load_config
from tests import docs_text
from tests.deploy.test_compose import check_deployment as check_compose
from tests.deploy.test_k8s import check_deployment as check_k8s
from tests.deploy.test_k8s import container
from tests.deploy.test_swarm import check_stack

SECTION = "Deploying across hosts: mutual TLS and containers"

RUN_TOML = '[topology]\nkind = "ring"\nnodes = 4\n'
"""The page's ``run.toml``, which it does not show: a run of the four peers ``n0``..``n3``
its roster, ``--nodes`` and ``--place`` name."""


def _columns(block: str) -> list[str]:
    """A bash block, or its two columns where it shows two hosts side by side (its first
    line ``# on HOST ... # on HOST``)."""
    if not block.startswith("# on"):
        return [block]
    split = [re.fullmatch(r"(\s*\S.*?)\s{3,}(\S.*)", line) for line in block.splitlines()]
    assert all(split), block  # every line: a left column, 3 spaces or more, a right one
    return ["\n".join(m.group(i) for m in split if m) for i in (1, 2)]


def _commands(*prefix: str) -> list[list[str]]:
    """Every command of the section's bash blocks that starts ``fedcore PREFIX...``, as argv
    without ``fedcore`` (continued lines joined, comments dropped)."""
    text = docs_text.section(SECTION)
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for column in _columns(block):
            for line in re.sub(r"\\[ \t]*\n[ \t]*", " ", column).splitlines():
                argv = shlex.split(line, comments=True)
                if argv[: 1 + len(prefix)] == ["fedcore", *prefix]:
                    found.append(argv[1:])
    return found


def _roster() -> dict[str, str]:
    """The page's roster of several hosts (its one ``json`` block)."""
    (block,) = re.findall(r"^```json\n(.*?)^```", docs_text.section(SECTION), re.S | re.M)
    roster: dict[str, str] = json.loads(block)
    return roster


def _at(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    """``folder`` made the current one, with the page's ``run.toml`` and roster in it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.toml").write_text(RUN_TOML, encoding="utf-8")
    (folder / "roster.json").write_text(json.dumps(_roster()), encoding="utf-8")
    monkeypatch.chdir(folder)
    return load_config(folder / "run.toml")


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_pages_commands_are_found() -> None:
    """Every ``fedcore compose`` and ``fedcore k8s`` the section shows is one these tests
    run: one on one host, two on two hosts, one swarm, one k8s."""
    compose = _commands("compose")
    assert len(compose) == 4, compose
    assert len([a for a in compose if "--roster" in a]) == 2
    assert len([a for a in compose if "--swarm" in a]) == 1
    assert len(_commands("k8s")) == 1
    assert len(_commands("certs", "init")) == 1


def test_certs_init_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (argv,) = _commands("certs", "init")
    _at(tmp_path, monkeypatch)
    assert main(argv) == 0
    nodes = argv[argv.index("--nodes") + 1 : argv.index("--out")]
    written = sorted(p.name for p in (tmp_path / _option(argv, "--out")).iterdir())
    pairs = [f"{n}.{ext}" for n in nodes for ext in ("crt", "key")]
    assert written == sorted(["ca.crt", "ca.key", *pairs])


def test_compose_on_one_host_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (argv,) = [a for a in _commands("compose") if "--roster" not in a and "--swarm" not in a]
    config = _at(tmp_path, monkeypatch)
    assert main(argv) == 0, capsys.readouterr().err
    services = check_compose(tmp_path / _option(argv, "--out"), config)
    assert sorted(services) == ["n0", "n1", "n2", "n3"]


def test_compose_on_two_hosts_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [a for a in _commands("compose") if "--roster" in a]
    roster = _roster()
    here: list[str] = []
    for i, argv in enumerate(hosts):
        host = tmp_path / f"host{i}"  # each host its own folder
        config = _at(host, monkeypatch)
        assert main(argv) == 0, capsys.readouterr().err
        nodes = _option(argv, "--nodes").split(",")
        check_compose(host / _option(argv, "--out"), config, nodes=nodes, roster=roster)
        here += nodes
    assert sorted(here) == sorted(roster)  # every peer on one host, once


def test_compose_swarm_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (argv,) = [a for a in _commands("compose") if "--swarm" in a]
    config = _at(tmp_path, monkeypatch)
    assert main(argv) == 0, capsys.readouterr().err
    placement = dict(item.split("=") for item in _option(argv, "--place").split(","))
    check_stack(tmp_path / _option(argv, "--out"), config, placement=placement)


def test_k8s_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (argv,) = _commands("k8s")
    config = _at(tmp_path, monkeypatch)
    assert main(argv) == 0, capsys.readouterr().err
    docs = check_k8s(
        tmp_path / _option(argv, "--out"), config, namespace=_option(argv, "--namespace")
    )
    sts = docs["statefulset-n0.yaml"]
    requests = container(sts)["resources"]["requests"]
    assert requests == {"cpu": _option(argv, "--cpu"), "memory": _option(argv, "--memory")}
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["resources"] == {"requests": {"storage": _option(argv, "--storage")}}
