"""The values a config's keys may take: each table's names (the choices of a key) and the
bounds of its numbers, declared once and read by the tables' checks
(:mod:`fedcore.config.tables`) and by the modules that act on the keys."""

from __future__ import annotations

from fedcore import registry

__all__ = [
    "AUTO_RECORDS_NODES",
    "CODECS",
    "COMPUTE_TIMES",
    "CONVEX_MODELS",
    "DATA_ENV",
    "DEVICES",
    "DTYPES",
    "ENGINES",
    "FLOAT32_MAX",
    "FOLDER",
    "LR_SCALINGS",
    "LR_SCHEDULES",
    "MAX_AVAILABILITY_CYCLES",
    "MAX_BATCH",
    "MAX_CHUNK",
    "MAX_FEATURES",
    "MAX_LOCAL_STEPS",
    "MAX_NODES",
    "MAX_PARAMETERS",
    "MAX_ROUNDS",
    "MAX_VIRTUAL_S",
    "MODEL_CHOICES",
    "MODES",
    "NODE_MAPS_NODES",
    "NODE_RECORDS",
    "NORMS",
    "OPTIMIZER_NAMES",
    "ORDERS",
    "PARTITIONS",
    "PRIVACY_ACCOUNTANTS",
    "PRIVACY_MECHANISMS",
    "PRIVACY_NOISE_KEYS",
    "RANK_PARTITIONS",
    "REMOVED_KEYS",
    "SEED_LIMIT",
    "STREAMS",
    "TRACKING_KEYS",
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
(:func:`~fedcore.config.check_clock_horizon`). The draws of mean 1 are bounded (a lognormal
one below 9.1e15, a Pareto one below 9.1e13: the keyed hash has 53 bits), so no clock of an
accepted run overflows to infinity (a null in the records)."""

MAX_AVAILABILITY_CYCLES = 1e6
"""The most on/off periods (``time.on_s`` + ``time.off_s``) a run's clock may pass through,
every draw at its mean. The clock steps a peer through its periods one at a time (about
half a millisecond a period, measured on 16 peers with 10,000 periods each), so periods far
shorter than the run would hold the run for hours
(:func:`~fedcore.config.check_clock_horizon`)."""

PARTITIONS = ("iid", "dirichlet", "shards", "sorted", "quantity", "natural", "slices")
"""How training data is split across nodes (``data.partition``)."""
MODES = ("strict", "deadline")
"""How a node waits for its in-neighbours (``transport.mode``)."""
ORDERS = ("shuffled", "sorted")
"""Order of a node's examples in a dataset stream (``data.order``)."""
LR_SCHEDULES = ("constant", "sqrt", "cosine", "poly")
"""Step-size schedules (``algorithm.lr_schedule``)."""
LR_SCALINGS = ("none", "linear", "sqrt")
"""How ``algorithm.lr`` scales with the batch size (``algorithm.lr_scaling``)."""
OPTIMIZER_NAMES = registry.OPTIMIZERS.builtin
"""Node optimizers (``optimizer.name``; :data:`fedcore.algorithms.optim.OPTIMIZERS`)."""
REMOVED_KEYS = {
    "transport.kind": "the command chooses the transport (fedcore simulate: in-process; "
    "fedcore launch and fedcore node: gRPC). Delete the line.",
}
"""Keys a config may no longer set, each with what to do instead (one line, exit 2)."""
PRIVACY_MECHANISMS = ("none", "dp-sgd", "dp-peer", "dp-fedavg")
"""``privacy.mechanism``: none, per-example DP-SGD on each peer, peer-level noise on what
each peer sends (its whole data, against its neighbours), or user-level DP-FedAvg
(clipping and noise at the server; :mod:`fedcore.privacy`)."""

PRIVACY_NOISE_KEYS = ("seed", "secret")
"""``privacy.noise_key``: the noise keyed by the run's seed (reproducible; every peer of
the run could redraw it) or by a secret each process draws from the OS (a deployment)."""

PRIVACY_ACCOUNTANTS = ("prv", "rdp")
"""``privacy.accountant``: Opacus's accountant that turns a private run's steps into
epsilon (:mod:`fedcore.privacy.accountant`)."""

ENGINES = ("auto", "vectorized", "messages", "cohort")
"""Values of ``simulate.engine``."""

NODE_RECORDS = ("auto", "all", "eval", "none")
"""Values of ``simulate.node_records``."""

RANK_PARTITIONS = ("auto", "blocks", "graph", "metis")
"""Values of ``simulate.partition``: how a sharded run places peers on its ranks
(:mod:`fedcore.engines.partition`)."""

DATA_ENV = "FEDCORE_DATA"
"""The environment variable that sets the default ``data.root``."""

FOLDER = "folder:"
"""The prefix of ``data.dataset = "folder:PATH"`` (:func:`fedcore.data.folder.folder`)."""

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

CODECS = registry.CODECS.builtin
"""Codecs (``compression.codec``)."""

AUTO_RECORDS_NODES = 256
"""Up to this many nodes ``simulate.node_records = "auto"`` writes every node record."""

NODE_MAPS_NODES = 100_000
"""Up to this many nodes an evaluation record holds ``node_accuracy`` (one entry a node)
and ``summary.json`` ``params_sha256`` (one digest a node); above, a run leaves them out
(they would be tens of MB a line) and the summary has ``params_sha256_all``, one digest
of every node's parameters in node order."""

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
