"""User-level DP-FedAvg (McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018), with the clipping at the server (as Flower's
server-side fixed clipping): FedAvg (:mod:`fedcore.algorithms.server`) whose server, given
the models ``x_k`` of the round's cohort, steps with

    Delta = (sum_k clip_C(x_k - x) + N(0, sigma^2 C^2 I)) / m,     x <- x + Delta

``x`` the global model the cohort started from, ``clip_C(v) = v min(1, C / ||v||)``, ``m``
the cohort size (a fixed denominator: an absent worker adds nothing, and the noise is
calibrated to one user's whole contribution, C). With a server optimizer, ``-Delta`` is
the difference it steps on. The workers' rule is FedAvg's, unchanged.

Each round is then a Gaussian mechanism over users at noise multiplier sigma, sampled at
rate ``q = m / N`` (the accountant: :mod:`fedcore.privacy.plan`). The server sees every
worker's model before it clips: the guarantee is about the global models (what the
workers and anyone after them see), with the server trusted. The noise is a keyed hash of
``(run seed, server, round, coordinate)`` (:func:`~fedcore.privacy.dpsgd.add_keyed_noise`),
so the engines agree bit for bit.
"""

from __future__ import annotations

import torch

from fedcore.algorithms.inbox import Gathered
from fedcore.algorithms.optim import keep_rows
from fedcore.algorithms.rule import Rows, Send
from fedcore.algorithms.server import FedAvgRule, FedAvgState, cohort_size
from fedcore.counter_random import make_key
from fedcore.privacy.dpsgd import add_keyed_noise, peer_words, secret_word

__all__ = ["DPFedAvgRule", "private_fedavg"]


class DPFedAvgRule(FedAvgRule):
    """FedAvg with user-level differential privacy (see the module docstring); built by
    :func:`private_fedavg` from the run's FedAvg rule."""

    clip: float
    noise: float
    _key: int

    def mix(
        self, state: FedAvgState, phase: int, inbox: Gathered, rows: Rows
    ) -> tuple[FedAvgState, Send | None]:
        """Phase 0 at the server: the clipped, noised mean difference (see the module
        docstring), then the server step; phase 1 as FedAvg."""
        if phase == 1:
            return super().mix(state, phase, inbox, rows)
        x, opt = state.x, state.server_opt
        heard = inbox.heard()
        if not bool(heard.any()):
            return FedAvgState(x, opt), Send({"x": x})
        models = inbox.tensors["x"]
        delta = models.to(torch.float64) - x[inbox.dst].to(torch.float64)
        norms2 = (delta * delta).sum(dim=1)
        over = norms2 > self.clip * self.clip
        factor = torch.where(over, self.clip / norms2.sqrt(), torch.ones_like(norms2))
        total = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
        total.index_add_(0, inbox.dst, delta * factor.unsqueeze(1))
        at = heard.nonzero().squeeze(1)
        noise = torch.zeros(at.numel(), x.shape[1], dtype=torch.float64, device=x.device)
        words = peer_words([rows.ids[i] for i in at.tolist()], x.device)
        add_keyed_noise(noise, self._key, words, rows.round, 0, self.noise * self.clip)
        total[at] += noise
        workers = sum(1 for v in rows.nodes if v != self.server)
        step = (total / cohort_size(workers, self.fraction)).to(x.dtype)
        mask = heard.unsqueeze(1)
        if self._opt is None:
            x = torch.where(mask, x + step, x)
        else:
            before = opt if opt is not None else self._opt.init(x)
            u, after = self._opt.update(-step, before, x, self.server_lr)
            x = torch.where(mask, x - u, x)
            opt = keep_rows(heard, after, before)
        return FedAvgState(x, opt), Send({"x": x})


def private_fedavg(
    rule: FedAvgRule, clip: float, noise: float, seed: int, secret: bool = False
) -> DPFedAvgRule:
    """The run's FedAvg rule ``rule`` (its options as built) with DP-FedAvg's server step;
    ``secret``: its noise keyed with 64 bits from the OS too (``privacy.noise_key``)."""
    private = DPFedAvgRule.__new__(DPFedAvgRule)
    private.__dict__.update(vars(rule))
    private.clip, private.noise = float(clip), float(noise)
    private._key = make_key("fedcore.privacy.dp-fedavg", seed, *secret_word(secret))
    return private
