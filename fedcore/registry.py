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

import math
from collections.abc import Callable
from typing import Any

from fedcore.family import (
    FIX_PATH,
    PLUGIN_NAME,
    Entry,
    Family,
    close_matches,
    did_you_mean,
    import_object,
)
from fedcore.family import entries as _entries

__all__ = [
    "ALGORITHMS",
    "CODECS",
    "DATASETS",
    "DEPLOY_TARGETS",
    "FIX_PATH",
    "MODELS",
    "OPTIMIZERS",
    "PLUGIN_NAME",
    "TOPOLOGY_KINDS",
    "Entry",
    "Family",
    "close_matches",
    "did_you_mean",
    "import_object",
]


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
        Entry("push-diging", f"{_ALGORITHMS}.tracking:PushDIGing"),
        Entry("exact-diffusion", f"{_ALGORITHMS}.exact:ExactDiffusion"),
        Entry("dog", f"{_ALGORITHMS}.online:DOG"),
        Entry("clippedgossip", f"{_ALGORITHMS}.robust_gossip:ClippedGossip"),
        Entry("trimmed-gossip", f"{_ALGORITHMS}.robust_gossip:TrimmedGossip"),
        Entry("median-gossip", f"{_ALGORITHMS}.robust_gossip:MedianGossip"),
        Entry("dol", f"{_ALGORITHMS}.online:DOL"),
        Entry("local", f"{_ALGORITHMS}.reference:Local"),
        Entry("central", f"{_ALGORITHMS}.reference:Central"),
        Entry("deepsqueeze", f"{_ALGORITHMS}.compressed:DeepSqueeze"),
        Entry("choco", f"{_ALGORITHMS}.compressed:CHOCO"),
        Entry("beer", f"{_ALGORITHMS}.compressed:BEER"),
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


def _epidemic(n: int, topology: Any) -> int:
    """An epidemic schedule's edges over its period: ``degree`` out-edges a node a round and
    a self-loop (``period`` 0, the run's rounds not resolved yet: one round)."""
    return int(max(1, topology.period) * n * (topology.degree + 1))


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
        # Each round every node's degree out-edges and its self-loop, over the period.
        _kind("epidemic-local", ("degree", "period"), lambda n, t: _epidemic(n, t)),
        _kind("epidemic-oracle", ("degree", "period"), lambda n, t: _epidemic(n, t)),
    ),
    group="fedcore.topology_kinds",
    defaults={"edges": _per_node(lambda n, t: n - 1)},  # a plug-in: at most complete
    plugin_keys=("rows", "cols", "p", "degree", "server", "period"),  # the built-in kinds' keys
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
