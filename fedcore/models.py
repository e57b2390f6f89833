"""Reference models and the flat-parameter objective the algorithms work on.

Algorithms see a model as one flat parameter vector. :class:`Objective` binds an
``nn.Module`` to such a vector without copies in the hot path: the module's
parameters are views into one flat buffer and their gradients views into another, so
evaluating the loss and gradient at a point is one copy in and one backward pass.

Built-in models: ``logreg`` (multinomial logistic regression), ``mlp`` (one hidden
ReLU layer, ``model.hidden`` units) and ``cnn1d`` (two strided 1-D convolutions with
``model.hidden`` channels, for signals like MNIST-1D). A user's model loads by import path:
``"pkg.module:factory"`` is called as ``factory(input_dim=..., num_classes=..., **options)``
and returns an ``nn.Module`` mapping a batch of inputs to class logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from fedcore.data import resolve_factory
from fedcore.errors import DataError

__all__ = ["MODELS", "Objective", "build_model", "cnn1d", "logreg", "mlp"]


def logreg(*, input_dim: int, num_classes: int) -> nn.Module:
    """Multinomial logistic regression: one linear layer to class logits."""
    return nn.Sequential(nn.Flatten(), nn.Linear(input_dim, num_classes))


def mlp(*, input_dim: int, num_classes: int, hidden: int = 64) -> nn.Module:
    """A small multi-layer perceptron: linear, ReLU, linear."""
    if hidden < 1:
        raise DataError(f"model.hidden must be >= 1, got {hidden}.")
    return nn.Sequential(
        nn.Flatten(), nn.Linear(input_dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
    )


def cnn1d(*, input_dim: int, num_classes: int, hidden: int = 32) -> nn.Module:
    """A small 1-D CNN for signals such as MNIST-1D: two strided convolutions, ``hidden``
    channels, ReLU, then a linear layer on the flattened features."""
    if hidden < 1:
        raise DataError(f"model.hidden must be >= 1, got {hidden}.")
    if input_dim < 8:
        raise DataError(f"cnn1d needs signals of at least 8 values, got {input_dim}.")
    length = (input_dim + 1) // 2  # after the first stride-2 convolution (kernel 5, pad 2)
    length = (length + 1) // 2  # after the second
    return nn.Sequential(
        nn.Unflatten(1, (1, input_dim)),
        nn.Conv1d(1, hidden, 5, stride=2, padding=2),
        nn.ReLU(),
        nn.Conv1d(hidden, hidden, 5, stride=2, padding=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(hidden * length, num_classes),
    )


MODELS: dict[str, Callable[..., nn.Module]] = {"logreg": logreg, "mlp": mlp, "cnn1d": cnn1d}


def build_model(
    name: str, *, input_dim: int, num_classes: int, seed: int, **options: Any
) -> nn.Module:
    """Build a model by name or import path, initialized from ``seed``.

    Raises:
        DataError: unknown name, bad options, or a factory that returns no module.
    """
    factory = resolve_factory(name, MODELS, what="model")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            module = factory(input_dim=input_dim, num_classes=num_classes, **options)
        except TypeError as exc:
            raise DataError(
                f"model {name!r} does not accept these options {options}: {exc}."
            ) from exc
    if not isinstance(module, nn.Module):
        raise DataError(f"model factory {name!r} returned {type(module).__name__}, not nn.Module.")
    return module


class Objective:
    """A classification model as a function of one flat parameter vector.

    Args:
        module: The model. It is taken over: its parameters become views into a
            private flat buffer, so give each node its own module.
        dtype: Parameter dtype (``torch.float32`` or ``torch.float64``).
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype = torch.float32) -> None:
        """Move ``module`` onto flat parameter and gradient buffers."""
        module.to(dtype)
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise DataError("the model has no trainable parameters.")
        self.module = module
        self.dtype = dtype
        self.numel = sum(p.numel() for p in params)
        self._flat = torch.empty(self.numel, dtype=dtype)
        self._grad = torch.zeros(self.numel, dtype=dtype)
        module.train()
        self._training = True  # module.train()/eval() walk every submodule: switch only on change
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                self._flat[offset : offset + n].copy_(p.reshape(-1))
                p.data = self._flat[offset : offset + n].view_as(p)
                p.grad = self._grad[offset : offset + n].view_as(p)
                offset += n

    def initial_params(self) -> torch.Tensor:
        """A copy of the module's parameters at construction, flattened."""
        return self._flat.clone()

    def _load(self, params: torch.Tensor) -> None:
        if params.shape != (self.numel,):
            raise DataError(f"expected {self.numel} parameters, got shape {tuple(params.shape)}.")
        with torch.no_grad():
            self._flat.copy_(params)

    def loss_and_grad(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        """Mean cross-entropy on ``(x, y)`` at ``params`` and its gradient (a new tensor)."""
        self._load(params)
        self._grad.zero_()
        if not self._training:
            self.module.train()
            self._training = True
        loss = functional.cross_entropy(self.module(x.to(self.dtype)), y)
        loss.backward()  # type: ignore[no-untyped-call]
        return float(loss.item()), self._grad.clone()

    @torch.no_grad()
    def evaluate(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, float]:
        """Mean cross-entropy and accuracy on ``(x, y)`` at ``params``."""
        self._load(params)
        if self._training:
            self.module.eval()
            self._training = False
        logits = self.module(x.to(self.dtype))
        loss = functional.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).to(torch.float64).mean()
        return float(loss.item()), float(acc.item())
