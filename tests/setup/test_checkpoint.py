"""Checkpoints: exact resume in one process, torn files skipped, kill -9 and --resume."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedcore.config import load_config
from fedcore.deploy.launch import free_ports
from fedcore.deploy.peer import model_path
from fedcore.deploy.summarize import read_params
from fedcore.engines.messages import build_network
from fedcore.errors import ConfigError
from fedcore.setup import checkpoint
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate
from tests.resume import assert_resumes_exactly

REPO = Path(__file__).resolve().parents[2]

CASES = {
    "ops": ["algorithm.name=ops"],
    "robust-ops": ["algorithm.name=ops", "algorithm.robust=true", "faults.drop=0.2"],
    "dpsgd-qsgd": ["algorithm.name=dpsgd", "topology.kind=ring", "compression.codec=qsgd"],
    "deepsqueeze": ["algorithm.name=deepsqueeze", "topology.kind=ring", "compression.codec=sign"],
    "choco-randk": [
        "algorithm.name=choco",
        "topology.kind=ring",
        "compression.codec=randk",
        "compression.ratio=0.3",
    ],
    "rps": ["algorithm.name=rps", "topology.kind=complete"],
    "dog-synthetic": ["algorithm.name=dog", "topology.kind=ring", "data.stream=synthetic"],
}


@pytest.mark.parametrize("overrides", list(CASES.values()), ids=list(CASES))
def test_resume_in_process_is_exact(tmp_path: Path, overrides: list[str]) -> None:
    """Checkpoint every node at round 7, restore into a fresh network, finish: the same
    parameters, bit for bit, as a run that never stopped."""
    config = load_config(None, [*overrides, "topology.nodes=5", "model.name=mlp"])
    assert_resumes_exactly(config, tmp_path, stop=7, end=12)


def test_torn_checkpoint_is_detected_and_the_previous_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(None, ["topology.nodes=3", "run.rounds=4"])
    network = build_network(config)
    node = network.nodes["n0"]
    for _ in range(3):
        network.run(node.round + 1)
        checkpoint.save(tmp_path, node)
    newest = sorted(tmp_path.glob("round-*.ckpt"))[-1]
    newest.write_bytes(newest.read_bytes()[:-100])  # torn write
    with caplog.at_level(logging.WARNING):
        saved = checkpoint.latest(tmp_path)
    assert saved is not None and saved["round"] == 2
    assert "digest does not match" in caplog.text and newest.name in caplog.text
    (tmp_path / "round-000009.ckpt").write_bytes(b"garbage")
    assert checkpoint.latest(tmp_path)["round"] == 2  # type: ignore[index]
    with pytest.raises(ConfigError, match="n0"):  # n0's checkpoint does not fit n1
        checkpoint.restore(network.nodes["n1"], saved)


@pytest.mark.parametrize("old", ["fields", "shape"])
def test_a_checkpoint_of_another_state_layout_is_refused_in_one_line(
    tmp_path: Path, old: str
) -> None:
    """A checkpoint written before D-PSGD became a rule over peer rows (its state was
    ``DPSGDState(x [d], pending_step)``): refused with one clear line, not a traceback."""
    config = load_config(None, ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=3"])
    network = build_network(config)
    network.run(2)
    node = network.nodes["n0"]
    saved = checkpoint.snapshot(node)
    fields = saved["state"]["fields"]
    if old == "fields":
        saved["state"]["fields"] = {"x": fields["x"][0], "pending_step": None}
    else:
        fields["x"] = fields["x"][0]
    with pytest.raises(ConfigError, match="another layout") as caught:
        checkpoint.restore(node, saved)
    assert "\n" not in str(caught.value)


@pytest.mark.grpc
def test_kill_9_then_resume_finishes_the_run(tmp_path: Path) -> None:
    """Three peers in deadline mode; n1 is killed at about round 12 and restarted with
    --resume; every peer finishes, n1's records cover every round once, and the final
    average model is within 1 point of an uninterrupted run's. (A 1 s deadline, so that a
    loaded machine does not make the healthy rounds miss messages too.)"""
    overrides = [
        "algorithm.name=dpsgd",
        "topology.kind=ring",
        "topology.nodes=3",
        "run.rounds=60",
        "run.eval_every=10",
        "run.checkpoint_every=5",
        "transport.mode=deadline",
        "transport.deadline_s=1.0",
    ]
    config_path = tmp_path / "run.toml"
    config_path.write_text("\n".join(_toml(overrides)), encoding="utf-8")
    roster = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(free_ports(3))}
    roster_path = tmp_path / "roster.json"
    roster_path.write_text(json.dumps(roster), encoding="utf-8")

    logs = []

    def start(node: str, *extra: str) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "fedcore", "node", "--config", str(config_path),
            "--id", node, "--roster", str(roster_path), "--out", str(tmp_path / node), *extra,
        ]  # fmt: skip
        log = open(tmp_path / f"{node}.log", "ab")  # noqa: SIM115 - closed below
        logs.append(log)
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    procs = {n: start(n) for n in roster}
    try:
        metrics = tmp_path / "n1" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (
            not metrics.exists() or metrics.read_text(encoding="utf-8").count("\n") < 12
        ):
            time.sleep(0.05)
        os.kill(procs["n1"].pid, signal.SIGKILL)
        procs["n1"].wait(timeout=30)
        procs["n1"] = start("n1", "--resume")
        for proc in procs.values():
            assert proc.wait(timeout=240) == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    assert "resumed from the checkpoint of round" in (tmp_path / "n1.log").read_text()
    rounds = [
        json.loads(line)["round"]
        for line in (tmp_path / "n1" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert rounds == list(range(60))
    setup = prepare_run(load_config(config_path))
    models = [read_params(model_path(tmp_path / n, 59)) for n in roster]
    x, y = setup.dataset.x_test, setup.dataset.y_test
    _, resumed = setup.evaluator.evaluate(torch.stack(models).mean(0), x, y)
    baseline = simulate(load_config(config_path), out_dir=tmp_path / "sim", show_progress=False)
    assert abs(resumed - baseline["final"]["avg_model_accuracy"]) <= 0.01


def _toml(overrides: list[str]) -> list[str]:
    tables: dict[str, list[str]] = {}
    for item in overrides:
        key, value = item.split("=", 1)
        table, name = key.split(".")
        quoted = value if value.replace(".", "").isdigit() else f'"{value}"'
        tables.setdefault(table, []).append(f"{name} = {quoted}")
    return [line for t, lines in tables.items() for line in (f"[{t}]", *lines)]


def test_a_launch_keeps_every_peers_checkpoint_of_one_round(tmp_path: Path) -> None:
    """``fedcore launch --resume`` restarts the peers from the newest round all of them
    have a good checkpoint of: ``good_rounds`` skips a damaged one, ``drop_after`` leaves
    ``latest`` at that round (issue 27 item 4)."""
    folder = tmp_path / "checkpoints"
    for t in (20, 40, 60):
        checkpoint.write(folder, t, {"round": t})
    (folder / "round-000060.ckpt").write_bytes(b"torn")
    assert checkpoint.good_rounds(folder) == [20, 40]
    checkpoint.drop_after(folder, 20)
    assert [p.name for p in folder.iterdir()] == ["round-000020.ckpt"]
    latest = checkpoint.latest(folder)
    assert latest is not None and latest["round"] == 20
    checkpoint.drop_after(folder, None)
    assert checkpoint.latest(folder) is None
