"""Build a whole in-process network from a config: data, models, graph, nodes.

:func:`build_network` is shared by ``fedcore simulate`` and by the public test harness
:mod:`fedcore.testing`, so users' tests run exactly the code path of a simulation.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import torch

from fedcore import topology
from fedcore.algorithms import Algorithm, algorithm_factory, make_algorithm
from fedcore.algorithms.optim import Optimizer, make_optimizer
from fedcore.algorithms.rule import NodeRule, is_rule
from fedcore.compression import codec_seed, configured_codec
from fedcore.config import Config, TopologyConfig, effective_lr, fingerprint_json
from fedcore.data import (
    BatchStream,
    Dataset,
    NoData,
    check_partition_size,
    load_dataset,
    partition,
    training_examples,
)
from fedcore.errors import ConfigError, DataError, TopologyError
from fedcore.faults import FaultPlan
from fedcore.ids import error_text
from fedcore.models import Objective, build_model, physical_memory
from fedcore.node import DecodeCache, Node, NodeOptions, RoundRecord
from fedcore.streams import Batches, OnlineSource, load_source
from fedcore.topology import Topology
from fedcore.topology.digest import edges_json
from fedcore.topology.weights import check_mixing_size
from fedcore.transport import InProcessNetwork, Transport
from fedcore.transport.faults import FaultyTransport

logger = logging.getLogger(__name__)

LOSSY_SPARSE = ("qsgd", "sign", "topk", "randk")
"""Codecs whose error scales with the values sent (no use on growing running sums)."""

__all__ = [
    "PROGRESS_AFTER_S",
    "PROGRESS_NODES",
    "Network",
    "RunSetup",
    "algorithm_options",
    "build_network",
    "build_topology",
    "communication_graph",
    "configured_algorithm",
    "estimated_edges",
    "make_objective",
    "prepare_run",
    "round_drift",
]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def build_topology(cfg: TopologyConfig) -> Topology:
    """The trust graph of ``[topology]``: the file if one is given, else the generator."""
    if cfg.file:
        if cfg.undirected:
            raise ConfigError("topology.undirected applies to generated graphs, not to files.")
        return topology.load(cfg.file)
    params: dict[str, object] = {}
    if cfg.kind == "erdos-renyi":
        params["p"] = cfg.p
    if cfg.kind == "random-regular":
        params["degree"] = cfg.degree
    if cfg.kind == "torus":
        params.update({k: v for k, v in (("rows", cfg.rows), ("cols", cfg.cols)) if v})
    if cfg.kind == "star":
        params["server"] = cfg.server
    built = topology.build(cfg.kind, nodes=cfg.nodes, seed=cfg.seed, **params)
    if not cfg.undirected:
        return built
    if not isinstance(built, topology.TrustGraph):
        raise ConfigError(f"topology.undirected does not apply to the schedule {cfg.kind!r}.")
    if not built.is_symmetric():
        edges = built.edges()
        return topology.TrustGraph.from_edges(
            [*edges, *((v, u) for u, v in edges)],
            name=f"{built.name}-undirected",
            nodes=built.nodes,
        )
    return built


def estimated_edges(cfg: TopologyConfig, nodes: int) -> int:
    """About how many edges (over one period, self-loops included) the generator of
    ``[topology]`` makes for ``nodes`` nodes, from the counts alone: what building the graph
    will cost before it is built. A ``file`` is not estimated (0)."""
    if cfg.file:
        return 0
    n = nodes
    log2 = max(1, math.ceil(math.log2(n))) if n > 1 else 1
    if cfg.kind == "one-peer-exponential":  # one edge and one self-loop a node a round
        return 2 * n * log2
    p = cfg.p if not cfg.undirected else 1 - (1 - cfg.p) ** 2
    one_way = 2 if cfg.undirected else 1  # undirected adds the reverse of a one-way edge
    per_node = {
        "ring": 2,
        "directed-ring": one_way,
        "exponential": one_way * log2,
        "torus": 4,
        "complete": n - 1,
        "erdos-renyi": p * (n - 1),
        "social": one_way * 3,  # trusts two, trusted back by one
        "random-regular": cfg.degree,
        "star": 2,  # each worker to the server and back
    }.get(cfg.kind, 1)
    return int(n * per_node) + n


def _period_graphs(t: Topology) -> tuple[topology.TrustGraph, ...]:
    """The graphs of one period of ``t`` (a TrustGraph is its own one)."""
    return tuple(t.at(r) for r in range(t.period))


def round_drift(config: Config) -> int:
    """Rounds a sender may run ahead of a receiver beyond strict lock-step.

    None in strict mode without faults. In deadline mode, or with a fault plan (a node does
    not wait for a message the plan lost), ``transport.round_window``; plus the length of
    every partition and crash window, in which the nodes cut off run on without waiting.
    """
    f = config.faults
    if config.transport.mode != "deadline" and not f.active:
        return 0
    rounds = config.run.rounds
    drift: int = config.transport.round_window
    drift += sum(max(0, min(p.end, rounds) - p.start) for p in f.partitions)
    drift += sum(max(0, (c.back if c.back >= 0 else rounds) - c.at) for c in f.crashes)
    return drift


def communication_graph(algorithm: Algorithm, trust: Topology) -> Topology:
    """The weighted graph ``algorithm`` communicates over, validated for it."""
    return topology.prepare(
        trust,
        mixing=algorithm.mixing,
        algorithm=algorithm.name,
        server=getattr(algorithm, "server", None),
    )


@dataclass(slots=True)
class Network:
    """An in-process network ready to run.

    Attributes:
        config: The experiment.
        dataset: The dataset (with its test split).
        trust: The trust graph as configured.
        graph: The weighted communication graph the algorithm uses.
        algorithm: The algorithm.
        transport: The in-process network (``transport.messages`` if recording).
        nodes: Node id -> node, in graph order.
        run_id: The run fingerprint.
        evaluator: An objective (own module) for evaluating any parameters.
        setup: What every peer derived from the config (streams, fault plan).
    """

    config: Config
    dataset: Dataset
    trust: Topology
    graph: Topology
    algorithm: Algorithm
    transport: InProcessNetwork
    nodes: dict[str, Node]
    run_id: str
    evaluator: Objective
    setup: RunSetup

    async def run_async(self, rounds: int) -> None:
        """Run every node up to ``rounds`` total rounds, concurrently.

        If a node fails, the others are cancelled and the first node's error is raised
        as itself (not wrapped in an exception group), so callers can catch it by type.
        """
        try:
            async with asyncio.TaskGroup() as group:
                for node in self.nodes.values():
                    group.create_task(node.run(rounds))
        except BaseExceptionGroup as failure:
            raise _first_leaf(failure) from None

    def run(self, rounds: int) -> None:
        """Run every node up to ``rounds`` total rounds (blocking)."""
        asyncio.run(self.run_async(rounds))


def _probe(objective: Objective, dataset: Dataset, name: str) -> None:
    """Run the model once on two examples so a broken model fails here, clearly."""
    x, y = dataset.x_train[:2], dataset.y_train[:2]
    try:
        logits = objective.module(x.to(objective.dtype))
    except Exception as exc:  # a user model can raise anything; report it as a config error
        raise DataError(
            f"model {name!r} failed on a batch of dataset {dataset.name!r}: {error_text(exc)}"
        ) from exc
    if not isinstance(logits, torch.Tensor):
        raise DataError(
            f"model {name!r} maps a batch of 2 examples to a {type(logits).__name__}; "
            f"expected (2, {dataset.num_classes}) class logits as a tensor."
        )
    if tuple(logits.shape) != (2, dataset.num_classes):
        raise DataError(
            f"model {name!r} maps a batch of 2 examples to shape {tuple(logits.shape)}; "
            f"expected (2, {dataset.num_classes}) class logits."
        )
    try:
        objective.loss_and_grad(objective.initial_params(), x, y)
    except Exception as exc:  # its backward pass, say
        raise DataError(
            f"model {name!r} failed to give a loss and gradient on a batch of dataset "
            f"{dataset.name!r}: {error_text(exc)}"
        ) from exc


_COPIES = 4
"""Model-sized float buffers a simulated node holds at least: its module's parameters and
their gradients, its algorithm state and a message."""

_EDGE_BYTES = 100
"""Bytes an edge of a weighted graph costs at least while it is built: index and weight
arrays of the trust and the weighted graph, and the engine's tables (a few hundred
measured; a graph was about 1,100 bytes an edge while it was built of networkx objects)."""

PROGRESS_NODES = 1000
"""From this many nodes on, :func:`prepare_run` given a ``progress`` stream says that it is
preparing when that takes more than :data:`PROGRESS_AFTER_S`."""
PROGRESS_AFTER_S = 2.0
"""Seconds of preparing after which :func:`prepare_run` prints its progress line."""


def _check_run_memory(
    config: Config,
    algorithm: Algorithm,
    evaluator: Objective,
    *,
    nodes: int,
    edges: int,
    hosts_all: bool,
) -> None:
    """Refuse, before the graph is built, a run whose least memory is clearly more than
    this machine has.

    The estimate is a lower bound: ``edges`` weighted edges (``_EDGE_BYTES`` each), and with
    ``hosts_all`` every node's model (``_COPIES`` buffers each; robust push-sum also keeps
    two float64 totals an edge). The engines check their own, larger, needs afterwards.
    """
    memory = physical_memory()
    if memory is None:
        return
    d = evaluator.initial_params().numel()
    itemsize = torch.empty((), dtype=evaluator.dtype).element_size()
    graph = edges * _EDGE_BYTES
    models = nodes * d * itemsize * _COPIES if hosts_all else 0
    if hosts_all and getattr(algorithm, "robust", False):
        models += 2 * edges * d * 8
    need = graph + models
    if need <= memory:
        return
    parts = [f"about {edges:,} graph edges ({_size(graph)})"]
    if hosts_all:
        parts.append(f"{nodes:,} models of {d:,} parameters x {_COPIES} copies ({_size(models)})")
    raise ConfigError(
        f"this run needs at least {_size(need)} of memory ({' and '.join(parts)}), more than "
        f"this machine's {_size(memory)}. Use fewer nodes (topology.nodes), a sparser graph "
        "or a smaller model."
    )


def _size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that leaves at least 1 (``1.5 GiB``)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


class _Announcer:
    """Prints ``text`` on ``stream`` once, if still running ``after_s`` seconds after
    :meth:`start`; :meth:`stop` cancels it (and waits, so nothing is printed after it)."""

    def __init__(self, stream: TextIO | None, text: str, after_s: float) -> None:
        self._stream = stream
        self._text = text
        self._timer = threading.Timer(after_s, self._say) if stream is not None else None
        if self._timer is not None:
            self._timer.daemon = True

    def _say(self) -> None:
        assert self._stream is not None
        self._stream.write(self._text + "\n")
        self._stream.flush()

    def start(self) -> None:
        """Start the countdown (no-op without a stream)."""
        if self._timer is not None:
            self._timer.start()

    def stop(self) -> None:
        """Cancel the line if it has not been printed yet."""
        if self._timer is not None:
            self._timer.cancel()
            if self._timer.is_alive():
                self._timer.join()


class _Laps:
    """Logs each step of :func:`prepare_run` with the seconds it took."""

    def __init__(self) -> None:
        self.began = self._last = time.perf_counter()

    def done(self, what: str, *args: object) -> None:
        now = time.perf_counter()
        logger.info(what + " (%.2f s)", *args, now - self._last)
        self._last = now


def _check_network_memory(config: Config, setup: RunSetup) -> None:
    """Refuse an in-process network whose models alone would not fit in this machine's
    memory (one model per node and one evaluator, ``_COPIES`` buffers each)."""
    memory = physical_memory()
    if memory is None:
        return
    models = len(setup.graph.nodes) + 1
    need = models * _COPIES * setup.start.numel() * setup.start.element_size()
    if need > memory:
        raise DataError(
            f"{len(setup.graph.nodes)} simulated nodes of a {setup.start.numel():,}-parameter "
            f"model need at least {need / 2**30:.1f} GiB ({models} models x {_COPIES} "
            f"copies), more than this machine's {memory / 2**30:.1f} GiB. Use a smaller "
            "model or fewer nodes."
        )


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def make_objective(config: Config, dataset: Dataset, gradient_mode: str | None = None) -> Objective:
    """The configured model, initialized from ``run.seed``, as a flat-parameter objective.

    ``gradient_mode`` (:data:`~fedcore.gradients.GRADIENT_MODES`): how its gradients are
    computed; ``None`` decides it on the first training examples (once a run: every peer
    and engine then reuses the run's decision, :meth:`RunSetup.objective`)."""
    options = dict(config.model.options)
    if config.model.name in ("mlp", "cnn1d"):
        options["hidden"] = config.model.hidden
    module = build_model(
        config.model.name,
        input_dim=dataset.input_dim,
        num_classes=dataset.num_classes,
        seed=config.run.seed,
        **options,
    )
    sample = None if gradient_mode is not None else (dataset.x_train[:6], dataset.y_train[:6])
    return Objective(
        module, _DTYPES[config.model.dtype], gradient_mode=gradient_mode, sample=sample
    )


@dataclass(slots=True)
class RunSetup:
    """Everything every peer of a run derives from the config, identically.

    Each peer (in one process or in its own) builds the same setup from the same config
    and then makes only its own :class:`Node` with :meth:`make_node`.
    """

    config: Config
    dataset: Dataset
    trust: Topology
    graph: Topology
    algorithm: Algorithm
    parts: list[Any]
    start: torch.Tensor
    run_id: str
    options: NodeOptions
    evaluator: Objective
    faults: FaultPlan | None = None
    source: OnlineSource | None = None

    def objective(self) -> Objective:
        """A fresh model (same initialization on every call) as a flat-parameter objective,
        computing its gradients as the run decided (:attr:`evaluator`'s mode)."""
        return make_objective(self.config, self.dataset, self.evaluator.rows.mode)

    @property
    def layers(self) -> tuple[int, ...]:
        """The model's layer sizes, in the flat parameters' order (for APS's shifts)."""
        return tuple(numel for _, _, numel in self.evaluator.segments)

    def optimizer(self) -> Optimizer | None:
        """The node optimizer of ``[optimizer]`` over the model's layers, or ``None`` for
        plain SGD without weight decay (every algorithm's own ``lr * g`` step)."""
        return node_optimizer(self.config, self.evaluator.segments)

    def stream(self, i: int) -> Batches:
        """A fresh stream of the node at graph index ``i`` (the same batches every time)."""
        if self.source is not None:
            return self.source.stream(i)
        if self.graph.nodes[i] == getattr(self.algorithm, "server", None):
            return NoData()
        idx = torch.as_tensor(self.parts[i])
        return BatchStream(
            self.dataset.x_train[idx],
            self.dataset.y_train[idx],
            batch_size=self.config.data.batch_size,
            seed=self.config.run.seed * 1_000_003 + i,
            order=self.config.data.order,
        )

    def make_node(
        self,
        node_id: str,
        transport: Transport,
        *,
        observer: Callable[[Node, RoundRecord], None] | None = None,
        decode_cache: DecodeCache | None = None,
    ) -> Node:
        """The node ``node_id`` with its data partition, its own model and ``transport``.

        With a ``[faults]`` plan, the node is given the plan and ``transport`` is wrapped in
        a :class:`FaultyTransport` of it (which loses the plan's messages on the wire).
        """
        if self.faults is not None:
            transport = FaultyTransport(transport, self.faults)
        i = self.graph.index(node_id)
        return Node(
            node_id,
            algorithm=self.algorithm,
            graph=self.graph,
            objective=self.objective(),
            stream=self.stream(i),
            transport=transport,
            options=self.options,
            params=self.start,
            codec=configured_codec(
                self.config.compression,
                seed=codec_seed(self.config.run.seed, i),
                layers=self.layers,
            ),
            optimizer=self.optimizer(),
            observer=observer,
            decode_cache=decode_cache,
            faults=self.faults,
        )


def algorithm_options(config: Config) -> dict[str, Any]:
    """The keyword options of ``config.algorithm.name`` (a registered name or a user's
    ``"pkg.module:factory"``): its ``[algorithm]`` keys, and for an algorithm of the server
    family (one whose factory takes a ``server``) ``server`` (``topology.server``) and
    ``seed`` (``run.seed``).

    Raises:
        ConfigError: an unknown name or an import path that does not load.
    """
    options = dict(config.algorithm.options)
    factory = algorithm_factory(config.algorithm.name)
    try:
        takes: Collection[str] = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read: no server options
        takes = ()
    if "server" in takes:
        options.setdefault("server", config.topology.server)
        if "seed" in takes:  # the server family's seeded choices (FedAvg's sample)
            options.setdefault("seed", config.run.seed)
    return options


def configured_algorithm(config: Config) -> Algorithm:
    """The algorithm of ``[algorithm]``: ``name`` (registered, or ``"pkg.module:factory"``)
    built with :func:`algorithm_options`.

    Raises:
        ConfigError: an unknown name, an import path that does not load or builds no
            algorithm, or an option it does not take.
    """
    return make_algorithm(config.algorithm.name, **algorithm_options(config))


def node_optimizer(
    config: Config, segments: list[tuple[str, int, int]] | None = None
) -> Optimizer | None:
    """The optimizer ``config.optimizer`` names, per layer over ``segments``; ``None`` for
    plain SGD without weight decay, which the algorithms apply themselves (bit for bit the
    step of a run without an ``[optimizer]`` table).

    Raises:
        ConfigError: an option the optimizer does not take.
    """
    opt = config.optimizer
    if opt.name == "sgd" and not opt.weight_decay:
        make_optimizer(opt.name, **opt.options())  # refuse keys plain SGD does not take
        return None
    return make_optimizer(opt.name, segments=segments, **opt.options())


def _check_combinations(config: Config, algorithm: Algorithm) -> None:
    """Refuse what the config's tables cannot do together (cheap: no graph, no data)."""
    optimizer = node_optimizer(config)
    if algorithm.name == "apmsqueeze" and optimizer is not None:
        raise ConfigError(
            f"algorithm 'apmsqueeze' is itself the optimizer (Adam, then momentum on the frozen "
            f"second moment); optimizer.name = {config.optimizer.name!r} would stand in for its "
            "gradient. Leave [optimizer] at plain SGD."
        )
    f = config.faults
    if f.active and not f.announce and config.transport.mode == "strict":
        raise ConfigError(
            "faults.announce = false makes lost messages vanish: strict mode would wait for "
            "them until transport.strict_timeout_s. Set transport.mode = 'deadline'."
        )
    if algorithm.name == "choco" and (f.drop or f.edge_drop or f.partitions or f.crashes):
        raise ConfigError(
            "algorithm 'choco' needs every message: a lost one leaves the receiver's copy of "
            "the sender's public model behind for good. Remove the [faults] losses, or use "
            "'deepsqueeze' or 'dpsgd', which mix what arrives."
        )
    if getattr(algorithm, "robust", False) and config.compression.codec in LOSSY_SPARSE:
        raise ConfigError(
            f"algorithm {config.algorithm.name!r} with robust = true sends running totals that "
            f"grow without bound; codec {config.compression.codec!r} has an error relative to "
            "them. Use compression.codec = 'fp32', 'fp16', 'bf16' or 'raw'."
        )


def prepare_run(
    config: Config,
    *,
    algorithm: Algorithm | None = None,
    trust: Topology | None = None,
    dataset: Dataset | None = None,
    progress: TextIO | None = None,
    hosts_all: bool = False,
) -> RunSetup:
    """Validate ``config`` and derive what every peer shares (see :class:`RunSetup`).

    What can be checked from the counts alone is checked before the graph is built (which
    takes seconds to a minute at tens of thousands of nodes): the config's combinations,
    the examples each node gets, a mixing over every pair of nodes, and a lower bound of the
    memory. Each step is logged (INFO) with its time.

    Args:
        config: The experiment.
        algorithm: Use this algorithm object instead of ``config.algorithm.name``.
        trust: Use this trust graph instead of ``config.topology``.
        dataset: Use this dataset instead of ``config.data.dataset``.
        progress: Where to print one line (``preparing N nodes ...``) when a run of at least
            :data:`PROGRESS_NODES` nodes takes more than :data:`PROGRESS_AFTER_S` seconds to
            prepare; None: print nothing.
        hosts_all: This machine will hold every node's model (``simulate``, ``launch``):
            the memory estimate counts them. False (a peer, a summary): the graph only.

    Raises:
        ConfigError, TopologyError, DataError: on anything invalid, before any work.
    """
    seed = config.run.seed
    laps = _Laps()
    if algorithm is None:
        algorithm = configured_algorithm(config)
    elif is_rule(algorithm):  # a bare rule: run it on one peer per node
        algorithm = NodeRule(algorithm)
    _check_combinations(config, algorithm)
    if trust is None and config.topology.file:  # its size is known only once it is read
        trust = build_topology(config.topology)
        laps.done("read the graph %s: %d nodes", trust.name, len(trust.nodes))
    if trust is not None:
        n = len(trust.nodes)
    else:  # a star has its server besides topology.nodes workers
        n = config.topology.nodes + (config.topology.kind == "star")
    server = getattr(algorithm, "server", None)
    # The server family's server holds no data: the split is over the workers only.
    server_at = None
    if server is not None:
        if trust is not None and server not in trust.nodes:
            raise TopologyError(
                f"topology.server = {server!r} is not a node of the graph {trust.name!r}."
            )
        if trust is None and config.topology.kind != "star":
            raise ConfigError(
                f"algorithm {algorithm.name!r} runs on a star: set topology.kind = 'star' "
                "(or a graph file with its server named by topology.server)."
            )
        server_at = trust.nodes.index(server) if trust is not None else n - 1
        if config.data.stream:
            raise ConfigError(
                f"algorithm {algorithm.name!r} has a server that holds no data, but "
                f"data.stream {config.data.stream!r} gives every node a stream of its own. "
                "Use a dataset (data.stream = '')."
            )
    holders = n - (server_at is not None)
    check_mixing_size(n, mixing=algorithm.mixing, algorithm=algorithm.name)
    source = None
    if config.data.stream:
        data = config.data
        stream_options = (
            {
                "features": data.features,
                "adversarial": data.adversarial,
                "noise": data.noise,
                "drift": data.drift,
            }
            if data.stream == "synthetic"
            else {}
        )
        source = load_source(
            data.stream,
            nodes=n,
            rounds=config.run.rounds,
            batch_size=data.batch_size,
            seed=seed,
            options=stream_options,
        )
        dataset = source.dataset
        laps.done("made the stream %s for %d nodes", data.stream, n)
    else:
        if dataset is None:
            known = training_examples(config.data.dataset, test_fraction=config.data.test_fraction)
            if known is not None:  # refuse too many nodes before even loading the data
                check_partition_size(
                    known,
                    holders,
                    config.data.partition,
                    shards_per_node=config.data.shards_per_node,
                )
            dataset = load_dataset(
                config.data.dataset, seed=seed, test_fraction=config.data.test_fraction
            )
            laps.done("loaded dataset %s: %d training examples", dataset.name, len(dataset.y_train))
    # The split needs only the node count: made before the graph, it refuses a split that
    # cannot be made (a Dirichlet one, say) without waiting for the graph.
    if source is not None:
        # Streams hold their own data: one shared empty part, not an array per node.
        parts = [np.zeros(0, dtype=np.int64)] * n
    else:
        parts = partition(
            dataset.y_train,
            holders,
            config.data.partition,
            seed=seed,
            alpha=config.data.alpha,
            shards_per_node=config.data.shards_per_node,
        )
        smallest = min(len(p) for p in parts)
        if config.data.batch_size > smallest:
            # Under lr_scaling the step size assumes batches of data.batch_size: say so.
            scaled = config.algorithm.lr_scaling != "none"
            logger.log(
                logging.WARNING if scaled else logging.INFO,
                "data.batch_size = %d is larger than the %d training examples of the "
                "smallest node: its batches hold all of them%s",
                config.data.batch_size,
                smallest,
                " (algorithm.lr_scaling still scales by data.batch_size)" if scaled else "",
            )
        if server_at is not None:
            parts.insert(server_at, np.zeros(0, dtype=np.int64))
        laps.done("split the data %s across %d nodes", config.data.partition, holders)
    evaluator = make_objective(config, dataset)
    _probe(evaluator, dataset, config.model.name)
    laps.done("built and probed model %s", config.model.name)
    if trust is None:
        edges = estimated_edges(config.topology, n)
    else:  # self-loops included, as the weights will have them
        edges = sum(g.index_edges()[0].size + len(g.nodes) for g in _period_graphs(trust))
    if algorithm.mixing in ("complete", "all-pairs"):
        edges = max(edges, n * n)
    _check_run_memory(config, algorithm, evaluator, nodes=n, edges=edges, hosts_all=hosts_all)
    announcer = _Announcer(
        progress if n >= PROGRESS_NODES else None,
        f"preparing {n:,} nodes (graph and weights) ...",
        PROGRESS_AFTER_S,
    )
    announcer.start()
    try:
        if trust is None:
            trust = build_topology(config.topology)
            laps.done("built the graph %s: %d nodes", trust.name, len(trust.nodes))
        graph = communication_graph(algorithm, trust)
        laps.done("weighted the graph for %s (%s mixing)", algorithm.name, algorithm.mixing)
        if graph.period > 1 and getattr(algorithm, "fixed_graph", False):
            raise ConfigError(
                f"algorithm {config.algorithm.name!r} runs on a fixed graph, but the topology "
                f"{trust.name!r} changes every round (a schedule of {graph.period} graphs). "
                "Use a static topology kind (fedcore topology show lists a schedule's)."
            )
        edges_used = (
            {e for t in range(graph.period) for e in graph.at(t).edges()}
            if config.faults.edge_drop
            else set()
        )
        for text in config.faults.edge_drop:
            sender, _, receiver = (part.strip() for part in text.partition("->"))
            known = sender in graph.nodes and receiver in graph.nodes  # else the plan says so
            if known and (sender, receiver) not in edges_used:
                raise ConfigError(
                    f"faults.edge_drop names {text!r}, but {sender} sends {receiver} nothing: it "
                    f"is not an edge of the graph {config.algorithm.name!r} communicates over. "
                    "Name an edge of the graph (fedcore topology show prints them)."
                )
        if len(graph.nodes) != n:  # a generator always makes n nodes; never split wrongly
            raise TopologyError(
                f"topology.nodes = {n}, but the graph {trust.name!r} has {len(graph.nodes)} nodes."
            )
        run_id = fingerprint_json(config, edges_json(graph))
        laps.done(
            "fingerprinted the run over %d edges",
            sum(g.index_edges()[0].size for g in _period_graphs(graph)),
        )
    finally:
        announcer.stop()
    lr, warmup = effective_lr(config.algorithm, config.data.batch_size)
    options = NodeOptions(
        run_id=run_id,
        lr=lr,
        lr_schedule=config.algorithm.lr_schedule,
        rounds=config.run.rounds,
        warmup_rounds=warmup,
        lr_power=config.algorithm.lr_power,
        local_steps=config.run.local_steps,
        mode=config.transport.mode,
        deadline_s=config.transport.deadline_s,
        strict_timeout_s=config.transport.strict_timeout_s,
        round_window=round_drift(config),
    )
    # Models with their own randomness (dropout) draw from torch's global generator; seed it
    # so a run replays exactly.
    torch.manual_seed(seed)
    setup = RunSetup(
        config=config,
        dataset=dataset,
        trust=trust,
        graph=graph,
        algorithm=algorithm,
        parts=parts,
        start=evaluator.initial_params(),
        run_id=run_id,
        options=options,
        evaluator=evaluator,
        faults=(
            FaultPlan(config.faults, run_seed=seed, nodes=graph.nodes)
            if config.faults.active
            else None
        ),
        source=source,
    )
    logger.info("prepared %d nodes in %.2f s", len(graph.nodes), time.perf_counter() - laps.began)
    return setup


def build_network(
    config: Config,
    *,
    record: bool = False,
    observer: Callable[[Node, RoundRecord], None] | None = None,
    algorithm: Algorithm | None = None,
    trust: Topology | None = None,
    dataset: Dataset | None = None,
    share_decoded: bool = True,
    setup: RunSetup | None = None,
) -> Network:
    """Build every node of ``config`` on an in-process network.

    Args:
        config: The experiment.
        record: Keep every delivered message in ``network.transport.messages``.
        observer: Called with ``(node, record)`` after every node's round.
        algorithm: Use this algorithm object instead of ``config.algorithm.name``.
        trust: Use this trust graph instead of ``config.topology``.
        dataset: Use this dataset instead of ``config.data.dataset``.
        share_decoded: Decode each sent payload once for all its receivers
            (:class:`~fedcore.node.DecodeCache`); results are identical either way.
        setup: Use this :func:`prepare_run` result of ``config`` (then ``algorithm``,
            ``trust`` and ``dataset`` are ignored).

    Raises:
        ConfigError, TopologyError, DataError: on anything invalid.
    """
    if setup is None:
        setup = prepare_run(config, algorithm=algorithm, trust=trust, dataset=dataset)
    _check_network_memory(config, setup)
    net = InProcessNetwork(record=record)
    cache = DecodeCache() if share_decoded else None
    built = {
        node_id: setup.make_node(
            node_id, net.endpoint(node_id), observer=observer, decode_cache=cache
        )
        for node_id in setup.graph.nodes
    }
    return Network(
        config=config,
        dataset=setup.dataset,
        trust=setup.trust,
        graph=setup.graph,
        algorithm=setup.algorithm,
        transport=net,
        nodes=built,
        run_id=setup.run_id,
        evaluator=setup.evaluator,
        setup=setup,
    )
