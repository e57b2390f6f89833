"""The models the field publishes on, as built-in ``model.name`` factories.

* ``resnet20``: ResNet-20 for 32x32x3 images (He et al., CVPR 2016), ``model.norm``
  ``"group"`` (default), ``"batch"`` or ``"none"``;
* ``femnist-cnn``: LEAF's FEMNIST CNN on 1x28x28 images;
* ``char-lstm``: LEAF's Shakespeare next-character LSTM on int64 character indices;
* ``cnn32``: a small CNN for 32x32x3 images.

Each is a fixed architecture that checks the input size it is given (``input_dim``, the
flattened size) and says in one line what it takes; an image model takes its examples flat
or image-shaped. Their parameter counts are in the models table of
``docs/datasets-and-models.md``, which ``tests/test_registry.py`` holds to
:func:`fedcore.models.parameter_count`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from fedcore.config import NORMS
from fedcore.errors import DataError
from fedcore.registry import did_you_mean

__all__ = ["VOCABULARY", "CharLSTM", "ResNet20", "char_lstm", "cnn32", "femnist_cnn", "resnet20"]


def _image_shape(name: str, input_dim: int, shape: tuple[int, int, int]) -> None:
    """Refuse inputs of another size than ``shape`` (channels, height, width), in one line."""
    c, h, w = shape
    if input_dim != c * h * w:
        raise DataError(
            f"{name} takes {h}x{w} images of {c} channel{'s' if c > 1 else ''} ({c * h * w:,} "
            f"values an example), but the dataset's examples have {input_dim:,}; use a dataset "
            f"of {c}x{h}x{w} images."
        )


class _Images(nn.Module):
    """Reshape a batch of flat or image-shaped examples to ``[B, *shape]``."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


def _norm(norm: str, channels: int) -> nn.Module:
    if norm == "group":
        return nn.GroupNorm(_GROUPS, channels)
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    return nn.Identity()


_GROUPS = 2
"""GroupNorm groups of ``resnet20`` (Hsieh et al., ICML 2020, "The Non-IID Data Quagmire",
replace BatchNorm by GroupNorm of 2 groups for decentralized ResNets)."""


class _BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut; a block that halves the image and widens the
    channels takes the identity shortcut subsampled and zero-padded (He et al.'s CIFAR
    option A: no parameters)."""

    def __init__(self, inputs: int, outputs: int, stride: int, norm: str) -> None:
        super().__init__()
        bias = norm == "none"  # a norm layer's shift takes the place of a bias
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=bias)
        self.norm1 = _norm(norm, outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, stride=1, padding=1, bias=bias)
        self.norm2 = _norm(norm, outputs)
        self.stride = stride
        self.pad = outputs - inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = functional.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        shortcut = x
        if self.stride != 1 or self.pad:
            shortcut = x[:, :, :: self.stride, :: self.stride]
            half = self.pad // 2
            shortcut = functional.pad(shortcut, (0, 0, 0, 0, half, self.pad - half))
        return functional.relu(out + shortcut)


class ResNet20(nn.Module):
    """ResNet-20 for 32x32x3 images (He et al., CVPR 2016, section 4.2): a 3x3 convolution
    of 16 channels, three stages of three basic blocks (16, 32, 64 channels; the second and
    third halve the image), global average pooling, a linear layer to the classes."""

    def __init__(self, num_classes: int, norm: str) -> None:
        super().__init__()
        bias = norm == "none"
        self.images = _Images((3, 32, 32))
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=bias)
        self.norm = _norm(norm, 16)
        blocks: list[nn.Module] = []
        inputs = 16
        for outputs, stride in ((16, 1), (32, 2), (64, 2)):
            for k in range(3):
                blocks.append(_BasicBlock(inputs, outputs, stride if k == 0 else 1, norm))
                inputs = outputs
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = functional.relu(self.norm(self.conv(self.images(x))))
        h = self.blocks(h)
        logits: torch.Tensor = self.fc(h.mean(dim=(2, 3)))
        return logits


def resnet20(*, input_dim: int, num_classes: int, norm: str = "group") -> nn.Module:
    """ResNet-20 (:class:`ResNet20`, about 0.27M parameters) for 32x32x3 images.

    ``norm``: ``"group"`` (GroupNorm, 2 groups: the vectorized engine maps it with
    ``torch.func.vmap``), ``"batch"`` (BatchNorm: its running statistics are updated in place,
    which vmap cannot map, so every engine computes its gradients one module per peer) or
    ``"none"`` (no normalization; the convolutions get biases)."""
    if norm not in NORMS:
        hint = did_you_mean(norm, NORMS)
        raise DataError(
            f"model.norm = {norm!r} is invalid: it must be one of {', '.join(NORMS)}"
            + (f"; {hint}" if hint else ".")
        )
    _image_shape("resnet20", input_dim, (3, 32, 32))
    return ResNet20(num_classes, norm)


def femnist_cnn(*, input_dim: int, num_classes: int) -> nn.Module:
    """LEAF's FEMNIST CNN (Caldas et al., 2018, "LEAF: A Benchmark for Federated Settings"):
    on 1x28x28 images, a 5x5 convolution of 32 channels ("same" padding), ReLU, 2x2 max-pool,
    a 5x5 convolution of 64 channels, ReLU, 2x2 max-pool, a dense layer of 2048 units with
    ReLU, and a linear layer to the classes (62 for FEMNIST): 6,603,710 parameters."""
    _image_shape("femnist-cnn", input_dim, (1, 28, 28))
    return nn.Sequential(
        _Images((1, 28, 28)),
        nn.Conv2d(1, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(7 * 7 * 64, 2048),
        nn.ReLU(),
        nn.Linear(2048, num_classes),
    )


def cnn32(*, input_dim: int, num_classes: int) -> nn.Module:
    """A small CNN for 32x32x3 images (CIFAR-10's shape): a 5x5 convolution of 32 channels
    ("same" padding), ReLU, 2x2 max-pool, a 5x5 convolution of 64 channels, ReLU, 2x2
    max-pool, a dense layer of 128 units with ReLU, and a linear layer to the classes
    (579,402 parameters for 10 classes)."""
    _image_shape("cnn32", input_dim, (3, 32, 32))
    return nn.Sequential(
        _Images((3, 32, 32)),
        nn.Conv2d(3, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 64, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


VOCABULARY = 80
"""Characters of LEAF's Shakespeare vocabulary (``char-lstm``'s embedding rows)."""


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: each character index embedded in 8 dimensions, a 2-layer
    LSTM of 256 units, and a linear layer from its last output to the next character."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, 8)
        self.lstm = nn.LSTM(8, 256, num_layers=2, batch_first=True)
        self.fc = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point() or x.dim() != 2:
            raise DataError(
                "char-lstm takes int64 character indices of shape [batch, length], got "
                f"{x.dtype} of shape {tuple(x.shape)}; use a dataset of character sequences."
            )
        out, _ = self.lstm(self.embed(x))
        logits: torch.Tensor = self.fc(out[:, -1])
        return logits


def char_lstm(*, input_dim: int, num_classes: int) -> nn.Module:
    """LEAF's Shakespeare next-character model (:class:`CharLSTM`, 819,920 parameters for 80
    classes) on int64 sequences of character indices in ``[0, 80)`` (80 in LEAF)."""
    if num_classes > VOCABULARY:
        raise DataError(
            f"char-lstm predicts one of the {VOCABULARY} characters of its vocabulary, but the "
            f"dataset has {num_classes:,} classes; use a dataset of character sequences."
        )
    if input_dim < 1:
        raise DataError("char-lstm needs sequences of at least one character.")
    return CharLSTM(num_classes)
