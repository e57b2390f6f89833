"""A user's algorithm by import path (``algorithm.name = "pkg.module:factory"``), and the
docs' "Write your own algorithm" (``docs/writing-your-own.md``): its commands are read from
that page and run here, so the section cannot drift from the code (the launch of 8 peers is
marked grpc). The tests keep their ``readme`` names, which ``.ci/run`` lists."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from fedcore.algorithms import Inbox, RoundContext, make_algorithm
from fedcore.algorithms.base import model_schema
from fedcore.algorithms.dpsgd import DPSGDRule
from fedcore.algorithms.reference import ModelState
from fedcore.algorithms.rule import is_rule
from fedcore.config import load_config
from fedcore.deploy.launch import user_code_roots
from fedcore.engines.vectorized import unsupported
from fedcore.errors import ConfigError
from fedcore.messages import MessageSchema, Payload
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.results import run_name
from fedcore.simulation.simulate import choose_engine
from fedcore.simulation.sweep import sweep_name
from fedcore.testing import TestNetwork, VectorizedTestNetwork, make_network
from tests import docs_text
from tests.clitools import cli, one_line_error

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "user_algorithm"
PATH = "momentum_gossip:MomentumGossip"


@pytest.fixture
def example_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The example's folder on ``sys.path`` (as running from it puts it there), and its
    module forgotten afterwards."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    sys.modules.pop("momentum_gossip", None)


@pytest.fixture
def user_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, str], str]]:
    """Write a module of the given source in a folder on ``sys.path``; return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
        importlib.invalidate_caches()
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


# -- loading --------------------------------------------------------------------------


@pytest.mark.usefixtures("example_path")
def test_a_rule_by_import_path_is_a_checked_rule() -> None:
    algorithm = make_algorithm(PATH, beta=0.5)
    assert is_rule(algorithm)
    assert algorithm.name == "momentum-gossip" and algorithm.mixing == "doubly-stochastic"
    assert algorithm.rule.beta == 0.5
    assert make_algorithm(PATH).rule.beta == 0.9  # its default


def test_what_a_factory_returns_decides_how_it_runs() -> None:
    """A rule is a rule (each engine runs it through its adapter); a per-message algorithm
    is used as it is."""
    assert type(make_algorithm("fedcore.algorithms.dpsgd:DPSGDRule")) is DPSGDRule
    assert type(make_algorithm("fedcore.algorithms.dpsgd:DPSGD")) is DPSGDRule
    assert type(make_algorithm("tests.algorithms.test_user_algorithm:MyCentral")) is MyCentral


def _params(net: TestNetwork | VectorizedTestNetwork) -> dict[str, torch.Tensor]:
    return net.models()


@pytest.mark.parametrize("engine", ["messages", "vectorized"])
def test_a_built_in_rule_by_import_path_is_the_built_in(engine: str) -> None:
    """``"fedcore.algorithms.dpsgd:DPSGDRule"`` is ``dpsgd``, bit for bit, on either engine."""
    settings = {"algorithm.lr": 0.3}
    mine = make_network("ring:6", algorithm="fedcore.algorithms.dpsgd:DPSGDRule",
                        settings=settings, engine=engine).run(8)  # fmt: skip
    ours = make_network("ring:6", algorithm="dpsgd", settings=settings, engine=engine).run(8)
    assert isinstance(mine, VectorizedTestNetwork if engine == "vectorized" else TestNetwork)
    for node, x in _params(ours).items():
        assert torch.equal(_params(mine)[node], x), node


@pytest.mark.usefixtures("example_path")
def test_the_example_runs_alike_on_both_engines_and_is_dpsgd_without_momentum() -> None:
    """The example rule gets the vectorized engine (``auto``), equals the message engine
    bit for bit, and with ``beta = 0`` is D-PSGD."""
    settings: dict[str, Any] = {"algorithm.lr": 0.3, "algorithm.beta": 0.9}
    auto = make_network("ring:6", algorithm=PATH, settings=settings, engine="auto").run(8)
    messages = make_network("ring:6", algorithm=PATH, settings=settings).run(8)
    assert isinstance(auto, VectorizedTestNetwork) and isinstance(messages, TestNetwork)
    assert auto.state.momentum.shape == auto.state.x.shape and auto.state.pending.shape[1] == 0
    for node, x in _params(messages).items():
        assert torch.equal(_params(auto)[node], x), node
    still = make_network("ring:6", algorithm=PATH, settings={**settings, "algorithm.beta": 0.0})
    plain = make_network("ring:6", algorithm="dpsgd", settings={"algorithm.lr": 0.3})
    momentum = _params(messages)
    still.run(8)
    plain.run(8)
    for node, x in _params(plain).items():
        assert torch.equal(_params(still)[node], x), node
        assert not torch.equal(momentum[node], x), node  # beta = 0.9 moved elsewhere


@pytest.mark.usefixtures("example_path")
def test_make_network_takes_a_rule_object() -> None:
    from momentum_gossip import MomentumGossip  # type: ignore[import-not-found]

    net = make_network("ring:4", algorithm=MomentumGossip(beta=0.5), engine="vectorized")
    assert isinstance(net, VectorizedTestNetwork)
    assert net.config.algorithm.name == "momentum-gossip"
    assert net.run(2).round == 2


class MyCentral:
    """A user's per-message algorithm (the protocol of fedcore.algorithms.base): every
    node averages its post-step model with those that arrived."""

    name = "my-central"
    mixing = "complete"
    phases = 1

    def init(self, params: torch.Tensor) -> ModelState:
        return ModelState(params.clone())

    def model(self, state: ModelState) -> torch.Tensor:
        return state.x

    def step(self, state: ModelState, grad: torch.Tensor, ctx: RoundContext) -> Any:
        x = state.x - ctx.lr * grad
        return ModelState(x), dict.fromkeys(ctx.out_weights, Payload({"x": x}))

    def expected_senders(self, phase: int, ctx: RoundContext) -> tuple[str, ...]:
        return tuple(ctx.in_weights)

    def message_schema(self, phase: int, sender: str, ctx: RoundContext) -> MessageSchema:
        return model_schema("x")

    def mix(self, state: ModelState, phase: int, inbox: Inbox, ctx: RoundContext) -> Any:
        total = state.x.clone()
        for sender in sorted(inbox):
            total.add_(inbox[sender].tensor("x"))
        return ModelState(total / (1 + len(inbox))), {}


def test_a_per_message_algorithm_runs_on_the_message_engine_only() -> None:
    path = "tests.algorithms.test_user_algorithm:MyCentral"
    net = make_network("complete:4", algorithm=path, engine="auto")
    assert isinstance(net, TestNetwork) and type(net.network.algorithm) is MyCentral
    config = load_config(None, [f"algorithm.name={path}", "topology.kind=complete",
                                "topology.nodes=4"])  # fmt: skip
    setup = prepare_run(config)
    why = unsupported(setup) or ""
    assert "per-message protocol" in why and "fedcore.algorithms.rule.Rule" in why
    assert choose_engine(setup, "auto")[0] == "messages"


# -- errors ---------------------------------------------------------------------------


class _Bad(NamedTuple):
    source: str | None  # a module to write (None: none)
    name: str
    options: dict[str, Any]
    needles: tuple[str, ...]


_RULE = """
from fedcore.algorithms.dpsgd import DPSGDRule
class Rule(DPSGDRule):
    def __init__(self, step: float) -> None:
        if step < 0:
            raise ValueError("step must be >= 0")
class Everywhere(DPSGDRule):
    pattern = "everyone"
class Nameless(DPSGDRule):
    name = ""
def nothing():
    return 42
VALUE = 3
"""

BAD = {
    "not found": _Bad(None, "nosuch_mod_xyz:Rule", {}, (
        "no module named 'nosuch_mod_xyz'", "PYTHONPATH", "folder that holds the module")),
    "a dependency missing": _Bad("import nosuch_dep_xyz\n", "{m}:Rule", {}, (
        "does not import", "nosuch_dep_xyz", "install what it needs")),
    "fails to import": _Bad("raise RuntimeError('boom at import')\n", "{m}:Rule", {}, (
        "importing module", "boom at import", "fix the module")),
    "no such attribute": _Bad(_RULE, "{m}:Nope", {}, ("has no attribute 'Nope'",)),
    "not callable": _Bad(_RULE, "{m}:VALUE", {}, ("object of type int", "not a class or")),
    "malformed": _Bad(None, "a b:c", {}, ("not an import path", "'pkg.module:factory'")),
    "no attribute part": _Bad(None, "mod:", {}, ("not an import path",)),
    "a file": _Bad(None, "examples/user_algorithm/momentum_gossip.py:MomentumGossip", {}, (
        "names a file", "'momentum_gossip:MomentumGossip'", "PYTHONPATH")),
    "unknown option": _Bad(_RULE, "{m}:Rule", {"step": 1.0, "gamma": 2}, (
        "has no option gamma (its options: step)",)),
    "option left out": _Bad(_RULE, "{m}:Rule", {}, ("cannot be built", "'step'")),
    "factory fails": _Bad(_RULE, "{m}:Rule", {"step": -1.0}, (
        "failed to build", "ValueError: step must be >= 0")),
    "returns something else": _Bad(_RULE, "{m}:nothing", {}, (
        "object of type int", "neither an update rule", "nor a per-message algorithm")),
    "bad pattern": _Bad(_RULE, "{m}:Everywhere", {}, ("pattern = 'everyone'", "'neighbours'")),
    "no name": _Bad(_RULE, "{m}:Nameless", {}, ("its name is ''",)),
    "unknown built-in": _Bad(None, "nope", {}, ("unknown algorithm 'nope'", "pkg.module:factory")),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_a_bad_algorithm_is_one_config_error(
    case: _Bad, user_module: Callable[[str, str], str], request: pytest.FixtureRequest
) -> None:
    module = re.sub(r"\W", "_", f"user_alg_{request.node.callspec.id}")
    if case.source is not None:
        user_module(module, case.source)
    name = case.name.format(m=module)
    with pytest.raises(ConfigError) as caught:
        make_algorithm(name, **case.options)
    text = str(caught.value)
    assert "\n" not in text and text.endswith("."), text
    for needle in case.needles:
        assert needle in text, (needle, text)


@pytest.mark.usefixtures("example_path")
def test_the_examples_own_checks_and_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"algorithm.beta = 1.5 must be a number in \[0, 1\)"):
        make_algorithm(PATH, beta=1.5)
    with pytest.raises(ConfigError, match=r"has no option gamma \(its options: beta\)"):
        make_algorithm(PATH, gamma=1)


def test_the_cli_says_it_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(
        capsys,
        ["simulate", "-q", "--set", "algorithm.name=nosuch_mod_xyz:Rule"],
        "algorithm.name = 'nosuch_mod_xyz:Rule': no module named 'nosuch_mod_xyz'",
    )


# -- names, launch, containers --------------------------------------------------------


@pytest.mark.usefixtures("example_path")
def test_runs_are_named_by_the_algorithms_own_name() -> None:
    overrides = [f"algorithm.name={PATH}", "algorithm.beta=0.5", "topology.kind=ring"]
    config = load_config(None, [*overrides, "topology.nodes=4"])
    name = run_name(config, prepare_run(config), overrides)
    assert name.startswith("momentum-gossip-ring-4-algorithm.name=momentum-gossip-"), name
    assert ":" not in name and "/" not in name
    swept = sweep_name(config, overrides, [0, 1])
    assert swept.startswith("momentum-gossip-ring-4-algorithm.name=momentum-gossip-"), swept
    assert ":" not in swept


@pytest.mark.usefixtures("example_path")
def test_launch_gives_its_peers_the_folder_the_module_came_from() -> None:
    config = load_config(EXAMPLE / "run.toml")
    make_algorithm(config.algorithm.name)  # imported here, as prepare_run does
    assert user_code_roots(config) == [str(EXAMPLE.resolve())]
    package = load_config(None, ["algorithm.name=fedcore.algorithms.dpsgd:DPSGDRule"])
    make_algorithm(package.algorithm.name)
    assert user_code_roots(package) == [str(REPO)]
    assert user_code_roots(load_config(None)) == []


def test_compose_says_the_image_must_import_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(EXAMPLE)
    try:
        status, out, err = cli(capsys, "compose", "run.toml", "--out", str(tmp_path / "d"))
    finally:
        sys.modules.pop("momentum_gossip", None)
        if str(EXAMPLE) in sys.path:  # the CLI put its working folder there
            sys.path.remove(str(EXAMPLE))
    assert status == 0, err
    assert "must import your code too (algorithm.name = 'momentum_gossip:MomentumGossip')" in out
    saved = (tmp_path / "d" / "config.toml").read_text(encoding="utf-8")
    assert 'name = "momentum_gossip:MomentumGossip"' in saved


# -- the docs' section, run ------------------------------------------------------------

SMALL = ["--set", "run.rounds=20", "--set", "run.eval_every=10"]
"""Fewer rounds than the docs' runs (the same code path)."""

CONSOLE = "import sys; from fedcore.cli import main; sys.exit(main())"
"""What the ``fedcore`` console script runs; with ``python -P`` the working folder is not
on ``sys.path``, as for the script, so the CLI itself must find modules there."""


class Command(NamedTuple):
    cwd: Path
    env: dict[str, str]
    argv: list[str]  # after "fedcore"


def _section() -> str:
    return docs_text.section("Write your own algorithm")


def readme_commands() -> list[Command]:
    """Every command of the section's ```bash blocks, each block from the repository root
    (``cd`` moves; ``VAR=value`` before ``fedcore`` sets the environment)."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", _section(), re.S | re.M):
        cwd = REPO
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[0] == "cd":
                cwd = (cwd / words[1]).resolve()
                continue
            env = {}
            while "=" in words[0]:
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            assert words[0] == "fedcore", f"the test runs only fedcore commands, not {line!r}"
            commands.append(Command(cwd, env, words[1:]))
    return commands


COMMANDS = readme_commands()


def _index(*words: str) -> int:
    found = [i for i, c in enumerate(COMMANDS) if all(w in c.argv for w in words)]
    assert found, f"the docs' section has no command with {words}"
    return found[0]


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], dict[str, Any]]:
    """Run the docs' command ``i`` (once) with :data:`SMALL`; return its summary."""
    out = tmp_path_factory.mktemp("readme")
    done: dict[int, dict[str, Any]] = {}

    def run(i: int) -> dict[str, Any]:
        if i not in done:
            command = COMMANDS[i]
            env = {**os.environ, **command.env}
            path = [*command.env.get("PYTHONPATH", "").split(os.pathsep), str(REPO)]
            env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
            argv = [sys.executable, "-P", "-c", CONSOLE, *command.argv]
            argv += ["-q", "--out", str(out / f"run{i}"), *SMALL]
            ran = subprocess.run(
                argv, cwd=command.cwd, env=env, capture_output=True, text=True, timeout=240
            )
            assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
            done[i] = json.loads((out / f"run{i}" / "summary.json").read_text(encoding="utf-8"))
        return done[i]

    return run


def test_the_readme_shows_each_way_to_run_it() -> None:
    assert {c.argv[0] for c in COMMANDS} == {"simulate", "launch"}
    for words in (["run.toml"], ["--engine", "messages"], ["launch"], ["topology.nodes=10000"]):
        _index(*words)
    assert any("PYTHONPATH" in c.env for c in COMMANDS)
    text = _section()
    for piece in ("init", "model", "step", "mix", "schema", "Rows", "Slot", "Send", "gossip",
                  "pull", "rows.compress", "momentum_gossip.py"):  # fmt: skip
        assert piece in text, piece
    assert "(engines.md#thousands-of-peers-the-vectorized-engine)" in text
    assert "\n## Thousands of peers: the vectorized engine\n" in docs_text.page("engines.md")
    shown = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)[1]  # the example's round
    source = (EXAMPLE / "momentum_gossip.py").read_text(encoding="utf-8")
    for line in shown.splitlines():
        if line.strip() and not line.strip().startswith("def "):
            assert line in source, f"the docs' excerpt has drifted: {line!r}"


def test_the_readme_commands_run(readme_runs: Callable[[int], dict[str, Any]]) -> None:
    """Every simulate command of the section, from its folder (or with PYTHONPATH): the
    8-peer runs identical bit for bit, 10,000 peers on the vectorized engine."""
    eight = [i for i, c in enumerate(COMMANDS) if c.argv[0] == "simulate"]
    runs = {i: readme_runs(i) for i in eight}
    big = _index("topology.nodes=10000")
    assert runs[big]["nodes"] == 10_000 and runs[big]["engine"] == "vectorized"
    small = [s for i, s in runs.items() if i != big]
    assert {s["engine"] for s in small} == {"vectorized", "messages"}
    for summary in runs.values():
        assert summary["algorithm"] == "momentum-gossip" and summary["rounds"] == 20
    assert all(s["params_sha256"] == small[0]["params_sha256"] for s in small)
    assert len(small[0]["params_sha256"]) == 8


@pytest.mark.grpc
def test_the_readme_launch_equals_the_message_engine(
    readme_runs: Callable[[int], dict[str, Any]],
) -> None:
    launched = readme_runs(_index("launch"))
    simulated = readme_runs(_index("--engine", "messages"))
    assert launched["transport"] == "grpc" and launched["nodes"] == 8
    assert launched["params_sha256"] == simulated["params_sha256"]
    assert launched["traffic"]["messages_sent"] == simulated["traffic"]["messages_sent"]
