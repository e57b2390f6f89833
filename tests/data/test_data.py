"""Tests of datasets, partitions across nodes and per-node minibatch streams."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.data import (
    DATASETS,
    PARTITIONS,
    BatchStream,
    Dataset,
    StackedBatches,
    digits,
    load_dataset,
    load_object,
    partition,
)
from fedcore.errors import DataError

REPO = Path(__file__).resolve().parents[2]
CUSTOM = "examples.custom.my_experiment"


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))


@pytest.fixture(scope="module")
def ds() -> Dataset:
    return digits(seed=0)


def wrong_type_factory(*, seed: int, test_fraction: float) -> dict[str, object]:
    """A user factory that returns something other than a Dataset."""
    return {"seed": seed, "test_fraction": test_fraction}


def wrong_signature_factory(n: int) -> Dataset:
    """A user factory that does not take ``seed`` and ``test_fraction``."""
    raise AssertionError("never called with the right arguments")


def distinct_labels(y: np.ndarray, parts: list[np.ndarray]) -> float:
    return float(np.mean([len(np.unique(y[p])) for p in parts]))


# --- digits ---------------------------------------------------------------------------


def test_digits_shapes_and_types(ds: Dataset) -> None:
    assert ds.name == "digits"
    assert ds.num_classes == 10
    assert ds.input_dim == 64
    assert tuple(ds.x_train.shape) == (1437, 64)
    assert tuple(ds.x_test.shape) == (360, 64)
    assert ds.x_train.dtype == torch.float32 and ds.x_test.dtype == torch.float32
    assert ds.y_train.dtype == torch.int64 and ds.y_test.dtype == torch.int64
    assert set(ds.y_train.tolist()) == set(range(10))
    assert DATASETS["digits"] is digits


def test_digits_test_fraction_sets_the_split_size() -> None:
    half = digits(seed=0, test_fraction=0.5)
    assert len(half.y_train) + len(half.y_test) == 1797
    assert abs(len(half.y_test) - 1797 * 0.5) <= 1


def test_digits_is_standardized_with_training_statistics(ds: Dataset) -> None:
    x = ds.x_train.double()
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    assert torch.allclose(mean, torch.zeros(64, dtype=torch.float64), atol=1e-5)
    constant = std < 1e-6
    assert constant.any()  # digits has always-blank border pixels: they stay at 0
    assert torch.allclose(
        std[~constant], torch.ones(int((~constant).sum()), dtype=x.dtype), atol=1e-4
    )
    assert torch.all(x[:, constant] == 0)
    # the test split is scaled with the training statistics, not its own
    assert not torch.allclose(
        ds.x_test.double().mean(dim=0), torch.zeros(64, dtype=x.dtype), atol=1e-5
    )


def test_digits_split_is_stratified(ds: Dataset) -> None:
    train = np.bincount(ds.y_train.numpy(), minlength=10)
    test = np.bincount(ds.y_test.numpy(), minlength=10)
    total = train + test
    expected = total * len(ds.y_test) / total.sum()
    assert np.all(np.abs(test - expected) <= 1.0)


def test_digits_split_is_deterministic_per_seed(ds: Dataset) -> None:
    again = digits(seed=0)
    assert torch.equal(again.x_train, ds.x_train) and torch.equal(again.y_test, ds.y_test)
    other = digits(seed=1)
    assert not torch.equal(other.y_train, ds.y_train)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_digits_rejects_bad_test_fraction(fraction: float) -> None:
    with pytest.raises(DataError, match="test_fraction"):
        digits(seed=0, test_fraction=fraction)


def tiny_dataset(**overrides: torch.Tensor) -> Dataset:
    tensors = {
        "x_train": torch.zeros(4, 2),
        "y_train": torch.tensor([0, 1, 0, 1]),
        "x_test": torch.zeros(2, 2),
        "y_test": torch.tensor([1, 0]),
        **overrides,
    }
    return Dataset(name="tiny", num_classes=2, **tensors)


def test_dataset_checks_shapes_and_labels() -> None:
    assert tiny_dataset().input_dim == 2
    assert tiny_dataset(x_train=torch.zeros(4, 3, 5)).input_dim == 15
    with pytest.raises(DataError, match="train split has 4 inputs and 3 labels"):
        tiny_dataset(y_train=torch.tensor([0, 1, 0]))
    with pytest.raises(DataError, match="test split has 0 inputs"):
        tiny_dataset(x_test=torch.zeros(0, 2), y_test=torch.zeros(0, dtype=torch.int64))
    with pytest.raises(DataError, match="int64"):
        tiny_dataset(y_train=torch.tensor([0, 1, 2, 0]))  # label 2 of 2 classes
    with pytest.raises(DataError, match="int64"):
        tiny_dataset(y_test=torch.tensor([-1, 0]))
    with pytest.raises(DataError, match="int64"):
        tiny_dataset(y_train=torch.tensor([0, 1, 0, 1], dtype=torch.int32))


# --- load_dataset -----------------------------------------------------------------------


def test_load_dataset_builtin() -> None:
    d = load_dataset("digits", seed=0, test_fraction=0.2)
    assert d.name == "digits" and len(d.y_test) == 360


def test_load_dataset_user_factory_by_import_path() -> None:
    d = load_dataset(f"{CUSTOM}:make_dataset", seed=3, test_fraction=0.25)
    assert isinstance(d, Dataset)
    assert d.num_classes == 4 and d.input_dim == 2
    assert len(d.y_test) == 500 and len(d.y_train) == 1500
    again = load_dataset(f"{CUSTOM}:make_dataset", seed=3, test_fraction=0.25)
    assert torch.equal(d.x_train, again.x_train)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("nope", "unknown dataset 'nope'"),
        ("nosuchpkg.mod:f", "cannot import module 'nosuchpkg.mod'"),
        (f"{CUSTOM}:nope", "has no attribute 'nope'"),
        (f"{CUSTOM}:__doc__", "not callable"),
        (":make_dataset", "neither a built-in name"),
        (f"{CUSTOM}:", "neither a built-in name"),
    ],
)
def test_load_dataset_errors(name: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_dataset(name, seed=0)


def test_load_dataset_factory_returning_the_wrong_type() -> None:
    with pytest.raises(DataError, match=r"returned dict, not fedcore\.data\.Dataset"):
        load_dataset(f"{__name__}:wrong_type_factory", seed=0)


def test_load_dataset_factory_with_the_wrong_signature() -> None:
    with pytest.raises(DataError, match="wrong_signature_factory"):
        load_dataset(f"{__name__}:wrong_signature_factory", seed=0)


def test_load_object() -> None:
    assert load_object("fedcore.data:digits", what="dataset") is digits
    with pytest.raises(DataError, match="thing"):
        load_object("no_colon", what="thing")


# --- partitions -------------------------------------------------------------------------

SCHEMES = list(PARTITIONS)
COVERING = [s for s in SCHEMES if s != "slices"]  # slices may leave some out: test_partitions.py


def writers_of(n: int) -> np.ndarray:
    """37 made-up writers of ``n`` examples, interleaved (the natural scheme's groups)."""
    return (np.arange(n) * 7919) % 37


def check_split(parts: list[np.ndarray], n: int, n_parts: int, min_size: int) -> None:
    assert len(parts) == n_parts
    joined = np.concatenate(parts)
    assert len(joined) == n  # disjoint: nothing counted twice ...
    assert np.array_equal(np.sort(joined), np.arange(n))  # ... and every index covered
    for p in parts:
        assert p.dtype.kind == "i"
        assert np.all(np.diff(p) > 0)  # sorted, no repeats
        assert len(p) >= min_size


@pytest.mark.parametrize("scheme", COVERING)
@pytest.mark.parametrize("n_parts", [1, 4, 16])
def test_partition_covers_every_index_once(ds: Dataset, scheme: str, n_parts: int) -> None:
    y = ds.y_train.numpy()
    parts = partition(
        y,
        n_parts,
        scheme,
        seed=0,
        alpha=0.5,
        shards_per_node=2,
        min_size=5,
        groups=writers_of(len(y)),
    )
    check_split(parts, len(y), n_parts, 5)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_partition_accepts_a_tensor(ds: Dataset, scheme: str) -> None:
    groups = writers_of(len(ds.y_train))
    a = partition(ds.y_train, 4, scheme, seed=2, groups=groups)
    b = partition(ds.y_train.numpy(), 4, scheme, seed=2, groups=groups)
    assert all(np.array_equal(x, z) for x, z in zip(a, b, strict=True))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_partition_is_deterministic_per_seed(ds: Dataset, scheme: str) -> None:
    y = ds.y_train.numpy()
    groups = writers_of(len(y))
    a = partition(y, 8, scheme, seed=1, groups=groups)
    b = partition(y, 8, scheme, seed=1, groups=groups)
    c = partition(y, 8, scheme, seed=2, groups=groups)
    assert all(np.array_equal(x, z) for x, z in zip(a, b, strict=True))
    differ = not all(np.array_equal(x, z) for x, z in zip(a, c, strict=True))
    assert differ == (scheme != "sorted")  # sorted: label runs in node order, no draw


def test_dirichlet_respects_min_size_under_heavy_skew() -> None:
    y = np.repeat(np.arange(10), 30)
    parts = partition(y, 10, "dirichlet", seed=0, alpha=0.1, min_size=10)
    check_split(parts, 300, 10, 10)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_iid_respects_min_size_at_the_limit(seed: int) -> None:
    y = np.zeros(12, dtype=np.int64)
    check_split(partition(y, 4, "iid", seed=seed, min_size=3), 12, 4, 3)


def test_shards_respect_min_size_or_raise() -> None:
    y = np.arange(9)
    try:
        parts = partition(y, 3, "shards", seed=0, shards_per_node=2, min_size=3)
    except DataError:
        return
    assert min(len(p) for p in parts) >= 3


def test_small_alpha_gives_more_label_skew_than_large_alpha(ds: Dataset) -> None:
    y = ds.y_train.numpy()
    skewed = distinct_labels(y, partition(y, 10, "dirichlet", seed=0, alpha=0.05))
    mild = distinct_labels(y, partition(y, 10, "dirichlet", seed=0, alpha=100.0))
    iid = distinct_labels(y, partition(y, 10, "iid", seed=0))
    assert skewed < 5.0
    assert mild > 9.0 and iid > 9.0
    assert skewed < mild


def test_one_shard_per_node_gives_about_one_label(ds: Dataset) -> None:
    y = ds.y_train.numpy()
    parts = partition(y, 10, "shards", seed=0, shards_per_node=1)
    assert distinct_labels(y, parts) <= 2.0
    balanced = np.repeat(np.arange(10), 20)
    parts = partition(balanced, 10, "shards", seed=4, shards_per_node=1)
    assert [len(np.unique(balanced[p])) for p in parts] == [1] * 10
    assert sorted(int(balanced[p][0]) for p in parts) == list(range(10))


def test_shards_per_node_sets_labels_per_node() -> None:
    y = np.repeat(np.arange(10), 20)
    parts = partition(y, 5, "shards", seed=0, shards_per_node=2)
    assert all(len(np.unique(y[p])) <= 2 for p in parts)
    assert all(len(p) == 40 for p in parts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scheme": "nope"}, "unknown partition 'nope'"),
        ({"scheme": "dirichlet", "alpha": 0.0}, "alpha"),
        ({"scheme": "dirichlet", "alpha": -1.0}, "alpha"),
        ({"scheme": "iid", "n_parts": 0}, "0 nodes"),
        ({"scheme": "iid", "n_parts": 30}, "too few"),
        ({"scheme": "iid", "n_parts": 10, "min_size": 3}, "too few"),
        ({"scheme": "shards", "shards_per_node": 0}, "shards_per_node"),
        ({"scheme": "shards", "n_parts": 10, "shards_per_node": 3}, "shards_per_node"),
    ],
)
def test_partition_errors(kwargs: dict[str, object], match: str) -> None:
    y = np.repeat(np.arange(2), 10)
    args: dict[str, object] = {"n_parts": 4, "seed": 0, **kwargs}
    with pytest.raises(DataError, match=match) as info:
        partition(y, **args)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_dirichlet_that_cannot_meet_min_size_raises() -> None:
    y = np.repeat(np.arange(2), 10)
    with pytest.raises(DataError, match="1000 tries"):
        partition(y, 10, "dirichlet", seed=0, alpha=0.001, min_size=2)


# --- BatchStream ------------------------------------------------------------------------


def stream(n: int, batch_size: int, seed: int = 0) -> BatchStream:
    return BatchStream(
        torch.arange(n, dtype=torch.float32).unsqueeze(1) * 10,
        torch.arange(n),
        batch_size=batch_size,
        seed=seed,
    )


def epochs(s: BatchStream, n_epochs: int, per_epoch: int) -> list[list[int]]:
    out: list[list[int]] = []
    for _ in range(n_epochs):
        seen: list[int] = []
        for _ in range(per_epoch):
            x, y = s.next_batch()
            assert torch.equal(x[:, 0], y.to(torch.float32) * 10)  # inputs stay with labels
            seen.extend(y.tolist())
        out.append(seen)
    return out


def test_batch_stream_visits_every_example_once_per_epoch() -> None:
    s = stream(12, 4)
    assert len(s) == 12
    got = epochs(s, 4, 3)
    for epoch in got:
        assert sorted(epoch) == list(range(12))
    assert len({tuple(e) for e in got}) > 1  # reshuffled between epochs


def test_batch_stream_without_full_last_batch_repeats_nothing_in_an_epoch() -> None:
    # 10 examples in batches of 4: an epoch is two full batches; the remainder waits
    # for a later epoch (drop-last), but no example repeats inside an epoch.
    s = stream(10, 4, seed=3)
    seen: set[int] = set()
    for epoch in epochs(s, 10, 2):
        assert len(epoch) == len(set(epoch)) == 8
        seen.update(epoch)
    assert seen == set(range(10))


def test_batch_stream_clips_batch_size_to_the_data() -> None:
    s = stream(3, 32)
    assert s.batch_size == 3
    for _ in range(3):
        _, y = s.next_batch()
        assert sorted(y.tolist()) == [0, 1, 2]


def test_batch_stream_is_deterministic_per_seed() -> None:
    a = epochs(stream(20, 5, seed=7), 3, 4)
    b = epochs(stream(20, 5, seed=7), 3, 4)
    c = epochs(stream(20, 5, seed=8), 3, 4)
    assert a == b
    assert a != c


def test_batch_stream_errors() -> None:
    with pytest.raises(DataError, match="batch_size"):
        stream(4, 0)
    with pytest.raises(DataError, match="no training examples"):
        BatchStream(torch.zeros(0, 2), torch.zeros(0, dtype=torch.int64), batch_size=2, seed=0)


@pytest.mark.parametrize(
    ("order", "pinned"),
    [
        ("shuffled", [[6, 0, 3, 7], [8, 5, 1, 9], [9, 8, 5, 3], [0, 6, 7, 2], [0, 9, 6, 1]]),
        ("sorted", [[7, 4, 3, 8], [1, 6, 9, 2], [7, 4, 8, 3], [1, 9, 6, 2], [7, 4, 1, 3]]),
    ],
)
def test_batch_stream_draws_the_pinned_batches(order: str, pinned: list[list[int]]) -> None:
    # Drawn by BatchStream before it became a one-row StackedBatches: any change to the
    # permutations, the epoch rule or the sorted order shows here.
    y = torch.tensor([3, 1, 2, 1, 0, 3, 2, 0, 1, 2])
    s = BatchStream(torch.arange(10.0)[:, None], y, batch_size=4, seed=3, order=order)
    got = [s.next_batch()[0][:, 0].long().tolist() for _ in range(5)]
    assert got == pinned


@pytest.mark.parametrize("order", ["shuffled", "sorted"])
def test_stacked_batches_draw_every_nodes_batch_stream(order: str) -> None:
    # The vectorized engine's batches are the message engine's: node i's rows of
    # StackedBatches.next are its BatchStream's batches, a crashed node reads nothing, and
    # take(i) moves node i alone; ragged parts (fewer examples than batch_size) are masked.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=gen)
    y = torch.randint(0, 4, (40,), generator=gen)
    parts = [np.arange(0, 11), np.arange(11, 14), np.arange(14, 40)]
    seeds = [5, 6, 7]
    stack = StackedBatches(
        x, y, parts, batch_size=4, seeds=seeds, order=order, device=torch.device("cpu")
    )
    streams = [
        BatchStream(x[p], y[p], batch_size=4, seed=s, order=order)
        for p, s in zip(parts, seeds, strict=True)
    ]
    rng = np.random.default_rng(1)
    for t in range(12):
        up = rng.random(3) < 0.7
        if t % 4 == 3:
            i = int(rng.integers(3))
            want = streams[i].next_batch()[1]
            assert torch.equal(y[parts[i]][stack.take(i)], want)
            continue
        rows, bx, by, mask = stack.next(up)
        assert rows.tolist() == np.nonzero(up)[0].tolist()
        for k, i in enumerate(rows.tolist()):
            wx, wy = streams[i].next_batch()
            n = len(wy)
            assert mask is None or int(mask[k].sum()) == n
            assert torch.equal(bx[k, :n], wx) and torch.equal(by[k, :n], wy)


def test_stacked_batches_state_dict_continues_exactly() -> None:
    # The vectorized engine's checkpoint holds this dict; its keys are the stored format.
    x, y = torch.randn(30, 2), torch.arange(30) % 3
    parts = [np.arange(0, 13), np.arange(13, 30)]

    def make() -> StackedBatches:
        return StackedBatches(
            x, y, parts, batch_size=5, seeds=[1, 2], order="shuffled", device=torch.device("cpu")
        )

    up = np.ones(2, dtype=np.bool_)
    a = make()
    for _ in range(3):
        a.next(up)
    state = a.state_dict()
    assert set(state) == {"generators", "positions", "orders"}
    b = make()
    b.load_state_dict(state)
    for _ in range(6):
        (_, xa, _, _), (_, xb, _, _) = a.next(up), b.next(up)
        assert torch.equal(xa, xb)


def test_stacked_batches_errors() -> None:
    x, y, cpu = torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64), torch.device("cpu")
    with pytest.raises(DataError, match="node index 1"):
        StackedBatches(x, y, [[0], []], batch_size=1, seeds=[0, 1], order="shuffled", device=cpu)
    with pytest.raises(DataError, match="batch_size"):
        StackedBatches(x, y, [[0]], batch_size=0, seeds=[0], order="shuffled", device=cpu)
    with pytest.raises(DataError, match="order"):
        StackedBatches(x, y, [[0]], batch_size=1, seeds=[0], order="random", device=cpu)


def test_mnist1d_is_generated_offline_and_seeded() -> None:
    import numpy as np

    from fedcore.data import mnist1d

    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    a = mnist1d(seed=1, test_fraction=0.25, num_samples=400)
    assert np.random.random() == before  # the global NumPy state is left as it was
    b = mnist1d(seed=1, test_fraction=0.25, num_samples=400)
    assert a.x_train.shape == (300, 40) and a.x_test.shape == (100, 40)
    assert torch.equal(a.x_train, b.x_train) and a.num_classes == 10
    assert set(a.y_train.tolist()) == set(range(10))
