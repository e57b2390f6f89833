"""``[run]``: what a run is called, its seed, rounds and evaluation period."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import ClassVar

from fedcore.config.constants import MAX_LOCAL_STEPS, MAX_NODES, MAX_ROUNDS
from fedcore.config.rules import Table, holds, is_int, number, require, rule, whole
from fedcore.errors import ConfigError

__all__ = ["RunConfig"]


def _peers_or_all(key: str, value: object) -> None:
    require(
        value == "all" or (is_int(value) and 1 <= value <= MAX_NODES),  # type: ignore[operator]
        key,
        value,
        f'must be "all" or a whole number of peers from 1 to {MAX_NODES:,}',
    )


def _tensorboard_installed(key: str, value: object) -> None:
    if value and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "run.tensorboard = true needs the tensorboard package, which is not "
            "installed; install it with: pip install 'fedcore[tensorboard]' (or pip "
            "install tensorboard), or set run.tensorboard = false."
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig(Table):
    """``[run]``: name (empty: ``<algorithm>-<topology>``), seed, rounds, eval period.

    ``regret``: after the run, compute the static regret (and the dynamic regret where the
    stream knows its comparator) at every evaluation round, for convex models (``logreg``).
    ``checkpoint_every``: a run (``fedcore simulate``) or a peer (``fedcore node``)
    checkpoints its state every K rounds (0: never); ``fedcore simulate --resume RUN_DIR``
    and ``fedcore node --resume`` continue from the newest good checkpoint.
    ``local_steps``: K steps of the node's optimizer on K local minibatches a round, the
    last of them the algorithm's own step before it communicates (local SGD; local D-SGD
    for the gossip algorithms); 1 is one step a round.
    ``tensorboard``: also write TensorBoard event files into ``<run>/tensorboard/`` (the
    round aggregates, evaluations, bytes, regret and the config as text; needs the
    ``tensorboard`` package: ``pip install 'fedcore[tensorboard]'``). ``csv``: also write
    ``<run>/rounds.csv``, one row of round aggregates a round. ``target_accuracy``: the
    summary says when the average model first reached it. None of the three changes the
    run (they are not part of its fingerprint).
    ``eval_peers``: whose own models an evaluation measures: ``"all"`` (the default), or a
    seeded sample of that many peers (the same ones at every evaluation), whose figures the
    records label ``"eval_peers": {"sampled": k, "of": n}``; the average model and the
    consensus distance are always every peer's. It does not change the run either.
    """

    TABLE: ClassVar[str] = "run"

    name: str = field(
        default="",
        metadata=holds(
            lambda v: "/" not in v and "\\" not in v, "must not contain path separators"
        ),
    )
    seed: int = field(
        default=0, metadata=holds(lambda v: is_int(v) and 0 <= v < 2**32, "must be in [0, 2**32)")
    )
    rounds: int = field(default=300, metadata=whole(1, MAX_ROUNDS))
    eval_every: int = field(default=25, metadata=whole(1, MAX_ROUNDS))
    eval_peers: int | str = field(default="all", metadata=rule(_peers_or_all))
    regret: bool = False
    checkpoint_every: int = field(default=0, metadata=whole(0, MAX_ROUNDS))
    local_steps: int = field(default=1, metadata=whole(1, MAX_LOCAL_STEPS))
    tensorboard: bool = field(default=False, metadata=rule(_tensorboard_installed))
    csv: bool = False
    target_accuracy: float = field(
        default=0.0, metadata=number("[0, 1]", why="must be an accuracy in [0, 1] (0: none)")
    )
    """The summary's ``time_to_target``: the first evaluation whose average-model accuracy
    reaches it (round, and virtual seconds with ``[time]``); 0: not reported."""

    def check(self) -> None:
        """Regret counts one loss a node a round."""
        require(
            not (self.regret and self.local_steps > 1),
            "run.local_steps",
            self.local_steps,
            "must be 1 with run.regret = true (regret counts one loss a node a round)",
        )
