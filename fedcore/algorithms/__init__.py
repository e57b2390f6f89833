"""Decentralized learning algorithms as sans-I/O state machines, and their registry.

``make_algorithm(name, **options)`` builds one from the registry; the options are the
extra keys of the config's ``[algorithm]`` table.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fedcore.algorithms.base import Algorithm, Inbox, Outbox, RoundContext
from fedcore.algorithms.compressed import CHOCO, CHOCOState, DeepSqueeze, DeepSqueezeState
from fedcore.algorithms.dpsgd import DPSGD, DPSGDState
from fedcore.algorithms.online import DOG, DOL
from fedcore.algorithms.ops import OPS, OPSState, push_shares, push_sum_mix
from fedcore.algorithms.reference import Central, Local, ModelState
from fedcore.algorithms.rps import RPS, RPSState
from fedcore.algorithms.rule import NodeRule, Rows, Rule, Send, Slot
from fedcore.algorithms.server import FedAvg, FedAvgState
from fedcore.algorithms.squeeze import (
    APMSqueeze,
    APMSqueezeState,
    DoubleSqueeze,
    DoubleSqueezeState,
)
from fedcore.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "CHOCO",
    "DOG",
    "DOL",
    "DPSGD",
    "OPS",
    "RPS",
    "APMSqueeze",
    "APMSqueezeState",
    "Algorithm",
    "CHOCOState",
    "Central",
    "DPSGDState",
    "DeepSqueeze",
    "DeepSqueezeState",
    "DoubleSqueeze",
    "DoubleSqueezeState",
    "FedAvg",
    "FedAvgState",
    "Inbox",
    "Local",
    "ModelState",
    "NodeRule",
    "OPSState",
    "Outbox",
    "RPSState",
    "RoundContext",
    "Rows",
    "Rule",
    "Send",
    "Slot",
    "make_algorithm",
    "push_shares",
    "push_sum_mix",
]

ALGORITHMS: dict[str, Callable[..., Algorithm]] = {
    "ops": OPS,
    "dpsgd": DPSGD,
    "dog": DOG,
    "dol": DOL,
    "local": Local,
    "central": Central,
    "deepsqueeze": DeepSqueeze,
    "choco": CHOCO,
    "rps": RPS,
    "fedavg": FedAvg,
    "doublesqueeze": DoubleSqueeze,
    "apmsqueeze": APMSqueeze,
}


def make_algorithm(name: str, **options: Any) -> Algorithm:
    """Build the algorithm registered as ``name`` with keyword ``options``.

    Raises:
        ConfigError: unknown name, or an option the algorithm does not take.
    """
    factory = ALGORITHMS.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown algorithm {name!r}; known algorithms: {', '.join(sorted(ALGORITHMS))}."
        )
    accepted = set(inspect.signature(factory).parameters)
    unknown = sorted(set(options) - accepted)
    if unknown:
        allowed = ", ".join(sorted(accepted)) or "none"
        raise ConfigError(
            f"algorithm {name!r} has no option {', '.join(unknown)} (its options: {allowed})."
        )
    return factory(**options)
