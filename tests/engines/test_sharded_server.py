"""The server family (a rule that chooses who talks: ``fedavg`` with a server optimizer,
sampling and local steps, ``doublesqueeze``, ``apmsqueeze``) on a sharded run against one
process: the server's row on one rank, its workers on all, only the round's messages
crossing ranks (:mod:`fedcore.engines.shard_server`). Each case ends with the one-process
run's parameters (``params_sha256``), traffic, fault counts, evaluations and per-node
records, with a lossy codec and with drops and a crash where one process runs them; a run
interrupted on 2 ranks resumes to the same bits.

The ranks are forked processes, as in ``tests/engines/test_sharded.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedcore.compression.rowwire import wire_width
from fedcore.config import Config
from fedcore.engines.partition import place
from fedcore.engines.ranks import Ranks
from fedcore.engines.shard_reshard import merge_parts
from fedcore.engines.shard_server import round_halo
from fedcore.engines.sharded import ShardedNetwork
from fedcore.engines.stacked_graph import stack_graph
from fedcore.errors import ConfigError
from fedcore.setup.prepare import prepare_run
from fedcore.setup.virtual import row_codec
from fedcore.simulation.rank_checkpoints import load_parts, read_manifest
from fedcore.simulation.simulate import simulate
from tests.engines.test_sharded import SAME, _records, equal_on_ranks
from tests.engines.test_sharded_faults import _case
from tests.engines.test_sharded_resume import STOP_AT, run_world
from tests.engines.test_vectorized import ODD_IDS

SERVER_DOWN = (
    f"faults.crashes=[{{node={ODD_IDS[3]!r},at=1,back=3}},{{node={ODD_IDS[8]!r},at=4,back=5}}]"
)
"""FAULTS' crash of a worker, and the star's server (the last of ODD_IDS) down in round 4."""

CASES = [
    # FedAvg: a sample of half the workers, two local steps (GRAPHS), FedAvgM's server step
    # and a node optimizer (FedAdam with drops and a crash on 2 ranks: the resume below).
    ("fedavg", "qsgd", False, 3, ["algorithm.server_optimizer=momentum", "optimizer.name=adam"]),
    # A sample of the workers evaluated; the server down in round 4 besides a worker.
    ("doublesqueeze", "sign", True, 2, ["run.eval_peers=3", SERVER_DOWN]),
    # APMSqueeze: three warm-up rounds at full precision, then compressed momentum.
    ("apmsqueeze", "topk", True, 2, ["algorithm.precondition_rounds=3"]),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded-server")


@pytest.mark.parametrize(("algorithm", "codec", "faults", "world", "extra"), CASES)
def test_the_server_family_on_ranks_equals_one_process(
    algorithm: str, codec: str, faults: bool, world: int, extra: list[str], folder: Path
) -> None:
    config = _case(algorithm, codec, faults, folder, *extra)
    got = equal_on_ranks(config, folder, f"{algorithm}-{codec}-{faults}", world)
    assert got["ranks"] == world and got["engine"] == "vectorized"
    if faults:
        assert got["traffic"]["messages_dropped"] > 0
    if SERVER_DOWN in extra:
        assert got["faults"]["down_rounds"][ODD_IDS[8]] == [[4, 4]]
    elif algorithm == "fedavg":  # only the round's messages crossed, each row once per rank
        assert 0 < got["halo_bytes"] == _round_messages(config, got["partition"], world)


def test_a_round_halo_sends_each_sender_once_per_rank_and_both_ends_agree() -> None:
    """Each rank's plan of a phase's messages: a sender's row once to each rank of its
    receivers (none to its own), in sorted order, where the receiving rank expects it."""
    owner = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    src = torch.tensor([0, 3, 6, 1, 4, 2, 5, 0, 0])  # workers to a server (row 7), and more
    dst = torch.tensor([7, 7, 7, 7, 7, 7, 7, 4, 1])
    pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
    mine = [torch.nonzero(owner == r).squeeze(1) for r in range(3)]
    halos = [round_halo(src, dst, owner, mine[r], Ranks(r, 3)) for r in range(3)]
    for r, halo in enumerate(halos):
        at = 0
        for q, count in enumerate(halo.send_counts):
            sent = mine[r][halo.send_rows[at : at + count]].tolist()
            at += count
            start = sum(halos[q].recv_counts[:r])
            assert sent == halos[q].recv_rows[start : start + count].tolist()
            wanted = {u for u, v in pairs if owner[u] == r and owner[v] == q != r}
            assert sent == sorted(wanted), (r, q)
    # Rank 0's rows 0, 3 and 6 to the server's rank, row 0 once for its three receivers.
    assert halos[0].send_counts == [0, 3, 0]


def _round_messages(config: Config, method: str, world: int) -> int:
    """The bytes a FedAvg run with no faults sends across ranks: each round, a sampled
    worker's encoded row and its example count to the server's rank (if elsewhere), and
    the server's encoded row once to each other rank of the next round's sample."""
    setup = prepare_run(config)
    graph = stack_graph(setup.graph.at(0), device=torch.device("cpu"))
    nodes = setup.graph.nodes
    owner = place(method, len(nodes), graph.src.numpy(), graph.dst.numpy(), world).owner
    codec = row_codec(setup)
    row = wire_width(codec, setup.start.numel(), setup.start.dtype)
    assert row is not None  # a codec with a row form: rows cross encoded
    rule = setup.algorithm
    server = owner[nodes.index(rule.server)]
    total = 0
    for t in range(config.run.rounds):
        sampled = [owner[nodes.index(v)] for v in rule.sample(nodes, t)]
        following = {owner[nodes.index(v)] for v in rule.sample(nodes, t + 1)}
        total += sum(row + 8 for r in sampled if r != server)
        total += row * len(following - {server})
    return total


def test_fedavg_interrupted_on_2_ranks_resumes_to_the_uninterrupted_run(folder: Path) -> None:
    """FedAdam's server state on the server's rank, a stochastic codec's generators and the
    fault counts go into each rank's checkpoint: resumed on 2 ranks, the run ends with one
    process's bits; re-sharded, the server's state, which one rank alone keeps, is refused
    in one line."""
    extra = ("run.checkpoint_every=2", "algorithm.server_optimizer=adam")
    config = _case("fedavg", "qsgd", True, folder, *extra)
    one = folder / "resume-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    out = folder / "resume-two"
    outcomes = run_world(config, out, stop=STOP_AT)
    assert outcomes[0].startswith(f"KeyboardInterrupt: after round {STOP_AT}"), outcomes
    # Re-sharded (on 1 rank here): the server optimizer's state is refused in one line.
    setup = prepare_run(config)
    net = ShardedNetwork(setup, Ranks(0, 1))
    manifest = read_manifest(out)
    assert manifest is not None
    _, parts = load_parts(out, manifest, Ranks(0, 1), setup.run_id, net.mine.numpy())
    with pytest.raises(ConfigError) as caught:
        merge_parts(net, parts, manifest.world)
    text = str(caught.value)
    assert "its rule keeps state that is not one row per peer" in text and "\n" not in text
    assert run_world(config, out, resume=True) == {0: "ok", 1: "ok"}
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert got["status"] == "completed" and got["ranks"] == 2
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    assert _records(out) == _records(one)
