"""Reference models and the flat-parameter objective the algorithms work on.

Algorithms see a model as one flat parameter vector. :class:`Objective` binds an
``nn.Module`` to such a vector without copies in the hot path: the module's
parameters are views into one flat buffer and their gradients views into another, so
evaluating the loss and gradient at a point is one copy in and one backward pass.

Built-in models: ``logreg`` (multinomial logistic regression), ``mlp`` (one hidden
ReLU layer, ``model.hidden`` units) and ``cnn1d`` (two strided 1-D convolutions with
``model.hidden`` channels, for signals like MNIST-1D), and the models the field publishes
on: ``resnet20`` (ResNet-20 for 32x32x3 images, ``model.norm`` group, batch or none),
``femnist-cnn`` (LEAF's FEMNIST CNN, 1x28x28), ``char-lstm`` (LEAF's Shakespeare LSTM, on
int64 character indices) and ``cnn32`` (a small CNN for 32x32x3 images), in
:mod:`fedcore.architectures`. A user's model loads by import path:
``"pkg.module:factory"`` is called as ``factory(input_dim=..., num_classes=..., **options)``
and returns an ``nn.Module`` mapping a batch of inputs to class logits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from fedcore import registry
from fedcore.config import MAX_PARAMETERS, table_keys
from fedcore.data import refused_arguments, resolve_factory
from fedcore.errors import DataError, FedcoreError
from fedcore.evaluation import example_chunk
from fedcore.gradients import RowGradient, model_input
from fedcore.ids import error_text
from fedcore.registry import did_you_mean
from fedcore.runtime import physical_memory

__all__ = [
    "MODELS",
    "Objective",
    "build_model",
    "cnn1d",
    "logreg",
    "mlp",
    "parameter_count",
    "physical_memory",
]


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


MODELS: dict[str, Callable[..., nn.Module]] = registry.MODELS.factories()


_SIZED = ("logreg", "mlp", "cnn1d")
"""The built-in models whose size grows with the input and ``model.hidden`` (counted by
formula, and bounded before they are built); the others are fixed architectures that check
their input size themselves."""

_BYTES_PER_PARAMETER = 3 * 4
"""Memory a parameter of a built-in model needs while it is built: the module's float32
copy, then the flat parameters and gradients of :class:`Objective` (a lower bound: an
algorithm's state and a simulation's many nodes need more)."""


def parameter_count(
    name: str, *, input_dim: int, num_classes: int, hidden: int = 0, **options: Any
) -> int:
    """Parameters of the built-in model ``name`` (``hidden`` 0: its default width; other
    ``options`` as ``[model]`` gives them, such as ``norm``).

    Raises:
        DataError: ``name`` is not a built-in model, or does not take these inputs.
    """
    if name not in MODELS:
        raise DataError(f"unknown built-in model {name!r}; they are {', '.join(MODELS)}.")
    d, c = input_dim, num_classes
    if name not in _SIZED:  # a fixed architecture: counted without memory
        with torch.device("meta"):
            module = MODELS[name](input_dim=d, num_classes=c, **options)
        return sum(p.numel() for p in module.parameters())
    if name == "logreg":
        return (d + 1) * c
    h = hidden or int(inspect.signature(MODELS[name]).parameters["hidden"].default)
    if name == "mlp":
        return (d + 1) * h + (h + 1) * c
    length = ((d + 1) // 2 + 1) // 2  # cnn1d: after two stride-2 convolutions
    return (5 + 1) * h + (5 * h + 1) * h + (h * length + 1) * c


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _check_size(name: str, input_dim: int, num_classes: int, options: dict[str, Any]) -> None:
    """Refuse a built-in model too large to build, before any allocation tries.

    Two bounds: :data:`~fedcore.config.MAX_PARAMETERS` (2**31: 8 GiB a float32 copy, and
    a peer keeps several; indices stay within 32 bits), and the machine's physical memory
    for the 3 float32 copies building the model needs (``_BYTES_PER_PARAMETER``).
    """
    hidden = options.get("hidden", 0)
    if not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for v in (input_dim, num_classes, hidden)
    ):
        return  # the factory reports bad values itself
    if name not in _SIZED:
        return  # a fixed architecture: the factory checks its inputs (and it is small)
    count = parameter_count(name, input_dim=input_dim, num_classes=num_classes, hidden=hidden)
    shape = f"model {name!r}" + (f" with model.hidden = {hidden:,}" if hidden else "")
    shape += f" on {input_dim:,} input features and {num_classes:,} classes"
    if count > MAX_PARAMETERS:
        raise DataError(
            f"{shape} has {count:,} parameters, more than the {MAX_PARAMETERS:,} (2**31) a "
            "built-in model may have (8 GiB a float32 copy, and a peer keeps several). "
            "Use a smaller model.hidden."
        )
    memory = physical_memory()
    need = count * _BYTES_PER_PARAMETER
    if memory is not None and need > memory:
        raise DataError(
            f"{shape} has {count:,} parameters; building it takes about {_size(need)} (3 "
            "float32 copies: the module, the flat parameters, the gradients), more than this "
            f"machine's {_size(memory)} of memory. Use a smaller model.hidden."
        )


def _option_hints(factory: Callable[..., Any], options: dict[str, Any]) -> str:
    """``" (hiden: did you mean `hidden`?)"``: for each option ``factory`` does not take that is
    close to one it takes or to a ``[model]`` key."""
    try:
        takes = [
            n
            for n, p in inspect.signature(factory).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
    except (TypeError, ValueError):
        return ""
    near = [n for n in takes if n not in ("input_dim", "num_classes")] + list(table_keys("model"))
    hints = [(key, did_you_mean(key, near)) for key in options if key not in takes]
    shown = [f"{key}: {hint}" for key, hint in hints if hint]
    return f" ({'; '.join(shown)})" if shown else ""


def build_model(
    name: str, *, input_dim: int, num_classes: int, seed: int, **options: Any
) -> nn.Module:
    """Build a model by name or import path, initialized from ``seed``.

    A built-in model's size is checked first (:func:`_check_size`). Whatever a factory
    raises becomes a :class:`DataError` naming it and its error, chained to the original
    (whose traceback ``fedcore -v`` shows).

    Raises:
        DataError: unknown name, bad options, a model too large, a factory that fails or
            returns no module.
    """
    if name not in MODELS and name in registry.MODELS:  # a plug-in's, by its import path
        name = registry.MODELS.entry(name).target
    factory = resolve_factory(name, MODELS, what="model")
    if factory is MODELS.get(name):
        _check_size(name, input_dim, num_classes, options)
    refused = refused_arguments(factory, input_dim=input_dim, num_classes=num_classes, **options)
    if refused is not None:
        raise DataError(
            f"model {name!r} does not accept these options {options}: {refused}"
            + _option_hints(factory, options)
            + "."
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            module = factory(input_dim=input_dim, num_classes=num_classes, **options)
        except FedcoreError:
            raise
        except Exception as exc:  # a user's factory can raise anything
            raise DataError(f"model factory {name!r} failed: {error_text(exc)}") from exc
    if not isinstance(module, nn.Module):
        raise DataError(f"model factory {name!r} returned {type(module).__name__}, not nn.Module.")
    return module


class Objective:
    """A classification model as a function of one flat parameter vector.

    Args:
        module: The model. It is taken over: its parameters become views into a
            private flat buffer, so give each node its own module.
        dtype: Parameter dtype (``torch.float32`` or ``torch.float64``).
        gradient_mode: How :attr:`rows` computes (:data:`~fedcore.gradients.GRADIENT_MODES`);
            ``None``: decide (by probing ``sample`` if given).
        sample: A few training examples to decide the gradient mode on.

    The loss and gradient go through :attr:`rows` (:class:`~fedcore.gradients.RowGradient`),
    the code the vectorized engine runs on all its peers at once, here on one row.
    """

    def __init__(
        self,
        module: nn.Module,
        dtype: torch.dtype = torch.float32,
        *,
        gradient_mode: str | None = None,
        sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Move ``module`` onto flat parameter and gradient buffers."""
        module.to(dtype)
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        if not params:
            raise DataError("the model has no trainable parameters.")
        self.module = module
        self.dtype = dtype
        self.numel = sum(p.numel() for p in params)
        # The layers of the flat vector, in order: (name, offset, numel). Per-layer rules
        # (LARS, LAMB: fedcore.algorithms.optim) use them.
        self.segments: list[tuple[str, int, int]] = []
        for name, p in named:
            start = self.segments[-1][1] + self.segments[-1][2] if self.segments else 0
            self.segments.append((name, start, p.numel()))
        self._flat = torch.empty(self.numel, dtype=dtype)
        # The module's own gradients (module_loss_and_grad), made on its first call: the
        # row path (vmap, batched) never needs them, and a large model's copy a peer counts.
        self._grad: torch.Tensor | None = None
        module.train()
        self._training = True  # module.train()/eval() walk every submodule: switch only on change
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                self._flat[offset : offset + n].copy_(p.reshape(-1))
                p.data = self._flat[offset : offset + n].view_as(p)
                offset += n
        initial = self._flat.clone()  # the mode probe loads other parameters
        self.rows = RowGradient(
            module, dtype, self.module_loss_and_grad, mode=gradient_mode, sample=sample
        )
        with torch.no_grad():
            self._flat.copy_(initial)

    def initial_params(self) -> torch.Tensor:
        """A copy of the module's parameters at construction, flattened."""
        return self._flat.clone()

    def _check(self, params: torch.Tensor) -> None:
        if params.shape != (self.numel,):
            raise DataError(f"expected {self.numel} parameters, got shape {tuple(params.shape)}.")

    def _load(self, params: torch.Tensor) -> None:
        self._check(params)
        with torch.no_grad():
            self._flat.copy_(params)

    def loss_and_grad(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        """Mean cross-entropy on ``(x, y)`` at ``params`` and its gradient (a new tensor),
        through :attr:`rows`: the one gradient path every engine shares, on one row."""
        self._check(params)
        losses, grads = self.rows.loss_and_grad(params[None], x[None], y[None])
        return float(losses.item()), grads[0]

    def module_loss_and_grad(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        """The same through the module's own forward and backward (the reference the row
        path is checked against, and the row path of a model vmap cannot map)."""
        self._load(params)
        grad = self._gradients()
        grad.zero_()
        if not self._training:
            self.module.train()
            self._training = True
        loss = functional.cross_entropy(self.module(model_input(x, self.dtype)), y)
        loss.backward()  # type: ignore[no-untyped-call]
        return float(loss.item()), grad.clone()

    def _gradients(self) -> torch.Tensor:
        """The flat buffer the module's ``.grad`` views (made on first use)."""
        if self._grad is None:
            self._grad = torch.zeros(self.numel, dtype=self.dtype)
            params = [p for p in self.module.parameters() if p.requires_grad]
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = self._grad[offset : offset + n].view_as(p)
                offset += n
        return self._grad

    @torch.no_grad()
    def evaluate(
        self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, float]:
        """Mean cross-entropy and accuracy on ``(x, y)`` at ``params``, in passes of at most
        :data:`~fedcore.evaluation.EVAL_INPUT_BYTES` of examples (one pass for the small
        datasets)."""
        self._load(params)
        if self._training:
            self.module.eval()
            self._training = False
        n = len(y)
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        part = example_chunk(n, x[:1].numel() * max(x.element_size(), itemsize))
        if part >= n:
            logits = self.module(model_input(x, self.dtype))
            loss = functional.cross_entropy(logits, y)
            acc = (logits.argmax(dim=1) == y).to(torch.float64).mean()
            return float(loss.item()), float(acc.item())
        loss_sum = 0.0
        correct = 0
        for first in range(0, n, part):
            xs, ys = x[first : first + part], y[first : first + part]
            logits = self.module(model_input(xs, self.dtype))
            loss_sum += float(functional.cross_entropy(logits, ys, reduction="sum").double())
            correct += int((logits.argmax(dim=1) == ys).sum())
        return loss_sum / n, correct / n
