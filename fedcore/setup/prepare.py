"""A run's set-up: its plan (:mod:`~fedcore.setup.plan`) with its data and model
(:mod:`~fedcore.setup.training`), as every peer derives it from the config.

:func:`prepare_run` takes the steps in the order that refuses a bad config soonest: the
cheap checks (with ``simulate``'s engine, and a built-in dataset's size against the node
count), a small graph with its weights and their checks (:func:`~fedcore.setup.plan.weigh_early`),
the data split, the model (probed on two examples), then a large graph, its weights, and
the fingerprint. So a config refused for what it says is refused before any data is
loaded, and before any warning of the later steps. It has no side effect on the
process: the caller seeds torch's global generator (:func:`seed_torch`) and shows
progress where it wants them.

:func:`prepare_run` takes the whole config and splits it: each step is given only its
part (the tables it reads, or a frozen dataclass of them, such as :class:`NodeInputs`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from fedcore.adversary import Attacked, byzantine
from fedcore.adversary.poison import flip_labels
from fedcore.algorithms import Algorithm
from fedcore.algorithms.asynchronous import example_shares, is_asynchronous
from fedcore.algorithms.optim import Optimizer
from fedcore.algorithms.server import FedAvgRule, cohort_size
from fedcore.compression import Codec, codec_seed, configured_codec
from fedcore.config import (
    AlgorithmConfig,
    Config,
    DataConfig,
    FaultsConfig,
    RunConfig,
    TransportConfig,
    effective_lr,
)
from fedcore.data import (
    BatchStream,
    Dataset,
    NoData,
    check_partition_size,
    training_examples,
)
from fedcore.errors import ConfigError
from fedcore.faults import FaultPlan
from fedcore.metrics import check_eval_peers
from fedcore.models import Objective
from fedcore.node import DecodeCache, Node, NodeOptions, RoundRecord, per_node
from fedcore.node.arrivals import VirtualClock
from fedcore.node.asynchronous import AsyncPeer
from fedcore.node.pace import Pace
from fedcore.privacy.dpfedavg import private_fedavg
from fedcore.privacy.plan import PrivacyPlan, plan_privacy
from fedcore.setup.engine_checks import EngineInputs, check_engine
from fedcore.setup.graph import GraphInputs
from fedcore.setup.plan import (
    Laps,
    Shape,
    finish_plan,
    node_optimizer,
    outline_run,
    round_drift,
    weigh_early,
)
from fedcore.setup.training import (
    TrainingInputs,
    build_evaluator,
    load_training_data,
    make_objective,
    model_size,
)
from fedcore.streams import Batches, OnlineSource
from fedcore.timing import TimeModel
from fedcore.topology import Topology
from fedcore.transport import Transport
from fedcore.transport.base import AsyncTransport
from fedcore.transport.faults import FaultyTransport
from fedcore.transport.paced import PacedTransport

logger = logging.getLogger(__name__)

__all__ = ["NodeInputs", "RunSetup", "node_options", "prepare_run", "seed_torch"]


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
    test_parts: list[Any] | None = None
    clock: VirtualClock | None = field(default=None, repr=False)
    """A simulation's virtual clock (:func:`~fedcore.engines.clock.virtual_clock`), which
    :meth:`make_node` gives every node; None on a gRPC peer and without ``[time]``."""
    node_algorithm: Algorithm | None = field(default=None, repr=False)
    """What every node of this process runs of :attr:`algorithm` (:meth:`node_form`), once
    made."""
    timing: TimeModel | None = field(default=None, repr=False)
    """The durations of ``[time]`` (:meth:`time_model`), once made."""
    shared_objective: Objective | None = field(default=None, repr=False)
    """The objective the nodes of this process share (:meth:`node_objective`), once made."""
    privacy: PrivacyPlan | None = field(default=None, repr=False)
    """A private run's plan (``[privacy]``; :func:`~fedcore.privacy.plan.plan_privacy`)."""

    def own_tests(self) -> dict[str, Any] | None:
        """Each worker's own test example indices by node id (a ``natural`` partition with
        per-node test sets; :class:`~fedcore.setup.training.TrainingData`), else ``None``."""
        if self.test_parts is None:
            return None
        return {n: self.test_parts[i] for i, n in enumerate(self.graph.nodes)}

    def objective(self) -> Objective:
        """A fresh model (same initialization on every call) as a flat-parameter objective,
        computing its gradients as the run decided (:attr:`evaluator`'s mode)."""
        config = self.config
        return make_objective(config.model, config.run.seed, self.dataset, self.evaluator.rows.mode)

    def node_objective(self) -> Objective:
        """A node's objective: one shared by every node this set-up makes where the model
        holds no state of its own (no buffers: BatchNorm's running statistics are a
        node's), else a fresh one (:meth:`objective`). Nodes run their rounds one at a
        time and every call loads the parameters it is given (the row path never reads the
        module's), so a shared model computes each node's bits; a large model's module
        parameters and gradients are then one copy a process, not two a peer."""
        shared = self.shared_objective
        if shared is not None:
            return shared
        objective = self.objective()
        if next(objective.module.buffers(), None) is None:
            self.shared_objective = objective
        return objective

    @property
    def layers(self) -> tuple[int, ...]:
        """The model's layer sizes, in the flat parameters' order (for APS's shifts)."""
        return tuple(numel for _, _, numel in self.evaluator.segments)

    def optimizer(self) -> Optimizer | None:
        """The node optimizer of ``[optimizer]`` over the model's layers, or ``None`` for
        plain SGD without weight decay (every algorithm's own ``lr * g`` step)."""
        return node_optimizer(self.config.optimizer, self.evaluator.segments)

    def stream(self, i: int) -> Batches:
        """A fresh stream of the node at graph index ``i`` (the same batches every time)."""
        if self.source is not None:
            return self.source.stream(i)
        if self.graph.nodes[i] == self.algorithm.server:
            return NoData()
        idx = torch.as_tensor(self.parts[i])
        return BatchStream(
            self.dataset.x_train[idx],
            self.dataset.y_train[idx],
            batch_size=self.config.data.batch_size,
            seed=self.config.run.seed * 1_000_003 + i,
            order=self.config.data.order,
        )

    def node_form(self) -> Algorithm:
        """What every node of this process runs of :attr:`algorithm`: a rule through one
        :class:`~fedcore.node.rule.NodeRule` (:func:`~fedcore.node.rule.per_node`), made
        once; a per-message algorithm as it is."""
        if self.node_algorithm is None:
            self.node_algorithm = per_node(self.algorithm)
        return self.node_algorithm

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
        transport, pace = self._wrap(node_id, transport)
        i = self.graph.index(node_id)
        return Node(
            node_id,
            algorithm=self.node_form(),
            graph=self.graph,
            objective=self.node_objective(),
            stream=self.stream(i),
            transport=transport,
            options=self.options,
            params=self.start,
            codec=self._codec(i),
            optimizer=self.optimizer(),
            observer=observer,
            decode_cache=decode_cache,
            faults=self.faults,
            clock=self.clock,
            pace=pace,
            privacy=None if self.privacy is None else self.privacy.dpsgd(),
        )

    def make_async_peer(
        self,
        node_id: str,
        transport: AsyncTransport,
        *,
        observer: Callable[[Any, RoundRecord], None] | None = None,
    ) -> AsyncPeer:
        """The asynchronous peer ``node_id`` (an asynchronous algorithm's real peer; see
        :mod:`fedcore.node.asynchronous`), its transport wrapped as :meth:`make_node`'s."""
        wrapped, pace = self._wrap(node_id, transport)
        i = self.graph.index(node_id)
        server = self.algorithm.server
        workers = torch.tensor([v != server for v in self.graph.nodes])
        shares = example_shares(self.parts, workers).tolist()
        return AsyncPeer(
            node_id,
            algorithm=self.algorithm,
            graph=self.graph,
            objective=self.node_objective(),
            stream=self.stream(i),
            transport=wrapped,  # type: ignore[arg-type]
            options=self.options,
            params=self.start,
            codec=self._codec(i),
            shares={v: x for v, x in zip(self.graph.nodes, shares, strict=True) if v != server},
            pace=pace,
            observer=observer,
        )

    def _wrap(self, node_id: str, transport: Transport) -> tuple[Transport, Pace | None]:
        """``transport`` wrapped in the fault plan's losses (its delays waited out unless a
        virtual clock counts them) and, on a real peer with ``[time]``, its links' times;
        and the peer's pace (``[time]`` as real sleeps), if any."""
        if self.faults is not None:
            transport = FaultyTransport(transport, self.faults, delays=self.clock is None)
        if not self.config.time.active or self.clock is not None:
            return transport, None
        model = self.time_model()  # a real peer: real sleeps
        pace = Pace(model, node_id, steps=self.config.run.local_steps)
        return PacedTransport(transport, model), pace

    def _codec(self, i: int) -> Codec:
        """The codec of the node at graph index ``i`` (its own seed)."""
        return configured_codec(
            self.config.compression, seed=codec_seed(self.config.run.seed, i), layers=self.layers
        )

    def time_model(self) -> TimeModel:
        """The run's :class:`~fedcore.timing.TimeModel` (one a set-up: traces read once)."""
        if self.timing is None:
            config = self.config
            self.timing = TimeModel(config.time, run_seed=config.run.seed, nodes=self.graph.nodes)
        return self.timing


@dataclass(frozen=True, slots=True)
class NodeInputs:
    """What :func:`node_options` reads of a config (:meth:`of`).

    Attributes:
        algorithm: ``[algorithm]``: the step size and its schedule.
        run: ``[run]``: the rounds and local steps.
        transport: ``[transport]``: the waiting mode and its times.
        faults: ``[faults]``, whose windows let a sender run ahead.
        batch_size: ``data.batch_size``, which a scaled step size follows.
    """

    algorithm: AlgorithmConfig
    run: RunConfig
    transport: TransportConfig
    faults: FaultsConfig
    batch_size: int

    @classmethod
    def of(cls, config: Config) -> NodeInputs:
        """The node options' part of ``config``."""
        return cls(
            config.algorithm, config.run, config.transport, config.faults, config.data.batch_size
        )


def node_options(inputs: NodeInputs, run_id: str) -> NodeOptions:
    """What every node of the run ``run_id`` is told of the run: its step sizes, rounds
    and waiting mode."""
    algorithm, run, transport = inputs.algorithm, inputs.run, inputs.transport
    lr, warmup = effective_lr(algorithm, inputs.batch_size)
    return NodeOptions(
        run_id=run_id,
        lr=lr,
        lr_schedule=algorithm.lr_schedule,
        rounds=run.rounds,
        warmup_rounds=warmup,
        lr_power=algorithm.lr_power,
        local_steps=run.local_steps,
        mode=transport.mode,
        deadline_s=transport.deadline_s,
        strict_timeout_s=transport.strict_timeout_s,
        round_window=round_drift(transport, inputs.faults, run.rounds),
    )


def seed_torch(config: Config) -> None:
    """Seed torch's global generator with ``run.seed``: models with their own randomness
    (dropout) draw from it, so a run replays exactly. Every caller that runs rounds in
    this process calls it once, after the set-up and before the first round."""
    torch.manual_seed(config.run.seed)


def _check_split_size(data: DataConfig, shape: Shape) -> None:
    """Refuse more data holders than a built-in dataset's training examples can be split
    across, from its known size (no data loaded; a graph not built yet)."""
    if data.stream:
        return
    known = training_examples(data.dataset, test_fraction=data.test_fraction)
    if known is not None:
        check_partition_size(
            known,
            shape.holders,
            data.partition,
            shards_per_node=data.shards_per_node,
            examples_per_node=data.examples_per_node,
        )


def prepare_run(
    config: Config,
    *,
    algorithm: Algorithm | None = None,
    trust: Topology | None = None,
    dataset: Dataset | None = None,
    hosts_all: bool = False,
    simulated: bool = False,
) -> RunSetup:
    """Validate ``config`` and derive what every peer shares (see :class:`RunSetup`).

    Args:
        config: The experiment.
        algorithm: Use this algorithm object instead of ``config.algorithm.name``.
        trust: Use this trust graph instead of ``config.topology``.
        dataset: Use this dataset instead of ``config.data.dataset``.
        hosts_all: This machine will hold every node's model (``simulate``, ``launch``):
            the memory bound counts them. False (a peer, a summary): the graph only.
        simulated: ``simulate`` runs it in this process: ``simulate.engine`` and
            ``simulate.device`` are checked with the cheap checks
            (:func:`~fedcore.setup.engine_checks.check_engine`).

    Raises:
        ConfigError, TopologyError, DataError: on anything invalid, before any work.
    """
    laps = Laps()
    outline = outline_run(config, algorithm=algorithm, trust=trust, laps=laps)
    if simulated:
        check_engine(EngineInputs.of(config), outline.algorithm)
    if outline.algorithm.needs_every_message and config.transport.mode == "deadline":
        # Said once a set-up: no refusal, since every message may well arrive in time.
        logger.warning(
            "algorithm %r needs every message, and transport.mode = 'deadline' loses one "
            "that comes later than transport.deadline_s for good (the receiver's copy of its "
            "sender's public model falls behind); set transport.mode = 'strict' unless every "
            "message arrives in time",
            config.algorithm.name,
        )
    if outline.algorithm.robust and config.compression.codec == "fp16":
        logger.warning(
            "algorithm %r with robust = true sends running totals that grow every round, "
            "and fp16's largest value is 65504: a total past it stops the run as not finite; "
            "compression.codec = 'bf16' is as small on the wire with float32's range",
            config.algorithm.name,
        )
    if dataset is None:
        _check_split_size(config.data, outline.shape)
    outline = weigh_early(GraphInputs.of(config), outline, laps)
    data = load_training_data(TrainingInputs.of(config), outline.shape, dataset=dataset, laps=laps)
    evaluator = build_evaluator(config.model, config.run.seed, data.dataset)
    laps.done("built and probed model %s", config.model.name)
    plan = finish_plan(config, outline, model_size(evaluator) if hosts_all else None, laps)
    if config.adversary.active and config.adversary.attack == "labelflip":
        nodes, server = plan.graph.nodes, plan.algorithm.server
        liars = byzantine(config.adversary, config.run.seed, nodes, server)
        poisoned, parts = flip_labels(data.dataset, data.parts, nodes, liars)
        data = dataclasses.replace(data, dataset=poisoned, parts=parts)
    privacy = plan_privacy(
        config.privacy,
        nodes=plan.graph.nodes,
        examples=[len(p) for p in data.parts],
        batch_size=config.data.batch_size,
        run=config.run,
        asynchronous=is_asynchronous(plan.algorithm),
        gradient_mode=(evaluator.rows.mode, evaluator.rows.why),
        streamed=data.source is not None,
        cohort=_cohort(plan.algorithm, len(plan.graph.nodes)),
    )
    rule = plan.algorithm
    if privacy is not None and privacy.user_level:  # DP-FedAvg's server step
        rule = _dp_fedavg(config, rule)
    if privacy is not None and privacy.rounds < config.run.rounds:  # privacy.target_epsilon
        config = dataclasses.replace(
            config, run=dataclasses.replace(config.run, rounds=privacy.rounds)
        )
    setup = RunSetup(
        config=config,
        dataset=data.dataset,
        trust=plan.trust,
        graph=plan.graph,
        algorithm=rule,
        parts=data.parts,
        start=evaluator.initial_params(),
        run_id=plan.run_id,
        options=node_options(NodeInputs.of(config), plan.run_id),
        evaluator=evaluator,
        faults=plan.faults,
        source=data.source,
        test_parts=data.test_parts,
        privacy=privacy,
    )
    _check_eval_peers(config, plan.graph.nodes, plan.algorithm.server)
    logger.info(
        "prepared %d nodes in %.2f s", len(plan.graph.nodes), time.perf_counter() - laps.began
    )
    return setup


def _cohort(algorithm: Algorithm, nodes: int) -> tuple[int, int] | None:
    """FedAvg's cohort size and number of workers (the server is one of ``nodes``), which
    DP-FedAvg samples users at; None for any other algorithm."""
    inner = algorithm.rule if isinstance(algorithm, Attacked) else algorithm
    if not isinstance(inner, FedAvgRule):
        return None
    return cohort_size(nodes - 1, inner.fraction), nodes - 1


def _dp_fedavg(config: Config, algorithm: Algorithm) -> Algorithm:
    """The run's FedAvg with DP-FedAvg's server step (:mod:`fedcore.privacy.dpfedavg`);
    refused in one line where the server would not average (a robust aggregator) or a
    Byzantine peer's rule wraps it."""
    if isinstance(algorithm, Attacked):
        raise ConfigError(
            "privacy.mechanism = 'dp-fedavg' with an [adversary] is not built (the liars "
            "wrap FedAvg's rule); use privacy.mechanism = 'dp-sgd', or remove [adversary]."
        )
    rule = cast(FedAvgRule, algorithm)
    if rule.aggregator.robust:
        raise ConfigError(
            "privacy.mechanism = 'dp-fedavg' replaces the server's mean with its clipped, "
            f"noised mean, so algorithm.aggregator = {rule.aggregator.name!r} would not run; "
            "set algorithm.aggregator = 'mean', or use privacy.mechanism = 'dp-sgd'."
        )
    p = config.privacy
    secret = p.noise_key == "secret"
    return cast(Algorithm, private_fedavg(rule, p.clip, p.noise, config.run.seed, secret))


def _check_eval_peers(config: Config, nodes: Sequence[str], server: str | None) -> None:
    """Refuse ``run.eval_peers`` above the peers whose own models are evaluated (every
    node, the server left out), in one line, before any work."""
    check_eval_peers(config.run.eval_peers, len(nodes) - (server is not None and server in nodes))
