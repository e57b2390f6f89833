"""A personal model per peer (``[personal]``): made after the run from each peer's final
model, measured on the peer's own test set beside it, the same on every engine; the run
itself is not changed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.cli.common import print_table
from fedcore.config import Config, config_from_dict, load_config
from fedcore.config.tables.personal import MAX_PERSONAL_STEPS
from fedcore.data import BatchStream
from fedcore.data.standin import write_standin
from fedcore.engines.shard_refusal import config_refusal
from fedcore.errors import ConfigError
from fedcore.models import Objective
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.personal import class_mix, finetune, personal_figures, weighted_accuracy
from fedcore.simulation.simulate import simulate

FIGURES = (
    "shared_mean_accuracy",
    "shared_worst_accuracy",
    "personal_mean_accuracy",
    "personal_worst_accuracy",
)


def _tables(engine: str, nodes: int = 4, rounds: int = 6) -> dict[str, Any]:
    """D-PSGD on a ring, digits under a Dirichlet alpha = 0.1 split: a few peers."""
    return {
        "run": {"rounds": rounds, "eval_every": rounds},
        "topology": {"kind": "ring", "nodes": nodes},
        "algorithm": {"name": "dpsgd", "lr": 0.5},
        "model": {"name": "logreg"},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 0.1},
        "simulate": {"engine": engine},
    }


def _digits(engine: str = "vectorized", **personal: Any) -> Config:
    return config_from_dict({**_tables(engine), "personal": {"mode": "finetune", **personal}})


def _run(config: Config, out: Path) -> dict[str, Any]:
    return simulate(config, out_dir=out, show_progress=False)


def test_both_engines_report_the_same_personal_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = _run(_digits("messages", steps=4), tmp_path / "m")
    fast = _run(_digits("vectorized", steps=4), tmp_path / "v")
    assert (slow["engine"], fast["engine"]) == ("messages", "vectorized")
    assert slow["personal"] == fast["personal"]
    p = fast["personal"]
    assert p["test_sets"] == "class mix" and p["peers"] == 4 and p["steps"] == 4
    assert p["lr"] == 0.5  # personal.lr = 0: the run's algorithm.lr
    assert len(p["node_accuracy"]) == 4
    for key in FIGURES:
        assert 0 <= p[key] <= 1, key
    assert p["personal_mean_accuracy"] != p["shared_mean_accuracy"]  # 4 steps moved them
    # The training is that of the run without [personal]: the same parameters.
    plain = _run(config_from_dict(_tables("vectorized")), tmp_path / "plain")
    assert "personal" not in plain
    assert plain["params_sha256"] == fast["params_sha256"]
    print_table(fast)
    shown = capsys.readouterr().out
    assert f"{p['personal_mean_accuracy']:.4f} / {p['personal_worst_accuracy']:.4f}" in shown
    assert f"{p['shared_mean_accuracy']:.4f} / {p['shared_worst_accuracy']:.4f}" in shown


def test_the_test_split_is_weighted_by_each_peers_classes() -> None:
    """The class-mix accuracy is the accuracy on a test set whose classes come in the
    peer's shares: taken here example by example, each weighted by its class's share
    over the class's test examples."""
    setup = prepare_run(config_from_dict(_tables("vectorized")))
    objective = setup.evaluator
    x, y = setup.dataset.x_test, setup.dataset.y_test
    classes = int(y.max()) + 1
    by_class = [(x[y == c], y[y == c]) for c in range(classes)]
    params = setup.start + 0.01 * torch.randn(setup.start.shape, generator=torch.Generator())
    mix = class_mix(setup.dataset.y_train[torch.as_tensor(setup.parts[0])], classes)
    assert (mix == 0).any()  # alpha = 0.1: the peer lacks some classes
    counts = torch.bincount(y, minlength=classes).to(torch.float64)
    hit = [objective.evaluate(params, x[j : j + 1], y[j : j + 1])[1] for j in range(len(y))]
    expected = sum(h * float(mix[int(c)] / counts[int(c)]) for h, c in zip(hit, y, strict=True))
    assert weighted_accuracy(objective, params, by_class, mix) == pytest.approx(expected, 1e-12)
    # classes with no test example count for nothing; none at all: no figure
    none = [(xc[:0], yc[:0]) if mix[c] > 0 else (xc, yc) for c, (xc, yc) in enumerate(by_class)]
    assert math.isnan(weighted_accuracy(objective, params, none, mix))


@pytest.fixture(scope="module")
def leaf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("leaf")
    write_standin("femnist", base, samples=300, writers=12)
    return base


def test_zero_steps_is_the_shared_model_on_each_peers_own_test_set(
    tmp_path: Path, leaf: Path
) -> None:
    """With steps = 0 the personal model is the shared one; under a natural partition
    its figures are the run's own evaluation of each peer on its own writers' tests."""
    config = config_from_dict(
        {
            "run": {"rounds": 3, "eval_every": 3},
            "topology": {"kind": "ring", "nodes": 6},
            "algorithm": {"name": "dpsgd", "lr": 0.05},
            "model": {"name": "logreg"},
            "data": {"dataset": "femnist", "root": str(leaf), "partition": "natural"},
            "personal": {"mode": "finetune", "steps": 0},
        }
    )
    summary = _run(config, tmp_path / "run")
    p, final = summary["personal"], summary["final"]
    assert p["test_sets"] == final["node_test_sets"] == "own"
    assert p["shared_mean_accuracy"] == pytest.approx(final["mean_node_accuracy"], abs=1e-12)
    assert p["shared_worst_accuracy"] == final["min_node_accuracy"]
    for peer, figures in p["node_accuracy"].items():
        assert figures["personal"] == figures["shared"] == final["node_accuracy"][peer]
    assert p["personal_mean_accuracy"] == p["shared_mean_accuracy"]


MEAN_MARGIN, WORST_MARGIN = 0.05, 0.1
"""Measured on this run: the mean peer's accuracy 0.848 -> 0.957 and the worst's 0.680 ->
0.934 (4 peers, 3 rounds, 10 steps at lr 0.5); the margins are half of that or less."""


def test_personal_models_beat_the_shared_one_under_label_skew(tmp_path: Path) -> None:
    """Dirichlet alpha = 0.1 over 4 peers: ten steps on a peer's own classes lift the mean
    and the worst peer's accuracy on its own test set well above the shared model's."""
    config = config_from_dict(
        {**_tables("vectorized", nodes=4, rounds=3), "personal": {"mode": "finetune"}}
    )
    p = _run(config, tmp_path / "run")["personal"]
    assert p["steps"] == 10 and p["lr"] == 0.5, p  # the defaults
    assert p["personal_mean_accuracy"] > p["shared_mean_accuracy"] + MEAN_MARGIN, p
    assert p["personal_worst_accuracy"] > p["shared_worst_accuracy"] + WORST_MARGIN, p


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("personal.mode=head", "personal.mode"),
        ("personal.steps=-1", "personal.steps"),
        (f"personal.steps={MAX_PERSONAL_STEPS + 1}", "personal.steps"),
        ("personal.lr=-0.1", "personal.lr"),
        ("personal.lr=inf", "personal.lr"),
        ("personal.lr=nan", "personal.lr"),
        ("personal.lr=1e39", "personal.lr"),  # inf in float32
        ("personal.steps=3", "does nothing with personal.mode = 'none'"),
    ],
)
def test_bad_values_are_refused_in_one_line(item: str, says: str) -> None:
    extra = [] if "does nothing" in says else ["personal.mode=finetune"]
    with pytest.raises(ConfigError) as err:
        load_config(None, [*extra, item])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_where_there_is_no_personal_model_to_make() -> None:
    on = ["personal.mode=finetune"]
    for item, says in (
        ("data.stream=synthetic", "online stream"),
        ("simulate.engine=cohort", "cohort engine"),
    ):
        with pytest.raises(ConfigError, match=says) as err:
            load_config(None, [*on, item])
        assert "\n" not in str(err.value)
    why = config_refusal(load_config(None, on))
    assert why is not None and "[personal]" in why
    assert load_config(None, [*on, "personal.steps=0"]).personal.steps == 0  # the extreme
    assert math.isclose(load_config(None, [*on, "personal.lr=1e-9"]).personal.lr, 1e-9)


def test_fine_tuning_leaves_the_model_buffers_and_torch_generator_as_they_were() -> None:
    """BatchNorm's running statistics (of the one module every peer's model is loaded into)
    and torch's generator are the same after a peer's fine-tuning: the next peer's shared
    figures, and whatever runs next in the process, do not depend on it."""
    module = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )
    objective = Objective(module)
    x, y = torch.randn(12, 4), torch.arange(12) % 3
    before = [b.clone() for b in module.buffers()]
    start = objective.initial_params()
    tuned = finetune(objective, start, BatchStream(x, y, batch_size=4, seed=1), 3, 0.1)
    assert not torch.equal(tuned, start)
    assert all(torch.equal(a, b) for a, b in zip(before, module.buffers(), strict=True))
    setup = prepare_run(_digits(steps=2))
    state = torch.get_rng_state()
    final = dict.fromkeys(setup.graph.nodes, setup.start)
    figures = personal_figures(setup, final, nodes=setup.graph.nodes)
    assert torch.equal(torch.get_rng_state(), state)
    assert figures == personal_figures(setup, final, nodes=setup.graph.nodes)


def test_a_server_familys_workers_fine_tune_the_servers_model() -> None:
    """FedAvg: a worker holds the global model of the last round it was sampled in (or its
    first one); its shared model is the server's final model, the global one."""
    tables = {
        **_tables("vectorized"),
        "topology": {"kind": "star", "nodes": 4},
        "algorithm": {"name": "fedavg", "lr": 0.5, "fraction": 0.5},
        "personal": {"mode": "finetune", "steps": 1},
    }
    setup = prepare_run(config_from_dict(tables))
    server, workers = "server", [n for n in setup.graph.nodes if n != "server"]
    trained = setup.start + 0.05 * torch.randn(setup.start.shape, generator=torch.Generator())
    stale = {**dict.fromkeys(workers, setup.start), server: trained}
    fresh = dict.fromkeys(setup.graph.nodes, trained)
    got = personal_figures(setup, stale, nodes=setup.graph.nodes, server=server)
    assert got == personal_figures(setup, fresh, nodes=setup.graph.nodes, server=server)
    assert set(got["node_accuracy"]) == set(workers)  # the server is measured as no peer
    gossip = personal_figures(setup, stale, nodes=workers)  # no server: their own models
    assert gossip["node_accuracy"]["n0"] != got["node_accuracy"]["n0"]
