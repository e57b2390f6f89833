"""``[data]``: the dataset (or online stream), how it is split across nodes, minibatches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fedcore import registry
from fedcore.config.constants import FOLDER, MAX_BATCH, MAX_FEATURES, ORDERS, PARTITIONS, STREAMS
from fedcore.config.rules import (
    Table,
    check_name,
    choice,
    holds,
    number,
    require,
    rule,
    shown,
    whole,
)
from fedcore.errors import ConfigError
from fedcore.registry import did_you_mean

__all__ = ["DataConfig"]


def _dataset(key: str, value: str) -> None:
    """A dataset's name, a user's ``"pkg.module:factory"`` or ``"folder:PATH"``."""
    if not value.startswith(FOLDER) or not value[len(FOLDER) :].strip():
        check_name(key, value, registry.DATASETS)


def _stream(key: str, value: str) -> None:
    if value not in STREAMS and ":" not in value:
        hint = did_you_mean(value, [s for s in STREAMS if s])
        raise ConfigError(
            f'{key} = {shown(value)} is invalid: it must be "synthetic", '
            '"" (batches of data.dataset) or a stream of your own as "pkg.module:factory"'
            + (f"; {hint}" if hint else ".")
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig(Table):
    """``[data]``: dataset, how it is split across nodes, minibatch size, online streams.

    ``order``: ``"shuffled"`` minibatches, or ``"sorted"`` by label (each node sees its
    classes one after another). ``stream``: ``""`` (batches of ``dataset``),
    ``"synthetic"`` (the drifting stream of :mod:`fedcore.streams`, shaped by
    ``features``, ``adversarial`` (G), ``noise`` (sigma) and ``drift`` (M)) or a user's
    ``"pkg.module:factory"``. ``root``: the folder of the datasets read from files
    (``cifar10``, ``femnist``, ...; :func:`fedcore.data.files.data_root`: ``""`` is
    ``$FEDCORE_DATA``, else ``~/.cache/fedcore/data``). ``partition``: ``iid``,
    ``dirichlet`` (label skew, ``alpha``), ``shards`` (``shards_per_node`` classes a node),
    ``quantity`` (size skew, ``alpha``), ``natural`` (whole writers a node; per-node test
    sets where every test writer has training data) or ``slices`` (node ``i`` holds
    ``examples_per_node`` consecutive entries of one seeded permutation of the training
    set from entry ``i * examples_per_node`` on, wrapping around: a pure function of the
    seed and ``i``, so a population of millions finds a client's examples by index;
    ``examples_per_node = 0``: the training examples over the nodes, rounded down).
    """

    TABLE: ClassVar[str] = "data"

    dataset: str = field(default="digits", metadata=rule(_dataset))
    root: str = field(
        default="", metadata=holds(lambda v: v == v.strip(), "has whitespace around it")
    )
    partition: str = field(default="dirichlet", metadata=choice(PARTITIONS))
    alpha: float = field(default=0.3, metadata=number("> 0"))
    shards_per_node: int = field(default=2, metadata=whole(1, MAX_BATCH))
    examples_per_node: int = field(default=0, metadata=whole(0, MAX_BATCH))
    batch_size: int = field(default=32, metadata=whole(1, MAX_BATCH))
    test_fraction: float = field(default=0.2, metadata=number("(0, 1)"))
    order: str = field(default="shuffled", metadata=choice(ORDERS))
    stream: str = field(default="", metadata=rule(_stream))
    # adversarial, noise and drift shape the synthetic stream; checked, stream or not.
    features: int = field(default=10, metadata=whole(1, MAX_FEATURES))
    adversarial: float = field(default=1.0, metadata=number(">= 0"))
    noise: float = field(default=1.0, metadata=number(">= 0"))
    drift: float = field(default=10.0, metadata=number(">= 0"))

    def check(self) -> None:
        """The natural partition needs a dataset of writers; ``examples_per_node`` is the
        ``slices`` partition's."""
        require(
            not self.examples_per_node or self.partition == "slices",
            "data.examples_per_node",
            self.examples_per_node,
            f"sizes the 'slices' partition, not {self.partition!r}: set data.partition = "
            "'slices', or leave data.examples_per_node out",
        )
        if self.partition == "natural" and self.dataset in registry.DATASETS:
            require(
                "writers" in registry.DATASETS.entry(self.dataset).tags,
                "data.partition",
                self.partition,
                f"needs a dataset with writers ({', '.join(registry.DATASETS.tagged('writers'))});"
                f" {self.dataset!r} has none",
            )
