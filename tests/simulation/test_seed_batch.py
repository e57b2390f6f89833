"""Seeds as a batch: ``fedcore simulate --seeds ... --batch-seeds`` (blocks of rows of one
vectorized network, ``fedcore.simulation.seed_batch``) writes each seed's folder as its
separate run does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.clitools import TINY, cli, one_line_error

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO))


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


_WALL = re.compile(r'"wall_s(econds)?": ?[-0-9.e]+')


def without_wall_times(text: str) -> str:
    """A run file's text less its wall times (the only figures a batch changes)."""
    return _WALL.sub("", text)


def sweep(capsys: pytest.CaptureFixture[str], out: Path, seeds: str, *extra: str) -> None:
    status, _, err = cli(capsys, "simulate", "-q", "--seeds", seeds, "--out", str(out), *extra)
    assert status == 0, err


CASES = {
    # the README's default algorithm and model (OPS, push-sum shares), tiny; 8 peers with
    # batches of 70: seed 2's smallest peer holds 66 examples (its batches have a mask),
    # seeds 0 and 1 hold more (no mask), so the blocks share one masked pass
    "ops": [*TINY, *("--set", "topology.nodes=8", "--set", "data.batch_size=70"), "--csv"],
    # per-row codec draws (qsgd), error memories, a node optimizer's state
    "choco-qsgd-momentum": [
        *TINY,
        *("--set", "algorithm.name='choco'", "--set", "compression.codec='qsgd'"),
        *("--set", "optimizer.name='momentum'", "--set", "topology.kind='ring'"),
    ],
    # each seed's own fault plan: lost messages (their lists in the records) and a crash
    "dpsgd-faults": [
        *TINY,
        *("--set", "algorithm.name='dpsgd'", "--set", "topology.kind='ring'"),
        *("--set", "faults.drop=0.3"),
        *("--set", 'faults.crashes=[{node="n2", at=1, back=3}]'),
    ],
    # online learning's DOG
    "dog": [*TINY, *("--set", "algorithm.name='dog'", "--set", "topology.kind='ring'")],
    # a time-varying graph (one union a round of the period), robust push-sum's per-edge
    # totals
    "ops-robust-schedule": [
        *TINY,
        *("--set", "topology.kind='one-peer-exponential'", "--set", "topology.nodes=8"),
        *("--set", "algorithm.robust=true", "--set", "faults.drop=0.2"),
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_seeds_as_a_batch_equal_separate_runs(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, batched = tmp_path / "plain", tmp_path / "batched"
    sweep(capsys, plain, "0-2", *CASES[case])
    sweep(capsys, batched, "0-2", *CASES[case], "--batch-seeds")
    digests = set()
    for k in range(3):
        one, other = plain / f"seed-{k}", batched / f"seed-{k}"
        assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in other.iterdir())
        files = {p.name for p in one.iterdir()} - {"curves.png"}  # tests draw no pictures
        assert files >= {"config.toml", "metrics.jsonl", "summary.json"}
        for name in sorted(files):
            mine = without_wall_times((other / name).read_text(encoding="utf-8"))
            assert mine == without_wall_times((one / name).read_text(encoding="utf-8")), name
        digests.add(json.dumps(read_json(other / "summary.json")["params_sha256"]))
    assert len(digests) == 3  # three seeds, three different runs
    mine, theirs = read_json(batched / "sweep.json"), read_json(plain / "sweep.json")
    assert mine["completed"] == theirs["completed"] == [0, 1, 2]
    for run, other in zip(mine["runs"], theirs["runs"], strict=True):
        assert {k: v for k, v in run["final"].items() if k != "wall_seconds"} == {
            k: v for k, v in other["final"].items() if k != "wall_seconds"
        }


def test_a_seed_that_fails_in_a_batch_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch that cannot go on (seed 1's data fails) runs its seeds one by one: each
    seed's failure is its own, as in a plain sweep."""
    out = tmp_path / "flaky"
    argv = ["simulate", "--seeds", "0-1", "--batch-seeds", "--out", str(out), *TINY]
    argv += ["--set", "data.dataset=tests.simulation.test_sweep:flaky_digits"]
    status, _, err = cli(capsys, *argv)
    assert status == 0, err
    assert "the batch stopped (" in err and "no data for seed 1); its seeds run one by" in err
    record = read_json(out / "sweep.json")
    assert (record["completed"], record["failed"]) == ([0], [1])
    assert "no data for seed 1" in record["runs"][1]["reason"]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ([], ("--batch-seeds runs the seeds of a sweep", "give --seeds")),
        (["--seeds", "0-1", "--jobs", "2"], ("drop --jobs",)),
        (["--seeds", "0-1", "--ranks", "2"], ("drop --seeds, --batch-seeds",)),
        (["--seeds", "0-1", "--engine", "messages"], ("simulate.engine = 'messages'",)),
        (["--seeds", "0-1", "--set", "algorithm.name='central'"], ("'central' is not batched",)),
        (["--seeds", "0-1", "--set", "algorithm.name='fedavg'"], ("'fedavg' is not batched",)),
        (["--seeds", "0-1", "--set", "time.step_s=0.1"], ("virtual time ([time])",)),
        (["--seeds", "0-1", "--set", "transport.mode='deadline'"], ("deadline mode",)),
        (["--seeds", "0-1", "--set", "run.checkpoint_every=2"], ("checkpoint_every",)),
    ],
)
def test_what_cannot_be_batched_is_refused_in_one_line(
    extra: list[str], needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s"
    line = one_line_error(
        capsys, ["simulate", "-q", "--batch-seeds", "--out", str(out), *extra, *TINY], *needles
    )
    if "not batched" in line:
        assert "without --batch-seeds" in line  # what to run instead
    assert not out.exists()


def test_resume_refuses_batch_seeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(
        capsys,
        ["simulate", "--resume", str(tmp_path), "--batch-seeds"],
        "drop --batch-seeds",
    )
