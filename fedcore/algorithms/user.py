"""Users' algorithms by import path: ``algorithm.name = "pkg.module:factory"``.

As user models and datasets are, a user's algorithm is named by import path: the module is
imported (from ``sys.path``: the ``fedcore`` command puts its working directory there, as
``python -m`` does, and ``fedcore launch`` gives its peers the folder the module came from)
and the attribute after the colon is called with the ``[algorithm]`` table's own keys as
keyword options. It returns either

* a :class:`~fedcore.algorithms.rule.Rule` (``init``, ``model``, ``step``, ``mix``,
  ``schema``, ``pattern``): it runs on a gRPC peer, on the message engine (each through its
  engine's adapter) and, stacked, on the vectorized engine; or
* an object of the per-message :class:`~fedcore.algorithms.base.Algorithm` protocol
  (``init``, ``model``, ``step``, ``expected_senders``, ``mix``): the message engine and
  gRPC peers run it, the vectorized engine does not.

What makes an object a rule is declared, never guessed: its class subclasses
:class:`~fedcore.algorithms.rule.Rule` (or a built-in rule). An object that hands unknown
attributes on to another (a wrapper with ``__getattr__``) is what its own class says.

Every way this can go wrong (a malformed path, a module that is not found or fails to
import, a missing attribute, an option the factory does not take, a factory that fails or
returns something else) is one :class:`~fedcore.errors.ConfigError` sentence naming the
value and the fix.

Once the rounds run, a user's rule is a :class:`CheckedRule`: each call of its code that
raises, and each value it returns that no engine can use (``None``, a wrong type, a tensor
of the wrong shape or dtype), is one :class:`~fedcore.errors.UserCodeError` naming the
rule, the method and what was expected, on every engine and on a gRPC peer alike. The
built-in rules are not wrapped.
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fedcore.algorithms.base import TRAITS, with_traits
from fedcore.algorithms.rule import RULE_MEMBERS, Rows, Rule, Send, is_rule
from fedcore.config import table_keys
from fedcore.errors import ConfigError, FedcoreError, UserCodeError
from fedcore.ids import clip, error_text
from fedcore.messages import MessageSchema
from fedcore.registry import did_you_mean, import_object

__all__ = [
    "PATTERNS",
    "CheckedRule",
    "as_algorithm",
    "checked",
    "is_import_path",
    "load_factory",
    "make_user_algorithm",
    "unknown_options",
]

PATTERNS = ("neighbours", "chosen", "edges", "none")
"""What a rule's ``pattern`` may say."""

_ALGORITHM = ("name", "mixing", "phases", "init", "model", "step", "expected_senders", "mix")
"""What an object of the per-message protocol has."""

_RULE = RULE_MEMBERS


def unknown_options(unknown: list[str], accepted: list[str]) -> str:
    """``"nmae (did you mean `name`?), lrr (did you mean `lr`?)"``: the ``[algorithm]`` keys
    an algorithm does not take, each with the closest of its options and of the table's
    own keys (``name``, ``lr``, ...), where one is close."""
    near = [*accepted, *table_keys("algorithm")]
    parts = []
    for key in unknown:
        hint = did_you_mean(key, near)
        parts.append(f"{key} ({hint})" if hint else key)
    return ", ".join(parts)


def is_import_path(name: str) -> bool:
    """Whether ``name`` is meant as ``"pkg.module:factory"`` (it has a colon)."""
    return ":" in name


def load_factory(path: str) -> Callable[..., Any]:
    """Import ``"pkg.module:factory"`` and return the callable (a class or a function).

    Raises:
        ConfigError: a malformed path, a module not found or failing to import, no such
            attribute, or one that is not callable.
    """
    factory = import_object(path, what="algorithm.name")
    if not callable(factory):
        raise ConfigError(
            f"algorithm.name = {path!r} names an object of type {type(factory).__name__}, "
            "not a class or function: name the rule's class (or a function that returns "
            "the algorithm)."
        )
    return factory  # type: ignore[no-any-return]


def _keywords(factory: Callable[..., Any]) -> list[str] | None:
    """The options ``factory`` takes by keyword (None: any, or its signature is unknown)."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return None
    return sorted(
        n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def make_user_algorithm(path: str, **options: Any) -> Any:
    """Call the factory at ``path`` with ``options``; a :class:`Rule` it returns comes back
    checked (:func:`checked`), an :class:`Algorithm` as it is.

    Raises:
        ConfigError: the factory cannot be loaded (:func:`load_factory`), does not take an
            option, fails, or returns neither a rule nor an algorithm.
    """
    factory = load_factory(path)
    accepted = _keywords(factory)
    unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ConfigError(
            f"algorithm {path!r} has no option {unknown_options(unknown, accepted or [])} "
            "(its options: "
            f"{', '.join(accepted or ()) or 'none'}); remove the other keys of [algorithm]."
        )
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:  # a required option left out
        raise ConfigError(
            f"algorithm {path!r} cannot be built from the [algorithm] keys given: {exc}; "
            "set it with algorithm.KEY = VALUE."
        ) from None
    except ValueError:  # no signature to read: the call says what is wrong
        pass
    try:
        made = factory(**options)
    except FedcoreError:
        raise
    except Exception as exc:  # a user's factory can raise anything
        raise ConfigError(
            f"algorithm {path!r} failed to build with options {clip(options)}: {error_text(exc)}."
        ) from exc
    return as_algorithm(made, path)


def as_algorithm(made: Any, path: str) -> Any:
    """``made`` (what a user's factory returned, or a user's object) as the engines run it:
    a declared rule checked (:func:`checked`), an object of the per-message protocol as it
    is. ``path`` names it in errors.

    Raises:
        ConfigError: ``made`` is neither (an undeclared rule is told to subclass
            :class:`~fedcore.algorithms.rule.Rule`), or has a bad name, phases or pattern.
    """
    if is_rule(made):
        _check_rule(path, made)
        return checked(made, path)
    missing = [a for a in _ALGORITHM if not hasattr(made, a)]
    if missing:
        kind = type(made).__name__
        as_rule = [a for a in _RULE if not hasattr(made, a)]
        if not as_rule:  # what it has is only a hint for the message, never a decision
            raise ConfigError(
                f"algorithm {path!r} returned an object of type {kind}, which has a rule's "
                "methods but does not declare itself a rule: subclass "
                f"fedcore.algorithms.rule.Rule (class {kind}(Rule): ...)."
            )
        raise ConfigError(
            f"algorithm {path!r} returned an object of type {kind}, which is "
            f"neither an update rule (it lacks {', '.join(as_rule)} of "
            "fedcore.algorithms.rule.Rule) nor a per-message algorithm (it lacks "
            f"{', '.join(missing)} of fedcore.algorithms.base.Algorithm): return one of them."
        )
    _check_names(path, made)
    return with_traits(made)


def checked(rule: Any, origin: str) -> Any:
    """``rule`` as the engines run it: a user's rule in a :class:`CheckedRule`, a rule of
    fedcore's own (a built-in by import path, a subclass defined in fedcore) as it is."""
    if isinstance(rule, CheckedRule) or type(rule).__module__.split(".")[0] == "fedcore":
        return rule
    return CheckedRule(rule, origin)


def _check_names(path: str, made: Any) -> None:
    if not isinstance(made.name, str) or not made.name.strip():
        raise ConfigError(
            f"algorithm {path!r}: its name is {made.name!r}; give the class a non-empty "
            "string name (it names runs and checkpoints)."
        )
    if isinstance(made.phases, bool) or not isinstance(made.phases, int) or made.phases < 1:
        raise ConfigError(
            f"algorithm {path!r}: phases = {made.phases!r}; it must be a whole number >= 1 "
            "(communication phases a round)."
        )


def _check_rule(path: str, rule: Any) -> None:
    missing = [a for a in _RULE if not hasattr(rule, a)]
    if missing:
        raise ConfigError(
            f"algorithm {path!r}: its rule lacks {', '.join(missing)}; see "
            "fedcore.algorithms.rule.Rule."
        )
    _check_names(path, rule)
    if rule.pattern not in PATTERNS:
        raise ConfigError(
            f"algorithm {path!r}: pattern = {rule.pattern!r}; a rule sends to 'neighbours' "
            "(every edge of the graph), 'chosen' (who talks, by talks()), 'edges' (a message "
            "per edge) or 'none'."
        )
    if rule.pattern == "chosen" and not callable(rule.talks):
        raise ConfigError(
            f"algorithm {path!r}: pattern = 'chosen' needs talks(phase, rows), naming each "
            "phase's senders and receivers."
        )


# -- a user's rule at run time ----------------------------------------------------------


def _what(value: object) -> str:
    """``value`` as a check's message names it: ``None``, ``a tensor of shape (1, 649)
    and dtype torch.float32``, ``an object of type dict``."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"an object of type {type(value).__name__}"


class CheckedRule(Rule):
    """A user's rule as the engines run it: every call of its code goes through here.

    An exception it raises (but fedcore's own errors, which it may raise on purpose or get
    from :func:`~fedcore.algorithms.rule.gossip` and ``rows.compress``) becomes one
    :class:`~fedcore.errors.UserCodeError` naming the rule, the method and the error, with
    the user's traceback kept for the log. What it returns is checked where the engine
    receives it: the state a NamedTuple, ``model`` a ``[B, d]`` tensor of the parameters'
    dtype, ``step`` and ``mix`` a pair ``(state, Send or None)`` whose tensors and scalars
    are the ones ``schema`` names, with one row per peer. A check is a few comparisons of
    shapes a call: the math is the user's, untouched.

    Attributes:
        rule: The user's rule.
        origin: Where it came from (its import path), for messages.
    """

    def __init__(self, rule: Any, origin: str) -> None:
        """Check ``rule``'s calls; ``origin`` names it (``"pkg.module:Factory"``)."""
        self.rule = rule
        self.origin = origin
        self.name: str = rule.name
        self.mixing: str = rule.mixing
        self.phases: int = int(rule.phases)
        self.pattern: str = rule.pattern
        for trait in TRAITS:  # the user's rule's own (a Rule's, or their defaults)
            setattr(self, trait, getattr(rule, trait))
        # Its optional hooks, each it offers checked as its other methods (one it does
        # not offer stays None, the Rule's default).
        self.trains = self._hook("trains", rule.trains)
        self.talks = self._hook("talks", rule.talks)
        self.lossless = self._hook("lossless", rule.lossless)
        self.local_step = self._hook("local_step", rule.local_step)
        self.accept = self._hook("accept", rule.accept)
        self.widths = self._hook("widths", rule.widths)
        self.edge_fields = rule.edge_fields
        self._params: tuple[tuple[int, ...], torch.dtype] | None = None  # d, dtype at init
        try:
            takes = len(inspect.signature(rule.schema).parameters) >= 2
        except (TypeError, ValueError):
            takes = False
        self._schema_takes_rows = takes
        self._ragged = rule.widths is not None  # messages of several lengths

    def _hook(self, method: str, fn: Any) -> Any:
        """The user's optional hook ``fn`` checked (:meth:`_optional`), or as it is where
        it is not a method (``None``: not offered)."""
        return functools.partial(self._optional, method, fn) if callable(fn) else fn

    def __getattr__(self, name: str) -> Any:
        """The rule's own attributes (its options: ``eta``, ``gamma`` ...; an attribute it
        lacks: AttributeError)."""
        if name.startswith("_") or name in ("rule", "origin"):  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.rule, name)

    def __repr__(self) -> str:
        return f"CheckedRule({self.rule!r})"

    # -- what goes wrong -----------------------------------------------------------------

    def _fail(self, method: str, what: str, cause: BaseException | None = None) -> UserCodeError:
        trace = "".join(traceback.format_exception(cause)) if cause is not None else ""
        return UserCodeError(f"algorithm {self.name!r} ({self.origin}): {method} {what}.", trace)

    def _call(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, a user's exception as a :class:`UserCodeError`."""
        try:
            return fn(*args)
        except (FedcoreError, MemoryError):
            raise
        except Exception as exc:  # a user's code can raise anything
            raise self._fail(f"{method}()", f"raised {error_text(exc)}", exc) from exc

    def _optional(self, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        out = self._call(method, fn, *args)
        if method == "local_step":
            self._check_state(method, out)
        elif method in ("talks", "widths") and not (isinstance(out, tuple) and len(out) == 2):
            raise self._fail(
                f"{method}()",
                f"returned {_what(out)}; expected a pair (senders, receivers)"
                if method == "talks"
                else f"returned {_what(out)}; expected a pair (out, in)",
            )
        elif method == "trains" and not isinstance(out, torch.Tensor):
            raise self._fail("trains()", f"returned {_what(out)}; expected a [B] bool tensor")
        return out

    def _check_state(self, method: str, state: Any) -> None:
        if not (isinstance(state, tuple) and hasattr(type(state), "_fields")):
            raise self._fail(
                f"{method}()",
                f"returned {_what(state)} as the state; expected a NamedTuple of [B, ...] "
                "tensors (one row per peer)",
            )

    def _check_pair(self, method: str, out: Any) -> tuple[Any, Any]:
        if not (isinstance(out, tuple) and len(out) == 2) or hasattr(type(out), "_fields"):
            raise self._fail(
                f"{method}()",
                f"returned {_what(out)}; expected a pair (state, Send or None): the new "
                "state and what the rows send next",
            )
        state, send = out
        self._check_state(method, state)
        return state, send

    def _check_send(self, method: str, send: Any, phase: int, rows: Rows) -> None:
        """``send``, what ``method`` returned for ``phase``, against the rule's schema."""
        if send is None:
            return
        if not isinstance(send, Send):
            raise self._fail(
                f"{method}()", f"returned {_what(send)} to send; expected a Send or None"
            )
        if phase >= self.phases:
            raise self._fail(
                f"{method}()",
                f"of the last phase ({phase - 1}) returned a Send; expected None "
                "(no phase follows)",
            )
        schema = self.schema(phase, rows)
        said = f"{method}() sends"
        for names, wanted in ((send.tensors, schema.tensors), (send.scalars, schema.scalars)):
            if set(names) != set(wanted):
                raise self._fail(
                    said,
                    f"{sorted(names)}; schema({phase}) says {sorted(wanted)}: send exactly those",
                )
        edges = rows.edges
        lead = rows.b
        if self.pattern == "edges" and not send.shared and edges is not None:
            lead = int(edges.out_row.shape[0])
        known = self._params
        ragged = self._ragged
        for name, value in send.tensors.items():
            if not isinstance(value, torch.Tensor):
                raise self._fail(said, f"{name!r} as {_what(value)}; expected a tensor")
            shape = schema.tensors[name]
            size = known[0] if shape is None and known is not None else shape
            expected = None if size is None or ragged else (lead, *size)
            if (
                value.dim() == 0
                or value.shape[0] != lead
                or (expected is not None and tuple(value.shape) != expected)
            ):
                want = expected or (lead, "...")
                raise self._fail(
                    said,
                    f"{name!r} as {_what(value)}; expected shape {_shape(want)} "
                    f"(one row per {'edge' if lead != rows.b else 'peer'})",
                )
            if known is not None and value.dtype != known[1]:
                raise self._fail(
                    said, f"{name!r} as {_what(value)}; expected the model's dtype {known[1]}"
                )
        for name, value in send.scalars.items():
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (lead,):
                raise self._fail(
                    said, f"scalar {name!r} as {_what(value)}; expected shape ({lead},)"
                )

    # -- the rule's methods ------------------------------------------------------------

    def init(self, params: torch.Tensor) -> Any:
        """The user's ``init``, its state checked, and ``model`` of it against ``params``."""
        self._params = (tuple(params.shape[1:]), params.dtype)
        state = self._call("init", self.rule.init, params)
        self._check_state("init", state)
        x = self.model(state)
        if x.shape[0] != params.shape[0]:
            raise self._fail(
                "model()",
                f"returned {_what(x)} for the state init() made of {params.shape[0]} row(s); "
                f"expected shape {_shape((params.shape[0], *params.shape[1:]))}",
            )
        return state

    def model(self, state: Any) -> torch.Tensor:
        """The user's ``model``: a ``[B, d]`` tensor of the parameters' dtype."""
        out = self._call("model", self.rule.model, state)
        known = self._params
        if (
            not isinstance(out, torch.Tensor)
            or (known is not None and (tuple(out.shape[1:]) != known[0] or out.dtype != known[1]))
            or out.dim() < 1
        ):
            want = f"[B, {', '.join(map(str, known[0]))}]" if known else "[B, d]"
            dtype = f" and dtype {known[1]}" if known else ""
            raise self._fail(
                "model()",
                f"returned {_what(out)}; expected shape {want}{dtype}: each peer's row of the "
                "model's parameters",
            )
        return out

    def step(self, state: Any, grad: torch.Tensor, rows: Rows) -> tuple[Any, Send | None]:
        """The user's ``step``: a pair (state, phase 0's Send or None), checked."""
        new, send = self._check_pair("step", self._call("step", self.rule.step, state, grad, rows))
        self._check_send("step", send, 0, rows)
        return new, send

    def mix(self, state: Any, phase: int, inbox: Any, rows: Rows) -> tuple[Any, Send | None]:
        """The user's ``mix``: a pair (state, the next phase's Send or None), checked."""
        out = self._call("mix", self.rule.mix, state, phase, inbox, rows)
        new, send = self._check_pair("mix", out)
        self._check_send("mix", send, phase + 1, rows)
        return new, send

    def schema(self, phase: int, rows: Rows | None = None) -> MessageSchema:
        """The user's ``schema`` (with ``rows`` if it takes them): a MessageSchema."""
        if self._schema_takes_rows:
            out = self._call("schema", self.rule.schema, phase, rows)
        else:
            out = self._call("schema", self.rule.schema, phase)
        if not isinstance(out, MessageSchema):
            raise self._fail(
                "schema()",
                f"returned {_what(out)}; expected a fedcore.messages.MessageSchema "
                "(e.g. model_schema('x'))",
            )
        return out


def _shape(shape: tuple[Any, ...] | Mapping[str, Any]) -> str:
    """``(1, 650)`` as a message writes a shape (a 1-tuple without its comma's look)."""
    return "(" + ", ".join(str(s) for s in shape) + ")"
