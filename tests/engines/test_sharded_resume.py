"""Checkpoints of a sharded run and ``--resume``: a run on 2 ranks interrupted after a
checkpoint and resumed ends as the uninterrupted run (the one-process run's parameters,
records and figures, which 2 ranks equal); a manifest or rank file that does not fit is
refused in one line (:mod:`fedcore.simulation.rank_checkpoints`).

The ranks are forked processes, as in ``tests/engines/test_sharded.py``; the interrupt is a
:class:`KeyboardInterrupt` every rank raises at the start of the same round (what Ctrl-C
becomes in each rank).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedcore.cli import main
from fedcore.config import Config
from fedcore.data import BatchStream, Dataset
from fedcore.engines.cohort import CohortNetwork
from fedcore.engines.ranks import Ranks
from fedcore.engines.shard_reshard import merge_parts
from fedcore.engines.shard_streams import RowStreams
from fedcore.engines.sharded import ShardedNetwork
from fedcore.errors import ConfigError
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.rank_checkpoints import (
    MANIFEST,
    load_parts,
    load_rank,
    rank_file,
    read_manifest,
    verify_files,
)
from fedcore.simulation.ranks import free_port, simulate_rank
from fedcore.simulation.simulate import resume, simulate
from tests.engines.test_sharded import RANKS, SAME, _records, in_rank
from tests.engines.test_sharded_faults import _case
from tests.engines.test_vectorized import ODD_IDS

STOP_AT = 3
"""The round at whose start the interrupted run stops (after the checkpoint of round 2)."""


def _rank(
    config: Config,
    rank: int,
    world: int,
    port: int,
    out: Path,
    queue: Any,
    resume: bool,
    stop: int,
) -> None:
    torch.set_num_threads(1)
    if stop:  # Ctrl-C, as every rank takes it, at the start of round `stop`
        for network in (ShardedNetwork, CohortNetwork):
            _stop_at(network, stop)
    try:
        simulate_rank(
            config,
            Ranks(rank, world, 0, "127.0.0.1", port),
            out_dir=out,
            show_progress=False,
            threads=1,
            resume=resume,
        )
        queue.put((rank, "ok"))
    except BaseException as exc:  # reported to the test
        queue.put((rank, f"{type(exc).__name__}: {exc}"))


def _stop_at(network: Any, stop: int) -> None:
    """Make ``network``'s rounds raise :class:`KeyboardInterrupt` at the start of round
    ``stop``."""
    run_round = network.run_round

    def stopping(net: Any) -> Any:
        if net.round == stop:
            raise KeyboardInterrupt
        return run_round(net)

    network.run_round = stopping


def run_world(
    config: Config, out: Path, *, world: int = 2, resume: bool = False, stop: int = 0
) -> dict[int, str]:
    """Every rank's outcome of ``config`` on ``world`` ranks into ``out`` (``"ok"`` or its
    error): a new run, stopped at the start of round ``stop`` where given, or a resumed
    one."""
    context = RANKS  # forked from a server with no threads (tests/engines/test_sharded.py)
    queue = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=in_rank, args=(None, _rank, config, r, world, port, out, queue, resume, stop)
        )
        for r in range(world)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
        assert p.exitcode is not None, "a rank did not end"
    outcomes: dict[int, str] = {}
    while not queue.empty():
        rank, what = queue.get()
        outcomes[rank] = what
    return outcomes


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path, Path]:
    """``(config, one-process run, the 2-rank run interrupted at round STOP_AT)``."""
    folder = tmp_path_factory.mktemp("sharded-resume")
    # A stochastic codec (its generators), drops and a crash (fault counts), a node
    # optimizer's state and local steps, all resumed.
    extra = ("run.checkpoint_every=2", "optimizer.name=momentum", "run.local_steps=2")
    config = _case("dpsgd", "qsgd", True, folder, *extra)
    one = folder / "one"
    torch.set_num_threads(1)
    simulate(config, out_dir=one, show_progress=False, threads=1)
    out = folder / "two"
    outcomes = run_world(config, out, stop=STOP_AT)
    assert outcomes[0].startswith("KeyboardInterrupt: after round 3 of 6"), outcomes
    assert f"continue with: fedcore simulate --resume {out}" in outcomes[0]
    assert outcomes[1] == "KeyboardInterrupt: ", outcomes
    return config, one, out


def test_resume_after_an_interrupt_on_2_ranks_equals_the_uninterrupted_run(
    stopped: tuple[Config, Path, Path], tmp_path: Path
) -> None:
    config, one, stopped_out = stopped
    out = tmp_path / "two"
    shutil.copytree(stopped_out, out)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "interrupted" and summary["rounds_completed"] == STOP_AT
    manifest = json.loads((out / "checkpoints" / MANIFEST).read_text(encoding="utf-8"))
    assert (manifest["round"], manifest["world"]) == (2, 2)
    assert run_world(config, out, resume=True) == {0: "ok", 1: "ok"}
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    expected = json.loads((one / "summary.json").read_text(encoding="utf-8"))
    assert got["status"] == "completed" and got["ranks"] == 2
    assert got["faults"] and got["params_sha256"] == expected["params_sha256"]
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    assert _records(out) == _records(one)


@pytest.mark.parametrize("world", [1, 4])
def test_a_2_rank_run_resumed_on_another_number_of_ranks_equals_the_uninterrupted_run(
    stopped: tuple[Config, Path, Path], tmp_path: Path, world: int
) -> None:
    """Re-sharding: each of the new ranks reads the rows it holds now (the placement of a
    fresh run on that many ranks) from the 2 ranks' files: their rule state, data places,
    codec generators and in-edge fault counts, the halo bytes added up on the new rank 0.
    The run ends with the uninterrupted run's bits; its next checkpoints are of the new
    ranks."""
    config, one, stopped_out = stopped
    out = tmp_path / "resharded"
    shutil.copytree(stopped_out, out)
    assert run_world(config, out, world=world, resume=True) == dict.fromkeys(range(world), "ok")
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    expected = json.loads((one / "summary.json").read_text(encoding="utf-8"))
    assert got["status"] == "completed" and got["ranks"] == world
    assert got["faults"] and got["params_sha256"] == expected["params_sha256"]
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    assert _records(out) == _records(one)
    manifest = read_manifest(out)
    assert manifest is not None and (manifest.round, manifest.world) == (4, world)


def _other_generator(network: dict[str, Any]) -> None:
    network["torch_rng"] = torch.Generator().manual_seed(12345).get_state()


def _state_not_per_row(network: dict[str, Any]) -> None:
    fields = network["state"]["fields"]
    fields["x"] = fields["x"][:-1]


def _more_state(network: dict[str, Any]) -> None:
    network["edges"] = torch.zeros(3)


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_other_generator, "its ranks' torch generators differ"),
        (_state_not_per_row, "its rule keeps state that is not one row per peer"),
        (_more_state, "it holds 'edges', not placed by row"),
    ],
)
def test_a_checkpoint_that_cannot_be_resharded_is_refused_in_one_line(
    stopped: tuple[Config, Path, Path], damage: Any, says: str
) -> None:
    """Ranks whose torch generators differ (a rank drew from it for its own rows), a rule
    state with a field that is not one row per peer, or a rank state this fedcore does
    not place by row: no re-sharding can be exact, so it is refused with the number of
    ranks to use."""
    config, _, stopped_out = stopped
    setup = prepare_run(config, hosts_all=True, simulated=True)
    net = ShardedNetwork(setup, Ranks(0, 1))
    manifest = read_manifest(stopped_out)
    assert manifest is not None
    _, parts = load_parts(stopped_out, manifest, Ranks(0, 1), setup.run_id, net.mine.numpy())
    assert [part.rank for part in parts] == [0, 1]
    merge_parts(net, parts, manifest.world)  # as they are: they fit
    damage(parts[1].network)
    with pytest.raises(ConfigError) as caught:
        merge_parts(net, parts, manifest.world)
    text = str(caught.value)
    assert says in text and "resume with --ranks 2" in text and "\n" not in text, text


def _missing(out: Path) -> None:
    rank_file(out, 1, 2, 2).unlink()


def _truncated(out: Path) -> None:
    path = rank_file(out, 1, 2, 2)
    path.write_bytes(path.read_bytes()[:-10])


def _swapped(out: Path) -> None:  # rank 1's file replaced by another of the same size
    path = rank_file(out, 1, 2, 2)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def _three_ranks(out: Path) -> None:  # a manifest of 3 ranks in a folder of 2 ranks' files
    where = out / "checkpoints" / MANIFEST
    manifest = json.loads(where.read_text(encoding="utf-8"))
    files = [*manifest["files"], manifest["files"][1]]
    where.write_text(json.dumps({**manifest, "world": 3, "files": files}), encoding="utf-8")


def _manifest(change: dict[str, Any]) -> Any:
    def damage(out: Path) -> None:
        where = out / "checkpoints" / MANIFEST
        manifest = json.loads(where.read_text(encoding="utf-8"))
        where.write_text(json.dumps({**manifest, **change}), encoding="utf-8")

    return damage


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_missing, "rank 1 of 2's checkpoint of round 2, '{out}/checkpoints/rank-1-of-2"),
        (_truncated, "bytes, not the"),
        (_swapped, "is not the file the manifest names"),
        (_manifest({"world": 3}), "it names 2 files for 3 ranks"),
        (_three_ranks, "rank 0's file is not named 'rank-0-of-3/round-000002.ckpt'"),
        (_manifest({"kind": "other"}), "it does not say it is one"),
        (_manifest({"round": 0}), "not whole numbers >= 1"),
        (_manifest({"run_id": "f" * 64}), "belong to another run than its config.toml"),
        (_manifest({"rows": [[0, 1]]}), "its rows are not 2 lists of whole numbers"),
    ],
)
def test_a_resume_that_does_not_fit_is_refused_in_one_line(
    stopped: tuple[Config, Path, Path], tmp_path: Path, damage: Any, says: str
) -> None:
    stopped_out = stopped[2]
    out = tmp_path / "two"
    shutil.copytree(stopped_out, out)
    damage(out)
    with pytest.raises(ConfigError) as caught:
        manifest = read_manifest(out)
        assert manifest is not None
        verify_files(manifest)  # what the launcher checks of every rank's file
        run_id = json.loads((stopped_out / "checkpoints" / MANIFEST).read_text())["run_id"]
        for rank in range(2):  # what each rank checks of its own
            load_rank(out, manifest, Ranks(rank, 2), run_id)
    text = str(caught.value)
    assert says.format(out=out) in text and "\n" not in text, text


def test_what_a_sharded_resume_does_not_run_is_refused_in_one_line(
    stopped: tuple[Config, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, one, stopped_out = stopped
    out = tmp_path / "two"
    shutil.copytree(stopped_out, out)
    manifest = read_manifest(out)
    assert manifest is not None
    with pytest.raises(ConfigError, match="start 2 ranks"):  # a rank's own file, of 3
        load_rank(out, manifest, Ranks(2, 3), manifest.run_id)
    with pytest.raises(ConfigError, match="is a sharded run's"):  # not on one process
        resume(out, show_progress=False)
    assert main(["simulate", "--ranks", "2", "--resume", str(out), "--set", "run.rounds=9"]) == 2
    assert "drop --set" in capsys.readouterr().err
    assert main(["simulate", "--ranks", "2", "--resume", str(one)]) == 2
    assert "nothing to resume" in capsys.readouterr().err  # completed
    shutil.rmtree(out / "checkpoints")
    (out / "summary.json").unlink()
    assert main(["simulate", "--ranks", "2", "--resume", str(out)]) == 2
    assert "holds a one-process run: resume it without --ranks" in capsys.readouterr().err


def test_a_resumed_rank_reads_its_streams_on_from_where_they_were(tmp_path: Path) -> None:
    """An online source of one stream a peer (:func:`varied_source`), a peer that crashed,
    2 ranks resumed on 3: each new rank reads its rows' streams forward from where they
    were, and the run ends as one process's."""
    crash = f"faults.crashes=[{{node={ODD_IDS[3]!r},at=1,back=3}}]"
    stream = "data.stream=tests.engines.test_sharded_resume:varied_source"
    config = _case("dog", "fp32", False, tmp_path, stream, crash, "run.checkpoint_every=2")
    one = tmp_path / "one"
    torch.set_num_threads(1)
    simulate(config, out_dir=one, show_progress=False, threads=1)
    out = tmp_path / "two"
    assert run_world(config, out, stop=STOP_AT)[1] == "KeyboardInterrupt: "
    # Re-sharded on 3 ranks: each new rank reads its rows' streams forward.
    assert run_world(config, out, world=3, resume=True) == dict.fromkeys(range(3), "ok")
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    expected = json.loads((one / "summary.json").read_text(encoding="utf-8"))
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    assert _records(out) == _records(one)


class _Varied:
    """A user's source of one stream a peer (no ``batches``): 32 random examples of 10
    features, each peer's own shuffle, two a batch."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(32, 10, generator=gen)
        y = (x[:, 0] > 0).long()
        self.dataset = Dataset(
            name="varied", x_train=x, y_train=y, x_test=x, y_test=y, num_classes=2
        )

    def stream(self, node: int) -> BatchStream:
        return BatchStream(self.dataset.x_train, self.dataset.y_train, batch_size=2, seed=node)


def varied_source(**_: Any) -> _Varied:
    return _Varied()


@pytest.mark.parametrize(
    "read",
    [torch.tensor([-1, 2]), torch.tensor([1, 2, 3]), torch.tensor([]), torch.tensor([[1, 2]])],
)
def test_a_streams_state_that_does_not_fit_is_refused(read: torch.Tensor) -> None:
    """A rank's stream counts of another length or shape, or negative, are refused (the
    rank's checkpoint loader turns the refusal into its one line), and nothing is read."""
    streams = RowStreams(_Varied(), np.array([0, 2]), 4)
    with pytest.raises(ValueError, match="counts of batches read"):
        streams.load_state_dict({"read": read}, [0, 2])
    assert streams.read.tolist() == [0, 0, 0, 0]
