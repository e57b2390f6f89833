"""Evaluation at scale: the average model from exact column sums (the same bits in any
order and split of the rows), ``run.eval_peers`` (a seeded sample of peers whose figures
the records label as a sample; refusals at its extremes), and a sharded evaluation that
gathers two figures a peer, never a model. R = 1, 2, 3 ranks against one process with a
sample: ``tests/engines/test_sharded.py``."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore import evaluation
from fedcore.cli import main
from fedcore.cli.common import print_table
from fedcore.config import load_config
from fedcore.engines import sharded
from fedcore.engines.ranks import Ranks
from fedcore.errors import ConfigError
from fedcore.evaluation import (
    column_sums,
    eval_sample,
    exact_mean,
    mean_of_sums,
    sum_extremes,
    sum_window,
)
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_mean_is_the_same_bits_in_any_order_and_split(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(1)
    scale = torch.logspace(-30, 30, 300, dtype=torch.float64).unsqueeze(1)
    rows = (torch.randn(300, 4, generator=g, dtype=torch.float64) * scale).to(dtype)
    rows[7, 0] = torch.finfo(dtype).tiny / 8  # a subnormal
    rows[9, 1] = -torch.finfo(dtype).max
    mean = exact_mean(rows)
    # The limbs cover the window, not the format's range (float64's: 67 limbs).
    assert column_sums(rows).shape[1] <= (evaluation.SUM_WINDOW_BITS + 31) // 32 + 4 + 3
    for c in range(4):  # the exact mean, rounded (to within float64's last places)
        exact = float(sum(Fraction(v) for v in rows[:, c].tolist()) / 300)
        assert mean[c].item() == pytest.approx(exact, rel=1e-15, abs=0.0)
    order = torch.randperm(300, generator=g)
    parts = [rows[order[:1]], rows[order[1:120]], rows[order[120:]]]
    window = sum_window(sum_extremes(rows), dtype)  # the union's: a maximum of the parts'
    most = torch.stack([sum_extremes(p) for p in parts]).amax(dim=0)
    assert torch.equal(most, sum_extremes(rows))
    summed = sum((column_sums(p, window) for p in parts), torch.zeros_like(column_sums(rows)))
    assert torch.equal(mean_of_sums(summed, 300, dtype, window[0]), mean)
    assert torch.equal(exact_mean(rows.flip(0)), mean)
    monkeypatch.setattr(evaluation, "_SUM_CHUNK_VALUES", 3)  # passes of a block of 3 values
    assert torch.equal(exact_mean(rows), mean)


def test_a_mean_with_nan_or_infinities_says_so() -> None:
    rows = torch.ones(4, 4)
    rows[0, 0], rows[1, 1], rows[2, 2], rows[3, 2] = math.nan, math.inf, math.inf, -math.inf
    rows[0, 3] = -math.inf
    got = exact_mean(rows).tolist()
    assert math.isnan(got[0]) and got[1] == math.inf and math.isnan(got[2])
    assert got[3] == -math.inf
    # Columns of nothing finite (a diverged run's models), of both dtypes.
    for dtype in (torch.float32, torch.float64):
        rows = torch.full((3, 4), math.inf, dtype=dtype)
        rows[:, 1], rows[:, 2], rows[0, 3] = math.nan, -math.inf, 0.0
        got = exact_mean(rows).tolist()
        assert got[0] == math.inf and math.isnan(got[1]) and got[2] == -math.inf
        assert got[3] == math.inf


def test_the_sample_is_a_pure_function_of_the_seed() -> None:
    sample = eval_sample(7, 50, 10)
    assert torch.equal(sample, eval_sample(7, 50, 10)) and len(set(sample.tolist())) == 10
    assert sample.tolist() == sorted(sample.tolist()) and 0 <= sample.min() <= sample.max() < 50
    assert not torch.equal(sample, eval_sample(8, 50, 10))
    assert set(eval_sample(7, 50, 9).tolist()) < set(sample.tolist())  # nested
    assert eval_sample(7, 50, 50).tolist() == list(range(50))
    assert eval_sample(7, 50, 1).numel() == 1


@pytest.mark.parametrize(
    "value", ["0", "-1", "1.5", "true", "'some'", "'3'", "1000001", "[1]"], ids=str
)
def test_a_bad_eval_peers_is_refused_in_one_line(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=r'run.eval_peers = .* must be "all" or a whole'):
        load_config(None, [f"run.eval_peers={value}"])
    assert main(["simulate", "--quiet", "--set", f"run.eval_peers={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.eval_peers" in err[0], err


@pytest.mark.parametrize("algorithm", ["dpsgd", "fedavg"])
def test_eval_peers_is_at_most_the_peers_evaluated(algorithm: str) -> None:
    """Every node's model, or the server family's workers' (the server left out)."""
    kind = "star" if algorithm == "fedavg" else "ring"
    settings = [f"algorithm.name={algorithm}", "topology.nodes=6", f"topology.kind={kind}"]
    if algorithm == "dpsgd":
        settings.append("topology.undirected=true")
    setup = prepare_run(load_config(None, settings))
    evaluated = len(setup.graph.nodes) - (setup.algorithm.server is not None)
    assert evaluated == 6
    for fine in (1, evaluated, "'all'"):
        prepare_run(load_config(None, [*settings, f"run.eval_peers={fine}"]))
    with pytest.raises(ConfigError, match=f"more than the {evaluated} peers") as caught:
        prepare_run(load_config(None, [*settings, f"run.eval_peers={evaluated + 1}"]))
    assert "\n" not in str(caught.value)


def _run(tmp: Path, name: str, *settings: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = load_config(
        None,
        ["run.rounds=4", "run.eval_every=2", "topology.nodes=10", "run.seed=3", *settings],
    )
    out = tmp / name
    summary = simulate(config, out_dir=out, show_progress=False, threads=1)
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    evals = [r for r in map(json.loads, lines) if r["kind"] == "eval"]
    return summary, evals


def test_a_sample_measures_its_peers_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, full_evals = _run(tmp_path, "all")
    assert "eval_peers" not in full["final"]
    for engine in ("vectorized", "messages"):
        got, evals = _run(tmp_path, engine, "run.eval_peers=4", f"simulate.engine={engine}")
        assert got["engine"] == engine and got["params_sha256"] == full["params_sha256"]
        assert got["run_id"] == full["run_id"]  # the same run, measured otherwise
        for whole, some in zip(full_evals, evals, strict=True):
            assert some["eval_peers"] == {"sampled": 4, "of": 10}
            for key in ("avg_model_accuracy", "avg_model_test_loss", "consensus_distance"):
                assert some[key] == whole[key], key  # every peer's, exactly
            picked = sorted(some["node_accuracy"])
            assert len(picked) == 4 and set(picked) <= set(whole["node_accuracy"])
            accs = [whole["node_accuracy"][n] for n in some["node_accuracy"]]
            assert list(some["node_accuracy"].values()) == accs
            assert some["mean_node_accuracy"] == sum(accs) / 4
            assert some["min_node_accuracy"] == min(accs)
        assert got["final"]["eval_peers"] == {"sampled": 4, "of": 10}
        print_table(got)
        table = capsys.readouterr().out
        assert "(a sample of 4 of 10 peers)" in table.split("mean node accuracy")[1]
    _, every_evals = _run(tmp_path, "every", "run.eval_peers=10")
    for whole, some in zip(full_evals, every_evals, strict=True):
        assert some.pop("eval_peers") == {"sampled": 10, "of": 10}
        assert some == whole


def test_a_sharded_evaluation_gathers_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """On one rank (no process group): the evaluation gathers two figures a peer, and the
    record is the one-process engine's."""
    config = load_config(
        None,
        ["algorithm.name=dpsgd", "topology.undirected=true", "topology.nodes=12", "run.rounds=1"],
    )
    setup = prepare_run(config, hosts_all=True, simulated=True)
    net = sharded.ShardedNetwork(setup, Ranks(0, 1))
    gathered: list[tuple[int, ...]] = []
    real = sharded.gather_rows

    def spy(ranks: Ranks, local: torch.Tensor, shards: Any) -> torch.Tensor | None:
        gathered.append(tuple(local.shape))
        return real(ranks, local, shards)

    monkeypatch.setattr(sharded, "gather_rows", spy)
    net.run_round()
    gathered.clear()
    record = net.evaluate()
    assert gathered == [(12, 2)]
    from fedcore.engines.vectorized import VectorizedNetwork

    one = VectorizedNetwork(setup, device=torch.device("cpu"))
    one.run_round()
    assert record == one.evaluate()
