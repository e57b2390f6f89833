"""An in-memory harness for testing algorithms and models, yours or fedcore's.

Two levels:

* :func:`make_network` builds a full in-process network (data, models, nodes, the
  in-process transport with every message recorded) from a few arguments, exactly as
  ``fedcore simulate`` does, and returns a :class:`TestNetwork` you can run round by
  round while inspecting every node's state and every message::

      from fedcore.testing import make_network

      def test_my_model_learns():
          net = make_network("ring:8", algorithm="dpsgd", model="mypkg.models:make_model")
          net.run(50)
          assert net.evaluate()["avg_model_accuracy"] > 0.8
          assert all(m.sender in net.graph.in_neighbours(m.receiver) for m in net.messages)

  ``engine="vectorized"`` builds the same network on the vectorized engine instead
  (:class:`VectorizedTestNetwork`: every node's state stacked, the same ``run``,
  ``models`` and ``evaluate``), for tests at thousands of nodes.

* :func:`lockstep` drives an algorithm's pure update rules over a weighted graph with
  hand-made gradients and no transport at all, in any node processing order, optionally
  dropping chosen messages. Property tests of the update rules use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fedcore.algorithms import Algorithm, Outbox, RoundContext
from fedcore.algorithms.base import unions, with_traits
from fedcore.algorithms.user import as_algorithm
from fedcore.compression import Codec, get_codec
from fedcore.config import Config, config_from_dict, config_to_dict
from fedcore.data import Dataset
from fedcore.engines.messages import Network, build_network
from fedcore.engines.vectorized import VectorizedNetwork, evaluate_stacked
from fedcore.messages import Message, Payload
from fedcore.metrics import evaluate_models
from fedcore.node import Node, per_node
from fedcore.setup.graph import communication_graph
from fedcore.setup.plan import AlgorithmInputs, configured_algorithm
from fedcore.setup.prepare import prepare_run, seed_torch
from fedcore.simulation.simulate import choose_engine
from fedcore.topology import Topology, parse_spec

__all__ = ["TestNetwork", "VectorizedTestNetwork", "lockstep", "make_network"]


class TestNetwork:
    """A built in-process network, run a few rounds at a time (see :func:`make_network`)."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, network: Network) -> None:
        """Wrap ``network``."""
        self.network = network

    @property
    def nodes(self) -> dict[str, Node]:
        """Node id -> node (``node.state`` is the algorithm state)."""
        return self.network.nodes

    @property
    def graph(self) -> Topology:
        """The weighted communication graph."""
        return self.network.graph

    @property
    def config(self) -> Config:
        """The effective config."""
        return self.network.config

    @property
    def round(self) -> int:
        """Rounds completed so far."""
        return min(node.round for node in self.nodes.values())

    @property
    def messages(self) -> list[Message]:
        """Every message delivered so far, in delivery order."""
        return self.network.transport.messages

    def messages_at(self, round: int, phase: int = 0) -> list[Message]:
        """The messages of one round and phase."""
        return [m for m in self.messages if m.round == round and m.phase == phase]

    def run(self, rounds: int = 1) -> TestNetwork:
        """Run ``rounds`` more rounds on every node."""
        self.network.run(self.round + rounds)
        return self

    def models(self) -> dict[str, torch.Tensor]:
        """Node id -> the parameters it predicts with."""
        return {nid: node.model() for nid, node in self.nodes.items()}

    def average_model(self) -> torch.Tensor:
        """The mean of all nodes' models."""
        return torch.stack(list(self.models().values())).mean(dim=0)

    def evaluate(self) -> dict[str, Any]:
        """Average-model and per-node test accuracy, loss, consensus distance."""
        net = self.network
        return evaluate_models(net.evaluator, self.models(), net.dataset.x_test, net.dataset.y_test)


class VectorizedTestNetwork:
    """A built vectorized network (see :func:`make_network` with ``engine="vectorized"``):
    the same reading methods as :class:`TestNetwork`, every node's state stacked."""

    __test__ = False

    def __init__(self, network: VectorizedNetwork) -> None:
        """Wrap ``network``."""
        self.network = network

    @property
    def graph(self) -> Topology:
        """The weighted communication graph."""
        return self.network.setup.graph

    @property
    def config(self) -> Config:
        """The effective config."""
        return self.network.setup.config

    @property
    def round(self) -> int:
        """Rounds completed so far."""
        return self.network.round

    @property
    def state(self) -> Any:
        """The stacked algorithm state (a NamedTuple of tensors with a node dimension)."""
        return self.network.state

    def run(self, rounds: int = 1) -> VectorizedTestNetwork:
        """Run ``rounds`` more rounds on every node."""
        for _ in range(rounds):
            self.network.run_round()
        return self

    def models(self) -> dict[str, torch.Tensor]:
        """Node id -> the parameters it predicts with."""
        stacked = self.network.model()
        return {nid: stacked[i] for i, nid in enumerate(self.network.nodes)}

    def average_model(self) -> torch.Tensor:
        """The mean of all nodes' models."""
        return self.network.model().mean(dim=0)

    def evaluate(self) -> dict[str, Any]:
        """Average-model and per-node test accuracy, loss, consensus distance."""
        return evaluate_stacked(self.network, self.network.model())


def make_network(
    topology: str | Topology = "ring:8",
    *,
    algorithm: str | Any = "dpsgd",
    dataset: str | Dataset = "digits",
    model: str = "logreg",
    seed: int = 0,
    record: bool = True,
    settings: Mapping[str, Any] | None = None,
    engine: str = "messages",
) -> TestNetwork | VectorizedTestNetwork:
    """Build a :class:`TestNetwork` (or, ``engine = "vectorized"``, a
    :class:`VectorizedTestNetwork`).

    Args:
        topology: A spec such as ``"ring:8"`` or ``"social:16"``, or a built graph.
        algorithm: A registered name, your own as ``"pkg.module:factory"`` (as
            ``algorithm.name`` takes it), or your own object: a
            :class:`~fedcore.algorithms.rule.Rule` (on either engine, each through its
            adapter) or an object of
            the per-message Algorithm protocol (the message engine only).
        dataset: A built-in name, ``"pkg.module:factory"``, or a :class:`Dataset`.
        model: A built-in name or ``"pkg.module:factory"``.
        seed: The run seed.
        record: Keep every message in ``.messages``.
        settings: Other config keys by dotted path, e.g. ``{"algorithm.lr": 0.1}``.
            ``topology.*`` keys are ignored: ``topology`` gives the graph.
        engine: ``"messages"`` (the default: node objects exchanging recorded messages),
            ``"vectorized"`` (every node's state stacked; no messages to inspect) or
            ``"auto"`` (vectorized where it supports the config), as ``simulate.engine``.

    Raises:
        ConfigError: ``engine = "vectorized"`` and the vectorized engine cannot run it.
    """
    raw = config_to_dict(Config())
    raw["run"]["seed"] = seed
    raw["model"]["name"] = model
    if isinstance(dataset, str):
        raw["data"]["dataset"] = dataset
    if not isinstance(algorithm, str):
        # Declared rules are checked (each engine runs them through its adapter); a
        # per-message algorithm (one that hands its attributes on to a built-in one
        # included) runs as it is.
        kind = type(algorithm)
        algorithm = as_algorithm(algorithm, f"{kind.__module__}:{kind.__qualname__}")
    raw["algorithm"]["name"] = algorithm if isinstance(algorithm, str) else algorithm.name
    for key, value in (settings or {}).items():
        table, _, name = key.partition(".")
        raw.setdefault(table, {})[name] = value
    config = config_from_dict(raw)
    trust = parse_spec(topology) if isinstance(topology, str) else topology
    algo: Algorithm = (
        configured_algorithm(AlgorithmInputs.of(config))
        if isinstance(algorithm, str)
        else algorithm
    )
    if engine != "messages":
        setup = prepare_run(
            config,
            algorithm=algo,
            trust=trust,
            dataset=dataset if isinstance(dataset, Dataset) else None,
        )
        chosen, _ = choose_engine(setup, engine)
        if chosen == "vectorized":
            seed_torch(config)  # a model with its own randomness (dropout) replays exactly
            return VectorizedTestNetwork(VectorizedNetwork(setup, device=torch.device("cpu")))
    network = build_network(
        config,
        record=record,
        algorithm=algo,
        trust=trust,
        dataset=dataset if isinstance(dataset, Dataset) else None,
        # Each receiver decodes its own copy, so a user algorithm that (wrongly) updates
        # its inbox in place cannot corrupt another node's input here.
        share_decoded=False,
    )
    seed_torch(config)  # as simulate does, after the set-up
    return TestNetwork(network)


def lockstep(
    algorithm: Any,
    graph: Topology,
    params: Mapping[str, torch.Tensor],
    *,
    rounds: int,
    lr: float = 0.0,
    grad: Callable[[str, int, torch.Tensor], torch.Tensor] | None = None,
    order: Sequence[str] | None = None,
    drop: Callable[[str, str, int, int], bool] | None = None,
    states: Mapping[str, Any] | None = None,
    on_round: Callable[[int, dict[str, Any]], None] | None = None,
    codecs: Mapping[str, Codec] | None = None,
) -> dict[str, Any]:
    """Run ``algorithm``'s pure update rules on every node of ``graph``, with no transport.

    Every node steps, then every node's messages are snapshotted, then every node mixes,
    phase by phase; ``order`` sets the order nodes are processed in (results must not
    depend on it). ``graph`` is used as given if it has weights, else it gets the
    algorithm's weights.

    Args:
        algorithm: The algorithm.
        graph: The graph (weighted, or to be weighted for the algorithm).
        params: Node id -> initial parameters (ignored for nodes in ``states``).
        rounds: Rounds to run.
        lr: Step size.
        grad: ``grad(node, round, model) -> gradient``; zero if omitted.
        order: Node processing order (default: graph order).
        drop: ``drop(sender, receiver, round, phase) -> True`` loses that message.
        states: Start from these states instead of ``algorithm.init(params)``.
        on_round: Called with ``(round, states)`` after each round.
        codecs: Node id -> the codec it compresses with (algorithms that compress
            themselves use it; none means lossless).

    Returns:
        Node id -> final algorithm state.
    """
    algorithm = with_traits(algorithm)
    if not graph.has_weights():
        graph = communication_graph(algorithm, graph)
    algorithm = per_node(algorithm)  # a rule on one peer at a time, as a node runs it
    nodes = tuple(order or graph.nodes)
    state: dict[str, Any] = (
        dict(states) if states is not None else {n: algorithm.init(params[n]) for n in nodes}
    )
    union = {n: unions(graph, n) for n in nodes}
    for t in range(rounds):
        g = graph.at(t)
        ctxs = {
            n: RoundContext(
                node=n,
                round=t,
                lr=lr,
                self_weight=g.self_weight(n),
                out_weights=g.out_weights(n),
                in_weights=g.in_weights(n),
                nodes=graph.nodes,
                codec=codecs.get(n) if codecs is not None else None,
                out_union=union[n][0],
                in_union=union[n][1],
            )
            for n in nodes
        }
        outboxes: dict[str, Outbox] = {}
        for n in nodes:
            model = algorithm.model(state[n])
            gradient = grad(n, t, model) if grad is not None else torch.zeros_like(model)
            state[n], outboxes[n] = algorithm.step(state[n], gradient, ctxs[n])
        for phase in range(algorithm.phases):
            snap = _snapshot(outboxes)
            for n in nodes:
                inbox = {
                    s: snap[s][n]
                    for s in sorted(algorithm.expected_senders(phase, ctxs[n]))
                    if n in snap.get(s, {}) and not (drop is not None and drop(s, n, t, phase))
                }
                state[n], outboxes[n] = algorithm.mix(state[n], phase, inbox, ctxs[n])
        if on_round is not None:
            on_round(t, state)
    return state


def _snapshot(outboxes: Mapping[str, Outbox]) -> dict[str, dict[str, Payload]]:
    """Deep-copy every payload so no in-place update after sending can leak."""
    copies: dict[str, dict[str, Payload]] = {}
    for sender, outbox in outboxes.items():
        seen: dict[int, Payload] = {}
        box: dict[str, Payload] = {}
        for dst, payload in outbox.items():
            if id(payload) not in seen:
                # What a receiver gets: a private copy, decoded if the sender encoded it.
                seen[id(payload)] = Payload(
                    {
                        k: v.clone()
                        if isinstance(v, torch.Tensor)
                        else get_codec(v.codec).decode(v)
                        for k, v in payload.tensors.items()
                    },
                    dict(payload.scalars),
                )
            box[dst] = seen[id(payload)]
        copies[sender] = box
    return copies
