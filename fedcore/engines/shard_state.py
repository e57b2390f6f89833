"""What one rank of a sharded run keeps in its checkpoint (:func:`rank_state`) and how it
continues from it (:func:`load_rank_state`): the part of
:class:`~fedcore.engines.sharded.ShardedNetwork` that checkpoints.

A rank's next round is a function of its rows' rule state (a rule whose state is per edge,
robust push-sum: its rows' out- and in-edges' totals, which never leave the rank) and node
optimizer state, their places in their data (generators, positions, epoch orders), the
generators of its rows' codecs, torch's global generator and, with virtual time, the
run's clock (every rank's the same: :mod:`fedcore.engines.shard_time`); its fault counts (per
in-edge of its rows) and the halo bytes it has sent are what the run's figures add up at
the end. All of it is this rank's own, so each rank writes and reads only its own file
(:mod:`fedcore.simulation.rank_checkpoints` says where, and how a manifest ties the ranks'
files of one round together).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from fedcore.algorithms.rule import Rule
from fedcore.compression.batched import RowCodec
from fedcore.engines.ranks import Ranks
from fedcore.engines.shard_batches import RankBatches
from fedcore.engines.shard_faults import ShardFaults
from fedcore.engines.shard_streams import RowStreams
from fedcore.engines.shard_time import ShardTime
from fedcore.errors import ConfigError
from fedcore.setup import checkpoint

__all__ = ["RankBlock", "load_rank_state", "rank_state"]


class RankBlock(Protocol):
    """What checkpoints of a rank's block read and set
    (:class:`~fedcore.engines.sharded.ShardedNetwork`)."""

    ranks: Ranks
    mine: torch.Tensor
    rule: Rule
    state: Any
    opt_state: Any
    batches: RankBatches | RowStreams
    codec: RowCodec
    faults: ShardFaults | None
    time: ShardTime | None
    halo_bytes: int
    round: int


def rank_state(net: RankBlock) -> dict[str, Any]:
    """Everything :func:`load_rank_state` needs to continue ``net`` (one rank's block)
    from its round exactly, as plain containers and CPU tensors."""
    rows = net.mine.tolist()
    generators = net.codec.generators  # empty for a codec that draws nothing
    faults = net.faults
    return {
        "round": net.round,
        "rows": net.mine.clone(),
        "state": checkpoint.to_tree(net.state),
        "optimizer": checkpoint.to_tree(net.opt_state),
        "batches": net.batches.state_dict(rows),
        "codec": [generators[i].get_state() for i in rows] if generators else None,
        "faults": None
        if faults is None
        else [[m.clone(), d.clone()] for m, d in zip(faults.missing, faults.dropped, strict=True)],
        "halo_bytes": net.halo_bytes,
        "torch_rng": torch.get_rng_state(),
        "clock": None if net.time is None else net.time.state_dict(),
    }


def load_rank_state(net: RankBlock, saved: dict[str, Any]) -> None:
    """Continue ``net`` from a :func:`rank_state` of the same rank of the same run.

    Raises:
        ConfigError: the state is of other rows (another placement of the peers) or
            another layout, in one line.
    """
    label = net.ranks.label
    rows = saved.get("rows")
    if not isinstance(rows, torch.Tensor) or not torch.equal(rows, net.mine):
        raise ConfigError(
            f"the checkpoint of {label} holds other peers than this fedcore places on it "
            "(another simulate.partition or fedcore version): resume with the fedcore "
            "that wrote it, or start the run afresh."
        )
    net.state = checkpoint.restore_state(saved["state"], net.state, label, net.rule.name)
    try:
        if (net.opt_state is None) != (saved.get("optimizer") is None):
            raise ValueError("a node optimizer in one and not the other")
        if net.opt_state is not None:
            net.opt_state = checkpoint.restore_state(
                saved["optimizer"], net.opt_state, label, "node optimizer"
            )
        net.batches.load_state_dict(saved["batches"], net.mine.tolist())
        generators = net.codec.generators
        if generators:
            for i, state in zip(net.mine.tolist(), saved["codec"], strict=True):
                generators[i].set_state(state)
        faults = net.faults
        if (faults is None) != (saved["faults"] is None):
            raise ValueError("a fault plan in one and not the other")
        if faults is not None:
            counts = zip(faults.missing, faults.dropped, saved["faults"], strict=True)
            for missing, dropped, (m, d) in counts:
                missing.copy_(m)
                dropped.copy_(d)
        net.halo_bytes = int(saved["halo_bytes"])
        torch.set_rng_state(saved["torch_rng"])
        if (net.time is None) != (saved.get("clock") is None) and "clock" in saved:
            raise ValueError("virtual time in one and not the other")
        if net.time is not None:  # none saved (an older checkpoint): the clock replays
            net.time.load_state_dict(saved.get("clock"))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"the checkpoint of {label} does not fit this run ({str(exc).splitlines()[0]}): "
            "resume with the fedcore and config that wrote it."
        ) from None
    net.round = int(saved["round"])
