"""Data poisoning: the Byzantine peers' training labels flipped (``attack = "labelflip"``).

Each Byzantine peer trains on its own examples with each label ``y`` read as
``C - 1 - y`` (``C`` classes), and sends what it honestly computes from them. Its
examples are copied once, flipped, to the end of the training split, and its part points
at the copies, so every engine (and every real peer, which prepares the same split) reads
the poisoned examples through the path it reads any peer's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch

from fedcore.data.types import Dataset

__all__ = ["flip_labels"]


def flip_labels(
    dataset: Dataset, parts: Sequence[Any], nodes: Sequence[str], liars: Collection[str]
) -> tuple[Dataset, list[Any]]:
    """``(dataset, parts)`` with the parts of ``liars`` (``parts[i]`` is ``nodes[i]``'s
    example indices) pointing at flipped copies of their examples."""
    at = [i for i, v in enumerate(nodes) if v in liars and i < len(parts)]
    if not at:
        return dataset, list(parts)
    picked = [np.asarray(parts[i], dtype=np.int64) for i in at]
    idx = torch.from_numpy(np.concatenate(picked))
    base = int(dataset.x_train.shape[0])
    x = torch.cat([dataset.x_train, dataset.x_train[idx]])
    y = torch.cat([dataset.y_train, dataset.num_classes - 1 - dataset.y_train[idx]])
    groups = dataset.groups_train
    if groups is not None:
        groups = np.concatenate([groups, groups[idx.numpy()]])
    out = list(parts)
    start = base
    for i, p in zip(at, picked, strict=True):
        out[i] = np.arange(start, start + p.size, dtype=np.int64)
        start += p.size
    return dataclasses.replace(dataset, x_train=x, y_train=y, groups_train=groups), out
