"""Issue 40: fedcore's warnings (a batch larger than a peer's data, say) printed under
``-q`` and once per run of a sweep. Now ``-q`` keeps them off the terminal, each run's
``summary.json`` lists them (``warnings``), and a sweep says each distinct one once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedcore.cli import main
from tests.clitools import TINY
from tests.plainlogging import plain_logging

BIG = [*TINY, "--set", "data.batch_size=100000"]
"""A run whose batch is larger than any peer's data: one warning (the same for a seed)."""
SAID = "data.batch_size = 100000 is larger than the"


def _warnings(folder: Path) -> list[str]:
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    warnings = summary["warnings"]
    assert isinstance(warnings, list)
    return [str(w) for w in warnings]


def test_simulate_q_keeps_warnings_off_the_terminal_and_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with plain_logging():
        assert main(["simulate", "-q", *BIG, "--out", str(tmp_path / "quiet")]) == 0
        out, err = capsys.readouterr()
        assert main(["simulate", *BIG, "--out", str(tmp_path / "loud")]) == 0
        _, loud = capsys.readouterr()
    assert out == f"results: {tmp_path / 'quiet'}\n" and err == ""
    assert loud.count(SAID) == 1 and "WARNING fedcore.setup.training" in loud
    for run in ("quiet", "loud"):
        (said,) = _warnings(tmp_path / run)
        assert said.startswith(SAID) and "smallest peer" in said
    # A run with nothing to say says so.
    assert main(["simulate", "-q", *TINY, "--out", str(tmp_path / "calm")]) == 0
    assert _warnings(tmp_path / "calm") == []


def test_a_sweep_says_each_distinct_warning_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = ["--grid", "algorithm.lr=0.1,0.2,0.3", "--seeds", "0"]
    with plain_logging():
        assert main(["sweep", *BIG, *grid, "--out", str(tmp_path / "loud")]) == 0
        _, loud = capsys.readouterr()
        assert main(["sweep", "-q", *BIG, *grid, "--out", str(tmp_path / "quiet")]) == 0
        out, quiet = capsys.readouterr()
    assert loud.count(SAID) == 1, loud  # three runs, one warning (it was three)
    assert loud.index(SAID) < loud.index("seed 0 [1/3]")  # said with the run that said it
    assert quiet == "" and out == f"results: {tmp_path / 'quiet'}\n"
    runs = sorted((tmp_path / "quiet").glob("*/seed-0"))
    assert len(runs) == 3
    for run in runs:
        (said,) = _warnings(run)
        assert said.startswith(SAID)


def test_run_warnings_collects_silences_the_terminal_only_and_leaves_logging_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging
    import sys

    from fedcore import progress

    log = logging.getLogger("fedcore.somewhere")
    with plain_logging():
        terminal = logging.StreamHandler(sys.stderr)
        to_file = logging.FileHandler(tmp_path / "run.log")
        root = logging.getLogger()
        root.addHandler(terminal)
        root.addHandler(to_file)
        try:
            with progress.run_warnings(quiet=True) as outer:
                with progress.run_warnings(quiet=False) as inner:
                    for _ in range(2):
                        log.warning("first %s", "thing")
                    log.warning("second")
                log.warning("third")
                assert progress.current_warnings() == ["first thing", "second", "third"]
            log.warning("after")
        finally:
            to_file.close()
    _, err = capsys.readouterr()
    assert err == "after\n"  # the terminal heard only what came after the quiet run
    assert (tmp_path / "run.log").read_text(encoding="utf-8").splitlines() == [
        "first thing",
        "first thing",
        "second",
        "third",
        "after",
    ]
    assert inner.messages == ["first thing", "second"]
    assert outer.messages == ["first thing", "second", "third"]
    assert not terminal.filters and progress.current_warnings() == []
    assert not [
        h for h in logging.getLogger("fedcore").handlers if isinstance(h, progress.RunWarnings)
    ]


def test_a_run_keeps_at_most_max_notes_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from fedcore import progress

    monkeypatch.setattr(progress, "MAX_NOTES", 3)
    with plain_logging(), progress.run_warnings(quiet=True) as said:
        for i in range(5):
            logging.getLogger("fedcore.x").warning("warning %d", i)
    assert said.messages == ["warning 0", "warning 1", "warning 2", "... and 2 more warnings"]
