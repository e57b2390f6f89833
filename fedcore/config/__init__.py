"""Experiment configuration: TOML into frozen, validated dataclasses.

A config file has ten tables; every key is optional and defaults to the built-in run
(OPS on a 16-node directed social trust graph, digits with Dirichlet label skew)::

    [run]        name, seed, rounds, eval_every, regret, checkpoint_every, local_steps
    [topology]   kind, nodes, seed, file, p, rows, cols, degree, undirected, server
                 (file wins)
    [algorithm]  name, lr, lr_schedule, warmup_rounds, lr_power, lr_scaling,
                 base_batch_size, and the algorithm's own options
    [optimizer]  name, momentum, nesterov, betas, eps, weight_decay, eta, trust_clip
    [data]       dataset, partition, alpha, shards_per_node, batch_size, test_fraction,
                 order, stream, features, adversarial, noise, drift
    [model]      name, hidden, dtype
    [compression] codec, bits, ratio, chunk, scaled
    [transport]  mode, deadline_s, strict_timeout_s, startup_timeout_s,
                 call_timeout_s, max_message_mb, tls (a table: dir)
    [faults]     seed, drop, edge_drop, delay_s, partitions, crashes, announce
    [simulate]   engine, device, node_records  (how ``fedcore simulate`` runs; not part
                 of the experiment: left out of the run fingerprint)

``--set KEY=VALUE`` overrides any key by dotted path; VALUE is read as a TOML value
(``--set run.rounds=50``, ``--set algorithm.name=dpsgd``; a bare word is a string).
Unknown tables or keys, wrong types and unknown names raise
:class:`~fedcore.errors.ConfigError` naming the key and the closest names ("did you mean
`rounds`?", :func:`fedcore.registry.did_you_mean`); so do values that could only fail once
the rounds start (whitespace around a name, ``optimizer.eps = 0``, a step beyond float32,
a device the engine would not use).

Paths (``topology.file``, ``transport.tls.dir``, ``data.root``, the ``PATH`` of
``data.dataset = "folder:PATH"``; see ``PATH_KEYS``) written in a config file
are relative to the folder of that file, and paths given with ``--set`` or in no file at
all are relative to the current directory: :func:`load_config` makes both absolute, so a
config (and the ``config.toml`` a run saves) works from any directory. User code is named
by import path (``"pkg.module:factory"``), never by file, so no other key holds a path.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fedcore import registry
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id, clip, shorten
from fedcore.registry import close_matches, did_you_mean

__all__ = [
    "AUTO_RECORDS_NODES",
    "CODECS",
    "COMPUTE_TIMES",
    "CONVEX_MODELS",
    "DATA_ENV",
    "DEVICES",
    "DTYPES",
    "ENGINES",
    "FOLDER",
    "LR_SCALINGS",
    "LR_SCHEDULES",
    "MAX_AVAILABILITY_CYCLES",
    "MAX_VIRTUAL_S",
    "MODEL_CHOICES",
    "MODES",
    "NODE_RECORDS",
    "NORMS",
    "OPTIMIZER_NAMES",
    "ORDERS",
    "PARTITIONS",
    "PATH_KEYS",
    "REMOVED_KEYS",
    "STREAMS",
    "TRACKING_KEYS",
    "AlgorithmConfig",
    "ClockCost",
    "CompressionConfig",
    "Config",
    "DataConfig",
    "FaultsConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RunConfig",
    "SimulateConfig",
    "TimeConfig",
    "TopologyConfig",
    "TransportConfig",
    "check_clock_horizon",
    "config_from_dict",
    "config_to_dict",
    "counted",
    "dumps_toml",
    "effective_lr",
    "fingerprint",
    "fingerprint_json",
    "load_config",
    "parse_override",
    "safe_product",
    "table_keys",
]


TRACKING_KEYS = ("tensorboard", "csv", "target_accuracy")
"""``[run]`` keys that say what a run writes beside its records (experiment tracking and
what the summary reports), not what runs: left out of the run fingerprint and of a run's
name."""

COMPUTE_TIMES = ("fixed", "lognormal", "pareto")
"""How a peer's compute time of a local step is drawn (``time.compute``)."""

MAX_VIRTUAL_S = 1e15
"""The latest moment, in virtual seconds, a run's clock may reach (about 32 million years;
float64 still tells an eighth of a second apart there). Costs that could take a run's
clock past it, every draw at its mean, are refused before the run
(:func:`check_clock_horizon`). The draws of mean 1 are bounded (a lognormal one below
9.1e15, a Pareto one below 9.1e13: the keyed hash has 53 bits), so no clock of an
accepted run overflows to infinity (a null in the records)."""

MAX_AVAILABILITY_CYCLES = 1e6
"""The most on/off periods (``time.on_s`` + ``time.off_s``) a run's clock may pass through,
every draw at its mean. The clock steps a peer through its periods one at a time (about
half a millisecond a period, measured on 16 peers with 10,000 periods each), so periods far
shorter than the run would hold the run for hours (:func:`check_clock_horizon`)."""

PARTITIONS = ("iid", "dirichlet", "shards", "quantity", "natural")
"""How training data is split across nodes (``data.partition``)."""
MODES = ("strict", "deadline")
"""How a node waits for its in-neighbours (``transport.mode``)."""
ORDERS = ("shuffled", "sorted")
"""Order of a node's examples in a dataset stream (``data.order``)."""
LR_SCHEDULES = ("constant", "sqrt", "cosine", "poly")
"""Step-size schedules (``algorithm.lr_schedule``)."""
LR_SCALINGS = ("none", "linear", "sqrt")
"""How ``algorithm.lr`` scales with the batch size (``algorithm.lr_scaling``)."""
OPTIMIZER_NAMES = registry.OPTIMIZERS.names
"""Node optimizers (``optimizer.name``; :data:`fedcore.algorithms.optim.OPTIMIZERS`)."""
REMOVED_KEYS = {
    "transport.kind": "the command chooses the transport (fedcore simulate: in-process; "
    "fedcore launch and fedcore node: gRPC). Delete the line.",
}
"""Keys a config may no longer set, each with what to do instead (one line, exit 2)."""
ENGINES = ("auto", "vectorized", "messages")
"""Values of ``simulate.engine``."""

NODE_RECORDS = ("auto", "all", "eval", "none")
"""Values of ``simulate.node_records``."""

DATA_ENV = "FEDCORE_DATA"
"""The environment variable that sets the default ``data.root``."""

FOLDER = "folder:"
"""The prefix of ``data.dataset = "folder:PATH"`` (:func:`fedcore.localdata.folder`)."""

STREAMS = ("", "synthetic")
"""Values of ``data.stream`` besides a user's ``"pkg.module:factory"``."""

DTYPES = ("float32", "float64")
"""Values of ``model.dtype``."""

NORMS = ("group", "none", "batch")
"""Values of ``model.norm`` (``resnet20``: GroupNorm, none, BatchNorm)."""

MODEL_CHOICES: dict[str, tuple[str, ...]] = {"norm": NORMS}
"""The values a built-in model's ``[model]`` option may take, checked when the config is
read (the option's own name: the models that take it, :data:`fedcore.registry.MODELS`)."""

DEVICES = ("cpu", "cuda")
"""Device kinds ``simulate.device`` may name (``"cuda:1"`` picks a GPU)."""

CONVEX_MODELS = registry.MODELS.tagged("convex")
"""Built-in models whose loss is convex in the parameters (``run.regret`` needs one)."""

CODECS = registry.CODECS.names
"""Codecs (``compression.codec``)."""

# Bounds of the integer keys, so that a typo such as 10**23 is a clear ConfigError here and
# never an OverflowError or a failed allocation deep in a run.
MAX_ROUNDS = 10**9
"""Most rounds a run may have (``run.rounds``, periods and fault rounds). Far beyond any
experiment (10**9 rounds at 1 ms each are 11 days), far inside every integer a round meets
(a Python list index, int64 tensors, the wire's uint64)."""
MAX_NODES = 1_000_000
"""Most nodes a generated topology may have: a million peers of logistic regression run on
the vectorized engine in a few GiB (``examples/dog-1m.toml``)."""
SEED_LIMIT = 2**64
"""``topology.seed`` and ``faults.seed`` are in ``[0, SEED_LIMIT)``: they fit in 64 bits."""
MAX_PARAMETERS = 2**31
"""Most parameters a built-in model may have (8 GiB a float32 copy; a peer keeps several).
:func:`fedcore.models.build_model` refuses larger ones before allocating anything."""
MAX_LOCAL_STEPS = 10**4
"""Most ``run.local_steps``: local steps a round (each reads one minibatch)."""
MAX_BATCH = 10**6
"""Largest ``data.batch_size``."""
MAX_FEATURES = 100_000
"""Largest ``data.features`` (the synthetic stream's dimension)."""
FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: a larger step size or weight decay is inf on a float32 model."""
MAX_CHUNK = 2**40
"""Largest ``compression.chunk``: the bound every codec header accepts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """``[run]``: name (empty: ``<algorithm>-<topology>``), seed, rounds, eval period.

    ``regret``: after the run, compute the static regret (and the dynamic regret where the
    stream knows its comparator) at every evaluation round, for convex models (``logreg``).
    ``checkpoint_every``: a run (``fedcore simulate``) or a peer (``fedcore node``)
    checkpoints its state every K rounds (0: never); ``fedcore simulate --resume RUN_DIR``
    and ``fedcore node --resume`` continue from the newest good checkpoint.
    ``local_steps``: K steps of the node's optimizer on K local minibatches a round, the
    last of them the algorithm's own step before it communicates (local SGD; local D-SGD
    for the gossip algorithms); 1 is one step a round.
    ``tensorboard``: also write TensorBoard event files into ``<run>/tensorboard/`` (the
    round aggregates, evaluations, bytes, regret and the config as text; needs the
    ``tensorboard`` package: ``pip install 'fedcore[tensorboard]'``). ``csv``: also write
    ``<run>/rounds.csv``, one row of round aggregates a round. ``target_accuracy``: the
    summary says when the average model first reached it. None of the three changes the
    run (they are not part of its fingerprint).
    """

    name: str = ""
    seed: int = 0
    rounds: int = 300
    eval_every: int = 25
    regret: bool = False
    checkpoint_every: int = 0
    local_steps: int = 1
    tensorboard: bool = False
    csv: bool = False
    target_accuracy: float = 0.0
    """The summary's ``time_to_target``: the first evaluation whose average-model accuracy
    reaches it (round, and virtual seconds with ``[time]``); 0: not reported."""

    def __post_init__(self) -> None:
        """Validate ranges."""
        _require(
            0.0 <= self.target_accuracy <= 1.0,
            "run.target_accuracy",
            self.target_accuracy,
            "must be an accuracy in [0, 1] (0: none)",
        )
        _require(
            _is_int(self.seed) and 0 <= self.seed < 2**32,
            "run.seed",
            self.seed,
            "must be in [0, 2**32)",
        )
        _int_range("run.rounds", self.rounds, 1, MAX_ROUNDS)
        _int_range("run.eval_every", self.eval_every, 1, MAX_ROUNDS)
        _int_range("run.checkpoint_every", self.checkpoint_every, 0, MAX_ROUNDS)
        _int_range("run.local_steps", self.local_steps, 1, MAX_LOCAL_STEPS)
        _require(
            not (self.regret and self.local_steps > 1),
            "run.local_steps",
            self.local_steps,
            "must be 1 with run.regret = true (regret counts one loss a node a round)",
        )
        _require(
            "/" not in self.name and "\\" not in self.name,
            "run.name",
            self.name,
            "must not contain path separators",
        )
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(
                "run.tensorboard = true needs the tensorboard package, which is not "
                "installed; install it with: pip install 'fedcore[tensorboard]' (or pip "
                "install tensorboard), or set run.tensorboard = false."
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyConfig:
    """``[topology]``: a generator (kind, nodes, seed and its parameters) or a file.

    ``file``: a graph file; :func:`load_config` makes it absolute (a relative path in a
    config file is relative to that file's folder, one given with ``--set`` to the current
    directory). ``undirected = true`` adds the reverse of every one-way edge (an undirected
    exponential or Erdos-Renyi graph, for algorithms that need a symmetric one).
    ``server``: the parameter server's node id, of a ``star`` (``nodes`` workers and the
    server) or of a graph file, for the server family (``fedavg``, ...); it holds no data.
    """

    kind: str = "social"
    nodes: int = 16
    seed: int = 0
    file: str = ""
    p: float = 0.3
    rows: int = 0
    cols: int = 0
    degree: int = 4
    undirected: bool = False
    server: str = "server"

    def __post_init__(self) -> None:
        """Validate ranges."""
        _int_range("topology.nodes", self.nodes, 1, MAX_NODES)
        _int_range("topology.seed", self.seed, 0, SEED_LIMIT - 1)
        _int_range("topology.rows", self.rows, 0, MAX_NODES)
        _int_range("topology.cols", self.cols, 0, MAX_NODES)
        _int_range("topology.degree", self.degree, 1, MAX_NODES - 1)
        _require(0.0 < self.p <= 1.0, "topology.p", self.p, "must be in (0, 1]")
        _name("topology.kind", self.kind, registry.TOPOLOGY_KINDS, user=False)
        check_node_id(self.server, "topology.server", ConfigError)


@dataclass(frozen=True, slots=True, kw_only=True)
class AlgorithmConfig:
    """``[algorithm]``: name, step size and schedule; other keys go to the algorithm.

    ``lr_schedule``: ``constant``, ``sqrt``, ``cosine`` or ``poly`` (power ``lr_power``),
    after ``warmup_rounds`` rounds of linear warm-up. ``lr_scaling`` (``none``, ``linear``
    or ``sqrt``) with ``base_batch_size`` B0 scales the step size for a batch size B of
    ``k = B / B0`` times the base: ``linear`` multiplies ``lr`` by k and divides the
    warm-up rounds by k (the same warm-up epochs), ``sqrt`` multiplies ``lr`` by sqrt(k)
    and keeps the warm-up rounds (warm-up epochs k times longer: LEGW). See
    :func:`effective_lr`; the summary records the values used.
    """

    name: str = "ops"
    lr: float = 0.5
    lr_schedule: str = "constant"
    warmup_rounds: int = 0
    lr_power: float = 1.0
    lr_scaling: str = "none"
    base_batch_size: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Validate ranges."""
        _require(math.isfinite(self.lr) and self.lr >= 0, "algorithm.lr", self.lr, "must be >= 0")
        _choice("algorithm.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _int_range("algorithm.warmup_rounds", self.warmup_rounds, 0, MAX_ROUNDS)
        _require(
            math.isfinite(self.lr_power) and self.lr_power > 0,
            "algorithm.lr_power",
            self.lr_power,
            "must be > 0",
        )
        _choice("algorithm.lr_scaling", self.lr_scaling, LR_SCALINGS)
        _int_range("algorithm.base_batch_size", self.base_batch_size, 0, MAX_BATCH)
        _require(
            self.lr_scaling == "none" or self.base_batch_size > 0,
            "algorithm.base_batch_size",
            self.base_batch_size,
            f"must be set (> 0) with lr_scaling = {self.lr_scaling!r}",
        )


def effective_lr(algorithm: AlgorithmConfig, batch_size: int) -> tuple[float, int]:
    """``(lr, warmup_rounds)`` after ``algorithm.lr_scaling`` for ``batch_size``."""
    if algorithm.lr_scaling == "none":
        return algorithm.lr, algorithm.warmup_rounds
    k = batch_size / algorithm.base_batch_size
    if algorithm.lr_scaling == "linear":
        return algorithm.lr * k, max(0, round(algorithm.warmup_rounds / k))
    return algorithm.lr * math.sqrt(k), algorithm.warmup_rounds


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerConfig:
    """``[optimizer]``: the rule that turns a node's gradient into its step.

    ``name`` is one of ``OPTIMIZER_NAMES`` (:mod:`fedcore.algorithms.optim` has the update
    rules); ``sgd`` with no ``weight_decay`` is the plain ``lr * g`` step of every algorithm,
    bit for bit. Each optimizer takes only its own keys: ``momentum`` (``momentum``,
    ``lars``), ``nesterov`` (``momentum``), ``betas`` and ``eps`` (``adam``, ``adamw``,
    ``lamb``), ``eta`` (``lars``'s trust coefficient), ``trust_clip`` (``lamb``'s bound on
    the weight norm, 0 for none), ``weight_decay`` (all). Setting a key an optimizer does
    not take to anything but its default is refused.
    """

    name: str = "sgd"
    momentum: float = 0.9
    nesterov: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    eta: float = 0.001
    trust_clip: float = 0.0

    def __post_init__(self) -> None:
        """Validate names and ranges."""
        _choice("optimizer.name", self.name, OPTIMIZER_NAMES)
        betas = self.betas
        ok = (
            isinstance(betas, list | tuple)
            and len(betas) == 2
            and all(isinstance(b, int | float) and not isinstance(b, bool) for b in betas)
            and all(0 <= b < 1 for b in betas)
        )
        _require(ok, "optimizer.betas", betas, "must be two numbers in [0, 1), e.g. [0.9, 0.999]")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        for key in ("momentum", "eps", "weight_decay", "eta", "trust_clip"):
            value = getattr(self, key)
            _require(math.isfinite(value) and value >= 0, f"optimizer.{key}", value, "must be >= 0")
        _require(self.momentum < 1, "optimizer.momentum", self.momentum, "must be below 1")
        _require(
            self.eps > 0,
            "optimizer.eps",
            self.eps,
            "must be > 0 (the optimizers that take it divide by sqrt(v) + eps, which is 0 "
            "for a weight whose gradient is 0: the run would diverge at round 0)",
        )

    def options(self) -> dict[str, Any]:
        """The keyword options of :func:`~fedcore.algorithms.optim.make_optimizer`: every
        key this optimizer takes, and any other key set away from its default (which
        ``make_optimizer`` then refuses, naming it)."""
        takes = _OPTIMIZER_KEYS[self.name]
        defaults = OptimizerConfig()
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "name":
                continue
            value = getattr(self, f.name)
            if f.name in takes or value != getattr(defaults, f.name):
                out[f.name] = value
        return out


_OPTIMIZER_KEYS: dict[str, tuple[str, ...]] = {e.name: e.keys for e in registry.OPTIMIZERS}
"""The ``[optimizer]`` keys each optimizer takes (its factory's keywords)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """``[data]``: dataset, how it is split across nodes, minibatch size, online streams.

    ``order``: ``"shuffled"`` minibatches, or ``"sorted"`` by label (each node sees its
    classes one after another). ``stream``: ``""`` (batches of ``dataset``),
    ``"synthetic"`` (the drifting stream of :mod:`fedcore.streams`, shaped by
    ``features``, ``adversarial`` (G), ``noise`` (sigma) and ``drift`` (M)) or a user's
    ``"pkg.module:factory"``. ``root``: the folder of the datasets read from files
    (``cifar10``, ``femnist``, ...; :func:`fedcore.localdata.data_root`: ``""`` is
    ``$FEDCORE_DATA``, else ``~/.cache/fedcore/data``). ``partition``: ``iid``,
    ``dirichlet`` (label skew, ``alpha``), ``shards`` (``shards_per_node`` classes a node),
    ``quantity`` (size skew, ``alpha``) or ``natural`` (whole writers a node; per-node test
    sets where every test writer has training data).
    """

    dataset: str = "digits"
    root: str = ""
    partition: str = "dirichlet"
    alpha: float = 0.3
    shards_per_node: int = 2
    batch_size: int = 32
    test_fraction: float = 0.2
    order: str = "shuffled"
    stream: str = ""
    features: int = 10
    adversarial: float = 1.0
    noise: float = 1.0
    drift: float = 10.0

    def __post_init__(self) -> None:
        """Validate ranges."""
        _choice("data.order", self.order, ORDERS)
        _choice("data.partition", self.partition, PARTITIONS)
        if not self.dataset.startswith(FOLDER) or not self.dataset[len(FOLDER) :].strip():
            _name("data.dataset", self.dataset, registry.DATASETS)
        _require(
            self.root == self.root.strip(),
            "data.root",
            self.root,
            "has whitespace around it",
        )
        if self.partition == "natural" and self.dataset in registry.DATASETS:
            _require(
                "writers" in registry.DATASETS.entry(self.dataset).tags,
                "data.partition",
                self.partition,
                f"needs a dataset with writers ({', '.join(registry.DATASETS.tagged('writers'))});"
                f" {self.dataset!r} has none",
            )
        if self.stream not in STREAMS and ":" not in self.stream:
            hint = did_you_mean(self.stream, [s for s in STREAMS if s])
            raise ConfigError(
                f'data.stream = {_shown(self.stream)} is invalid: it must be "synthetic", '
                '"" (batches of data.dataset) or a stream of your own as "pkg.module:factory"'
                + (f"; {hint}" if hint else ".")
            )
        _require(
            math.isfinite(self.alpha) and self.alpha > 0, "data.alpha", self.alpha, "must be > 0"
        )
        _int_range("data.batch_size", self.batch_size, 1, MAX_BATCH)
        _int_range("data.shards_per_node", self.shards_per_node, 1, MAX_BATCH)
        _int_range("data.features", self.features, 1, MAX_FEATURES)
        for key in ("adversarial", "noise", "drift"):  # checked here, stream or not
            value = getattr(self, key)
            _require(math.isfinite(value) and value >= 0, f"data.{key}", value, "must be >= 0")
        _require(
            0 < self.test_fraction < 1,
            "data.test_fraction",
            self.test_fraction,
            "must be in (0, 1)",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """``[model]``: built-in name or ``"pkg.module:factory"``, MLP width, dtype.

    Other keys are passed to a user's model factory as keyword arguments.
    """

    name: str = "logreg"
    hidden: int = 64
    dtype: str = "float32"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Validate ranges."""
        _int_range("model.hidden", self.hidden, 1, MAX_PARAMETERS)
        _choice("model.dtype", self.dtype, DTYPES)
        _name("model.name", self.name, registry.MODELS)
        if self.name in registry.MODELS:
            _model_options(self.name, self.options)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressionConfig:
    """``[compression]``: the codec of every tensor a node sends.

        ``codec`` is one of ``CODECS``; ``bits`` applies to ``qsgd`` (2, 4 or 8), ``ratio`` (the
        fraction of values kept) to ``topk`` and ``randk``, ``chunk`` (values per scale, 0 for
        one scale per tensor) to ``sign``, ``qsgd`` and ``fp8``; ``scaled`` makes ``qsgd``
        contractive (shrunk by ``1 + omega``), as error-feedback methods need. ``format``
        (``e4m3`` or ``e5m2``) applies to ``fp8``; ``exp_bits`` (2..8), ``man_bits`` (0..23) and
        ``scaling`` (``none``, or ``aps``: each layer shifted by a power of two before the cast,
    the shifts sent) to ``float``. ``fp32`` is lossless for float32 models;
        ``raw`` keeps any dtype exactly.
    """

    codec: str = "fp32"
    bits: int = 8
    ratio: float = 0.01
    chunk: int = 0
    scaled: bool = False
    format: str = "e4m3"
    exp_bits: int = 4
    man_bits: int = 3
    scaling: str = "none"

    def __post_init__(self) -> None:
        """Validate names and ranges."""
        _choice("compression.codec", self.codec, CODECS)
        _require(self.bits in (2, 4, 8), "compression.bits", self.bits, "must be 2, 4 or 8")
        _require(0 < self.ratio <= 1, "compression.ratio", self.ratio, "must be in (0, 1]")
        _int_range("compression.chunk", self.chunk, 0, MAX_CHUNK)
        _choice("compression.format", self.format, ("e4m3", "e5m2"))
        _int_range("compression.exp_bits", self.exp_bits, 2, 8)
        _int_range("compression.man_bits", self.man_bits, 0, 23)
        _choice("compression.scaling", self.scaling, ("none", "aps"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """``[transport]``: how peers talk and how long a node waits for its inbox.

    The command chooses the transport: ``fedcore simulate`` runs in-process, ``fedcore
    launch`` and ``fedcore node`` over gRPC (:data:`REMOVED_KEYS`: ``kind`` said so and did
    nothing, and is refused).
    """

    mode: str = "strict"
    deadline_s: float = 5.0
    strict_timeout_s: float = 300.0
    startup_timeout_s: float = 60.0
    call_timeout_s: float = 60.0
    max_message_mb: float = 1024.0
    round_window: int = 32
    """Deadline mode: rounds a sender may run ahead of a receiver beyond what lock-step
    allows; a message further ahead is refused (FAILED_PRECONDITION) and changes nothing."""
    chunk_timeout_s: float = 10.0
    """gRPC: longest wait for the next chunk of a message (and for its header)."""
    min_rate_mb_s: float = 1.0
    """gRPC: slowest transfer a receiver waits for; a message of S MiB may take
    ``chunk_timeout_s + S / min_rate_mb_s`` seconds in all."""
    max_streams_per_sender: int = 4
    """gRPC: message streams one sender may have open at once at a receiver."""
    tls: Mapping[str, Any] = field(default_factory=dict)
    """``[transport.tls]``: ``dir`` holds ``ca.crt`` and each node's ``<id>.crt`` and
    ``<id>.key`` (as ``fedcore certs init`` writes them). Set: every gRPC channel is
    mutual TLS and a sender's identity is the node id in its certificate. Empty: plaintext.
    A local path, so it is not part of the run fingerprint (hosts may keep certificates
    in different places); :func:`load_config` makes it absolute, as ``topology.file``."""

    @property
    def tls_dir(self) -> Path | None:
        """The certificate folder, or None when TLS is off."""
        return Path(self.tls["dir"]) if self.tls else None

    def __post_init__(self) -> None:
        """Validate ranges."""
        if not isinstance(self.tls, Mapping):
            raise ConfigError(f"transport.tls must be a table (dir = ...), got {self.tls!r}.")
        unknown = sorted(set(self.tls) - {"dir"})
        if unknown:
            hint = did_you_mean(unknown[0], ["dir"])
            raise ConfigError(
                f"unknown key transport.tls.{unknown[0]}"
                + (f"; {hint}" if hint else "")
                + " (keys of [transport.tls]: dir)."
            )
        if self.tls:
            _require(
                isinstance(self.tls.get("dir"), str) and bool(self.tls["dir"]),
                "transport.tls.dir",
                self.tls.get("dir"),
                "must be the certificate folder (fedcore certs init --out DIR)",
            )
        for key in (
            "startup_timeout_s",
            "call_timeout_s",
            "max_message_mb",
            "chunk_timeout_s",
            "min_rate_mb_s",
        ):
            value = getattr(self, key)
            _require(
                isinstance(value, int | float) and math.isfinite(value) and value > 0,
                f"transport.{key}",
                value,
                "must be a number > 0",
            )
        _int_range("transport.round_window", self.round_window, 0, 10**6)
        _int_range("transport.max_streams_per_sender", self.max_streams_per_sender, 1, 1024)
        _choice("transport.mode", self.mode, MODES)
        _require(self.deadline_s > 0, "transport.deadline_s", self.deadline_s, "must be > 0")
        _require(
            self.strict_timeout_s > 0,
            "transport.strict_timeout_s",
            self.strict_timeout_s,
            "must be > 0",
        )


def _edge(key: str, text: object) -> tuple[str, str]:
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


def _entry_hint(item: object, keys: tuple[str, ...]) -> str:
    """``"; bakc: did you mean `back`?."`` for the unknown keys of a fault entry (else ".")."""
    if not isinstance(item, Mapping):
        return "."
    hints = [(k, did_you_mean(k, keys)) for k in item if k not in keys]
    shown = [f"{k}: {h}" for k, h in hints if h]
    return f" ({'; '.join(shown)})." if shown else "."


def _round(key: str, value: object) -> int:
    if not _is_int(value) or not 0 <= value <= MAX_ROUNDS:  # type: ignore[operator]
        raise ConfigError(
            f"{key} must be a round number from 0 to {MAX_ROUNDS:,}, got {_shown(value)}."
        )
    assert isinstance(value, int)
    return value


@dataclass(frozen=True, slots=True)
class Partition:
    """``nodes`` are cut off from every other node for rounds ``start <= t < end``."""

    nodes: frozenset[str]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Crash:
    """``node`` is down for rounds ``at <= t < back`` (``back = -1``: for good)."""

    node: str
    at: int
    back: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultsConfig:
    """``[faults]``: reproducible message loss, delay, partitions and crashes.

    Every decision is a function of ``(run.seed, faults.seed, sender, receiver, round,
    phase)``, so a fault plan gives the same run in-process and over gRPC.

    * ``drop``: probability that any message is lost; ``edge_drop`` overrides it per edge:
      ``{ "n0->n1" = 0.5 }`` (two different nodes: a self-loop carries no message).
    * ``delay_s``: each message waits uniformly in ``[0, delay_s]`` before it is sent (a
      node sends one message after another, so its delays add up within a phase).
    * ``partitions``: ``[{ nodes = ["n0", "n1"], start = 10, end = 20 }]``: messages between
      those nodes and the rest are lost in rounds 10-19.
    * ``crashes``: ``[{ node = "n3", at = 50, back = 80 }]``: n3 does nothing in rounds
      50-79 (no step, no message) and resumes with the state it had; omit ``back`` to keep
      it down.
    * ``announce`` (default true): a lost message is replaced by a tiny drop notice, so
      receivers never wait for it (runs are fast and deterministic in strict mode); false:
      it vanishes and receivers need ``transport.mode = "deadline"``.
    """

    seed: int = 0
    drop: float = 0.0
    edge_drop: Mapping[str, float] = field(default_factory=dict)
    delay_s: float = 0.0
    partitions: tuple[Any, ...] = ()
    crashes: tuple[Any, ...] = ()
    announce: bool = True

    def __post_init__(self) -> None:
        """Validate, and parse ``partitions`` and ``crashes`` into typed records."""
        _require(0.0 <= self.drop <= 1.0, "faults.drop", self.drop, "must be in [0, 1]")
        _require(
            math.isfinite(self.delay_s) and self.delay_s >= 0,
            "faults.delay_s",
            self.delay_s,
            "must be >= 0",
        )
        _int_range("faults.seed", self.seed, 0, SEED_LIMIT - 1)
        if not isinstance(self.edge_drop, Mapping):
            raise ConfigError(f"faults.edge_drop must be a table, got {_shown(self.edge_drop)}.")
        edges: dict[tuple[str, str], str] = {}
        for edge, p in self.edge_drop.items():
            pair = _edge("faults.edge_drop", edge)
            if pair in edges:
                raise ConfigError(
                    f"faults.edge_drop names the edge {pair[0]}->{pair[1]} twice ({edges[pair]!r} "
                    f"and {edge!r}); give it once."
                )
            edges[pair] = edge
            ok = isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 1
            _require(ok, f"faults.edge_drop.{edge!r}", p, "must be a probability in [0, 1]")
        for key in ("partitions", "crashes"):
            value = getattr(self, key)
            if not isinstance(value, list | tuple):
                raise ConfigError(f"faults.{key} must be a list of tables, got {value!r}.")
        object.__setattr__(self, "partitions", tuple(map(self._partition, self.partitions)))
        object.__setattr__(self, "crashes", tuple(map(self._crash, self.crashes)))

    @property
    def active(self) -> bool:
        """Whether any fault is configured."""
        return bool(self.drop or self.edge_drop or self.delay_s or self.partitions or self.crashes)

    @staticmethod
    def _partition(item: object) -> Partition:
        if isinstance(item, Partition):
            return item
        key = "faults.partitions"
        if not isinstance(item, Mapping) or set(item) != {"nodes", "start", "end"}:
            raise ConfigError(
                f"{key}: each entry is {{ nodes = [...], start = R, end = R }}"
                + _entry_hint(item, ("nodes", "start", "end"))
            )
        nodes = item["nodes"]
        if not isinstance(nodes, list | tuple) or not nodes:
            raise ConfigError(f"{key}: nodes must be a non-empty list of node ids.")
        for node in nodes:
            check_node_id(node, f"{key}.nodes", ConfigError)
        start, end = _round(f"{key}.start", item["start"]), _round(f"{key}.end", item["end"])
        _require(end > start, f"{key}.end", end, f"must be after start ({start})")
        return Partition(frozenset(nodes), start, end)

    @staticmethod
    def _crash(item: object) -> Crash:
        if isinstance(item, Crash):
            return item
        key = "faults.crashes"
        if not isinstance(item, Mapping) or not {"node", "at"} <= set(item) <= {
            "node",
            "at",
            "back",
        }:
            raise ConfigError(
                f"{key}: each entry is {{ node = ID, at = R, back = R }}"
                + _entry_hint(item, ("node", "at", "back"))
            )
        node = check_node_id(item["node"], f"{key}.node", ConfigError)
        at = _round(f"{key}.at", item["at"])
        back = item.get("back", -1)
        if back != -1:
            back = _round(f"{key}.back", back)
            _require(back > at, f"{key}.back", back, f"must be after at ({at})")
        return Crash(node, at, back)


def _seconds_table(key: str, table: object, *, positive: bool) -> None:
    """Refuse a per-edge table of seconds or rates that is not ``{"u->v" = number}``."""
    if not isinstance(table, Mapping):
        raise ConfigError(f'{key} must be a table {{ "u->v" = number }}, got {_shown(table)}.')
    for edge, value in table.items():
        _edge(key, edge)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (value > 0 if positive else value >= 0)
        bound = "> 0" if positive else ">= 0"
        _require(ok, f"{key}.{edge!r}", value, f"must be a number {bound}")


@dataclass(frozen=True, slots=True)
class ClockCost:
    """One share of the latest moment a run's virtual clock could reach
    (:func:`check_clock_horizon`)."""

    key: str
    """The key (``time.step_s``, ``transport.deadline_s`` ...) the share comes from."""
    value: object
    """That key's value (a trace: its path)."""
    seconds: float
    """The share, over the whole run, in virtual seconds (inf if it overflows)."""
    how: str
    """How it comes about, e.g. ``"300 rounds x a latency of 2 s"``."""
    fix: str = "lower it"
    """What to do with the key's value (a bandwidth: raise it)."""


def check_clock_horizon(costs: Iterable[ClockCost], cycle_s: float = 0.0) -> None:
    """Refuse costs whose sum could take a run's virtual clock past :data:`MAX_VIRTUAL_S`
    (or overflow it), naming the key of the largest share; and, with ``cycle_s`` (a mean
    on period plus a mean off period, :attr:`TimeConfig.cycle_s`), a sum that would pass
    more than :data:`MAX_AVAILABILITY_CYCLES` of them.

    Raises:
        ConfigError: the sum is above :data:`MAX_VIRTUAL_S`, infinite or NaN, or spans too
            many on/off periods.
    """
    shares = list(costs)
    total = sum((c.seconds for c in shares), 0.0)  # fsum raises on overflow; this is inf
    if total <= MAX_VIRTUAL_S:
        if cycle_s > 0 and total / cycle_s > MAX_AVAILABILITY_CYCLES:
            raise ConfigError(
                f"time.on_s + time.off_s = {cycle_s:.3g} s is too short for a run whose "
                f"clock reaches about {total:.3g} s: each peer would pass "
                f"{total / cycle_s:,.0f} on/off periods, more than the "
                f"{MAX_AVAILABILITY_CYCLES:.0e} the clock steps through "
                f"(fedcore.config.MAX_AVAILABILITY_CYCLES); make the periods at least "
                f"{total / MAX_AVAILABILITY_CYCLES:.4g} s together, or run fewer rounds."
            )
        return
    worst = max(shares, key=lambda c: math.inf if math.isnan(c.seconds) else c.seconds)
    raise ConfigError(
        f"{worst.key} = {_shown(worst.value)} is invalid: {worst.how} would take the run's "
        f"virtual clock to {total:.3g} s, past the {MAX_VIRTUAL_S:.0e} s it may reach "
        f"(fedcore.config.MAX_VIRTUAL_S); {worst.fix}, or run fewer rounds."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeConfig:
    """``[time]``: how long things take, in virtual seconds (:mod:`fedcore.timing`).

    Compute: one local step of a peer takes ``step_s`` times the peer's speed factor times a
    draw of ``compute`` (``"fixed"``: 1; ``"lognormal"``: mean 1, log-spread ``sigma``;
    ``"pareto"``: mean 1, tail index ``alpha`` > 1, heavy-tailed). Speed factors: a share
    ``slow_fraction`` of the peers (``round(slow_fraction * N)`` of them, chosen by the
    keyed hash) is ``slow_factor`` times slower, and ``speeds = { n3 = 4.0 }`` sets a peer's
    factor outright. ``compute_trace``: a CSV file of ``node,seconds`` rows, each node's
    successive step times (cycled), instead of the draws.

    Links: a message takes ``latency_s`` plus its encoded bytes over ``bandwidth_mb_s``
    (MiB/s; 0: unlimited), per edge ``edge_latency_s`` / ``edge_bandwidth_mb_s``
    (``{ "n0->n1" = 0.5 }``); ``faults.delay_s`` adds its delay.

    Availability: each peer alternates on and off periods of exponential length with means
    ``on_s`` and ``off_s`` (both > 0 to switch it on), or the off windows of
    ``availability_trace`` (a CSV of ``node,start_s,end_s`` rows). A peer starts a
    computation only while on.

    Every draw is a keyed hash of ``(run.seed, time.seed, node, step)``, so both engines
    and every process see the same times. Costs that could take a run's clock past
    :data:`MAX_VIRTUAL_S` (every draw at its mean: ``run.rounds`` x ``run.local_steps`` x
    ``step_s`` x the slowest factor, plus the latencies, transfers and off periods) are
    refused at load, naming the key (:meth:`clock_costs`). Unset (the default), time is
    not simulated (every duration 0), except that ``fedcore simulate`` in deadline mode
    keeps a virtual clock for its deadlines.
    """

    seed: int = 0
    step_s: float = 0.0
    compute: str = "fixed"
    sigma: float = 1.0
    alpha: float = 2.0
    slow_fraction: float = 0.0
    slow_factor: float = 10.0
    speeds: Mapping[str, float] = field(default_factory=dict)
    compute_trace: str = ""
    latency_s: float = 0.0
    bandwidth_mb_s: float = 0.0
    edge_latency_s: Mapping[str, float] = field(default_factory=dict)
    edge_bandwidth_mb_s: Mapping[str, float] = field(default_factory=dict)
    on_s: float = 0.0
    off_s: float = 0.0
    availability_trace: str = ""

    def __post_init__(self) -> None:
        """Validate ranges."""
        _int_range("time.seed", self.seed, 0, SEED_LIMIT - 1)
        _choice("time.compute", self.compute, COMPUTE_TIMES)
        for key in ("step_s", "latency_s", "bandwidth_mb_s", "on_s", "off_s"):
            value = getattr(self, key)
            _require(math.isfinite(value) and value >= 0, f"time.{key}", value, "must be >= 0")
        _require(
            math.isfinite(self.sigma) and 0 < self.sigma <= 10,
            "time.sigma",
            self.sigma,
            "must be in (0, 10]",
        )
        _require(
            math.isfinite(self.alpha) and 1 < self.alpha <= 100,
            "time.alpha",
            self.alpha,
            "must be in (1, 100] (a Pareto tail with a finite mean)",
        )
        _require(
            0 <= self.slow_fraction <= 1,
            "time.slow_fraction",
            self.slow_fraction,
            "must be a share in [0, 1]",
        )
        _require(
            math.isfinite(self.slow_factor) and self.slow_factor > 0,
            "time.slow_factor",
            self.slow_factor,
            "must be > 0",
        )
        _require(
            (self.on_s > 0) == (self.off_s > 0),
            "time.off_s" if self.on_s > 0 else "time.on_s",
            self.off_s if self.on_s > 0 else self.on_s,
            "must be set with the other (time.on_s and time.off_s, both > 0: mean on and "
            "off periods)",
        )
        _require(
            not (self.on_s > 0 and self.availability_trace),
            "time.availability_trace",
            self.availability_trace,
            "cannot be set with time.on_s and time.off_s (one source of availability)",
        )
        if not isinstance(self.speeds, Mapping):
            raise ConfigError(
                f"time.speeds must be a table {{ node = factor }}, got {_shown(self.speeds)}."
            )
        for node, factor in self.speeds.items():
            check_node_id(node, "time.speeds", ConfigError)
            ok = isinstance(factor, int | float) and not isinstance(factor, bool)
            _require(
                ok and math.isfinite(factor) and factor > 0,
                f"time.speeds.{node}",
                factor,
                "must be a number > 0 (the peer's compute time multiplier)",
            )
        _seconds_table("time.edge_latency_s", self.edge_latency_s, positive=False)
        _seconds_table("time.edge_bandwidth_mb_s", self.edge_bandwidth_mb_s, positive=True)
        check_clock_horizon(self.clock_costs(rounds=1, local_steps=1))

    @property
    def active(self) -> bool:
        """Whether any duration is set (a run then keeps a virtual clock)."""
        return self != TimeConfig(seed=self.seed)

    @property
    def cycle_s(self) -> float:
        """A mean on period plus a mean off period (0: no on/off periods)."""
        return self.on_s + self.off_s if self.on_s > 0 and self.off_s > 0 else 0.0

    def slowest(self) -> tuple[str, float]:
        """The key and value of the largest speed factor a peer may have (1: no key makes
        any peer slower; ``slow_factor`` counts when ``slow_fraction`` > 0)."""
        factors = [("time.slow_factor", float(self.slow_factor))] if self.slow_fraction else []
        factors += [(f"time.speeds.{v}", float(f)) for v, f in self.speeds.items()]
        return max(factors, key=lambda kv: kv[1], default=("time.speeds", 1.0))

    def clock_costs(self, *, rounds: int, local_steps: int) -> list[ClockCost]:
        """What ``[time]`` alone (every draw at its mean, one phase, one-byte messages)
        adds to a run's clock over ``rounds`` rounds of ``local_steps`` steps: the least
        any run of these keys costs, refused at load above :data:`MAX_VIRTUAL_S`
        (:func:`check_clock_horizon`; the set-up adds the phases, message sizes, traces
        and deadlines: :meth:`fedcore.timing.TimeModel.clock_costs`)."""
        compute, links, off = self.clock_shares(rounds=rounds, local_steps=local_steps)
        return [*compute, *links, *off]

    def clock_shares(
        self,
        *,
        rounds: int,
        local_steps: int,
        phases: int = 1,
        message_bytes: int = 1,
        speed: float | None = None,
    ) -> tuple[list[ClockCost], list[ClockCost], list[ClockCost]]:
        """What ``[time]``'s keys add to a run's clock, every draw at its mean, over
        ``rounds`` rounds of ``local_steps`` steps and ``phases`` phases of messages of at
        most ``message_bytes`` bytes, as three lists: the compute (``step_s`` times
        ``speed``, the slowest speed factor of the run's peers; ``None``: the slowest any
        peer may have, :meth:`slowest`; nothing with a compute trace, whose values only the
        set-up reads), the links (per phase the longest latency, and the message over the
        slowest bandwidth) and the off periods. Apart, so that the set-up
        (:meth:`fedcore.timing.TimeModel.clock_costs`) adds to each what it alone knows:
        the compute trace, the fault plan's delay and the deadline."""
        compute = []
        if not self.compute_trace and self.step_s > 0:
            factor_key, slowest = self.slowest()
            factor = slowest if speed is None else speed
            key, value = ("time.step_s", self.step_s)
            if factor > max(self.step_s, 1.0):  # the factor is the unusual one
                key, value = factor_key, slowest
            compute.append(
                ClockCost(
                    key,
                    value,
                    safe_product(rounds, local_steps, self.step_s, factor),
                    f"{counted(rounds, 'round')} x {counted(local_steps, 'local step')} x "
                    f"time.step_s = {self.step_s:.3g} s x the slowest speed factor "
                    f"{factor:.3g}",
                )
            )
        each = counted(rounds, "round") + (f" x {counted(phases, 'phase')}" if phases != 1 else "")
        links = []
        latency = max(
            [("time.latency_s", float(self.latency_s))]
            + [(f"time.edge_latency_s.{e!r}", float(v)) for e, v in self.edge_latency_s.items()],
            key=lambda kv: kv[1],
        )
        if latency[1] > 0:
            links.append(
                ClockCost(
                    *latency,
                    safe_product(rounds, phases, latency[1]),
                    f"{each} x a latency of {latency[1]:.3g} s",
                )
            )
        rates = [("time.bandwidth_mb_s", float(self.bandwidth_mb_s))]
        rates += [
            (f"time.edge_bandwidth_mb_s.{e!r}", float(v))
            for e, v in self.edge_bandwidth_mb_s.items()
        ]
        rates = [kv for kv in rates if kv[1] > 0]  # 0: unlimited
        if rates and message_bytes > 0:
            key, rate = min(rates, key=lambda kv: kv[1])
            message = "one byte" if message_bytes == 1 else f"a message of {message_bytes} bytes"
            links.append(
                ClockCost(
                    key,
                    rate,
                    safe_product(rounds, phases, message_bytes / (rate * 2**20)),
                    f"{each} x {message} at {rate:.3g} MiB/s",
                    "raise it",
                )
            )
        off = []
        if self.off_s > 0:
            off.append(
                ClockCost(
                    "time.off_s",
                    self.off_s,
                    safe_product(rounds, self.off_s),
                    f"{counted(rounds, 'round')} x a mean off period of {self.off_s:.3g} s",
                )
            )
        return compute, links, off


def counted(n: int, what: str) -> str:
    """``"1 round"``, ``"300 rounds"``."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def safe_product(*factors: float) -> float:
    """The product of non-negative ``factors``: 0 if any is 0 (never ``0 x inf = nan``),
    inf where it overflows (a clock cost's seconds, here and in :mod:`fedcore.timing`)."""
    if any(f == 0 for f in factors):
        return 0.0
    return math.prod(float(f) for f in factors)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateConfig:
    """``[simulate]``: how ``fedcore simulate`` runs a config in one process.

    ``engine``: ``"messages"`` runs one asyncio node per peer exchanging encoded messages
    (the reference, and what gRPC peers do); ``"vectorized"`` holds every node's state
    stacked and applies each round to all nodes at once; ``"auto"`` (the default) takes
    ``vectorized`` whenever it supports the config and says why not otherwise.
    ``device``: ``"cpu"``, ``"cuda"`` or ``"cuda:K"`` (the vectorized engine only).
    ``node_records``: the per-node lines of ``metrics.jsonl``: ``"all"`` (one a node a
    round), ``"eval"`` (on evaluation rounds only), ``"none"``; ``"auto"`` is ``all`` up to
    ``AUTO_RECORDS_NODES`` nodes and ``eval`` above. Per-round network aggregates
    (``"kind": "round"``) are written whatever this says.
    """

    engine: str = "auto"
    device: str = "cpu"
    node_records: str = "auto"

    def __post_init__(self) -> None:
        """Validate names."""
        _choice("simulate.engine", self.engine, ENGINES)
        _choice("simulate.node_records", self.node_records, NODE_RECORDS)
        kind, colon, index = self.device.partition(":")
        hint = did_you_mean(kind, DEVICES) if kind not in DEVICES else ""
        _require(
            kind in DEVICES
            and (not colon or (kind == "cuda" and index.isascii() and index.isdigit())),
            "simulate.device",
            self.device,
            "must be 'cpu', 'cuda' or 'cuda:K' (K a GPU's number)" + (f"; {hint}" if hint else ""),
        )
        _require(
            self.engine != "messages" or kind == "cpu",
            "simulate.device",
            self.device,
            "needs the vectorized engine (simulate.engine = 'messages' runs on the CPU): set "
            "simulate.engine = 'vectorized', or simulate.device = 'cpu'",
        )


AUTO_RECORDS_NODES = 256
"""Up to this many nodes ``simulate.node_records = "auto"`` writes every node record."""

NODE_MAPS_NODES = 100_000
"""Up to this many nodes an evaluation record holds ``node_accuracy`` (one entry a node)
and ``summary.json`` ``params_sha256`` (one digest a node); above, a run leaves them out
(they would be tens of MB a line) and the summary has ``params_sha256_all``, one digest
of every node's parameters in node order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """A whole experiment."""

    run: RunConfig = field(default_factory=RunConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    time: TimeConfig = field(default_factory=TimeConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)

    def __post_init__(self) -> None:
        """Refuse what the tables cannot do together."""
        if self.time.active:  # the least its costs take the clock to over the whole run
            check_clock_horizon(
                self.time.clock_costs(rounds=self.run.rounds, local_steps=self.run.local_steps),
                cycle_s=self.time.cycle_s,
            )
        if self.model.dtype == "float32":
            for key, value in (
                ("algorithm.lr", self.algorithm.lr),
                ("optimizer.weight_decay", self.optimizer.weight_decay),
            ):
                _require(
                    value <= FLOAT32_MAX,
                    key,
                    value,
                    f"must be at most {FLOAT32_MAX:.4g} with model.dtype = 'float32' (a "
                    "larger step is inf in float32: the run would diverge at round 0)",
                )
        if self.run.regret and self.model.name not in CONVEX_MODELS:
            raise ConfigError(
                f"run.regret = true needs a model whose loss is convex in its parameters "
                f"({', '.join(CONVEX_MODELS)}): model {clip(self.model.name)} has no "
                "static regret to compute (and the dynamic regret is defined for logreg "
                "only). Set model.name = 'logreg', or run.regret = false."
            )


_SECTIONS: dict[str, type[Any]] = {
    "run": RunConfig,
    "topology": TopologyConfig,
    "algorithm": AlgorithmConfig,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "compression": CompressionConfig,
    "transport": TransportConfig,
    "faults": FaultsConfig,
    "time": TimeConfig,
    "simulate": SimulateConfig,
}


def table_keys(name: str) -> tuple[str, ...]:
    """The keys table ``[name]`` has of its own (sorted), without the options it passes on
    (``[algorithm]``'s to the algorithm, ``[model]``'s to a user's model)."""
    return tuple(sorted(f.name for f in fields(_SECTIONS[name]) if f.name != "options"))


def _require(ok: bool, key: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {_shown(value)} is invalid: it {why}.")


def _choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    """Refuse a value that is not one of ``choices``, suggesting the closest ones."""
    if value not in choices:
        hint = did_you_mean(value, choices)
        raise ConfigError(
            f"{key} = {_shown(value)} is invalid: it must be one of {', '.join(choices)}"
            + (f"; {hint}" if hint else ".")
        )


def _name(key: str, value: str, family: registry.Family, *, user: bool = True) -> None:
    """Refuse a name that is not one of ``family`` (nor, with ``user``, an import path
    ``"pkg.module:factory"``, checked when it is loaded), suggesting the closest names."""
    if value not in family and not (user and ":" in value):
        raise ConfigError(f"{key}: {family.unknown(value, user=user)}.")


def _model_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse a built-in model's option with a value it cannot take, or one misspelt (close
    to an option it takes); other keys are refused when the model is built (with the same
    hints), as a user's factory's are."""
    takes = registry.MODELS.entry(name).keys
    for key, value in options.items():
        if key in takes and key in MODEL_CHOICES:
            _choice(f"model.{key}", value, MODEL_CHOICES[key])
        elif key not in takes:
            hint = did_you_mean(key, takes)
            if hint:
                raise ConfigError(f"model {name!r} has no option {key!r}; {hint}")


def _shown(value: object) -> str:
    """``repr(value)``, cut short for a value such as a 10,000-digit integer."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "(huge)"
    return shorten(text, 80)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_range(key: str, value: object, low: int, high: int) -> None:
    """Refuse a non-integer or one outside ``[low, high]``, naming the bound."""
    _require(
        _is_int(value) and low <= value <= high,  # type: ignore[operator]
        key,
        value,
        f"must be a whole number from {low} to {high:_}".replace("_", ","),
    )


_KEEPS_SPACES = frozenset({"topology.file"})
"""String keys whose value may start or end with whitespace (a file's name may)."""


def _coerce(key: str, value: object, default: object) -> object:
    """Check ``value`` against the type of the field's default (int accepted for float)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok:
            try:
                value = float(value)  # type: ignore[arg-type]
            except OverflowError:
                raise ConfigError(
                    f"{key} = {_shown(value)} is too large for a number; give a value below 1e308."
                ) from None
    elif isinstance(default, str):
        ok = isinstance(value, str)
        if isinstance(value, str) and value != value.strip() and key not in _KEEPS_SPACES:
            raise ConfigError(
                f"{key} = {_shown(value)} has whitespace around it, which no name or choice "
                f"has; write {_shown(value.strip())}."
            )
    else:
        ok = True
    if not ok:
        raise ConfigError(
            f"{key} must be of type {type(default).__name__}, got {_shown(value)} "
            f"({type(value).__name__})."
        )
    return value


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Build a validated :class:`Config` from nested tables.

    Raises:
        ConfigError: unknown table or key, wrong type, or invalid value.
    """
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        near = close_matches(unknown[0], _SECTIONS)
        raise ConfigError(
            f"unknown config table [{unknown[0]}]"
            + (f"; did you mean {' or '.join(f'[{t}]' for t in near)}?" if near else "")
            + f" (tables: {', '.join(_SECTIONS)})."
        )
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        table = raw.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"[{name}] must be a table, got {table!r}.")
        defaults = cls()
        names = {f.name for f in fields(cls)}
        takes_options = "options" in names
        known = names - {"options"}
        kwargs: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for key, value in table.items():
            removed = REMOVED_KEYS.get(f"{name}.{key}")
            if removed is not None:
                raise ConfigError(f"{name}.{key} was removed: {removed}")
            if key in known:
                kwargs[key] = _coerce(f"{name}.{key}", value, getattr(defaults, key))
            elif takes_options:
                options[key] = value
            else:
                hint = did_you_mean(key, known)
                raise ConfigError(
                    f"unknown key {name}.{key}"
                    + (f"; {hint}" if hint else "")
                    + f" (keys of [{name}]: {', '.join(sorted(known))})."
                )
        if takes_options:
            kwargs["options"] = options
        sections[name] = cls(**kwargs)
    return Config(**sections)


def config_to_dict(config: Config) -> dict[str, dict[str, Any]]:
    """Nested tables of ``config``, options flattened into their table."""
    out: dict[str, dict[str, Any]] = {}
    for name in _SECTIONS:
        table = asdict(getattr(config, name))
        if name == "faults":  # plain TOML values, sets sorted (fingerprints must not vary)
            table["edge_drop"] = dict(sorted(table["edge_drop"].items()))
            for part in table["partitions"]:
                part["nodes"] = sorted(part["nodes"])
            table["partitions"] = list(table["partitions"])
            table["crashes"] = list(table["crashes"])
        if name == "time":
            for key in ("speeds", "edge_latency_s", "edge_bandwidth_mb_s"):
                table[key] = dict(sorted(table[key].items()))
        options = table.pop("options", None)
        if options:
            table.update(options)
        out[name] = table
    return out


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``"a.b=value"`` (or ``"a.b.c=value"`` for a sub-table such as
    ``transport.tls.dir``) into ``(["a", "b"], value)``; value as TOML, else a string."""
    key, sep, text = item.partition("=")
    path = key.strip().split(".")
    if not sep or len(path) not in (2, 3) or not all(path):
        raise ConfigError(
            f"--set {item!r} must look like TABLE.KEY=VALUE, e.g. --set algorithm.lr=0.1."
        )
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    except ValueError as exc:  # a number tomllib parses but Python will not convert
        raise ConfigError(
            f"--set {key.strip()}=... cannot be read: {str(exc).split(';')[0]}."
        ) from None
    return path, value


PATH_KEYS: tuple[tuple[str, ...], ...] = (
    ("topology", "file"),
    ("transport", "tls", "dir"),
    ("data", "root"),
    ("time", "compute_trace"),
    ("time", "availability_trace"),
)
"""The keys that hold a local path (as dotted paths split): :func:`load_config` makes them
absolute, and the ``PATH`` of ``data.dataset = "folder:PATH"``. The data, stream and model
keys otherwise name user code by import path, not by file."""


def _absolute_paths(raw: dict[str, Any], base: str) -> None:
    """Make every relative path of ``PATH_KEYS`` in ``raw`` absolute against ``base``.

    A leading ``~`` is the user's home folder. A value that is not a non-empty string is
    left for validation to report; an empty one means "none".
    """

    def absolute(value: str) -> str:
        return os.path.abspath(os.path.join(base, os.path.expanduser(value)))

    for keys in PATH_KEYS:
        table: object = raw
        for name in keys[:-1]:
            table = table.get(name) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            continue
        value = table.get(keys[-1])
        if isinstance(value, str) and value and value == value.strip():
            table[keys[-1]] = absolute(value)
    data = raw.get("data")
    dataset = data.get("dataset") if isinstance(data, dict) else None
    if isinstance(dataset, str) and dataset.startswith(FOLDER):
        path = dataset[len(FOLDER) :]
        if path and path == path.strip():
            data["dataset"] = FOLDER + absolute(path)  # type: ignore[index]


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Read ``path`` (or start from the built-in default), apply overrides, validate.

    Every path of ``PATH_KEYS`` comes back absolute: one written in the file relative to
    the file's folder, one given in ``overrides`` (or in no file) relative to the current
    directory. So the result, and the ``config.toml`` a run writes from it, mean the same
    files wherever they are used from.

    Raises:
        ConfigError: unreadable file, TOML syntax error, or any invalid key or value.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}.") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}.") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {str(path)!r} is not UTF-8 text: {exc.reason}."
            ) from exc
        except ValueError as exc:  # a number tomllib parses but Python will not convert
            raise ConfigError(
                f"config file {str(path)!r} cannot be read: {str(exc).split(';')[0]}."
            ) from exc
    raw = copy.deepcopy(raw)
    if path is not None:
        _absolute_paths(raw, os.path.dirname(os.path.abspath(path)))
    for item in overrides:
        keys, value = parse_override(item)
        section = raw
        for depth, name in enumerate(keys[:-1]):
            section = section.setdefault(name, {})
            if not isinstance(section, dict):
                raise ConfigError(f"[{'.'.join(keys[: depth + 1])}] must be a table.")
        section[keys[-1]] = value
    _absolute_paths(raw, os.getcwd())  # what the file left relative came from --set
    config = config_from_dict(raw)
    # Here, not in AlgorithmConfig: fedcore.testing names a run after an algorithm object.
    _name("algorithm.name", config.algorithm.name, registry.ALGORITHMS)
    return config


def fingerprint(config: Config, graph_edges: Iterable[tuple[str, str, float]]) -> str:
    """SHA-256 over the config and the weighted graph: peers of other runs differ.

    Local paths that peers may keep in different places are left out: the certificate
    folder (``transport.tls``), the graph file's name (``topology.file``; its edges
    and weights are in) and the datasets' folder (``data.root``).
    """
    edges = json.dumps(sorted(graph_edges), sort_keys=True, default=str)
    return fingerprint_json(config, [edges.encode()])


def fingerprint_json(config: Config, edges_json: Iterable[bytes]) -> str:
    """:func:`fingerprint` with the sorted edges given as JSON text, in chunks
    (:func:`fedcore.topology.digest.edges_json` writes them from a graph's arrays)."""
    tables = config_to_dict(config)
    tables.pop("simulate", None)  # how one process runs it, not what runs
    for key in TRACKING_KEYS:  # what is written beside the records, not what runs
        tables["run"].pop(key, None)
    tables["transport"].pop("tls", None)
    tables["topology"].pop("file", None)
    tables["data"].pop("root", None)
    if not config.time.active:  # fingerprints of runs without [time] as they were
        tables.pop("time", None)
    else:  # the traces' contents are in the run's times, not where a host keeps them
        tables["time"].pop("compute_trace", None)
        tables["time"].pop("availability_trace", None)
    # json.dumps({"config": tables, "edges": edges}, sort_keys=True), written in parts.
    digest = hashlib.sha256(b'{"config": ')
    digest.update(json.dumps(tables, sort_keys=True, default=str).encode())
    digest.update(b', "edges": ')
    for chunk in edges_json:
        digest.update(chunk)
    digest.update(b"}")
    return digest.hexdigest()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise ConfigError(f"cannot write {value!r} as a TOML value.")


def dumps_toml(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """Write nested tables of scalars as TOML (enough for configs)."""
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
        lines.append("")
    return "\n".join(lines)
