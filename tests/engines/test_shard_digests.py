"""The summary's digests of a sharded run, made where the models are
(:mod:`fedcore.engines.shard_digests`): the same bits as hashing every gathered model, block
by block for ``params_sha256_all`` (rank 0 never holds every model), one digest a peer
for ``params_sha256``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedcore.engines import shard_digests
from fedcore.engines.ranks import Ranks
from fedcore.metrics import all_params_sha256, params_sha256
from fedcore.simulation import results
from fedcore.simulation.simulate import simulate
from tests.engines.test_sharded import _config, run_ranks

NODES = [f"n{i}" for i in range(10)]


def _small_blocks(maps_up_to: int = 3, block_bytes: int = 100) -> None:
    """Digests of one digest of every model above ``maps_up_to`` peers, fed in blocks of
    ``block_bytes`` (a few rows), in this process (a rank's, through ``run_ranks``)."""
    shard_digests.NODE_MAPS_NODES = maps_up_to
    shard_digests.DIGEST_BLOCK_BYTES = block_bytes
    results.NODE_MAPS_NODES = maps_up_to


@pytest.mark.parametrize("block_bytes", [1, 24, 100, 1 << 20])
def test_digests_in_blocks_are_those_of_every_model(
    monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    rows = torch.randn(len(NODES), 3, dtype=torch.float64)
    one = Ranks(0, 1)
    shards = [np.arange(len(NODES), dtype=np.int64)]
    made = shard_digests.gathered_digests(one, rows, shards, NODES)
    assert made is not None
    assert made.digests == {
        "params_sha256": {n: params_sha256(r) for n, r in zip(NODES, rows, strict=True)}
    }
    monkeypatch.setattr(shard_digests, "NODE_MAPS_NODES", 3)
    monkeypatch.setattr(shard_digests, "DIGEST_BLOCK_BYTES", block_bytes)
    made = shard_digests.gathered_digests(one, rows, shards, NODES)
    assert made is not None
    assert made.digests == {"params_sha256_all": all_params_sha256(rows)}
    start = rows[0]
    assert shard_digests.start_digests(start, NODES).digests == {
        "params_sha256_all": all_params_sha256([start] * len(NODES))
    }


def test_start_digests_name_every_peer() -> None:
    start = torch.arange(4, dtype=torch.float32)
    assert shard_digests.start_digests(start, NODES[:2]).digests == {
        "params_sha256": dict.fromkeys(NODES[:2], params_sha256(start))
    }


def test_two_ranks_hash_every_model_in_blocks_as_one_process(tmp_path: Path) -> None:
    """``params_sha256_all`` on two ranks of the graph partition (rows that are not
    contiguous), in blocks of two rows: one process's digest, bit for bit."""
    config = _config(
        "dpsgd",
        tmp_path,
        "simulate.partition=graph",
        "run.rounds=2",
    )
    one = tmp_path / "one"
    torch.set_num_threads(1)
    maps = results.NODE_MAPS_NODES
    try:
        results.NODE_MAPS_NODES = 3
        expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    finally:
        results.NODE_MAPS_NODES = maps
    assert "params_sha256_all" in expected
    out = tmp_path / "two"
    assert run_ranks(config, 2, out, prepare=_small_blocks) == {0: "ok", 1: "ok"}
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert got["params_sha256_all"] == expected["params_sha256_all"]
    assert "params_sha256" not in got


@pytest.mark.parametrize("peers", [10, 400])
def test_rank_0_holds_a_block_of_rows_at_most(monkeypatch: pytest.MonkeyPatch, peers: int) -> None:
    """``params_sha256_all`` gathers one block of rows at a time, whatever the peers: rank
    0 never holds more than a block (here two rows of 3 float32)."""
    held: list[int] = []
    gather = shard_digests.gather_rows

    def counting(ranks: Ranks, local: torch.Tensor, shards: Any) -> torch.Tensor | None:
        got = gather(ranks, local, shards)
        held.append(0 if got is None else int(got.shape[0]))
        return got

    monkeypatch.setattr(shard_digests, "gather_rows", counting)
    monkeypatch.setattr(shard_digests, "NODE_MAPS_NODES", 3)
    monkeypatch.setattr(shard_digests, "DIGEST_BLOCK_BYTES", 24)
    rows = torch.randn(peers, 3)
    nodes = [f"n{i}" for i in range(peers)]
    shards = [np.arange(peers, dtype=np.int64)]
    made = shard_digests.gathered_digests(Ranks(0, 1), rows, shards, nodes)
    assert made is not None and made.digests == {"params_sha256_all": all_params_sha256(rows)}
    assert max(held) == 2 and sum(held) == peers
