"""Tests of the ``fedcore`` command line: error paths, simulate, topology show, plot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.cli import main
from fedcore.config import load_config
from tests.clitools import PNG_MAGIC, TINY, assert_one_line_error, cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths (topologies/, examples/) resolve against the repository root."""
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO))


def simulate(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> dict[str, Any]:
    status, _, err = cli(capsys, "simulate", "-q", "--out", str(out), *TINY, *extra)
    assert status == 0, err
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return summary


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- error paths ------------------------------------------------------------------------


def wrong_width_model(*, input_dim: int, num_classes: int) -> torch.nn.Module:
    """A user model whose output does not match the number of classes."""
    return torch.nn.Linear(input_dim, num_classes + 1)


class _Broken(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this model is broken")


def broken_model(*, input_dim: int, num_classes: int) -> torch.nn.Module:
    """A user model that raises on its first batch."""
    return _Broken()


ArgvMaker = Callable[[Path], list[str]]


def sim(*args: str) -> ArgvMaker:
    return lambda tmp: ["simulate", "-q", "--out", str(tmp / "run"), *args]


def sim_file(name: str, text: str, *args: str) -> ArgvMaker:
    def make(tmp: Path) -> list[str]:
        path = tmp / name
        path.write_text(text, encoding="utf-8")
        return ["simulate", "-q", "--out", str(tmp / "run"), str(path), *args]

    return make


def sim_graph(name: str, content: str) -> ArgvMaker:
    def make(tmp: Path) -> list[str]:
        path = tmp / name
        path.write_text(content, encoding="utf-8")
        return ["simulate", "-q", "--out", str(tmp / "run"), "--set", f"topology.file={path}"]

    return make


ERRORS: dict[str, tuple[ArgvMaker, tuple[str, ...]]] = {
    "missing-config": (
        lambda tmp: ["simulate", "-q", str(tmp / "absent.toml")],
        ("cannot read config file", "absent.toml"),
    ),
    "invalid-toml": (sim_file("bad.toml", "[run\nrounds ="), ("bad.toml", "not valid TOML")),
    "unknown-table": (sim_file("t.toml", "[foo]\nx = 1\n"), ("unknown config table", "[foo]")),
    "unknown-key": (sim("--set", "run.bogus=1"), ("unknown key", "run.bogus")),
    "wrong-type": (sim("--set", "run.rounds=abc"), ("run.rounds", "'abc'")),
    "set-without-equals": (sim("--set", "run.rounds"), ("--set", "'run.rounds'", "TABLE.KEY")),
    "set-without-dot": (sim("--set", "rounds=3"), ("--set", "'rounds=3'", "TABLE.KEY")),
    "unknown-algorithm": (
        sim("--set", "algorithm.name=nope"),
        ("unknown algorithm", "'nope'", "ops"),
    ),
    "unknown-algorithm-option": (sim("--set", "algorithm.bogus=1"), ("bogus",)),
    "unknown-topology-kind": (
        sim("--set", "topology.kind=nope"),
        ("topology kind", "'nope'", "ring"),
    ),
    "unknown-dataset": (sim("--set", "data.dataset=nope"), ("unknown dataset", "'nope'")),
    "unknown-model": (sim("--set", "model.name=nope"), ("unknown model", "'nope'")),
    "bad-model-import": (
        sim("--set", "model.name=nosuchpkg.mod:f"),
        ("cannot import", "nosuchpkg"),
    ),
    "bad-model-option": (sim("--set", "model.foo=1"), ("logreg", "foo")),
    "model-output-does-not-fit": (
        sim("--set", "model.name=tests.cli.test_commands:wrong_width_model"),
        ("wrong_width_model", "expected (2, 10)"),
    ),
    "model-that-raises": (
        sim("--set", "model.name=tests.cli.test_commands:broken_model"),
        ("broken_model", "failed on a batch"),
    ),
    "tiny-test-fraction": (sim("--set", "data.test_fraction=0.001"), ("test_fraction",)),
    "infinite-alpha": (sim("--set", "data.alpha=inf"), ("data.alpha",)),
    "out-is-a-file": (
        lambda tmp: [
            "simulate",
            "-q",
            "--out",
            str(write_json(tmp / "file.json", {})),
            *TINY,
        ],
        ("cannot write", "file.json"),
    ),
    "unknown-partition": (sim("--set", "data.partition=nope"), ("data.partition", "'nope'")),
    "graph-file-missing": (
        lambda tmp: sim("--set", f"topology.file={tmp / 'nope.json'}")(tmp),
        ("nope.json", "does not exist"),
    ),
    "graph-file-bad-json": (sim_graph("g.json", "{bad"), ("g.json", "not valid JSON")),
    "graph-file-negative-weight": (
        sim_graph("neg.json", json.dumps({"edges": [["a", "b", -1], ["b", "a", 1]]})),
        ("neg.json", "weight", "-1", "non-negative"),
    ),
    "graph-not-strongly-connected": (
        sim_graph("split.json", json.dumps({"edges": [["a", "b"], ["b", "a"], ["c", "d"]]})),
        ("not strongly connected", "components", "[a, b]", "[c]", "[d]"),
    ),
    "too-few-nodes": (sim("--set", "topology.nodes=1"), ("at least 2",)),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_error_is_one_line_and_exit_status_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_argv, needles = ERRORS[case]
    status, out, err = cli(capsys, *make_argv(tmp_path))
    assert_one_line_error(status, out, err, *needles)
    assert not (tmp_path / "run").exists()  # nothing written before the config is valid


def test_dpsgd_on_the_one_way_social_graph_points_to_push_sum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = cli(
        capsys, "simulate", "-q", "--out", str(tmp_path), "--set", "algorithm.name=dpsgd"
    )
    line = assert_one_line_error(status, out, err, "dpsgd")
    assert "one-way" in line or "undirected" in line
    assert "push-sum" in line or "'ops'" in line


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("bogus:3", ("'bogus:3'", "unknown kind")),
        ("ring", ("'ring'", "KIND:NODES")),
        ("ring:x", ("'ring:x'", "node count")),
        ("nope.json", ("nope.json", "does not exist")),
        ("topologies/absent.graphml", ("absent.graphml", "does not exist")),
    ],
)
def test_topology_show_errors(
    spec: str, needles: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = cli(capsys, "topology", "show", spec)
    assert_one_line_error(status, out, err, *needles)
    assert out == ""


def test_topology_show_invalid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_json(tmp_path / "neg.json", {"edges": [["a", "b", -0.5], ["b", "a", 1.0]]})
    status, out, err = cli(capsys, "topology", "show", str(path))
    assert_one_line_error(status, out, err, "neg.json", "weight")


def test_plot_of_a_folder_that_is_not_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "x.png"
    status, out, err = cli(capsys, "plot", str(tmp_path), "--out", str(png))
    assert_one_line_error(status, out, err, "not a run folder", "metrics.jsonl")
    assert not png.exists()


def test_plot_of_a_run_without_evaluations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"kind": "node"}\n', encoding="utf-8")
    status, out, err = cli(capsys, "plot", str(tmp_path), "--out", str(tmp_path / "x.png"))
    assert_one_line_error(status, out, err, "no evaluation records")


def test_non_utf8_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[run]\nname = "caf\xe9"\n')
    status, out, err = cli(capsys, "simulate", "-q", "--out", str(tmp_path / "run"), str(path))
    assert_one_line_error(status, out, err, "latin1.toml")


def test_negative_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = cli(
        capsys, "simulate", "-q", "--out", str(tmp_path / "run"), *TINY, "--set", "run.seed=-1"
    )
    assert_one_line_error(status, out, err, "run.seed")


def test_dataset_factory_with_the_wrong_signature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = cli(
        capsys,
        "simulate",
        "-q",
        "--out",
        str(tmp_path / "run"),
        *TINY,
        "--set",
        "data.dataset=examples.custom.my_experiment:make_model",
    )
    assert_one_line_error(status, out, err, "make_model")


def test_errors_in_a_real_process_reach_stderr_without_traceback(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for argv in (
        ["topology", "show", "bogus:3"],
        ["plot", str(tmp_path), "--out", str(tmp_path / "x.png")],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "fedcore", *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr)


def test_argparse_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


# --- simulate ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(["simulate", "-q", "--out", str(out), *TINY]) == 0
    return out


def test_simulate_writes_the_results_folder(run_dir: Path) -> None:
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.toml",
        "curves.png",
        "metrics.jsonl",
        "summary.json",
    ]
    assert (run_dir / "curves.png").read_bytes().startswith(PNG_MAGIC)


def test_simulate_config_toml_reloads_to_the_same_config(run_dir: Path) -> None:
    expected = load_config(None, [TINY[i + 1] for i in range(0, len(TINY), 2)])
    assert load_config(run_dir / "config.toml") == expected


def test_simulate_metrics_have_node_and_eval_records(run_dir: Path) -> None:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    nodes = [r for r in records if r["kind"] == "node"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(nodes) == 4 * 3
    assert {(r["node"], r["round"]) for r in nodes} == {
        (f"n{i}", t) for i in range(4) for t in range(3)
    }
    for r in nodes:
        assert r["loss"] >= 0 and r["bytes_sent"] >= 0 and r["messages_sent"] >= 0
    assert [r["round"] for r in evals] == [1, 2]  # every 2nd round and the last
    for r in evals:
        assert 0.0 <= r["avg_model_accuracy"] <= 1.0
        assert 0.0 <= r["mean_node_accuracy"] <= 1.0
        assert r["consensus_distance"] >= 0


def test_simulate_summary(run_dir: Path) -> None:
    s = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    assert s["algorithm"] == "ops"
    assert s["transport"] == "inproc"
    assert s["nodes"] == 4
    assert s["rounds"] == 3
    assert isinstance(s["wall_seconds"], float) and s["wall_seconds"] > 0
    final = s["final"]
    for key in ("avg_model_accuracy", "mean_node_accuracy"):
        assert 0.0 <= final[key] <= 1.0
    assert final["consensus_distance"] >= 0
    assert final["average_loss"] > 0
    traffic = s["traffic"]
    assert traffic["bytes_sent"] > 0 and traffic["messages_sent"] > 0
    assert traffic["messages_dropped"] == 0
    digests = s["params_sha256"]
    assert sorted(digests) == ["n0", "n1", "n2", "n3"]
    assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests.values())
    metrics = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    node_bytes = sum(r["bytes_sent"] for r in map(json.loads, metrics) if r["kind"] == "node")
    assert traffic["bytes_sent"] == node_bytes


def test_simulate_from_a_file_is_deterministic_and_prints_a_table(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the same config as run_dir, written as a file and overridden back to the tiny run
    config = tmp_path / "exp.toml"
    config.write_text(
        "[run]\nrounds = 50\neval_every = 2\n[topology]\nnodes = 4\n[data]\nbatch_size = 16\n",
        encoding="utf-8",
    )
    out = tmp_path / "again"
    status, stdout, err = cli(
        capsys, "simulate", str(config), "--out", str(out), "--set", "run.rounds=3"
    )
    assert status == 0, err
    for label in ("algorithm", "avg-model accuracy", "consensus distance", "wall time"):
        assert label in stdout
    assert "ops" in stdout and str(out) in stdout
    first = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    second = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert load_config(out / "config.toml") == load_config(run_dir / "config.toml")
    assert second["params_sha256"] == first["params_sha256"]
    assert second["run_id"] == first["run_id"]
    assert second["final"] == first["final"]


@pytest.fixture(scope="module")
def dpsgd_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "dpsgd"
    overrides = ["algorithm.name=dpsgd", "topology.kind=ring", "run.name=my-ring"]
    argv = ["simulate", "-q", "--out", str(out), *TINY]
    for item in overrides:
        argv += ["--set", item]
    assert main(argv) == 0
    return out


def test_simulate_overrides_take_effect(dpsgd_dir: Path) -> None:
    s = json.loads((dpsgd_dir / "summary.json").read_text(encoding="utf-8"))
    assert s["algorithm"] == "dpsgd"
    assert s["topology"]["name"] == "ring-4"
    assert s["name"] == "my-ring"
    assert s["nodes"] == 4 and s["rounds"] == 3
    assert load_config(dpsgd_dir / "config.toml").algorithm.name == "dpsgd"


def test_simulate_with_a_graph_file_and_a_user_dataset_and_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = simulate(
        capsys,
        tmp_path / "custom",
        "--set",
        "topology.file=topologies/ring-8.json",
        "--set",
        "data.dataset=examples.custom.my_experiment:make_dataset",
        "--set",
        "model.name=examples.custom.my_experiment:make_model",
        "--set",
        "model.width=4",
    )
    assert s["nodes"] == 8
    assert s["topology"]["name"] == "ring-8"
    assert sorted(s["params_sha256"]) == [f"n{i}" for i in range(8)]
    assert 0.0 <= s["final"]["avg_model_accuracy"] <= 1.0
    config = load_config(tmp_path / "custom" / "config.toml")
    assert dict(config.model.options) == {"width": 4}


# --- topology show ----------------------------------------------------------------------


def parse_description(text: str) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


@pytest.mark.parametrize("spec", ["ring:8", "topologies/ring-8.json"])
def test_topology_show_ring(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = cli(capsys, "topology", "show", spec)
    assert status == 0, err
    info = parse_description(out)
    assert info["nodes"].startswith("8")
    assert info["edges"].startswith("16")
    assert info["strongly connected"].startswith("yes")
    gap = float(info["spectral gap"].split()[0])
    assert 0.0 < gap < 1.0
    assert gap == pytest.approx(0.195262, abs=1e-5)


def test_topology_show_directed_social(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = cli(capsys, "topology", "show", "social:12:seed=1")
    assert status == 0
    info = parse_description(out)
    assert info["nodes"].startswith("12")
    assert info["strongly connected"].startswith("yes")


# --- plot -------------------------------------------------------------------------------


def test_plot_two_runs(
    run_dir: Path, dpsgd_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "plots" / "compare.png"
    status, out, err = cli(capsys, "plot", str(run_dir), str(dpsgd_dir), "--out", str(png))
    assert status == 0, err
    assert str(png) in out
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert png.stat().st_size > 1000


# --- engines ----------------------------------------------------------------------------


def test_engine_flag_picks_the_engine_and_the_numbers_agree(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fast = simulate(capsys, tmp_path / "v", "--engine", "vectorized", "--set", "faults.drop=0.2")
    slow = simulate(capsys, tmp_path / "m", "--engine", "messages", "--set", "faults.drop=0.2")
    assert (fast["engine"], slow["engine"]) == ("vectorized", "messages")
    assert fast["device"] == "cpu" and fast["gradients"] == "batched"
    assert set(fast) == set(slow)
    assert fast["traffic"] == slow["traffic"] and fast["faults"] == slow["faults"]
    assert fast["run_id"] == slow["run_id"]  # how a run is simulated is not part of it
    for out in ("v", "m"):
        lines = (tmp_path / out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        kinds = [json.loads(line)["kind"] for line in lines]
        assert kinds.count("round") == 3 and kinds.count("node") == 12
        assert kinds.count("eval") == 2


def test_auto_says_in_one_line_why_it_takes_the_message_engine(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = cli(
        capsys,
        "simulate",
        "--out",
        str(tmp_path / "d"),
        *TINY,
        "--set",
        "algorithm.name=rps",
        "--set",
        "topology.kind=complete",
        "--set",
        "compression.codec=qsgd",
    )
    assert status == 0
    notes = [line for line in err.splitlines() if "engine 'messages'" in line]
    assert len(notes) == 1 and "stochastic codec" in notes[0]


def test_vectorized_refuses_what_it_cannot_run_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = cli(
        capsys,
        "simulate",
        "-q",
        "--out",
        str(tmp_path / "d"),
        *TINY,
        "--engine",
        "vectorized",
        "--set",
        "algorithm.name=rps",
        "--set",
        "topology.kind=complete",
        "--set",
        "compression.codec=qsgd",
    )
    assert_one_line_error(status, out, err, "vectorized", "stochastic codec")
    status, out, err = cli(capsys, "simulate", "-q", *TINY, "--device", "cuda:x")
    assert_one_line_error(status, out, err, "simulate.device")


def test_node_records_setting_thins_the_node_lines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for mode, expected in (("none", 0), ("eval", 8), ("all", 12)):
        simulate(capsys, tmp_path / mode, "--set", f"simulate.node_records={mode}")
        lines = (tmp_path / mode / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        kinds = [json.loads(line)["kind"] for line in lines]
        assert kinds.count("node") == expected and kinds.count("round") == 3, mode


@pytest.mark.parametrize("engine", ["messages", "vectorized"])
def test_outputs_are_strict_json_when_a_run_diverges(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, engine: str
) -> None:
    """A diverged run's figures are not numbers: written as null, never as NaN."""

    def refuse(token: str) -> None:
        raise AssertionError(f"non-strict JSON token {token}")

    out = tmp_path / engine
    simulate(
        capsys,
        out,
        "--engine",
        engine,
        "--set",
        "algorithm.name=local",
        "--set",
        "algorithm.lr=1e38",  # float32 takes it (1e39 is refused); the steps overflow
    )
    lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line, parse_constant=refuse) for line in lines]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"), parse_constant=refuse)
    assert summary["final"]["average_loss"] is None
    assert any(r["kind"] == "round" and r["train_loss"] is None for r in records)


def test_plot_to_a_file_type_it_cannot_write_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    simulate(capsys, tmp_path / "run")
    status, out, err = cli(capsys, "plot", str(tmp_path / "run"), "--out", str(tmp_path / "p.txt"))
    assert_one_line_error(status, out, err, "--out", ".png")
    status, _, _ = cli(capsys, "plot", str(tmp_path / "run"), "--out", str(tmp_path / "p.svg"))
    assert status == 0 and (tmp_path / "p.svg").stat().st_size > 0


def test_quiet_still_says_where_the_results_are(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = cli(capsys, "simulate", "-q", "--out", str(tmp_path / "r"), *TINY)
    assert status == 0 and out.strip() == f"results: {tmp_path / 'r'}"


def test_no_eta_from_the_first_rounds_alone() -> None:
    import io

    from fedcore.progress import Progress

    stream = io.StringIO()
    progress = Progress(1000, label="t", stream=stream)
    progress.update(1)
    assert "ETA --" in stream.getvalue()
    progress.update(1000)
    assert "ETA 0s" in stream.getvalue().splitlines()[-1]


def test_runs_started_together_never_share_a_folder(tmp_path: Path) -> None:
    """Two runs of the same config started at once (the same second): two folders, each
    with its own config (the issue's repro: ``--set run.seed=1 -q & --set run.seed=2 -q``)."""
    argv = [sys.executable, "-m", "fedcore", "simulate", "-q", *TINY]
    procs = [
        subprocess.Popen(
            [*argv, "--set", f"run.seed={seed}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2
    seeds = sorted(load_config(f / "config.toml").run.seed for f in folders)
    assert seeds == [1, 2]
    for folder in folders:
        assert (folder / "summary.json").is_file() and (folder / "curves.png").is_file()


def test_an_out_folder_holding_a_run_is_refused_unless_forced(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    simulate(capsys, tmp_path / "r")
    status, out, err = cli(capsys, "simulate", "-q", "--out", str(tmp_path / "r"), *TINY)
    assert_one_line_error(status, out, err, "holds another run", "--force")
    simulate(capsys, tmp_path / "r", "--force", "--set", "run.seed=3")
    assert load_config(tmp_path / "r" / "config.toml").run.seed == 3
