"""Users' algorithms by import path: ``algorithm.name = "pkg.module:factory"``.

As user models and datasets are, a user's algorithm is named by import path: the module is
imported (from ``sys.path``: the ``fedcore`` command puts its working directory there, as
``python -m`` does, and ``fedcore launch`` gives its peers the folder the module came from)
and the attribute after the colon is called with the ``[algorithm]`` table's own keys as
keyword options. It returns either

* a :class:`~fedcore.algorithms.rule.Rule` (``init``, ``model``, ``step``, ``mix``,
  ``schema``, ``pattern``): wrapped in :class:`~fedcore.algorithms.rule.NodeRule`, it runs
  on a gRPC peer, on the message engine and, stacked, on the vectorized engine; or
* an object of the per-message :class:`~fedcore.algorithms.base.Algorithm` protocol
  (``init``, ``model``, ``step``, ``expected_senders``, ``mix``): the message engine and
  gRPC peers run it, the vectorized engine does not.

Every way this can go wrong (a malformed path, a module that is not found or fails to
import, a missing attribute, an option the factory does not take, a factory that fails or
returns something else) is one :class:`~fedcore.errors.ConfigError` sentence naming the
value and the fix.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from fedcore.algorithms.base import Algorithm
from fedcore.algorithms.rule import NodeRule, is_rule
from fedcore.config import table_keys
from fedcore.errors import ConfigError, FedcoreError
from fedcore.ids import clip, error_text
from fedcore.registry import did_you_mean

__all__ = [
    "PATTERNS",
    "is_import_path",
    "load_factory",
    "make_user_algorithm",
    "unknown_options",
]

PATTERNS = ("neighbours", "chosen", "edges", "none")
"""What a rule's ``pattern`` may say."""

_ALGORITHM = ("name", "mixing", "phases", "init", "model", "step", "expected_senders", "mix")
"""What an object of the per-message protocol has."""

_RULE = ("name", "mixing", "phases", "init", "model", "step", "mix", "schema", "pattern")

_FIX_PATH = (
    "run fedcore from the folder that holds the module, or put that folder on PYTHONPATH "
    "(in a container: install the module in the image or put it on the image's PYTHONPATH)"
)


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


def _split(path: str) -> tuple[str, str]:
    module, _, attribute = path.partition(":")
    parts = module.split(".")
    if "/" in module or "\\" in module or module.endswith(".py"):
        stem = module.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        raise ConfigError(
            f"algorithm.name = {path!r} names a file; name its module instead, "
            f"{stem + ':' + attribute!r}, and {_FIX_PATH}."
        )
    if not module or not attribute or not all(p.isidentifier() for p in parts):
        raise ConfigError(
            f"algorithm.name = {path!r} is not an import path: write 'pkg.module:factory' "
            "(a module importable from here and the name of a class or function in it), "
            "or a built-in name."
        )
    return module, attribute


def load_factory(path: str) -> Callable[..., Any]:
    """Import ``"pkg.module:factory"`` and return the callable (a class or a function).

    Raises:
        ConfigError: a malformed path, a module not found or failing to import, no such
            attribute, or one that is not callable.
    """
    module_name, attribute = _split(path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ConfigError(
                f"algorithm.name = {path!r}: no module named {missing!r} on the Python path; "
                f"{_FIX_PATH}."
            ) from exc
        raise ConfigError(
            f"algorithm.name = {path!r}: module {module_name!r} does not import "
            f"({error_text(exc)}); install what it needs."
        ) from exc
    except Exception as exc:  # a user's module can raise anything as it runs
        raise ConfigError(
            f"algorithm.name = {path!r}: importing module {module_name!r} failed "
            f"({error_text(exc)}); fix the module (fedcore -v shows the traceback)."
        ) from exc
    try:
        factory = getattr(module, attribute)
    except AttributeError:
        raise ConfigError(
            f"algorithm.name = {path!r}: module {module_name!r} has no attribute "
            f"{attribute!r}; name a class or function defined in "
            f"{getattr(module, '__file__', None) or module_name}."
        ) from None
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


def make_user_algorithm(path: str, **options: Any) -> Algorithm:
    """Call the factory at ``path`` with ``options``; a :class:`Rule` it returns comes back
    wrapped in :class:`NodeRule`, an :class:`Algorithm` as it is.

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
    if isinstance(made, NodeRule):
        return made
    if is_rule(made):
        _check_rule(path, made)
        return NodeRule(made)
    missing = [a for a in _ALGORITHM if not hasattr(made, a)]
    if missing:
        as_rule = [a for a in _RULE if not hasattr(made, a)]
        raise ConfigError(
            f"algorithm {path!r} returned an object of type {type(made).__name__}, which is "
            f"neither an update rule (it lacks {', '.join(as_rule)} of "
            "fedcore.algorithms.rule.Rule) nor a per-message algorithm (it lacks "
            f"{', '.join(missing)} of fedcore.algorithms.base.Algorithm): return one of them."
        )
    _check_names(path, made)
    return made  # type: ignore[no-any-return]


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
    if rule.pattern == "chosen" and not callable(getattr(rule, "talks", None)):
        raise ConfigError(
            f"algorithm {path!r}: pattern = 'chosen' needs talks(phase, rows), naming each "
            "phase's senders and receivers."
        )
