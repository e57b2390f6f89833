"""A private run's plan: what each peer's privacy is accounted from, the round a target
epsilon stops the run at, and the ``privacy`` block of ``summary.json``.

DP-SGD (``privacy.mechanism = "dp-sgd"``): peer ``i`` holding ``n_i`` examples takes a
batch of ``B`` (``data.batch_size``, or all ``n_i`` if fewer) each local step, so its
sampling rate is ``q_i = min(1, B / n_i)`` and after ``R`` rounds it has taken ``R x
run.local_steps`` steps (an upper bound for a peer that sits rounds out: a server family's
unsampled worker, a crashed peer). Epsilon grows with ``q``, so the peer with the highest
rate has the largest epsilon: the run's epsilon, which the summary reports with that
peer, its rate and the range of rates.

Peer-level noise (``"dp-peer"``): each step clips a peer's batch gradient and noises it, a
mechanism over the peer's whole data at rate 1, composed over its ``R x run.local_steps``
steps; every peer has that epsilon, against whoever sees its messages.

DP-FedAvg (``"dp-fedavg"``, FedAvg only): each round is one step over users, sampled at
``q = m / N`` (the cohort of ``m`` of the ``N`` workers), whatever the local steps; the
summary reports the cohort and the population.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedcore.config.tables.privacy import PrivacyConfig
from fedcore.config.tables.run import RunConfig
from fedcore.errors import ConfigError
from fedcore.privacy.accountant import Mechanism, epsilon, last_step_within
from fedcore.privacy.dpsgd import DPSGD, PeerDP

__all__ = ["PrivacyPlan", "plan_privacy"]


@dataclass(frozen=True, slots=True)
class PrivacyPlan:
    """A private run's plan (see the module docstring).

    Attributes:
        config: ``[privacy]``.
        rates: Each data-holding peer's sampling rate, by node id.
        steps_per_round: Steps a peer takes a round (``run.local_steps``).
        planned_rounds: ``run.rounds`` as configured.
        rounds: The rounds the run takes: ``planned_rounds``, or fewer where
            ``target_epsilon`` stops it.
        seed: ``run.seed``, which keys the noise.
    """

    config: PrivacyConfig
    rates: dict[str, float]
    steps_per_round: int
    planned_rounds: int
    rounds: int
    seed: int
    cohort: tuple[int, int] = (0, 0)
    """DP-FedAvg: the cohort size m and the population N (the workers)."""

    @property
    def worst(self) -> tuple[str, float]:
        """The peer of the highest sampling rate (the first in node order) and its rate."""
        top = max(self.rates.values())
        return next(n for n, q in self.rates.items() if q == top), top

    @property
    def user_level(self) -> bool:
        """Whether each step protects a user's whole data (DP-FedAvg), not one record."""
        return self.config.mechanism == "dp-fedavg"

    @property
    def peer_level(self) -> bool:
        """Whether each step protects a peer's whole data from its neighbours (dp-peer)."""
        return self.config.mechanism == "dp-peer"

    def dpsgd(self) -> DPSGD | PeerDP | None:
        """The private gradient every peer of the run computes with (DP-SGD, or the
        peer-level ``dp-peer``), or None."""
        secret = self.config.noise_key == "secret"
        if self.config.mechanism == "dp-peer":
            return PeerDP(self.config.clip, self.config.noise, self.seed, secret)
        if self.config.mechanism != "dp-sgd":
            return None
        return DPSGD(self.config.clip, self.config.noise, self.seed, secret)

    def epsilon(self, rounds: int) -> float:
        """The run's epsilon (its worst peer's) after ``rounds`` rounds."""
        p = self.config
        q = self.worst[1]
        return epsilon(
            [Mechanism(p.noise, q, rounds * self.steps_per_round)], p.delta, p.accountant
        )

    def report(self, rounds_done: int) -> dict[str, Any]:
        """The summary's ``privacy`` block after ``rounds_done`` rounds."""
        p = self.config
        peer, q = self.worst
        eps = self.epsilon(rounds_done)
        out: dict[str, Any] = {
            "mechanism": p.mechanism,
            "epsilon": eps if eps != float("inf") else None,  # JSON has no infinity
            "delta": p.delta,
            "accountant": p.accountant,
            "clip": p.clip,
            "noise": p.noise,
            "steps": rounds_done * self.steps_per_round,
            "sampling_rate": q,
        }
        if self.user_level:
            out["cohort"], out["population"] = self.cohort
        else:
            out["peer"] = peer
            out["sampling_rates"] = [min(self.rates.values()), q]
            out["level"] = "peer" if self.peer_level else "record"
        if p.target_epsilon > 0:
            out["target_epsilon"] = p.target_epsilon
            out["stopped_at_target"] = self.rounds < self.planned_rounds
            out["planned_rounds"] = self.planned_rounds
        return out


def plan_privacy(
    config: PrivacyConfig,
    *,
    nodes: Sequence[str],
    examples: Sequence[int],
    batch_size: int,
    run: RunConfig,
    asynchronous: bool = False,
    gradient_mode: tuple[str, str] = ("batched", ""),
    streamed: bool = False,
    cohort: tuple[int, int] | None = None,
) -> PrivacyPlan | None:
    """The plan of a private run (None for ``mechanism = "none"``): each peer's rate
    from the ``examples`` it holds (in ``nodes``' order; peers of none, a server, hold no
    data to protect), and the rounds of ``run`` within ``target_epsilon``.
    ``gradient_mode``: the run's gradient mode and why
    (:attr:`fedcore.gradients.RowGradient.mode`). ``cohort``: FedAvg's cohort size and
    workers (None: the algorithm is not FedAvg), which DP-FedAvg samples users at.

    Raises:
        ConfigError: what DP-SGD cannot run (an asynchronous algorithm, a model without
            per-example gradients, a stream: no fixed data set to sample from), no peer
            holding data, or a target that not even one round stays within.
    """
    if not config.active:
        return None
    rounds, local_steps, seed = run.rounds, run.local_steps, run.seed
    if config.mechanism == "dp-fedavg":
        if cohort is None:
            raise ConfigError(
                "privacy.mechanism = 'dp-fedavg' clips and noises FedAvg's server step: set "
                "algorithm.name = 'fedavg' (on a star), or use privacy.mechanism = 'dp-sgd'."
            )
        m, n = cohort
        plan = PrivacyPlan(config, {"users": m / n}, 1, rounds, rounds, seed, (m, n))
        return _within_target(plan)
    if asynchronous:
        raise ConfigError(
            f"privacy.mechanism = {config.mechanism!r} runs with the synchronous "
            "algorithms; the asynchronous ones (their event engine and peers) are not "
            "private yet: choose another algorithm.name, or remove the [privacy] table."
        )
    mode, why = gradient_mode
    if mode == "module" and config.mechanism == "dp-sgd":
        why = why or "torch.func cannot map it"
        raise ConfigError(
            f"privacy.mechanism = {config.mechanism!r} needs per-example gradients, which "
            f"this model's gradient mode 'module' cannot give ({why}); "
            "use a model torch.func can map (no BatchNorm: model.norm = 'group')."
        )
    if streamed:
        raise ConfigError(
            f"privacy.mechanism = {config.mechanism!r} needs each peer's fixed data set to "
            "sample batches from, which a data stream (data.stream) has not; remove "
            "data.stream or the [privacy] table."
        )
    if config.mechanism == "dp-peer":  # a peer's whole data, every step: rate 1
        rates = {n: 1.0 for n, k in zip(nodes, examples, strict=True) if k > 0}
    else:
        rates = {n: min(1.0, batch_size / k) for n, k in zip(nodes, examples, strict=True) if k > 0}
    if not rates:
        raise ConfigError("privacy: no peer holds training examples to protect.")
    return _within_target(PrivacyPlan(config, rates, local_steps, rounds, rounds, seed))


def _within_target(plan: PrivacyPlan) -> PrivacyPlan:
    """``plan`` with the rounds within ``target_epsilon`` (itself without a target)."""
    config, local_steps, rounds = plan.config, plan.steps_per_round, plan.planned_rounds
    if config.target_epsilon <= 0:
        return plan
    steps, _ = last_step_within(
        config.noise,
        plan.worst[1],
        rounds * local_steps,
        config.delta,
        config.target_epsilon,
        config.accountant,
    )
    within = steps // local_steps
    if within == 0:
        raise ConfigError(
            f"privacy.target_epsilon = {config.target_epsilon:g} is spent within the first "
            f"round (epsilon {plan.epsilon(1):.4g} after one round at sampling rate "
            f"{plan.worst[1]:.4g}); raise privacy.noise, sample less a step (data.batch_size; "
            "algorithm.fraction for dp-fedavg), or raise the target."
        )
    return dataclasses.replace(plan, rounds=within)
