"""The rules a table's fields declare (fedcore.config.rules), and that every key has one."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from fedcore.config import RunConfig, TopologyConfig
from fedcore.config.experiment import TABLES
from fedcore.config.rules import RULES, Table, choice, holds, number, rules, whole
from fedcore.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class _Toy(Table):
    TABLE: ClassVar[str] = "toy"

    share: float = field(default=0.5, metadata=number("[0, 1]"))
    rate: float = field(default=1.0, metadata=number("> 0"))
    wait: float = field(default=1.0, metadata=number("> 0", finite=False))
    below: float = field(
        default=0.5, metadata=rules(number(">= 0"), number("< 1", why="must be below 1"))
    )
    open_: float = field(default=0.5, metadata=number("(0, 1)"))
    count: int = field(default=3, metadata=whole(1, 10_000))
    kind: str = field(default="a", metadata=choice(("a", "b")))
    even: int = field(default=2, metadata=holds(lambda v: v % 2 == 0, "must be even"))
    free: str = ""
    checked: int = 0

    def check(self) -> None:
        if self.checked and self.count < 2:
            raise ConfigError("toy.checked needs toy.count >= 2.")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("share", 1.5, "toy.share = 1.5 is invalid: it must be in [0, 1]."),
        ("share", math.nan, "toy.share = nan is invalid: it must be in [0, 1]."),
        ("rate", 0.0, "toy.rate = 0.0 is invalid: it must be > 0."),
        ("rate", math.inf, "toy.rate = inf is invalid: it must be > 0."),
        ("wait", math.nan, "toy.wait = nan is invalid: it must be > 0."),
        ("below", -1.0, "toy.below = -1.0 is invalid: it must be >= 0."),
        ("below", 1.0, "toy.below = 1.0 is invalid: it must be below 1."),
        ("open_", 1.0, "toy.open_ = 1.0 is invalid: it must be in (0, 1)."),
        ("open_", "x", "toy.open_ = 'x' is invalid: it must be in (0, 1)."),
        ("count", 0, "toy.count = 0 is invalid: it must be a whole number from 1 to 10,000."),
        ("count", True, "toy.count = True is invalid: it must be a whole number from 1 to 10,000."),
        ("kind", "c", "toy.kind = 'c' is invalid: it must be one of a, b."),
        ("kind", "bb", "toy.kind = 'bb' is invalid: it must be one of a, b; did you mean `b`?"),
        ("even", 3, "toy.even = 3 is invalid: it must be even."),
    ],
)
def test_a_declared_rule_refuses_a_value_naming_the_key(
    key: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _Toy(**{key: value})  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_values_within_the_rules_pass_and_check_runs_after_them() -> None:
    _Toy(share=0.0, rate=1e-300, wait=math.inf, below=0.0, open_=0.999, count=10_000, kind="b")
    _Toy(checked=1, count=2)
    with pytest.raises(ConfigError, match=r"toy\.checked needs"):
        _Toy(checked=1, count=1)
    with pytest.raises(ConfigError, match=r"toy\.count = 0"):  # the rules first
        _Toy(checked=1, count=0)


def test_rules_hold_for_every_way_a_table_is_built() -> None:
    with pytest.raises(ConfigError, match=r"run\.rounds = 0 is invalid"):
        dataclasses.replace(RunConfig(), rounds=0)
    with pytest.raises(ConfigError, match=r"topology\.p = 2\.0 is invalid"):
        TopologyConfig(p=2.0)


def test_bounds_are_written_as_the_message_says_them() -> None:
    with pytest.raises(ValueError, match="bounds"):
        number("between 0 and 1")


FREE_KEYS = {
    "topology.file": "a path (made absolute at load)",
    "algorithm.name": "checked by load_config: fedcore.testing names a run after an object",
    "algorithm.options": "the algorithm's own keys, checked when it is built",
    "model.options": "the model's own keys, checked by ModelConfig.check and the model",
    "faults.partitions": "parsed by FaultsConfig.check",
    "faults.crashes": "parsed by FaultsConfig.check",
    "time.compute_trace": "a path (read by the set-up)",
    "time.availability_trace": "a path (read by the set-up)",
}
"""Keys that declare no rule, and why; booleans need none (load_config checks types)."""


def test_every_key_declares_its_rule() -> None:
    missing = []
    for name, cls in TABLES.items():
        assert name == cls.TABLE
        defaults = cls()
        for f in dataclasses.fields(cls):
            key = f"{name}.{f.name}"
            if RULES in f.metadata:
                assert key not in FREE_KEYS, key
            elif not isinstance(getattr(defaults, f.name), bool) and key not in FREE_KEYS:
                missing.append(key)
    assert not missing, f"keys with no rule: {missing}"
