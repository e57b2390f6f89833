"""Every shipped example config loads and prepares (its graph, data split and model), so
none drifts from the config schema. The examples on datasets read from files prepare on
stand-in files (fedcore.data.standin) found through $FEDCORE_DATA, as a user's real files would
be, run a few rounds end to end, and without their files stop with the fetch command."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from fedcore import registry
from fedcore.config import DATA_ENV, config_to_dict, load_config
from fedcore.data.standin import write_standin
from fedcore.setup.prepare import prepare_run
from tests import docs_text
from tests.clitools import cli, one_line_error

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))
FROM_FILES = [
    p for p in EXAMPLES if load_config(p).data.dataset in registry.DATASETS.tagged("files")
]


@pytest.fixture(scope="module")
def standin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stand-in files of every dataset an example reads, with a writer for each of 40 peers."""
    root = tmp_path_factory.mktemp("data")
    for name in {load_config(p).data.dataset for p in FROM_FILES}:
        write_standin(name, root, samples=800, writers=40)
    return root


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 10
    assert {p.stem for p in FROM_FILES} >= {
        "cifar10-deepsqueeze",
        "femnist-fedavg",
        "shakespeare-ops",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_prepares(path: Path, standin_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DATA_ENV, str(standin_root))
    config = load_config(path)
    if config.topology.nodes > 1000:  # dog-10k: its graph takes seconds; the config is checked
        return
    setup = prepare_run(config)
    assert len(setup.graph.nodes) >= config.topology.nodes


@pytest.mark.parametrize("path", FROM_FILES, ids=[p.stem for p in FROM_FILES])
def test_example_on_published_data_runs_on_standin_files(
    path: Path,
    standin_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(DATA_ENV, str(standin_root))
    out = tmp_path / "run"
    status, _, err = cli(
        capsys,
        "simulate",
        str(path),
        "--set",
        "run.rounds=2",
        "--set",
        "run.eval_every=1",
        "--out",
        str(out),
        "--quiet",
    )
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    config = load_config(path)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert len(evals) == 2
    if config.data.partition == "natural":
        assert all(r["node_test_sets"] == "own" for r in evals)


@pytest.mark.parametrize("path", FROM_FILES, ids=[p.stem for p in FROM_FILES])
def test_example_without_its_data_says_how_to_fetch_it(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    line = one_line_error(capsys, ["simulate", str(path), "--out", str(tmp_path / "run")])
    assert "fetch it on a machine with network with:" in line and str(tmp_path) in line
    assert not (tmp_path / "run").exists()


# --- virtual time: the page's run as a config file ---------------------------------------

VIRTUAL_TIME = Path(__file__).resolve().parents[1] / "examples" / "virtual_time.toml"


def _page_command(page: str, first: str) -> list[str]:
    """The ``fedcore`` command of ``page`` whose ```bash block line starts with ``first``
    (continuation lines joined), as argv without ``fedcore``."""
    text = docs_text.page(page)
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if line.strip().startswith(first) and words and words[0] == "fedcore":
                return words[1:]
    raise AssertionError(f"{page} has no command starting {first!r}")


def test_the_virtual_time_example_is_the_pages_run() -> None:
    """``examples/virtual_time.toml`` is the run docs/time.md shows with ``--set`` (slow
    peers, slow links, a deadline), its name aside."""
    argv = _page_command("time.md", "fedcore simulate --set algorithm.name=dpsgd")
    overrides = [argv[i + 1] for i, word in enumerate(argv) if word == "--set"]
    assert any(item.startswith("time.") for item in overrides), overrides
    shown = config_to_dict(load_config(None, overrides))
    example = config_to_dict(load_config(VIRTUAL_TIME))
    shown["run"].pop("name")
    example["run"].pop("name")
    assert example == shown
    assert "examples/virtual_time.toml" in docs_text.page("time.md")


def test_the_virtual_time_example_runs_in_virtual_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    status, _, err = cli(
        capsys,
        "simulate",
        str(VIRTUAL_TIME),
        "--set",
        "run.rounds=30",
        "--set",
        "run.eval_every=10",
        "--out",
        str(out),
        "--quiet",
    )
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "completed"
    assert summary["time"]["virtual_seconds"] > 30 * 0.1  # every round at least a step
    assert summary["time_to_target"]["vtime"] is not None
