"""Plug-ins from outside the package, through the documented paths only (the "Where to add
things" table of docs/architecture.md): a toy algorithm, asynchronous algorithm, codec,
dataset, model, topology kind and deployment target, written in ``tmp_path`` as a package
with a dist-info (its ``entry_points.txt``: what ``pip install`` of a package that declares
them leaves), found on ``sys.path``, and each one run and seen to be used. The entry points,
the config, the ``fedcore deploy`` command and the in-process registration are read from
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
        def raises(*args, **kwargs):
            raise RuntimeError("boom")

        def wrong(*args, **kwargs):
            return 42
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
    (code,) = _blocks("python")  # the docs' registration
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
    assert len(targets) == 7
    for target in targets:
        module, _, attribute = target.partition(":")
        assert f"def {attribute}(" in TOY[module.removeprefix("toyplug.") + ".py"], target
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
            assert str(inspect.signature(factory)) == shown, (group, target)
