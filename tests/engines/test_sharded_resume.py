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

import pytest
import torch

from fedcore.cli import main
from fedcore.config import Config
from fedcore.data import BatchStream, Dataset
from fedcore.engines.ranks import Ranks
from fedcore.engines.sharded import ShardedNetwork
from fedcore.errors import ConfigError
from fedcore.simulation.rank_checkpoints import (
    MANIFEST,
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
    config: Config, rank: int, port: int, out: Path, queue: Any, resume: bool, stop: int
) -> None:
    torch.set_num_threads(1)
    if stop:  # Ctrl-C, as every rank takes it, at the start of round `stop`
        run_round = ShardedNetwork.run_round

        def stopping(net: ShardedNetwork) -> Any:
            if net.round == stop:
                raise KeyboardInterrupt
            return run_round(net)

        ShardedNetwork.run_round = stopping  # type: ignore[method-assign]
    try:
        simulate_rank(
            config,
            Ranks(rank, 2, 0, "127.0.0.1", port),
            out_dir=out,
            show_progress=False,
            threads=1,
            resume=resume,
        )
        queue.put((rank, "ok"))
    except BaseException as exc:  # reported to the test
        queue.put((rank, f"{type(exc).__name__}: {exc}"))


def _two_ranks(config: Config, out: Path, *, resume: bool = False, stop: int = 0) -> dict[int, str]:
    context = RANKS  # forked from a server with no threads (tests/engines/test_sharded.py)
    queue = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=in_rank, args=(None, _rank, config, r, port, out, queue, resume, stop)
        )
        for r in range(2)
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
    outcomes = _two_ranks(config, out, stop=STOP_AT)
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
    assert _two_ranks(config, out, resume=True) == {0: "ok", 1: "ok"}
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    expected = json.loads((one / "summary.json").read_text(encoding="utf-8"))
    assert got["status"] == "completed" and got["ranks"] == 2
    assert got["faults"] and got["params_sha256"] == expected["params_sha256"]
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    assert _records(out) == _records(one)


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


def test_another_number_of_ranks_is_refused_with_the_one_to_use(
    stopped: tuple[Config, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, one, stopped_out = stopped
    out = tmp_path / "two"
    shutil.copytree(stopped_out, out)
    assert main(["simulate", "--ranks", "3", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedcore: error: the checkpoints in") and "\n" not in err
    assert "written by 2 ranks" in err and "resume with --ranks 2" in err
    manifest = read_manifest(out)
    assert manifest is not None
    with pytest.raises(ConfigError, match="start 2 ranks"):  # each of torchrun's 3 ranks
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
    """An online source of one stream a peer (:func:`varied_source`), a peer that crashed:
    each resumed rank reads its rows' streams forward, and the run ends as one process's."""
    crash = f"faults.crashes=[{{node={ODD_IDS[3]!r},at=1,back=3}}]"
    stream = "data.stream=tests.engines.test_sharded_resume:varied_source"
    config = _case("dog", "fp32", False, tmp_path, stream, crash, "run.checkpoint_every=2")
    one = tmp_path / "one"
    torch.set_num_threads(1)
    simulate(config, out_dir=one, show_progress=False, threads=1)
    out = tmp_path / "two"
    assert _two_ranks(config, out, stop=STOP_AT)[1] == "KeyboardInterrupt: "
    assert _two_ranks(config, out, resume=True) == {0: "ok", 1: "ok"}
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
