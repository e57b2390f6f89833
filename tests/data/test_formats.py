"""The datasets read from local files (fedcore.data's format modules), on stand-in files
written in each real format and layout (fedcore.data.standin): shapes, dtypes, labels as the
files hold them, missing datasets, the CIFAR unpickler's refusals, and the folder: forms."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.data import load_dataset
from fedcore.data.files import DATA_ENV, FETCH, MissingDataset, data_root
from fedcore.data.idx import read_idx
from fedcore.data.leaf import SHAKESPEARE_LETTERS
from fedcore.data.standin import STANDINS, main, write_standin
from fedcore.errors import DataError
from tests.clitools import cli, one_line_error

SHAPES = {
    "cifar10": ((3, 32, 32), 10, torch.float32),
    "cifar100": ((3, 32, 32), 100, torch.float32),
    "fashion-mnist": ((1, 28, 28), 10, torch.float32),
    "emnist": ((1, 28, 28), 47, torch.float32),
    "femnist": ((1, 28, 28), 62, torch.float32),
    "shakespeare": ((80,), 80, torch.int64),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("data")
    for name in STANDINS:
        write_standin(name, base, samples=240, writers=12)
    return base


def _file_labels(name: str, root: Path) -> tuple[list[int], list[int]]:
    """The labels as the files hold them, read without fedcore.data."""
    if name == "cifar10":
        folder = root / "cifar-10-batches-py"
        train = []
        for i in range(1, 6):
            with (folder / f"data_batch_{i}").open("rb") as f:
                train += pickle.load(f, encoding="latin1")["labels"]
        with (folder / "test_batch").open("rb") as f:
            return train, pickle.load(f, encoding="latin1")["labels"]
    if name == "cifar100":
        out = []
        for split in ("train", "test"):
            with (root / "cifar-100-python" / split).open("rb") as f:
                out.append(pickle.load(f, encoding="latin1")["fine_labels"])
        return out[0], out[1]
    if name in ("fashion-mnist", "emnist"):
        raw = root / ("EMNIST" if name == "emnist" else "FashionMNIST") / "raw"
        stems = (
            ("emnist-balanced-train", "emnist-balanced-test")
            if name == "emnist"
            else (
                "train",
                "t10k",
            )
        )
        pair = [list((raw / f"{s}-labels-idx1-ubyte").read_bytes()[8:]) for s in stems]
        return pair[0], pair[1]
    out = []
    for split in ("train", "test"):
        users: dict[str, list[object]] = {}
        for path in sorted((root / name / "data" / split).glob("*.json")):
            for user, data in json.loads(path.read_text())["user_data"].items():
                users[user] = data["y"]
        labels = [y for u in sorted(users) for y in users[u]]
        if name == "shakespeare":
            labels = [SHAKESPEARE_LETTERS.index(str(c)) for c in labels]
        out.append([int(str(v)) for v in labels])
    return out[0], out[1]


@pytest.mark.parametrize("name", STANDINS)
def test_every_loader_reads_its_standin_folder(name: str, root: Path) -> None:
    dataset = load_dataset(name, seed=0, root=str(root))
    shape, classes, dtype = SHAPES[name]
    assert dataset.name == name and dataset.num_classes == classes
    for x, y in ((dataset.x_train, dataset.y_train), (dataset.x_test, dataset.y_test)):
        assert tuple(x.shape[1:]) == shape and x.dtype == dtype and y.dtype == torch.int64
        assert len(x) == len(y) > 0
    train, test = _file_labels(name, root)
    assert dataset.y_train.tolist() == train and dataset.y_test.tolist() == test
    if dtype == torch.float32:  # standardized per channel with the training split's figures
        means = dataset.x_train.double().mean(dim=(0, 2, 3))
        stds = dataset.x_train.double().std(dim=(0, 2, 3))
        assert torch.allclose(means, torch.zeros_like(means), atol=1e-4)
        assert torch.allclose(stds, torch.ones_like(stds), atol=1e-2)
    else:
        assert int(dataset.x_train.min()) >= 0 and int(dataset.x_train.max()) < classes


@pytest.mark.parametrize("name", ["femnist", "shakespeare"])
def test_leaf_datasets_keep_their_writers(name: str, root: Path) -> None:
    dataset = load_dataset(name, seed=0, root=str(root))
    assert dataset.groups_train is not None and dataset.groups_test is not None
    assert len(dataset.writers) == 12 and list(dataset.writers) == sorted(dataset.writers)
    counts = np.bincount(dataset.groups_train, minlength=12)
    for user, count in zip(dataset.writers, counts, strict=True):
        in_files = 0
        for path in (root / name / "data" / "train").glob("*.json"):
            in_files += len(json.loads(path.read_text())["user_data"].get(user, {"y": []})["y"])
        assert in_files == count


def test_shakespeare_characters_follow_leafs_vocabulary(root: Path) -> None:
    dataset = load_dataset("shakespeare", seed=0, root=str(root))
    path = sorted((root / "shakespeare" / "data" / "train").glob("*.json"))[0]
    blob = json.loads(path.read_text())
    user = sorted(blob["user_data"])[0]
    first = blob["user_data"][user]["x"][0]
    at = dataset.writers.index(user)
    row = dataset.x_train[np.flatnonzero(dataset.groups_train == at)[0]]
    assert "".join(SHAKESPEARE_LETTERS[i] for i in row.tolist()) == first
    assert len(SHAKESPEARE_LETTERS) == 80


def test_idx_files_read_alike_plain_and_gzipped(tmp_path: Path) -> None:
    plain = write_standin("fashion-mnist", tmp_path / "a", samples=40)
    packed = write_standin("fashion-mnist", tmp_path / "b", samples=40, compress=True)
    assert not list(packed.glob("*ubyte")) and len(list(packed.glob("*.gz"))) == 4
    a = load_dataset("fashion-mnist", seed=0, root=str(tmp_path / "a"))
    b = load_dataset("fashion-mnist", seed=0, root=str(tmp_path / "b"))
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    image = read_idx(plain / "train-images-idx3-ubyte")
    assert image.shape == (40, 28, 28) and image.dtype == np.uint8


def test_idx_headers_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "x"
    bad.write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"\x01\x02")
    with pytest.raises(DataError, match="header says"):
        read_idx(bad)
    bad.write_bytes(b"PK\x03\x04")
    with pytest.raises(DataError, match="not an idx file"):
        read_idx(bad)


def test_emnist_images_are_transposed_back(tmp_path: Path) -> None:
    raw = write_standin("emnist", tmp_path, samples=20)
    stored = read_idx(raw / "emnist-balanced-train-images-idx3-ubyte")
    dataset = load_dataset("emnist", seed=0, root=str(tmp_path))
    # standardization is one affine map: the order of pixels is the stored one, transposed
    x = dataset.x_train[0, 0].numpy()
    expected = stored[0].T.astype(np.float64)
    assert np.corrcoef(x.ravel(), expected.ravel())[0, 1] > 0.999


def _py2_array(values: bytes, shape: tuple[int, ...]) -> bytes:
    """A uint8 ndarray pickled as Python 2's numpy 1.x did (protocol 2, byte strings)."""
    dims = b"".join(b"K" + bytes([d]) if d < 256 else b"M" + struct.pack("<H", d) for d in shape)
    return (
        b"cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85U\x01b\x87R"
        + b"(K\x01("
        + dims
        + b"tcnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff"
        b"\xffK\x00tb\x89T" + struct.pack("<I", len(values)) + values + b"tb"
    )


def test_the_cifar_python_release_of_python_2_reads(tmp_path: Path) -> None:
    """The real batches were written by Python 2 (byte-string keys and data)."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        pixels = rng.integers(0, 256, (2, 3072), dtype=np.uint8)
        labels = b"]q\x03(K\x03K\x07e"
        blob = (
            b"\x80\x02}q\x00(U\x04data"
            + _py2_array(pixels.tobytes(), (2, 3072))
            + b"U\x06labels"
            + labels
            + b"u."
        )
        (folder / name).write_bytes(blob)
    dataset = load_dataset("cifar10", seed=0, root=str(tmp_path))
    assert tuple(dataset.x_train.shape) == (10, 3, 32, 32)
    assert dataset.y_train.tolist() == [3, 7] * 5


def test_the_cifar_unpickler_refuses_anything_but_arrays(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(pickle.dumps({"data": Evil()}, protocol=2))
    with pytest.raises(DataError, match="never does"):
        load_dataset("cifar10", seed=0, root=str(tmp_path))
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", sorted(FETCH))
def test_a_missing_dataset_is_one_line_with_the_fetch_command(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingDataset) as caught:
        load_dataset(name, seed=0, root=str(empty))
    text = str(caught.value)
    assert str(empty) in text
    assert ("torchvision.datasets" in text) or ("preprocess.sh" in text)
    argv = ["simulate", "--set", f"data.dataset={name}", "--set", f"data.root={empty}"]
    if name in ("femnist", "shakespeare"):
        argv += ["--set", "data.partition=natural"]
    line = one_line_error(capsys, [*argv, "--out", str(tmp_path / "run")], "fetch it")
    assert FETCH[name].format(root=str(empty)) in line
    assert list(empty.iterdir()) == []  # nothing downloaded, nothing written


def test_data_root_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(DATA_ENV, raising=False)
    assert data_root() == Path("~/.cache/fedcore/data").expanduser()
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    assert data_root() == tmp_path
    assert data_root("~/elsewhere") == Path.home() / "elsewhere"


def test_leaf_is_found_in_the_folders_leaf_writes(tmp_path: Path) -> None:
    write_standin("femnist", tmp_path, samples=60, writers=6)
    inner = tmp_path / "femnist" / "data"
    a = load_dataset("femnist", seed=0, root=str(tmp_path))
    b = load_dataset("femnist", seed=0, root=str(inner))  # LEAF's own data/ folder as root
    assert torch.equal(a.x_train, b.x_train) and a.writers == b.writers


def test_the_standin_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cifar10", "shakespeare", "--root", str(tmp_path), "--samples", "60"]) == 0
    assert (tmp_path / "cifar-10-batches-py" / "test_batch").is_file()
    assert "shakespeare: wrote" in capsys.readouterr().out
    assert main(["femnist", "--root", str(tmp_path), "--samples", "10", "--writers", "12"]) == 2
    assert main(["femnist", "--root", str(tmp_path / "few"), "--samples", "10"]) == 0  # 2 writers


# -- folder:PATH --------------------------------------------------------------------------------


def test_folder_npz(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "set.npz"
    np.savez(
        path,
        x_train=rng.normal(size=(30, 5)),
        y_train=rng.integers(0, 3, 30),
        x_test=rng.normal(size=(6, 5)),
        y_test=np.array([0, 1, 2, 0, 1, 2]),
    )
    dataset = load_dataset(f"folder:{path}", seed=0)
    assert tuple(dataset.x_train.shape) == (30, 5) and dataset.num_classes == 3
    np.savez(tmp_path / "bad.npz", x=np.zeros(3))
    with pytest.raises(DataError, match="has no x_train"):
        load_dataset(f"folder:{tmp_path / 'bad.npz'}", seed=0)


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_folder_of_image_folders(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("test", 2)):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
                (tmp_path / split / cls / f"{i}.png").write_bytes(_png(pixels))
    dataset = load_dataset(f"folder:{tmp_path}", seed=0)
    assert tuple(dataset.x_train.shape) == (8, 3, 8, 8) and dataset.num_classes == 2
    assert dataset.y_train.tolist() == [0] * 4 + [1] * 4


def test_folder_of_hugging_face_parquet_and_arrow(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)

    def table(n: int) -> object:
        images = [
            {"bytes": _png(rng.integers(0, 256, (6, 6), dtype=np.uint8)), "path": None}
            for _ in range(n)
        ]
        return pa.table({"img": images, "label": rng.integers(0, 4, n).tolist()})

    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(table(12), tmp_path / "hub" / "data" / "train-00000-of-00001.parquet")
    pq.write_table(table(5), tmp_path / "hub" / "data" / "test-00000-of-00001.parquet")
    dataset = load_dataset(f"folder:{tmp_path / 'hub'}", seed=0)
    assert tuple(dataset.x_train.shape) == (12, 1, 6, 6) and len(dataset.y_test) == 5
    for split, n in (("train", 7), ("test", 3)):  # save_to_disk: split folders of .arrow
        (tmp_path / "disk" / split).mkdir(parents=True)
        t = table(n)
        path = str(tmp_path / "disk" / split / "data-00000-of-00001.arrow")
        with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, t.schema) as writer:
            writer.write_table(t)
    dataset = load_dataset(f"folder:{tmp_path / 'disk'}", seed=0)
    assert len(dataset.y_train) == 7 and len(dataset.y_test) == 3


def test_a_folder_with_nothing_readable_says_what_it_needs(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no \.parquet"):
        load_dataset(f"folder:{tmp_path}", seed=0)
    with pytest.raises(DataError, match=r"neither a \.npz file nor a folder"):
        load_dataset(f"folder:{tmp_path / 'nothing'}", seed=0)


def test_leaf_json_is_decoded_once_and_kept_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedcore.data import leaf
    from fedcore.data.cache import LEAF_CACHE

    folder = write_standin("femnist", tmp_path, samples=60, writers=6)
    first = load_dataset("femnist", seed=0, root=str(tmp_path))
    kept = list((folder / LEAF_CACHE).glob("femnist-*.npz"))
    assert len(kept) == 1

    def never(*_: object) -> None:
        raise AssertionError("decoded again")

    with monkeypatch.context() as m:
        m.setattr(leaf, "_leaf_decoded", never)
        again = load_dataset("femnist", seed=0, root=str(tmp_path))
    assert torch.equal(first.x_train, again.x_train) and first.writers == again.writers
    assert np.array_equal(first.groups_test, again.groups_test)
    # a changed file makes a new key (the old decoded file goes); a cut-short one is redone
    path = sorted((folder / "train").glob("*.json"))[0]
    blob = json.loads(path.read_text())
    user = blob["users"][0]
    blob["user_data"][user]["y"][0] = (blob["user_data"][user]["y"][0] + 1) % 62
    path.write_text(json.dumps(blob))
    changed = load_dataset("femnist", seed=0, root=str(tmp_path))
    assert not torch.equal(changed.y_train, first.y_train)
    (now,) = (folder / LEAF_CACHE).glob("femnist-*.npz")
    assert now != kept[0]
    now.write_bytes(now.read_bytes()[:100])
    assert torch.equal(load_dataset("femnist", seed=0, root=str(tmp_path)).y_train, changed.y_train)


def test_leaf_in_a_folder_that_cannot_be_written_is_decoded_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedcore.data import cache

    write_standin("shakespeare", tmp_path, samples=60, writers=6)

    def refuse(*_: object, **__: object) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(cache.tempfile, "NamedTemporaryFile", refuse)
    dataset = load_dataset("shakespeare", seed=0, root=str(tmp_path))
    assert len(dataset.writers) == 6


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["data.dataset=cifar10", "data.root=/mnt/data"], "at /mnt/data inside each peer"),
        (["data.dataset=femnist", "data.partition=natural"], "at $FEDCORE_DATA (else"),
        (["data.dataset=folder:/data/set.npz"], "at /data/set.npz inside each peer"),
    ],
)
def test_deployments_say_where_the_peers_read_the_files(
    overrides: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The peers read the files in their containers; nothing is loaded where it is written."""
    argv = ["compose", "--out", str(tmp_path / "d")]
    for item in overrides:
        argv += ["--set", item]
    status, out, err = cli(capsys, *argv)
    assert status == 0, err
    assert says in out and "mount" in out
    assert "must import your code" not in out


@pytest.mark.parametrize("hundred", [False, True])
def test_the_cifar_binary_release_reads(tmp_path: Path, hundred: bool) -> None:
    """A label byte (CIFAR-100: coarse then fine) before each image's 3,072 bytes."""
    rng = np.random.default_rng(0)
    folder = tmp_path / ("cifar-100-binary" if hundred else "cifar-10-batches-bin")
    folder.mkdir()
    files = (
        ["train.bin", "test.bin"]
        if hundred
        else [
            *(f"data_batch_{i}.bin" for i in range(1, 6)),
            "test_batch.bin",
        ]
    )
    expected: list[int] = []
    for name in files:
        labels = rng.integers(0, 100 if hundred else 10, 3)
        head = [labels // 5, labels] if hundred else [labels]
        rows = np.concatenate(
            [np.stack(head, axis=1), rng.integers(0, 256, (3, 3072))], axis=1
        ).astype(np.uint8)
        (folder / name).write_bytes(rows.tobytes())
        if "test" not in name:
            expected += labels.tolist()
    dataset = load_dataset("cifar100" if hundred else "cifar10", seed=0, root=str(tmp_path))
    assert dataset.y_train.tolist() == expected
    assert tuple(dataset.x_test.shape) == (3, 3, 32, 32)
