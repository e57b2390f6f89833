"""A sharded rank's batches (:class:`~fedcore.engines.shard_batches.RankBatches`): its rows'
alone, the batches and checkpoint state the batches of every peer give those rows, bit for
bit, on parts of uneven sizes; a state loads on a rank that holds other rows around them
(re-sharding)."""

from __future__ import annotations

import numpy as np
import torch

from fedcore.config import load_config
from fedcore.engines.shard_batches import RankBatches
from fedcore.engines.vectorized import stacked_batches
from fedcore.setup.prepare import prepare_run


def _setup():  # type: ignore[no-untyped-def]
    config = load_config(
        None,
        [
            "topology.nodes=9",
            "algorithm.name=dpsgd",
            "topology.undirected=true",
            "data.partition=quantity",
            "data.batch_size=3",
        ],
    )
    return prepare_run(config)


def test_a_ranks_batches_are_every_peers_for_its_rows() -> None:
    setup = _setup()
    assert len({len(p) for p in setup.parts}) > 1  # parts of uneven sizes
    every = stacked_batches(setup, torch.device("cpu"))
    mine = np.array([1, 4, 5, 8], dtype=np.int64)
    ours = RankBatches(setup, torch.device("cpu"), mine)
    own = np.zeros(len(setup.parts), dtype=np.bool_)
    own[mine] = True
    for t in range(7):
        up = own.copy()
        if t == 3:
            up[4] = False  # a crashed row reads nothing
        want = every.next(up)
        got = ours.next(up)
        for a, b in zip(want, got, strict=True):
            assert (a is None and b is None) or torch.equal(a, b), t
        state, wanted = ours.state_dict(mine.tolist()), every.state_dict(mine.tolist())
        assert torch.equal(state["orders"], wanted["orders"])
        assert torch.equal(state["positions"], wanted["positions"])
    # Re-sharded: rows 4 and 5 go on with a rank that holds other rows beside them.
    other = RankBatches(setup, torch.device("cpu"), np.array([0, 4, 5, 6], dtype=np.int64))
    other.load_state_dict(ours.state_dict([4, 5]), [4, 5])
    up = np.zeros(len(setup.parts), dtype=np.bool_)
    up[[4, 5]] = True
    want, got = every.next(up), other.next(up)
    for a, b in zip(want, got, strict=True):  # padded and masked as every peer's stack
        assert (a is None and b is None) or torch.equal(a, b)
