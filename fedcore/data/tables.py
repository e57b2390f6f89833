"""Hugging Face ``datasets`` folders of ``.parquet`` or ``.arrow`` files (``folder:PATH``):
each file read and checked on its own (errors name the file), then joined per split. Needs
pyarrow (``pip install "fedcore[datasets]"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedcore.data.files import (
    MAX_CLASSES,
    _at,
    _data_file,
    _features,
    _finish,
    _int_labels,
    _reading,
)
from fedcore.data.images import _decode_image, _stacked
from fedcore.data.types import Dataset
from fedcore.errors import DataError
from fedcore.ids import clip

__all__: list[str] = []


def _tables(name: str, where: Path, files: list[Path]) -> Dataset:
    """The ``.parquet`` or ``.arrow`` files of ``where``, each read and checked on its own
    (errors name the file), then joined per split."""
    try:
        import pyarrow  # noqa: F401 - only to say what is missing
    except ImportError:
        raise DataError(
            f"data.dataset {name!r} holds .parquet/.arrow files, which need pyarrow: "
            "pip install 'fedcore[datasets]'."
        ) from None
    splits: dict[str, list[tuple[np.ndarray, np.ndarray, str]]] = {"train": [], "test": []}
    empty: dict[str, list[str]] = {"train": [], "test": []}
    for path in files:
        split = next((s for s in splits if s in path.relative_to(where).as_posix()), None)
        if split is None:
            continue
        real = _data_file(path, where)
        part = _table_arrays(_read_table(path, real), _at(path))
        if part is None:
            empty[split].append(_at(path))
        else:
            splits[split].append(part)
    for split, parts in splits.items():
        if not parts:
            held = f" ({', '.join(empty[split][:3])} hold no rows)" if empty[split] else ""
            raise DataError(
                f"data.dataset {name!r}: found no {split} examples{held}; a file's name or "
                "folder must say train or test."
            )
    first = splits["train"][0]
    for x, _, where_x in splits["train"] + splits["test"]:
        if x.shape[1:] != first[0].shape[1:]:
            raise DataError(
                f"{where_x} holds examples of shape {x.shape[1:]}, {first[2]} of "
                f"{first[0].shape[1:]}; the files of a dataset must have one shape."
            )
    arrays = {
        split: (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        for split, parts in splits.items()
    }
    return _finish(name, arrays["train"], arrays["test"], _at(where))


def _read_table(path: Path, real: Path) -> Any:
    """A ``.parquet`` file, or an ``.arrow`` file of Arrow's stream or file format."""
    import pyarrow.ipc
    import pyarrow.parquet

    with _reading(path, "a table (.parquet or .arrow)"):
        if path.suffix == ".parquet":
            return pyarrow.parquet.read_table(real)
        with real.open("rb") as f:
            try:
                return pyarrow.ipc.open_stream(f).read_all()
            except pyarrow.ArrowInvalid:
                f.seek(0)
                return pyarrow.ipc.open_file(f).read_all()


def _numeric_type(kind: Any) -> bool:
    """Whether an Arrow type is numbers, or lists (of lists ...) of numbers."""
    import pyarrow as pa

    while (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ):
        kind = kind.value_type
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))


def _table_arrays(table: Any, where: str) -> tuple[np.ndarray, np.ndarray, str] | None:
    """One table's features and labels, checked (None for a table of no rows)."""
    import pyarrow as pa

    columns = table.column_names
    label = next((c for c in ("label", "labels", "fine_label") if c in columns), None)
    feature = next((c for c in ("image", "img", "pixels", "x") if c in columns), None)
    if label is None or feature is None:
        shown = ", ".join(clip(c, 30) for c in columns[:8])
        raise DataError(
            f"{where} has columns {shown}; a dataset table needs a label column (label, "
            "labels or fine_label) and an image column (image, img, pixels or x)."
        )
    if not table.num_rows:
        return None
    label_type = table.schema.field(label).type
    if not pa.types.is_integer(label_type):
        raise DataError(
            f"the {label!r} column of {where} holds {label_type}, not integer class labels."
        )
    labels = table.column(label)
    if labels.null_count:
        raise DataError(f"the {label!r} column of {where} has empty cells.")
    y = _int_labels(np.asarray(labels.to_numpy()), f"the {label!r} column of {where}", MAX_CLASSES)
    kind = table.schema.field(feature).type
    cells = table.column(feature)
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0)
    ):
        images = []
        for i, cell in enumerate(cells.to_pylist()):
            data = cell.get("bytes") if isinstance(cell, dict) else cell
            if not isinstance(data, bytes):
                raise DataError(
                    f"row {i} of {where} holds no image bytes (a path alone is not read)."
                )
            images.append(_decode_image(data, f"the image of row {i} of {where}"))
        x = _stacked(images, [f"row {i}" for i in range(len(images))], where)
    elif _numeric_type(kind):
        if cells.null_count:
            raise DataError(f"the {feature!r} column of {where} has empty cells.")
        try:
            x = np.asarray(cells.to_pylist(), dtype=np.float32)
        except (ValueError, TypeError):
            raise DataError(
                f"the {feature!r} column of {where} holds rows of different lengths (or empty "
                "values); every example must have one shape."
            ) from None
    else:
        raise DataError(f"the {feature!r} column of {where} holds {kind}, not images or numbers.")
    return _features(x, f"the {feature!r} column of {where}"), y, where
