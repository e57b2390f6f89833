"""Build the peer image (``nodes/Dockerfile``) with no container registry and no network in
the build: a base image made from Debian packages, and fedcore with everything it needs
installed from a folder of wheels.

    python scripts/docker_image.py                      # fedcore-base:bookworm, fedcore:latest
    python scripts/docker_image.py --tag fedcore:dev --torch-wheel torch-2.13.0+cpu-...whl

Three steps, each usable alone (``--only base|wheels|image``):

1. **Base.** ``debootstrap --variant=minbase`` of Debian bookworm (its python3 is 3.11, like
   the wheels) with ``python3`` and ``python3-venv``, trimmed of documentation and package
   caches, then ``docker import``. Needs root and Debian's ``debootstrap``; skipped when the
   image exists already. Packages come from ``--mirror`` (default: the first Debian mirror
   of this machine's apt sources, else deb.debian.org).
2. **Wheels.** ``pip wheel`` of this checkout with its ``datasets`` extra into a folder. torch
   is pinned to the release this Python runs (``torch==2.13.0+cpu`` say), so pip takes the
   same file it installed from (a local wheel on ``find-links``); elsewhere give the file
   with ``--torch-wheel`` (PyPI's Linux torch wheels are the multi-GB CUDA builds).
3. **Image.** ``docker build`` of ``nodes/Dockerfile`` in a fresh build context (this
   checkout's ``pyproject.toml``, ``README.md``, ``fedcore/`` and the wheels), with
   ``--build-arg BASE=<base> --build-arg WHEELS=nodes/wheels``: an offline install.

``docker`` talks to the daemon of ``DOCKER_HOST`` (or the default socket), as usual.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"  # Debian 12: python3 is 3.11, the wheels' Python
DEFAULT_BASE = f"fedcore-base:{SUITE}"
DEFAULT_TAG = "fedcore:latest"
_FALLBACK_MIRROR = "http://deb.debian.org/debian"
# Left out of the base: documentation and caches nothing in the image reads.
_TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
         "var/cache/apt/archives", "var/lib/apt/lists")  # fmt: skip


class BuildError(RuntimeError):
    """A step failed; the message says which and why."""


def _run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, what: str) -> None:
    proc = subprocess.run(
        list(argv), env=None if env is None else dict(env), capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def image_exists(tag: str, env: Mapping[str, str] | None = None) -> bool:
    proc = subprocess.run(
        ["docker", "image", "inspect", tag],
        env=None if env is None else dict(env),
        capture_output=True,
    )
    return proc.returncode == 0


def apt_mirror() -> str:
    """The first Debian mirror of this machine's apt sources (deb822 or one-line form)."""
    candidates = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for match in re.finditer(r"(?:URIs:\s*|^deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            uri = match.group(1)
            if uri.startswith("http") and uri.rstrip("/").endswith("/debian"):
                return uri
    return _FALLBACK_MIRROR


def bootstrap(rootfs: Path, *, mirror: str | None = None) -> Path:
    """debootstrap the base's file system into ``rootfs`` (a new folder), trimmed."""
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed (Debian: apt-get install debootstrap).")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise BuildError("debootstrap needs root to make the base image.")
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv",
            SUITE,
            str(rootfs),
            mirror or apt_mirror(),
        ],
        what="debootstrap",
    )
    for part in _TRIM:
        shutil.rmtree(rootfs / part, ignore_errors=True)
    return rootfs


def make_base(
    tag: str = DEFAULT_BASE,
    *,
    mirror: str | None = None,
    rootfs: Path | None = None,
    env: Mapping[str, str] | None = None,
    log: bool = True,
) -> bool:
    """Make ``tag`` from Debian packages unless it exists; return whether it was made.

    ``rootfs``: a folder :func:`bootstrap` filled already (``--only rootfs``), imported
    as it is instead of running debootstrap again.
    """
    if image_exists(tag, env):
        return False
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedcore-base-") as tmp:
        if rootfs is None:
            rootfs = bootstrap(Path(tmp) / "rootfs", mirror=mirror)
        elif not (rootfs / "usr" / "bin" / "python3").exists():
            raise BuildError(f"{rootfs} is not a debootstrapped base (no usr/bin/python3).")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run(
                ["docker", "import", "-", tag],
                stdin=tar.stdout,
                env=None if env is None else dict(env),
                capture_output=True,
                text=True,
            )
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise BuildError(f"docker import failed: {imported.stderr.strip()}")
    if log:
        print(f"base image {tag}: made in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return True


def collect_wheels(dest: Path, *, torch_wheel: Path | None = None, log: bool = True) -> Path:
    """Wheels of this checkout (with ``datasets``) and of all it needs, into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    if torch_wheel is not None:
        if not torch_wheel.is_file():
            raise BuildError(f"--torch-wheel {torch_wheel} is not a file.")
        shutil.copy2(torch_wheel, dest / torch_wheel.name)
        pin = str(dest / torch_wheel.name)
    else:
        import torch

        pin = f"torch=={torch.__version__}"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(dest),
            "--find-links",
            str(dest),
            f"{ROOT}[datasets]",
            pin,
        ],
        what=(
            f"pip wheel (torch pinned as {pin}; where pip cannot find that file, give a CPU "
            "torch wheel with --torch-wheel)"
        ),
    )
    if log:
        count = len(list(dest.glob("*.whl")))
        print(f"wheels: {count} in {dest} ({time.monotonic() - began:.0f} s)", file=sys.stderr)
    return dest


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def build_image(
    tag: str = DEFAULT_TAG,
    *,
    base: str = DEFAULT_BASE,
    wheels: Path,
    env: Mapping[str, str] | None = None,
    log: bool = True,
) -> None:
    """``docker build`` of ``nodes/Dockerfile`` from ``base``, installing from ``wheels``."""
    if not any(wheels.glob("*.whl")):
        raise BuildError(f"{wheels} holds no wheel; collect them first (--only wheels).")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fedcore-context-") as tmp:
        ctx = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, ctx / name)
        shutil.copytree(
            ROOT / "fedcore", ctx / "fedcore", ignore=shutil.ignore_patterns("__pycache__")
        )
        (ctx / "nodes").mkdir()
        shutil.copy2(ROOT / "nodes" / "Dockerfile", ctx / "nodes" / "Dockerfile")
        # Hard links where the wheels' folder shares the file system: no copy of 350 MB.
        shutil.copytree(wheels, ctx / "nodes" / "wheels", copy_function=_link_or_copy)
        _run(
            [
                "docker",
                "build",
                "--network",
                "none",
                "--quiet",
                "-t",
                tag,
                "--build-arg",
                f"BASE={base}",
                "--build-arg",
                "WHEELS=nodes/wheels",
                "-f",
                str(ctx / "nodes" / "Dockerfile"),
                str(ctx),
            ],
            env=env,
            what="docker build",
        )
    if log:
        print(f"image {tag}: built in {time.monotonic() - began:.0f} s", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image to build ({DEFAULT_TAG})")
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"base image ({DEFAULT_BASE})")
    parser.add_argument("--mirror", help="Debian mirror for debootstrap (default: apt's)")
    parser.add_argument("--wheels", type=Path, help="wheel folder to fill and use (default: temp)")
    parser.add_argument("--torch-wheel", type=Path, help="a CPU torch wheel file to use")
    parser.add_argument(
        "--only", choices=("rootfs", "base", "wheels", "image"), help="one step only"
    )
    parser.add_argument(
        "--rootfs", type=Path, help="base file system folder: made by --only rootfs, used by base"
    )
    args = parser.parse_args(argv)
    try:
        if args.only == "rootfs":
            if args.rootfs is None:
                parser.error("--only rootfs needs --rootfs DIR (a folder to create)")
            bootstrap(args.rootfs, mirror=args.mirror)
            return 0
        made = args.only in (None, "base") and make_base(
            args.base, mirror=args.mirror, rootfs=args.rootfs
        )
        if args.only in (None, "base") and not made:
            print(f"base image {args.base}: exists", file=sys.stderr)
        if args.only == "base":
            return 0
        with tempfile.TemporaryDirectory(prefix="fedcore-wheels-") as tmp:
            wheels = args.wheels or Path(tmp)
            if args.only in (None, "wheels"):
                collect_wheels(wheels, torch_wheel=args.torch_wheel)
            if args.only in (None, "image"):
                build_image(args.tag, base=args.base, wheels=wheels)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
