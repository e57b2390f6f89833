"""Re-sharding a sharded run's checkpoint: resuming the rows that ``R`` ranks wrote on
``R'`` ranks (``fedcore simulate --ranks R' --resume RUN_DIR``).

A rank's checkpoint (:func:`~fedcore.engines.shard_state.rank_state`) holds, for its own
rows, everything their next round reads, row by row: the rule state (one row per peer in
every field of the run's algorithms) and node optimizer state, each row's place in its data
(generator, position, epoch order; an online stream's batches read), its codec's
generator, and the fault counts of its rows' in-edges (each in-edge's counts belong to its
receiver's row). The rest is the rank's own: the halo
bytes it sent (only their sum over the ranks is reported) and torch's global generator.

So the rows a new rank holds under the placement a fresh run on ``R'`` ranks computes
(:func:`placement_rows`) are read from the old ranks' files that hold them (the
manifest lists each file's rows), and put in the new rank's order
(:func:`merge_parts`): the same bits each row had, so the run goes on exactly. The halo
bytes of every old rank go to the new rank 0 (the summary adds them up). torch's
generator must be the same on every old rank (no rank drew from it for its own rows; the
algorithms and models a sharded run runs draw nothing from it, so it is the run's seed):
otherwise, or where a rule keeps state that is not one row per peer (an algorithm's
state per edge, a FedAvg server optimizer's on the server's rank alone), or a rank's
checkpoint holds more than the parts above, the checkpoint
cannot be re-sharded exactly and is refused in one line that says to resume on ``R``
ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from fedcore.engines.partition import place
from fedcore.engines.shard_plan import union_edges
from fedcore.engines.stacked_graph import stack_graph
from fedcore.errors import ConfigError
from fedcore.setup import checkpoint
from fedcore.setup.prepare import RunSetup

__all__ = ["Part", "merge_parts", "placement_rows"]


_KNOWN = frozenset(
    (
        "round",
        "rows",
        "state",
        "optimizer",
        "batches",
        "codec",
        "faults",
        "halo_bytes",
        "torch_rng",
    )
)
"""What a rank's checkpoint holds that :func:`merge_parts` puts together; a checkpoint
that holds more is refused (no guess at how it moves with the rows)."""


class Part(NamedTuple):
    """One old rank's checkpoint, as the new rank read it.

    Attributes:
        rank: The old rank that wrote it.
        rows: Its global rows (sorted), as the manifest lists them.
        network: Its :func:`~fedcore.engines.shard_state.rank_state`.
    """

    rank: int
    rows: np.ndarray[Any, np.dtype[np.int64]]
    network: dict[str, Any]


def placement_rows(setup: RunSetup, world: int) -> list[np.ndarray[Any, np.dtype[np.int64]]]:
    """Per rank, the sorted global rows a sharded run of ``setup`` on ``world`` ranks
    places on it (as :class:`~fedcore.engines.sharded.ShardedNetwork` places them: one
    placement of the union of the period's graphs by ``simulate.partition``)."""
    cpu = torch.device("cpu")
    graphs = [stack_graph(setup.graph.at(t), device=cpu) for t in range(setup.graph.period)]
    src, dst = union_edges(graphs)
    n = len(setup.graph.nodes)
    placement = place(setup.config.simulate.partition, n, src, dst, world)
    return [np.asarray(rows, dtype=np.int64) for rows in placement.rows]


def _refuse(old_world: int, why: str) -> ConfigError:
    return ConfigError(
        f"the checkpoints were written by {old_world} ranks and cannot be re-sharded ({why}): "
        f"resume with --ranks {old_world} (torchrun: WORLD_SIZE = {old_world})."
    )


def merge_parts(net: Any, parts: Sequence[Part], old_world: int) -> dict[str, Any]:
    """A :func:`~fedcore.engines.shard_state.rank_state` of ``net``'s rows (a
    :class:`~fedcore.engines.sharded.ShardedNetwork` built for the new placement) from
    the old ranks' ``parts`` that hold them (on the new rank 0: every old rank's, for the
    halo bytes), for :func:`~fedcore.engines.shard_state.load_rank_state`.

    Raises:
        ConfigError: the parts do not hold every row of ``net``, or the checkpoint cannot
            be re-sharded (see the module docstring), in one line.
    """
    mine = net.mine.numpy()
    where = np.full(net.n, -1, dtype=np.int64)  # each global row's part
    local = np.full(net.n, -1, dtype=np.int64)  # and its place among that part's rows
    for p, part in enumerate(parts):
        where[part.rows] = p
        local[part.rows] = np.arange(part.rows.size)
    if mine.size and (where[mine] < 0).any():
        raise _refuse(old_world, "the manifest's rows do not cover the peers")
    picks = []  # per part: (my positions it fills, its positions they come from)
    for p in range(len(parts)):
        at = np.nonzero(where[mine] == p)[0]
        picks.append((torch.from_numpy(at), torch.from_numpy(local[mine[at]])))

    def rows_of(values: Sequence[torch.Tensor]) -> torch.Tensor:
        out = values[0].new_empty((mine.size, *values[0].shape[1:]))
        for (at, there), value in zip(picks, values, strict=True):
            out[at] = value[there]
        return out

    def listed(values: Sequence[list[Any]]) -> list[Any]:
        out: list[Any] = [None] * mine.size
        for (at, there), value in zip(picks, values, strict=True):
            for i, j in zip(at.tolist(), there.tolist(), strict=True):
                out[i] = value[j]
        return out

    saved = [part.network for part in parts]
    unknown = sorted(set().union(*saved) - _KNOWN)
    if unknown:  # state a later rank_state keeps, which this module does not place
        raise _refuse(old_world, f"it holds {', '.join(map(repr, unknown))}, not placed by row")
    rounds = {int(s["round"]) for s in saved}
    rng = [s["torch_rng"] for s in saved]
    if len(rounds) != 1 or any(not torch.equal(rng[0], r) for r in rng[1:]):
        raise _refuse(old_world, "its ranks' torch generators differ")
    start = net.start.unsqueeze(0)
    probes = (net.rule.init(start.repeat(2, 1)), net.rule.init(start.repeat(3, 1)))
    sizes = [part.rows.size for part in parts]
    state = _merge_state(
        [checkpoint.from_tree(s["state"]) for s in saved], probes, sizes, rows_of, old_world
    )
    optimizer = None
    if net.optimizer is not None and all(s.get("optimizer") is not None for s in saved):
        params = (net.rule.model(probes[0]), net.rule.model(probes[1]))
        optimizer = checkpoint.to_tree(
            _merge_state(
                [checkpoint.from_tree(s["optimizer"]) for s in saved],
                (net.optimizer.init(params[0]), net.optimizer.init(params[1])),
                sizes,
                rows_of,
                old_world,
            )
        )
    batches = [s["batches"] for s in saved]
    codecs = [s["codec"] for s in saved]
    return {
        "round": rounds.pop(),
        "rows": net.mine.clone(),
        "state": checkpoint.to_tree(state),
        "optimizer": optimizer,
        "batches": _merge_batches(batches, rows_of, listed),
        "codec": None if codecs[0] is None else listed(codecs),
        "faults": _merge_faults(net, parts),
        "halo_bytes": sum(int(s["halo_bytes"]) for s in saved) if net.ranks.rank == 0 else 0,
        "torch_rng": rng[0],
    }


def _merge_batches(
    batches: list[dict[str, Any]],
    rows_of: Callable[[Sequence[torch.Tensor]], torch.Tensor],
    listed: Callable[[Sequence[list[Any]]], list[Any]],
) -> dict[str, Any]:
    """Where the new rank's rows are in their data: a data set's generators, positions and
    epoch orders, or an online stream's counts of batches read
    (:class:`~fedcore.engines.shard_streams.RowStreams`)."""
    if "read" in batches[0]:
        return {"read": rows_of([b["read"] for b in batches])}
    return {
        "generators": listed([b["generators"] for b in batches]),
        "positions": rows_of([b["positions"] for b in batches]),
        "orders": rows_of([b["orders"] for b in batches]),
    }


def _merge_state(
    values: list[Any],
    probes: tuple[Any, Any],
    sizes: list[int],
    rows_of: Callable[[Sequence[torch.Tensor]], torch.Tensor],
    old_world: int,
) -> Any:
    """The rule state of the new rank's rows from the parts' ``values``: a field that is
    one row per peer (``probes``, the rule's state of 2 and of 3 rows, says which) is put
    together row by row; any other must be the same on every part."""
    first = values[0]
    two, three = probes
    if two is None and any(v is not None for v in values):  # a server optimizer's state
        raise _refuse(old_world, "its rule keeps state that is not one row per peer")
    if isinstance(first, torch.Tensor):
        per_row = (
            isinstance(two, torch.Tensor)
            and isinstance(three, torch.Tensor)
            and two.dim() > 0
            and (two.shape[0], three.shape[0]) == (2, 3)
            and all(
                isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == size
                for v, size in zip(values, sizes, strict=True)
            )
        )
        if per_row:
            return rows_of(values)
        if all(isinstance(v, torch.Tensor) and torch.equal(first, v) for v in values[1:]):
            return first
        raise _refuse(old_world, "its rule keeps state that is not one row per peer")
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(
            *(
                _merge_state([v[k] for v in values], (two[k], three[k]), sizes, rows_of, old_world)
                for k in range(len(first))
            )
        )
    if all(v == first for v in values[1:]):
        return first
    raise _refuse(old_world, "its rule keeps state that is not one row per peer")


def _merge_faults(net: Any, parts: Sequence[Part]) -> list[list[torch.Tensor]] | None:
    """The fault counts of the new rank's rows' in-edges, each graph and phase: every
    in-edge's counts are its receiver's, in the part that holds that row (whose in-edges
    are those of its rows, in edge order)."""
    faults = net.faults
    saved = parts[0].network["faults"]
    if faults is None or saved is None:  # both: none; one: refused by load_rank_state
        return None if saved is None else []
    merged = []
    for i, m in enumerate(faults.messages):
        counts = torch.zeros(2, m.dst.numel(), dtype=torch.long)
        for part in parts:
            own = torch.zeros(net.n, dtype=torch.bool)
            own[torch.from_numpy(part.rows)] = True
            edges = torch.nonzero(own[m.dst]).squeeze(1)
            missing, dropped = part.network["faults"][i]
            counts[:, edges] = torch.stack([missing, dropped])
        mine = counts[:, faults.edges[i]]
        merged.append([mine[0].clone(), mine[1].clone()])
    return merged
