"""The machinery of fedcore's name families: :class:`Entry` (one name and the import path
of its factory), :class:`Family` (a family's names, built in and plugged in) and the one
resolver of import paths, :func:`import_object`, with the "did you mean" of every answer.

:mod:`fedcore.registry` lists the families themselves; this module knows none of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fedcore.errors import ConfigError
from fedcore.ids import error_text

__all__ = [
    "FIX_PATH",
    "PLUGIN_NAME",
    "Entry",
    "Family",
    "close_matches",
    "did_you_mean",
    "entries",
    "import_object",
]


FIX_PATH = (
    "run fedcore from the folder that holds the module, or put that folder on PYTHONPATH "
    "(in a container: install the module in the image or put it on the image's PYTHONPATH)"
)
"""How to make a module importable: what every "no module named" answer says."""


def import_object(path: str, *, what: str, error: type[Exception] = ConfigError) -> Any:
    """The object at import path ``"pkg.module:attribute"``, imported now: the one
    resolver of every family's import paths (a user's algorithm, a registry's own entries,
    a checkpoint's state classes), with one style of answer when it goes wrong.

    ``what`` names the setting in answers (``"algorithm.name"``: ``algorithm.name =
    'pkg.mod:Nope': module 'pkg.mod' has no attribute 'Nope'; ...``).

    Raises:
        error: a malformed path (or a file's), a module not found or failing to import, or
            no such attribute, each one sentence naming ``what``, the path and the fix.
    """
    module_name, _, attribute = path.partition(":")
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        stem = module_name.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        raise error(
            f"{what} = {path!r} names a file; name its module instead, "
            f"{stem + ':' + attribute!r}, and {FIX_PATH}."
        )
    if (
        not module_name
        or not attribute
        or not all(p.isidentifier() for p in module_name.split("."))
    ):
        raise error(
            f"{what} = {path!r} is not an import path: write 'pkg.module:factory' "
            "(a module importable from here and the name of a class or function in it), "
            "or a built-in name."
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise error(
                f"{what} = {path!r}: no module named {missing!r} on the Python path; {FIX_PATH}."
            ) from exc
        raise error(
            f"{what} = {path!r}: module {module_name!r} does not import "
            f"({error_text(exc)}); install what it needs."
        ) from exc
    except Exception as exc:  # a user's module can raise anything as it runs
        raise error(
            f"{what} = {path!r}: importing module {module_name!r} failed "
            f"({error_text(exc)}); fix the module (fedcore -v shows the traceback)."
        ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise error(
            f"{what} = {path!r}: module {module_name!r} has no attribute "
            f"{attribute!r}; name a class or function defined in "
            f"{getattr(module, '__file__', None) or module_name}."
        ) from None


def close_matches(word: object, choices: Iterable[str]) -> list[str]:
    """The few ``choices`` closest to ``word`` (:func:`difflib.get_close_matches`), best
    first; a word with whitespace around it matches its stripped self first."""
    if not isinstance(word, str):
        return []
    options = list(dict.fromkeys(choices))
    found = [word.strip()] if word.strip() in options and word.strip() != word else []
    found += difflib.get_close_matches(word.strip() or word, options, n=3, cutoff=0.6)
    return list(dict.fromkeys(found))


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``"did you mean `lr`?"`` (or ``"`lr` or `lr_power`"``) for the ``choices`` close to
    ``word``; ``""`` when none is. Every "unknown name" answer appends it."""
    found = close_matches(word, choices)
    if not found:
        return ""
    return "did you mean " + " or ".join(f"`{m}`" for m in found) + "?"


@dataclass(frozen=True, slots=True)
class Entry:
    """One name of a family.

    Attributes:
        name: The name a config uses.
        target: ``"module:attribute"``: the factory (class or function) behind the name.
        keys: The options it takes by name (an optimizer's ``[optimizer]`` keys, a topology
            kind's parameters, a model's config keys).
        tags: What sets it apart within its family (``"convex"``: a model whose regret has
            a comparator; ``"per-layer"``: an optimizer that needs the layer sizes).
        edges: A topology kind's edge estimate: ``edges(nodes, topology)`` -> about how many
            edges (over one period, self-loops included) it makes of ``nodes`` nodes under
            the ``[topology]`` table ``topology``, from the counts alone.
    """

    name: str
    target: str
    keys: tuple[str, ...] = ()
    tags: frozenset[str] = frozenset()
    edges: Callable[[int, Any], int] | None = None


PLUGIN_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
"""A plug-in's name: lowercase letters, digits, ``-`` and ``_``, a letter first (so it is
never an import path nor a ``"folder:PATH"``)."""


class Family:
    """The names of one family, in the order its documentation lists them: the built-in
    entries, then those plugged in from outside the package.

    A plug-in comes in two ways: :meth:`register` (in-process: the Python API, tests), or
    an entry point of the family's ``group`` that an installed distribution declares
    (``name = "pkg.module:factory"`` under ``[project.entry-points."fedcore.codecs"]``),
    read once, and only when a name is asked for that is not built in or registered. An
    entry point may name an :class:`Entry` instead of the factory (``"pkg.module:MY_KIND"``,
    ``MY_KIND = Entry("my-kind", "pkg.module:factory", keys=...)``): the entry then says
    what :meth:`register` is told (its keys, tags, edge estimate), checked the same way,
    when the name is first looked up (:meth:`entry`), which imports its module.

    Attributes:
        plugin_keys: The keys a plug-in may declare (``None``: any name; by default none).
        plugin_tags: The tags a plug-in may carry: those that act on a plug-in (the others
            say how a built-in name is made).
    """

    def __init__(
        self,
        what: str,
        entries: tuple[Entry, ...],
        *,
        group: str = "",
        defaults: dict[str, Any] | None = None,
        plugin_keys: tuple[str, ...] | None = (),
        plugin_tags: tuple[str, ...] = (),
    ) -> None:
        self.what = what
        self.group = group
        self._entries = {e.name: e for e in entries}
        if len(self._entries) != len(entries):
            raise ValueError(f"a {what} is listed twice")
        self._builtin = tuple(self._entries)
        self._defaults = defaults or {}
        self.plugin_keys = plugin_keys
        self.plugin_tags = plugin_tags
        self._origins: dict[str, str] = {}
        self._installed: set[str] = set()
        self._pending: dict[str, str] = {}
        self._scanned = not group

    @property
    def names(self) -> tuple[str, ...]:
        """Every name, in listing order (plug-ins registered so far last)."""
        return tuple(self._entries)

    @property
    def builtin(self) -> tuple[str, ...]:
        """The names the package itself lists, in listing order (no plug-in's)."""
        return self._builtin

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name not in self._entries and PLUGIN_NAME.fullmatch(name):
            self.scan()
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def register(self, entry: Entry, *, origin: str = "") -> Entry:
        """Add ``entry`` from outside the package (``origin`` names where it comes from in
        answers: a distribution, a module); registering the same entry again is a no-op.

        Raises:
            ConfigError: a name that is not a plug-in name (:data:`PLUGIN_NAME`), one of
                the built-in names, or one another plug-in registered with another target.
        """
        source = origin or "fedcore.registry"
        name = entry.name
        if not isinstance(name, str) or not PLUGIN_NAME.fullmatch(name):
            raise ConfigError(
                f"{source}: {self.what} plug-in name {name!r} is not a name: use lowercase "
                "letters, digits, '-' and '_', starting with a letter."
            )
        if not isinstance(entry.target, str) or ":" not in entry.target:
            raise ConfigError(
                f"{source}: {self.what} plug-in {name!r} = {entry.target!r} is not an import "
                "path 'pkg.module:factory'."
            )
        if name in self._builtin:
            raise ConfigError(
                f"{source}: {self.what} plug-in {name!r} clashes with the built-in {self.what} "
                f"{name!r}; give it another name."
            )
        known = self._entries.get(name)
        if known is not None and known.target != entry.target:
            raise ConfigError(
                f"{source}: {self.what} plug-in {name!r} clashes with the one from "
                f"{self._origins.get(name, 'fedcore.registry')} ({known.target}); "
                "uninstall one of them or rename it."
            )
        entry = self._declared(entry, source)
        self._entries[name] = entry
        self._origins.setdefault(name, source)
        return entry

    def _declared(self, entry: Entry, source: str) -> Entry:
        """``entry`` with its declarations checked (keys, tags, edge estimate) and made
        canonical (a tuple of keys, a frozenset of tags, the family's defaults filled in).

        Raises:
            ConfigError: a declaration this family does not take, in one line.
        """
        said = f"{source}: {self.what} plug-in {entry.name!r}"
        keys, tags = entry.keys, entry.tags
        if isinstance(keys, str) or not isinstance(keys, tuple | list):
            raise ConfigError(f"{said}: keys = {keys!r} is not a tuple of key names.")
        if isinstance(tags, str) or not isinstance(tags, frozenset | set | tuple | list):
            raise ConfigError(f"{said}: tags = {tags!r} is not a set of tags.")
        allowed = self.plugin_keys
        for key in keys:
            if not isinstance(key, str) or not key.isidentifier():
                raise ConfigError(f"{said}: key {key!r} is not a key name.")
            if allowed is not None and key not in allowed:
                takes = f"one of {', '.join(allowed)}" if allowed else "none"
                raise ConfigError(
                    f"{said}: {key!r} is not a key a {self.what} plug-in may take ({takes})."
                )
        for tag in tags:
            if tag not in self.plugin_tags:
                takes = f"one of {', '.join(self.plugin_tags)}" if self.plugin_tags else "none"
                raise ConfigError(
                    f"{said}: tag {tag!r} is not one a {self.what} plug-in may carry ({takes})."
                )
        if entry.edges is not None and ("edges" not in self._defaults or not callable(entry.edges)):
            why = "is not callable" if "edges" in self._defaults else "applies to topology kinds"
            raise ConfigError(f"{said}: edges = {entry.edges!r} {why}.")
        entry = dataclasses.replace(entry, keys=tuple(keys), tags=frozenset(tags))
        missing = {k: v for k, v in self._defaults.items() if getattr(entry, k) is None}
        return dataclasses.replace(entry, **missing) if missing else entry

    def registered_here(self, name: str) -> str:
        """Where ``name`` was registered from, if only :meth:`register` in this process
        made it known (no built-in name, no installed entry point of it); else ``""``. Such
        a name is unknown to every other process (the peers ``fedcore launch`` starts)."""
        if name in self._builtin or name not in self._entries:
            return ""
        self.scan()
        if name in self._installed:
            return ""
        return self._origins.get(name, "fedcore.registry")

    def installed(self) -> tuple[str, ...]:
        """The names the installed entry points of this family's group declare, read from
        the distributions' metadata alone (nothing imported, nothing checked): what help
        lists."""
        if not self.group:
            return ()
        from importlib.metadata import entry_points

        return tuple(dict.fromkeys(point.name for point in entry_points(group=self.group)))

    def scan(self) -> None:
        """Register the entry points of this family's group, once (a no-op without one)."""
        if self._scanned:
            return
        self._scanned = True
        from importlib.metadata import entry_points

        for point in entry_points(group=self.group):
            dist = getattr(point, "dist", None)
            dist_name = getattr(dist, "name", None) or "?"
            origin = f"distribution {dist_name} (entry point {self.group})"
            known = point.name in self._entries
            self.register(Entry(point.name, point.value), origin=origin)
            self._installed.add(point.name)
            if not known:
                self._pending[point.name] = origin

    def _resolve(self, name: str) -> None:
        """Read the declarations of entry point ``name`` when it names an :class:`Entry`
        (its module imported now), once; a factory declares nothing."""
        origin = self._pending.pop(name, None)
        if origin is None:
            return
        point = self._entries[name]
        found = import_object(point.target, what=f"{origin}: {self.what} {name!r}")
        if not isinstance(found, Entry):
            return
        if found.name != name:
            raise ConfigError(
                f"{origin}: {self.what} plug-in {name!r} = {point.target!r} is the entry of "
                f"{found.name!r}; give the entry point and the Entry the same name."
            )
        if not isinstance(found.target, str) or ":" not in found.target:
            raise ConfigError(
                f"{origin}: {self.what} plug-in {name!r}: its Entry's target "
                f"{found.target!r} is not an import path 'pkg.module:factory'."
            )
        self._entries[name] = self._declared(found, origin)

    def did_you_mean(self, name: object) -> str:
        """``"did you mean `ops`?"`` for a name close to one of this family's (else ``""``)."""
        return did_you_mean(name, self.names)

    def unknown(self, name: object, *, user: bool = False) -> str:
        """The answer to a name that is not one of this family's: the closest names, then
        every name (and, with ``user``, that a user's goes by import path)."""
        self.scan()
        hint = self.did_you_mean(name)
        own = ", or your own as 'pkg.module:factory'" if user else ""
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        return (
            f"unknown {self.what} {shown}"
            + (f"; {hint}" if hint else "")
            + f" (known {self.what}s: {', '.join(self.names)}{own})"
        )

    def entry(self, name: str) -> Entry:
        """The entry of ``name`` (``KeyError`` if it is not one); an installed one's
        declarations are read now (:class:`Family`).

        Raises:
            ConfigError: an installed plug-in whose entry point does not import, or whose
                declarations this family does not take, in one line.
        """
        if name not in self:
            raise KeyError(name)
        self._resolve(name)
        return self._entries[name]

    def tagged(self, tag: str) -> tuple[str, ...]:
        """The names that carry ``tag``, of those whose declarations are read (an installed
        plug-in's are once :meth:`entry` looked it up: ask ``tag in entry(name).tags``)."""
        return tuple(e.name for e in self if tag in e.tags)

    def load(self, name: str) -> Any:
        """The factory behind ``name``, imported now."""
        return import_object(self.entry(name).target, what=f"{self.what} {name!r}")

    def factories(self) -> dict[str, Any]:
        """Name -> factory for every built-in name (what the family's own registry holds)."""
        return {name: self.load(name) for name in self._builtin}


def entries(module: str, *items: tuple[Any, ...]) -> tuple[Entry, ...]:
    """Entries whose factories live in ``module``: ``(name, attribute, keys?, tags?)``."""
    out = []
    for name, attribute, *rest in items:
        keys = tuple(rest[0]) if rest else ()
        tags = frozenset(rest[1]) if len(rest) > 1 else frozenset()
        out.append(Entry(name, f"{module}:{attribute}", keys, tags))
    return tuple(out)
