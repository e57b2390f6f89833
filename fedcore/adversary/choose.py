"""Which peers lie: ``adversary.peers`` as given, or ``adversary.fraction`` of them by keyed
hashes of the node ids (the same peers on every engine and in every node's process,
whatever the node order)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from fedcore.algorithms.rule import Rows
from fedcore.config.tables.adversary import AdversaryConfig
from fedcore.counter_random import hash64, make_key, string_id
from fedcore.errors import ConfigError

__all__ = ["Liars", "byzantine"]


def byzantine(
    adversary: AdversaryConfig, run_seed: int, nodes: Sequence[str], server: str | None
) -> tuple[str, ...]:
    """The Byzantine peers among ``nodes`` (in node order); a server never lies. Made once
    per run (the set-up, the observer and every evaluation ask; with ``fraction`` each
    answer hashes every node id).

    Raises:
        ConfigError: a named peer that is not in the graph (or is the server), or a
            fraction that leaves no honest peer.
    """
    if not adversary.active:
        return ()
    return _chosen(adversary, run_seed, tuple(nodes), server)


@functools.lru_cache(maxsize=8)
def _chosen(
    adversary: AdversaryConfig, run_seed: int, nodes: tuple[str, ...], server: str | None
) -> tuple[str, ...]:
    workers = [v for v in nodes if v != server]
    if adversary.peers:
        known = set(workers)
        for peer in adversary.peers:
            if peer not in known:
                why = "is the server" if peer == server else "is not a node of the graph"
                raise ConfigError(f"adversary.peers names {peer!r}, which {why}.")
        chosen = set(adversary.peers)
    else:
        k = max(1, round(adversary.fraction * len(workers)))
        if k >= len(workers):
            raise ConfigError(
                f"adversary.fraction = {adversary.fraction} makes {k} of the {len(workers)} "
                "peers Byzantine: leave at least one honest peer."
            )
        key = make_key("fedcore.adversary.peers", run_seed, adversary.seed)
        ranked = sorted(workers, key=lambda v: (hash64(key, string_id(v)), v))
        chosen = set(ranked[:k])
    if len(chosen) >= len(workers):
        raise ConfigError(
            "adversary.peers names every peer: leave at least one honest peer, whose "
            "figures are the run's."
        )
    return tuple(v for v in nodes if v in chosen)


class Liars:
    """The Byzantine peers of a run as masks over a rule's rows, made once per node list."""

    def __init__(self, adversary: AdversaryConfig, run_seed: int, server: str | None) -> None:
        """The peers ``adversary`` names (:func:`byzantine`), once the nodes are known."""
        self.adversary = adversary
        self.run_seed = run_seed
        self.server = server
        self._nodes: tuple[str, ...] | None = None
        self._mask = torch.zeros(0, dtype=torch.bool)
        self.population = 0
        """Peers of the run (a server left out)."""
        self.count = 0
        """Byzantine peers among them."""

    def mask(self, rows: Rows) -> torch.Tensor:
        """``[n]`` bool over :attr:`Rows.nodes`: which peers lie."""
        if self._nodes is not rows.nodes:
            if self._nodes != rows.nodes:
                liars = set(byzantine(self.adversary, self.run_seed, rows.nodes, self.server))
                self._mask = torch.tensor([v in liars for v in rows.nodes], dtype=torch.bool)
                self.population = len(rows.nodes) - (self.server in rows.nodes)
                self.count = len(liars)
            self._nodes = rows.nodes
        if self._mask.device != rows.index.device:
            self._mask = self._mask.to(rows.index.device)
        return self._mask

    def rows(self, rows: Rows) -> torch.Tensor:
        """``[B]`` bool: which of the rows lie."""
        return self.mask(rows)[rows.index]
