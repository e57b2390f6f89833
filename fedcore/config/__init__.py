"""Experiment configuration: TOML into frozen, validated dataclasses.

A config file has fourteen tables; every key is optional and defaults to the built-in run
(OPS on a 16-node directed social trust graph, digits with Dirichlet label skew;
:func:`table_keys` lists a table's keys)::

    [run]        name, seed, rounds, eval_every, regret, checkpoint_every, local_steps,
                 tensorboard, csv, target_accuracy
    [topology]   kind, nodes, seed, file, p, rows, cols, degree, period, undirected,
                 server (file wins)
    [algorithm]  name, lr, lr_schedule, warmup_rounds, lr_power, lr_scaling,
                 base_batch_size, and the algorithm's own options
    [optimizer]  name, momentum, nesterov, betas, eps, weight_decay, eta, trust_clip
    [data]       dataset, root, partition, alpha, shards_per_node, examples_per_node,
                 batch_size, test_fraction, order, stream, features, adversarial, noise,
                 drift
    [model]      name, hidden, dtype, and a model's own options (``norm``)
    [compression] codec, bits, ratio, chunk, scaled, format, exp_bits, man_bits, scaling
    [transport]  mode, deadline_s, strict_timeout_s, startup_timeout_s,
                 call_timeout_s, max_message_mb, round_window, chunk_timeout_s,
                 min_rate_mb_s, max_streams_per_sender, tls (a table: dir)
    [faults]     seed, drop, edge_drop, delay_s, partitions, crashes, announce
    [time]       seed, step_s, compute, sigma, alpha, slow_fraction, slow_factor, speeds,
                 compute_trace, latency_s, bandwidth_mb_s, edge_latency_s,
                 edge_bandwidth_mb_s, on_s, off_s, availability_trace
    [privacy]    mechanism, clip, noise, delta, target_epsilon, accountant
    [personal]   mode, steps, lr (a personal model per peer after the run; not part of the
                 run fingerprint)
    [simulate]   engine, device, node_records, partition  (how ``fedcore simulate`` runs; not part
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

The package, by concern:

* :mod:`~fedcore.config.constants`: each key's names (choices) and numeric bounds.
* :mod:`~fedcore.config.rules`: how a key's rule is declared on its field (``choice``,
  ``whole``, ``number``, ...) and the one loop that checks every table
  (:class:`~fedcore.config.rules.Table`).
* :mod:`~fedcore.config.tables`: the tables, one frozen dataclass each (``run``,
  ``topology``, ``learning``, ``data``, ``network``, ``faults``, ``time``, ``privacy``,
  ``personal``,
  ``simulate``).
* :mod:`~fedcore.config.experiment`: :class:`Config`, the tables together.
* :mod:`~fedcore.config.clock`: the ceiling of a run's virtual clock.
* :mod:`~fedcore.config.load`, :mod:`~fedcore.config.overrides`: reading a file and
  ``--set``; :mod:`~fedcore.config.dump`: writing one;
  :mod:`~fedcore.config.fingerprints`: the run fingerprint.
"""

from __future__ import annotations

from fedcore.config.clock import ClockCost, check_clock_horizon, counted, safe_product
from fedcore.config.constants import (
    AUTO_RECORDS_NODES,
    CODECS,
    COMPUTE_TIMES,
    CONVEX_MODELS,
    DATA_ENV,
    DEVICES,
    DTYPES,
    ENGINES,
    FLOAT32_MAX,
    FOLDER,
    LR_SCALINGS,
    LR_SCHEDULES,
    MAX_AVAILABILITY_CYCLES,
    MAX_BATCH,
    MAX_CHUNK,
    MAX_FEATURES,
    MAX_LOCAL_STEPS,
    MAX_NODES,
    MAX_PARAMETERS,
    MAX_ROUNDS,
    MAX_VIRTUAL_S,
    MODEL_CHOICES,
    MODES,
    NODE_MAPS_NODES,
    NODE_RECORDS,
    NORMS,
    OPTIMIZER_NAMES,
    ORDERS,
    PARTITIONS,
    RANK_PARTITIONS,
    REMOVED_KEYS,
    SEED_LIMIT,
    STREAMS,
    TRACKING_KEYS,
)
from fedcore.config.dump import config_to_dict, dumps_toml, toml_value
from fedcore.config.experiment import Config, table_keys
from fedcore.config.fingerprints import fingerprint, fingerprint_json
from fedcore.config.load import PATH_KEYS, config_from_dict, load_config
from fedcore.config.overrides import parse_override
from fedcore.config.tables.adversary import AdversaryConfig
from fedcore.config.tables.data import DataConfig
from fedcore.config.tables.faults import Crash, FaultsConfig, Partition
from fedcore.config.tables.learning import (
    AlgorithmConfig,
    ModelConfig,
    OptimizerConfig,
    effective_lr,
)
from fedcore.config.tables.network import CompressionConfig, TransportConfig
from fedcore.config.tables.run import RunConfig
from fedcore.config.tables.simulate import SimulateConfig
from fedcore.config.tables.time import TimeConfig
from fedcore.config.tables.topology import TopologyConfig

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
    "PATH_KEYS",
    "RANK_PARTITIONS",
    "REMOVED_KEYS",
    "SEED_LIMIT",
    "STREAMS",
    "TRACKING_KEYS",
    "AdversaryConfig",
    "AlgorithmConfig",
    "ClockCost",
    "CompressionConfig",
    "Config",
    "Crash",
    "DataConfig",
    "FaultsConfig",
    "ModelConfig",
    "OptimizerConfig",
    "Partition",
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
    "toml_value",
]
