"""Bad input ends in one error line and exit status 2, never a traceback.

Each case goes through the command line (``fedcore.cli.main``): a user's model or dataset
factory that raises (its traceback only behind ``-v``), a step size that is no number, a
model too large to allocate, an integer too large for any bound, a single-node graph file.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from fedcore import models
from fedcore.algorithms import CHOCO, DeepSqueeze, make_algorithm
from fedcore.config import MAX_PARAMETERS, Config, load_config
from fedcore.errors import ConfigError, DataError, TopologyError
from fedcore.models import build_model, parameter_count
from fedcore.node import RoundRecord
from fedcore.simulation.observer import RunObserver
from fedcore.topology import complete, ring, torus
from tests.clitools import cli, one_line_error

TINY = [
    "--set",
    "run.rounds=2",
    "--set",
    "topology.kind=ring",
    "--set",
    "topology.nodes=4",
    "--set",
    "data.batch_size=8",
]

FACTORIES = """
import torch


def model_raises(*, input_dim, num_classes, **options):
    raise RuntimeError("the model factory is broken")


def model_raises_lines(*, input_dim, num_classes):
    raise RuntimeError("first line of it\\nframe #0: c10::Error\\nframe #1: more")


def model_type_error_inside(*, input_dim, num_classes):
    return len(5)


def model_out_of_memory(*, input_dim, num_classes):
    raise MemoryError()


class _BadBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("the backward pass is broken")


class _BackwardModule(torch.nn.Module):
    def __init__(self, input_dim, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(input_dim, num_classes)

    def forward(self, x):
        return _BadBackward.apply(self.linear(x))


def model_bad_backward(*, input_dim, num_classes):
    return _BackwardModule(input_dim, num_classes)


class _NotATensor(torch.nn.Module):
    def __init__(self, input_dim, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(input_dim, num_classes)

    def forward(self, x):
        return {"logits": self.linear(x)}


def model_returns_a_dict(*, input_dim, num_classes):
    return _NotATensor(input_dim, num_classes)


def dataset_raises(*, seed, test_fraction):
    raise ValueError("no such dataset file: /data/x.npz")


def dataset_wrong_signature(*, seed):
    raise AssertionError("never called")
"""


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in ``tmp_path``, where ``badfactories`` is an importable user module."""
    (tmp_path / "badfactories.py").write_text(FACTORIES, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def simulate(*overrides: str) -> list[str]:
    argv = ["simulate", "-q", "--out", "run", *TINY]
    for item in overrides:
        argv += ["--set", item]
    return argv


# --- 1. a user's factory that raises ---------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        (
            "model.name=badfactories:model_raises",
            ["model factory 'badfactories:model_raises' failed", "RuntimeError: the model"],
        ),
        (
            "model.name=badfactories:model_raises_lines",
            ["RuntimeError: first line of it [...]"],
        ),
        (
            "model.name=badfactories:model_type_error_inside",
            ["model factory 'badfactories:model_type_error_inside' failed", "TypeError"],
        ),
        ("model.name=badfactories:model_out_of_memory", ["failed: MemoryError"]),
        (
            "data.dataset=badfactories:dataset_raises",
            ["dataset factory 'badfactories:dataset_raises' failed", "no such dataset file"],
        ),
        (
            "data.dataset=badfactories:dataset_wrong_signature",
            ["must accept keyword arguments seed and test_fraction"],
        ),
    ],
)
def test_a_factory_that_raises_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], override: str, needles: list[str]
) -> None:
    line = one_line_error(capsys, simulate(override), *needles)
    if "wrong_signature" not in override:
        assert line.endswith("(add -v to see the traceback)")
    assert not (in_tmp / "run").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_shows_the_factory_traceback(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    argv = simulate("model.name=badfactories:model_raises")
    argv = ["-v", *argv] if where == "before" else [*argv, "-v"]
    status, out, err = cli(capsys, *argv)
    text = out + err
    assert status == 2
    assert "Traceback" in text
    assert 'badfactories.py", line' in text  # the user's own frame
    last = text.strip().splitlines()[-1]
    assert last.startswith("fedcore: error: model factory 'badfactories:model_raises' failed")
    assert "add -v" not in last


def test_the_library_raises_data_error_chained_to_the_factorys_error(in_tmp: Path) -> None:
    with pytest.raises(DataError, match=r"model factory .* failed: RuntimeError") as info:
        build_model("badfactories:model_raises", input_dim=4, num_classes=2, seed=0)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_error_of_fedcore_itself_has_no_pointer_to_verbose(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_error(capsys, simulate("model.name=nope"), "unknown model 'nope'")
    assert "-v" not in line


def test_running_out_of_memory_anyway_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A size no bound caught (many nodes of a large model in one process) still ends in
    one line, exit status 1 (the run failed on its way)."""
    import importlib

    runner = importlib.import_module("fedcore.simulation.simulate")

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(runner, "simulate", out_of_memory)
    status, out, err = cli(capsys, *simulate())
    text = out + err
    assert status == 1 and "Traceback" not in text
    assert text.strip().splitlines() == [
        "fedcore: error: out of memory; use a smaller model, fewer nodes, smaller batches or "
        "fewer rounds."
    ]


# --- 2. step sizes that are no numbers ------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "key", "value"),
    [
        ("deepsqueeze", "eta", "x"),
        ("deepsqueeze", "eta", "true"),
        ("deepsqueeze", "eta", "[0.1]"),
        ("deepsqueeze", "eta", "nan"),
        ("deepsqueeze", "eta", "0"),
        ("choco", "gamma", "x"),
        ("choco", "gamma", "true"),
        ("choco", "gamma", "{a = 1}"),
        ("choco", "gamma", "1.5"),
    ],
)
def test_a_step_that_is_no_number_in_range_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], algorithm: str, key: str, value: str
) -> None:
    argv = simulate(f"algorithm.name={algorithm}", f"algorithm.{key}={value}")
    one_line_error(capsys, argv, f"algorithm '{algorithm}': {key} =", "must be a number in (0, 1]")


def test_steps_are_checked_in_the_library_too() -> None:
    for bad in ("0.2", True, None, float("inf"), -0.1):
        with pytest.raises(ConfigError, match="eta"):
            DeepSqueeze(eta=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="gamma"):
            CHOCO(gamma=bad)  # type: ignore[arg-type]
    assert DeepSqueeze(eta=1).eta == 1
    assert CHOCO(gamma=0.25).gamma == 0.25


@pytest.mark.parametrize(
    "options",
    [{"robust": 1}, {"robust": "yes"}, {"step_scale": 1}, {"step_scale": [1]}, {"step": 1}],
)
def test_ops_options_of_the_wrong_type_are_config_errors(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        make_algorithm("ops", **options)


# --- 3. a model too large to allocate -------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "hidden", "needles"),
    [
        ("mlp", "1000000000000", ["model.hidden = 1000000000000 is invalid"]),
        ("mlp", "100000000", ["7,500,000,010 parameters", "2**31"]),
        ("cnn1d", "100000", ["parameters", "2**31"]),
        ("mlp", "0", ["model.hidden = 0 is invalid"]),
        ("mlp", "-5", ["model.hidden = -5 is invalid"]),
        ("mlp", "1.5", ["model.hidden must be of type int"]),
    ],
)
def test_a_model_too_large_or_too_small_is_refused_before_allocating(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], model: str, hidden: str, needles: list[str]
) -> None:
    one_line_error(capsys, simulate(f"model.name={model}", f"model.hidden={hidden}"), *needles)


def test_a_model_larger_than_memory_is_refused(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "physical_memory", lambda: 1 << 20)  # 1 MiB
    one_line_error(
        capsys,
        simulate("model.name=mlp", "model.hidden=10000"),
        "750,010 parameters",
        "takes about 8.6 MiB",
        "more than this machine's 1.0 MiB of memory",
    )


@pytest.mark.parametrize("name", ["cnn1d", "logreg", "mlp"])  # fixed ones: tests/test_models.py
@pytest.mark.parametrize(("input_dim", "hidden"), [(8, 1), (40, 3), (64, 0), (9, 7)])
def test_parameter_count_matches_the_built_model(name: str, input_dim: int, hidden: int) -> None:
    options = {"hidden": hidden} if hidden and name != "logreg" else {}
    module = build_model(name, input_dim=input_dim, num_classes=3, seed=0, **options)
    expected = sum(p.numel() for p in module.parameters())
    assert parameter_count(name, input_dim=input_dim, num_classes=3, hidden=hidden) == expected


def test_the_parameter_bound_is_checked_in_the_library() -> None:
    hidden = MAX_PARAMETERS // 64
    with pytest.raises(DataError, match=r"2\*\*31"):
        build_model("mlp", input_dim=64, num_classes=10, seed=0, hidden=hidden)
    with pytest.raises(DataError, match=r"2\*\*31"):
        build_model("logreg", input_dim=MAX_PARAMETERS, num_classes=2, seed=0)
    assert isinstance(build_model("mlp", input_dim=4, num_classes=2, seed=0), torch.nn.Module)


# --- 4. integers too large for any bound ----------------------------------------------------


def _int_keys() -> list[str]:
    keys = []
    for section in dataclasses.fields(Config):
        table = getattr(Config(), section.name)
        for f in dataclasses.fields(table):
            value = getattr(table, f.name)
            if isinstance(value, int) and not isinstance(value, bool):
                keys.append(f"{section.name}.{f.name}")
    return keys


INT_KEYS = _int_keys()


def test_every_int_key_of_the_brief_is_covered() -> None:
    brief = {
        "run.rounds",
        "run.seed",
        "run.eval_every",
        "run.checkpoint_every",
        "topology.nodes",
        "topology.seed",
        "data.batch_size",
        "data.shards_per_node",
        "data.features",
        "model.hidden",
        "compression.bits",
        "compression.chunk",
        "faults.seed",
    }
    assert brief <= set(INT_KEYS)


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", ["99999999999999999999999", "-99999999999999999999999"])
def test_a_huge_integer_for_any_int_key_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], key: str, value: str
) -> None:
    line = one_line_error(capsys, simulate(f"{key}={value}"), key)
    assert len(line) < 300
    assert not (in_tmp / "run").exists()


@pytest.mark.parametrize("key", ["run.rounds", "algorithm.lr"])
def test_a_number_with_thousands_of_digits_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    one_line_error(capsys, simulate(f"{key}=1{'0' * 5000}"), key)
    one_line_error(capsys, simulate(f"{key}=1{'0' * 400}"), key)


def test_a_config_file_with_a_huge_number_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "c.toml").write_text(f"[run]\nrounds = 1{'0' * 5000}\n", encoding="utf-8")
    one_line_error(capsys, ["simulate", "-q", "c.toml"], "c.toml", "cannot be read")


@pytest.mark.parametrize(
    "override",
    [
        "faults.partitions=[{nodes = ['n0'], start = 0, end = 99999999999999999999}]",
        "faults.crashes=[{node = 'n0', at = 99999999999999999999}]",
    ],
)
def test_huge_fault_rounds_are_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], override: str
) -> None:
    one_line_error(capsys, simulate(override), "round number from 0 to 1,000,000,000")


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("ring:2000000", "at most 1,000,000"),
        ("complete:100000", "ordered pairs"),
        ("erdos-renyi:20000", "ordered pairs"),
        ("torus:1000x1001", "at most 1,000,000, not 1,001,000"),
        ("social:16:seed=99999999999999999999999", "seed must be at most"),
    ],
)
def test_topologies_too_large_are_one_line(
    capsys: pytest.CaptureFixture[str], spec: str, needle: str
) -> None:
    one_line_error(capsys, ["topology", "show", spec], needle)


def test_generators_bound_their_sizes_in_the_library() -> None:
    with pytest.raises(TopologyError, match=r"rows \* cols"):
        torus(1000, 1001)
    with pytest.raises(TopologyError, match="ordered pairs"):
        complete(5000)
    with pytest.raises(TopologyError, match="at most 1,000,000"):
        ring(1_000_001)


def test_a_synthetic_stream_too_large_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = simulate("data.stream=synthetic", "data.features=100000")
    one_line_error(capsys, argv, "data.features = 100,000", "synthetic stream")


def test_many_rounds_allocate_nothing_up_front() -> None:
    """The observer of a run grows its per-round records as rounds arrive."""
    config = load_config(None, ["run.rounds=1000000000", "topology.nodes=4"])
    nodes = [f"n{i}" for i in range(4)]
    observer = RunObserver(
        nodes=nodes,
        config=config,
        evaluator=None,  # type: ignore[arg-type]
        dataset=None,  # type: ignore[arg-type]
        writer=None,
        progress=None,
    )
    assert all(row == [] for row in observer.losses.values())
    observer.observe(RoundRecord.down_round("n1", 2, lr=0.0, wall_s=0.0), None)
    assert observer.losses["n1"] == [None, None, None]


# --- 5. a graph file with a single node ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("solo.json", json.dumps({"nodes": ["solo"], "edges": []})),
        ("loop.json", json.dumps({"edges": [["solo", "solo", 1.0]]})),
        ("solo.txt", "solo\n"),
        ("loop.edgelist", "solo solo\n"),
        (
            "solo.graphml",
            '<?xml version="1.0"?><graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
            '<graph edgedefault="directed"><node id="solo"/></graph></graphml>',
        ),
    ],
)
def test_a_single_node_graph_file_is_refused(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], name: str, text: str
) -> None:
    (in_tmp / name).write_text(text, encoding="utf-8")
    one_line_error(capsys, simulate(f"topology.file={name}"), "single node (solo)", "at least two")
    one_line_error(capsys, ["topology", "show", name], "single node (solo)")


@pytest.mark.parametrize(
    "factory,needles",
    [
        ("model_bad_backward", ["loss and gradient", "the backward pass is broken"]),
        ("model_returns_a_dict", ["maps a batch of 2 examples to a dict"]),
    ],
)
def test_a_model_that_fails_after_building_is_one_line(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], factory: str, needles: list[str]
) -> None:
    one_line_error(capsys, simulate(f"model.name=badfactories:{factory}"), *needles)


def test_a_simulation_larger_than_memory_is_refused(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One model fits, but one per simulated node does not, on either engine: refused
    before the graph is built, by the estimate every engine shares."""
    from fedcore.engines import vectorized
    from fedcore.setup import plan

    monkeypatch.setattr(plan, "physical_memory", lambda: 20 * 650 * 4 * 4)
    monkeypatch.setattr(vectorized, "physical_memory", lambda: 20 * 650 * 4 * 4)
    for engine in ("messages", "vectorized"):
        argv = simulate("topology.nodes=32", f"simulate.engine={engine}")
        one_line_error(capsys, argv, "32 models of 650 parameters x 4 copies", "203.1 KiB")
