"""Every partition (fedcore.data.partition): pinned by hash, a pure function of its inputs,
covering each example once, with the natural one keeping writers whole on both splits."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.config import PARTITIONS, config_from_dict
from fedcore.data import natural_owners, own_test_parts, partition
from fedcore.data.partitions import slice_order, slice_part
from fedcore.errors import ConfigError, DataError

LABELS = np.random.default_rng(7).integers(0, 10, 1000)
WRITERS = np.random.default_rng(8).integers(0, 60, 1000)

PINNED = {
    ("iid", 4): "fcd8411ca19e7e2f",
    ("iid", 16): "1b0eae901dcb4353",
    ("iid", 50): "dff9fbcf1a64ba4b",
    ("dirichlet", 4): "2e5a1a82d82a9a99",
    ("dirichlet", 16): "4da369eaac0de034",
    ("dirichlet", 50): "1a19a66b85d4dad9",
    ("shards", 4): "232f46d9c40ff4d5",
    ("shards", 16): "add3532c4e4b5332",
    ("shards", 50): "6e16275c599f7a87",
    ("sorted", 4): "5bb765b894108a45",
    ("sorted", 16): "09396aeafc92fa9a",
    ("sorted", 50): "92daa957d326bd2c",
    ("quantity", 4): "ea0bf69d5f2ecc0f",
    ("quantity", 16): "9441ab381f5025c6",
    ("quantity", 50): "19fd4cc8c126154c",
    ("natural", 4): "0a56944071a1a67c",
    ("natural", 16): "604df429fa8192bc",
    ("natural", 50): "7bf470c7bfb52ff7",
    # One seeded permutation cut in slices: iid's split where the nodes divide the examples.
    ("slices", 4): "fcd8411ca19e7e2f",
    ("slices", 16): "07dad419897f724f",
    ("slices", 50): "dff9fbcf1a64ba4b",
}
COVERING = tuple(s for s in PARTITIONS if s != "slices")  # slices: its own test below


def digest(parts: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(np.asarray(p, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def split(scheme: str, n: int, seed: int = 3) -> list[np.ndarray]:
    return partition(LABELS, n, scheme, seed=seed, alpha=0.5, shards_per_node=2, groups=WRITERS)


def test_every_scheme_is_pinned() -> None:
    assert {s for s, _ in PINNED} == set(PARTITIONS)


@pytest.mark.parametrize(("scheme", "n"), sorted(PINNED))
def test_partition_is_pinned(scheme: str, n: int) -> None:
    """The same split on every machine and version: a changed split changes every result."""
    parts = split(scheme, n)
    assert digest(parts) == PINNED[scheme, n]
    assert digest(split(scheme, n)) == PINNED[scheme, n]  # two calls, one answer
    joined = np.sort(np.concatenate(parts))
    if scheme == "slices":  # 1000 // n a node, disjoint: 16 nodes leave 8 examples out
        assert len(np.unique(joined)) == len(joined) == len(LABELS) - len(LABELS) % n
    else:
        assert np.array_equal(joined, np.arange(len(LABELS)))


@settings(max_examples=40, deadline=None)
@given(
    scheme=st.sampled_from(COVERING),
    n=st.integers(1, 30),
    seed=st.integers(0, 2**31),
    alpha=st.floats(0.05, 5.0),
)
def test_every_example_once_and_no_peer_below_the_minimum(
    scheme: str, n: int, seed: int, alpha: float
) -> None:
    try:
        parts = partition(LABELS, n, scheme, seed=seed, alpha=alpha, groups=WRITERS)
    except DataError:  # a skewed draw that cannot give everyone two: refused, not made
        return
    joined = np.concatenate(parts)
    assert len(joined) == len(LABELS) and np.array_equal(np.sort(joined), np.arange(1000))
    assert min(len(p) for p in parts) >= 2 and len(parts) == n


def test_slices_are_a_pure_function_of_seed_and_index() -> None:
    """A client's part is found by index, alone (what a population needs); examples wrap
    around when the nodes outnumber them, and sizes are refused at their extremes."""
    parts = partition(LABELS, 30, "slices", seed=5, examples_per_node=70)
    order = slice_order(len(LABELS), 5)
    for i in (0, 13, 29):
        assert np.array_equal(parts[i], slice_part(order, i, 70))
    assert all(len(p) == 70 and len(np.unique(p)) == 70 for p in parts)
    assert np.array_equal(slice_part(order, 10**6, 70), slice_part(order, 10**6, 70))
    assert len(np.unique(np.concatenate(parts[:14]))) == 980  # 14 x 70 <= 1000: disjoint
    with pytest.raises(DataError, match=r"set data\.examples_per_node"):
        partition(LABELS, 501, "slices", seed=0)  # 1 example a node
    with pytest.raises(DataError, match="use at most 1000"):
        partition(LABELS, 2, "slices", seed=0, examples_per_node=1001)
    assert len(partition(LABELS, 2, "slices", seed=0, examples_per_node=1000)[1]) == 1000
    with pytest.raises(ConfigError, match="sizes the 'slices' partition"):
        config_from_dict({"data": {"examples_per_node": 5}})
    for size in (-1, 10**6 + 1):
        with pytest.raises(ConfigError, match="a whole number from 0 to 1,000,000"):
            config_from_dict({"data": {"partition": "slices", "examples_per_node": size}})


@pytest.mark.parametrize("n", [4, 16, 60])
def test_natural_keeps_every_writer_on_one_peer(n: int) -> None:
    parts = split("natural", n)
    holder = {}
    for peer, p in enumerate(parts):
        for w in np.unique(WRITERS[p]):
            assert holder.setdefault(int(w), peer) == peer
    assert len(holder) == 60
    sizes = [len(np.unique(WRITERS[p])) for p in parts]
    assert max(sizes) - min(sizes) <= 1  # dealt round-robin: whole writers, evenly


def test_natural_is_refused_with_more_peers_than_writers() -> None:
    with pytest.raises(DataError, match="60 writers for 61 nodes"):
        split("natural", 61)
    with pytest.raises(DataError, match="needs a dataset with writers"):
        partition(LABELS, 4, "natural", seed=0)


def test_own_test_parts_follow_the_writers_of_the_training_split() -> None:
    test_writers = np.random.default_rng(9).integers(0, 60, 300)
    tests = own_test_parts(WRITERS, test_writers, 8, seed=3)
    assert tests is not None
    owners = natural_owners(WRITERS, 8, seed=3)
    train = split("natural", 8)
    for peer, (tr, te) in enumerate(zip(train, tests, strict=True)):
        assert set(WRITERS[tr]) >= set(test_writers[te])
        assert (owners[test_writers[te]] == peer).all()
    joined = np.sort(np.concatenate(tests))
    assert np.array_equal(joined, np.arange(300))
    again = own_test_parts(WRITERS, test_writers, 8, seed=3)
    assert again is not None and digest(again) == digest(tests)


def test_a_split_by_writer_has_no_per_peer_test_sets() -> None:
    """LEAF's -t user: the test writers are not the training writers."""
    assert own_test_parts(WRITERS, np.arange(60), 4, seed=0) is not None
    elsewhere = np.append(np.arange(60), 70)  # a writer with no training example
    assert own_test_parts(WRITERS, elsewhere, 4, seed=0) is None
    one_writer = np.full(10, 59)  # the other peers would have no test example
    assert own_test_parts(WRITERS, one_writer, 4, seed=0) is None


def test_quantity_skews_sizes_not_labels() -> None:
    parts = partition(LABELS, 10, "quantity", seed=0, alpha=0.3)
    sizes = sorted(len(p) for p in parts)
    assert sizes[-1] > 4 * sizes[0]
    big = max(parts, key=len)
    assert len(np.unique(LABELS[big])) == 10  # labels iid within a peer
    even = partition(LABELS, 10, "quantity", seed=0, alpha=1000.0)
    assert max(len(p) for p in even) - min(len(p) for p in even) < 30


def test_shards_give_each_peer_about_its_shards_classes() -> None:
    labels = np.repeat(np.arange(10), 100)
    parts = partition(labels, 10, "shards", seed=0, shards_per_node=2)
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


def test_natural_is_refused_at_load_for_data_without_writers() -> None:
    with pytest.raises(ConfigError, match="needs a dataset with writers"):
        config_from_dict({"data": {"partition": "natural"}})
    config_from_dict({"data": {"partition": "natural", "dataset": "femnist"}})
    with pytest.raises(ConfigError, match=r"data\.root"):
        config_from_dict({"data": {"root": " /data"}})
