"""Online streams: dataset order, user sources by import path, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedcore.config import load_config
from fedcore.data import BatchStream, Dataset
from fedcore.errors import DataError
from fedcore.runners.simulate import simulate
from fedcore.streams import load_source


def test_sorted_order_walks_labels_in_order() -> None:
    y = torch.tensor([3, 1, 2, 1, 0, 3, 2, 0])
    stream = BatchStream(torch.arange(8.0)[:, None], y, batch_size=2, seed=0, order="sorted")
    seen = torch.cat([stream.next_batch()[1] for _ in range(4)])
    assert seen.tolist() == sorted(y.tolist())
    with pytest.raises(DataError, match="order"):
        BatchStream(torch.zeros(2, 1), y[:2], batch_size=1, seed=0, order="random")


class _Constant:
    """A user source: every node sees the same two examples every round."""

    def __init__(self, nodes: int, seed: int, batch_size: int, rounds: int) -> None:
        x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
        y = torch.tensor([0, 1])
        self.dataset = Dataset(
            name="constant", x_train=x, y_train=y, x_test=x, y_test=y, num_classes=2
        )

    def stream(self, node: int) -> BatchStream:
        return BatchStream(self.dataset.x_train, self.dataset.y_train, batch_size=2, seed=node)


def make_source(*, nodes: int, seed: int, batch_size: int, rounds: int) -> _Constant:
    return _Constant(nodes, seed, batch_size, rounds)


def make_nothing(**_: object) -> object:
    return object()


def test_user_source_by_import_path(tmp_path: Path) -> None:
    overrides = [
        "data.stream=tests.test_streams:make_source",
        "topology.nodes=4",
        "run.rounds=30",
        "run.regret=true",
    ]
    summary = simulate(load_config(None, overrides), out_dir=tmp_path, show_progress=False)
    assert summary["final"]["avg_model_accuracy"] == 1.0
    assert summary["final"]["static_regret"] > 0  # separable: the infimum is 0


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("nonsense", "unknown data.stream"),
        ("tests.test_streams:make_nothing", "must return an object"),
        ("tests.test_streams:no_such_factory", "no_such_factory"),
    ],
)
def test_bad_sources_are_named(name: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_source(name, nodes=2, rounds=3, batch_size=2, seed=0, options={})
