"""Online streams: dataset order, user sources by import path, and their errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.config import load_config
from fedcore.data import BatchStream, Dataset
from fedcore.errors import DataError
from fedcore.simulation.simulate import simulate
from fedcore.streams import SyntheticDrift, load_source


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


# --- the synthetic stream: counter-based draws, one node or all at once -----------------------


def _source(**kwargs: Any) -> SyntheticDrift:
    options: dict[str, Any] = {"nodes": 7, "rounds": 20, "batch_size": 3, "seed": 5}
    return SyntheticDrift(**(options | kwargs))


@pytest.mark.parametrize(
    ("options", "size"),
    [
        ({}, None),  # a small round: batch() draws every node's batch of the round at once
        ({"nodes": 70_000, "batch_size": 1, "test_size": 10}, None),  # large: one row
        ({"nodes": 5_000, "batch_size": 40, "test_size": 10}, None),  # large: tensors
        ({"features": 7}, 5),  # an odd number of features: the last Box–Muller half unused
    ],
    ids=["round-cache", "one-row", "tensor", "odd-features"],
)
def test_batches_are_the_per_node_batches_bit_for_bit(
    options: dict[str, Any], size: int | None
) -> None:
    source = _source(**options)
    for round in (0, 3, 19):
        x, y = source.batches(round, size=size)
        assert x.shape == (source.nodes, size or source.batch_size, source.features)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        for node in sorted({0, 1, source.nodes // 2, source.nodes - 1}):
            xn, yn = source.batch(node, round, size)
            assert torch.equal(x[node], xn) and torch.equal(y[node], yn), (round, node)
        picked = torch.tensor([source.nodes - 1, 0])
        xp, yp = source.batches(round, picked, size=size)
        assert torch.equal(xp, x[picked]) and torch.equal(yp, y[picked])


def test_batches_in_chunks_and_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    source = _source()
    whole = source.batches(4)
    monkeypatch.setattr(SyntheticDrift, "CHUNK_VALUES", 10)  # one node per chunk
    monkeypatch.setattr(SyntheticDrift, "TABLE_VALUES", 0)  # and no kept sines
    parts = _source().batches(4)
    assert torch.equal(whole[0], parts[0]) and torch.equal(whole[1], parts[1])
    stream = source.stream(2)
    for round in range(3):
        x, y = stream.next_batch()
        xs, ys = source.batches(round)
        assert torch.equal(x, xs[2]) and torch.equal(y, ys[2])
    assert not torch.equal(source.batches(4)[0], _source(seed=6).batches(4)[0])
    kept = source.batch(1, 4)[0]
    kept += 1  # the caller's copy: the kept round stays as it was
    assert torch.equal(source.batch(1, 4)[0], whole[0][1])


def test_direction_is_the_documented_unit_vector() -> None:
    source = _source(features=9)
    nodes = torch.arange(source.nodes)
    for round in (0, 7, 10**6):
        v = source.direction(nodes, round)
        k = torch.arange(9, dtype=torch.float64)
        reference = torch.sin(nodes[:, None].double() + 1.7 * k + 0.31 * round)
        reference /= reference.norm(dim=1, keepdim=True)
        # sin(A + B) as sin A cos B + cos A sin B: the difference is the rounding of A + B
        torch.testing.assert_close(v, reference, rtol=0, atol=1e-14 * (16 + 0.31 * round))
        assert torch.equal(v[3], source.direction(3, round))


def test_the_draws_have_the_documented_distribution() -> None:
    """G = 0: a = sigma xi is N(0, sigma^2 I); labels are Bernoulli(sigmoid(w* . a))."""
    source = _source(nodes=2_000, batch_size=20, adversarial=0.0, noise=1.5, test_size=10)
    x, y = source.batches(5)
    xi = x.double().reshape(-1, source.features) / 1.5
    n = xi.shape[0]
    assert float(xi.mean(0).abs().max()) < 5 / n**0.5
    assert float((xi.var(0) - 1).abs().max()) < 5 * (2 / n) ** 0.5
    corr = torch.corrcoef(xi.T) - torch.eye(source.features)
    assert float(corr.abs().max()) < 5 / n**0.5
    p = torch.sigmoid(x.double().reshape(-1, source.features) @ source.comparator(5))
    labels = y.reshape(-1).double()
    assert abs(float(labels.mean() - p.mean())) < 5 * float((p * (1 - p)).mean() / n) ** 0.5
    for low, high in ((0.0, 0.2), (0.4, 0.6), (0.8, 1.0)):  # calibrated in every band
        band = (p >= low) & (p < high)
        assert abs(float(labels[band].mean() - p[band].mean())) < 0.02
