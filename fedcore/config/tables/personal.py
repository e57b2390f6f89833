"""``[personal]``: a personal model per peer, made from the shared one after the run and
measured on the peer's own test set (not part of the run fingerprint: the training does
not change)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from fedcore.config.rules import Table, choice, number, require, whole

__all__ = ["MAX_PERSONAL_STEPS", "PERSONAL_MODES", "PersonalConfig"]

PERSONAL_MODES = ("none", "finetune")
"""``personal.mode``: no personal model, or the shared model fine-tuned on the peer's own
training part."""

MAX_PERSONAL_STEPS = 10**5
"""The most fine-tuning steps a peer takes (each is one minibatch gradient of its model)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PersonalConfig(Table):
    """``[personal]``: each peer's personal model, made once the run is over from the model
    it ended with (the shared part), and measured beside it on the peer's own test set
    (:mod:`fedcore.simulation.personal`).

    ``mode``: ``"none"`` (the default: no personal model, and the other keys must stay at
    their defaults) or ``"finetune"``: ``steps`` plain SGD steps of step ``lr`` (0: the
    run's ``algorithm.lr``) on minibatches of ``data.batch_size`` of the peer's own
    training part. ``steps = 0`` measures the shared model alone. The summary's
    ``personal`` block gives the mean and worst peer's accuracy of both models.
    """

    TABLE: ClassVar[str] = "personal"

    mode: str = field(default="none", metadata=choice(PERSONAL_MODES))
    steps: int = field(default=10, metadata=whole(0, MAX_PERSONAL_STEPS))
    lr: float = field(
        default=0.0,
        metadata=number(">= 0", why="must be a step size > 0 (0: the run's algorithm.lr)"),
    )

    @property
    def active(self) -> bool:
        """Whether the run makes personal models (a mode other than ``"none"``)."""
        return self.mode != "none"

    def check(self) -> None:
        """Keys without a mode would do nothing."""
        if self.active:
            return
        for f in fields(self):
            value = getattr(self, f.name)
            require(
                value == f.default,
                f"personal.{f.name}",
                value,
                "does nothing with personal.mode = 'none'; set personal.mode = 'finetune', "
                "or leave the key out",
            )
