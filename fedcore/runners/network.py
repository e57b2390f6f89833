"""Build a whole in-process network from a config: data, models, graph, nodes.

:func:`build_network` is shared by ``fedcore simulate`` and by the public test harness
:mod:`fedcore.testing`, so users' tests run exactly the code path of a simulation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore import topology
from fedcore.algorithms import Algorithm, make_algorithm
from fedcore.compression import make_codec
from fedcore.config import Config, TopologyConfig, fingerprint
from fedcore.data import BatchStream, Dataset, load_dataset, partition
from fedcore.errors import ConfigError, DataError
from fedcore.ids import error_text
from fedcore.models import Objective, build_model, physical_memory
from fedcore.node import DecodeCache, Node, NodeOptions, RoundRecord
from fedcore.streams import Batches, OnlineSource, load_source
from fedcore.topology import Topology
from fedcore.transport import InProcessNetwork, Transport
from fedcore.transport.faults import FaultPlan, FaultyTransport

LOSSY_SPARSE = ("qsgd", "sign", "topk", "randk")
"""Codecs whose error scales with the values sent (no use on growing running sums)."""

__all__ = [
    "Network",
    "RunSetup",
    "build_network",
    "build_topology",
    "communication_graph",
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
    return topology.prepare(trust, mixing=algorithm.mixing, algorithm=algorithm.name)


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


def make_objective(config: Config, dataset: Dataset) -> Objective:
    """The configured model, initialized from ``run.seed``, as a flat-parameter objective."""
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
    return Objective(module, _DTYPES[config.model.dtype])


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
        """A fresh model (same initialization on every call) as a flat-parameter objective."""
        return make_objective(self.config, self.dataset)

    def stream(self, i: int) -> Batches:
        """A fresh stream of the node at graph index ``i`` (the same batches every time)."""
        if self.source is not None:
            return self.source.stream(i)
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

        With a ``[faults]`` plan, ``transport`` is wrapped in a :class:`FaultyTransport`.
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
            codec=make_codec(
                self.config.compression.codec,
                bits=self.config.compression.bits,
                ratio=self.config.compression.ratio,
                chunk=self.config.compression.chunk,
                scaled=self.config.compression.scaled,
                seed=self.config.run.seed * 1_000_003 + i + 7919,
            ),
            observer=observer,
            decode_cache=decode_cache,
        )


def prepare_run(
    config: Config,
    *,
    algorithm: Algorithm | None = None,
    trust: Topology | None = None,
    dataset: Dataset | None = None,
) -> RunSetup:
    """Validate ``config`` and derive what every peer shares (see :class:`RunSetup`).

    Raises:
        ConfigError, TopologyError, DataError: on anything invalid, before any work.
    """
    seed = config.run.seed
    trust = trust if trust is not None else build_topology(config.topology)
    if algorithm is None:
        algorithm = make_algorithm(config.algorithm.name, **config.algorithm.options)
    graph = communication_graph(algorithm, trust)
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
    edges_used = {e for t in range(graph.period) for e in graph.at(t).edges()}
    for text in f.edge_drop:
        sender, _, receiver = (part.strip() for part in text.partition("->"))
        known = sender in graph.nodes and receiver in graph.nodes  # else the plan says so
        if known and (sender, receiver) not in edges_used:
            raise ConfigError(
                f"faults.edge_drop names {text!r}, but {sender} sends {receiver} nothing: it is "
                f"not an edge of the graph {config.algorithm.name!r} communicates over. Name "
                "an edge of the graph (fedcore topology show prints them)."
            )
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
            nodes=len(graph.nodes),
            rounds=config.run.rounds,
            batch_size=data.batch_size,
            seed=seed,
            options=stream_options,
        )
        dataset = source.dataset
    elif dataset is None:
        dataset = load_dataset(
            config.data.dataset, seed=seed, test_fraction=config.data.test_fraction
        )
    parts = (
        [np.zeros(0, dtype=np.int64) for _ in graph.nodes]  # streams hold their own data
        if source is not None
        else partition(
            dataset.y_train,
            len(graph.nodes),
            config.data.partition,
            seed=seed,
            alpha=config.data.alpha,
            shards_per_node=config.data.shards_per_node,
        )
    )
    edges = [
        (u, v, graph.at(t).weight(u, v))
        for t in range(graph.period)
        for u, v in graph.at(t).edges()
    ]
    run_id = fingerprint(config, edges)
    options = NodeOptions(
        run_id=run_id,
        lr=config.algorithm.lr,
        lr_schedule=config.algorithm.lr_schedule,
        mode=config.transport.mode,
        deadline_s=config.transport.deadline_s,
        strict_timeout_s=config.transport.strict_timeout_s,
        round_window=round_drift(config),
    )
    evaluator = make_objective(config, dataset)
    _probe(evaluator, dataset, config.model.name)
    # Models with their own randomness (dropout) draw from torch's global generator; seed it
    # so a run replays exactly.
    torch.manual_seed(seed)
    return RunSetup(
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
