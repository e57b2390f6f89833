"""What learns: ``[algorithm]`` (and its step-size schedule), ``[optimizer]`` and
``[model]``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from fedcore import registry
from fedcore.config.constants import (
    DTYPES,
    LR_SCALINGS,
    LR_SCHEDULES,
    MAX_BATCH,
    MAX_PARAMETERS,
    MAX_ROUNDS,
    MODEL_CHOICES,
    OPTIMIZER_NAMES,
)
from fedcore.config.rules import (
    Table,
    check_choice,
    choice,
    holds,
    named,
    number,
    require,
    rules,
    whole,
)
from fedcore.errors import ConfigError
from fedcore.registry import did_you_mean

__all__ = ["AlgorithmConfig", "ModelConfig", "OptimizerConfig", "effective_lr"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AlgorithmConfig(Table):
    """``[algorithm]``: name, step size and schedule; other keys go to the algorithm.

    ``lr_schedule``: ``constant``, ``sqrt``, ``cosine`` or ``poly`` (power ``lr_power``),
    after ``warmup_rounds`` rounds of linear warm-up. ``lr_scaling`` (``none``, ``linear``
    or ``sqrt``) with ``base_batch_size`` B0 scales the step size for a batch size B of
    ``k = B / B0`` times the base: ``linear`` multiplies ``lr`` by k and divides the
    warm-up rounds by k (the same warm-up epochs), ``sqrt`` multiplies ``lr`` by sqrt(k)
    and keeps the warm-up rounds (warm-up epochs k times longer: LEGW). See
    :func:`effective_lr`; the summary records the values used.

    ``name`` is checked by :func:`~fedcore.config.load_config`, not here:
    :mod:`fedcore.testing` names a run after an algorithm object.
    """

    TABLE: ClassVar[str] = "algorithm"

    name: str = "ops"
    lr: float = field(default=0.5, metadata=number(">= 0"))
    lr_schedule: str = field(default="constant", metadata=choice(LR_SCHEDULES))
    warmup_rounds: int = field(default=0, metadata=whole(0, MAX_ROUNDS))
    lr_power: float = field(default=1.0, metadata=number("> 0"))
    lr_scaling: str = field(default="none", metadata=choice(LR_SCALINGS))
    base_batch_size: int = field(default=0, metadata=whole(0, MAX_BATCH))
    options: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """A scaled step size needs the batch size it was tuned for."""
        require(
            self.lr_scaling == "none" or self.base_batch_size > 0,
            "algorithm.base_batch_size",
            self.base_batch_size,
            f"must be set (> 0) with lr_scaling = {self.lr_scaling!r}",
        )


def effective_lr(algorithm: AlgorithmConfig, batch_size: int) -> tuple[float, int]:
    """``(lr, warmup_rounds)`` after ``algorithm.lr_scaling`` for ``batch_size``."""
    if algorithm.lr_scaling == "none":
        return algorithm.lr, algorithm.warmup_rounds
    k = batch_size / algorithm.base_batch_size
    if algorithm.lr_scaling == "linear":
        return algorithm.lr * k, max(0, round(algorithm.warmup_rounds / k))
    return algorithm.lr * math.sqrt(k), algorithm.warmup_rounds


def _two_betas(betas: object) -> bool:
    return (
        isinstance(betas, list | tuple)
        and len(betas) == 2
        and all(isinstance(b, int | float) and not isinstance(b, bool) for b in betas)
        and all(0 <= b < 1 for b in betas)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerConfig(Table):
    """``[optimizer]``: the rule that turns a node's gradient into its step.

    ``name`` is one of ``OPTIMIZER_NAMES`` (:mod:`fedcore.algorithms.optim` has the update
    rules); ``sgd`` with no ``weight_decay`` is the plain ``lr * g`` step of every algorithm,
    bit for bit. Each optimizer takes only its own keys: ``momentum`` (``momentum``,
    ``lars``), ``nesterov`` (``momentum``), ``betas`` and ``eps`` (``adam``, ``adamw``,
    ``lamb``), ``eta`` (``lars``'s trust coefficient), ``trust_clip`` (``lamb``'s bound on
    the weight norm, 0 for none), ``weight_decay`` (all). Setting a key an optimizer does
    not take to anything but its default is refused.
    """

    TABLE: ClassVar[str] = "optimizer"

    name: str = field(default="sgd", metadata=choice(OPTIMIZER_NAMES))
    momentum: float = field(
        default=0.9, metadata=rules(number(">= 0"), number("< 1", why="must be below 1"))
    )
    nesterov: bool = False
    betas: tuple[float, float] = field(
        default=(0.9, 0.999),
        metadata=holds(_two_betas, "must be two numbers in [0, 1), e.g. [0.9, 0.999]"),
    )
    eps: float = field(
        default=1e-8,
        metadata=rules(
            number(">= 0"),
            number(
                "> 0",
                why="must be > 0 (the optimizers that take it divide by sqrt(v) + eps, which "
                "is 0 for a weight whose gradient is 0: the run would diverge at round 0)",
            ),
        ),
    )
    weight_decay: float = field(default=0.0, metadata=number(">= 0"))
    eta: float = field(default=0.001, metadata=number(">= 0"))
    trust_clip: float = field(default=0.0, metadata=number(">= 0"))

    def check(self) -> None:
        """``betas`` as a tuple of two floats (a TOML array is a list)."""
        object.__setattr__(self, "betas", (float(self.betas[0]), float(self.betas[1])))

    def options(self) -> dict[str, Any]:
        """The keyword options of :func:`~fedcore.algorithms.optim.make_optimizer`: every
        key this optimizer takes, and any other key set away from its default (which
        ``make_optimizer`` then refuses, naming it)."""
        takes = _OPTIMIZER_KEYS[self.name]
        defaults = OptimizerConfig()
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "name":
                continue
            value = getattr(self, f.name)
            if f.name in takes or value != getattr(defaults, f.name):
                out[f.name] = value
        return out


_OPTIMIZER_KEYS: dict[str, tuple[str, ...]] = {e.name: e.keys for e in registry.OPTIMIZERS}
"""The ``[optimizer]`` keys each optimizer takes (its factory's keywords)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig(Table):
    """``[model]``: built-in name or ``"pkg.module:factory"``, MLP width, dtype.

    Other keys are passed to a user's model factory as keyword arguments.
    """

    TABLE: ClassVar[str] = "model"

    name: str = field(default="logreg", metadata=named(registry.MODELS))
    hidden: int = field(default=64, metadata=whole(1, MAX_PARAMETERS))
    dtype: str = field(default="float32", metadata=choice(DTYPES))
    options: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Refuse a built-in model's option with a value it cannot take, or one misspelt
        (close to an option it takes); other keys are refused when the model is built (with
        the same hints), as a user's factory's are."""
        if self.name not in registry.MODELS:
            return
        takes = registry.MODELS.entry(self.name).keys
        for key, value in self.options.items():
            if key in takes and key in MODEL_CHOICES:
                check_choice(f"model.{key}", value, MODEL_CHOICES[key])
            elif key not in takes:
                hint = did_you_mean(key, takes)
                if hint:
                    raise ConfigError(f"model {self.name!r} has no option {key!r}; {hint}")
