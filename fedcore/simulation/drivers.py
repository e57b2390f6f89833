"""How :func:`~fedcore.simulation.simulate.simulate` drives each engine.

:class:`Engine` is what a run asks of an engine's network, whichever engine it is; one
driver per engine (messages, vectorized, events) answers it, and :func:`build_engine`
builds the one a run chose. :func:`run_vectorized` and :func:`run_events` run every
round of a vectorized or an event network into a
:class:`~fedcore.simulation.observer.RunObserver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from fedcore.engines.events import EventNetwork
from fedcore.engines.messages import Network, build_network
from fedcore.engines.vectorized import Flusher, VectorizedNetwork, resolve_device
from fedcore.metrics import JsonlWriter
from fedcore.progress import Progress
from fedcore.setup import checkpoint
from fedcore.setup.prepare import RunSetup
from fedcore.simulation.observer import RunObserver

__all__ = [
    "Engine",
    "Save",
    "build_engine",
    "run_events",
    "run_vectorized",
]


Save = Callable[[int, dict[str, Any]], None]
"""Write a checkpoint of ``round`` holding the engine's ``state`` (and the run's own)."""


class Engine(Protocol):
    """What :func:`~fedcore.simulation.simulate.simulate` asks of an engine's network,
    whichever engine it is."""

    name: str
    """``"messages"``, ``"vectorized"`` or ``"events"`` (the checkpoint and summary say it)."""
    nodes: Sequence[str]
    """Every node, in graph order."""

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        """Run (or continue, from checkpoint ``saved``) to ``run.rounds``, accounting into
        ``observer`` and checkpointing through ``save``; every node's final parameters
        where the engine has them at hand (``None``: :meth:`final` reads them)."""
        ...

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        """Every node's parameters now, on the CPU."""
        ...

    def summary(self) -> dict[str, Any]:
        """The summary's keys that say how this engine ran (engine, device, gradients)."""
        ...


class _Messages:
    """The message engine: a :class:`~fedcore.node.Node` per peer, in-process."""

    name = "messages"

    def __init__(self, network: Network) -> None:
        self.network = network
        self.nodes: Sequence[str] = list(network.nodes)

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        network = self.network
        if saved is not None:
            for nid, node in network.nodes.items():
                checkpoint.restore(node, saved["nodes"][nid])
        observer.attach(network)
        config = network.config
        asyncio.run(_run_messages(network, config.run.rounds, config.run.checkpoint_every, save))
        return None

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        return {nid: node.model() for nid, node in self.network.nodes.items()}

    def summary(self) -> dict[str, Any]:
        # One module per node on the CPU.
        return {"engine": self.name, "device": "cpu", "gradients": "per-node"}


class _Vectorized:
    """The vectorized engine: every peer a row of one stack."""

    name = "vectorized"

    def __init__(self, net: VectorizedNetwork) -> None:
        self.net = net
        self.nodes: Sequence[str] = list(net.nodes)

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        return run_vectorized(self.net, observer, writer, progress, save=save, saved=saved)

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        return _vectorized_final(self.net, observer)

    def summary(self) -> dict[str, Any]:
        net = self.net
        return {"engine": self.name, "device": str(net.device), "gradients": net.objective.mode}


class _Events:
    """The event engine: the asynchronous algorithms in virtual time."""

    name = "events"

    def __init__(self, net: EventNetwork) -> None:
        self.net = net
        self.nodes: Sequence[str] = list(net.nodes)

    def run(
        self,
        observer: RunObserver,
        writer: JsonlWriter,
        progress: Progress | None,
        save: Save,
        saved: Mapping[str, Any] | None,
    ) -> dict[str, torch.Tensor] | None:
        return run_events(self.net, observer)

    def final(self, observer: RunObserver) -> dict[str, torch.Tensor]:
        models = self.net.models()
        return {nid: models[i] for i, nid in enumerate(self.net.nodes)}

    def summary(self) -> dict[str, Any]:
        return {"engine": self.name, "device": "cpu", "gradients": self.net.objective.mode}


def build_engine(setup: RunSetup, engine: str) -> Engine:
    """The network of ``engine`` (a name
    :func:`~fedcore.simulation.simulate.choose_engine` gave) for ``setup``."""
    if engine == "events":
        return _Events(EventNetwork(setup))
    if engine == "vectorized":
        device = resolve_device(setup.config.simulate.device)
        return _Vectorized(VectorizedNetwork(setup, device=device))
    return _Messages(build_network(setup.config, setup=setup))


async def _run_messages(
    network: Network,
    rounds: int,
    every: int,
    save: Callable[[int, dict[str, Any]], None],
) -> None:
    """Run the message engine to ``rounds``, stopping every node at each multiple of
    ``every`` (0: never) to checkpoint them all at once.

    SIGINT and SIGTERM (in the main thread) cancel the run between the nodes' steps and
    raise :class:`KeyboardInterrupt` here, rather than inside one node's task.
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, task.cancel)
        except (ValueError, RuntimeError):  # not the main thread: signals stay as they are
            continue
        handled.append((sig, previous))
    try:
        done = min(node.round for node in network.nodes.values())
        while done < rounds:
            stop = min(rounds, (done // every + 1) * every) if every else rounds
            await network.run_async(stop)
            done = stop
            if every and done < rounds:
                nodes = network.nodes.items()
                save(done, {"nodes": {nid: checkpoint.snapshot(n) for nid, n in nodes}})
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    finally:
        for sig, previous in handled:
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous)


def run_vectorized(
    net: VectorizedNetwork,
    observer: RunObserver,
    writer: JsonlWriter | None,
    progress: Progress | None,
    *,
    save: Callable[[int, dict[str, Any]], None] | None = None,
    saved: Mapping[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """Run every round of a :class:`~fedcore.engines.vectorized.VectorizedNetwork`,
    accounting into ``observer``; checkpoint through ``save`` every
    ``run.checkpoint_every`` rounds, and continue from checkpoint ``saved``. Returns
    every node's final parameters (on the CPU)."""
    flusher = Flusher(
        net, observer=observer, writer=writer, records=observer.records, progress=progress
    )
    if saved is not None:
        net.load_state_dict(saved["network"])
        flusher.load_state_dict(saved["flusher"])
    every = net.setup.config.run.checkpoint_every if save is not None else 0
    try:
        while net.round < observer.rounds:
            flusher.add(net.run_round())
            if every and net.round % every == 0 and net.round < observer.rounds:
                assert save is not None
                flusher.flush()
                save(net.round, {"network": net.state_dict(), "flusher": flusher.state_dict()})
    except BaseException:
        with contextlib.suppress(Exception):  # account what ran, for the partial summary
            flusher.flush()
        raise
    flusher.flush()
    return _vectorized_final(net, observer)


def run_events(net: EventNetwork, observer: RunObserver) -> dict[str, torch.Tensor]:
    """Run an asynchronous network's rounds (see :mod:`fedcore.engines.events`) into
    ``observer``; every node's final parameters."""
    lr = net.setup.options.lr
    while net.round < observer.rounds:
        figures = net.run_round()
        evaluating = observer.is_eval_round(figures.round)
        models = net.models() if evaluating else None
        for i, record in enumerate(net.records(figures, lr)):
            observer.observe(record, None if models is None else models[i].clone())
    models = net.models()
    return {nid: models[i] for i, nid in enumerate(net.nodes)}


def _vectorized_final(net: VectorizedNetwork, observer: RunObserver) -> dict[str, torch.Tensor]:
    """Every node's parameters (on the CPU), with the fault tables put into ``observer``."""
    missing, dropped = net.fault_counts()
    observer.missing_edges.update(missing)
    observer.dropped_edges.update(dropped)
    final = net.model().cpu()
    return {nid: final[i] for i, nid in enumerate(net.nodes)}
