"""A shared check: a network checkpointed mid-run and restored ends as one that never
stopped (``checkpoint.save`` / ``latest`` / ``restore``, the peers' path)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedcore.config import Config
from fedcore.engines.messages import Network, build_network
from fedcore.metrics import params_sha256
from fedcore.node import Node
from fedcore.setup import checkpoint


def assert_resumes_exactly(
    config: Config,
    folder: Path,
    *,
    stop: int,
    end: int,
    saved: Callable[[Node], None] | None = None,
    restored: Callable[[Node], None] | None = None,
) -> tuple[Network, Network]:
    """Run ``config`` to ``end``; run it again to ``stop``, checkpoint every node into
    ``folder/<id>``, restore the checkpoints into a fresh network and run that to ``end``:
    every node's parameters must be the same bits. ``saved`` and ``restored`` are called
    with each node after its checkpoint is written and read. Returns ``(whole, resumed)``.
    """
    whole = build_network(config)
    whole.run(end)
    first = build_network(config)
    first.run(stop)
    for node in first.nodes.values():
        checkpoint.save(folder / node.id, node)
        if saved is not None:
            saved(node)
    second = build_network(config)
    for node in second.nodes.values():
        state = checkpoint.latest(folder / node.id)
        assert state is not None, node.id
        checkpoint.restore(node, state)
        assert node.round == stop
        if restored is not None:
            restored(node)
    second.run(end)
    for nid, node in whole.nodes.items():
        assert params_sha256(second.nodes[nid].model()) == params_sha256(node.model()), nid
    return whole, second
