"""``benchmarks/versus_flower.py`` without Flower: the exit-2 line that says how to make
Flower's venv, the workloads as fedcore configs, and fedcore's side alone for 2 rounds."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fedcore.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "versus_flower.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("versus_flower", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("versus_flower", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    "args", [(), ("--flower-python", "/nonexistent/python"), ("--flower-python", sys.executable)]
)
def test_without_flower_it_says_how_and_exits_2(args: tuple[str, ...], tmp_path: Path) -> None:
    """No interpreter, one that does not exist, and one without flwr (this one: the test
    venv has no Flower) all end with one line that names the venv command."""
    if args and args[-1] == sys.executable and importlib.util.find_spec("flwr") is not None:
        pytest.skip("this interpreter has flwr")
    proc = _run(*args, "--out", str(tmp_path / "out.json"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pip install 'flwr[simulation]' torch==2.13.0" in lines[0]
    assert "--flower-python" in lines[0]
    assert proc.stdout == ""
    assert not (tmp_path / "out.json").exists()


def test_workloads_are_the_stated_fedcore_configs() -> None:
    """Each workload is examples/fedavg.toml with its clients, sample and local steps."""
    module = _script()
    for work in module.WORKLOADS.values():
        config = load_config(module.EXAMPLE, work.overrides(3))
        assert config.algorithm.name == "fedavg"
        assert config.topology.kind == "star"
        assert config.topology.nodes == work.clients
        assert config.algorithm.options["fraction"] == work.fraction
        assert config.run.local_steps == work.local_steps
        assert config.run.rounds == 3 and config.run.eval_every == 3
        assert config.model.name == "mlp" and config.model.hidden == work.hidden
        assert config.data.partition == "iid" and config.data.dataset == work.dataset
    assert {w.clients for w in module.WORKLOADS.values()} == {100, 1000, 8, 16}


@pytest.mark.slow  # two fedcore processes of 2 rounds: 20-50 s on the loaded 2-core box
def test_fedcore_side_alone(tmp_path: Path) -> None:
    out = tmp_path / "versus.json"
    proc = _run(
        "--only",
        "fedcore",
        "--workloads",
        "fedavg-100",
        "--rounds",
        "2",
        "--repeats",
        "1",
        "--out",
        str(out),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    (row,) = report["workloads"]
    assert row["auto_engine"] in ("messages", "vectorized")
    assert row["parameters"] == 40 * 64 + 64 + 64 * 10 + 10  # mnist1d's 40 features
    other = "messages" if row["auto_engine"] == "vectorized" else "vectorized"
    assert set(row["sides"]) == {"fedcore-auto", f"fedcore-{other}"}
    for side, runs in row["runs"].items():
        (run,) = runs
        assert "error" not in run, (side, run)
        assert run["rounds_timed"] == 2
        assert 0 < run["per_round"] < run["startup_to_round1"] < run["process_seconds"]
        assert len(run["loadavg_before"]) == 3
    assert "fedavg-100" in proc.stdout and "fedcore auto" in proc.stdout
