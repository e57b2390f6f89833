"""``[privacy]``: differential privacy of a run, its mechanism and accountant."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields
from typing import ClassVar

from fedcore.config.constants import (
    PRIVACY_ACCOUNTANTS,
    PRIVACY_MECHANISMS,
    PRIVACY_NOISE_KEYS,
)
from fedcore.config.rules import Table, choice, number, require, rule, rules
from fedcore.errors import ConfigError

__all__ = ["PrivacyConfig"]


def _accountant_installed(key: str, value: object) -> None:
    if value != "none" and importlib.util.find_spec("opacus") is None:
        raise ConfigError(
            f"{key} = {value!r} needs Opacus's privacy accountants, which are not "
            "installed; install them with: pip install 'fedcore[dp]' (or pip install "
            "opacus), or remove the [privacy] table."
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyConfig(Table):
    """``[privacy]``: which mechanism makes the run differentially private, and how its
    epsilon is accounted (:mod:`fedcore.privacy`; the ``fedcore[dp]`` extra).

    ``mechanism``: ``"none"`` (the default: no privacy, and the table's other keys must
    stay at their defaults), ``"dp-sgd"`` (each peer clips every example's gradient to
    norm ``clip``, sums them and adds Gaussian noise of standard deviation ``noise *
    clip``: record-level privacy of each peer's data), ``"dp-peer"`` (each peer clips
    each step's gradient to ``clip`` and adds that noise, so every message it sends is
    private in its whole data set: peer-level privacy against its neighbours) or
    ``"dp-fedavg"`` (FedAvg's
    server clips each worker's update to ``clip`` and adds the noise to their sum:
    user-level privacy).
    ``delta``: the delta epsilon is reported at (1e-5; it should be below one over the
    number of records protected). ``target_epsilon``: the run stops after the last round
    whose epsilon is within it, and the summary says so (0: no target).
    ``accountant``: ``"prv"`` (Opacus's PRV accountant, the tighter) or ``"rdp"``.
    ``noise_key``: ``"seed"`` (the noise is a keyed hash of the run's seed: reproducible,
    the engines agree bit for bit, and every peer of the run could redraw another's) or
    ``"secret"`` (keyed by 64 bits each process draws from the OS: what a deployment
    wants; the run is then not reproducible).
    """

    TABLE: ClassVar[str] = "privacy"

    mechanism: str = field(
        default="none",
        metadata=rules(choice(PRIVACY_MECHANISMS), rule(_accountant_installed)),
    )
    clip: float = field(default=1.0, metadata=number("> 0"))
    noise: float = field(default=1.0, metadata=number(">= 0"))
    delta: float = field(default=1e-5, metadata=number("(0, 1)"))
    target_epsilon: float = field(
        default=0.0, metadata=number(">= 0", why="must be an epsilon > 0 (0: no target)")
    )
    accountant: str = field(default="prv", metadata=choice(PRIVACY_ACCOUNTANTS))
    noise_key: str = field(default="seed", metadata=choice(PRIVACY_NOISE_KEYS))

    @property
    def active(self) -> bool:
        """Whether the run is private (a mechanism other than ``"none"``)."""
        return self.mechanism != "none"

    def check(self) -> None:
        """Keys without a mechanism would do nothing; a target needs noise."""
        if not self.active:
            for f in fields(self):
                value = getattr(self, f.name)
                require(
                    value == f.default,
                    f"privacy.{f.name}",
                    value,
                    "does nothing with privacy.mechanism = 'none'; set privacy.mechanism "
                    "('dp-sgd' or 'dp-fedavg'), or leave the key out",
                )
        require(
            not (self.target_epsilon > 0 and self.noise == 0),
            "privacy.target_epsilon",
            self.target_epsilon,
            "cannot be met with privacy.noise = 0 (no noise: epsilon is infinite from the "
            "first step); set privacy.noise > 0",
        )
