"""The message engine: every node of a run as its own :class:`~fedcore.node.Node`, each on
an endpoint of one in-process network (:class:`~fedcore.transport.InProcessNetwork`).

:func:`build_network` is shared by ``fedcore simulate --engine messages`` and by the public
test harness :mod:`fedcore.testing`, so users' tests run exactly the code path of a
simulation; over gRPC (``fedcore launch``, ``fedcore node``) the same nodes run on
:class:`~fedcore.transport.grpc.GrpcTransport` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from fedcore.algorithms import Algorithm
from fedcore.config import Config
from fedcore.data import Dataset
from fedcore.errors import DataError
from fedcore.models import Objective
from fedcore.node import DecodeCache, Node, RoundRecord
from fedcore.runtime import physical_memory
from fedcore.setup.plan import COPIES
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.topology import Topology
from fedcore.transport import InProcessNetwork

__all__ = ["Network", "build_network"]


@dataclass(slots=True)
class Network:
    """An in-process network ready to run.

    Attributes:
        config: The experiment.
        dataset: The dataset (with its test split).
        trust: The trust graph as configured.
        graph: The weighted communication graph the algorithm uses.
        algorithm: The algorithm as every node runs it (a rule on one peer: its NodeRule).
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


def _check_network_memory(config: Config, setup: RunSetup) -> None:
    """Refuse an in-process network whose models alone would not fit in this machine's
    memory (one model per node and one evaluator, ``COPIES`` buffers each)."""
    memory = physical_memory()
    if memory is None:
        return
    models = len(setup.graph.nodes) + 1
    need = models * COPIES * setup.start.numel() * setup.start.element_size()
    if need > memory:
        raise DataError(
            f"{len(setup.graph.nodes)} simulated nodes of a {setup.start.numel():,}-parameter "
            f"model need at least {need / 2**30:.1f} GiB ({models} models x {COPIES} "
            f"copies), more than this machine's {memory / 2**30:.1f} GiB. Use a smaller "
            "model or fewer nodes."
        )


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


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
        algorithm=setup.node_form(),
        transport=net,
        nodes=built,
        run_id=setup.run_id,
        evaluator=setup.evaluator,
        setup=setup,
    )
