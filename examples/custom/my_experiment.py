"""A user's own model and dataset, plugged into fedcore by import path.

Run from the repository root (so that ``examples`` is importable)::

    fedcore simulate examples/custom.toml

``make_dataset`` returns a :class:`fedcore.data.Dataset`; ``make_model`` returns any
``nn.Module`` mapping a batch of inputs to class logits.
"""

from __future__ import annotations

import torch
from torch import nn

from fedcore.data import Dataset


def make_dataset(*, seed: int, test_fraction: float) -> Dataset:
    """Two noisy Gaussian blobs per class in 2-D, four classes (generated, no download)."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])
    y = torch.randint(0, 4, (2000,), generator=gen)
    x = centers[y] + torch.randn(2000, 2, generator=gen)
    n_test = int(len(y) * test_fraction)
    return Dataset(
        name="blobs",
        x_train=x[n_test:],
        y_train=y[n_test:],
        x_test=x[:n_test],
        y_test=y[:n_test],
        num_classes=4,
    )


def make_model(*, input_dim: int, num_classes: int, width: int = 16) -> nn.Module:
    """A tiny tanh network."""
    return nn.Sequential(nn.Linear(input_dim, width), nn.Tanh(), nn.Linear(width, num_classes))
