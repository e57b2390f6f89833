"""The vectorized engine sharded over torch.distributed ranks (gloo on 127.0.0.1) against one
process: R = 1, 2 and 3 ranks end with the one-process run's parameters (``params_sha256``),
traffic, byte counts, evaluations and per-node records, on a random graph with odd ids (the
rules whose state is per edge: ``tests/engines/test_sharded_edges.py``; the server family:
``tests/engines/test_sharded_server.py``); what
a sharded run cannot run yet is refused in one line before any rank starts; a rank that dies
stops the others within the group's timeout. Codecs and fault plans on ranks:
``tests/engines/test_sharded_faults.py``.

The ranks here are processes forked from a fork server (:data:`RANKS`) that call
:func:`fedcore.simulation.ranks.simulate_rank`
(no interpreter start); one test runs ``fedcore simulate --ranks 2`` end to end.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore import topology
from fedcore.cli import main
from fedcore.config import Config, load_config
from fedcore.engines.partition import (
    METIS_MISSING,
    cut_fraction,
    halo_rows,
    metis_available,
    place,
)
from fedcore.engines.ranks import Ranks, blocks, from_environment, join
from fedcore.engines.shard_server import SERVER_ALGORITHMS
from fedcore.engines.sharded import (
    EDGE_ALGORITHMS,
    SHARDED_ALGORITHMS,
    config_refusal,
    plan_halo,
    setup_refusal,
)
from fedcore.engines.stacked_graph import stack_graph
from fedcore.errors import ConfigError
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.simulation.ranks import LOST, _cause, _Child, free_port, simulate_rank
from fedcore.simulation.simulate import simulate
from tests.engines.test_vectorized import GRAPHS, ODD_IDS, odd_graph

ROUNDS = 6


def _config(algorithm: str, folder: Path, *extra: str) -> Config:
    settings = [
        f"run.rounds={ROUNDS}",
        "run.eval_every=3",
        f"algorithm.name={algorithm}",
        "algorithm.lr=0.3",
        "transport.strict_timeout_s=120",
        *odd_graph(algorithm, folder),
        *extra,
    ]
    return load_config(None, settings)


def _rank(config: Config, rank: int, world: int, port: int, out: Path, queue: Any) -> None:
    torch.set_num_threads(1)
    try:
        simulate_rank(
            config,
            Ranks(rank, world, 0, "127.0.0.1", port),
            out_dir=out,
            show_progress=False,
            threads=1,
        )
        queue.put((rank, "ok"))
    except BaseException as exc:  # reported to the test
        queue.put((rank, f"{type(exc).__name__}: {exc}"))


def _dying_rank(config: Config, rank: int, world: int, port: int, out: Path, queue: Any) -> None:
    """A rank that joins the others and dies at once (as a killed process does)."""
    join(Ranks(rank, world, 0, "127.0.0.1", port), 120)
    os._exit(3)


def _hanging_rank(config: Config, rank: int, world: int, port: int, out: Path, queue: Any) -> None:
    """A rank that joins the others and then never answers (the test stops it)."""
    join(Ranks(rank, world, 0, "127.0.0.1", port), 120)  # waits for rank 0's set-up
    time.sleep(60)


RANKS = multiprocessing.get_context("forkserver")
"""How the tests start ranks: forked from a server process that imported fedcore and this
module and holds nothing else. A fork of the test process itself inherits its objects: in
one CI run a rank's garbage collector met a gRPC object left by an earlier test, whose
release spun forever in the child (where gRPC's threads do not exist), before the rank
met the others."""
RANKS.set_forkserver_preload(["fedcore", "networkx", "tests.engines.test_sharded"])


def _no_curves() -> None:
    """What ``tests/conftest.py`` does in the test process, done in a rank's: a finished run
    leaves out its ``curves.png`` (matplotlib's import and a drawing, 1.5 s of each rank)."""
    from fedcore import plotting

    draw = plotting.plot_runs

    def plot_runs(run_dirs: Any, out: Path, **options: Any) -> Path:
        if options or [Path(d) for d in run_dirs] != [out.parent] or out.name != "curves.png":
            return draw(run_dirs, out, **options)
        return out

    plotting.plot_runs = plot_runs


def in_rank(prepare: Callable[[], None] | None, target: Callable[..., None], *args: Any) -> None:
    """A rank's process (:data:`RANKS`): no curves, ``prepare()`` (what a test changed in its
    own process, such as a patched builder, done again here), then ``target(*args)``."""
    _no_curves()
    if prepare is not None:
        prepare()
    target(*args)


def run_ranks(
    config: Config,
    world: int,
    out: Path,
    odd: Any = None,
    which: int = 1,
    prepare: Callable[[], None] | None = None,
) -> dict[int, str]:
    """Every rank's outcome (``"ok"`` or its error), the ranks started by :data:`RANKS`;
    rank ``which`` runs ``odd`` instead, if given (and is stopped once the others end);
    ``prepare`` runs first in every rank."""
    context = RANKS
    queue = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=in_rank,
            args=(
                prepare,
                odd if odd is not None and r == which else _rank,
                config,
                r,
                world,
                port,
                out,
                queue,
            ),
        )
        for r in range(world)
    ]
    for p in processes:
        p.start()
    for r, p in enumerate(processes):
        if odd is None or r != which:
            p.join(timeout=120)
            assert p.exitcode is not None, "a rank did not end"
    if odd is not None:
        processes[which].terminate()
        processes[which].join()
    outcomes: dict[int, str] = {}
    while not queue.empty():
        rank, what = queue.get()
        outcomes[rank] = what
    return outcomes


def _edges(setup: RunSetup) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The non-self edges of ``setup``'s graph as global rows (what every rank reads)."""
    graph = stack_graph(setup.graph.at(0), device=torch.device("cpu"))
    return graph.src.numpy(), graph.dst.numpy()


def _records(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    for r in records:
        r.pop("wall_s", None)
    return records


SAME = (
    "params_sha256",
    "traffic",
    "final",
    "status",
    "nodes",
    "rounds",
    "rounds_completed",
    "missing_rounds",
    "faults",
    "topology",
)


def equal_on_ranks(config: Config, folder: Path, name: str, world: int = 2) -> dict[str, Any]:
    """Run ``config`` in one process and on ``world`` ranks (folders ``name-one`` and
    ``name-<world>`` in ``folder``), assert the ranks end with one process's figures and
    records, and return the ranks' summary."""
    one = folder / f"{name}-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    out = folder / f"{name}-{world}"
    assert run_ranks(config, world, out) == dict.fromkeys(range(world), "ok")
    got: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for key in SAME:
        assert got.get(key) == expected.get(key), (world, key)
    assert _records(out) == _records(one), world
    return got


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded")


@pytest.mark.parametrize(
    "algorithm",
    [a for a in SHARDED_ALGORITHMS if a not in (*EDGE_ALGORITHMS, *SERVER_ALGORITHMS)],
)
def test_ranks_equal_one_process(algorithm: str, folder: Path) -> None:
    config = _config(algorithm, folder, *(s for s in GRAPHS[algorithm] if "topology" not in s))
    one = folder / f"{algorithm}-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    assert expected["engine"] == "vectorized"
    for world in (1, 2, 3):
        out = folder / f"{algorithm}-{world}"
        assert run_ranks(config, world, out) == dict.fromkeys(range(world), "ok")
        got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert got["ranks"] == world
        assert got["partition"] in ("graph", "blocks")  # auto; "blocks" where they cut fewer
        for key in SAME:
            assert got.get(key) == expected.get(key), (world, key)
        assert _records(out) == _records(one), world


@pytest.mark.parametrize("algorithm", ["ops", "dpsgd"])
def test_ranks_on_blocks_or_a_graph_partition_equal_one_process(
    algorithm: str, folder: Path
) -> None:
    """The same bits whichever peers a rank holds: contiguous blocks, and the graph
    partition, whose ranks hold rows that are not contiguous here (two and three ranks)."""
    extra = [s for s in GRAPHS[algorithm] if "topology" not in s]
    config = _config(algorithm, folder, *extra)
    setup = prepare_run(config)
    src, dst = _edges(setup)
    n = len(setup.graph.nodes)
    one = folder / f"{algorithm}-placed-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    for method, world in (("blocks", 2), ("blocks", 3), ("graph", 2)):
        placed = place(method, n, src, dst, world)
        assert placed.method == method
        if method == "graph":
            assert any(np.any(np.diff(rows) != 1) for rows in placed.rows)  # not contiguous
        out = folder / f"{algorithm}-{method}-{world}"
        placed_config = _config(algorithm, folder, *extra, f"simulate.partition={method}")
        assert run_ranks(placed_config, world, out) == dict.fromkeys(range(world), "ok")
        got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        assert got["partition"] == method
        assert got["cut_fraction"] == cut_fraction(src, dst, placed.owner)
        for key in SAME:
            assert got.get(key) == expected.get(key), (method, world, key)
        assert _records(out) == _records(one), (method, world)


def test_a_sample_of_peers_on_ranks_equals_one_process(folder: Path) -> None:
    """``run.eval_peers``: each rank evaluates its share of the sample (rows that are not
    contiguous on the graph partition), and the records are one process's, bit for bit."""
    extra = [s for s in GRAPHS["dpsgd"] if "topology" not in s]
    config = _config("dpsgd", folder, *extra, "run.eval_peers=5", "simulate.partition=graph")
    one = folder / "sample-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    assert expected["final"]["eval_peers"]["sampled"] == 5
    for world in (3,):  # R = 1, 2, 3 of every peer: test_ranks_equal_one_process
        out = folder / f"sample-{world}"
        assert run_ranks(config, world, out) == dict.fromkeys(range(world), "ok")
        got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        for key in SAME:
            assert got.get(key) == expected.get(key), (world, key)
        assert _records(out) == _records(one), world


@pytest.mark.parametrize("method", ["blocks", "graph", "interleaved"])
def test_the_halo_sends_each_boundary_row_once_per_rank(method: str) -> None:
    rng = np.random.default_rng(0)
    n = 11
    pairs = {(int(u), int(v)) for u, v in rng.integers(0, n, (40, 2)) if u != v}
    src = np.array([u for u, _ in sorted(pairs)], dtype=np.int64)
    dst = np.array([v for _, v in sorted(pairs)], dtype=np.int64)
    if method == "interleaved":  # any sorted rows per rank, not the partitioner's
        shards = [np.arange(r, n, 3, dtype=np.int64) for r in range(3)]
    else:
        shards = place(method, n, src, dst, 3).rows
    if method == "blocks":
        assert (
            [(int(r[0]), int(r[-1]) + 1) for r in shards]
            == blocks(n, 3)
            == [
                (0, 4),
                (4, 8),
                (8, 11),
            ]
        )
    owner = {int(u): r for r, rows in enumerate(shards) for u in rows}
    halos = [plan_halo(src, dst, shards, r) for r in range(3)]
    crossing = 0
    for r, rows in enumerate(shards):
        at = 0
        for q, count in enumerate(halos[r].send_counts):
            sent = rows[halos[r].send_rows[at : at + count].numpy()]  # local -> global
            at += count
            # What r sends q is what q expects from r, each row once, sorted.
            start = sum(halos[q].recv_counts[:r])
            assert sent.tolist() == halos[q].recv_rows[start : start + count].tolist()
            needed = sorted({u for u, v in pairs if owner[u] == r and owner[v] == q != r})
            assert sent.tolist() == needed
            crossing += count
    assert crossing == halo_rows(src, dst, np.array([owner[i] for i in range(n)]), 3)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("algorithm.name='fedbuff'", "not sharded yet"),
        ("simulate.device='cuda'", "CPU"),
        ("simulate.engine='messages'", "one process"),
        ("transport.mode='deadline'", "deadline mode"),
    ],
)
def test_what_is_not_sharded_is_refused_in_one_line(
    setting: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_config(None, [setting])
    why = config_refusal(config)
    assert why is not None and says in why
    # Before any rank starts: the launcher answers at once.
    assert main(["simulate", "--ranks", "2", "--quiet", "--set", setting]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a sharded run cannot run this config" in err[0] and says in err[0]


def test_a_sharded_run_is_one_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--ranks", "2", "--seeds", "0-1"]) == 2
    assert main(["simulate", "--ranks", "2", "--resume", "somewhere"]) == 2
    assert main(["simulate", "--ranks", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "drop --seeds" in err[0] and "holds no run" in err[1], err


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("ops", ["optimizer.name=adam", "run.local_steps=2"]),
        ("dpsgd", ["optimizer.name=lamb", "optimizer.weight_decay=0.01"]),
    ],
)
def test_node_optimizers_and_local_steps_on_ranks_equal_one_process(
    algorithm: str, extra: list[str], folder: Path
) -> None:
    """Each row's optimizer state and local steps are its own: 2 ranks (on the graph
    partition, rows that are not contiguous) end with one process's bits; LAMB's norms run
    over a row's own layers."""
    graph = [s for s in GRAPHS[algorithm] if "topology" not in s]
    config = _config(algorithm, folder, *graph, *extra, "simulate.partition=graph")
    equal_on_ranks(config, folder, f"{algorithm}-optimizer")


@pytest.mark.parametrize(
    "stream",
    [
        # The synthetic stream gives a round's batches at once; a crash puts a peer a batch
        # behind the others (two groups of positions), and the regret replays every stream.
        ["data.stream=synthetic", "model.name=logreg", "run.regret=true", "run.checkpoint_every=4"],
        # A user's source of one stream a peer (tests/test_streams.py).
        ["data.stream=tests.test_streams:make_source"],
    ],
)
def test_online_streams_on_ranks_equal_one_process(stream: list[str], folder: Path) -> None:
    """Each rank draws its own rows' batches, as one process draws them."""
    crash = f"faults.crashes=[{{node={ODD_IDS[3]!r},at=1,back=3}}]"
    graph = [s for s in GRAPHS["dog"] if "topology" not in s]
    config = _config("dog", folder, *graph, *stream, crash)
    name = stream[0].rpartition(":")[2].rpartition("=")[2]
    got = equal_on_ranks(config, folder, f"stream-{name}")
    if "run.regret=true" in stream:  # "final" is compared: the regret is one process's
        assert got["final"]["dynamic_regret"] > 0


def test_a_users_rule_on_ranks_equals_one_process(folder: Path) -> None:
    """A user's rule by import path (the example's momentum gossip) runs stacked on each
    rank as on one process, a peer crashed on the way; a per-message algorithm (no rule)
    is refused by every rank before it joins."""
    path = "examples.user_algorithm.momentum_gossip:MomentumGossip"
    crash = f"faults.crashes=[{{node={ODD_IDS[3]!r},at=1,back=3}}]"
    graph = [s for s in GRAPHS["dpsgd"] if "topology" not in s]
    config = _config("dpsgd", folder, *graph, f"algorithm.name={path}", "algorithm.beta=0.5", crash)
    assert config_refusal(config) is None
    equal_on_ranks(config, folder, "user")
    other = "tests.algorithms.test_user_algorithm:MyCentral"
    setup = prepare_run(load_config(None, [f"algorithm.name={other}", "topology.nodes=4"]))
    why = setup_refusal(setup)
    assert why is not None and "has no batched form" in why


def test_torchrun_environment_is_read() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert from_environment(env) == Ranks(1, 2, 0, "10.0.0.1", 29500)
    assert from_environment({}) is None
    with pytest.raises(ConfigError, match="not MASTER_PORT"):
        from_environment({k: v for k, v in env.items() if k != "MASTER_PORT"})
    with pytest.raises(ConfigError, match="not a rank"):
        from_environment({**env, "RANK": "2"})


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"RANK": "abc"}, "RANK = 'abc' is not a whole number"),
        ({"RANK": "-1"}, "RANK = '-1' is not a whole number"),
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE = '-1' is not a whole number"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, "not a rank of WORLD_SIZE = 0"),
        ({"RANK": "5"}, "RANK = 5 is not a rank of WORLD_SIZE = 2"),
        ({"WORLD_SIZE": "9" * 40}, "is not a whole number"),
        ({"MASTER_PORT": "99999"}, "MASTER_PORT = 99999 is not a TCP port"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT = 0 is not a TCP port"),
        ({"LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE = 'x' is not a whole number"),
        ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "do not fit"),
        ({"LOCAL_WORLD_SIZE": "3"}, "do not fit"),
        ({"MASTER_ADDR": "a b"}, "is not a host name"),
    ],
)
def test_a_bad_torchrun_environment_is_refused_in_one_line(
    changes: dict[str, str], says: str
) -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with pytest.raises(ConfigError) as caught:
        from_environment({**env, **changes})
    text = str(caught.value)
    assert says in text and "\n" not in text


@given(
    st.dictionaries(
        st.sampled_from(
            ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]
        ),
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12),
    )
)
@settings(max_examples=300, deadline=None)
def test_any_environment_gives_ranks_or_one_line(env: dict[str, str]) -> None:
    """Whatever torchrun's variables hold: a :class:`Ranks` that is a rank of its world on
    a TCP port, ``None``, or a one-line :class:`ConfigError`."""
    try:
        ranks = from_environment(env)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    if ranks is not None:
        assert 0 <= ranks.rank < ranks.world and 1 <= ranks.port <= 65535
        assert 1 <= ranks.on_this_machine <= ranks.world


def test_a_master_address_that_does_not_resolve_is_refused_at_once() -> None:
    began = time.monotonic()
    with pytest.raises(
        ConfigError, match=r"MASTER_ADDR = 'no\.such\.host\.invalid' does not resolve"
    ):
        join(Ranks(0, 1, 0, "no.such.host.invalid", free_port()), 120)
    assert time.monotonic() - began < 30


def test_too_many_ranks_are_refused_before_any_starts(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # More local processes than four a core: refused by the launcher, no process started.
    assert main(["simulate", "--ranks", "99999999", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at most" in err[0] and "torchrun" in err[0], err
    # More ranks than peers: every rank refuses before it joins the others.
    config = load_config(None, ["algorithm.name=ops", "topology.kind=ring", "topology.nodes=2"])
    outcomes = run_ranks(config, 3, folder / "more-ranks-than-peers")
    assert set(outcomes) == {0, 1, 2}
    for what in outcomes.values():
        assert "3 ranks for 2 peers" in what, what


def test_a_rank_waiting_for_the_others_stops_on_sigterm(folder: Path) -> None:
    """A rank that waits to meet the others (for up to a minute) still stops at once when
    it is told to: the wait runs beside the thread that takes the signal."""
    env = {
        **os.environ,
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    argv = [sys.executable, "-m", "fedcore", "simulate", "--quiet", "--out", str(folder / "w")]
    process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(6)  # past the set-up, into the wait
        assert process.poll() is None
        began = time.monotonic()
        process.terminate()
        _, err = process.communicate(timeout=30)
        assert time.monotonic() - began < 10
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0
    assert "Traceback" not in err and "interrupted" in err


def test_a_rank_that_dies_stops_the_others_in_bounded_time(folder: Path) -> None:
    config = _config("ops", folder)
    out = folder / "dies"
    began = time.monotonic()
    outcomes = run_ranks(config, 2, out, _dying_rank)
    assert time.monotonic() - began < 60  # at once: its sockets closed (the timeout: 120 s)
    assert LOST in outcomes[0] and outcomes[0].startswith("PeerUnavailableError: rank 0 of 2")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "failed"


def test_a_rank_that_hangs_stops_the_others_within_the_timeout(folder: Path) -> None:
    config = _config("ops", folder, "transport.strict_timeout_s=3")
    out = folder / "hangs"
    began = time.monotonic()
    outcomes = run_ranks(config, 2, out, _hanging_rank)
    assert time.monotonic() - began < 60  # set-up, then the first collective's 3 s
    assert LOST in outcomes[0] and outcomes[0].startswith("PeerUnavailableError: rank 0 of 2")
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["status"] == "failed"


def test_the_launcher_names_the_rank_that_failed_first() -> None:
    def child(rank: int, ended: float, error: str | None, stopped: bool = False) -> _Child:
        c = _Child(rank, None)  # type: ignore[arg-type]
        c.ended, c.error, c.stopped = ended, error, stopped
        return c

    lost = f"fedcore: error: rank 0 of 3: {LOST} during the halo exchange"
    own = "fedcore: error: rank 2 of 3: node 'a' diverged"
    assert _cause([child(0, 1.0, lost), child(2, 2.0, own)]).rank == 2
    assert _cause([child(0, 1.0, lost), child(1, 9.0, None, stopped=True)]).rank == 1
    assert _cause([child(1, 1.0, lost), child(0, 2.0, lost)]).rank == 1


def test_simulate_ranks_through_the_cli(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``fedcore simulate --ranks 2``: two processes, rank 0 writes the folder; the same
    parameters as one process."""
    settings = ["--set", "algorithm.name=ops", "--set", "topology.nodes=6", "--set", "run.rounds=3"]
    one = folder / "cli-one"
    assert main(["simulate", "--quiet", "--threads", "1", "--out", str(one), *settings]) == 0
    out = folder / "cli-two"
    argv = ["simulate", "--ranks", "2", "--quiet", "--threads", "1", "--out", str(out), *settings]
    assert main(argv) == 0
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    expected = json.loads((one / "summary.json").read_text(encoding="utf-8"))
    assert got["ranks"] == 2
    assert got["params_sha256"] == expected["params_sha256"]
    assert got["traffic"] == expected["traffic"]


def test_a_failed_rank_is_named_in_one_line(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What only the set-up tells (a data set that is not there) fails every rank before
    it joins; the launcher says one line, naming the rank, and exits non-zero."""
    missing = tmp_path / "no-such-data"
    settings = ["--set", f"data.dataset='folder:{missing}'", "--set", "topology.nodes=8"]
    assert main(["simulate", "--ranks", "2", "--quiet", *settings]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("fedcore: error: rank ") and " of 2: data.dataset " in err[0]
    assert "is neither a .npz file nor a folder" in err[0]


def _shuffled_ring(folder: Path, n: int = 12) -> Path:
    """A ring of ``n`` peers whose ids, sorted (graph order), are in no order of the ring:
    contiguous blocks of graph order cut it almost everywhere."""
    ids = [f"p{int(i):02d}" for i in np.random.default_rng(5).permutation(n)]
    edges = [(ids[i], ids[(i + 1) % n]) for i in range(n)]
    graph = topology.TrustGraph.from_edges(
        edges + [(v, u) for u, v in edges], name="shuffled-ring", nodes=sorted(ids)
    )
    path = folder / "shuffled-ring.json"
    topology.save(graph, path)
    return path


@pytest.mark.parametrize("world", [2, 3, 4, 12])
def test_a_graph_partition_of_a_shuffled_ring_cuts_one_edge_pair_a_rank(
    world: int, folder: Path
) -> None:
    """On a ring of 12 the graph partition gives each rank an arc: R of its 12 links cut,
    2R of its 24 directed edges, at most what contiguous blocks cut; sizes those of the
    blocks (differing by at most one), the same placement every time it is computed."""
    path = _shuffled_ring(folder)
    setup = prepare_run(load_config(None, [f"topology.file={path}", "algorithm.name=dpsgd"]))
    src, dst = _edges(setup)
    assert src.size == 24
    graph = place("graph", 12, src, dst, world)
    kept = place("blocks", 12, src, dst, world)
    assert graph.method == "graph" and kept.method == "blocks"
    assert cut_fraction(src, dst, graph.owner) == 2 * world / 24
    assert cut_fraction(src, dst, graph.owner) <= cut_fraction(src, dst, kept.owner)
    assert [r.size for r in graph.rows] == [hi - lo for lo, hi in blocks(12, world)]
    again = place("graph", 12, src, dst, world)
    assert all(np.array_equal(a, b) for a, b in zip(graph.rows, again.rows, strict=True))
    assert sorted(np.concatenate(graph.rows).tolist()) == list(range(12))


def test_the_summary_says_how_the_peers_were_placed(folder: Path) -> None:
    """Rank 0's summary: the partition that ran, the share of edges cut and the bytes that
    crossed ranks a round, counted here edge by edge: every row with a neighbour on another
    rank, once per such rank, times a D-PSGD row (the model, float32)."""
    path = _shuffled_ring(folder)
    config = load_config(None, [f"topology.file={path}", "algorithm.name=dpsgd", "run.rounds=2"])
    setup = prepare_run(config)
    src, dst = _edges(setup)
    out = folder / "placed-ring"
    assert run_ranks(config, 3, out) == dict.fromkeys(range(3), "ok")
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    owner = place("graph", 12, src, dst, 3).owner
    pairs = {(int(u), int(owner[v])) for u, v in zip(src, dst, strict=True) if owner[u] != owner[v]}
    assert len(pairs) == 6  # each arc's two ends, each to the one rank beside it
    row = setup.start.numel() * 4
    assert got["partition"] == "graph"
    assert got["cut_fraction"] == 6 / 24
    assert got["halo_bytes_per_round"] == len(pairs) * row
    one = folder / "placed-ring-one"
    alone = simulate(config, out_dir=one, show_progress=False, threads=1)
    assert got["params_sha256"] == alone["params_sha256"]
    blocked = folder / "placed-ring-blocks"
    config = load_config(
        None,
        [
            f"topology.file={path}",
            "algorithm.name=dpsgd",
            "run.rounds=2",
            "simulate.partition=blocks",
        ],
    )
    assert run_ranks(config, 3, blocked) == dict.fromkeys(range(3), "ok")
    more = json.loads((blocked / "summary.json").read_text(encoding="utf-8"))
    assert more["partition"] == "blocks" and more["cut_fraction"] > got["cut_fraction"]
    assert more["halo_bytes_per_round"] > got["halo_bytes_per_round"]
    assert more["params_sha256"] == alone["params_sha256"]


@pytest.mark.skipif(metis_available(), reason="pymetis is installed here")
def test_metis_without_pymetis_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    config = load_config(None, ["simulate.partition=metis"])
    assert config_refusal(config) == METIS_MISSING
    assert main(["simulate", "--ranks", "2", "--quiet", "--set", "simulate.partition=metis"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'fedcore[partition]'" in err[0], err


@pytest.mark.parametrize("value", ["", "Graph", "metis ", "kl", "1"])
def test_a_partition_that_is_not_one_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, [f"simulate.partition={value!r}"])
    assert "simulate.partition" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("method", ["auto", "blocks", "graph"])
def test_every_rank_holds_a_peer_at_the_extremes(method: str) -> None:
    """One rank holds every peer; as many ranks as peers hold one each, whatever the
    graph (here: none of its peers linked, and a complete one)."""
    n = 7
    none = np.zeros(0, dtype=np.int64)
    u, v = np.nonzero(~np.eye(n, dtype=bool))
    for src, dst in ((none, none), (u.astype(np.int64), v.astype(np.int64))):
        assert [r.tolist() for r in place(method, n, src, dst, 1).rows] == [list(range(n))]
        placed = place(method, n, src, dst, n)
        assert sorted(r.tolist() for r in placed.rows) == [[i] for i in range(n)]
        assert cut_fraction(src, dst, placed.owner) == (1.0 if src.size else 0.0)
    with pytest.raises(ValueError, match="8 ranks for 7 peers"):
        place(method, n, none, none, n + 1)
    with pytest.raises(ValueError, match="0 ranks"):
        place(method, n, none, none, 0)


def test_metis_places_every_peer_the_same_way_each_time() -> None:
    """Where the partition extra is installed: METIS's placement of a shuffled ring (an
    arc a rank), the same when computed again, no rank empty."""
    pytest.importorskip("pymetis")
    n = 12
    ring = np.random.default_rng(5).permutation(n)
    src = np.concatenate([ring, np.roll(ring, -1)])
    dst = np.concatenate([np.roll(ring, -1), ring])
    placed = place("metis", n, src, dst, 3)
    again = place("metis", n, src, dst, 3)
    assert placed.method == "metis" and all(r.size for r in placed.rows)
    assert all(np.array_equal(a, b) for a, b in zip(placed.rows, again.rows, strict=True))
    assert cut_fraction(src, dst, placed.owner) == 6 / 24
