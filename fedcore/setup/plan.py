"""The run plan: what a config makes of its trust graph, before any data or model exists.

:func:`plan_run` resolves the algorithm, checks what the config's tables cannot do
together, builds the trust graph and the weighted graph the algorithm communicates over,
and fingerprints the run (:class:`RunPlan`). It loads no dataset and builds no model, so
the deployment writers (``fedcore compose``, ``--swarm``, ``fedcore k8s``) need nothing
else; :func:`~fedcore.setup.prepare.prepare_run` adds the data and the model on top.

What can be checked from the counts alone is checked before the graph is built (which
takes seconds at a million nodes): the combinations, a mixing over every pair of nodes,
the server of the server family, and a lower bound of the memory. A small graph (at most
:data:`EARLY_GRAPH_EDGES` edges, a fraction of a second) is built, weighted and checked
with these cheap checks (:func:`weigh_early`), so that a graph that does not suit the
algorithm is refused before any data is loaded or model built; so is what ``simulate``'s
engine cannot run, as far as the config tells
(:func:`~fedcore.setup.engine_checks.check_engine`). Each step is logged (INFO) with its
time.

Each step reads only its part of the config: the tables it needs (``[topology]`` for the
node count and the memory bound, ``[optimizer]`` for the node optimizer), or where it reads
several, one frozen dataclass of them named for the step (:class:`AlgorithmInputs`,
:class:`CombinationInputs`, :class:`~fedcore.setup.engine_checks.EngineInputs`,
:class:`~fedcore.setup.graph.GraphInputs`), made from the config by its ``of``. Only the
entry points take the whole :class:`~fedcore.config.Config` and split it:
:func:`outline_run`, :func:`plan_run`, and :func:`finish_plan`, whose fingerprint covers
the whole config.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from fedcore import registry
from fedcore.adversary import Attacked, attacked, byzantine
from fedcore.algorithms import Algorithm, algorithm_factory, make_algorithm
from fedcore.algorithms.base import with_traits
from fedcore.algorithms.optim import Optimizer, make_optimizer
from fedcore.algorithms.server import FedAvgRule
from fedcore.config import (
    AdversaryConfig,
    AlgorithmConfig,
    CompressionConfig,
    Config,
    DataConfig,
    FaultsConfig,
    OptimizerConfig,
    TopologyConfig,
    TransportConfig,
    fingerprint_json,
)
from fedcore.errors import ConfigError, TopologyError
from fedcore.faults import FaultPlan
from fedcore.runtime import physical_memory
from fedcore.setup.graph import (
    GraphInputs,
    build_topology,
    check_graph,
    communication_graph,
    estimated_edges,
    period_graphs,
    with_rounds,
)
from fedcore.topology import Topology
from fedcore.topology.digest import edges_json
from fedcore.topology.weights import check_mixing_size

logger = logging.getLogger(__name__)

__all__ = [
    "COPIES",
    "EARLY_GRAPH_EDGES",
    "LOSSY_SPARSE",
    "AlgorithmInputs",
    "CombinationInputs",
    "Laps",
    "ModelSize",
    "Outline",
    "RunPlan",
    "Shape",
    "algorithm_options",
    "check_combinations",
    "configured_algorithm",
    "finish_plan",
    "node_optimizer",
    "outline_run",
    "plan_run",
    "planned_nodes",
    "read_trust",
    "resolve_algorithm",
    "round_drift",
    "run_shape",
    "size_text",
    "weigh_early",
]

LOSSY_SPARSE = registry.CODECS.tagged("relative")
"""Codecs whose error scales with the values sent (no use on growing running sums)."""

COPIES = 4
"""Model-sized float buffers a simulated node holds at least: its module's parameters and
their gradients, its algorithm state and a message."""

EDGE_BYTES = 100
"""Bytes an edge of a weighted graph costs at least while it is built: index and weight
arrays of the trust and the weighted graph, and the engine's tables (a few hundred
measured; a graph was about 1,100 bytes an edge while it was built of networkx objects)."""

EARLY_GRAPH_EDGES = 200_000
"""A graph of at most this many edges (estimated from the counts, self-loops included) is
built, weighted and checked before the data and the model (:func:`weigh_early`): well
under a second and some 20 MB, and a graph that does not suit the algorithm is refused
before any slow step. A larger one is built after the model, once the memory bound that
counts every node's model has passed (building it takes seconds at a million nodes)."""


def round_drift(transport: TransportConfig, faults: FaultsConfig, rounds: int) -> int:
    """Rounds a sender may run ahead of a receiver beyond strict lock-step, in a run of
    ``rounds`` (``run.rounds``).

    None in strict mode without faults. In deadline mode, or with a fault plan (a node does
    not wait for a message the plan lost), ``transport.round_window``; plus the length of
    every partition and crash window, in which the nodes cut off run on without waiting.
    """
    if transport.mode != "deadline" and not faults.active:
        return 0
    drift: int = transport.round_window
    drift += sum(max(0, min(p.end, rounds) - p.start) for p in faults.partitions)
    drift += sum(max(0, (c.back if c.back >= 0 else rounds) - c.at) for c in faults.crashes)
    return drift


@dataclass(frozen=True, slots=True)
class AlgorithmInputs:
    """What making the configured algorithm reads of a config (:meth:`of`).

    Attributes:
        algorithm: ``[algorithm]``: its name and options.
        server: ``topology.server``, for an algorithm of the server family.
        seed: ``run.seed``, for the server family's seeded choices.
        adversary: ``[adversary]``: the peers that lie, and how.
    """

    algorithm: AlgorithmConfig
    server: str
    seed: int
    adversary: AdversaryConfig = dataclasses.field(default_factory=AdversaryConfig)

    @classmethod
    def of(cls, config: Config) -> AlgorithmInputs:
        """The algorithm's part of ``config``."""
        return cls(config.algorithm, config.topology.server, config.run.seed, config.adversary)


def algorithm_options(inputs: AlgorithmInputs) -> dict[str, Any]:
    """The keyword options of ``algorithm.name`` (a registered name or a user's
    ``"pkg.module:factory"``): its ``[algorithm]`` keys, and for an algorithm of the server
    family (one whose factory takes a ``server``) ``server`` (``topology.server``) and
    ``seed`` (``run.seed``).

    Raises:
        ConfigError: an unknown name or an import path that does not load.
    """
    options = dict(inputs.algorithm.options)
    factory = algorithm_factory(inputs.algorithm.name)
    try:
        takes: Collection[str] = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read: no server options
        takes = ()
    if "server" in takes:
        options.setdefault("server", inputs.server)
        if "seed" in takes:  # the server family's seeded choices (FedAvg's sample)
            options.setdefault("seed", inputs.seed)
    return options


def configured_algorithm(inputs: AlgorithmInputs) -> Any:
    """The algorithm of ``[algorithm]``: ``name`` (registered, or ``"pkg.module:factory"``)
    built with :func:`algorithm_options`.

    Raises:
        ConfigError: an unknown name, an import path that does not load or builds no
            algorithm, or an option it does not take.
    """
    return make_algorithm(inputs.algorithm.name, **algorithm_options(inputs))


def node_optimizer(
    opt: OptimizerConfig, segments: list[tuple[str, int, int]] | None = None
) -> Optimizer | None:
    """The optimizer ``[optimizer]`` (``opt``) names, per layer over ``segments``; ``None``
    for plain SGD without weight decay, which the algorithms apply themselves (bit for bit
    the step of a run without an ``[optimizer]`` table).

    Raises:
        ConfigError: an option the optimizer does not take.
    """
    if opt.name == "sgd" and not opt.weight_decay:
        make_optimizer(opt.name, **opt.options())  # refuse keys plain SGD does not take
        return None
    return make_optimizer(opt.name, segments=segments, **opt.options())


@dataclass(frozen=True, slots=True)
class CombinationInputs:
    """What :func:`check_combinations` reads of a config (:meth:`of`): the tables whose
    settings an algorithm, or each other, cannot take together.

    Attributes:
        optimizer: ``[optimizer]``.
        faults: ``[faults]``.
        transport: ``[transport]`` (its mode).
        compression: ``[compression]`` (its codec).
        algorithm_name: ``algorithm.name`` as configured, which a refusal names.
    """

    optimizer: OptimizerConfig
    faults: FaultsConfig
    transport: TransportConfig
    compression: CompressionConfig
    algorithm_name: str

    @classmethod
    def of(cls, config: Config) -> CombinationInputs:
        """The combination checks' part of ``config``."""
        return cls(
            config.optimizer,
            config.faults,
            config.transport,
            config.compression,
            config.algorithm.name,
        )


def check_combinations(inputs: CombinationInputs, algorithm: Algorithm) -> None:
    """Refuse what the config's tables cannot do together (cheap: no graph, no data)."""
    optimizer = node_optimizer(inputs.optimizer)
    if algorithm.is_optimizer and optimizer is not None:
        raise ConfigError(
            f"algorithm {algorithm.name!r} is itself the optimizer (Adam, then momentum on the "
            f"frozen second moment); optimizer.name = {inputs.optimizer.name!r} would stand in "
            "for its gradient. Leave [optimizer] at plain SGD."
        )
    f = inputs.faults
    if f.active and not f.announce and inputs.transport.mode == "strict":
        raise ConfigError(
            "faults.announce = false makes lost messages vanish: strict mode would wait for "
            "them until transport.strict_timeout_s. Set transport.mode = 'deadline'."
        )
    if algorithm.needs_every_message and (f.drop or f.edge_drop or f.partitions or f.crashes):
        raise ConfigError(
            f"algorithm {algorithm.name!r} needs every message: a lost one leaves the "
            "receiver's copy of the sender's public model behind for good. Remove the [faults] "
            "losses, or use 'deepsqueeze' or 'dpsgd', which mix what arrives."
        )
    codec = inputs.compression.codec
    relative = codec in registry.CODECS and "relative" in registry.CODECS.entry(codec).tags
    if algorithm.robust and relative:  # LOSSY_SPARSE, or a plug-in that says so
        raise ConfigError(
            f"algorithm {inputs.algorithm_name!r} with robust = true sends running totals that "
            f"grow without bound; codec {inputs.compression.codec!r} has an error relative to "
            "them. Use compression.codec = 'fp32', 'bf16' or 'raw'."
        )


def resolve_algorithm(inputs: AlgorithmInputs, algorithm: Any = None) -> Any:
    """``algorithm``, or the one ``[algorithm]`` names: a rule (each engine runs it through
    its own adapter) or an object of the per-message protocol."""
    if algorithm is None:
        algorithm = configured_algorithm(inputs)
    return attacked(with_traits(algorithm), inputs.adversary, inputs.seed)


def planned_nodes(topology: TopologyConfig) -> int | None:
    """How many nodes ``[topology]`` makes (a star's server included); ``None`` for a
    graph file, whose size is known only once it is read."""
    if topology.file:
        return None
    return topology.nodes + ("server" in registry.TOPOLOGY_KINDS.entry(topology.kind).tags)


def read_trust(
    topology: TopologyConfig, trust: Topology | None, laps: Laps | None = None
) -> Topology | None:
    """``trust``, or the graph file of ``[topology]`` read now (its size is known only
    once it is read); ``None`` for a generated graph, built later by :func:`plan_run`."""
    if trust is None and topology.file:
        trust = build_topology(topology)
        if laps is not None:
            laps.done("read the graph %s: %d nodes", trust.name, len(trust.nodes))
    return trust


@dataclass(frozen=True, slots=True)
class Shape:
    """How many nodes a run has, and where the server family's server sits among them.

    Attributes:
        nodes: Every node, a server included.
        server_at: The server's index in graph order; ``None`` without a server.
    """

    nodes: int
    server_at: int | None

    @property
    def holders(self) -> int:
        """The nodes that hold data (all but a server)."""
        return self.nodes - (self.server_at is not None)


def run_shape(
    topology: TopologyConfig, data: DataConfig, algorithm: Algorithm, trust: Topology | None
) -> Shape:
    """The run's :class:`Shape`, checking the server family's server (against
    ``[topology]``'s kind and ``data.stream``) and the size of a mixing over every pair of
    nodes (from the counts: ``trust`` may be unbuilt)."""
    n = len(trust.nodes) if trust is not None else planned_nodes(topology)
    assert n is not None  # a graph file is read before (read_trust)
    server = algorithm.server
    server_at = None
    if server is not None:
        if trust is not None and server not in trust.nodes:
            raise TopologyError(
                f"topology.server = {server!r} is not a node of the graph {trust.name!r}."
            )
        if trust is None and "server" not in registry.TOPOLOGY_KINDS.entry(topology.kind).tags:
            raise ConfigError(
                f"algorithm {algorithm.name!r} runs on a star: set topology.kind = 'star' "
                "(or a graph file with its server named by topology.server)."
            )
        server_at = trust.nodes.index(server) if trust is not None else n - 1
        rule = algorithm.rule if isinstance(algorithm, Attacked) else algorithm
        if isinstance(rule, FedAvgRule):  # its aggregator's f against the cohort
            rule.check_workers(n - 1)
        if data.stream:
            raise ConfigError(
                f"algorithm {algorithm.name!r} has a server that holds no data, but "
                f"data.stream {data.stream!r} gives every node a stream of its own. "
                "Use a dataset (data.stream = '')."
            )
    check_mixing_size(n, mixing=algorithm.mixing, algorithm=algorithm.name)
    return Shape(nodes=n, server_at=server_at)


@dataclass(frozen=True, slots=True)
class ModelSize:
    """A model's parameter count and the bytes of one parameter (for the memory bound)."""

    params: int
    itemsize: int


def check_run_memory(
    topology: TopologyConfig,
    algorithm: Algorithm,
    shape: Shape,
    trust: Topology | None,
    model: ModelSize | None,
) -> None:
    """Refuse, before the graph is built, a run whose least memory is clearly more than
    this machine has (``[topology]`` estimates the edges of a graph not built yet).

    The estimate is a lower bound: the weighted edges (``EDGE_BYTES`` each), and with a
    ``model`` (this machine holds every node's: ``simulate``, ``launch``) every node's
    model (``COPIES`` buffers each; a robust rule also keeps ``edge_totals`` float64
    totals an edge, two unless it says more: robust Push-DIGing's four). The engines
    check their own, larger, needs afterwards.
    """
    memory = physical_memory()
    if memory is None:
        return
    n = shape.nodes
    if trust is None:
        edges = estimated_edges(topology, n)
    else:  # self-loops included, as the weights will have them
        edges = sum(g.index_edges()[0].size + len(g.nodes) for g in period_graphs(trust))
    if algorithm.mixing in ("complete", "all-pairs"):
        edges = max(edges, n * n)
    graph = edges * EDGE_BYTES
    models = 0
    if model is not None:
        models = n * model.params * model.itemsize * COPIES
        if algorithm.robust:  # its model-sized float64 totals a graph edge (sent, seen)
            models += getattr(algorithm, "edge_totals", 2) * edges * model.params * 8
    need = graph + models
    if need <= memory:
        return
    parts = [f"about {edges:,} graph edges ({size_text(graph)})"]
    if model is not None:
        parts.append(
            f"{n:,} models of {model.params:,} parameters x {COPIES} copies ({size_text(models)})"
        )
    periodic = not topology.file and "period" in registry.TOPOLOGY_KINDS.entry(topology.kind).keys
    raise ConfigError(
        f"this run needs at least {size_text(need)} of memory ({' and '.join(parts)}), more "
        f"than this machine's {size_text(memory)}. Use fewer nodes (topology.nodes), "
        + ("a shorter topology.period (the schedule repeats after it), " if periodic else "")
        + "a sparser graph or a smaller model."
    )


def size_text(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that leaves at least 1 (``1.5 GiB``)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


class Laps:
    """Logs each step of a run's set-up with the seconds it took."""

    def __init__(self) -> None:
        self.began = self._last = time.perf_counter()

    def done(self, what: str, *args: object) -> None:
        now = time.perf_counter()
        logger.info(what + " (%.2f s)", *args, now - self._last)
        self._last = now


@dataclass(slots=True)
class RunPlan:
    """What a config makes of its graph: the same on every peer, with no data or model.

    Attributes:
        config: The experiment.
        algorithm: The algorithm.
        trust: The trust graph as configured.
        graph: The weighted graph the algorithm communicates over.
        shape: Node count and the server's place.
        run_id: The run fingerprint (the config and every weighted edge).
        faults: The fault plan of ``[faults]``, or ``None``.
    """

    config: Config
    algorithm: Algorithm
    trust: Topology
    graph: Topology
    shape: Shape
    run_id: str
    faults: FaultPlan | None


@dataclass(frozen=True, slots=True)
class Outline:
    """What the cheap checks settle, before any data, model or graph.

    Attributes:
        algorithm: The algorithm (a bare rule wrapped to run on one peer per node).
        trust: The trust graph if it was given or read from a file (or built early);
            ``None`` for a generated one, which :func:`finish_plan` builds.
        shape: Node count and the server's place.
        graph: The weighted graph, built and checked early (:func:`weigh_early`), or
            ``None``: :func:`finish_plan` builds it.
    """

    algorithm: Algorithm
    trust: Topology | None
    shape: Shape
    graph: Topology | None = None


def outline_run(
    config: Config,
    *,
    algorithm: Algorithm | None = None,
    trust: Topology | None = None,
    laps: Laps | None = None,
) -> Outline:
    """The checks that need no graph, data or model: the algorithm, what the config's
    tables cannot do together, a graph file's size, a server's place and the size of a
    mixing over every pair of nodes.

    Raises:
        ConfigError, TopologyError: on anything invalid.
    """
    algorithm = resolve_algorithm(AlgorithmInputs.of(config), algorithm)
    check_combinations(CombinationInputs.of(config), algorithm)
    trust = read_trust(config.topology, trust, laps)
    return Outline(algorithm, trust, run_shape(config.topology, config.data, algorithm, trust))


def plan_run(
    config: Config,
    *,
    algorithm: Algorithm | None = None,
    trust: Topology | None = None,
    model: ModelSize | None = None,
) -> RunPlan:
    """The :class:`RunPlan` of ``config``: checks, graph, weights and fingerprint.

    Args:
        config: The experiment.
        algorithm: Use this algorithm object instead of ``config.algorithm.name``.
        trust: Use this trust graph instead of ``config.topology``.
        model: The size of the model, when this machine will hold every node's
            (``simulate``, ``launch``): the memory bound counts them. ``None`` (a peer, a
            deployment writer): the graph only.

    Raises:
        ConfigError, TopologyError: on anything invalid, before the graph is built where
            the counts tell.
    """
    laps = Laps()
    outline = outline_run(config, algorithm=algorithm, trust=trust, laps=laps)
    return finish_plan(config, outline, model, laps)


def finish_plan(
    config: Config, outline: Outline, model: ModelSize | None = None, laps: Laps | None = None
) -> RunPlan:
    """The plan on top of ``outline``: the memory bound (with ``model``: every node's
    model too), the graph, its weights, their checks, the fingerprint and the fault plan.

    Raises:
        ConfigError, TopologyError: on anything invalid, before the graph is built where
            the counts tell.
    """
    laps = laps or Laps()
    algorithm, trust, shape = outline.algorithm, outline.trust, outline.shape
    check_run_memory(
        with_rounds(config.topology, config.run.rounds), algorithm, shape, trust, model
    )
    if outline.graph is not None:
        assert trust is not None
        graph = outline.graph
    else:
        trust, graph = _weighted_graph(GraphInputs.of(config), outline, laps)
    run_id = fingerprint_json(config, edges_json(graph))
    edges = sum(g.index_edges()[0].size for g in period_graphs(graph))
    laps.done("fingerprinted the run over %d edges", edges)
    faults = None
    if config.faults.active:
        faults = FaultPlan(config.faults, run_seed=config.run.seed, nodes=graph.nodes)
    byzantine(config.adversary, config.run.seed, graph.nodes, algorithm.server)  # names known
    return RunPlan(config, algorithm, trust, graph, shape, run_id, faults)


def weigh_early(inputs: GraphInputs, outline: Outline, laps: Laps | None = None) -> Outline:
    """``outline`` with its graph built, weighted and checked now where it is small (at
    most :data:`EARLY_GRAPH_EDGES` edges): a graph that does not suit the algorithm, a
    schedule for an algorithm of one fixed graph or a dropped edge that is no edge is then
    refused before the data and the model. A larger graph is left to :func:`finish_plan`.

    Raises:
        ConfigError, TopologyError: such a graph.
    """
    if outline.graph is not None:
        return outline
    n, trust = outline.shape.nodes, outline.trust
    if trust is None:
        edges = estimated_edges(inputs.topology, n)
    else:
        edges = sum(g.index_edges()[0].size + len(g.nodes) for g in period_graphs(trust))
    if outline.algorithm.mixing in ("complete", "all-pairs"):
        edges = max(edges, n * n)
    if edges > EARLY_GRAPH_EDGES:
        return outline
    trust, graph = _weighted_graph(inputs, outline, laps or Laps())
    return dataclasses.replace(outline, trust=trust, graph=graph)


def _weighted_graph(inputs: GraphInputs, outline: Outline, laps: Laps) -> tuple[Topology, Topology]:
    """The trust graph of ``outline`` (built now if it is not yet) and the weighted graph
    its algorithm communicates over, checked (:func:`~fedcore.setup.graph.check_graph`)."""
    algorithm, trust = outline.algorithm, outline.trust
    if trust is None:
        trust = build_topology(inputs.topology)
        laps.done("built the graph %s: %d nodes", trust.name, len(trust.nodes))
    graph = communication_graph(algorithm, trust)
    laps.done("weighted the graph for %s (%s mixing)", algorithm.name, algorithm.mixing)
    check_graph(inputs, algorithm, trust, graph, outline.shape.nodes)
    return trust, graph
