"""How a table's keys are checked: each key's rule is declared once, on its field.

A table (:class:`Table`) is a frozen dataclass whose fields carry their rules as metadata::

    rounds: int = field(default=300, metadata=whole(1, MAX_ROUNDS))
    lr_schedule: str = field(default="constant", metadata=choice(LR_SCHEDULES))
    momentum: float = field(default=0.9, metadata=rules(number(">= 0"), number("< 1", why=...)))

and one loop (:meth:`Table.__post_init__`) applies them, field by field in the order the
table declares them, every time a table is built (from a file, ``--set``,
:func:`dataclasses.replace` or by hand). What no single key can say (one key read against
another, a key that is normalised) is the table's :meth:`Table.check`, run after the loop.

A refused value is a :class:`~fedcore.errors.ConfigError` that names the key and why:
``run.rounds = 0 is invalid: it must be a whole number from 1 to 1,000,000,000.``
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import fields
from typing import Any, ClassVar

from fedcore import registry
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id, clip, shorten
from fedcore.registry import did_you_mean

__all__ = [
    "RULES",
    "Rule",
    "Table",
    "check_choice",
    "check_name",
    "choice",
    "holds",
    "is_int",
    "named",
    "node_id",
    "number",
    "parse_edge",
    "require",
    "rule",
    "rules",
    "shown",
    "whole",
    "whole_range",
]

Rule = Callable[[str, Any], None]
"""A key's check: called with the key's dotted name and its value; raises
:class:`~fedcore.errors.ConfigError` to refuse the value."""

RULES = "fedcore.config.rules"
"""The field metadata key under which a field's rules are kept."""

Rules = dict[str, tuple[Rule, ...]]
"""Field metadata holding rules (what :func:`choice`, :func:`whole` ... return)."""


def shown(value: object) -> str:
    """``repr(value)``, cut short for a value such as a 10,000-digit integer."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "(huge)"
    return shorten(text, 80)


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require(ok: bool, key: str, value: object, why: str) -> None:
    """Refuse ``value`` of ``key`` unless ``ok``: ``"KEY = VALUE is invalid: it WHY."``."""
    if not ok:
        raise ConfigError(f"{key} = {shown(value)} is invalid: it {why}.")


def check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    """Refuse a value that is not one of ``choices``, suggesting the closest ones."""
    if value not in choices:
        hint = did_you_mean(value, choices)
        raise ConfigError(
            f"{key} = {shown(value)} is invalid: it must be one of {', '.join(choices)}"
            + (f"; {hint}" if hint else ".")
        )


def check_name(key: str, value: str, family: registry.Family, *, user: bool = True) -> None:
    """Refuse a name that is not one of ``family`` (nor, with ``user``, an import path
    ``"pkg.module:factory"``, checked when it is loaded), suggesting the closest names."""
    if value not in family and not (user and ":" in value):
        raise ConfigError(f"{key}: {family.unknown(value, user=user)}.")


def whole_range(key: str, value: object, low: int, high: int) -> None:
    """Refuse a non-integer or one outside ``[low, high]``, naming the bound."""
    require(
        is_int(value) and low <= value <= high,  # type: ignore[operator]
        key,
        value,
        f"must be a whole number from {low} to {high:_}".replace("_", ","),
    )


def parse_edge(key: str, text: object) -> tuple[str, str]:
    """``("u", "v")`` of an edge written ``"u->v"`` (two different safe node ids)."""
    if not isinstance(text, str) or text.count("->") != 1:
        raise ConfigError(f'{key}: an edge is written "sender->receiver", got {clip(text)}.')
    sender, receiver = (part.strip() for part in text.split("->"))
    if not sender or not receiver:
        raise ConfigError(f'{key}: an edge is written "sender->receiver", got {clip(text)}.')
    check_node_id(sender, f"{key} ({clip(text)})", ConfigError)
    check_node_id(receiver, f"{key} ({clip(text)})", ConfigError)
    if sender == receiver:
        raise ConfigError(
            f"{key}: {text!r} is a self-loop, but a node sends no message to itself, so there "
            'is nothing to drop. Name an edge between two different nodes ("u->v"), or use '
            "faults.crashes to take the node down."
        )
    return sender, receiver


# The rules a field may declare (its metadata). Each returns ``{RULES: (rule,)}``;
# ``rules(a, b)`` gives a field several, applied in order.


def rules(*each: Rules) -> Rules:
    """The rules of several declarations, applied in the order given."""
    return {RULES: tuple(r for meta in each for r in meta[RULES])}


def rule(check: Rule) -> Rules:
    """A rule written as a function ``check(key, value)`` that raises ConfigError."""
    return {RULES: (check,)}


def holds(ok: Callable[[Any], bool], why: str) -> Rules:
    """Refuse a value for which ``ok(value)`` is false: ``"... is invalid: it WHY."``."""
    return rule(lambda key, value: require(ok(value), key, value, why))


def choice(choices: tuple[str, ...]) -> Rules:
    """One of ``choices`` (a wrong one is answered with the closest ones)."""
    return rule(lambda key, value: check_choice(key, value, choices))


def named(family: registry.Family, *, user: bool = True) -> Rules:
    """A name of ``family`` (with ``user``, or a user's ``"pkg.module:factory"``)."""
    return rule(lambda key, value: check_name(key, value, family, user=user))


def whole(low: int, high: int) -> Rules:
    """A whole number from ``low`` to ``high``."""
    return rule(lambda key, value: whole_range(key, value, low, high))


def node_id() -> Rules:
    """A safe node id (:func:`fedcore.ids.check_node_id`)."""

    def check(key: str, value: object) -> None:
        check_node_id(value, key, ConfigError)

    return rule(check)


_BOUNDS = re.compile(
    r"(?P<side>>=|>|<=|<) (?P<bound>\S+)"  # one side: ">= 0"
    r"|(?P<opening>[\[(])(?P<low>\S+), (?P<high>\S+)(?P<closing>[\])])"  # an interval: "(0, 1]"
)


def number(bounds: str, *, why: str = "", finite: bool = True) -> Rules:
    """A number within ``bounds``, written as the message says it: ``">= 0"``, ``"> 0"``,
    ``"< 1"``, or an interval ``"[0, 1]"``, ``"(0, 1]"``, ``"(0, 1)"``; refused with
    ``"it must be >= 0"`` / ``"it must be in (0, 1]"``, or ``why`` if given. ``finite``
    refuses inf and nan as well (an interval refuses them anyway); without it only nan
    (``transport.deadline_s = inf`` waits for ever).
    """
    parts = _BOUNDS.fullmatch(bounds)
    if parts is None:
        raise ValueError(f"bounds {bounds!r} are not '>= X', '> X', '< X', '<= X' or '[X, Y)'")
    low, high, low_open, high_open = -math.inf, math.inf, False, False
    if parts["side"]:
        if parts["side"].startswith(">"):
            low, low_open = float(parts["bound"]), parts["side"] == ">"
        else:
            high, high_open = float(parts["bound"]), parts["side"] == "<"
        says = f"must be {bounds}"
    else:
        low, low_open = float(parts["low"]), parts["opening"] == "("
        high, high_open = float(parts["high"]), parts["closing"] == ")"
        says = f"must be in {bounds}"

    def ok(value: object) -> bool:
        return (
            isinstance(value, int | float)
            and (not finite or math.isfinite(value))
            and (value > low if low_open else value >= low)
            and (value < high if high_open else value <= high)
        )

    return holds(ok, why or says)


# The tables and the loop that checks them.


_DECLARED: dict[type[Table], tuple[tuple[str, str, tuple[Rule, ...]], ...]] = {}
"""Per table class, ``(dotted key, field name, rules)`` of each field that declares rules
(read once: every table built applies them)."""


def _declared(cls: type[Table]) -> tuple[tuple[str, str, tuple[Rule, ...]], ...]:
    found = _DECLARED.get(cls)
    if found is None:
        found = _DECLARED[cls] = tuple(
            (f"{cls.TABLE}.{f.name}", f.name, f.metadata[RULES])
            for f in fields(cls)  # type: ignore[arg-type]
            if RULES in f.metadata
        )
    return found


class Table:
    """Base of the config tables (``[run]``, ``[data]``, ...), each a frozen dataclass.

    Building one applies every field's declared rules (:func:`choice`, :func:`whole`,
    :func:`number`, ...), field by field, then :meth:`check`.
    """

    __slots__ = ()

    TABLE: ClassVar[str]
    """The table's name in a config file (``"run"``): its keys are ``TABLE.field``."""

    def __post_init__(self) -> None:
        """Apply each field's rules, then :meth:`check`."""
        for key, name, checks in _declared(type(self)):
            value = getattr(self, name)
            for check in checks:
                check(key, value)
        self.check()

    def check(self) -> None:
        """What no single key's rule says: keys read together, values normalised."""
