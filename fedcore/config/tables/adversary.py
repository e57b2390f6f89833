"""``[adversary]``: peers that lie. Which peers are Byzantine, and what they send.

A Byzantine peer runs the algorithm as every peer does and sends well-formed messages (the
schema, the round windows and the trust graph still hold), but with malicious values. Its
own model is not a result: the run's figures are the honest peers' alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fedcore.config.constants import SEED_LIMIT
from fedcore.config.rules import Table, choice, number, require, rule, shown, whole
from fedcore.errors import ConfigError
from fedcore.ids import check_node_id

__all__ = ["ATTACKS", "SENDER_ATTACKS", "TARGETED_ATTACKS", "VIEWS", "AdversaryConfig"]

SENDER_ATTACKS = ("signflip", "scale", "gaussian", "inflate", "withhold", "labelflip")
"""Attacks a Byzantine peer makes of its own messages (or its own data) alone: the same on
every engine and on a real ``fedcore node``."""

TARGETED_ATTACKS = ("alie", "ipm", "dissensus")
"""Attacks made, for each honest target, of the values its honest in-neighbours send it
in the same phase (what an attacker that sees its targets' neighbourhoods sends): run by
the in-process engines, which see every message."""

ATTACKS = SENDER_ATTACKS + TARGETED_ATTACKS

VIEWS = ("neighbours", "omniscient")
"""What a targeted ``alie`` or ``ipm`` is made of: the values the target's honest
in-neighbours send it, or every honest peer's (the vectorized engine's whole stack)."""


def _peers(key: str, peers: object) -> None:
    """A list of distinct safe node ids."""
    if isinstance(peers, str) or not isinstance(peers, list | tuple):
        raise ConfigError(
            f'{key} must be a list of node ids, got {shown(peers)}; write peers = ["n3"].'
        )
    for peer in peers:
        check_node_id(peer, key, ConfigError)
    twice = sorted({p for p in peers if peers.count(p) > 1})
    require(not twice, key, list(peers)[:8], f"names {twice[:3]} twice")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdversaryConfig(Table):
    """``[adversary]``: which peers lie, and how.

    * ``peers``: the Byzantine peers by id (``["n3", "n7"]``), or
    * ``fraction``: that share of the peers (rounded to the nearest whole peer, at least
      one), chosen by keyed hashes of ``run.seed``, ``adversary.seed`` and each node id:
      the same peers on every engine, whatever the node order. A server is never chosen.
    * ``attack``: what they send instead of their honest values:

      - ``signflip``: ``-scale * v``; ``scale``: ``scale * v``;
      - ``gaussian``: ``v + sigma * N(0, I)`` (keyed by the run, the sender, the round and
        the phase: every receiver gets the same noise);
      - ``labelflip``: data poisoning: the peer trains on its examples with each label
        ``y`` read as ``C - 1 - y`` and sends what it honestly computes from them;
      - ``inflate`` (push-sum): the weight and the value each ``scale`` (> 1) times theirs,
        so the de-biased value looks honest while the mass grows (the factor is cut where
        the weight would leave the legal range of a share, ``(0, n]``); ``withhold``: the
        same with ``scale`` in ``(0, 1)``, the share of its mass the peer passes on (the
        rest is lost);
      - ``alie`` (Baruch et al. 2019, "A little is enough"): ``mu - z * sd``, the mean and
        standard deviation (per coordinate) of the values the target's honest
        in-neighbours send it; ``z = 0`` (the default) derives ``z_max`` from the number of
        peers ``n`` and of Byzantine ones ``f``: ``s = floor(n / 2 + 1) - f``,
        ``z = Phi^-1((n - s) / n)``;
      - ``ipm`` (Xie et al. 2020, inner-product manipulation): ``-epsilon * mu``;
      - ``dissensus`` (He, Karimireddy and Jaggi 2022): each attacker sends its target
        ``x_i - push * sum_k W_ik (v_k - x_i) / sum_b W_ib`` (``k`` its honest
        in-neighbours, ``b`` its Byzantine ones), so the target's gossip step is
        ``(1 - push)`` times the honest one: pushed away from its neighbours' consensus.

      The sender attacks (``signflip``, ``scale``, ``gaussian``, ``inflate``,
      ``withhold``) run wherever the algorithm runs, a real ``fedcore node`` included; the
      targeted ones (``alie``, ``ipm``, ``dissensus``) need the values the target's other
      neighbours send it in the same phase, which only a simulation sees.
    * ``scale``, ``sigma``, ``z``, ``epsilon``, ``push``: the attacks' options.
    * ``view`` (``alie``, ``ipm``): ``"neighbours"`` (the default: the values the target's
      honest in-neighbours send it) or ``"omniscient"`` (every honest peer's value this
      phase, the same lie to every target; the vectorized engine only, which holds them
      all).
    * ``seed``: the choice of ``fraction`` and the noise of ``gaussian``.
    """

    TABLE: ClassVar[str] = "adversary"

    peers: tuple[str, ...] = field(default=(), metadata=rule(_peers))
    fraction: float = field(default=0.0, metadata=number("[0, 1)"))
    attack: str = field(default="signflip", metadata=choice(ATTACKS))
    scale: float = field(default=1.0, metadata=number(">= 0"))
    sigma: float = field(default=1.0, metadata=number(">= 0"))
    z: float = field(default=0.0, metadata=number(">= 0"))
    epsilon: float = field(default=0.1, metadata=number(">= 0"))
    push: float = field(default=1.5, metadata=number(">= 0"))
    view: str = field(default="neighbours", metadata=choice(VIEWS))
    seed: int = field(default=0, metadata=whole(0, SEED_LIMIT - 1))

    def check(self) -> None:
        """``peers`` as a tuple; not both ``peers`` and ``fraction``; ``scale`` that
        inflates or withholds as the attack says."""
        object.__setattr__(self, "peers", tuple(self.peers))
        if self.attack == "inflate":
            require(self.scale > 1, "adversary.scale", self.scale, "must be above 1 to inflate")
        if self.attack == "withhold":
            require(
                0 < self.scale < 1,
                "adversary.scale",
                self.scale,
                "must be in (0, 1) to withhold: the share of its mass the peer passes on",
            )
        if self.view == "omniscient" and self.attack not in ("alie", "ipm"):
            raise ConfigError(
                f"adversary.view = 'omniscient' makes alie or ipm of every honest peer's "
                f"value; adversary.attack = {self.attack!r} has no such form. Use view = "
                "'neighbours', or attack = 'alie' or 'ipm'."
            )
        if self.peers and self.fraction:
            raise ConfigError(
                "adversary.peers and adversary.fraction both choose the Byzantine peers: "
                "give one of them."
            )

    @property
    def active(self) -> bool:
        """Whether any peer lies."""
        return bool(self.peers or self.fraction)

    @property
    def targeted(self) -> bool:
        """Whether the attack is made of the target's neighbourhood (a simulation's)."""
        return self.attack in TARGETED_ATTACKS
