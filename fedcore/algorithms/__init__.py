"""Decentralized learning algorithms as sans-I/O state machines, and their registry.

``make_algorithm(name, **options)`` builds one from the registry, or a user's from an
import path ``"pkg.module:factory"`` (:mod:`fedcore.algorithms.user`); the options are the
extra keys of the config's ``[algorithm]`` table.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fedcore import registry
from fedcore.algorithms.asynchronous import AsynchronousRule
from fedcore.algorithms.base import Algorithm, Inbox, Outbox, RoundContext, with_traits
from fedcore.algorithms.compressed import CHOCO, CHOCOState, DeepSqueeze, DeepSqueezeState
from fedcore.algorithms.dpsgd import DPSGD, DPSGDState
from fedcore.algorithms.online import DOG, DOL
from fedcore.algorithms.ops import OPS, PushSumState
from fedcore.algorithms.reference import Central, Local, ModelState
from fedcore.algorithms.rps import RPS, RPSState
from fedcore.algorithms.rule import Rows, Rule, Send, Slot
from fedcore.algorithms.server import FedAvg, FedAvgState
from fedcore.algorithms.squeeze import (
    APMSqueeze,
    APMSqueezeState,
    DoubleSqueeze,
    DoubleSqueezeState,
)
from fedcore.algorithms.user import (
    as_algorithm,
    is_import_path,
    load_factory,
    make_user_algorithm,
    unknown_options,
)
from fedcore.errors import ConfigError, FedcoreError
from fedcore.ids import error_text

__all__ = [
    "ALGORITHMS",
    "CHOCO",
    "DOG",
    "DOL",
    "DPSGD",
    "OPS",
    "RPS",
    "APMSqueeze",
    "APMSqueezeState",
    "Algorithm",
    "CHOCOState",
    "Central",
    "DPSGDState",
    "DeepSqueeze",
    "DeepSqueezeState",
    "DoubleSqueeze",
    "DoubleSqueezeState",
    "FedAvg",
    "FedAvgState",
    "Inbox",
    "Local",
    "ModelState",
    "Outbox",
    "PushSumState",
    "RPSState",
    "RoundContext",
    "Rows",
    "Rule",
    "Send",
    "Slot",
    "algorithm_factory",
    "make_algorithm",
]

ALGORITHMS: dict[str, Callable[..., Any]] = registry.ALGORITHMS.factories()
"""Name -> factory of every registered algorithm (:data:`fedcore.registry.ALGORITHMS`)."""


def _unknown(name: str) -> ConfigError:
    return ConfigError(registry.ALGORITHMS.unknown(name, user=True) + ".")


def algorithm_factory(name: str) -> Callable[..., Any]:
    """The factory of algorithm ``name``: the registered one, or the class or function at
    import path ``"pkg.module:factory"``.

    Raises:
        ConfigError: unknown name, or an import path that does not load.
    """
    factory = ALGORITHMS.get(name)
    if factory is not None:
        return factory
    if is_import_path(name):
        return load_factory(name)
    if name in registry.ALGORITHMS:  # a plug-in: loaded as a user's, by its import path
        return load_factory(registry.ALGORITHMS.entry(name).target)
    raise _unknown(name)


def make_algorithm(name: str, **options: Any) -> Any:
    """Build the algorithm registered as ``name``, or a user's at import path
    ``"pkg.module:factory"``, with keyword ``options``: a :class:`Rule` (every built-in
    synchronous one; each engine runs it through its own adapter) or an object of the
    per-message :class:`Algorithm` protocol.

    Raises:
        ConfigError: unknown name, an import path that does not load or builds no
            algorithm, or an option the algorithm does not take.
    """
    factory = ALGORITHMS.get(name)
    plugin = ""
    if factory is None:
        if is_import_path(name):
            return make_user_algorithm(name, **options)
        if name not in registry.ALGORITHMS:
            raise _unknown(name)
        plugin = registry.ALGORITHMS.entry(name).target
        factory = load_factory(plugin)
    try:
        accepted = _options_of(factory, set(options))
    except (TypeError, ValueError):  # a plug-in's without a signature: the call tells
        accepted = set(options)
    unknown = sorted(set(options) - accepted)
    if unknown:
        allowed = ", ".join(sorted(accepted)) or "none"
        raise ConfigError(
            f"algorithm {name!r} has no option {unknown_options(unknown, sorted(accepted))}; "
            f"its options: {allowed}."
        )
    if not plugin:
        return with_traits(factory(**options))
    return _plugged_in(name, plugin, factory, options)


def _options_of(factory: Callable[..., Any], given: set[str]) -> set[str]:
    """The keyword options ``factory`` takes: its named parameters, or every one ``given``
    where it takes ``**options`` of its own. A rule class with no ``__init__`` of its own
    (``DPSGDRule``: object's, or the protocol's, ``(*args, **kwargs)``) takes none.

    Raises:
        TypeError, ValueError: no signature to read.
    """
    params = inspect.signature(factory).parameters
    named = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if open_ended and isinstance(factory, type):  # its own __init__, not an inherited default
        own = [c for c in factory.__mro__ if "__init__" in vars(c)]
        open_ended = bool(own) and own[0] is not object and not _default_init(own[0])
    return named | given if open_ended else named


def _default_init(cls: type) -> bool:
    """Whether ``cls.__init__`` is one a protocol class installs (``typing.Protocol``'s
    placeholder, which puts ``object.__init__`` on the class it first builds), not a
    constructor someone wrote."""
    init = vars(cls)["__init__"]
    return init is object.__init__ or getattr(init, "__module__", "") == "typing"


def _plugged_in(name: str, path: str, factory: Callable[..., Any], options: dict[str, Any]) -> Any:
    """What the plug-in ``name`` (its factory at ``path``) builds: an asynchronous rule as
    the built-in ones, anything else checked as a user's algorithm is.

    Raises:
        ConfigError: the factory fails, or builds neither (one line, naming ``path``).
    """
    try:
        made = factory(**options)
    except FedcoreError:
        raise
    except Exception as exc:  # a plug-in's factory can raise anything
        raise ConfigError(
            f"algorithm {name!r} ({path}) failed to build: {error_text(exc)}; "
            "fix it (fedcore -v shows the traceback)."
        ) from exc
    if isinstance(made, AsynchronousRule):
        return with_traits(made)
    return as_algorithm(made, path)
