"""A user's rule that fails at run time, and what makes an object a rule.

A method of a user's rule that raises, or returns what no engine can use (``None``, a wrong
type, a tensor of the wrong shape), is one :class:`~fedcore.errors.UserCodeError` line
naming the rule, the method and what was expected: on the message engine, the vectorized
engine, through the CLI (exit status 3, the traceback in the run's ``error.log``) and on
``fedcore launch`` peers (marked grpc). What makes an object a rule is declared (its class
subclasses :class:`~fedcore.algorithms.rule.Rule`), so a per-message algorithm that hands
its attributes on to a built-in one runs as what it is.
"""

from __future__ import annotations

import importlib
import os
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.algorithms import make_algorithm
from fedcore.algorithms.rule import is_rule
from fedcore.algorithms.user import CheckedRule
from fedcore.cli.app import parser
from fedcore.cli.common import EXIT_USER_CODE
from fedcore.errors import ConfigError, UserCodeError
from fedcore.node import NodeRule
from fedcore.testing import TestNetwork, VectorizedTestNetwork, make_network
from tests.clitools import TINY, cli, one_line_error

MODULE = "user_rule_errors_mod"

SOURCE = """
import torch
from typing import NamedTuple
from fedcore.algorithms.base import model_schema
from fedcore.algorithms.dpsgd import DPSGDRule
from fedcore.algorithms.rule import Rule, Send, gossip
from fedcore.errors import AlgorithmError


class Raises(DPSGDRule):
    name = "raises"
    def mix(self, state, phase, inbox, rows):
        raise KeyError("no such slot, says the user")


class StepNone(DPSGDRule):
    name = "step-none"
    def step(self, state, grad, rows):
        return None


class ShortModel(DPSGDRule):
    name = "short-model"
    def model(self, state):
        return state.x[:, :-1]


class ShortSend(DPSGDRule):
    name = "short-send"
    def step(self, state, grad, rows):
        new, send = super().step(state, grad, rows)
        return new, Send({"x": send.tensors["x"][:, :-1]})


class WrongName(DPSGDRule):
    name = "wrong-name"
    def step(self, state, grad, rows):
        new, send = super().step(state, grad, rows)
        return new, Send({"y": send.tensors["x"]})


class SchemaDict(DPSGDRule):
    name = "schema-dict"
    def schema(self, phase):
        return {"x": None}


class StateTensor(DPSGDRule):
    name = "state-tensor"
    def init(self, params):
        return params.clone()


class OnPurpose(DPSGDRule):
    name = "on-purpose"
    def mix(self, state, phase, inbox, rows):
        raise AlgorithmError("the rule's own refusal, as it wrote it.")


from fedcore.algorithms.ops import RobustPushSumRule
from fedcore.algorithms.rps import RPSRule
from fedcore.algorithms.server import FedAvgRule


class MyFedAvg(FedAvgRule):  # pattern "chosen": talks, trains
    pass


class MyRobustOPS(RobustPushSumRule):  # pattern "edges": edge_fields
    def __init__(self):
        super().__init__("none")


class MyRPS(RPSRule):  # pattern "edges", messages of several lengths: widths
    pass


class Undeclared:  # a rule's members, but no declaration
    name = "undeclared"
    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"
    def init(self, params): ...
    def model(self, state): ...
    def step(self, state, grad, rows): ...
    def mix(self, state, phase, inbox, rows): ...
    def schema(self, phase): return model_schema("x")


class X(NamedTuple):
    x: torch.Tensor


class Plain(Rule):  # a whole rule of its own: gossip averaging, declared by subclassing
    name = "plain"
    mixing = "doubly-stochastic"
    phases = 1
    pattern = "neighbours"
    def init(self, params): return X(params.clone())
    def model(self, state): return state.x
    def step(self, state, grad, rows):
        x = state.x - rows.lr * grad
        return X(x), Send({"x": x})
    def mix(self, state, phase, inbox, rows):
        return X(gossip(state.x, rows.self_weight, inbox)), None
    def schema(self, phase): return model_schema("x")
"""


@pytest.fixture
def bad_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """:data:`SOURCE` as module :data:`MODULE` in a folder on ``sys.path``; the folder."""
    (tmp_path / f"{MODULE}.py").write_text(SOURCE, encoding="utf-8")
    importlib.invalidate_caches()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(MODULE, None)


FAILS = {
    "raises": ("Raises", ("mix()", "raised KeyError", "no such slot, says the user")),
    "returns None": ("StepNone", ("step()", "returned None", "expected a pair (state, Send")),
    "model too short": (
        "ShortModel",
        ("model()", "shape (B, 649)", "expected shape [B, 650] and dtype torch.float32"),
    ),
    "sends too short": ("ShortSend", ("step() sends 'x'", "(B, 649)", "expected shape (B, 650)")),
    "sends another name": ("WrongName", ("step() sends ['y']", "schema(0) says ['x']")),
    "schema not a schema": ("SchemaDict", ("schema()", "type dict", "MessageSchema")),
    "state not a NamedTuple": ("StateTensor", ("init()", "as the state", "NamedTuple")),
}  # fmt: skip
"""Case -> (class, what its one line says; ``B`` stands for the engine's rows)."""


@pytest.mark.usefixtures("bad_rules")
@pytest.mark.parametrize("engine", ["messages", "vectorized"])
@pytest.mark.parametrize("case", list(FAILS))
def test_a_failing_rule_is_one_line_naming_rule_and_method(case: str, engine: str) -> None:
    cls, needles = FAILS[case]
    rows = "1" if engine == "messages" else "4"
    with pytest.raises(UserCodeError) as caught:
        make_network("ring:4", algorithm=f"{MODULE}:{cls}", engine=engine).run(2)
    text = str(caught.value)
    assert "\n" not in text and text.endswith("."), text
    assert text.startswith(
        f"algorithm '{make_algorithm(f'{MODULE}:{cls}').name}' ({MODULE}:{cls}): "
    )
    for needle in needles:
        assert needle.replace("(B,", f"({rows},") in text, (needle, text)
    if case == "raises":
        assert "KeyError" in caught.value.trace and "no such slot" in caught.value.trace


@pytest.mark.usefixtures("bad_rules")
def test_a_rules_own_fedcore_error_goes_through_as_it_is() -> None:
    with pytest.raises(Exception) as caught:
        make_network("ring:4", algorithm=f"{MODULE}:OnPurpose").run(1)
    assert type(caught.value).__name__ == "AlgorithmError"
    assert str(caught.value) == "the rule's own refusal, as it wrote it."


@pytest.mark.parametrize("engine", ["messages", "vectorized"])
@pytest.mark.parametrize("case", ["raises", "returns None"])
def test_the_cli_says_one_line_exits_3_and_logs_the_traceback(
    case: str, engine: str, bad_rules: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cls, needles = FAILS[case]
    out = tmp_path / "run"
    argv = ["simulate", "-q", "--out", str(out), "--engine", engine, *TINY]
    argv += ["--set", f"algorithm.name={MODULE}:{cls}", "--set", "topology.kind=ring"]
    status, said, err = cli(capsys, *argv)
    assert status == EXIT_USER_CODE == 3, (status, err)
    assert "Traceback" not in said + err
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, err
    log = out / "error.log"
    assert lines[0].startswith("fedcore: error: algorithm ") and f"({MODULE}:{cls})" in lines[0]
    assert needles[0] in lines[0] and lines[0].endswith(f"; the traceback is in {log}.")
    text = log.read_text(encoding="utf-8")
    assert text.startswith("Traceback") and "UserCodeError" in text
    if case == "raises":  # the user's own frame, for the rule's author
        assert f"{MODULE}.py" in text and 'raise KeyError("no such slot' in text


def test_the_exit_statuses_are_in_the_help() -> None:
    epilog = parser().epilog or ""
    assert "3 your own algorithm's code failed" in epilog and "error.log" in epilog


def test_simulate_refuses_an_empty_device(capsys: pytest.CaptureFixture[str]) -> None:
    for device in ("", "  "):
        one_line_error(capsys, ["simulate", "-q", "--device", device], f"--device {device!r}")


def test_an_error_crosses_processes_with_its_traceback() -> None:
    """A sweep's worker sends it back pickled: the user's traceback comes with it."""
    exc = UserCodeError("algorithm 'a' (m:A): step() raised KeyError: 'k'.", "the trace")
    back = pickle.loads(pickle.dumps(exc))
    assert str(back) == str(exc) and back.trace == "the trace" and back.log is None


# -- what makes an object a rule -------------------------------------------------------


class Delegating:
    """A per-message algorithm that hands every attribute it lacks on to a built-in one
    (it has a rule's attributes too, through ``NodeRule.__getattr__``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.steps = 0

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def step(self, state: Any, grad: torch.Tensor, ctx: Any) -> Any:
        self.steps += 1
        return self.inner.step(state, grad, ctx)


@pytest.mark.usefixtures("bad_rules")
def test_the_harness_takes_a_rule_and_a_delegating_per_message_algorithm() -> None:
    from user_rule_errors_mod import Plain  # type: ignore[import-not-found]

    inner = NodeRule(make_algorithm("dpsgd"))  # the message engine's form of a rule
    delegating = Delegating(inner)
    assert all(hasattr(delegating, a) for a in ("init", "step", "mix", "schema", "pattern"))
    assert not is_rule(delegating) and not is_rule(inner) and is_rule(Plain())
    settings = {"algorithm.lr": 0.3}
    mine = make_network("ring:6", algorithm=delegating, settings=settings)
    assert isinstance(mine, TestNetwork) and mine.network.algorithm is delegating
    mine.run(3)
    assert delegating.steps == 3 * 6
    ours = make_network("ring:6", algorithm="dpsgd", settings=settings).run(3)
    for node, x in ours.models().items():
        assert torch.equal(mine.models()[node], x), node
    runs = {}
    for engine in ("messages", "vectorized"):
        rule = make_network("ring:6", algorithm=Plain(), settings=settings, engine=engine)
        assert isinstance(rule, VectorizedTestNetwork if engine == "vectorized" else TestNetwork)
        runs[engine] = rule.run(3).models()
    for node, x in runs["messages"].items():  # the declared rule, alike on both engines
        assert torch.equal(runs["vectorized"][node], x), node
        assert not torch.equal(ours.models()[node], x), node  # adapt-then-combine: not D-PSGD


@pytest.mark.usefixtures("bad_rules")
def test_a_rule_must_be_declared() -> None:
    with pytest.raises(ConfigError, match=r"does not declare itself a rule: subclass "):
        make_algorithm(f"{MODULE}:Undeclared")
    from user_rule_errors_mod import Undeclared

    with pytest.raises(ConfigError, match=r"class Undeclared\(Rule\)"):
        make_network("ring:4", algorithm=Undeclared())


SUBCLASSES = {
    "chosen": ("MyFedAvg", "fedavg", "star:4", {}),
    "edges": ("MyRobustOPS", "ops", "social:6", {"algorithm.robust": True}),
    "widths": ("MyRPS", "rps", "complete:5", {}),
}


@pytest.mark.usefixtures("bad_rules")
@pytest.mark.parametrize("engine", ["messages", "vectorized"])
@pytest.mark.parametrize("case", list(SUBCLASSES))
def test_a_checked_rule_of_every_pattern_is_the_rule_bit_for_bit(case: str, engine: str) -> None:
    """A user's subclass of a built-in rule runs checked (optional methods included), and
    ends where the built-in does."""
    cls, name, topology, settings = SUBCLASSES[case]
    path = f"{MODULE}:{cls}"
    algorithm = make_algorithm(path)
    assert isinstance(algorithm, CheckedRule)
    mine = make_network(topology, algorithm=path, engine=engine).run(3)
    ours = make_network(topology, algorithm=name, engine=engine, settings=settings).run(3)
    for node, x in ours.models().items():
        assert torch.equal(mine.models()[node], x), node


@pytest.mark.usefixtures("bad_rules")
def test_only_users_rules_are_checked() -> None:
    """Built-in rules, by name or by import path, run as they are; a user's, checked."""
    for name in ("dpsgd", "fedcore.algorithms.dpsgd:DPSGDRule", "ops", "rps"):
        algorithm = make_algorithm(name)
        assert is_rule(algorithm) and not isinstance(algorithm, CheckedRule)
    user = make_algorithm(f"{MODULE}:Raises")
    assert isinstance(user, CheckedRule)
    assert user.rule.name == "raises" and user.origin == f"{MODULE}:Raises"


# -- real peers --------------------------------------------------------------------------


@pytest.mark.grpc
def test_a_launched_peer_logs_the_line_and_keeps_the_traceback(
    bad_rules: Path, tmp_path: Path
) -> None:
    out = tmp_path / "launch"
    argv = [sys.executable, "-m", "fedcore", "launch", "-q", "--out", str(out), *TINY]
    argv += ["--set", f"algorithm.name={MODULE}:Raises", "--set", "topology.kind=ring"]
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, str(bad_rules)])}
    done = subprocess.run(argv, cwd=bad_rules, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 3 and "Traceback" not in done.stdout + done.stderr, done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and "exited with status 3" in said[0], done.stderr
    assert f"({MODULE}:Raises): mix() raised KeyError" in said[0], said
    named = re.search(r"peer '(\w+)' exited", said[0])
    assert named is not None, said
    peer = out / "nodes" / named.group(1)  # the first to fail (the others were stopped)
    log = (peer / "node.log").read_text(encoding="utf-8")
    assert "Traceback" not in log
    errors = [ln for ln in log.splitlines() if ln.startswith("fedcore: error: ")]
    assert errors == [
        f"fedcore: error: algorithm 'raises' ({MODULE}:Raises): mix() raised KeyError: "
        f"'no such slot, says the user'; the traceback is in {peer / 'error.log'}."
    ]
    assert 'raise KeyError("no such slot' in (peer / "error.log").read_text(encoding="utf-8")
