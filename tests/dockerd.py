"""A Docker daemon for the tests: the one already running, or a private one started here.

:func:`docker_daemon` reuses a reachable daemon (``DOCKER_HOST``, or the default socket) and
otherwise, as root with Debian's ``docker.io`` installed, starts ``dockerd`` with everything
of its own under a new temporary folder: data root, exec root (its containerd), socket and
pid file. It starts no default bridge (``--bridge=none``): the tests' containers live only
on the networks the tests create. :meth:`Daemon.stop` stops a daemon started here by its
PID, unmounts what it left mounted and removes the folder; :meth:`Daemon.leftovers` says
what is still there, so a test can check that nothing stays behind.

No daemon and none can be started: the tests skip, unless ``FEDCORE_REQUIRE_DOCKER=1``
(set by ``.ci/run``), where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE = "FEDCORE_REQUIRE_DOCKER"


def _unavailable(why: str) -> None:
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{REQUIRE}=1 but {why}")
    pytest.skip(f"{why} (CI installs docker.io and sets {REQUIRE}=1)")


@dataclass
class Daemon:
    """A reachable Docker daemon; ``started`` when these tests started it (``pid``, ``root``)."""

    env: dict[str, str]
    started: bool
    pid: int | None = None
    root: Path | None = None
    log: Path | None = None
    created: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) to remove

    def run(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 120,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` against this daemon."""
        return self.command(["docker", *args], check=check, timeout=timeout, cwd=cwd)

    def command(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float = 120,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Any command (docker-compose, sh gather.sh) with this daemon's environment."""
        proc = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def lines(self, *args: str) -> list[str]:
        return [line for line in self.run(*args).stdout.splitlines() if line.strip()]

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, volumes, networks and images still on the daemon that are ours:
        everything, on a daemon started here; what the tests recorded, on a reused one."""
        networks = self.lines("network", "ls", "--format", "{{.Name}}")
        found = {
            "containers": self.lines("ps", "-aq"),
            "volumes": self.lines("volume", "ls", "-q"),
            # The networks every daemon has, and swarm's own while a swarm is on.
            "networks": [n for n in networks if n not in ("bridge", "host", "none")],
            "images": self.lines("image", "ls", "-q"),
        }
        if self.started:
            return {kind: items for kind, items in found.items() if items}
        mine = {kind: [n for k, n in self.created if k == kind] for kind in found}
        present = {
            "images": self.lines("image", "ls", "--format", "{{.Repository}}:{{.Tag}}"),
            "networks": networks,
            "volumes": found["volumes"],
            "containers": self.lines("ps", "-a", "--format", "{{.Names}}"),
        }
        return {k: [n for n in v if n in present[k]] for k, v in mine.items() if v}

    def stop(self) -> list[str]:
        """Stop a daemon started here (by PID) and remove its folder; return what could not be
        cleaned (empty when all went). A reused daemon is left running."""
        if not self.started or self.pid is None or self.root is None:
            return []
        problems: list[str] = []
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _alive(self.pid):
            time.sleep(0.2)
        if _alive(self.pid):
            problems.append(f"dockerd {self.pid} did not stop on SIGTERM within 60 s; killed")
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            time.sleep(1)
        for mount in sorted(_mounts_under(self.root), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        left = _mounts_under(self.root)
        if left:
            problems.append(f"still mounted under {self.root}: {left}")
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            problems.append(f"{self.root} could not be removed")
        if _alive(self.pid):
            problems.append(f"dockerd {self.pid} is still running")
        return problems


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours counts as gone once reaped.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve())
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        points = [line.split()[1] for line in fh]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def _reachable(env: dict[str, str]) -> bool:
    try:
        proc = subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@contextlib.contextmanager
def docker_daemon() -> Iterator[Daemon]:
    """A daemon for the tests (see the module's docstring); stopped afterwards if started."""
    if shutil.which("docker") is None:
        _unavailable("the docker command is not installed")
    env = dict(os.environ)
    if _reachable(env):
        yield Daemon(env=env, started=False)
        return
    if shutil.which("dockerd") is None:
        _unavailable("no Docker daemon is running and dockerd is not installed")
    if os.geteuid() != 0:
        _unavailable("no Docker daemon is running, and starting one needs root")
    # A short path: a unix socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="fcd-", dir="/tmp"))
    socket = root / "docker.sock"
    log = root / "dockerd.log"
    argv = [
        "dockerd",
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "dockerd.pid"),
        "--host", f"unix://{socket}",
        "--bridge", "none",
    ]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    env["DOCKER_HOST"] = f"unix://{socket}"
    daemon = Daemon(env=env, started=True, pid=proc.pid, root=root, log=log)
    try:
        deadline = time.monotonic() + 60
        while not _reachable(env):
            if proc.poll() is not None or time.monotonic() > deadline:
                text = log.read_text(encoding="utf-8", errors="replace")[-3000:]
                _unavailable(f"dockerd did not start:\n{text}")
            time.sleep(0.5)
        yield daemon
    finally:
        if root.exists():  # not stopped (and checked) by the caller: stop it now
            daemon.stop()
