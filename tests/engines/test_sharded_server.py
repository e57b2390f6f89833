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

from fedcore.simulation.simulate import simulate
from tests.engines.test_sharded import SAME, _records, run_ranks
from tests.engines.test_sharded_faults import _case

CASES = [
    # FedAvg: a sample of half the workers, two local steps (GRAPHS), FedAdam's server step.
    ("fedavg", "topk", True, 2, ["algorithm.server_optimizer=adam", "algorithm.server_lr=0.5"]),
    ("fedavg", "qsgd", False, 3, ["algorithm.server_optimizer=momentum", "optimizer.name=adam"]),
    ("doublesqueeze", "sign", True, 2, []),
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
    case = f"{algorithm}-{codec}-{faults}-{world}"
    config = _case(algorithm, codec, faults, folder, *extra)
    one = folder / f"{case}-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    assert expected["engine"] == "vectorized"
    out = folder / f"{case}-ranks"
    assert run_ranks(config, world, out) == dict.fromkeys(range(world), "ok")
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert got["ranks"] == world
    for key in SAME:
        assert got.get(key) == expected.get(key), (world, key)
    if faults:
        assert got["traffic"]["messages_dropped"] > 0
    assert _records(out) == _records(one)
