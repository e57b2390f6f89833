"""A whole experiment: the tables together (:class:`Config`), and what they cannot do
together."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from fedcore.config.clock import check_clock_horizon
from fedcore.config.constants import CONVEX_MODELS, FLOAT32_MAX
from fedcore.config.rules import require
from fedcore.config.tables.adversary import AdversaryConfig
from fedcore.config.tables.data import DataConfig
from fedcore.config.tables.faults import FaultsConfig
from fedcore.config.tables.learning import AlgorithmConfig, ModelConfig, OptimizerConfig
from fedcore.config.tables.network import CompressionConfig, TransportConfig
from fedcore.config.tables.personal import PersonalConfig
from fedcore.config.tables.privacy import PrivacyConfig
from fedcore.config.tables.run import RunConfig
from fedcore.config.tables.simulate import SimulateConfig
from fedcore.config.tables.time import TimeConfig
from fedcore.config.tables.topology import TopologyConfig
from fedcore.errors import ConfigError
from fedcore.ids import clip

__all__ = ["TABLES", "Config", "table_keys"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """A whole experiment."""

    run: RunConfig = field(default_factory=RunConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    time: TimeConfig = field(default_factory=TimeConfig)
    adversary: AdversaryConfig = field(default_factory=AdversaryConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    personal: PersonalConfig = field(default_factory=PersonalConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)

    def __post_init__(self) -> None:
        """Refuse what the tables cannot do together."""
        if self.time.active:  # the least its costs take the clock to over the whole run
            check_clock_horizon(
                self.time.clock_costs(rounds=self.run.rounds, local_steps=self.run.local_steps),
                cycle_s=self.time.cycle_s,
            )
        if self.model.dtype == "float32":
            for key, value in (
                ("algorithm.lr", self.algorithm.lr),
                ("optimizer.weight_decay", self.optimizer.weight_decay),
                ("personal.lr", self.personal.lr),
            ):
                require(
                    value <= FLOAT32_MAX,
                    key,
                    value,
                    f"must be at most {FLOAT32_MAX:.4g} with model.dtype = 'float32' (a "
                    "larger step is inf in float32: the run would diverge at round 0)",
                )
        if (
            self.adversary.active
            and self.adversary.view == "omniscient"
            and self.simulate.engine == "messages"
        ):
            raise ConfigError(
                "adversary.view = 'omniscient' reads every honest peer's value at once, "
                "which only the vectorized engine holds; use simulate.engine = 'auto' or "
                "'vectorized', or view = 'neighbours'."
            )
        if self.adversary.active and self.simulate.engine == "cohort":
            raise ConfigError(
                "[adversary] with simulate.engine = 'cohort': the cohort engine does not run "
                "Byzantine clients yet; use simulate.engine = 'auto'."
            )
        if self.adversary.active and self.adversary.attack == "labelflip" and self.data.stream:
            raise ConfigError(
                "adversary.attack = 'labelflip' poisons a peer's examples; an online stream "
                f"(data.stream = {clip(self.data.stream)}) holds none fixed. Choose another "
                "attack, or a dataset."
            )
        self._check_personal()
        if self.run.regret and self.model.name not in CONVEX_MODELS:
            raise ConfigError(
                f"run.regret = true needs a model whose loss is convex in its parameters "
                f"({', '.join(CONVEX_MODELS)}): model {clip(self.model.name)} has no "
                "static regret to compute (and the dynamic regret is defined for logreg "
                "only). Set model.name = 'logreg', or run.regret = false."
            )

    def _check_personal(self) -> None:
        """A personal model needs each peer's own fixed training part and its model."""
        if not self.personal.active:
            return
        if self.data.stream:
            raise ConfigError(
                "personal.mode = 'finetune' fine-tunes on a peer's own training part; an "
                f"online stream (data.stream = {clip(self.data.stream)}) holds none fixed. "
                "Use a dataset, or personal.mode = 'none'."
            )
        if self.simulate.engine == "cohort":
            raise ConfigError(
                "personal.mode = 'finetune' with simulate.engine = 'cohort': the cohort "
                "engine holds no client's model after the run; use simulate.engine = 'auto'."
            )


TABLES: dict[str, type[Any]] = {
    "run": RunConfig,
    "topology": TopologyConfig,
    "algorithm": AlgorithmConfig,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "compression": CompressionConfig,
    "transport": TransportConfig,
    "faults": FaultsConfig,
    "time": TimeConfig,
    "adversary": AdversaryConfig,
    "privacy": PrivacyConfig,
    "personal": PersonalConfig,
    "simulate": SimulateConfig,
}
"""The tables of a config file, by name, in the order a config is written."""


def table_keys(name: str) -> tuple[str, ...]:
    """The keys table ``[name]`` has of its own (sorted), without the options it passes on
    (``[algorithm]``'s to the algorithm, ``[model]``'s to a user's model)."""
    return tuple(sorted(f.name for f in fields(TABLES[name]) if f.name != "options"))
