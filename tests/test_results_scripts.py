"""The results scripts and benchmarks run end to end at a tiny size, and the results
table says what ``summary.json`` says.

Only what is robust at that size is checked: the script completes and writes its files,
every method reports a finite accuracy, and the ones that should learn at all do.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clitools import TINY, cli

ROOT = Path(__file__).resolve().parents[1]
# The scripts run their grids with --jobs 1, in the script's process: a worker pool would
# only add an interpreter a worker (a few CPU seconds each) on a CI box whose cores the
# suite's own workers already fill; the runs are the same either way (the sweep's
# test_jobs_2_runs_in_workers_and_gives_the_same_runs, tests/simulation/test_sweep.py).
CHANCE = 0.1  # ten classes


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.slow  # 25-50 s on the 2-core box: 12 short D-PSGD runs
def test_large_batch_results_tiny(tmp_path: Path) -> None:
    _run(
        [
            "scripts/large_batch_results.py",
            "--tiny",
            "--jobs",
            "1",
            "--out",
            str(tmp_path),
        ],
        timeout=400,
    )
    stem = tmp_path / "large-batch-digits"
    for suffix in (".md", ".json", ".png"):
        assert stem.with_suffix(suffix).stat().st_size > 0, suffix
    report = json.loads(stem.with_suffix(".json").read_text(encoding="utf-8"))
    rows = report["rows"]
    keys = {row["key"] for row in rows}
    assert keys == {"sgd", "momentum", "sgd-linear", "momentum-linear", "adam", "lars", "lamb"}
    assert {row["batch"] for row in rows} == {32, 128, report["setup"]["per_node"]}
    for row in rows:
        # Equal epochs: every batch sees about as many examples.
        assert row["epochs"] == pytest.approx(rows[0]["epochs"], rel=0.1), row
        if "failed" in row:  # divergence is a finding, only for the linearly scaled rate
            assert row["key"] in ("sgd-linear", "momentum-linear"), row
            continue
        acc = row["avg_model_accuracy"]
        assert math.isfinite(acc) and 0 <= acc <= 1, row
        if row["key"] not in ("sgd-linear", "momentum-linear"):
            assert acc > CHANCE + 0.05, row
    small_sgd = next(r for r in rows if r["key"] == "sgd")
    assert small_sgd["avg_model_accuracy"] > 0.7, small_sgd
    table = stem.with_suffix(".md").read_text(encoding="utf-8")
    assert "LAMB" in table and "LARS" in table


def test_optimizer_step_benchmark_tiny(tmp_path: Path) -> None:
    out = tmp_path / "optimizer_step.json"
    proc = _run(["benchmarks/optimizer_step.py", "--tiny", "--out", str(out)], timeout=60)
    assert "lamb" in proc.stdout
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["machine"]["cpu_count"]
    names = {"lr * g", "sgd", "momentum", "adam", "adamw", "lars", "lamb"}
    for result in report["results"]:
        rows = {row["optimizer"]: row for row in result["rows"]}
        assert names <= set(rows)
        assert rows["lr * g"]["ratio_to_lr_g"] == pytest.approx(1.0)
        for row in rows.values():
            assert math.isfinite(row["seconds_per_call"]) and row["seconds_per_call"] > 0


@pytest.mark.slow  # about 10 s: three short runs
def test_federated_results_tiny(tmp_path: Path) -> None:
    """FedAvg with C = 1, K = 1 tracks CENTRAL on the same split (within a few points: the
    Dirichlet parts differ in size, so the weights are not CENTRAL's equal ones)."""
    _run(["scripts/federated_results.py", "--tiny", "--jobs", "1", "--out", str(tmp_path)], 400)
    stem = tmp_path / "federated-digits"
    assert stem.with_suffix(".png").stat().st_size > 0
    rows = {r["method"]: r for r in json.loads(stem.with_suffix(".json").read_text("utf-8"))}
    assert set(rows) == {"CENTRAL", "FedAvg C=1 K=1", "FedAvg C=0.25 K=5"}
    acc = {k: r["avg_model_accuracy"] for k, r in rows.items()}
    assert abs(acc["FedAvg C=1 K=1"] - acc["CENTRAL"]) < 0.05
    assert acc["FedAvg C=0.25 K=5"] > 0.5
    assert rows["FedAvg C=0.25 K=5"]["mb_per_node"] < rows["FedAvg C=1 K=1"]["mb_per_node"] / 3


@pytest.mark.slow  # about 20 s: 18 short runs
def test_time_results_tiny(tmp_path: Path) -> None:
    """Claims (a)-(c) at CI size: with homogeneous peers each asynchronous method ends
    within a few points of its synchronous counterpart; with 10% of the peers 10x slower,
    AD-PSGD, asynchronous push-sum and FedBuff reach the target in less virtual time."""
    _run(["scripts/time_results.py", "--tiny", "--jobs", "1", "--out", str(tmp_path)], 600)
    stem = tmp_path / "time-digits"
    assert stem.with_suffix(".png").stat().st_size > 0
    rows = {r["case"]: r for r in json.loads(stem.with_suffix(".json").read_text("utf-8"))}
    assert not [case for case, r in rows.items() if "failed" in r]
    for sync, asyn in (("D-PSGD", "AD-PSGD"), ("OPS", "async push-sum"), ("FedAvg", "FedBuff")):
        same = rows[f"homogeneous: {sync}"]["accuracy"] - rows[f"homogeneous: {asyn}"]["accuracy"]
        assert abs(same) < 0.06, (sync, asyn)
        slow = rows[f"heavy-tailed: {asyn}"]
        assert slow["engine"] == "events" and slow["speedup_to_target"] > 2, (asyn, slow)


def _byzantine(grid: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scripts/byzantine_results.py --grids GRID --tiny`` in this process (``--jobs 1``
    runs the grid here: a new process would import torch again)."""
    import runpy

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    argv = ["--grids", grid, "--tiny", "--jobs", "1", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["byzantine_results.py", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "scripts" / "byzantine_results.py"), run_name="__main__")
    assert not done.value.code


@pytest.mark.slow  # about 4 s: six short runs, in this process
def test_byzantine_results_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claim (b) at CI size: weight inflation stops plain push-sum (the inflated mass drives
    honest peers' shares out of range) while clipped push-sum completes within a few
    points of its honest run, and withheld mass costs it little."""
    _byzantine("push-sum", tmp_path, monkeypatch)
    stem = tmp_path / "byzantine-push-sum"
    assert stem.with_suffix(".png").stat().st_size > 0
    rows = {r["case"]: r for r in json.loads(stem.with_suffix(".json").read_text("utf-8"))}
    assert rows["ops, inflate"]["failed"] and not rows["ops, no attack"]["failed"]
    honest = rows["clipped-push-sum, no attack"]["mean_node_accuracy"][0]
    assert honest > 0.8
    for attack in ("inflate", "withhold"):
        row = rows[f"clipped-push-sum, {attack}"]
        assert not row["failed"] and row["mean_node_accuracy"][0] > honest - 0.05, attack


@pytest.mark.slow  # about 4 s: twelve short runs, in this process
def test_byzantine_gossip_results_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claim (a) at CI size: dissensus by two of 16 peers of a torus breaks plain gossip,
    not self-centered clipping; on the non-IID dumbbell with no attack, the trimmed mean
    and the median cut the bridge (each clique stays at its own half of the classes)."""
    _byzantine("gossip", tmp_path, monkeypatch)
    stem = tmp_path / "byzantine-gossip"
    rows = {r["case"]: r for r in json.loads(stem.with_suffix(".json").read_text("utf-8"))}
    acc = {case: row["mean_node_accuracy"][0] for case, row in rows.items()}
    assert acc["torus, dpsgd, dissensus"] < 0.5 < 0.85 < acc["torus, clippedgossip, dissensus"]
    cut = max(acc["dumbbell, trimmed-gossip, no attack"], acc["dumbbell, median-gossip, no attack"])
    assert cut < 0.56 < acc["dumbbell, dpsgd, no attack"], acc


@pytest.mark.slow  # about 3 s: six short runs, in this process
def test_byzantine_star_results_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claim (c) at CI size: the star grid runs every aggregator with and without two
    Byzantine workers of ten, and the robust rules keep the server's model learning."""
    _byzantine("star", tmp_path, monkeypatch)
    stem = tmp_path / "byzantine-star"
    rows = {r["aggregator"]: r for r in json.loads(stem.with_suffix(".json").read_text("utf-8"))}
    assert set(rows) == {"mean", "median", "krum"}
    for row in rows.values():
        worst = row["worst"]["2"]
        assert worst["attack"] == "sign flip" and worst["accuracy"] > 0.6, row


def test_the_table_and_the_summary_give_one_time_to_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``time to target`` in the table is ``summary.json``'s ``time_to_target`` round: the
    ``round`` of the first evaluation record at the target (counted from 0, as every record
    of ``metrics.jsonl``), not one more (the table said 25 where the summary said 24)."""
    out = tmp_path / "run"
    target = ["--set", "run.target_accuracy=0.01", "--set", "run.rounds=4"]
    status, printed, err = cli(capsys, "simulate", *TINY, *target, "--out", str(out))
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    hit = summary["time_to_target"]
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = (json.loads(line) for line in lines)
    first = next(r for r in records if r.get("kind") == "eval")
    assert first["avg_model_accuracy"] >= 0.01  # so the first evaluation is the hit
    assert hit["round"] == first["round"] == 1  # rounds 0 and 1 ran: evaluated after round 1
    (line,) = [row for row in printed.splitlines() if "time to target" in row]
    assert f"round {hit['round']}, accuracy {hit['accuracy']:.4f}" in line, line


@pytest.mark.slow  # about 4 s: three short runs, in this process
def test_privacy_results_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claim (d) at CI size: DP-SGD's accuracy rises with epsilon toward the non-private
    run's, each run spending the epsilon it was calibrated to. In this process (``--jobs
    1`` runs the grid here): a new one would import torch and Opacus again."""
    import runpy

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    argv = ["--tiny", "--jobs", "1", "--mechanisms", "dp-sgd", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["privacy_results.py", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "scripts" / "privacy_results.py"), run_name="__main__")
    assert not done.value.code
    rows = {r["case"]: r for r in json.loads((tmp_path / "privacy.json").read_text("utf-8"))}
    acc = {case: row["avg_model_accuracy"][0] for case, row in rows.items()}
    assert acc["dp-sgd, epsilon 1"] < acc["dp-sgd, epsilon 8"] < acc["dp-sgd, non-private"]
    for eps in (1, 8):
        assert eps * 0.99 < rows[f"dp-sgd, epsilon {eps}"]["epsilon"] <= eps


def _tracking(grids: list[str], out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scripts/tracking_results.py --grids ... --tiny`` in this process."""
    import runpy

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    argv = ["--grids", *grids, "--tiny", "--jobs", "1", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["tracking_results.py", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "scripts" / "tracking_results.py"), run_name="__main__")
    assert not done.value.code


@pytest.mark.slow  # about 2 s: eight least-squares runs on 8 peers, 150 rounds, in this process
def test_tracking_bias_results_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claim (a) at CI size: on strongly heterogeneous least squares, D-PSGD and push-sum
    SGD stop at a floor that grows with the step, and the tracking rules go far below it,
    on the ring and on the one-way social digraph."""
    _tracking(["bias"], tmp_path, monkeypatch)
    rows = json.loads((tmp_path / "tracking-bias.json").read_text("utf-8"))
    final = {(r["rule"], r["lr"]): r["distance"][0] for r in rows}
    for biased, tracking in (("dpsgd", "dsgt"), ("ops", "push-pull")):
        assert final[(biased, 0.02)] < final[(biased, 0.05)]  # the floor grows with the step
        assert final[(tracking, 0.05)] < 0.05 < 0.5 < final[(biased, 0.02)], final
    assert (tmp_path / "tracking-bias.png").stat().st_size > 0


@pytest.mark.slow  # about 2 s: two Push-Pull runs of 60 rounds, in this process
def test_tracking_speedup_results_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Claim (b)'s grid runs end to end and reports each population's rounds to the target
    and a final accuracy above chance (the speed-up itself needs the full size)."""
    _tracking(["speedup"], tmp_path, monkeypatch)
    rows = json.loads((tmp_path / "tracking-speedup.json").read_text("utf-8"))
    assert [r["peers"] for r in rows] == [4, 16]
    for row in rows:
        assert row["final"][0] > CHANCE + 0.05 and len(row["rounds_to_0.2"]) == 1, row
