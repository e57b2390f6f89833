"""Every duration an example's header states is measured in benchmarks/README.md (issue 27:
examples/dog-10k.toml said "about a minute", then "about 12 s", from no measurement)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Times the README states"
DURATION = re.compile(
    r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:s|ms|seconds?|minutes?)\b|\ba (?:minute|second)\b"
)


def _times_section() -> str:
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert SECTION in text, "benchmarks/README.md has no section of the README's times"
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def _header(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return " ".join(lines)


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_an_examples_stated_time_points_to_its_measurement(path: Path) -> None:
    header = _header(path)
    if not DURATION.search(header):
        return
    assert "benchmarks/README.md" in header, f"{path.name} states a time with no measurement"
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert f"examples/{path.name}" in (_times_section() if "Times the README" in header else text)


def test_the_times_section_gives_a_command_and_a_measurement_a_row() -> None:
    rows = [ln for ln in _times_section().splitlines() if ln.startswith("| ") and "---" not in ln]
    measured = [r for r in rows if r.count("|") == 5 and not r.startswith("| what")]
    assert len(measured) >= 8
    for row in measured:
        _what, where, command, figures = (c.strip() for c in row.strip("|").split("|"))
        assert where, row
        assert "`" in command or "section" in command, row
        assert DURATION.search(figures), row
