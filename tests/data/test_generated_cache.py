"""The cache of the built-in datasets that are made, not read (digits, MNIST-1D): what it
gives back is what making them gives, bit for bit; whatever lies in the cache folder (a
file cut short, random bytes, arrays of the wrong shape, a link) is never read as data,
never replaced where fedcore did not write it, and costs only the making."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.data import digits
from fedcore.data.cache import CACHE_ENV, user_cache
from fedcore.data.types import Dataset

SPLITS = ("x_train", "y_train", "x_test", "y_test")


def _equal(a: Dataset, b: Dataset) -> None:
    for split in SPLITS:
        x, y = getattr(a, split), getattr(b, split)
        assert x.dtype == y.dtype and torch.equal(x, y), split


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Dataset:
    """digits(seed=2) made with no cache."""
    monkeypatch.setenv(CACHE_ENV, "")
    return digits(seed=2)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _only_file(folder: Path) -> Path:
    (path,) = folder.glob("digits-*.npz")
    return path


def test_a_hit_is_the_made_dataset_bit_for_bit(fresh: Dataset, folder: Path) -> None:
    _equal(digits(seed=2), fresh)  # a miss: made, then kept
    assert _only_file(folder).stat().st_size > 0
    _equal(digits(seed=2), fresh)  # a hit
    # Another seed or split is another file.
    digits(seed=3)
    digits(seed=2, test_fraction=0.3)
    assert len(list(folder.glob("digits-*.npz"))) == 3


def test_an_empty_variable_turns_it_off(fresh: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, " ")
    assert user_cache() is None
    _equal(digits(seed=2), fresh)


def test_the_default_folder_is_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache() == tmp_path / "xdg" / "fedcore"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache() == tmp_path / "home" / ".cache" / "fedcore"


@pytest.mark.parametrize(
    "spoil",
    [
        "cut",
        "garbage",
        "labels",
        "nan",
        "shape",
        "dtype",
        "fewer",
        "extra-array",
    ],
)
def test_a_spoiled_file_is_made_again(spoil: str, fresh: Dataset, folder: Path) -> None:
    digits(seed=2)
    path = _only_file(folder)
    with np.load(path) as blob:
        arrays = {k: blob[k] for k in blob.files}
    if spoil == "cut":
        path.write_bytes(path.read_bytes()[:1000])
    elif spoil == "garbage":
        path.write_bytes(os.urandom(5000))
    else:
        if spoil == "labels":
            arrays["y_train"][0] = 10
        elif spoil == "nan":
            arrays["x_test"][3, 5] = np.nan
        elif spoil == "shape":
            arrays["x_train"] = arrays["x_train"][:, :63]
        elif spoil == "dtype":
            arrays["x_train"] = arrays["x_train"].astype(np.float64)
        elif spoil == "fewer":
            arrays["x_train"], arrays["y_train"] = arrays["x_train"][1:], arrays["y_train"][1:]
        else:
            arrays["extra"] = np.zeros(3)
        with path.open("wb") as f:
            np.savez(f, **arrays)
    _equal(digits(seed=2), fresh)
    if spoil != "extra-array":  # a file fedcore did not write is left alone
        _equal(digits(seed=2), fresh)


def test_a_link_is_neither_read_nor_replaced(fresh: Dataset, folder: Path, tmp_path: Path) -> None:
    digits(seed=2)
    path = _only_file(folder)
    target = tmp_path / "elsewhere.npz"
    path.rename(target)
    path.symlink_to(target)
    before = target.read_bytes()
    _equal(digits(seed=2), fresh)
    assert path.is_symlink() and target.read_bytes() == before


def test_a_folder_that_is_a_file_or_a_link_is_no_cache(
    fresh: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "a-file"
    plain.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(plain))
    assert user_cache() is None
    _equal(digits(seed=2), fresh)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "link"))
    assert user_cache() is None
    _equal(digits(seed=2), fresh)
    assert not list(real.iterdir())


def test_a_folder_that_cannot_be_written_costs_only_the_making(
    fresh: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / "parent"
    parent.write_text("a file where the cache's parent folder should be")
    monkeypatch.setenv(CACHE_ENV, str(parent / "cache"))
    _equal(digits(seed=2), fresh)


@given(st.binary(max_size=3000))
@settings(max_examples=40, deadline=None)
def test_any_bytes_in_the_file_give_the_made_dataset(data: bytes) -> None:
    folder = Path(os.environ[CACHE_ENV])
    path = _only_file(folder)
    path.write_bytes(data)
    got = digits(seed=2)
    # Made again; a file that is not one fedcore wrote is left as it was.
    assert path.read_bytes() == data or _keeps_the_splits(path)
    assert torch.equal(got.y_test, EXPECTED.y_test) and torch.equal(got.x_train, EXPECTED.x_train)


EXPECTED: Dataset


def _keeps_the_splits(path: Path) -> bool:
    with np.load(path) as blob:
        return set(blob.files) == set(SPLITS)


@pytest.fixture(autouse=True, scope="module")
def _expected(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A cache folder of this module's own (the property test reads it from the
    environment, which hypothesis leaves as the fixtures set it)."""
    global EXPECTED
    folder = tmp_path_factory.mktemp("module-cache")
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    try:
        EXPECTED = digits(seed=2)
        yield
    finally:
        if old is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = old


def test_a_hit_imports_no_scikit_learn(tmp_path: Path) -> None:
    code = (
        "import sys; from fedcore.data import digits; digits(seed=5); "
        "print('sklearn' in sys.modules)"
    )
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache")}
    runs = [
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    assert [r.stdout.strip() for r in runs] == ["True", "False"], [r.stderr for r in runs]
