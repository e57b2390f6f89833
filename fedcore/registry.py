"""One list per family of names: the algorithms, codecs, node optimizers, topology kinds,
datasets and models a config may name.

Each family is listed here once, and only here. Every other place reads it: config
validation (:mod:`fedcore.config`, which must answer a bad name without importing torch),
the registries that build the objects (``fedcore.algorithms.ALGORITHMS``,
``fedcore.compression.CODECS``, ``fedcore.algorithms.optim.OPTIMIZERS``,
``fedcore.topology.kinds.KINDS``, ``fedcore.data.DATASETS``,
``fedcore.models.MODELS``), and the tests that hold the documentation's tables to them
(``docs/algorithms.md``, ``docs/datasets-and-models.md``).

An entry names its implementation by import path (``"module:attribute"``), loaded only when
asked for (:meth:`Family.load`), so this module imports nothing heavy. To add a name, add
its entry here and write the implementation it points to; ``docs/architecture.md`` says
which contract suite then covers it.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fedcore.errors import ConfigError
from fedcore.ids import error_text

__all__ = [
    "ALGORITHMS",
    "CODECS",
    "DATASETS",
    "DEPLOY_TARGETS",
    "MODELS",
    "OPTIMIZERS",
    "TOPOLOGY_KINDS",
    "Entry",
    "Family",
    "close_matches",
    "did_you_mean",
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


def _entries(module: str, *items: tuple[Any, ...]) -> tuple[Entry, ...]:
    """Entries whose factories live in ``module``: ``(name, attribute, keys?, tags?)``."""
    out = []
    for name, attribute, *rest in items:
        keys = tuple(rest[0]) if rest else ()
        tags = frozenset(rest[1]) if len(rest) > 1 else frozenset()
        out.append(Entry(name, f"{module}:{attribute}", keys, tags))
    return tuple(out)


_ALGORITHMS = "fedcore.algorithms"
_ASYNC = frozenset({"asynchronous"})
ALGORITHMS = Family(
    "algorithm",
    (
        Entry("ops", f"{_ALGORITHMS}.ops:OPS"),
        Entry("clipped-push-sum", f"{_ALGORITHMS}.clipped_push_sum:ClippedPushSum"),
        Entry("dpsgd", f"{_ALGORITHMS}.dpsgd:DPSGD"),
        Entry("dsgt", f"{_ALGORITHMS}.tracking:DSGT"),
        Entry("push-pull", f"{_ALGORITHMS}.tracking:PushPull"),
        Entry("dog", f"{_ALGORITHMS}.online:DOG"),
        Entry("clippedgossip", f"{_ALGORITHMS}.robust_gossip:ClippedGossip"),
        Entry("trimmed-gossip", f"{_ALGORITHMS}.robust_gossip:TrimmedGossip"),
        Entry("median-gossip", f"{_ALGORITHMS}.robust_gossip:MedianGossip"),
        Entry("dol", f"{_ALGORITHMS}.online:DOL"),
        Entry("local", f"{_ALGORITHMS}.reference:Local"),
        Entry("central", f"{_ALGORITHMS}.reference:Central"),
        Entry("deepsqueeze", f"{_ALGORITHMS}.compressed:DeepSqueeze"),
        Entry("choco", f"{_ALGORITHMS}.compressed:CHOCO"),
        Entry("rps", f"{_ALGORITHMS}.rps:RPS"),
        Entry("fedavg", f"{_ALGORITHMS}.server:FedAvg"),
        Entry("doublesqueeze", f"{_ALGORITHMS}.squeeze:DoubleSqueeze"),
        Entry("apmsqueeze", f"{_ALGORITHMS}.squeeze:APMSqueeze"),
        Entry("adpsgd", f"{_ALGORITHMS}.asynchronous:ADPSGD", (), _ASYNC),
        Entry("async-push-sum", f"{_ALGORITHMS}.asynchronous:AsyncPushSum", (), _ASYNC),
        Entry("fedbuff", f"{_ALGORITHMS}.asynchronous:FedBuff", (), _ASYNC),
        Entry("fedasync", f"{_ALGORITHMS}.asynchronous:FedAsync", (), _ASYNC),
    ),
    group="fedcore.algorithms",
)
"""``algorithm.name``: the registered algorithms (a user's goes by import path);
``asynchronous``: one without rounds, which runs on the event engine."""

CODECS = Family(
    "codec",
    _entries(
        "fedcore.compression.registry",
        ("fp32", "_cast"),
        ("fp16", "_cast"),
        ("bf16", "_cast"),
        ("qsgd", "_qsgd", (), ("relative",)),
        ("sign", "_sign", (), ("relative",)),
        ("topk", "_topk", (), ("relative",)),
        ("randk", "_randk", (), ("relative",)),
        ("fp8", "_fp8"),
        ("float", "_float"),
        ("s2fp8", "_s2fp8"),
        ("raw", "_raw"),
    ),
    group="fedcore.codecs",
    plugin_tags=("relative",),
)
"""``compression.codec``: each name's factory builds its encoder from the ``[compression]``
options (:func:`fedcore.compression.make_codec`); ``relative``: an error that scales with
the values sent (no use on running sums that grow without bound)."""

OPTIMIZERS = Family(
    "optimizer",
    _entries(
        "fedcore.algorithms.optim",
        ("sgd", "sgd", ("weight_decay",), ("server",)),
        ("momentum", "momentum", ("momentum", "nesterov", "weight_decay"), ("server",)),
        ("adam", "adam", ("betas", "eps", "weight_decay"), ("server",)),
        ("adamw", "adamw", ("betas", "eps", "weight_decay")),
        ("lars", "lars", ("eta", "momentum", "weight_decay"), ("per-layer",)),
        ("lamb", "lamb", ("betas", "eps", "weight_decay", "trust_clip"), ("per-layer",)),
    ),
    plugin_keys=None,
    plugin_tags=("server", "per-layer"),
)
"""``optimizer.name``; ``keys`` are the ``[optimizer]`` keys each takes; ``server``: one the
server family's server may run (``algorithm.server_optimizer``); ``per-layer``: one that
needs the model's layer sizes."""


def _log2(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 1


def _one_way(topology: Any) -> int:
    """2 for ``topology.undirected`` (which adds the reverse of a one-way edge), else 1."""
    return 2 if topology.undirected else 1


def _per_node(edges: Callable[[int, Any], float]) -> Callable[[int, Any], int]:
    """An estimate of ``edges(n, topology)`` edges a node, plus every node's self-loop."""
    return lambda n, topology: int(n * edges(n, topology)) + n


def _either_way(p: float, undirected: bool) -> float:
    """The chance of an edge of an Erdos-Renyi graph made undirected (either direction)."""
    return p if not undirected else 1 - (1 - p) ** 2


def _kind(
    name: str,
    keys: tuple[str, ...],
    edges: Callable[[int, Any], int],
    tags: tuple[str, ...] = (),
) -> Entry:
    """A built-in topology kind: its builder is ``fedcore.topology.kinds._kind_<name>``."""
    target = f"fedcore.topology.kinds:_kind_{name.replace('-', '_')}"
    return Entry(name, target, keys, frozenset(tags), edges)


TOPOLOGY_KINDS = Family(
    "topology kind",
    (
        _kind("ring", (), _per_node(lambda n, t: 2)),
        _kind("directed-ring", (), _per_node(lambda n, t: _one_way(t))),
        _kind("exponential", (), _per_node(lambda n, t: _one_way(t) * _log2(n))),
        _kind("torus", ("rows", "cols"), _per_node(lambda n, t: 4), ("unset-at-0",)),
        _kind("complete", (), _per_node(lambda n, t: n - 1)),
        _kind(
            "erdos-renyi", ("p",), _per_node(lambda n, t: _either_way(t.p, t.undirected) * (n - 1))
        ),
        _kind("social", (), _per_node(lambda n, t: _one_way(t) * 3)),  # trusts two, trusted by one
        _kind("random-regular", ("degree",), _per_node(lambda n, t: t.degree)),
        # One edge and one self-loop a node a round, over a period of log2(n) rounds.
        _kind("one-peer-exponential", (), lambda n, t: 2 * n * _log2(n)),
        _kind("star", ("server",), _per_node(lambda n, t: 2), ("server",)),  # to it and back
    ),
    group="fedcore.topology_kinds",
    defaults={"edges": _per_node(lambda n, t: n - 1)},  # a plug-in: at most complete
    plugin_keys=("rows", "cols", "p", "degree", "server"),  # the built-in kinds' keys
    plugin_tags=("unset-at-0", "server"),
)
"""``topology.kind``; ``keys`` are each kind's parameters besides nodes and seed (the
``[topology]`` keys of the same names); ``unset-at-0``: a key set to 0 is left to the
kind's default; ``server``: ``nodes`` workers and one server more (the server family's
graph); ``edges``: the kind's edge estimate."""

DATASETS = Family(
    "dataset",
    _entries("fedcore.data.builtin", ("digits", "digits"), ("mnist1d", "mnist1d"))
    + _entries(
        "fedcore.data.cifar",
        ("cifar10", "cifar10", ("root",), ("images", "files")),
        ("cifar100", "cifar100", ("root",), ("images", "files")),
    )
    + _entries(
        "fedcore.data.idx",
        ("fashion-mnist", "fashion_mnist", ("root",), ("images", "files")),
        ("emnist", "emnist", ("root",), ("images", "files")),
    )
    + _entries(
        "fedcore.data.leaf",
        ("femnist", "femnist", ("root",), ("images", "files", "writers")),
        ("shakespeare", "shakespeare", ("root",), ("files", "writers")),
    ),
    group="fedcore.datasets",
    plugin_keys=("root",),
    plugin_tags=("files", "writers"),
)
"""``data.dataset``: the built-in datasets (a user's goes by import path, a folder of files
as ``"folder:PATH"``); ``keys``: ``root`` for those read from files under ``data.root``;
``files``: read from files (each module's ``standin`` writes stand-in files of it:
:mod:`fedcore.data.standin`); ``writers``: data with writers (the ``natural`` partition,
per-peer test sets)."""

MODELS = Family(
    "model",
    _entries(
        "fedcore.models",
        ("logreg", "logreg", (), ("convex",)),
        ("mlp", "mlp", ("hidden",)),
        ("cnn1d", "cnn1d", ("hidden",)),
    )
    + _entries(
        "fedcore.architectures",
        ("resnet20", "resnet20", ("norm",)),
        ("femnist-cnn", "femnist_cnn"),
        ("char-lstm", "char_lstm"),
        ("cnn32", "cnn32"),
    ),
    group="fedcore.models",
    plugin_keys=None,
)
"""``model.name``: the built-in models (a user's goes by import path); ``keys`` are the
``[model]`` keys each takes (``model.hidden``, ``model.norm``); ``convex``: regret has a
comparator."""

DEPLOY_TARGETS = Family(
    "deployment target",
    (
        Entry("compose", "fedcore.deploy.compose:write_compose"),
        Entry("k8s", "fedcore.deploy.k8s:write_k8s"),
    ),
    group="fedcore.deploy_targets",
)
"""``fedcore deploy --target NAME``: each name's writer is ``write(config, out, *, image,
port) -> Path`` (the files of a deployment of ``config`` under the folder ``out``, the path
it wrote returned); ``fedcore compose`` and ``fedcore k8s`` are the built-in writers with
all their options."""
