"""``fedcore compose`` and ``nodes/Dockerfile``: the generated deployment validates with
``docker-compose config``, names every node, and its roster matches the graph.

Docker cannot run here; ``docker-compose config`` validates a file without a daemon. Where
``docker-compose`` is missing the validation is skipped, unless ``FEDCORE_REQUIRE_COMPOSE=1``
(CI), where that is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from fnmatch import fnmatch
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import fedcore
from fedcore.cli import main
from fedcore.config import Config, load_config
from fedcore.deploy import compose
from fedcore.deploy.compose import source_root, write_compose
from fedcore.deploy.yamlout import dumps_yaml
from fedcore.errors import ConfigError, TopologyError
from fedcore.ids import id_problem
from fedcore.setup.prepare import prepare_run
from fedcore.topology import Topology

REPO = Path(__file__).resolve().parents[2]
SMALL_SET = ["topology.kind=ring", "topology.nodes=4"]  # load_config overrides
SMALL = [arg for item in SMALL_SET for arg in ("--set", item)]  # the same on the command line


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths (topologies/) resolve against the repository root."""
    monkeypatch.chdir(REPO)


# --- reading what docker-compose makes of a file ----------------------------------------------


def _yaml_loader() -> Callable[[str], Any] | None:
    """A YAML parser: PyYAML if this environment has it, else the one docker-compose runs on
    (it needs PyYAML itself), else None."""
    try:
        import yaml

        return yaml.safe_load  # type: ignore[no-any-return]
    except ImportError:
        pass
    exe = shutil.which("docker-compose")
    if exe is None:
        return None
    first = Path(exe).read_bytes()[:200].split(b"\n", 1)[0].decode(errors="replace")
    python = first[2:].strip().split() if first.startswith("#!") else []
    if not python:
        return None
    script = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
    try:
        probe = subprocess.run([*python, "-c", "import yaml"], capture_output=True, timeout=30)
    except OSError:
        return None
    if probe.returncode != 0:
        return None

    def load(text: str) -> Any:
        done = subprocess.run(
            [*python, "-c", script], input=text, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return load


LOAD_YAML = _yaml_loader()


def _compose_exe() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        if os.environ.get("FEDCORE_REQUIRE_COMPOSE") == "1":
            pytest.fail("FEDCORE_REQUIRE_COMPOSE=1 but docker-compose is not on PATH")
        pytest.skip(
            "docker-compose is not on PATH (CI installs it and sets FEDCORE_REQUIRE_COMPOSE)"
        )
    return exe


def compose_config(path: Path) -> dict[str, Any]:
    """``docker-compose -f PATH config``: validate the file, and return docker-compose's
    normalized reading of it (relative paths made absolute)."""
    exe = _compose_exe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    # One call: `config` validates exactly as `config -q` does (docker-compose 1.x reads the
    # file the same way, then -q returns before printing), and prints its reading.
    full = subprocess.run(
        [exe, "-f", str(path), "config"], capture_output=True, text=True, env=env, timeout=60
    )
    assert full.returncode == 0, f"docker-compose rejects {path}:\n{full.stderr}"
    if LOAD_YAML is None:
        pytest.skip("no YAML parser here to read docker-compose's output")
    doc: dict[str, Any] = LOAD_YAML(full.stdout)
    return doc


def own_reading(path: Path) -> dict[str, Any]:
    """Our file parsed as YAML, without docker-compose's normalization."""
    if LOAD_YAML is None:
        pytest.skip("no YAML parser here (PyYAML, or docker-compose's)")
    doc: dict[str, Any] = LOAD_YAML(path.read_text(encoding="utf-8"))
    return doc


# --- what every deployment must satisfy ---------------------------------------------------------


def out_neighbours(graph: Topology) -> dict[str, set[str]]:
    outs: dict[str, set[str]] = {n: set() for n in graph.nodes}
    for t in range(graph.period):
        for u, v in graph.at(t).edges():
            if u != v:
                outs[u].add(v)
    return outs


def mounts(service: dict[str, Any], base: Path) -> dict[str, tuple[str, str]]:
    """Container path -> (absolute host path, mode) of a service's volumes; relative host
    paths are relative to ``base`` (the compose file's folder)."""
    found: dict[str, tuple[str, str]] = {}
    for volume in service.get("volumes", []):
        host, target, *mode = volume.split(":") if isinstance(volume, str) else [
            volume["source"], volume["target"], "ro" if volume.get("read_only") else "rw"
        ]  # fmt: skip
        found[target] = (str((base / host).resolve()), mode[0] if mode else "rw")
    return found


def ports(service: dict[str, Any]) -> list[tuple[int, int]]:
    """(host port, container port) pairs, in the short or the long syntax."""
    return [
        (int(p["published"]), int(p["target"]))
        if isinstance(p, dict)
        else (int(str(p).split(":")[-2]), int(str(p).split(":")[-1]))
        for p in service.get("ports", [])
    ]


def check_deployment(
    out: Path,
    config: Config,
    *,
    nodes: list[str] | None = None,
    roster: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Check DIR's compose file against the graph, then that docker-compose validates it and
    reads it the same; return its services."""
    graph = prepare_run(config).graph
    ids = list(graph.nodes)
    here = nodes if nodes is not None else ids
    path = out / "docker-compose.yml"
    services: dict[str, Any] = own_reading(path)["services"]
    assert sorted(services) == sorted(here)

    written = json.loads((out / "roster.json").read_text(encoding="utf-8"))
    assert set(written) >= set(ids)
    if roster is None:
        # Every node, and every out-neighbour a node sends to, is reachable by service name.
        assert written == {n: f"{n}:7000" for n in ids}
        for n, targets in out_neighbours(graph).items():
            for v in targets | {n}:
                assert written[v].rpartition(":")[0] in services
    else:
        assert written == roster

    for n in here:
        service = services[n]
        port = written[n].rpartition(":")[2]
        assert service["hostname"] == n
        assert service["entrypoint"] == ["fedcore"]
        command = service["command"]
        assert command[0] == "node"
        assert command[command.index("--id") + 1] == n
        assert command[command.index("--listen") + 1] == f"0.0.0.0:{port}"
        assert command[command.index("--config") + 1] == "/fedcore/config.toml"
        assert command[command.index("--roster") + 1] == "/fedcore/roster.json"
        assert command[command.index("--out") + 1] == "/fedcore/out"
        assert "--resume" in command
        assert service["restart"] == "on-failure"
        assert service["working_dir"] == "/fedcore"
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "fedcore", "health"]
        assert f"127.0.0.1:{port}" in test
        assert test[test.index("--id") + 1] == n
        assert test[test.index("--config") + 1] == "/fedcore/config.toml"
        m = mounts(service, out)
        assert m["/fedcore/config.toml"] == (str((out / "config.toml").resolve()), "ro")
        assert m["/fedcore/roster.json"] == (str((out / "roster.json").resolve()), "ro")
        assert m["/fedcore/out"] == (str((out / "nodes" / n).resolve()), "rw")
        assert (out / "nodes" / n).is_dir()
        assert ports(service) == ([] if roster is None else [(int(port), int(port))])
        if source_root() is not None:
            assert (out / service["build"]["context"]).resolve() == source_root()
            assert service["build"]["dockerfile"] == "nodes/Dockerfile"

    # docker-compose accepts the file and reads it the same (last: it skips where missing).
    normalized = compose_config(path)["services"]
    assert sorted(normalized) == sorted(services)
    for n in here:
        ours, theirs = services[n], normalized[n]
        for key in ("image", "hostname", "entrypoint", "command", "working_dir", "restart"):
            assert theirs[key] == ours[key], (n, key)
        assert theirs["healthcheck"]["test"] == ours["healthcheck"]["test"]
        assert mounts(theirs, out) == mounts(ours, out)
        assert ports(theirs) == ports(ours)
        if "build" in ours:
            assert Path(theirs["build"]["context"]) == (out / ours["build"]["context"]).resolve()
    return services


# --- scenarios ---------------------------------------------------------------------------------


def test_default_config_sixteen_nodes(tmp_path: Path) -> None:
    config = load_config()
    out = tmp_path / "deploy"
    path = write_compose(config, out)
    assert path == out / "docker-compose.yml"
    services = check_deployment(out, config)
    assert len(services) == 16
    # The container's config is the same run: same fingerprint, so its peers accept each other.
    inside = load_config(out / "config.toml")
    assert inside == config
    assert prepare_run(inside).run_id == prepare_run(config).run_id


def test_graph_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(None, ["topology.file=topologies/ring-8.json", "algorithm.name=dpsgd"])
    out = tmp_path / "deploy"
    write_compose(config, out)
    services = check_deployment(out, config)
    assert sorted(services) == [f"n{i}" for i in range(8)]
    copied = out / "topology" / "ring-8.json"
    assert copied.read_bytes() == (REPO / "topologies" / "ring-8.json").read_bytes()
    for service in services.values():
        assert mounts(service, out)["/fedcore/topology"] == (str(copied.parent.resolve()), "ro")
    # The rewritten config names the copy relative to its own folder, which is also the
    # working directory: /fedcore in a container, DIR on the host (`fedcore summarize .`).
    written = tomllib.loads((out / "config.toml").read_text(encoding="utf-8"))
    assert written["topology"]["file"] == "topology/ring-8.json"
    inside = load_config(out / "config.toml")
    assert (out / inside.topology.file).resolve() == copied.resolve()
    graph = prepare_run(config).graph
    monkeypatch.chdir(out)
    assert prepare_run(inside).graph == graph


def make_certs(folder: Path, nodes: list[str]) -> Path:
    """Dummy files with the names `fedcore certs init` writes."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ["ca.crt", "ca.key", *(f"{n}.{ext}" for n in nodes for ext in ("crt", "key"))]:
        (folder / name).write_text(f"dummy {name}\n", encoding="utf-8")
    return folder


def test_tls_mounts_only_each_nodes_own_files(tmp_path: Path) -> None:
    ids = [f"n{i}" for i in range(4)]
    certs = make_certs(tmp_path / "pki", ids)
    config = load_config(None, [*SMALL_SET, f"transport.tls.dir={certs}"])
    out = tmp_path / "deploy"
    write_compose(config, out)
    services = check_deployment(out, config)
    copied = out / "certs"
    assert sorted(p.name for p in copied.iterdir()) == sorted(
        ["ca.crt", *(f"{n}.{ext}" for n in ids for ext in ("crt", "key"))]
    )
    assert not (copied / "ca.key").exists()
    for n in ids:
        assert stat.S_IMODE((copied / f"{n}.key").stat().st_mode) == 0o600
        cert_mounts = {
            target: source
            for target, source in mounts(services[n], out).items()
            if target.startswith("/fedcore/certs")
        }
        assert cert_mounts == {
            f"/fedcore/certs/{name}": (str((copied / name).resolve()), "ro")
            for name in ("ca.crt", f"{n}.crt", f"{n}.key")
        }
    assert load_config(out / "config.toml").transport.tls == {"dir": "/fedcore/certs"}


def test_tls_missing_certificates_are_refused(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "pki", ["n0", "n1", "n2", "n3"])
    (certs / "n2.key").unlink()
    config = load_config(None, [*SMALL_SET, f"transport.tls.dir={certs}"])
    with pytest.raises(ConfigError, match=r"n2\.key.*fedcore certs init --nodes n0 n1 n2 n3"):
        write_compose(config, tmp_path / "deploy")
    assert not (tmp_path / "deploy").exists()  # nothing written before the checks pass


def multi_host_roster(ids: list[str]) -> dict[str, str]:
    """Two hosts: the first half of the nodes on 10.0.0.1, the rest on 10.0.0.2."""
    half = len(ids) // 2
    return {n: f"10.0.0.{1 if i < half else 2}:{7000 + (i % half)}" for i, n in enumerate(ids)}


def test_multi_host_subset(tmp_path: Path) -> None:
    ids = [f"n{i}" for i in range(16)]
    certs = make_certs(tmp_path / "pki", ids)
    config = load_config(None, [f"transport.tls.dir={certs}"])
    roster = multi_host_roster(ids)
    roster_file = tmp_path / "roster.json"
    roster_file.write_text(json.dumps(roster), encoding="utf-8")
    here = ids[8:]
    out = tmp_path / "host2"
    write_compose(config, out, nodes=here, roster=roster_file)
    services = check_deployment(out, config, nodes=here, roster=roster)
    for n in here:
        port = int(roster[n].rpartition(":")[2])
        assert ports(services[n]) == [(port, port)]
    # Only this host's certificates travel.
    assert sorted(p.name for p in (out / "certs").iterdir()) == sorted(
        ["ca.crt", *(f"{n}.{ext}" for n in here for ext in ("crt", "key"))]
    )
    assert sorted(p.name for p in (out / "nodes").iterdir()) == sorted(here)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("n3"), "no address for n3"),
        (lambda r: r.update(n1="127.0.0.1:7001"), "loopback"),
        (lambda r: r.update(n1="localhost:7001"), "loopback"),
        (lambda r: r.update(n1=r["n0"]), "n0 and n1 both use port 7000"),
    ],
    ids=["missing", "loopback", "localhost", "same-port"],
)
def test_bad_rosters_are_refused(
    tmp_path: Path, change: Callable[[dict[str, str]], object], message: str
) -> None:
    config = load_config(None, SMALL_SET)
    roster = {f"n{i}": f"10.0.0.1:{7000 + i}" for i in range(4)}
    change(roster)
    with pytest.raises(ConfigError, match=message):
        write_compose(config, tmp_path / "deploy", roster=roster)


def test_nodes_need_a_roster_and_must_be_in_the_graph(tmp_path: Path) -> None:
    config = load_config(None, SMALL_SET)
    with pytest.raises(ConfigError, match="--roster"):
        write_compose(config, tmp_path / "a", nodes=["n0"])
    roster = {f"n{i}": f"10.0.0.1:{7000 + i}" for i in range(4)}
    with pytest.raises(ConfigError, match="n9 is not a node of the graph"):
        write_compose(config, tmp_path / "b", nodes=["n0", "n9"], roster=roster)


@pytest.mark.parametrize("bad", ["Alice", "n_1", "-n1", "n.1", "x" * 64])
def test_node_ids_that_are_not_service_names_are_refused(tmp_path: Path, bad: str) -> None:
    # "-n1" and a 64-character id are no node ids at all (fedcore.ids): the graph file is
    # refused as it loads. The others are node ids, but not compose service names.
    ids = ["n0", bad, "n2"]
    graph = tmp_path / "graph.json"
    graph.write_text(
        json.dumps(
            {
                "name": "t",
                "directed": False,
                "nodes": ids,
                "edges": [[a, b] for a, b in zip(ids, ids[1:] + ids[:1], strict=True)],
            }
        ),
        encoding="utf-8",
    )
    config = load_config(None, [f"topology.file={graph}"])
    error = ConfigError if id_problem(bad) is None else TopologyError
    with pytest.raises(error, match=re.escape(repr(bad)[:30])):
        write_compose(config, tmp_path / "deploy")
    assert not (tmp_path / "deploy").exists()


def test_bad_port_and_image(tmp_path: Path) -> None:
    config = load_config(None, SMALL_SET)
    with pytest.raises(ConfigError, match="port"):
        write_compose(config, tmp_path / "a", port=70000)
    with pytest.raises(ConfigError, match="image"):
        write_compose(config, tmp_path / "b", image="fed core")


def test_regenerating_keeps_peer_folders(tmp_path: Path) -> None:
    config = load_config(None, SMALL_SET)
    out = tmp_path / "deploy"
    write_compose(config, out)
    (out / "nodes" / "n0" / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    write_compose(config, out, port=7100, build_context=False)
    assert (out / "nodes" / "n0" / "metrics.jsonl").exists()
    services = own_reading(out / "docker-compose.yml")["services"]
    assert "build" not in services["n0"]
    assert "0.0.0.0:7100" in services["n0"]["command"]


# --- the command line ---------------------------------------------------------------------------


def test_cli_compose(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deploy"
    status = main(["compose", "--out", str(out), *SMALL, "--port", "7500", "--image", "me/fc:1"])
    printed, err = capsys.readouterr()
    assert status == 0, err
    assert "docker-compose up" in printed
    assert "fedcore summarize" in printed
    services = own_reading(out / "docker-compose.yml")["services"]
    assert sorted(services) == ["n0", "n1", "n2", "n3"]
    assert {s["image"] for s in services.values()} == {"me/fc:1"}
    roster = json.loads((out / "roster.json").read_text(encoding="utf-8"))
    assert roster == {n: f"{n}:7500" for n in services}
    compose_config(out / "docker-compose.yml")


def test_cli_multi_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    roster = tmp_path / "peers.toml"
    roster.write_text(
        "[peers]\n" + "".join(f'n{i} = "10.0.0.{1 + i // 2}:{7000 + i % 2}"\n' for i in range(4)),
        encoding="utf-8",
    )
    out = tmp_path / "deploy"
    status = main(
        ["compose", "--out", str(out), *SMALL, "--roster", str(roster), "--nodes", "n2, n3"]
    )
    printed, err = capsys.readouterr()
    assert status == 0, err
    assert "every host" in printed
    services = compose_config(out / "docker-compose.yml")["services"]
    assert sorted(services) == ["n2", "n3"]


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    certs = tmp_path / "pki"
    certs.mkdir()
    status = main(
        ["compose", "--out", str(tmp_path / "d"), *SMALL, "--set", f"transport.tls.dir={certs}"]
    )
    printed, err = capsys.readouterr()
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("fedcore: error:")
    assert "fedcore certs init --nodes n0 n1 n2 n3" in err
    assert "Traceback" not in printed + err


# --- the image from a plain `pip install .` ---------------------------------------------------


def _site_install(site: Path, direct_url: dict[str, Any] | None) -> metadata.Distribution:
    """A fedcore 'installed' into ``site`` as pip lays it out: the package and its
    dist-info, with ``direct_url.json`` (PEP 610) when given."""
    (site / "fedcore").mkdir(parents=True)
    (site / "fedcore" / "__init__.py").write_text("", encoding="utf-8")
    info = site / "fedcore-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fedcore\nVersion: 0.1.0\n", encoding="utf-8"
    )
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url), encoding="utf-8")
    return metadata.Distribution.at(info)


def _pip_installed(
    monkeypatch: pytest.MonkeyPatch, site: Path, direct_url: dict[str, Any] | None
) -> None:
    """Run as if fedcore were imported from ``site`` (not from this checkout)."""
    dist = _site_install(site, direct_url)
    real = metadata.distribution

    def distribution(name: str) -> metadata.Distribution:
        return dist if name == "fedcore" else real(name)

    monkeypatch.setattr(fedcore, "__file__", str(site / "fedcore" / "__init__.py"))
    monkeypatch.setattr(compose.metadata, "distribution", distribution)


@pytest.mark.parametrize(
    ("direct_url", "expected"),
    [
        ({"url": REPO.as_uri(), "dir_info": {}}, REPO),
        ({"url": "file:///src/my%20fedcore", "dir_info": {}}, Path("/src/my fedcore")),
        ({"url": "file://localhost/src/fedcore", "dir_info": {}}, Path("/src/fedcore")),
        ({"url": "file:///w/fedcore-0.1.0-py3-none-any.whl", "archive_info": {}}, None),
        ({"url": "https://example.org/fedcore.git", "vcs_info": {"vcs": "git"}}, None),
        ({"url": "file://otherhost/src/fedcore", "dir_info": {}}, None),
        ({"dir_info": {}}, None),
        ([], None),
    ],
)
def test_installed_from_reads_pips_direct_url(
    tmp_path: Path, direct_url: Any, expected: Path | None
) -> None:
    dist = _site_install(tmp_path / "site", direct_url)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedcore, "__file__", str(tmp_path / "site" / "fedcore" / "__init__.py"))
        assert compose.installed_from(dist) == expected
    # Another copy of fedcore on sys.path (this checkout) is not the one that dist installed.
    assert compose.installed_from(dist) is None


def test_installed_from_without_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _pip_installed(monkeypatch, tmp_path / "site", None)
    assert compose.installed_from() is None
    info = tmp_path / "site" / "fedcore-0.1.0.dist-info"
    (info / "direct_url.json").write_text("{not json", encoding="utf-8")
    assert compose.installed_from() is None

    def missing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(compose.metadata, "distribution", missing)
    assert compose.installed_from() is None


def test_plain_pip_install_builds_the_image_from_its_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pip install .` from a checkout, then `fedcore compose`: `up --build` builds it."""
    _pip_installed(monkeypatch, tmp_path / "site", {"url": REPO.as_uri(), "dir_info": {}})
    assert source_root() == REPO
    out = tmp_path / "deploy"
    status = main(["compose", "--out", str(out), *SMALL])
    printed, err = capsys.readouterr()
    assert status == 0, err
    assert "docker build" not in printed
    assert "docker-compose up --build" in printed
    text = (out / "docker-compose.yml").read_text(encoding="utf-8")
    assert "docker-compose up --build" in text.split("services:", 1)[0]
    services = own_reading(out / "docker-compose.yml")["services"]
    for service in services.values():
        assert (out / service["build"]["context"]).resolve() == REPO
        assert service["build"]["dockerfile"] == "nodes/Dockerfile"
    normalized = compose_config(out / "docker-compose.yml")["services"]
    assert {Path(s["build"]["context"]) for s in normalized.values()} == {REPO}


def test_pip_install_then_compose_from_the_checkout_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 27 item 5: `pip install .` leaves `fedcore.egg-info` in the checkout, and
    `fedcore compose` run from there puts the checkout first on sys.path; that egg-info
    (no direct_url.json, another copy of the package) must not hide the installed
    distribution's record of where it came from."""
    checkout = tmp_path / "checkout"
    egg = checkout / "fedcore.egg-info"
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: fedcore\nVersion: 0.1.0\n", encoding="utf-8"
    )
    (egg / "top_level.txt").write_text("fedcore\n", encoding="utf-8")
    site = tmp_path / "site"
    _site_install(site, {"url": REPO.as_uri(), "dir_info": {}})
    monkeypatch.setattr(fedcore, "__file__", str(site / "fedcore" / "__init__.py"))
    monkeypatch.chdir(checkout)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(checkout))  # what `fedcore` does with its working folder
    assert metadata.distribution("fedcore").read_text("PKG-INFO") is not None  # the egg-info
    assert source_root() == REPO
    status = main(["compose", "--out", str(tmp_path / "deploy"), *SMALL])
    assert status == 0, capsys.readouterr().err
    services = own_reading(tmp_path / "deploy" / "docker-compose.yml")["services"]
    deploy = tmp_path / "deploy"
    assert {(deploy / s["build"]["context"]).resolve() for s in services.values()} == {REPO}


def test_real_pip_install_then_compose_from_its_checkout(tmp_path: Path) -> None:
    """Issue 27 item 5 with a real ``pip install .`` (of a copy of this checkout, offline:
    no dependencies, this environment's setuptools), then the installed ``fedcore``
    console script run in that checkout, which holds the build's ``fedcore.egg-info``."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("no setuptools here to build fedcore with")
    src, site = tmp_path / "checkout", tmp_path / "site"
    src.mkdir()
    for name in ("fedcore", "nodes"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*pip, "--no-index", "--target", str(site), "."],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (src / "fedcore.egg-info").is_dir()  # what the build leaves in the checkout
    env = {**os.environ, "PYTHONPATH": str(site)}
    for cwd in (src, tmp_path):  # the checkout itself, and another folder
        out = tmp_path / f"deploy-{cwd.name}"
        argv = [sys.executable, str(site / "bin" / "fedcore"), "compose", "--out", str(out)]
        done = subprocess.run(
            [*argv, *SMALL], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        services = own_reading(out / "docker-compose.yml")["services"]
        contexts = {(out / s["build"]["context"]).resolve() for s in services.values()}
        assert contexts == {src.resolve()}, cwd


@pytest.mark.parametrize("origin", ["gone", "not-fedcore", "archive"])
def test_without_a_source_tree_the_image_is_built_first(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    origin: str,
) -> None:
    """Installed from a wheel, or the checkout moved: the steps start with `docker build`."""
    folder = tmp_path / "checkout"
    if origin == "not-fedcore":
        (folder / "nodes").mkdir(parents=True)
        (folder / "nodes" / "Dockerfile").write_text("FROM scratch\n", encoding="utf-8")
        (folder / "pyproject.toml").write_text('[project]\nname = "other"\n', encoding="utf-8")
    direct_url = (
        {"url": (tmp_path / "fedcore.whl").as_uri(), "archive_info": {}}
        if origin == "archive"
        else {"url": folder.as_uri(), "dir_info": {}}
    )
    _pip_installed(monkeypatch, tmp_path / "site", direct_url)
    assert source_root() is None
    out = tmp_path / "deploy"
    status = main(["compose", "--out", str(out), *SMALL, "--image", "me/fc:1"])
    printed, err = capsys.readouterr()
    assert status == 0, err
    steps = [line.strip() for line in printed.splitlines()]
    build = next(i for i, line in enumerate(steps) if line.startswith("docker build"))
    up = next(i for i, line in enumerate(steps) if "docker-compose up" in line)
    assert build < up
    assert steps[build].startswith("docker build -t me/fc:1 -f nodes/Dockerfile .")
    header = (out / "docker-compose.yml").read_text(encoding="utf-8").split("services:", 1)[0]
    assert "docker build -t me/fc:1 -f nodes/Dockerfile ." in header
    assert "--build" not in header.replace("docker build", "")
    services = own_reading(out / "docker-compose.yml")["services"]
    assert all("build" not in s and s["image"] == "me/fc:1" for s in services.values())
    compose_config(out / "docker-compose.yml")


# --- the YAML emitter ---------------------------------------------------------------------------


def test_yaml_emitter_round_trips_awkward_values() -> None:
    document = {
        "services": {
            "n0": {
                "plain": ["yes", "no", "on", "off", "null", "~", "1", "0x1f", "1:20", "", " x "],
                "on": "key that YAML 1.1 reads as a boolean",
                "Yes": True,
                "n": False,
                "quotes": "a \"b\" 'c' \\ # d: e\n\tf",
                "unicode": "données ✓",
                "ints": [0, -3, 65535],
                "empty_list": [],
                "empty_map": {},
                "a key with spaces": {"nested": {"deeper": ["x"]}},
                "long": ["a" * 30] * 5,
            }
        }
    }
    text = dumps_yaml(document)
    assert own_yaml(text) == document


def own_yaml(text: str) -> Any:
    if LOAD_YAML is None:
        pytest.skip("no YAML parser here (PyYAML, or docker-compose's)")
    return LOAD_YAML(text)


# --- nodes/Dockerfile ---------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of nodes/Dockerfile, continuation lines joined."""
    text = (REPO / "nodes" / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    ))  # fmt: skip
    steps = []
    defaults: dict[str, str] = {}  # ARG NAME=default, substituted as a plain build would
    for line in joined.splitlines():
        if line.strip():
            op, _, rest = line.strip().partition(" ")
            if op.upper() == "ARG" and "=" in rest:
                name, _, value = rest.strip().partition("=")
                defaults[name] = value
            for name, value in defaults.items():
                rest = rest.replace(f"${{{name}}}", value)
            steps.append((op.upper(), rest.strip()))
    return steps


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def test_dockerfile_copies_only_what_exists_and_is_not_ignored(pyproject: dict[str, Any]) -> None:
    ignore = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied: list[str] = []
    for op, args in dockerfile():
        if op in ("COPY", "ADD"):
            assert op == "COPY", "ADD fetches and unpacks; COPY is what is meant"
            *sources, _ = [a for a in args.split() if not a.startswith("--")]
            copied += [s.rstrip("/") for s in sources]
    assert copied, "nodes/Dockerfile copies nothing"
    for source in copied:
        assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
        hits = [p for p in ignore if fnmatch(source, p.rstrip("/"))]
        assert not hits, f"COPY {source} is excluded by .dockerignore {hits}"
    # What pip needs to build the package: pyproject, its readme, the package itself.
    needed = {"pyproject.toml", "fedcore", pyproject["project"]["readme"]}
    for name in pyproject["project"].get("license-files", []):
        needed.add(name)
    assert needed <= set(copied), needed - set(copied)


def test_dockerfile_installs_the_cpu_torch_that_pyproject_allows(
    pyproject: dict[str, Any],
) -> None:
    steps = dockerfile()
    froms = [args for op, args in steps if op == "FROM"]
    assert froms == ["python:3.11-slim"], froms  # the default of ARG BASE
    py = pyproject["project"]["requires-python"]
    assert py == ">=3.11"
    torch_spec = next(d for d in pyproject["project"]["dependencies"] if d.startswith("torch"))
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert f'"{torch_spec.replace(" ", "")}"' in runs, (torch_spec, runs)
    torch_step = next(args for op, args in steps if op == "RUN" and "torch" in args)
    assert "download.pytorch.org/whl/cpu" in torch_step and "--index-url" in torch_step
    assert "--no-cache-dir" in torch_step
    assert re.search(r"pip install --no-cache-dir \"?\.(\[[a-z,]+\])?\"?", runs)
    extras = re.findall(r"\.\[([a-z,]+)\]", runs)
    for extra in ",".join(extras).split(","):
        assert not extra or extra in pyproject["project"]["optional-dependencies"]


def test_dockerfile_runs_fedcore_as_a_non_root_user(pyproject: dict[str, Any]) -> None:
    steps = dockerfile()
    ops = [op for op, _ in steps]
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")
    assert ("WORKDIR", "/fedcore") in steps
    assert ("EXPOSE", "7000") in steps
    assert ("ENTRYPOINT", '["fedcore"]') in steps
    assert "fedcore" in pyproject["project"]["scripts"]


@pytest.fixture
def _no_compose(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PATH", "")
    yield


@pytest.mark.usefixtures("_no_compose")
def test_missing_docker_compose_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDCORE_REQUIRE_COMPOSE", "1")
    with pytest.raises(pytest.fail.Exception, match="FEDCORE_REQUIRE_COMPOSE"):
        _compose_exe()
    monkeypatch.setenv("FEDCORE_REQUIRE_COMPOSE", "0")
    with pytest.raises(pytest.skip.Exception):
        _compose_exe()


_DATA_MODULES = ("sklearn", "fedcore.data", "fedcore.setup.training", "fedcore.models")


def test_deployment_writers_load_no_dataset(tmp_path: Path) -> None:
    """``fedcore compose``, ``compose --swarm`` and ``fedcore k8s`` write files from the
    run plan alone: a fresh interpreter running all three never imports the data path (so
    no dataset is loaded and no model built), and the files name every node."""
    script = f"""
import sys
from fedcore.cli import main
base = {str(tmp_path)!r}
for argv in (
    ["compose", "--out", base + "/compose"],
    ["compose", "--swarm", "--out", base + "/swarm"],
    ["k8s", "--out", base + "/k8s"],
):
    assert main([*argv, "-q", "--set", "topology.nodes=5"]) == 0, argv
print(sorted(m for m in sys.modules if m.startswith({_DATA_MODULES!r})))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
    for folder in ("compose", "swarm", "k8s"):
        text = "".join(p.read_text() for p in (tmp_path / folder).rglob("*.y*ml"))
        assert all(f"n{i}" in text for i in range(5)), folder
