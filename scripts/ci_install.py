"""Install this checkout with its ``dev`` extra into the running Python's environment, as
``pip install --upgrade pip -e ".[dev]"`` would, but with uv, which fetches in parallel.

``.ci/run`` uses it. On the CI machines pip takes about two minutes for this install, most of
it waiting on one index request after another; uv installs the same distributions, at the
same versions, in about 15 s. So that both install the same thing, uv is given what pip
would use: every ``index-url``, ``extra-index-url``, ``find-links``, ``constraint`` and
``cert`` from pip's own configuration (``pip config list``: its files and ``PIP_*``
variables), and ``--index-strategy unsafe-best-match``, which weighs every index's versions
together as pip does (uv's default takes a package from the first index that has it).

uv itself goes into a folder of its own, not into the environment being tested. Where uv
cannot be had or fails, pip does the install as before, after one line that says why::

    python scripts/ci_install.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["--upgrade", "pip", "-e", f"{ROOT}[dev]"]
# pip's settings that say where distributions come from, and uv's flag for each.
_FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_settings() -> dict[str, list[str]]:
    """pip's effective settings by name (``find-links`` ...), each a list of values."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    return parse_settings(listed.stdout)


def parse_settings(listing: str) -> dict[str, list[str]]:
    """``pip config list``'s lines (``global.find-links='/opt/wheels'``, ``:env:.cert=...``)
    by setting name, each a list of values: a value may hold several, split by spaces."""
    settings: dict[str, list[str]] = {}
    for line in listing.splitlines():
        match = re.fullmatch(r"[^.]*\.([a-z-]+)='(.*)'", line.strip())
        if match is None:
            continue
        name, value = match.groups()
        for part in value.split():
            if part not in settings.setdefault(name, []):
                settings[name].append(part)
    return settings


def uv_command(uv: str, settings: dict[str, list[str]]) -> list[str]:
    """``uv pip install`` of :data:`TARGETS` from where pip's ``settings`` say."""
    argv = [uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", sys.executable]
    argv += ["--index-strategy", "unsafe-best-match"]
    for name, flag in _FLAGS.items():
        for value in settings.get(name, []):
            if name == "index-url":
                argv += [flag, value]
                break  # pip takes one
            if name != "find-links" or "://" in value or Path(value).exists():
                argv += [flag, value]  # pip skips a missing find-links folder; so does this
    return argv + TARGETS


def with_uv() -> str | None:
    """Install with uv; return why not, or ``None`` when done."""
    settings = pip_settings()
    env = dict(os.environ)
    for cert in settings.get("cert", [])[:1]:
        env.setdefault("SSL_CERT_FILE", cert)  # the CA bundle pip trusts, for uv too
    tools = Path(tempfile.mkdtemp(prefix="fedcore-uv-"))
    venv.create(tools, with_pip=True)
    got = subprocess.run(
        [str(tools / "bin" / "python"), "-m", "pip", "install", "--quiet", "uv"], env=env
    )
    if got.returncode != 0:
        return "pip could not install uv"
    done = subprocess.run(uv_command(str(tools / "bin" / "uv"), settings), env=env)
    if done.returncode != 0:
        return f"uv pip install failed (exit {done.returncode})"
    return None


def main() -> int:
    why = with_uv()
    if why is None:
        return 0
    print(f"ci_install: {why}; installing with pip instead", file=sys.stderr)
    for targets in (["--upgrade", "pip"], TARGETS[2:]):
        if subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *targets]).returncode:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
