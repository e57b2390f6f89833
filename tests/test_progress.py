"""Start-up lines in a log (``launch``'s status line, a peer's preparing and connecting
lines) come at least every 5 s however long a stage lasts; the results table says what
ran the run."""

from __future__ import annotations

import io
import itertools
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fedcore import progress
from fedcore.cli.common import print_table
from fedcore.config import load_config
from fedcore.progress import StatusLine


class _FakeTime:
    """``time`` for :mod:`fedcore.progress` with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


def test_the_start_up_line_in_a_log_comes_every_5_s_while_nothing_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27: peers stuck in one stage for 87 s (the text unchanged) printed no line
    for 87 s; now a log gets one every ``every_s`` (5 s) of the wait, and no more."""
    clock = _FakeTime()
    monkeypatch.setattr(progress, "time", clock)
    log = io.StringIO()
    line = StatusLine(log)  # the launcher's: every_s = 5
    text = "launch: 12/16 peers up; connecting 4 (n1, n5, n9, n13)"
    for k in range(871):  # the launcher looks every 0.1 s: 87 s of the same text
        clock.now = 1000.0 + k / 10
        line.show(text)
    lines = log.getvalue().splitlines()
    seconds = []
    for ln in lines:
        m = re.search(r"  (?:(\d+):(\d\d)|(\d+)s)$", ln)  # 5s, ..., 1:05
        assert m, ln
        minutes, secs, alone = m.groups()
        seconds.append(int(alone) if alone else 60 * int(minutes) + int(secs))
    assert seconds[0] == 0
    gaps = [b - a for a, b in itertools.pairwise(seconds)]
    assert len(lines) == 18 and all(g == 5 for g in gaps), lines  # 0s, 5s, ..., 85s


def test_a_ticker_prints_while_its_block_runs_and_not_after() -> None:
    log = io.StringIO()
    with progress.Ticker(log, lambda: "n0: preparing (data and model)", every_s=0.05):
        time.sleep(0.5)
    said = log.getvalue().splitlines()
    assert len(said) >= 3 and all(s.startswith("n0: preparing (data and model)  ") for s in said)
    time.sleep(0.2)
    assert log.getvalue().splitlines() == said
    before = threading.active_count()
    with progress.Ticker(None, lambda: "never", every_s=0.01):  # no stream: no thread
        assert threading.active_count() == before


def test_a_peer_says_it_prepares_and_whom_it_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer's slow data load and its wait for an out-neighbour that is not up each
    print a line at least every TICK_S: they were silent (the 87 s gap)."""
    import asyncio

    from fedcore.deploy import peer
    from fedcore.deploy.launch import free_ports
    from fedcore.errors import PeerUnavailableError

    monkeypatch.setattr(peer, "TICK_S", 0.2, raising=False)
    slow = peer.prepare_run

    def slow_prepare(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.7)  # a data set that takes its time to load
        return slow(*args, **kwargs)

    monkeypatch.setattr(peer, "prepare_run", slow_prepare)
    config = load_config(
        None,
        [
            "algorithm.name=dpsgd",
            "topology.kind=ring",
            "topology.nodes=3",
            "transport.startup_timeout_s=1.0",
        ],
    )
    ports = free_ports(3)  # n1 and n2 never start
    roster = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    said = io.StringIO()
    with pytest.raises(PeerUnavailableError):
        asyncio.run(peer.run_peer(config, "n0", roster, out=tmp_path, progress_stream=said))
    lines = said.getvalue().splitlines()
    assert sum(ln.startswith("n0: preparing (data and model)  ") for ln in lines) >= 2, lines
    waits = [ln for ln in lines if ln.startswith("n0: connecting; no handshake yet with n1, n2")]
    assert len(waits) >= 3, lines


def _summary(**extra: Any) -> dict[str, Any]:
    return {
        "algorithm": "ops",
        "topology": {"name": "social", "spectral_gap": 0.2},
        "nodes": 16,
        "rounds": 3,
        "final": {},
        "traffic": {},
        "wall_seconds": 1.0,
        **extra,
    }


def test_the_results_table_of_launch_says_grpc_peers(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27: ``fedcore launch``'s table said ``engine  messages`` (no engine key in a
    gRPC run's summary)."""
    print_table(_summary(transport="grpc", peers_per_process=1))
    assert re.search(r"^  engine +grpc peers \(16 processes\)$", capsys.readouterr().out, re.M)
    print_table(_summary(transport="grpc", peers_per_process=5))
    assert re.search(r"^  engine +grpc peers \(4 processes\)$", capsys.readouterr().out, re.M)
    print_table(_summary(transport="grpc", peers_per_process=16))
    assert re.search(r"^  engine +grpc peers \(1 process\)$", capsys.readouterr().out, re.M)
    print_table(_summary(transport="grpc"))  # summarize: peers that ran elsewhere
    assert re.search(r"^  engine +grpc peers$", capsys.readouterr().out, re.M)
    print_table(_summary(transport="inproc", engine="vectorized"))
    assert re.search(r"^  engine +vectorized$", capsys.readouterr().out, re.M)
