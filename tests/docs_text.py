"""The documentation's text, for the tests that hold it to the code: the README (the front
page) and the pages of the MkDocs site under ``docs/`` (``mkdocs.yml``).

A test that runs a command or a config the docs show reads it here, from whichever page
holds it now, so moving text between pages keeps it tested, and an edit of the text is
what is tested.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_HEADING = re.compile(r"^(#{1,6}) (.+?)\s*$")


def pages() -> list[Path]:
    """The README and every page of the site (``docs/*.md``; the results scripts' tables
    under ``docs/results/`` are generated, not written)."""
    return [README, *sorted(DOCS.glob("*.md"))]


def page(name: str) -> str:
    """One page's text: ``"README.md"`` or a page of ``docs/`` (``"config.md"``)."""
    path = README if name == "README.md" else DOCS / name
    return path.read_text(encoding="utf-8")


def all_text() -> str:
    """Every page's text, joined (the README first)."""
    return "\n".join(path.read_text(encoding="utf-8") for path in pages())


def _headings(text: str) -> list[tuple[int, int, str]]:
    """``(line index, level, title)`` of every markdown heading outside code fences (a
    ``# comment`` in a ```toml or ```bash block is no heading)."""
    found, fence = [], False
    for i, line in enumerate(text.splitlines()):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        match = None if fence else _HEADING.match(line)
        if match:
            found.append((i, len(match.group(1)), match.group(2)))
    return found


def section_page(title: str) -> Path:
    """The one page that has a heading ``title`` (any level)."""
    holders = [
        path
        for path in pages()
        if any(t == title for _, _, t in _headings(path.read_text(encoding="utf-8")))
    ]
    assert len(holders) == 1, f"{len(holders)} pages of the docs have a heading {title!r}"
    return holders[0]


def section(title: str) -> str:
    """The text under the heading ``title`` (any level, on whichever page has it), up to
    the next heading of its level or above."""
    text = section_page(title).read_text(encoding="utf-8")
    lines = text.splitlines()
    heads = _headings(text)
    start, level = next((i, lvl) for i, lvl, t in heads if t == title)
    end = next((i for i, lvl, _ in heads if i > start and lvl <= level), len(lines))
    return "\n".join(lines[start + 1 : end]) + "\n"
