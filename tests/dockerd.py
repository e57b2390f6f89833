"""A Docker daemon for the tests: the one already running, or a private one started here.

:func:`docker_daemon` reuses a reachable daemon (``DOCKER_HOST``, or the default socket) and
otherwise, as root with Debian's ``docker.io`` installed, starts ``dockerd`` with everything
of its own under a new temporary folder: data root, exec root (its containerd), socket and
pid file. It starts no default bridge (``--bridge=none``): the tests' containers live only
on the networks the tests create. :meth:`Daemon.stop` stops a daemon started here by its
PID, unmounts what it left mounted and removes the folder; :meth:`Daemon.leftovers` says
what is still there, so a test can check that nothing stays behind. Where the machine has
the memory to spare, the daemon's data root is a tmpfs (``FEDCORE_DOCKER_TMPFS=0``: never):
writing, committing and deleting the 2 GB image is then no disk work.

No daemon and none can be started: the tests skip, unless ``FEDCORE_REQUIRE_DOCKER=1``
(set by ``.ci/run``), where that is a failure.

Making the images takes minutes (debootstrap, a torch install in the image), so
:func:`prepare` does it in a background thread from the moment the docker tests are
collected (``tests/conftest.py``, which also runs them last): by the time they run, the
rest of the suite has given it the time (``.ci/run`` makes the base's file system and the
wheels even earlier: ``FEDCORE_DOCKER_ROOTFS``, ``FEDCORE_DOCKER_WHEELS``). :func:`prepared`
waits for it and hands over the daemon and the image, or raises what stopped it (a skip, a
failure).

Under pytest-xdist the preparation runs in the controlling process, which sees every
worker's collection (:func:`publish_to`): it writes the outcome to a hand-off file, and the
worker that runs the docker tests (they form one ``xdist_group``) reads it back
(:func:`receive_from`). That worker stops the daemon by its PID; the controller, its
parent, reaps it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
    proc: subprocess.Popen[bytes] | None = None
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
            # Less the networks every daemon has.
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
        still = {k: [n for n in v if n in present[k]] for k, v in mine.items()}
        return {kind: items for kind, items in still.items() if items}

    def stop(self) -> list[str]:
        """Stop a daemon started here (by PID) and remove its folder; return what could not be
        cleaned (empty when all went). A reused daemon is left running."""
        if not self.started or self.pid is None or self.root is None:
            return []
        if not self.root.exists():
            return []  # stopped already
        problems: list[str] = []
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    problems.append(
                        f"dockerd {self.pid} did not stop on SIGTERM within 60 s; killed"
                    )
                    self.proc.kill()
                    self.proc.wait()
        elif _alive(self.pid):  # started by the xdist controller: not our child
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while _alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(self.pid):
                problems.append(f"dockerd {self.pid} did not stop on SIGTERM within 60 s; killed")
                os.kill(self.pid, signal.SIGKILL)
        for mount in sorted(_mounts_under(self.root), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        left = _mounts_under(self.root)
        if left:
            problems.append(f"still mounted under {self.root}: {left}")
        shutil.rmtree(self.root, ignore_errors=True)
        if self.root.exists():
            problems.append(f"{self.root} could not be removed")
        if self.pid is not None and _alive(self.pid):
            problems.append(f"dockerd {self.pid} is still running")
        return problems


def _alive(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


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


# The data root in memory where memory allows: the images (2 GB, most of it torch) are written,
# hashed into layers and deleted again within minutes; on a loaded disk that took longer
# than the tests themselves (a layer commit of 30 s, an image rm of 20 s to 45 s).
_TMPFS_SIZE = 5 << 30  # a cap: about 2.5 GB is used
_TMPFS_SPARE = 3 << 30  # memory left over for the tests beside it


def _data_in_memory(data: Path) -> bool:
    """Mount a tmpfs on ``data`` when the machine has the memory to spare; say whether."""
    if os.environ.get("FEDCORE_DOCKER_TMPFS", "auto") == "0":
        return False
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh}
    except (OSError, ValueError, IndexError):
        return False
    if info.get("MemAvailable", 0) < _TMPFS_SIZE + _TMPFS_SPARE:
        return False
    data.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={_TMPFS_SIZE},mode=0711", "tmpfs", str(data)],
        capture_output=True,
    )
    return mounted.returncode == 0


def start_daemon() -> Daemon:
    """A daemon for the tests (see the module's docstring); call :meth:`Daemon.stop` after."""
    if shutil.which("docker") is None:
        _unavailable("the docker command is not installed")
    env = dict(os.environ)
    if _reachable(env):
        return Daemon(env=env, started=False)
    if shutil.which("dockerd") is None:
        _unavailable("no Docker daemon is running and dockerd is not installed")
    if os.geteuid() != 0:
        _unavailable("no Docker daemon is running, and starting one needs root")
    # A short path: a unix socket's path must fit in 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="fcd-", dir="/tmp"))
    _data_in_memory(root / "data")
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
        # Its own session: a signal to the tests' process group does not reach it.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    env["DOCKER_HOST"] = f"unix://{socket}"
    daemon = Daemon(env=env, started=True, pid=proc.pid, root=root, log=log, proc=proc)
    deadline = time.monotonic() + 60
    while not _reachable(env):
        if proc.poll() is not None or time.monotonic() > deadline:
            text = log.read_text(encoding="utf-8", errors="replace")[-3000:]
            daemon.stop()
            _unavailable(f"dockerd did not start:\n{text}")
        time.sleep(0.5)
    return daemon


def _build(daemon: Daemon, scratch: Path) -> str:
    """The base (unless the daemon has it) and the peer image; return the image's tag.

    Made ahead, if at all (``.ci/run`` does both while it installs and lints): the base's
    file system, ``FEDCORE_DOCKER_ROOTFS`` (``scripts/docker_image.py --only rootfs``), and
    the wheels, ``FEDCORE_DOCKER_WHEELS`` (``--only wheels``). Otherwise the wheels are
    collected while the base is made."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import docker_image

    rootfs = os.environ.get("FEDCORE_DOCKER_ROOTFS")
    ahead = os.environ.get("FEDCORE_DOCKER_WHEELS")
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            wheels = (
                None
                if ahead
                else pool.submit(docker_image.collect_wheels, scratch / "wheels", log=False)
            )
            # A reused daemon that has the base already keeps it as it was.
            if docker_image.make_base(
                env=daemon.env, rootfs=Path(rootfs) if rootfs else None, log=False
            ):
                daemon.created.append(("images", docker_image.DEFAULT_BASE))
            folder = Path(ahead) if wheels is None else wheels.result()
        tag = f"fedcore-test:{uuid.uuid4().hex[:12]}"
        daemon.created.append(("images", tag))
        docker_image.build_image(tag, wheels=folder, env=daemon.env, log=False)
    except docker_image.BuildError as exc:
        pytest.fail(f"could not build the peer image: {exc}")
    return tag


class _Preparation:
    def __init__(self, publish: Path | None = None) -> None:
        self.daemon: Daemon | None = None
        self.image: str | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.publish = publish
        self.scratch = Path(tempfile.mkdtemp(prefix="fedcore-docker-"))
        self.thread = threading.Thread(target=self._run, name="docker-images", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        began = time.monotonic()
        try:
            self.daemon = start_daemon()
            self.image = _build(self.daemon, self.scratch)
        except BaseException as exc:  # a skip or a failure too: raised again in the test
            self.error = exc
        finally:
            self.seconds = time.monotonic() - began
            shutil.rmtree(self.scratch, ignore_errors=True)
            if self.publish is not None:
                self._write(self.publish)

    def _write(self, path: Path) -> None:
        """The outcome as JSON, for the xdist worker that runs the docker tests."""
        state: dict[str, object] = {"seconds": self.seconds}
        if self.error is not None:
            kind = "skip" if isinstance(self.error, pytest.skip.Exception) else "fail"
            state["error"] = [kind, f"{type(self.error).__name__}: {self.error}"]
        else:
            d = self.daemon
            assert d is not None
            state["daemon"] = {
                "env": d.env,
                "started": d.started,
                "pid": d.pid,
                "root": None if d.root is None else str(d.root),
                "log": None if d.log is None else str(d.log),
                "created": d.created,
            }
            state["image"] = self.image
        part = path.with_suffix(".part")
        part.write_text(json.dumps(state), encoding="utf-8")
        part.replace(path)  # whole or absent: the reader never sees half of it


_PREPARATION: _Preparation | None = None
# Where the outcome is read from: in an xdist worker, the controller's hand-off file; in any
# process, the file of a preparation started before pytest (AHEAD, below).
AHEAD = "FEDCORE_DOCKER_HANDOFF"
_HANDOFF: Path | None = Path(os.environ[AHEAD]) if os.environ.get(AHEAD) else None


def ahead() -> Path | None:
    """The hand-off file of a preparation started before pytest (``python -m tests.dockerd
    prepare FILE``, what ``.ci/run`` does while it lints), named by ``FEDCORE_DOCKER_HANDOFF``:
    the tests take its daemon and image, stop the daemon by its PID, and prepare nothing."""
    return Path(os.environ[AHEAD]) if os.environ.get(AHEAD) else None


def prepare(publish: Path | None = None) -> None:
    """Start the daemon and the image build in the background (once); with ``publish``,
    write the outcome there when it is known (in the xdist controller)."""
    global _PREPARATION
    if _PREPARATION is None and _HANDOFF is None:
        _PREPARATION = _Preparation(publish)


def publish_to(path: Path) -> None:
    """In the xdist controller: prepare here, for the worker that will run the tests (unless
    a preparation started before pytest does it)."""
    if ahead() is None:
        prepare(publish=path)


def receive_from(path: Path) -> None:
    """In an xdist worker: take the daemon and image from the controller's hand-off file
    (or from the preparation started before pytest)."""
    global _HANDOFF
    _HANDOFF = ahead() or path


def _received(timeout: float) -> tuple[Daemon, str, float]:
    assert _HANDOFF is not None
    deadline = time.monotonic() + timeout
    while not _HANDOFF.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the Docker daemon and images were not ready within {timeout:.0f} s")
        time.sleep(0.5)
    state = json.loads(_HANDOFF.read_text(encoding="utf-8"))
    if "error" in state:
        kind, text = state["error"]
        if kind == "skip":
            pytest.skip(text)
        pytest.fail(text)
    d = state["daemon"]
    daemon = Daemon(
        env=d["env"],
        started=d["started"],
        pid=d["pid"],
        root=None if d["root"] is None else Path(d["root"]),
        log=None if d["log"] is None else Path(d["log"]),
        created=[(kind, name) for kind, name in d["created"]],
    )
    return daemon, state["image"], state["seconds"]


_RECEIVED: tuple[Daemon, str, float] | None = None


def prepared(timeout: float = 900) -> tuple[Daemon, str, float]:
    """The daemon, the peer image's tag and the seconds the preparation took."""
    global _RECEIVED
    if _HANDOFF is not None:
        if _RECEIVED is None:
            _RECEIVED = _received(timeout)
        return _RECEIVED
    prepare()
    assert _PREPARATION is not None
    _PREPARATION.thread.join(timeout)
    if _PREPARATION.thread.is_alive():
        pytest.fail(f"the Docker daemon and images were not ready within {timeout:.0f} s")
    if _PREPARATION.error is not None:
        raise _PREPARATION.error
    assert _PREPARATION.daemon is not None and _PREPARATION.image is not None
    return _PREPARATION.daemon, _PREPARATION.image, _PREPARATION.seconds


def shutdown() -> None:
    """At the end of the session: stop a daemon started here that no test stopped."""
    if _PREPARATION is None:
        return
    _PREPARATION.thread.join(900)
    if _PREPARATION.daemon is not None:
        _PREPARATION.daemon.stop()
        if _PREPARATION.daemon.proc is not None:
            _PREPARATION.daemon.proc.poll()  # reap one that an xdist worker stopped
    if _PREPARATION.publish is not None:
        shutil.rmtree(_PREPARATION.publish.parent, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.dockerd prepare FILE``: start a daemon and make the images now, write
    the outcome to FILE and leave the daemon running, for pytest run with
    ``FEDCORE_DOCKER_HANDOFF=FILE`` (whose docker tests stop it). ``stop FILE``: stop that
    daemon if it still runs (a run that ended before its docker tests)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.dockerd", description=main.__doc__)
    parser.add_argument("action", choices=("prepare", "stop"))
    parser.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    if args.action == "prepare":

        def interrupted(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        # Ended early (CI stops at a failed lint): stop the daemon started so far too.
        signal.signal(signal.SIGTERM, interrupted)
        preparation = _Preparation(publish=args.file)
        try:
            preparation.thread.join()
        except BaseException:
            if preparation.daemon is not None:
                preparation.daemon.stop()
            raise
        if preparation.error is not None:
            print(f"docker preparation failed: {preparation.error}", file=sys.stderr)
            return 1
        print(f"docker: daemon and images ready after {preparation.seconds:.0f} s")
        return 0
    if not args.file.exists():
        return 0
    state = json.loads(args.file.read_text(encoding="utf-8"))
    d = state.get("daemon")
    if not d or not d["started"]:
        return 0
    daemon = Daemon(env=d["env"], started=True, pid=d["pid"], root=Path(d["root"]), log=None)
    problems = daemon.stop()
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
