"""Running the CLI in a test and checking that an error is one line (shared by CLI tests)."""

from __future__ import annotations

import pytest

from fedcore.cli import main

TINY = ["--set", "run.rounds=3", "--set", "run.eval_every=2"]
TINY += ["--set", "topology.nodes=4", "--set", "data.batch_size=16"]
"""Overrides for a run of a second or less (CLI tests)."""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
"""The first bytes of a PNG file."""


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``fedcore *argv``; return its exit status, stdout and stderr."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(status: int, out: str, err: str, *needles: str) -> str:
    """Exit 2, no traceback, and one ``fedcore: error:`` line on stderr holding ``needles``
    (compared without case); return that line."""
    assert "Traceback" not in out + err
    assert status == 2, (status, out, err)
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("fedcore: error:"), line
    for needle in needles:
        assert needle.lower() in line.lower(), (needle, line)
    return line


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """Run the CLI and :func:`assert_one_line_error`, with nothing on stdout and
    ``needles`` matched exactly (case included)."""
    status, out, err = cli(capsys, *argv)
    line = assert_one_line_error(status, out, err)
    assert not out.strip(), out
    for needle in needles:
        assert needle in line, (needle, line)
    return line
