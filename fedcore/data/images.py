"""Images of ``folder:PATH`` datasets: a folder of ``train/`` and ``test/`` class folders of
image files, and the image cells of Hugging Face tables (:mod:`fedcore.data.tables`).

An image whose header claims more than :data:`MAX_IMAGE_PIXELS` pixels is refused before it
is decoded.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np

from fedcore.data.files import _at, _data_file, _finish, _listing, _reason
from fedcore.data.types import Dataset
from fedcore.errors import DataError, FedcoreError

__all__ = ["MAX_IMAGE_PIXELS"]

MAX_IMAGE_PIXELS = 4096 * 4096
"""Most pixels of one image fedcore decodes (an image of a folder of images, or a table's
image cell). A few hundred bytes of PNG can claim 30000x30000 pixels, gigabytes once
decoded: an image whose header claims more than this is refused before it is decoded."""


def _decode_image(source: Path | bytes, where: str) -> np.ndarray:
    """The pixels of an image file or of an image's bytes: its header's size checked against
    :data:`MAX_IMAGE_PIXELS` before any pixel is decoded.

    Raises:
        DataError: naming ``where``: not an image, cut short, or too many pixels.
    """
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
            with opened as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise DataError(
                        f"{where} is an image of {width}x{height} pixels; fedcore decodes "
                        f"images of at most {MAX_IMAGE_PIXELS} pixels (a decompression "
                        "bomb, or an image to make smaller)."
                    )
                return np.asarray(image)
    except FedcoreError:
        raise
    except Image.DecompressionBombError:
        raise DataError(
            f"{where} claims an image of more pixels than Pillow decodes (a decompression "
            f"bomb?); fedcore decodes images of at most {MAX_IMAGE_PIXELS} pixels."
        ) from None
    except MemoryError:
        raise DataError(f"{where}: decoding the image ran out of memory.") from None
    except OSError as exc:
        if exc.errno is not None:
            raise DataError(f"cannot read {where}: {exc.strerror or exc}.") from None
        raise DataError(f"{where} is not an image fedcore can read: {_reason(exc)}.") from None
    except Exception as exc:  # a hostile image can make Pillow raise anything
        raise DataError(f"{where} is not an image fedcore can read: {_reason(exc)}.") from None


def _stacked(xs: list[np.ndarray], wheres: list[str], folder: str) -> np.ndarray:
    """Images of one size stacked (the first of another size refused by name)."""
    first = xs[0].shape, xs[0].dtype
    for x, where in zip(xs, wheres, strict=True):
        if (x.shape, x.dtype) != first:
            raise DataError(
                f"the images of {folder} differ: {where} is {x.shape} {x.dtype}, "
                f"{wheres[0]} {first[0]} {first[1]}; make them one size and mode."
            )
    return np.stack(xs)


def _image_folders(name: str, where: Path) -> Dataset:
    """``train/`` and ``test/`` folders of class folders of image files."""
    classes = [p.name for p in _listing(where / "train") if p.is_dir()]
    if not classes:
        raise DataError(f"data.dataset {name!r}: {_at(where / 'train')} has no class folders.")
    arrays = {}
    for split in ("train", "test"):
        xs, ys, wheres = [], [], []
        for label, cls in enumerate(classes):
            for path in _listing(where / split / cls):
                if path.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp", ".gif"):
                    real = _data_file(path, where)
                    xs.append(_decode_image(real, _at(path)))
                    ys.append(label)
                    wheres.append(_at(path))
        if not xs:
            raise DataError(f"data.dataset {name!r}: {_at(where / split)} holds no images.")
        arrays[split] = (
            _stacked(xs, wheres, _at(where / split)),
            np.asarray(ys, dtype=np.int64),
        )
    return _finish(name, arrays["train"], arrays["test"], _at(where))
