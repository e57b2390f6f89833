"""CI's installer (scripts/ci_install.py) hands uv exactly the sources pip's settings name."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import ci_install  # noqa: E402


def test_pip_settings_reach_uv_as_pip_would_use_them(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    listing = "\n".join(
        [
            f"global.find-links='{wheels} {tmp_path / 'absent'}'",
            f":env:.find-links='{wheels}'",  # the same folder from two places: once
            "global.extra-index-url='file:///mirror/simple https://example.invalid/simple'",
            "global.index-url='https://first.invalid/simple'",
            "install.constraint='/etc/caps.txt'",
            "global.cert='/etc/ca.pem'",
            "global.default-timeout='180'",
            "not a setting line",
        ]
    )
    settings = ci_install.parse_settings(listing)
    assert settings["find-links"] == [str(wheels), str(tmp_path / "absent")]
    assert settings["cert"] == ["/etc/ca.pem"]
    argv = ci_install.uv_command("uv", settings)
    assert argv[:3] == ["uv", "pip", "install"]
    assert argv[argv.index("--python") + 1] == sys.executable
    assert argv[argv.index("--index-strategy") + 1] == "unsafe-best-match"
    pairs = list(itertools.pairwise(argv))
    assert ("--find-links", str(wheels)) in pairs
    assert str(tmp_path / "absent") not in argv  # pip skips a missing folder; so does uv here
    assert ("--index-url", "https://first.invalid/simple") in pairs
    assert ("--extra-index-url", "file:///mirror/simple") in pairs
    assert ("--extra-index-url", "https://example.invalid/simple") in pairs
    assert ("--constraint", "/etc/caps.txt") in pairs
    assert "180" not in argv and "/etc/ca.pem" not in argv  # not sources
    assert argv[-4:] == ["--upgrade", "pip", "-e", f"{ROOT}[dev]"]
