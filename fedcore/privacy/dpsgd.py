"""DP-SGD on each peer (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016):
the gradient a peer steps with is

    g = (sum_b clip_C(g_b) + N(0, sigma^2 C^2 I)) / B,

``g_b`` the gradient of example ``b``'s own loss, ``clip_C(v) = v min(1, C / ||v||)``, ``B``
the examples of the batch. Clipping bounds what one example can change the sum by (C),
and the noise makes each step a Gaussian mechanism of noise multiplier sigma; the
accountant (:mod:`fedcore.privacy.accountant`) composes the steps at sampling rate ``q =
B / examples held``.

The clipped sum comes from the gradient path every engine shares
(:func:`fedcore.gradients.per_example.clipped_sums`); the noise from a keyed hash of
``(run seed, peer, round, local step, pair)``
(:func:`~fedcore.counter_random.gaussian_pair_tensor`: coordinate ``j`` of ``d`` is the
first draw of pair ``j`` below ``ceil(d / 2)``, the second of pair ``j - ceil(d / 2)``
above), never from a shared generator: so a peer draws the same noise alone (a gRPC peer,
the message engine) or stacked with every other (the vectorized engine), and the two
agree bit for bit in the ``batched`` mode. The draws are exact operations only (the same
bits on every device), computed in blocks of :data:`NOISE_BLOCK` pairs that stay in the
CPU's cache (5x faster than one pass over ``[M, d]``).

With ``privacy.noise_key = "seed"`` (the default) the noise is a function of the run's
seed, which every peer of a run knows: it makes a run reproducible, and hides a peer's data
from whoever sees its models without the config (the published model, an eavesdropper),
not from the run's own peers. ``"secret"`` adds 64 bits each process draws from the OS to
the key (:func:`secret_word`): no other peer can redraw the noise, and the run is not
reproducible.
"""

from __future__ import annotations

import os

import torch

from fedcore.counter_random import gaussian_pair_tensor, make_key, signed64, string_id
from fedcore.gradients import RowGradient, row_reduce
from fedcore.gradients.per_example import clipped_sums

__all__ = ["DPSGD", "NOISE_BLOCK", "PeerDP", "add_keyed_noise", "peer_words", "secret_word"]

NOISE_BLOCK = 1 << 16
"""Pairs of Gaussian draws computed at once (their float64 temporaries stay in cache)."""


def peer_words(
    nodes: list[str] | tuple[str, ...], device: torch.device | None = None
) -> torch.Tensor:
    """Each node id's stable 64-bit word (int64), the noise's peer coordinate."""
    return torch.tensor([signed64(string_id(n)) for n in nodes], dtype=torch.int64, device=device)


class DPSGD:
    """The private gradient of stacked rows (see the module docstring).

    Args:
        clip: C, the norm each example's gradient is clipped to.
        noise: sigma, the noise multiplier (0: clipping only).
        seed: The run's seed, which keys the noise.
        secret: Key it with a secret of this process's too (``privacy.noise_key``).
    """

    DOMAIN = "fedcore.privacy.dp-sgd"
    """The noise key's domain (each mechanism draws its own noise)."""

    def __init__(self, clip: float, noise: float, seed: int, secret: bool = False) -> None:
        """Key the noise by the run's seed (and, with ``secret``, 64 bits from the OS)."""
        self.clip = float(clip)
        self.noise = float(noise)
        self.key = make_key(self.DOMAIN, seed, *secret_word(secret))

    def loss_and_grad(
        self,
        rows: RowGradient,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        peers: torch.Tensor,
        round: int,
        step: int,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row mean cross-entropy ``[M]`` and private gradient ``[M, d]`` of rows
        ``params [M, d]`` held by ``peers`` (their :func:`peer_words`, ``[M]``) at local
        step ``step`` of round ``round`` (``x``, ``y``, ``mask`` as
        :meth:`RowGradient.loss_and_grad` takes them)."""
        losses, sums, counts = clipped_sums(rows, params, x, y, self.clip, mask)
        if self.noise > 0:
            scale = self.noise * self.clip
            add_keyed_noise(sums, self.key, peers.to(params.device), round, step, scale)
        sums /= counts.to(sums.dtype).unsqueeze(1)
        return losses, sums


class PeerDP(DPSGD):
    """Peer-level privacy of what a peer sends (``privacy.mechanism = "dp-peer"``): each
    local step, the peer's gradient (its batch's mean) is clipped to norm C and noised,

        g = clip_C(grad f_i(x_i)) + N(0, sigma^2 C^2 I),

    before the rule sees it, so every model it sends (a function of its noised steps and
    of what it received) is a Gaussian mechanism over its *whole* data: against an
    adjacent run in which the peer holds other data or none (a clipped step moves by at
    most C), each step has noise multiplier sigma and sampling rate 1, and the accountant
    composes the steps. What it protects is a peer's data set from its neighbours (who
    see each message), as DP-FedAvg protects a worker's from the server; DP-SGD protects
    one record. The noise is keyed as DP-SGD's (:func:`add_keyed_noise`, another domain).

    Its arguments are :class:`DPSGD`'s, ``clip`` bounding each step's whole gradient.
    """

    DOMAIN = "fedcore.privacy.dp-peer"

    def loss_and_grad(
        self,
        rows: RowGradient,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        peers: torch.Tensor,
        round: int,
        step: int,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row mean loss ``[M]`` and the clipped, noised gradient ``[M, d]`` of rows
        ``params [M, d]`` held by ``peers`` (as :meth:`DPSGD.loss_and_grad`)."""
        losses, grad = rows.loss_and_grad(params, x, y, mask)
        grad = grad.clone()
        norms = _row_norms(grad)
        scale = torch.where(norms > self.clip, self.clip / norms.clamp(min=1e-300), 1.0)
        grad *= scale.to(grad.dtype).unsqueeze(1)
        if self.noise > 0:
            add_keyed_noise(
                grad, self.key, peers.to(params.device), round, step, self.noise * self.clip
            )
        return losses, grad


def _row_norms(values: torch.Tensor) -> torch.Tensor:
    """Each row's Euclidean norm (float64 ``[M]``), a row the same bits alone (a peer) or
    stacked (the vectorized engine)."""
    wide = values.to(torch.float64)
    return row_reduce(wide, int(wide.shape[1]), lambda t: torch.linalg.vector_norm(t, dim=-1))


def secret_word(secret: bool) -> tuple[int, ...]:
    """``(64 bits from the OS,)`` with ``secret`` (``privacy.noise_key = "secret"``), else
    ``()``: the extra coordinate of a noise key."""
    return (int.from_bytes(os.urandom(8), "little"),) if secret else ()


def add_keyed_noise(
    sums: torch.Tensor, key: int, peers: torch.Tensor, round: int, step: int, scale: float
) -> None:
    """``sums [M, d] += scale z`` in place, ``z`` row ``i``'s standard normal draws keyed
    by ``(key, peers[i], round, step, pair)`` (see the module docstring), in blocks of
    :data:`NOISE_BLOCK` pairs."""
    m, d = sums.shape
    half = (d + 1) // 2
    width = min(half, NOISE_BLOCK)
    rows = max(1, NOISE_BLOCK // width)
    for c0 in range(0, half, width):
        c1 = min(half, c0 + width)
        pairs = torch.arange(c0, c1, dtype=torch.int64, device=sums.device)
        second = min(d, half + c1) - (half + c0)  # pairs whose second draw is used
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            first, other = gaussian_pair_tensor(key, peers[r0:r1, None], round, step, pairs)
            sums[r0:r1, c0:c1] += first.mul_(scale).to(sums.dtype)
            if second > 0:
                block = other[:, :second].mul_(scale).to(sums.dtype)
                sums[r0:r1, half + c0 : half + c0 + second] += block
