"""Plug-ins from outside the package, through the documented paths only (the "Where to add
things" table of docs/architecture.md): a toy algorithm, asynchronous algorithm, codec,
dataset, model, topology kind and deployment target, written in ``tmp_path`` as a package
with a dist-info (its ``entry_points.txt``: what ``pip install`` of a package that declares
them leaves), found on ``sys.path``, and each one run and seen to be used; a topology kind
whose entry point names a ``registry.Entry`` that declares its parameter and edge estimate,
and bad declarations refused in one line; a name registered in-process refused by ``fedcore
launch`` and the deployment writers; the installed deployment targets in ``--help``. The
entry points, the config, the declaring entry, the ``fedcore deploy`` and ``fedcore
topology show`` commands and the in-process registration are read from
docs/writing-your-own.md ("Plug-ins: ..."), so what the page shows is what runs here."""

from __future__ import annotations

import inspect
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import fedcore
from fedcore import registry
from fedcore.cli.app import main
from fedcore.config import load_config
from fedcore.errors import ConfigError, FedcoreError
from tests import docs_text

FAMILIES = (
    registry.ALGORITHMS,
    registry.CODECS,
    registry.TOPOLOGY_KINDS,
    registry.DATASETS,
    registry.MODELS,
    registry.DEPLOY_TARGETS,
)

TOY = {
    "calls.py": """
        CALLS: dict[str, int] = {}

        def count(what: str) -> None:
            CALLS[what] = CALLS.get(what, 0) + 1
    """,
    "algo.py": """
        from fedcore.algorithms.asynchronous import ADPSGD
        from fedcore.algorithms.ops import OPS
        from toyplug.calls import count

        def toy_sync(**options):
            count("algorithm")
            return OPS(**options)

        class ToyAsync(ADPSGD):
            name = "toy-async"

            @staticmethod
            def step(x, w, grad, lr):
                count("step")
                return ADPSGD.step(x, w, grad, lr)

        def toy_async(**options):
            count("async")
            return ToyAsync(**options)
    """,
    "codec.py": """
        from fedcore.compression.base import RawCodec
        from toyplug.calls import count

        class Counting:
            \"\"\"Raw bytes, counted (not a RawCodec: an engine skips a lossless one).\"\"\"

            name = "toy-codec"

            def __init__(self):
                self.raw = RawCodec()

            def encode(self, tensor):
                count("encode")
                return self.raw.encode(tensor)

            def roundtrip_rows(self, *args, **kwargs):
                count("encode")
                return self.raw.roundtrip_rows(*args, **kwargs)

            def __getattr__(self, name):
                return getattr(self.raw, name)

        def toy_codec(name, options, generator):
            return Counting()
    """,
    "topo.py": """
        from fedcore.topology.generators import ring
        from toyplug.calls import count

        def toy_ring(nodes, seed, params):
            count("topology")
            return ring(nodes, directed=True)
    """,
    "data.py": """
        import torch
        from fedcore.data import Dataset
        from toyplug.calls import count

        def toy_data(*, seed, test_fraction):
            count("dataset")
            g = torch.Generator().manual_seed(seed)
            y = torch.arange(96) % 3
            x = torch.randn(96, 5, generator=g) + y[:, None].float()
            return Dataset(name="toy", x_train=x[:80], y_train=y[:80], x_test=x[80:],
                           y_test=y[80:], num_classes=3)
    """,
    "model.py": """
        from torch import nn
        from toyplug.calls import count

        def toy_model(*, input_dim, num_classes, **options):
            count("model")
            return nn.Sequential(nn.Flatten(), nn.Linear(input_dim, num_classes))
    """,
    "deploy.py": """
        from pathlib import Path

        def toy_target(config, out, *, image, port):
            path = Path(out) / "toy-deploy.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{image} {port} {config.topology.nodes}\\n")
            return path
    """,
    "bad.py": """
        from fedcore import registry

        def raises(*args, **kwargs):
            raise RuntimeError("boom")

        def wrong(*args, **kwargs):
            return 42

        def hops(nodes, seed, params):
            from toyplug.topo import toy_hops

            return toy_hops(nodes, seed, params)

        BAD_KEY = registry.Entry("bad-kind", "toyplug.bad:hops", keys=("q",))
        BAD_KEYS = registry.Entry("bad-kind", "toyplug.bad:hops", keys="degree")
        BAD_TAG = registry.Entry("bad-kind", "toyplug.bad:hops", tags=frozenset({"convex"}))
        BAD_EDGES = registry.Entry("bad-kind", "toyplug.bad:hops", edges=3)
        BAD_NAME = registry.Entry("other-kind", "toyplug.bad:hops")
        BAD_TARGET = registry.Entry("bad-kind", "toyplug/bad.py")
    """,
}

SECTION = (
    "Plug-ins: your own codec, topology kind, dataset, model, algorithm, asynchronous "
    "algorithm or deployment target from your own package"
)
"""The docs' section (``docs/writing-your-own.md``) whose snippets these tests run: its
``mypkg`` and ``my-`` names are this file's ``toyplug`` and ``toy-`` ones."""


def _toy(text: str) -> str:
    """The docs' ``mypkg`` names as this file's toys."""
    return text.replace("mypkg", "toyplug").replace("my_", "toy_").replace("my-", "toy-")


def _blocks(language: str) -> list[str]:
    """The section's fenced ``language`` blocks, with the toys' names."""
    text = docs_text.section(SECTION)
    return [_toy(b) for b in re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)]


def _documented_entry_points() -> str:
    """The section's ``pyproject.toml`` entry points as ``entry_points.txt`` (what ``pip
    install`` of a package that declares them leaves)."""
    declared = tomllib.loads(_blocks("toml")[0])["project"]["entry-points"]
    return "".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in names.items())
        for group, names in declared.items()
    )


ENTRY_POINTS = _documented_entry_points()

TOY["topo.py"] = textwrap.dedent(TOY["topo.py"]) + "\n" + _blocks("python")[0]
"""The toy kinds: ``toy-ring``, and the docs' ``my-hops``, which declares its parameter."""


def _install(root: Path, entry_points: str, dist: str = "toyplug") -> None:
    """What ``pip install`` leaves of a package declaring ``entry_points``: its modules and
    its dist-info, in a folder on ``sys.path``."""
    package = root / "toyplug"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    for name, text in TOY.items():
        (package / name).write_text(textwrap.dedent(text))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy package installed in ``tmp_path``; every family as it was afterwards."""
    saved = [(f, dict(f._entries), dict(f._origins), f._scanned) for f in FAMILIES]
    for family in FAMILIES:
        family._scanned = False
    site = tmp_path / "site"
    site.mkdir()
    _install(site, ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    yield tmp_path
    for family, entries, origins, scanned in saved:
        family._entries, family._origins, family._scanned = entries, origins, scanned
    for name in [m for m in sys.modules if m == "toyplug" or m.startswith("toyplug.")]:
        del sys.modules[name]


def _calls() -> dict[str, int]:
    from toyplug.calls import CALLS  # type: ignore[import-not-found]

    return CALLS  # type: ignore[no-any-return]


TINY = {"run": {"rounds": 3, "eval_every": 3}, "topology": {"nodes": 4}}


def test_a_synchronous_run_of_plugged_in_names(plugins: Path) -> None:
    result = fedcore.run(
        tomllib.loads(_blocks("toml")[1]),  # the docs' config
        out_dir=plugins / "sync",
        threads=1,
        run=TINY["run"],
    )
    assert result.status == "completed"
    calls = _calls()
    for what in ("algorithm", "dataset", "model", "topology", "encode"):
        assert calls.get(what, 0) > 0, (what, calls)
    config = (result.out_dir / "config.toml").read_text()
    for name in ("toy-sync", "toy-codec", "toy-ring", "toy-data", "toy-model"):
        assert name in config


def test_an_asynchronous_plugin_runs_on_the_event_engine(plugins: Path) -> None:
    result = fedcore.run(
        {
            "algorithm": {"name": "toy-async", "lr": 0.1},
            "topology": {"kind": "ring"},
            "time": {"step_s": 0.1},
        },
        out_dir=plugins / "async",
        threads=1,
        **TINY,
    )
    assert result.status == "completed"
    assert _calls().get("async", 0) > 0 and _calls().get("step", 0) > 0
    assert "events" in str(result.summary.get("engine"))


def test_a_plugged_in_deployment_target_writes_its_file(
    plugins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (command,) = _blocks("bash")
    argv = shlex.split(command.split("#")[0])
    assert argv[:2] == ["fedcore", "deploy"] and argv[argv.index("--target") + 1] == "toy-target"
    out = plugins / argv[argv.index("--out") + 1]
    argv[argv.index("--out") + 1] = str(out)
    assert main(argv[1:]) == 0
    written = (out / "toy-deploy.txt").read_text().split()
    assert written[:2] == ["fedcore:latest", "7100"]
    assert "wrote" in capsys.readouterr().out


def test_register_in_process_and_config_accepts_the_name(plugins: Path) -> None:
    code = _blocks("python")[-1]  # the docs' registration
    exec(code, {})
    entry = registry.TOPOLOGY_KINDS.entry("toy-ring-2")
    assert entry.target == "toyplug.topo:toy_ring"
    assert entry.edges is not None  # a plug-in kind gets the complete graph's estimate
    config = load_config(None, ["topology.kind=toy-ring-2"])
    assert config.topology.kind == "toy-ring-2"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ops", "clashes with the built-in"),
        ("Bad:Name", "is not a name"),
    ],
)
def test_register_refuses_a_bad_name_in_one_line(plugins: Path, name: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as caught:
        registry.ALGORITHMS.register(registry.Entry(name, "toyplug.algo:toy_sync"))
    assert "\n" not in str(caught.value)


def _edges(nodes: int, topology: object) -> int:
    return nodes


@pytest.mark.parametrize(
    ("family", "declared", "why"),
    [
        ("CODECS", {"keys": ("level",)}, "'level' is not a key a codec plug-in may take (none)"),
        ("DATASETS", {"keys": ("size",)}, "'size' is not a key a dataset plug-in may take (one"),
        ("DATASETS", {"tags": {"images"}}, "tag 'images' is not one a dataset plug-in may carry"),
        ("ALGORITHMS", {"edges": _edges}, "edges = <function _edges"),
        ("MODELS", {"keys": ("not a name",)}, "key 'not a name' is not a key name"),
    ],
)
def test_register_refuses_a_bad_declaration_in_one_line(
    plugins: Path, family: str, declared: dict[str, object], why: str
) -> None:
    entry = registry.Entry("toy-declared", "toyplug.bad:wrong", **declared)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        getattr(registry, family).register(entry)
    assert why in str(caught.value) and "\n" not in str(caught.value)


def test_register_takes_what_its_family_declares(plugins: Path) -> None:
    """A model's keys are any names (a list is made a tuple); a kind's, [topology] keys."""
    entry = registry.MODELS.register(
        registry.Entry("toy-model-2", "toyplug.model:toy_model", ["depth"])  # type: ignore[arg-type]
    )
    assert entry.keys == ("depth",)
    entry = registry.TOPOLOGY_KINDS.register(
        registry.Entry("toy-hub", "toyplug.topo:toy_hops", ("server",), frozenset({"server"}))
    )
    assert entry.edges is not None and "server" in registry.TOPOLOGY_KINDS.entry("toy-hub").tags


@pytest.mark.parametrize(
    ("declared", "answer"),
    [
        ("fp16 = toyplug.codec:toy_codec", r"distribution clashing .*built-in codec 'fp16'"),
        ("toy-codec = toyplug.bad:wrong", r"distribution .* clashes with the one from distr"),
    ],
)
def test_an_installed_clash_is_refused_naming_the_distribution(
    plugins: Path, monkeypatch: pytest.MonkeyPatch, declared: str, answer: str
) -> None:
    other = plugins / "other"
    other.mkdir()
    _install(other, f"[fedcore.codecs]\n{declared}\n", dist="clashing")
    monkeypatch.syspath_prepend(str(other))
    with pytest.raises(ConfigError, match=answer) as caught:
        load_config(None, ["compression.codec=no-such-codec"])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("target", ["toyplug.bad:raises", "toyplug.bad:wrong"])
def test_a_failing_plugin_is_refused_in_one_line(
    plugins: Path, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedcore.algorithms import make_algorithm
    from fedcore.compression import make_codec
    from fedcore.data import load_dataset
    from fedcore.models import build_model
    from fedcore.topology.kinds import build

    registry.CODECS.register(registry.Entry("bad-codec", target))
    registry.MODELS.register(registry.Entry("bad-model", target))
    registry.DEPLOY_TARGETS.register(registry.Entry("bad-target", target))
    registry.TOPOLOGY_KINDS.register(registry.Entry("bad-kind", target))
    registry.ALGORITHMS.register(registry.Entry("bad-algorithm", target))
    registry.DATASETS.register(registry.Entry("bad-data", target))
    with pytest.raises(FedcoreError) as codec:
        make_codec("bad-codec")
    with pytest.raises(FedcoreError) as model:
        build_model("bad-model", input_dim=3, num_classes=2, seed=0)
    with pytest.raises(FedcoreError) as kind:
        build("bad-kind", nodes=4)
    with pytest.raises(FedcoreError) as algorithm:
        make_algorithm("bad-algorithm")
    with pytest.raises(FedcoreError) as data:
        load_dataset("bad-data", seed=0)
    capsys.readouterr()
    assert main(["deploy", "--target", "bad-target", "--out", str(plugins / "x")]) == 2
    said = capsys.readouterr().err.strip()
    for text in (*(str(c.value) for c in (codec, model, kind, algorithm, data)), said):
        assert "\n" not in text and ("boom" in text or "int" in text), text


def test_a_plugin_registered_before_the_package_loads_its_registries(tmp_path: Path) -> None:
    """The registries built at import (decoders by codec name, ...) hold the built-in
    names only: a plug-in registered first is loaded when its name is asked for."""
    code = textwrap.dedent(
        """
        from fedcore import registry
        registry.CODECS.register(registry.Entry("late-codec", "json:dumps"))
        registry.TOPOLOGY_KINDS.register(registry.Entry("late-kind", "json:dumps"))
        registry.OPTIMIZERS.register(registry.Entry("late-optimizer", "json:dumps"))
        import fedcore.compression, fedcore.topology.generators, fedcore.models
        import fedcore.algorithms, fedcore.config
        assert "late-codec" not in fedcore.compression.CODECS
        assert "late-codec" not in fedcore.config.CODECS
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(fedcore.__file__).parents[1])},
        check=False,
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_the_docs_declare_every_family_and_every_toy() -> None:
    """The section's snippet declares a toy of each of the seven (each group once), each
    naming a factory this file defines, and links to adding a name inside the package."""
    declared = tomllib.loads(_blocks("toml")[0])["project"]["entry-points"]
    assert sorted(declared) == sorted(f.group for f in FAMILIES)
    targets = [t for names in declared.values() for t in names.values()]
    assert len(targets) == 8
    for target in targets:
        module, _, attribute = target.partition(":")
        text = TOY[module.removeprefix("toyplug.") + ".py"]
        assert f"def {attribute}(" in text or f"{attribute} = registry.Entry(" in text, target
    text = docs_text.section(SECTION)
    assert "architecture.md#where-to-add-things" in text
    for family in ("ALGORITHMS", "CODECS", "TOPOLOGY_KINDS", "DATASETS", "MODELS"):
        assert f"`{family}`" in text or f"registry.{family}" in text


def test_the_docs_signatures_are_the_toys(plugins: Path) -> None:
    """Each row of the section's table of factories gives the signature of the toys of its
    group, as written."""
    declared = tomllib.loads(_blocks("toml")[0])["project"]["entry-points"]
    rows = re.findall(
        r"^\| `(fedcore\.\w+)`[^|]*\| `\w+(\(.*?\))`", docs_text.section(SECTION), re.M
    )
    assert sorted({group for group, _ in rows}) == sorted(declared)
    for group, shown in rows:
        for target in declared[group].values():
            factory = registry.import_object(target, what=group)
            if isinstance(factory, registry.Entry):  # one that declares more: its factory's
                factory = registry.import_object(factory.target, what=group)
            assert str(inspect.signature(factory)) == shown, (group, target)


def test_an_installed_kind_declares_its_parameter_and_edge_estimate(
    plugins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' ``my-hops``: its entry point names a ``registry.Entry`` that declares the
    ``[topology]`` key it takes and its edge estimate; a config passes that key to it."""
    from fedcore.setup.graph import build_topology, estimated_edges

    config = load_config(None, ["topology.kind=toy-hops", "topology.degree=2", "topology.nodes=5"])
    entry = registry.TOPOLOGY_KINDS.entry("toy-hops")
    assert (entry.target, entry.keys) == ("toyplug.topo:toy_hops", ("degree",))
    graph = build_topology(config.topology)
    assert all(len(graph.out_neighbours(n)) == 2 for n in graph.nodes)
    assert estimated_edges(config.topology, 5) == 5 * 3
    result = fedcore.run(
        {"topology": {"kind": "toy-hops", "degree": 2}}, out_dir=plugins / "hops", threads=1, **TINY
    )
    assert result.status == "completed"
    assert load_config(None, ["topology.kind=toy-ring"]).topology.kind == "toy-ring"
    # The docs' command, then a key the kind does not take, refused in one line.
    (shown,) = re.findall(
        r"`fedcore (topology show toy-hops:\S+)`", _toy(docs_text.section(SECTION))
    )
    assert main(shown.split()) == 0
    assert "nodes: 8" in capsys.readouterr().out.replace("  ", " ")
    assert main(["topology", "show", "toy-hops:5:p=0.2"]) == 2
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "it takes degree" in said, said


@pytest.mark.parametrize(
    ("declared", "answer"),
    [
        ("BAD_KEY", r"'q' is not a key a topology kind plug-in may take \(one of rows, cols"),
        ("BAD_KEYS", r"keys = 'degree' is not a tuple of key names"),
        ("BAD_TAG", r"tag 'convex' is not one a topology kind plug-in may carry"),
        ("BAD_EDGES", r"edges = 3 is not callable"),
        ("BAD_NAME", r"is the entry of 'other-kind'; give the entry point and the Entry the same"),
        ("BAD_TARGET", r"its Entry's target 'toyplug/bad.py' is not an import path"),
    ],
)
def test_a_bad_declaration_is_refused_in_one_line_by_the_cli(
    plugins: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    declared: str,
    answer: str,
) -> None:
    other = plugins / "other"
    other.mkdir()
    _install(other, f"[fedcore.topology_kinds]\nbad-kind = toyplug.bad:{declared}\n", "badplug")
    monkeypatch.syspath_prepend(str(other))
    assert main(["topology", "show", "bad-kind:4"]) == 2
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "Traceback" not in said, said
    assert said.startswith(
        "fedcore: error: distribution badplug (entry point fedcore.topology_kinds): "
    )
    assert re.search(answer, said), said


@pytest.mark.parametrize(
    ("how", "peers"),
    [
        ("launch", "the peers fedcore launch starts"),
        ("compose", "the peers of a deployment"),
        ("swarm", "the peers of a deployment"),
        ("k8s", "the pods of a deployment"),
    ],
)
def test_a_name_registered_in_process_is_refused_before_any_peer_starts(
    plugins: Path, how: str, peers: str
) -> None:
    """The peers ``fedcore launch`` starts, and those of a written deployment, import
    fedcore afresh: a name registered in this process is refused in one line that says so,
    before any process starts or any file is written."""
    from fedcore.deploy.compose import write_compose
    from fedcore.deploy.k8s import write_k8s
    from fedcore.deploy.launch import launch
    from fedcore.deploy.swarm import write_stack

    exec(_blocks("python")[-1], {})  # the docs' registration of toy-ring-2
    assert registry.TOPOLOGY_KINDS.registered_here("toy-ring-2")
    assert not registry.TOPOLOGY_KINDS.registered_here("toy-ring")  # installed
    assert not registry.TOPOLOGY_KINDS.registered_here("ring")  # built in
    config = load_config(None, ["topology.kind=toy-ring-2", "topology.nodes=4"])
    out = plugins / "out"
    run = {
        "launch": lambda: launch(config, out_dir=out, show_progress=False),
        "compose": lambda: write_compose(config, out),
        "swarm": lambda: write_stack(config, out),
        "k8s": lambda: write_k8s(config, out),
    }[how]
    with pytest.raises(ConfigError) as caught:
        run()
    said = str(caught.value)
    assert "\n" not in said
    assert said.startswith("topology.kind = 'toy-ring-2' is a topology kind registered in-process")
    assert f"; {peers} see only installed entry points: install it as a plug-in" in said
    assert "docs/writing-your-own.md" in said
    assert not out.exists()


def test_deploy_help_lists_the_installed_targets(
    plugins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["--help"], ["deploy", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "compose, k8s, toy-target" in text, text
    assert registry.DEPLOY_TARGETS.names == registry.DEPLOY_TARGETS.builtin  # none imported


def test_the_parser_reads_no_entry_point_until_help_is_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Listing the installed targets reads every distribution's metadata: only for help."""
    import importlib.metadata

    from fedcore.cli.app import parser

    def refuse(**kwargs: object) -> None:
        raise AssertionError("entry points read to build the parser")

    monkeypatch.setattr(importlib.metadata, "entry_points", refuse)
    parser().parse_args(["deploy", "--target", "compose", "--out", "x"])


def test_the_docs_list_what_a_plugin_may_declare() -> None:
    """A topology kind's keys are the built-in kinds' (the ``[topology]`` keys the config
    passes), a dataset's ``root``; the docs name each key and tag a plug-in may declare."""
    for family in (registry.TOPOLOGY_KINDS, registry.DATASETS):
        builtin = {k for name in family.builtin for k in family.entry(name).keys}
        assert set(family.plugin_keys or ()) == builtin, family.what
    from fedcore.config import TopologyConfig

    fields = set(TopologyConfig.__dataclass_fields__)
    assert set(registry.TOPOLOGY_KINDS.plugin_keys or ()) <= fields
    text = docs_text.section(SECTION)
    for family in FAMILIES:
        for word in (*(family.plugin_keys or ()), *family.plugin_tags):
            assert f"`{word}`" in text, (family.what, word)
