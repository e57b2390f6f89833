"""Per-peer test sets (a natural partition of data with writers): both engines evaluate each
peer on its own writers' test examples, alike, and the average model on all of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.config import config_from_dict
from fedcore.data.standin import write_standin
from fedcore.setup.prepare import prepare_run
from tests.engines.test_vectorized import assert_same_run, run_both


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("leaf")
    write_standin("femnist", base, samples=300, writers=12)
    return base


def _config(root: Path, algorithm: str, kind: str, **extra: object) -> object:
    return config_from_dict(
        {
            "run": {"rounds": 3, "eval_every": 1, **extra},
            "topology": {"kind": kind, "nodes": 6},
            "algorithm": {"name": algorithm, "lr": 0.05},
            "model": {"name": "logreg"},
            "data": {
                "dataset": "femnist",
                "root": str(root),
                "partition": "natural",
                "batch_size": 8,
            },
        }
    )


@pytest.mark.parametrize(("algorithm", "kind"), [("dpsgd", "ring"), ("fedavg", "star")])
def test_both_engines_evaluate_each_peer_on_its_own_test_set(
    root: Path, algorithm: str, kind: str
) -> None:
    config = _config(root, algorithm, kind)
    assert_same_run(config)  # type: ignore[arg-type]
    (slow, _), (fast, params) = run_both(config)  # type: ignore[arg-type]
    for a, b in zip(slow.evals, fast.evals, strict=True):
        assert a["node_test_sets"] == b["node_test_sets"] == "own"
        assert a["node_accuracy"] == b["node_accuracy"]
    setup = prepare_run(config)  # type: ignore[arg-type]
    own = setup.own_tests()
    assert own is not None
    workers = [n for n in setup.graph.nodes if n != getattr(setup.algorithm, "server", None)]
    x, y = setup.dataset.x_test, setup.dataset.y_test
    rows = dict(zip(fast.nodes, params, strict=True))
    last = fast.evals[-1]["node_accuracy"]
    for node in workers:
        idx = torch.as_tensor(own[node])
        assert len(idx) > 0
        assert last[node] == setup.evaluator.evaluate(rows[node], x[idx], y[idx])[1]
    # the peers' test sets are their writers' and cover the test split once
    groups = setup.dataset.groups_test
    assert groups is not None
    joined = np.sort(np.concatenate([own[n] for n in workers]))
    assert np.array_equal(joined, np.arange(len(y)))
    for node in workers:
        i = setup.graph.index(node)
        assert set(groups[own[node]]) <= set(setup.dataset.groups_train[setup.parts[i]])


def test_a_sample_of_workers_on_their_own_test_sets(root: Path) -> None:
    """``run.eval_peers`` with a server and per-node test sets: both engines measure the
    same 3 workers (the server left out), each on its own test examples."""
    config = _config(root, "fedavg", "star", eval_peers=3)
    (slow, _), (fast, _) = run_both(config)  # type: ignore[arg-type]
    for a, b in zip(slow.evals, fast.evals, strict=True):
        assert a["eval_peers"] == b["eval_peers"] == {"sampled": 3, "of": 6}
        assert a["node_accuracy"] == b["node_accuracy"] and len(a["node_accuracy"]) == 3
        assert "server" not in a["node_accuracy"]
        for key in ("avg_model_accuracy", "consensus_distance", "mean_node_accuracy"):
            assert a[key] == b[key], key


def test_without_natural_every_peer_is_evaluated_on_the_whole_test_split(root: Path) -> None:
    config = config_from_dict(
        {
            "run": {"rounds": 2, "eval_every": 1},
            "topology": {"kind": "ring", "nodes": 4},
            "model": {"name": "logreg"},
            "data": {"dataset": "femnist", "root": str(root), "partition": "iid"},
        }
    )
    assert prepare_run(config).own_tests() is None
    (slow, _), _ = run_both(config)
    assert "node_test_sets" not in slow.evals[-1]
