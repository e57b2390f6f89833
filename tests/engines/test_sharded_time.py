"""Virtual time on a sharded run (``[time]``, ``transport.mode = "deadline"``,
:mod:`fedcore.engines.shard_time`) against one process: every rank advances the same clock
over the whole graph, so the ranks end with the one-process run's parameters, traffic (late
and missing messages included), fault tables, per-node records (each peer's clock and
compute seconds) and the summary's ``time`` block; with drops and a crash, unannounced
faults in deadline mode, and a run resumed on 2 ranks, the clock read from the ranks'
checkpoints (and re-sharded: read by one rank from the 2 ranks' files). What stays
refused is refused in one line.

The ranks are forked processes, as in ``tests/engines/test_sharded.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fedcore.config import Config, TimeConfig, load_config
from fedcore.engines.clock import clock_state, load_clock_state
from fedcore.engines.ranks import Ranks
from fedcore.engines.shard_reshard import merge_parts
from fedcore.engines.sharded import ShardedNetwork, config_refusal
from fedcore.errors import ConfigError
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.rank_checkpoints import load_parts, read_manifest
from fedcore.simulation.simulate import simulate
from fedcore.timing import PhaseTraffic, RoundClock, TimeModel
from tests.engines.test_sharded import SAME, _records, equal_on_ranks
from tests.engines.test_sharded_faults import FAULTS, _case
from tests.engines.test_sharded_resume import STOP_AT, run_world

TIME = [
    "time.step_s=0.1",
    "time.compute=lognormal",
    "time.slow_fraction=0.3",
    "time.slow_factor=6",
    "time.latency_s=0.05",
    "time.bandwidth_mb_s=0.01",
]
"""Steps of lognormal seconds (drawn by each peer's step count), a third of the peers six
times slower, links with a latency and a bandwidth: some messages come after their
receiver's deadline."""

DEADLINE = ["transport.mode=deadline", "transport.deadline_s=0.3"]

CASES = [
    ("dpsgd", [*TIME, *DEADLINE, *FAULTS, "run.target_accuracy=0.5"], 2),
    ("dog", [*TIME, *DEADLINE, *FAULTS, "faults.announce=false"], 3),
    ("ops", [*TIME, *FAULTS, "faults.delay_s=0.2"], 2),
    ("dpsgd", TIME, 2),
]
"""D-PSGD in deadline mode with drops, a partition and a crash (and the virtual time it
first reached a target accuracy); DOG with those lost
silently (3 ranks); push-sum (strict mode: it holds in deadline mode) with a fault plan's
delays; ``[time]`` alone. Deadline mode without a plan: the resumed run below."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded-time")


def _same(out: Path, one: Path, world: int) -> None:
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    expected = json.loads((one / "summary.json").read_text(encoding="utf-8"))
    assert got["status"] == "completed" and got["ranks"] == world
    for key in (*SAME, "time", "time_to_target"):
        assert got.get(key) == expected.get(key), (world, key)
    assert _records(out) == _records(one), world


@pytest.mark.parametrize(("algorithm", "extra", "world"), CASES)
def test_virtual_time_on_ranks_equals_one_process(
    algorithm: str, extra: list[str], world: int, folder: Path
) -> None:
    config = _case(algorithm, "fp32", False, folder, *extra)
    assert config_refusal(config) is None
    case = f"{algorithm}-{CASES.index((algorithm, extra, world))}"
    got = equal_on_ranks(config, folder, case, world)
    expected = json.loads((folder / f"{case}-one" / "summary.json").read_text(encoding="utf-8"))
    assert expected["engine"] == "vectorized" and got["ranks"] == world
    for key in ("time", "time_to_target"):  # the virtual seconds, each peer's utilisation
        assert got.get(key) == expected.get(key), key
    if "time.step_s=0.1" in extra:
        assert expected["time"]["virtual_seconds"] > 0
    if "transport.mode=deadline" in extra:
        assert expected["traffic"]["messages_late"] > 0
    if "run.target_accuracy=0.5" in extra:
        assert expected["time_to_target"]["vtime"] > 0


def test_a_resumed_run_reads_its_clock(folder: Path, tmp_path: Path) -> None:
    """Deadline mode without a fault plan (only late messages go missing), interrupted on
    2 ranks after a checkpoint and resumed: the figures are the uninterrupted run's; the
    checkpoint re-sharded on one rank holds the clock of its round (no replay)."""
    extra = [*TIME, *DEADLINE, "run.checkpoint_every=2"]
    config = _case("dpsgd", "fp32", False, folder, *extra)
    one = folder / "resume-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    assert expected["traffic"]["messages_late"] > 0
    stopped = folder / "resume-stopped"
    outcomes = run_world(config, stopped, stop=STOP_AT)
    assert outcomes[0].startswith(f"KeyboardInterrupt: after round {STOP_AT}"), outcomes
    out = tmp_path / "resumed"
    shutil.copytree(stopped, out)
    assert run_world(config, out, resume=True) == {0: "ok", 1: "ok"}
    _same(out, one, 2)
    # Every rank's file holds the clock: one rank reads it from the 2 ranks' files
    # (re-sharded) and goes on from the checkpoint's round, with no replay; clocks
    # that differ cannot be re-sharded.
    setup = prepare_run(config, hosts_all=True, simulated=True)  # no clock: the net makes it
    net = ShardedNetwork(setup, Ranks(0, 1))
    manifest = read_manifest(stopped)
    assert manifest is not None and manifest.round == 2
    _, parts = load_parts(stopped, manifest, Ranks(0, 1), setup.run_id, net.mine.numpy())
    net.load_state_dict(merge_parts(net, parts, 2))
    assert net.time is not None and net.time.clock.clock.round == 2
    assert float(net.time.clock.clock.clock.max()) > 0
    parts[1].network["clock"]["busy"][0] += 1.0
    with pytest.raises(ConfigError, match="its ranks' virtual clocks differ"):
        merge_parts(net, parts, 2)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (["algorithm.name=ops", *DEADLINE], "ops holds a silent peer's pushes in deadline mode"),
        (["faults.drop=0.1", "faults.announce=false", *TIME], "needs deadline mode"),
        (["algorithm.name=ops", "time.step_s=0.1"], None),
        (["algorithm.name=fedavg", "time.step_s=0.1"], "with fedavg is not sharded yet"),
        (["algorithm.name=doublesqueeze", *DEADLINE], "with doublesqueeze is not sharded"),
        (["algorithm.name=rps", *DEADLINE, "faults.drop=1", "faults.announce=false"], None),
    ],
)
def test_what_virtual_time_still_refuses(settings: list[str], says: str | None) -> None:
    config: Config = load_config(None, settings)
    why = config_refusal(config)
    assert why == says or (says is not None and why is not None and says in why), why


@pytest.mark.parametrize("periods", [True, False])
def test_a_clock_goes_on_from_its_state_exactly(periods: bool) -> None:
    """A clock loaded from another's :func:`~fedcore.engines.clock.clock_state` (the
    peers' times, busy seconds, steps; with on/off periods, which it need not keep)
    advances as that one does, bit for bit; a state of other peers is refused."""
    nodes = [f"p{i}" for i in range(5)]
    keys = {"step_s": 0.3, "compute": "lognormal", "latency_s": 0.01, "bandwidth_mb_s": 1.0}
    if periods:
        keys |= {"on_s": 1.0, "off_s": 0.5}

    def clock() -> RoundClock:
        model = TimeModel(TimeConfig(**keys), run_seed=1, nodes=nodes)  # type: ignore[arg-type]
        return RoundClock(model, steps=2, deadline_s=0.4)

    src, dst = torch.tensor([0, 1, 2, 3, 4, 0]), torch.tensor([1, 2, 3, 4, 0, 2])
    every = torch.ones(6, dtype=torch.bool)
    traffic = [PhaseTraffic(src, dst, torch.full((6,), 1000), every, every)]
    up = torch.ones(5, dtype=torch.bool)
    first, second = clock(), clock()
    for t in range(3):
        first.advance(t, up, up, traffic)
    load_clock_state(second, clock_state(first))
    for t in range(3, 6):
        a, b = first.advance(t, up, up, traffic), second.advance(t, up, up, traffic)
        assert torch.equal(a.end, b.end) and torch.equal(a.late[0], b.late[0])
    with pytest.raises(ValueError, match="other peers"):
        load_clock_state(second, {**clock_state(first), "clock": torch.zeros(4)})
