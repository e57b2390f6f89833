"""The documentation site (``mkdocs.yml``, ``docs/``) builds with ``mkdocs build --strict``,
where a broken link, anchor or API reference, or a page left out of the nav, fails; and the
README stays a front page that maps the site.

The build needs the ``docs`` extra (``pip install -e ".[docs]"``; ``.[dev]`` includes it).
Without mkdocs the build test is skipped with the reason, unless ``FEDCORE_REQUIRE_DOCS=1``
(set by ``.ci/run``), which makes that a failure.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs_text

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
"""The modules of mkdocs, mkdocs-material and mkdocstrings[python]."""


def _missing() -> list[str]:
    missing = []
    for name in NEEDED:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is absent
            found = False
        if not found:
            missing.append(name)
    return missing


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        reason = f"mkdocs is not installed ({', '.join(missing)}): pip install -e '.[docs]'"
        if os.environ.get("FEDCORE_REQUIRE_DOCS") == "1":
            pytest.fail(f"FEDCORE_REQUIRE_DOCS=1 but {reason}")
        pytest.skip(reason)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for page in docs_text.pages()[1:]:
        name = "" if page.stem == "index" else f"{page.stem}/"
        assert (site / name / "index.html").is_file(), page.name
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Quick start" in home and "fedcore simulate" in home  # the README's, included
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("RunResult", "SweepResult", "to_dataframe"):
        assert name in api, name
    bench = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "Times the README states" in bench  # benchmarks/README.md, included


def test_every_page_is_in_the_nav() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\s*- (?:[^:\n]+: )?([\w-]+\.md)\s*$", config, re.M))
    pages = {p.name for p in docs_text.pages()[1:]}
    assert pages == listed, (sorted(pages - listed), sorted(listed - pages))


def test_the_readme_is_a_front_page_that_maps_the_site() -> None:
    text = docs_text.page("README.md")
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    for command in (
        "pip install . && fedcore simulate",
        'pip install -e ".[test]" && python -m pytest',
        "mkdocs build --strict",
    ):
        assert command in text, command
    for marker in ("`slow`", "`grpc`", "`netns`", "`docker`"):
        assert marker in text, marker
    for page in docs_text.pages()[1:]:
        if page.name != "index.md":
            assert f"(docs/{page.name})" in text, f"the README's map has no link to {page.name}"


def test_ci_builds_the_site_and_requires_it() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "FEDCORE_REQUIRE_DOCS=1" in ci
    assert 'mkdocs build --strict --site-dir "$(mktemp -d)"' in ci
