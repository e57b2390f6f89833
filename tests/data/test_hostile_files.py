"""Hostile dataset files (fedcore.data): every malformed file of every format the loaders
read (.npz, CIFAR's python and binary batches, idx files plain and gzipped, LEAF's JSON,
folders of images, Hugging Face parquet and arrow tables) is refused with one DataError
line naming the file; through the CLI as one stderr line and exit 2 before any peer
starts; the LEAF decode cache never follows a link out of the dataset's folder nor removes
a file it did not write; a very long writer id costs memory once, not once per writer."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.data import first_non_finite, images, load_dataset, own_test_parts
from fedcore.data.cache import LEAF_CACHE
from fedcore.data.files import MAX_CLASSES
from fedcore.data.images import MAX_IMAGE_PIXELS
from fedcore.data.standin import STANDINS, WRITERS, main, write_standin
from fedcore.errors import DataError
from tests.clitools import one_line_error

Case = tuple[str, str, Path]
"""What a mutation made: the data.dataset to load, the data.root, the file that is bad."""

Mutation = Callable[[Path, st.DataObject], Case]
MUTATIONS: dict[str, Mutation] = {}


def mutation(function: Mutation) -> Mutation:
    MUTATIONS[function.__name__] = function
    return function


@pytest.fixture
def fresh() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="hostile-")).resolve()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _fresh_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="hostile-")).resolve()


def _cut(data: st.DataObject, raw: bytes, keep: float = 1.0) -> bytes:
    """``raw`` cut short somewhere in its first ``keep`` part."""
    return raw[: data.draw(st.integers(0, max(0, int(len(raw) * keep) - 1)), label="cut")]


def _garbage(data: st.DataObject) -> bytes:
    return data.draw(st.binary(max_size=300), label="garbage")


def _outside(base: Path, name: str, content: bytes) -> Path:
    """A file outside every dataset folder (a link's target)."""
    (base / "elsewhere").mkdir(exist_ok=True)
    target = base / "elsewhere" / name
    target.write_bytes(content)
    return target


def _link_out(path: Path, base: Path) -> None:
    """Replace ``path`` by a link to a copy of itself outside the dataset's folder."""
    target = _outside(base, path.name, path.read_bytes())
    path.unlink()
    path.symlink_to(target)


# -- .npz ---------------------------------------------------------------------------------------


def _npz_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.normal(size=(6, 4)).astype(np.float32),
        "y_train": np.array([0, 1, 2, 0, 1, 2]),
        "x_test": rng.normal(size=(3, 4)).astype(np.float32),
        "y_test": np.array([0, 1, 2]),
    }


def _npz(base: Path, arrays: dict[str, np.ndarray]) -> Case:
    (base / "data").mkdir(exist_ok=True)
    path = base / "data" / "set.npz"
    with path.open("wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return f"folder:{path}", "", path


@mutation
def npz_object_array(base: Path, data: st.DataObject) -> Case:
    arrays: dict[str, Any] = _npz_arrays()
    key = data.draw(st.sampled_from(sorted(arrays)))
    arrays[key] = np.array([{"a": 1}] * len(arrays[key]), dtype=object)
    return _npz(base, arrays)


@mutation
def npz_strings(base: Path, data: st.DataObject) -> Case:
    arrays = _npz_arrays()
    key = data.draw(st.sampled_from(sorted(arrays)))
    text = data.draw(st.text(min_size=1, max_size=5))
    arrays[key] = np.full(arrays[key].shape, text)
    return _npz(base, arrays)


@mutation
def npz_non_finite(base: Path, data: st.DataObject) -> Case:
    arrays = _npz_arrays()
    key = data.draw(st.sampled_from(["x_train", "x_test"]))
    x = arrays[key].astype(np.float64)
    value = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e39]))
    x[data.draw(st.integers(0, len(x) - 1)), data.draw(st.integers(0, 3))] = value
    arrays[key] = x
    return _npz(base, arrays)


@mutation
def npz_labels(base: Path, data: st.DataObject) -> Case:
    arrays = _npz_arrays()
    key = data.draw(st.sampled_from(["y_train", "y_test"]))
    y = arrays[key].astype(np.float64 if data.draw(st.booleans()) else np.int64)
    bad = data.draw(st.sampled_from([-1, MAX_CLASSES, 2**40, 1.5]))
    if bad == 1.5:
        y = y.astype(np.float64)
    y[data.draw(st.integers(0, len(y) - 1))] = bad
    arrays[key] = y
    return _npz(base, arrays)


@mutation
def npz_shapes(base: Path, data: st.DataObject) -> Case:
    arrays = _npz_arrays()
    how = data.draw(st.sampled_from(["flat", "labels 2-d", "lengths", "test shape", "empty"]))
    if how == "flat":
        arrays["x_train"] = arrays["x_train"][:, 0]
    elif how == "labels 2-d":
        arrays["y_test"] = arrays["y_test"][:, None]
    elif how == "lengths":
        arrays["y_train"] = arrays["y_train"][:-1]
    elif how == "test shape":
        arrays["x_test"] = arrays["x_test"][:, :3]
    else:
        arrays["x_train"] = arrays["x_train"][:, :0]
    return _npz(base, arrays)


@mutation
def npz_missing_array(base: Path, data: st.DataObject) -> Case:
    arrays = _npz_arrays()
    del arrays[data.draw(st.sampled_from(sorted(arrays)))]
    return _npz(base, arrays)


@mutation
def npz_truncated(base: Path, data: st.DataObject) -> Case:
    case = _npz(base, _npz_arrays())
    case[2].write_bytes(_cut(data, case[2].read_bytes()))
    return case


@mutation
def npz_not_a_zip(base: Path, data: st.DataObject) -> Case:
    case = _npz(base, _npz_arrays())
    if data.draw(st.booleans()):
        case[2].write_bytes(_garbage(data))
    else:  # a .npy, or a pickle, under the .npz's name
        out = io.BytesIO()
        np.save(out, np.zeros(3))
        case[2].write_bytes(out.getvalue() if data.draw(st.booleans()) else pickle.dumps([1]))
    return case


@mutation
def npz_link_out(base: Path, data: st.DataObject) -> Case:
    case = _npz(base, _npz_arrays())
    _link_out(case[2], base)
    return case


# -- CIFAR ----------------------------------------------------------------------------------------

CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _cifar(base: Path, data: st.DataObject) -> tuple[Path, dict[str, Any]]:
    """Stand-in CIFAR-10 batches of two images; one drawn batch's path and contents."""
    folder = write_standin("cifar10", base, samples=10)
    path = folder / data.draw(st.sampled_from(CIFAR_FILES), label="batch")
    with path.open("rb") as f:
        batch = pickle.load(f)
    return path, batch


def _pickled(path: Path, value: object, data: st.DataObject) -> Case:
    path.write_bytes(pickle.dumps(value, protocol=data.draw(st.integers(2, 5))))
    return "cifar10", str(path.parents[1]), path


@mutation
def cifar_data(base: Path, data: st.DataObject) -> Case:
    path, batch = _cifar(base, data)
    n = len(batch["labels"])
    batch["data"] = data.draw(
        st.sampled_from(
            [
                np.zeros((n, 100), np.uint8),
                np.zeros((n, 3072), np.float32),
                np.zeros((n, 3, 32, 32), np.uint8),
                np.full((n, 3072), 300, np.int64),
                np.array([None] * n, dtype=object),
                [[0] * 3072] * n,
                "pixels",
            ]
        )
    )
    return _pickled(path, batch, data)


@mutation
def cifar_labels(base: Path, data: st.DataObject) -> Case:
    path, batch = _cifar(base, data)
    n = len(batch["labels"])
    batch["labels"] = data.draw(
        st.sampled_from(
            [
                ["cat"] * n,
                [10] * n,
                [-1] * n,
                [0] * (n + 1),
                [[0]] * n,
                [0.5] * n,
                np.full(n, 0.5),
                {"a": 1},
                [2**70] * n,
            ]
        )
    )
    return _pickled(path, batch, data)


@mutation
def cifar_not_a_batch(base: Path, data: st.DataObject) -> Case:
    path, batch = _cifar(base, data)
    value = data.draw(
        st.sampled_from([[batch], (1, 2), 7, {"data": batch["data"]}, {1: 2}, {"labels": {1, 2}}])
    )
    return _pickled(path, value, data)


class _Evil:
    def __init__(self, function: Any, argument: str) -> None:
        self.function, self.argument = function, argument

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (self.function, (self.argument,))


@mutation
def cifar_code(base: Path, data: st.DataObject) -> Case:
    path, batch = _cifar(base, data)
    marker = base / "pwned"
    function = data.draw(st.sampled_from([os.system, eval, print]))
    argument = f"touch {marker}" if function is os.system else f"open({str(marker)!r}, 'w')"
    batch["data"] = _Evil(function, argument)
    return _pickled(path, batch, data)


@mutation
def cifar_truncated(base: Path, data: st.DataObject) -> Case:
    path, _ = _cifar(base, data)
    path.write_bytes(_cut(data, path.read_bytes()))
    return "cifar10", str(base), path


@mutation
def cifar_garbage(base: Path, data: st.DataObject) -> Case:
    path, _ = _cifar(base, data)
    path.write_bytes(_garbage(data))
    return "cifar10", str(base), path


@mutation
def cifar_link_out(base: Path, data: st.DataObject) -> Case:
    path, _ = _cifar(base, data)
    _link_out(path, base)
    return "cifar10", str(base), path


def _cifar_binary(base: Path, data: st.DataObject) -> Path:
    folder = base / "cifar-10-batches-bin"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in CIFAR_FILES:
        rows = rng.integers(0, 256, (2, 3073)).astype(np.uint8)
        rows[:, 0] %= 10
        (folder / f"{name}.bin").write_bytes(rows.tobytes())
    return folder / f"{data.draw(st.sampled_from(CIFAR_FILES))}.bin"


@mutation
def cifar_binary_size(base: Path, data: st.DataObject) -> Case:
    path = _cifar_binary(base, data)
    size = data.draw(st.integers(0, 3 * 3073).filter(lambda s: s % 3073 != 0 or s == 0))
    path.write_bytes(bytes(size))
    return "cifar10", str(base), path


@mutation
def cifar_binary_label(base: Path, data: st.DataObject) -> Case:
    path = _cifar_binary(base, data)
    raw = bytearray(path.read_bytes())
    raw[3073 * data.draw(st.integers(0, 1))] = data.draw(st.integers(10, 255))
    path.write_bytes(bytes(raw))
    return "cifar10", str(base), path


# -- idx (Fashion-MNIST) --------------------------------------------------------------------------


def _idx(base: Path, data: st.DataObject) -> tuple[Path, bytes, bool]:
    """Stand-in Fashion-MNIST, plain or gzipped; one drawn file and its raw bytes."""
    compress = data.draw(st.booleans(), label="gzipped")
    folder = write_standin("fashion-mnist", base, samples=8, compress=compress)
    path = data.draw(st.sampled_from(sorted(folder.iterdir())), label="file")
    raw = path.read_bytes()
    return path, gzip.decompress(raw) if compress else raw, compress


def _idx_write(path: Path, raw: bytes, compress: bool) -> Case:
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return "fashion-mnist", str(path.parents[2]), path


@mutation
def idx_truncated(base: Path, data: st.DataObject) -> Case:
    path, raw, compress = _idx(base, data)
    if compress and data.draw(st.booleans()):  # the gzip stream itself cut short
        path.write_bytes(_cut(data, path.read_bytes()))
        return "fashion-mnist", str(base), path
    return _idx_write(path, _cut(data, raw), compress)


@mutation
def idx_garbage(base: Path, data: st.DataObject) -> Case:
    path, _, _ = _idx(base, data)
    path.write_bytes(_garbage(data))
    return "fashion-mnist", str(base), path


@mutation
def idx_header(base: Path, data: st.DataObject) -> Case:
    path, raw, compress = _idx(base, data)
    head = bytearray(raw)
    where = data.draw(st.sampled_from(["type", "ndim", "dimension", "huge"]))
    if where == "type":
        head[2] = data.draw(st.sampled_from([0x00, 0x0A, 0xFF]))
    elif where == "ndim":
        head[3] = data.draw(st.sampled_from([0, 2, 4, 200]).filter(lambda d: d != raw[3]))
    elif where == "dimension":
        head[4:8] = struct.pack(">I", data.draw(st.integers(0, 1000).filter(lambda n: n != 8)))
    else:  # claims gigabytes: refused before anything is read
        head[4 : 4 + 4 * raw[3]] = struct.pack(">I", 60000) * raw[3]
    return _idx_write(path, bytes(head), compress)


@mutation
def idx_labels(base: Path, data: st.DataObject) -> Case:
    path, raw, compress = _idx(base, data)
    labels = path.parent / path.name.replace("images-idx3", "labels-idx1")
    raw = gzip.decompress(labels.read_bytes()) if compress else labels.read_bytes()
    body = bytearray(raw)
    body[8 + data.draw(st.integers(0, len(raw) - 9))] = data.draw(st.integers(10, 255))
    return _idx_write(labels, bytes(body), compress)


# -- LEAF JSON ------------------------------------------------------------------------------------


def _leaf(base: Path, data: st.DataObject) -> tuple[str, Path, dict[str, Any], str]:
    """Stand-in FEMNIST or Shakespeare of three writers; one drawn file, its JSON and one of
    its writers."""
    name = data.draw(st.sampled_from(["femnist", "shakespeare"]), label="dataset")
    folder = write_standin(name, base, samples=24, writers=3)
    split = data.draw(st.sampled_from(["train", "test"]), label="split")
    (path,) = sorted((folder / split).glob("*.json"))
    blob = json.loads(path.read_text())
    user = data.draw(st.sampled_from(sorted(blob["user_data"])), label="writer")
    return name, path, blob, user


def _leaf_write(name: str, path: Path, blob: object, base: Path) -> Case:
    path.write_text(json.dumps(blob))
    return name, str(base), path


@mutation
def leaf_user_data(base: Path, data: st.DataObject) -> Case:
    name, path, blob, _ = _leaf(base, data)
    how = data.draw(st.sampled_from(["list", "missing", "top list", "top number", "writer"]))
    if how == "list":
        blob["user_data"] = list(blob["user_data"].values())
    elif how == "missing":
        del blob["user_data"]
    elif how == "top list":
        blob = [blob]
    elif how == "top number":
        blob = 3
    else:
        blob["user_data"][sorted(blob["user_data"])[0]] = [1, 2]
    return _leaf_write(name, path, blob, base)


@mutation
def leaf_x_or_y(base: Path, data: st.DataObject) -> Case:
    name, path, blob, user = _leaf(base, data)
    entry = blob["user_data"][user]
    how = data.draw(st.sampled_from(["no y", "no x", "y null", "x string", "lengths"]))
    if how == "no y":
        del entry["y"]
    elif how == "no x":
        del entry["x"]
    elif how == "y null":
        entry["y"] = None
    elif how == "x string":
        entry["x"] = "abc"
    else:
        entry["y"] = entry["y"] + entry["y"][:1]
    return _leaf_write(name, path, blob, base)


@mutation
def leaf_examples(base: Path, data: st.DataObject) -> Case:
    """Ragged rows, strings for pixels, a line of the wrong length, a number for a line."""
    name, path, blob, user = _leaf(base, data)
    entry = blob["user_data"][user]
    i = data.draw(st.integers(0, len(entry["x"]) - 1))
    if name == "femnist":
        how = data.draw(st.sampled_from(["short", "long", "pixel", "row string", "nested"]))
        if how == "short":
            entry["x"][i] = entry["x"][i][:-1]
        elif how == "long":
            entry["x"][i] = entry["x"][i] + [0.5]
        elif how == "pixel":
            bad = data.draw(st.sampled_from(["0.5", "x" * 1000, None, [], {}]))
            entry["x"][i][data.draw(st.integers(0, 783))] = bad
        elif how == "row string":
            entry["x"][i] = "0" * 784
        else:
            entry["x"][i] = [entry["x"][i]]
    else:
        entry["x"][i] = data.draw(
            st.sampled_from([entry["x"][i][:-1], entry["x"][i] + "a", 7, None, ["a"] * 80])
        )
    return _leaf_write(name, path, blob, base)


@mutation
def leaf_labels(base: Path, data: st.DataObject) -> Case:
    name, path, blob, user = _leaf(base, data)
    entry = blob["user_data"][user]
    i = data.draw(st.integers(0, len(entry["y"]) - 1))
    if name == "femnist":
        bad = data.draw(st.sampled_from(["3", 62, -1, 1.5, None, [1], 2**70]))
    else:
        bad = data.draw(st.sampled_from([5, "ab", "", None, ["a"]]))
    entry["y"][i] = bad
    return _leaf_write(name, path, blob, base)


@mutation
def leaf_non_finite(base: Path, data: st.DataObject) -> Case:
    name, path, blob, user = _leaf(base, data)
    if name == "shakespeare":  # its features are characters: a label out of the vocabulary
        blob["user_data"][user]["y"][0] = "\u00e9\u00e9"
        return _leaf_write(name, path, blob, base)
    entry = blob["user_data"][user]
    entry["x"][0][data.draw(st.integers(0, 783))] = 123456.5  # a marker in the text
    text = json.dumps(blob)
    bad = data.draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e39"]))
    path.write_text(text.replace("123456.5", bad, 1))
    return name, str(base), path


@mutation
def leaf_bytes(base: Path, data: st.DataObject) -> Case:
    name, path, _, _ = _leaf(base, data)
    if data.draw(st.booleans()):
        path.write_bytes(_cut(data, path.read_bytes()))
    else:
        path.write_bytes(_garbage(data))
    return name, str(base), path


@mutation
def leaf_link_out(base: Path, data: st.DataObject) -> Case:
    name, path, _, _ = _leaf(base, data)
    _link_out(path, base)
    return name, str(base), path


# -- folders of images ----------------------------------------------------------------------------


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG of a few dozen bytes whose header claims ``width`` x ``height`` gray pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _chunk(b"IEND", b"")
    )


def _image_folder(base: Path) -> tuple[str, list[Path]]:
    """``train/`` and ``test/`` folders of two class folders of two 4x4 PNGs each."""
    rng = np.random.default_rng(0)
    folder = base / "images"
    files = []
    for split in ("train", "test"):
        for cls in ("cat", "dog"):
            (folder / split / cls).mkdir(parents=True)
            for i in range(2):
                path = folder / split / cls / f"{i}.png"
                path.write_bytes(_png(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)))
                files.append(path)
    return f"folder:{folder}", files


def _images(base: Path, data: st.DataObject) -> tuple[Case, Path]:
    spec, files = _image_folder(base)
    path = data.draw(st.sampled_from(files), label="image")
    return (spec, "", path), path


@mutation
def image_bytes(base: Path, data: st.DataObject) -> Case:
    case, path = _images(base, data)
    if data.draw(st.booleans()):
        path.write_bytes(_cut(data, path.read_bytes(), keep=0.7))
    else:
        path.write_bytes(b"\x89PNG\r\n\x1a\n" * data.draw(st.integers(0, 1)) + _garbage(data))
    return case


@mutation
def image_bomb(base: Path, data: st.DataObject) -> Case:
    case, path = _images(base, data)
    side = data.draw(st.sampled_from([30000, 5000, 4097]))
    path.write_bytes(png_claiming(side, side))
    return case


@mutation
def image_other_size(base: Path, data: st.DataObject) -> Case:
    case, path = _images(base, data)
    shape = data.draw(st.sampled_from([(5, 4, 3), (4, 4), (4, 4, 4)]))
    path.write_bytes(_png(np.zeros(shape, dtype=np.uint8)))
    return case


@mutation
def image_link_out(base: Path, data: st.DataObject) -> Case:
    case, path = _images(base, data)
    _link_out(path, base)
    return case


# -- Hugging Face tables --------------------------------------------------------------------------


def _tables(base: Path, data: st.DataObject, columns: dict[str, Any] | None = None) -> Case:
    """A train and a test table (parquet or arrow); ``columns`` replaces the drawn one's."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder = base / "hub"
    (folder / "data").mkdir(parents=True)
    fmt = data.draw(st.sampled_from(["parquet", "arrow"]), label="format")
    bad_split = data.draw(st.sampled_from(["train", "test"]), label="split")
    bad = folder / "data" / f"{bad_split}-00000.{fmt}"
    for split in ("train", "test"):
        table = pa.table(
            columns
            if columns is not None and split == bad_split
            else {"x": [[0.5, 1.0, 2.0]] * 3, "label": [0, 1, 2]}
        )
        path = folder / "data" / f"{split}-00000.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path)
        else:
            with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
                w.write_table(table)
    return f"folder:{folder}", "", bad


@mutation
def table_bytes(base: Path, data: st.DataObject) -> Case:
    case = _tables(base, data)
    raw = case[2].read_bytes()
    case[2].write_bytes(_cut(data, raw, keep=0.5) if data.draw(st.booleans()) else _garbage(data))
    return case


@mutation
def table_labels(base: Path, data: st.DataObject) -> Case:
    labels = data.draw(
        st.sampled_from(
            [["a", "b", "c"], [0.5, 1.0, 2.0], [0, None, 1], [-1, 0, 1], [0, 1, MAX_CLASSES]]
        )
    )
    return _tables(base, data, {"x": [[0.5, 1.0, 2.0]] * 3, "label": labels})


@mutation
def table_features(base: Path, data: st.DataObject) -> Case:
    x = data.draw(
        st.sampled_from(
            [
                ["a", "b", "c"],
                [[0.5, 1.0], [0.5], [1.0, 2.0]],
                [[0.5, 1.0, 2.0], None, [0.5, 1.0, 2.0]],
                [[0.5, float("nan"), 2.0]] * 3,
                [[0.5, None, 2.0]] * 3,
                [[0.5, 1.0]] * 3,
            ]
        )
    )
    return _tables(base, data, {"x": x, "label": [0, 1, 2]})


@mutation
def table_images(base: Path, data: st.DataObject) -> Case:
    good = _png(np.zeros((4, 4), dtype=np.uint8))
    bad = data.draw(
        st.sampled_from([b"", b"not an image", good[:30], png_claiming(30000, 30000), None])
    )
    cells = [{"bytes": good, "path": None}, {"bytes": bad, "path": "x.png"}]
    return _tables(base, data, {"image": cells, "label": [0, 1]})


@mutation
def table_columns(base: Path, data: st.DataObject) -> Case:
    columns = data.draw(
        st.sampled_from([{"x": [[1.0]], "y": [0]}, {"pixels_": [[1.0]], "label": [0]}])
    )
    return _tables(base, data, columns)


# -- the fuzz test ------------------------------------------------------------------------------


def assert_names_the_file(error: DataError, bad: Path) -> str:
    """One line, naming the file (never a doubled quote from a quoted name's possessive)."""
    text = str(error)
    assert text and len(text.splitlines()) == 1 and "\r" not in text, text
    assert str(bad) in text, (str(bad), text)
    assert "''s" not in text, text
    return text


@pytest.mark.parametrize("name", sorted(MUTATIONS))
@settings(max_examples=6)
@given(data=st.data())
def test_every_malformed_file_is_one_line_naming_it(name: str, data: st.DataObject) -> None:
    base = _fresh_dir()
    try:
        spec, root, bad = MUTATIONS[name](base, data)
        with pytest.raises(DataError) as caught:
            load_dataset(spec, seed=0, root=root)
        assert_names_the_file(caught.value, bad)
        assert not (base / "pwned").exists()  # a crafted pickle ran no code
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_fuzzed_formats_cover_every_loader() -> None:
    """Each format the loaders read has its malformed files above."""
    prefixes = {n.split("_")[0] for n in MUTATIONS}
    assert prefixes == {"npz", "cifar", "idx", "leaf", "image", "table"}
    assert len(MUTATIONS) >= 30


# -- through the CLI, before any peer -------------------------------------------------------------


def _nan_npz(folder: Path) -> Path:
    arrays = _npz_arrays()
    arrays["x_train"][2, 1] = np.nan
    path = folder / "nan.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize("command", ["simulate", "launch"])
def test_a_bad_file_stops_the_cli_in_one_line_before_any_peer(
    command: str, fresh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN feature is the file's fault, said before a peer starts (it was once a peer's
    rejected message); `fedcore launch` starts no process and writes no run folder."""
    bad = _nan_npz(fresh)
    out = fresh / "run"
    argv = [command, "--set", f"data.dataset=folder:{bad}", "--set", "topology.nodes=2"]
    line = one_line_error(capsys, [*argv, "--out", str(out)], str(bad), "NaN")
    assert "peer" not in line and "rejected" not in line
    assert not out.exists()


def test_a_bad_file_through_the_console_entry_is_one_line_and_exit_2(fresh: Path) -> None:
    """A CIFAR batch of the wrong shape (once a traceback of NumPy's reshape, exit 1)."""
    (fresh / "cifar-10-batches-py").mkdir()
    for name in CIFAR_FILES:
        batch = {"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}
        (fresh / "cifar-10-batches-py" / name).write_bytes(pickle.dumps(batch))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "fedcore", "simulate", "--set", "data.dataset=cifar10"),
            *("--set", f"data.root={fresh}", "--out", str(fresh / "run")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedcore: error:"), done.stderr
    assert str(fresh / "cifar-10-batches-py" / "data_batch_1") in lines[0]


def test_read_errors_name_the_file_not_cannot_write(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image that cannot be read is a data error naming it (the CLI once said 'cannot
    write' for any OSError); the same for a JSON file."""
    from PIL import Image

    spec, files = _image_folder(fresh)
    path = files[0]
    real_open = Image.open

    def denied(source: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(str(source)) == path:
            raise PermissionError(13, "Permission denied", str(source))
        return real_open(source, *args, **kwargs)

    monkeypatch.setattr(Image, "open", denied)
    with pytest.raises(DataError, match=r"cannot read .*Permission denied") as caught:
        load_dataset(spec, seed=0)
    assert_names_the_file(caught.value, path)
    line = one_line_error(
        capsys, ["simulate", "--set", f"data.dataset={spec}", "--out", str(fresh / "r")]
    )
    assert str(path) in line and "cannot write" not in line


# -- the decode cache -----------------------------------------------------------------------------


def _listing(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        p.name: (p.lstat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in sorted(folder.iterdir())
    }


def test_the_decode_cache_never_follows_a_link_out(fresh: Path) -> None:
    """A cache folder linked elsewhere is neither read nor written: the files there, one
    named as a decoded file, stay as they were."""
    folder = write_standin("femnist", fresh / "root", samples=30, writers=3)
    elsewhere = fresh / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"femnist-{'0' * 20}.npz").write_bytes(b"someone else's file")
    (elsewhere / "notes.txt").write_text("keep me")
    before = _listing(elsewhere)
    (folder / LEAF_CACHE).symlink_to(elsewhere, target_is_directory=True)
    for _ in range(2):
        dataset = load_dataset("femnist", seed=0, root=str(fresh / "root"))
        assert len(dataset.writers) == 3
    assert _listing(elsewhere) == before


def test_the_decode_cache_removes_only_files_it_wrote(fresh: Path) -> None:
    """In a real cache folder: an earlier decoded file goes; a link named as one, the file
    it points to, and a file of the same name pattern that fedcore did not write stay."""
    root = fresh / "root"
    folder = write_standin("femnist", root, samples=30, writers=3)
    load_dataset("femnist", seed=0, root=str(root))
    cache = folder / LEAF_CACHE
    (ours,) = cache.glob("femnist-*.npz")
    victim = _outside(fresh, "victim.npz", b"not fedcore's")
    link = cache / f"femnist-{'a' * 20}.npz"
    link.symlink_to(victim)
    foreign = cache / f"femnist-{'b' * 20}.npz"
    with foreign.open("wb") as f:
        np.savez(f, mine=np.zeros(2))
    path = sorted((folder / "train").glob("*.json"))[0]
    path.write_text(path.read_text() + " ")  # a new key: the decoded file is written again
    load_dataset("femnist", seed=0, root=str(root))
    assert not ours.exists()
    assert link.is_symlink() and victim.read_bytes() == b"not fedcore's"
    assert foreign.is_file()
    (now,) = [p for p in cache.glob("femnist-*.npz") if p not in (link, foreign)]
    with now.open("wb") as f:  # another's file at the very name fedcore would write
        np.savez(f, mine=np.ones(3))
    kept = now.read_bytes()
    assert len(load_dataset("femnist", seed=0, root=str(root)).writers) == 3
    assert now.read_bytes() == kept


def test_a_cached_file_that_is_a_link_is_not_read(fresh: Path) -> None:
    root = fresh / "root"
    folder = write_standin("femnist", root, samples=30, writers=3)
    first = load_dataset("femnist", seed=0, root=str(root))
    (cached,) = (folder / LEAF_CACHE).glob("femnist-*.npz")
    target = fresh / "crafted.npz"
    arrays = dict(np.load(cached))
    arrays["y_train"] = np.zeros_like(arrays["y_train"])
    with target.open("wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    cached.unlink()
    cached.symlink_to(target)
    again = load_dataset("femnist", seed=0, root=str(root))
    assert again.y_train.tolist() == first.y_train.tolist() != arrays["y_train"].tolist()


# -- long writer ids, standing in ----------------------------------------------------------------


def test_a_very_long_writer_id_costs_its_length_once(fresh: Path) -> None:
    """One writer id of 4 MB among 40 writers: decoded and cached within tens of MB (a
    fixed-width string array of the writers took 4 MB x 4 bytes x 41 = 656 MB)."""
    root = fresh / "root"
    folder = write_standin("femnist", root, samples=200, writers=40)
    long_id = "w" * (4 * 2**20)
    for split in ("train", "test"):
        path = sorted((folder / split).glob("*.json"))[0]
        blob = json.loads(path.read_text())
        first = blob["users"][0]
        blob["user_data"][long_id] = blob["user_data"].pop(first)
        blob["users"][0] = long_id
        path.write_text(json.dumps(blob))
    tracemalloc.start()
    try:
        dataset = load_dataset("femnist", seed=0, root=str(root))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert long_id in dataset.writers and len(dataset.writers) == 40
    assert peak < 64 * 2**20, peak
    (cached,) = (folder / LEAF_CACHE).glob("femnist-*.npz")
    with np.load(cached) as blob:
        assert blob["writers"].nbytes < len(long_id) + 40 * 100
    again = load_dataset("femnist", seed=0, root=str(root))  # read back from the cache
    assert again.writers == dataset.writers


def test_the_standin_defaults_fit_the_femnist_example(fresh: Path) -> None:
    """examples/femnist-fedavg.toml: 16 workers, a natural partition, each worker its own
    test examples: the default stand-in has the writers for it and a test example each."""
    assert main(["femnist", "shakespeare", "--root", str(fresh)]) == 0
    for name in ("femnist", "shakespeare"):
        dataset = load_dataset(name, seed=0, root=str(fresh))
        assert len(dataset.writers) == WRITERS >= 16
        assert dataset.groups_train is not None and dataset.groups_test is not None
        assert set(dataset.groups_test.tolist()) == set(range(WRITERS))
        parts = own_test_parts(dataset.groups_train, dataset.groups_test, 16, seed=0)
        assert parts is not None and all(len(p) for p in parts)


def test_the_standin_help_lists_the_datasets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in STANDINS:
        assert name in text


def test_more_writers_still_give_each_a_test_example(fresh: Path) -> None:
    """With as few examples as the writers allow, none is left without a test example (one
    was refused by the loader, with a doubled quote in its message)."""
    write_standin("femnist", fresh, samples=5 * 40, writers=40)
    dataset = load_dataset("femnist", seed=0, root=str(fresh))
    assert dataset.groups_test is not None
    assert set(dataset.groups_test.tolist()) == set(range(40))


def test_a_writer_without_test_examples_is_loaded(fresh: Path) -> None:
    """A writer may have no example in one split (LEAF writes empty lists)."""
    folder = write_standin("femnist", fresh, samples=30, writers=3)
    path = sorted((folder / "test").glob("*.json"))[0]
    blob = json.loads(path.read_text())
    blob["user_data"][blob["users"][0]] = {"x": [], "y": []}
    path.write_text(json.dumps(blob))
    dataset = load_dataset("femnist", seed=0, root=str(fresh))
    assert len(dataset.writers) == 3


def test_first_non_finite_finds_the_example() -> None:
    x = np.zeros((10_000, 3), dtype=np.float32)
    assert first_non_finite(x) is None
    x[7777, 2] = np.inf
    assert first_non_finite(x) == 7777
    import torch

    assert first_non_finite(torch.from_numpy(x)) == 7777
    assert first_non_finite(np.zeros((3, 2), dtype=np.int64)) is None


def test_an_image_within_the_pixel_limit_reads(fresh: Path) -> None:
    """The limit refuses a claimed size, not an ordinary image (nor one of exactly the
    limit's side)."""
    side = int(MAX_IMAGE_PIXELS**0.5)
    assert side * side == MAX_IMAGE_PIXELS
    pixels = images._decode_image(_png(np.zeros((64, 64), np.uint8)), "x")
    assert pixels.shape == (64, 64)
