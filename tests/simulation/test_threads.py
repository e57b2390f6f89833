"""``--threads auto``: the thread count by the run's shape, and runs whose bits do not
depend on it.

:func:`fedcore.simulation.simulate.choose_threads` gives one torch thread per
:data:`fedcore.runtime.BYTES_PER_THREAD` of the run's largest whole-state pass, up to the
usable cores. Because that count follows the machine, a run must give the same bits with
any count: the gradient path keeps each row's GEMMs on one thread
(:mod:`fedcore.gradients`), the updates are elementwise, and the one reduction that torch
splits by thread count (a codec's scale over a row longer than torch's grain) is computed
on one thread (``fedcore.gradients.row_reduce``). The runs below have rows of 45,610
parameters, above the grain of 32,768.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import fedcore
from fedcore.cli.app import main
from fedcore.config import load_config
from fedcore.runtime import BYTES_PER_THREAD, auto_threads, usable_cores
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import choose_threads, simulate
from tests.clitools import TINY
from tests.engines.test_vectorized import GRAPHS

LONG_ROWS = ["topology.nodes=8", "model.name=mlp", "model.hidden=700", "run.rounds=3"]
"""Rows of 45,610 parameters (digits: 64 inputs, 700 hidden, 10 classes)."""


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The test process imported torch before fedcore (conftest), so OpenMP read its wait
    # policy before fedcore could set it; the choice is tested as in the CLI's processes.
    monkeypatch.setattr(fedcore, "OPENMP_SLEEPS", True)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_auto_threads_is_one_per_block_of_bytes_up_to_the_cores() -> None:
    assert auto_threads(0, cores=8) == 1
    assert auto_threads(BYTES_PER_THREAD - 1, cores=8) == 1
    assert auto_threads(2 * BYTES_PER_THREAD, cores=8) == 2
    assert auto_threads(3 * BYTES_PER_THREAD - 1, cores=8) == 2
    assert auto_threads(1000 * BYTES_PER_THREAD, cores=8) == 8
    assert auto_threads(1000 * BYTES_PER_THREAD, cores=0) == 1
    assert 1 <= auto_threads(1 << 40) == usable_cores()


def test_choose_threads_on_both_sides_of_the_rule() -> None:
    small = prepare_run(load_config(None, []), hosts_all=True)  # 16 peers of 650 values
    assert choose_threads(small, "vectorized", cores=4)[0] == 1
    assert choose_threads(small, "messages", cores=4)[0] == 1
    big = prepare_run(load_config(None, ["model.name=mlp", "model.hidden=3000"]), hosts_all=True)
    model = big.start.numel() * 4  # 225,010 parameters: 0.9 MB, 16 of them 14 MB
    assert model < BYTES_PER_THREAD < 16 * model
    threads, why = choose_threads(big, "vectorized", cores=4)
    assert threads == 4 and why == "16 peers' models: 13.7 MiB"
    assert choose_threads(big, "vectorized", cores=64)[0] == 16 * model // BYTES_PER_THREAD
    assert choose_threads(big, "messages", cores=4) == (1, "one peer's model: 0.9 MiB")


def test_auto_keeps_one_thread_where_openmp_threads_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    big = prepare_run(load_config(None, ["model.name=mlp", "model.hidden=3000"]), hosts_all=True)
    monkeypatch.setattr(fedcore, "OPENMP_SLEEPS", False)
    threads, why = choose_threads(big, "vectorized", cores=4)
    assert threads == 1 and "OMP_WAIT_POLICY" in why


@pytest.mark.parametrize(
    ("environment", "sleeps"), [(None, True), ("PASSIVE", True), ("active", False)]
)
def test_importing_fedcore_first_makes_openmp_threads_sleep(
    environment: str | None, sleeps: bool
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if environment is not None:
        env["OMP_WAIT_POLICY"] = environment
    code = "import os, fedcore, torch; print(fedcore.OPENMP_SLEEPS, os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(sleeps), environment or "PASSIVE"]
    torch_first = "import torch, fedcore; print(fedcore.OPENMP_SLEEPS)"
    env.pop("OMP_WAIT_POLICY", None)
    out = subprocess.run(
        [sys.executable, "-c", torch_first], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False"]


def test_simulate_sets_the_count_for_the_run_and_puts_it_back(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = load_config(None, ["model.name=mlp", "model.hidden=3000", "run.rounds=1"])
    summary = simulate(config, out_dir=tmp_path / "a", show_progress=False, threads="auto")
    assert summary["threads"] == min(usable_cores(), 6)  # 13.7 MiB: up to 6
    assert torch.get_num_threads() == 1
    summary = simulate(config, out_dir=tmp_path / "b", show_progress=False, threads=None)
    assert summary["threads"] == 1
    with pytest.raises(Exception, match="whole number >= 1 or 'auto'"):
        simulate(config, out_dir=tmp_path / "c", show_progress=False, threads=0)


def test_the_cli_takes_a_count_or_auto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "two", "-1"):
        with pytest.raises(SystemExit) as exit_:
            main(["simulate", "--threads", bad])
        assert exit_.value.code == 2
        assert "must be a whole number >= 1 or auto" in capsys.readouterr().err
    out = ["--out", str(tmp_path / "run")]
    assert main(["simulate", "--quiet", *out, *TINY, "--threads", "2"]) == 0
    assert '"threads": 2' in (tmp_path / "run" / "summary.json").read_text()


def _digest(overrides: list[str], threads: int, folder: Path) -> str:
    config = load_config(None, overrides)
    summary = simulate(config, out_dir=folder, show_progress=False, force=True, threads=threads)
    assert summary["threads"] == threads
    return str(summary["params_sha256"])


@pytest.mark.parametrize("algorithm", sorted(set(GRAPHS) - {"ops"}))
def test_every_algorithm_gives_the_same_bits_with_one_or_two_threads(
    algorithm: str, tmp_path: Path
) -> None:
    """With the sign codec, whose scale is a mean over the whole row."""
    overrides = [
        *LONG_ROWS,
        f"algorithm.name={algorithm}",
        *GRAPHS[algorithm],
        "compression.codec=sign",
    ]
    one, two = (_digest(overrides, t, tmp_path / "run") for t in (1, 2))
    assert one == two


@pytest.mark.parametrize(
    "setting",
    [
        "compression.codec=qsgd",
        "compression.codec=topk",
        "compression.codec=s2fp8",
        "optimizer.name=lars",
        "optimizer.name=lamb",
        "optimizer.name=adam",
    ],
)
@pytest.mark.parametrize("engine", ["messages", "vectorized"])
def test_codecs_and_optimizers_give_the_same_bits_with_one_or_two_threads(
    setting: str, engine: str, tmp_path: Path
) -> None:
    overrides = [
        *LONG_ROWS,
        "algorithm.name=dpsgd",
        *GRAPHS["dpsgd"],
        setting,
        f"simulate.engine={engine}",
    ]
    one, two = (_digest(overrides, t, tmp_path / "run") for t in (1, 2))
    assert one == two


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "x", "", [2]], ids=repr)
def test_a_thread_count_that_is_not_one_is_refused_in_one_line(threads: object) -> None:
    from fedcore.errors import ConfigError
    from fedcore.runtime import run_threads

    with (
        pytest.raises(ConfigError, match="whole number >= 1 or 'auto'"),
        run_threads(threads, lambda: 1),  # type: ignore[arg-type]
    ):
        pass


def test_run_threads_sets_the_count_and_puts_it_back() -> None:
    from fedcore.runtime import run_threads

    before = torch.get_num_threads()
    seen = []
    for threads in (None, 1, "auto"):
        with run_threads(threads, lambda: 1):
            seen.append(torch.get_num_threads())
        assert torch.get_num_threads() == before
    assert seen == [before, 1, 1]
