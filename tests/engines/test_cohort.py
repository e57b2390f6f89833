"""The cohort engine (simulate.engine = "cohort", fedcore.engines.cohort): FedAvg over a
population with only the round's cohort in memory, equal to the vectorized engine bit for
bit, in memory that does not grow with the population, refusing what it does not run."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.algorithms.server import FedAvgRule, sample_indices, sample_workers
from fedcore.config import load_config
from fedcore.engines.cohort import ClientStore, CohortNetwork
from fedcore.errors import ConfigError
from fedcore.simulation.simulate import simulate
from tests.clitools import cli, one_line_error

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
POPULATION = [
    "algorithm.name=fedavg",
    "topology.kind=star",
    "algorithm.sampler=floyd",
    "data.partition=slices",
    "simulate.node_records=none",
]


def test_the_floyd_sample_is_m_distinct_clients_a_pure_function_of_seed_and_round() -> None:
    first = sample_indices(1000, 10, seed=3, t=7)
    assert first == sample_indices(1000, 10, seed=3, t=7) == sorted(set(first))
    assert len(first) == 10 and 0 <= first[0] <= first[-1] < 1000
    assert sample_indices(1000, 10, seed=4, t=7) != first != sample_indices(1000, 10, 3, 8)
    assert sample_indices(5, 9, 0, 0) == [0, 1, 2, 3, 4]  # everyone
    assert len(sample_indices(10**15, 3, 0, 0)) == 3  # O(m): the population is a number
    seen = {i for t in range(400) for i in sample_indices(20, 2, 0, t)}
    assert seen == set(range(20))  # every client is drawn in time
    workers = tuple(f"n{i}" for i in range(16))
    assert sample_workers(workers, 0.25, 3, 7, "floyd") == {
        workers[i] for i in sample_indices(16, 4, 3, 7)
    }
    with pytest.raises(ConfigError, match=r"algorithm.sampler must be one of sha256, floyd"):
        FedAvgRule(sampler="floy")


@pytest.mark.parametrize("value", ["''", "3", "[1]", "'FLOYD'", "'floyd '", "true"], ids=str)
def test_a_sampler_that_is_not_one_is_refused_in_one_line(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = ["algorithm.name=fedavg", "topology.kind=star", f"algorithm.sampler={value}"]
    argv = ["simulate", "-q", "--out", str(tmp_path)]
    one_line_error(capsys, [*argv, *(x for s in settings for x in ("--set", s))], "sampler")


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "optimizers",
    [
        ["algorithm.server_optimizer=adam", "algorithm.server_lr=0.05"],
        ["optimizer.name=lamb", "optimizer.weight_decay=0.01", "algorithm.lr=0.01"],
    ],
    ids=["fedadam", "lamb-clients"],
)
def test_the_cohort_engine_equals_the_vectorized_engine(
    optimizers: list[str], tmp_path: Path
) -> None:
    """12 clients, 3 a round, 2 local steps; FedAdam at the server, or LAMB at the
    clients (its state kept per sampled client): the global model, the round records and
    the evaluations' average-model figures are the same bits."""
    settings = [
        *POPULATION,
        *optimizers,
        "topology.nodes=12",
        "algorithm.fraction=0.25",
        "run.local_steps=2",
        "run.rounds=3",
        "run.eval_every=2",
        "model.name=mlp",
        "model.hidden=16",
        "data.batch_size=8",
    ]
    runs = {}
    # The reference engine too, once: the floyd sample and the slices on every engine.
    server_adam = "algorithm.server_optimizer=adam" in optimizers
    engines = ("vectorized", "cohort", *(("messages",) if server_adam else ()))
    for engine in engines:
        config = load_config(None, [*settings, f"simulate.engine={engine}"])
        summary = simulate(config, out_dir=tmp_path / engine, show_progress=False)
        runs[engine] = (summary, _records(tmp_path / engine))
    (vec, vec_records), (coh, coh_records) = runs["vectorized"], runs["cohort"]
    assert coh["params_sha256"] == {"server": vec["params_sha256"]["server"]}
    assert coh["engine"] == "cohort" and coh["clients_held"] <= 9 and coh["cohort"] == 3
    assert [r["kind"] for r in coh_records] == [r["kind"] for r in vec_records]
    for mine, theirs in zip(coh_records, vec_records, strict=True):
        assert mine == {k: v for k, v in theirs.items() if k in mine}
    assert set(vec_records[-1]) - set(coh_records[-1]) == {
        "mean_node_accuracy",
        "min_node_accuracy",
        "consensus_distance",
        "node_accuracy",
    }
    assert coh["final"] == {k: v for k, v in vec["final"].items() if k in coh["final"]}
    assert coh["traffic"]["bytes_sent"] == vec["traffic"]["bytes_sent"]
    if "messages" in runs:
        assert runs["messages"][0]["params_sha256"] == vec["params_sha256"]


def test_a_parked_client_continues_its_stream_exactly() -> None:
    """A store that keeps one stream whole (every other client parked as two integers,
    its epochs replayed when it is sampled again) draws the batches of one that keeps
    them all, epochs and all (5 examples, batches of 2)."""
    from fedcore.data import load_dataset
    from fedcore.data.partitions import slice_order

    data = load_dataset("digits", seed=0)
    order = slice_order(len(data.y_train), 0)
    stores = [
        ClientStore(data, order, 5, batch_size=2, order_kind=kind, seed=0, device=CPU, live=live)
        for kind in ("shuffled", "sorted")
        for live in (1, 100)
    ]
    for clients in ([3, 7], [3], [7, 9], [3, 9], [7], [3, 7, 9], [3, 7, 9], [9, 3]):
        x = [store.batches(clients)[0] for store in stores]
        assert torch.equal(x[0], x[1]) and torch.equal(x[2], x[3])
    assert stores[0].parked and len(stores[0].streams) == 1 and len(stores[0]) == 3


def test_an_interrupted_cohort_run_resumes_to_the_uninterrupted_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints every 2 rounds, Ctrl-C in round 3, --resume: the global model, records
    and figures of the run that never stopped (clients parked mid-epoch, Adam states and
    FedAvgM's velocity carried over)."""
    from fedcore.simulation.simulate import resume

    config = load_config(
        None,
        [
            *POPULATION,
            "simulate.engine=cohort",
            "topology.nodes=12",
            "algorithm.fraction=0.25",
            "algorithm.server_optimizer=momentum",
            "optimizer.name=adam",
            "algorithm.lr=0.01",
            "data.examples_per_node=5",
            "data.batch_size=2",
            "run.local_steps=2",
            "run.rounds=5",
            "run.eval_every=2",
            "run.checkpoint_every=2",
        ],
    )
    whole = simulate(config, out_dir=tmp_path / "whole", show_progress=False)
    run_round = CohortNetwork.run_round

    def interrupted(net: CohortNetwork) -> Any:
        if net.round == 3:
            raise KeyboardInterrupt
        return run_round(net)

    monkeypatch.setattr(CohortNetwork, "run_round", interrupted)
    with pytest.raises(KeyboardInterrupt):
        simulate(config, out_dir=tmp_path / "cut", show_progress=False)
    monkeypatch.undo()
    cut = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert (cut["status"], cut["rounds_completed"]) == ("interrupted", 3)
    resumed = resume(tmp_path / "cut", show_progress=False)
    for key in ("params_sha256", "final", "traffic", "clients_held", "status", "rounds_completed"):
        assert resumed[key] == whole[key], key
    assert _records(tmp_path / "cut") == _records(tmp_path / "whole")


def _population_peak(clients: int) -> tuple[int, int, int]:
    """(tracemalloc peak, tensor bytes held, clients held) of 3 rounds of 10 clients."""
    config = load_config(
        None,
        [
            *POPULATION,
            f"topology.nodes={clients}",
            f"algorithm.fraction={10 / clients}",
            "data.examples_per_node=8",
            "model.name=logreg",
            "optimizer.name=adam",
        ],
    )
    tracemalloc.start()
    try:
        net = CohortNetwork(config, device=CPU)
        for _ in range(3):
            net.run_round()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, net.live_bytes(), len(net.store)


def test_memory_does_not_grow_with_the_population() -> None:
    """1,000 and 100,000 clients, 10 a round, Adam at the clients: the same clients held,
    the same tensor bytes (streams and optimizer states of the 30 sampled clients),
    and a Python/numpy peak within 10% (about 0.9 MB; one int64 array over the larger
    population adds 0.8 MB, a Python object per client megabytes)."""
    _population_peak(1000)  # first-time allocations (caches, lazy imports) out of the way
    small_peak, small_bytes, small_held = _population_peak(1000)
    big_peak, big_bytes, big_held = _population_peak(100_000)
    assert small_held == big_held == 30
    assert big_bytes == small_bytes > 30 * 2 * 650 * 4  # 30 clients' Adam moments
    assert big_peak < 1.1 * small_peak, (small_peak, big_peak)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (["algorithm.name=ops", "topology.kind=ring"], "runs FedAvg of the server family only"),
        (["topology.kind=ring"], "needs the generated star"),
        (["algorithm.sampler=sha256"], "needs algorithm.sampler = 'floyd'"),
        (["data.partition=iid"], "set data.partition = 'slices'"),
        (["faults.drop=0.1"], "leave [faults] out"),
        (["time.step_s=1.0"], "leave [time] out"),
        (["transport.mode=deadline"], "set transport.mode = 'strict'"),
        (["simulate.node_records=all"], "set simulate.node_records = 'none'"),
        (["run.regret=true"], "set run.regret = false"),
        (["run.csv=true"], "set run.tensorboard = false and run.csv = false"),
        (["run.eval_peers=5"], "leave run.eval_peers out"),
        (["compression.codec=sign"], "set compression.codec = 'fp32'"),
        (["model.dtype=float64"], "and model.dtype = 'float32'"),
        (["data.stream=synthetic", "data.partition=slices"], "leave data.stream out"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else "",
)
def test_what_the_cohort_engine_does_not_run_is_refused_in_one_line(
    settings: list[str], needle: str
) -> None:
    config = load_config(None, [*POPULATION, "simulate.engine=cohort", *settings])
    with pytest.raises(ConfigError, match=r"simulate.engine = 'cohort' cannot run") as caught:
        CohortNetwork(config, device=CPU)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_the_population_example_runs_a_million_clients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/population.toml (1,000,000 clients, 100 a round) for two rounds;
    --resume of it without a checkpoint runs it again from round 0; --ranks of what the
    cohort engine does not run is refused in one line."""
    example = str(REPO / "examples" / "population.toml")
    out = tmp_path / "run"
    # digits, not MNIST-1D: generating MNIST-1D into an empty cache (CI's) takes seconds.
    lean = ["--set", "run.rounds=2", "--set", "data.dataset=digits"]
    status, _, err = cli(capsys, "simulate", example, *lean, "--out", str(out), "--quiet")
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["population"], summary["cohort"], summary["clients_held"]) == (10**6, 100, 200)
    assert summary["status"] == "completed" and summary["final"]["avg_model_accuracy"] > 0
    one_line_error(
        capsys,
        ["simulate", example, "--ranks", "2", "--set", "algorithm.sampler=sha256"],
        "a sharded run cannot run this config: simulate.engine = 'cohort': it needs "
        "algorithm.sampler = 'floyd'",
    )
    summary["status"] = "interrupted"  # as a Ctrl-C leaves it, with no checkpoint
    (out / "summary.json").write_text(json.dumps(summary))
    status, _, err = cli(capsys, "simulate", "--resume", str(out), "--quiet")
    assert status == 0, err
    again = json.loads((out / "summary.json").read_text())
    assert again["status"] == "completed"  # from round 0: the same run
    assert again["params_sha256"] == summary["params_sha256"]


def test_a_cohort_run_over_ranks_resumes_to_the_uninterrupted_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2 ranks, checkpoints every 2 rounds, Ctrl-C at the start of round 3 on every rank,
    --resume on 2 ranks: the one-process run's global model, records and figures (each
    rank's clients parked mid-epoch with their Adam states, FedAvgM's velocity on every
    rank). Another number of ranks, a manifest of another run, or a rank file of another
    engine is refused in one line before any rank joins the others."""
    from fedcore.cli import main
    from fedcore.engines.ranks import Ranks
    from fedcore.setup import checkpoint
    from fedcore.simulation.population import simulate_cohort_rank
    from fedcore.simulation.rank_checkpoints import MANIFEST, rank_file
    from tests.engines.test_sharded_resume import run_world

    config = load_config(
        None,
        [
            *POPULATION,
            "simulate.engine=cohort",
            "topology.nodes=12",
            "algorithm.fraction=0.5",
            "algorithm.server_optimizer=momentum",
            "optimizer.name=adam",
            "algorithm.lr=0.01",
            "data.examples_per_node=5",
            "data.batch_size=2",
            "run.local_steps=2",
            "run.rounds=5",
            "run.eval_every=2",
            "run.checkpoint_every=2",
            "transport.strict_timeout_s=60",
        ],
    )
    torch.set_num_threads(1)
    whole = simulate(config, out_dir=tmp_path / "whole", show_progress=False, threads=1)
    out = tmp_path / "two"
    outcomes = run_world(config, out, stop=3)
    assert outcomes[0] == (
        f"KeyboardInterrupt: after round 3 of 5; the results so far are in {out}; continue "
        f"with: fedcore simulate --resume {out}"
    ), outcomes
    assert outcomes[1] == "KeyboardInterrupt: ", outcomes
    cut = json.loads((out / "summary.json").read_text())
    assert (cut["status"], cut["rounds_completed"], cut["ranks"]) == ("interrupted", 3, 2)
    manifest = json.loads((out / "checkpoints" / MANIFEST).read_text())
    assert (manifest["round"], manifest["world"], len(manifest["files"])) == (2, 2, 2)
    status, _, err = cli(capsys, "simulate", "--ranks", "3", "--resume", str(out))
    assert status == 2 and "\n" not in err.strip(), err
    assert "written by 2 ranks, and each rank resumes its own clients" in err
    with pytest.raises(ConfigError, match=r"start 2 ranks \(WORLD_SIZE = 2"):  # torchrun's 3
        simulate_cohort_rank(config, Ranks(2, 3, 0, "127.0.0.1", 1), out_dir=out, resume=True)
    other = load_config(None, [*POPULATION, "simulate.engine=cohort", "topology.nodes=13"])
    with pytest.raises(ConfigError, match=r"belong to another run than its config\.toml"):
        simulate_cohort_rank(other, Ranks(0, 2, 0, "127.0.0.1", 1), out_dir=out, resume=True)
    swapped = tmp_path / "swapped"  # rank 1's file says it is another engine's
    shutil.copytree(out, swapped)
    path = rank_file(swapped, 1, 2, 2)
    checkpoint.write(path.parent, 2, {**checkpoint.read(path), "kind": "sharded-rank"})
    digest, size = checkpoint.header(path)
    manifest["files"][1].update(sha256=digest, bytes=size)
    (swapped / "checkpoints" / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"rank 1 of 2's checkpoint in .* is not a cohort run's"):
        simulate_cohort_rank(config, Ranks(1, 2, 0, "127.0.0.1", 1), out_dir=swapped, resume=True)
    assert run_world(config, out, resume=True) == {0: "ok", 1: "ok"}
    resumed = json.loads((out / "summary.json").read_text())
    for key in ("params_sha256", "final", "traffic", "clients_held", "status", "rounds_completed"):
        assert resumed[key] == whole[key], key
    assert _records(out) == _records(tmp_path / "whole")
    assert main(["simulate", "--resume", str(out)]) == 2  # completed
    assert "nothing to resume" in capsys.readouterr().err


def test_the_cohort_sharded_over_ranks_equals_one_process(tmp_path: Path) -> None:
    """2 ranks (client i on rank i % 2, holding its stream and LAMB state): the one-process
    run's global model, records and summary figures; a rank that dies ends the other with
    the lost-contact line and a failed summary."""
    from fedcore.simulation.ranks import LOST
    from tests.engines.test_sharded import _dying_rank, run_ranks

    config = load_config(
        None,
        [
            *POPULATION,
            "simulate.engine=cohort",
            "topology.nodes=12",
            "algorithm.fraction=0.5",
            "optimizer.name=lamb",
            "algorithm.lr=0.01",
            "run.local_steps=2",
            "run.rounds=3",
            "run.eval_every=2",
            "transport.strict_timeout_s=60",
        ],
    )
    torch.set_num_threads(1)
    one = simulate(config, out_dir=tmp_path / "one", show_progress=False, threads=1)
    assert run_ranks(config, 2, tmp_path / "two") == {0: "ok", 1: "ok"}
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert two["ranks"] == 2 and "ranks" not in one
    for key in ("params_sha256", "final", "traffic", "clients_held", "status", "rounds_completed"):
        assert two[key] == one[key], key
    assert _records(tmp_path / "two") == _records(tmp_path / "one")
    outcomes = run_ranks(config, 2, tmp_path / "dead", odd=_dying_rank)
    assert LOST in outcomes[0]
    failed = json.loads((tmp_path / "dead" / "summary.json").read_text())
    assert failed["status"] == "failed" and LOST in failed["error"]
