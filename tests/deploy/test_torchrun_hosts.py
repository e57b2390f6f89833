"""A sharded run across two "hosts" for real: torchrun on each of two network namespaces.

Each host is a network namespace of its own (:class:`tests.deploy.test_netns.Hosts`: its own
stack and one address on a bridge in a hub namespace). On each, ``torchrun --nnodes 2
--nproc-per-node 1 --node-rank K --master-addr <host 0's address>`` starts one rank of
``fedcore simulate``, as a user starts it on two machines (docs/engines.md, "Several
processes"); gloo is told which interface the hosts share (``GLOO_SOCKET_IFNAME``). Rank 0
writes the results, which must equal one process's bit for bit. Marked netns: skipped with
the reason where namespaces cannot be made, unless ``FEDCORE_REQUIRE_NETNS=1`` (CI).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedcore.config import config_to_dict, dumps_toml, load_config
from fedcore.simulation.simulate import simulate
from tests.deploy.test_netns import PREFIX, REPO, Hosts, _namespaces, _unavailable

pytestmark = pytest.mark.netns

SETTINGS = [
    "algorithm.name=dpsgd",
    "topology.kind=ring",
    "topology.nodes=6",
    "run.rounds=5",
    "run.eval_every=5",
    "transport.strict_timeout_s=60",
]
PORT = 29500


def test_torchrun_on_two_hosts_equals_one_process(tmp_path: Path) -> None:
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("FEDCORE_REQUIRE_NETNS") == "1":
            pytest.fail(f"FEDCORE_REQUIRE_NETNS=1, but {reason}")
        pytest.skip(reason)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None, "torch installs the torchrun command beside python"
    config = load_config(None, SETTINGS)
    config_path = tmp_path / "config.toml"
    config_path.write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
    prefix = f"{PREFIX}{secrets.token_hex(2)}-"
    hosts = Hosts(prefix, ("h0", "h1"))
    procs: list[subprocess.Popen[bytes]] = []
    out = tmp_path / "ranked"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["GLOO_SOCKET_IFNAME"] = "eth0"  # the link the hosts share (not lo)
    try:
        hosts.build()
        for k, host in enumerate(hosts.nodes):
            argv = [
                "ip", "netns", "exec", hosts.ns(host),
                torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(k),
                "--master-addr", hosts.address("h0"), "--master-port", str(PORT),
                "-m", "fedcore", "simulate", "--quiet", "--threads", "1",
                "--out", str(out), str(config_path),
            ]  # fmt: skip
            log = open(tmp_path / f"{host}.log", "wb")  # noqa: SIM115 - closed below
            procs.append(
                subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )
            log.close()
        deadline = time.monotonic() + 180
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        logs = "\n".join(
            f"--- {h} ---\n{(tmp_path / f'{h}.log').read_text(errors='replace')[-3000:]}"
            for h in hosts.nodes
        )
        assert all(p.returncode == 0 for p in procs), logs
    finally:
        for p in procs:  # torchrun and its rank: one session each
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        hosts.close()
        left = [n for n in _namespaces() if n.startswith(prefix)]
        assert not left, f"namespaces left behind: {left}"
    ranked = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    one = simulate(config, out_dir=tmp_path / "one", show_progress=False)
    assert ranked["ranks"] == 2 and ranked["status"] == "completed"
    assert ranked["params_sha256"] == one["params_sha256"]
    assert ranked["traffic"] == one["traffic"]
