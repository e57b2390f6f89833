"""What a rank's rows do before they communicate in a round of a sharded run: the gradients
of their batches, a node optimizer's direction (``[optimizer]``), and the local steps
between communications (``run.local_steps``), exactly as the one-process vectorized engine
runs them for the same rows (:meth:`fedcore.engines.vectorized.VectorizedNetwork.run_round`).

Every one of these is a function of a row's own state and batch: an optimizer's update is
elementwise per row (its norms run over a row's own layers), a local step is the rule's
``local_step`` (or ``x <- x - lr * u``) of the row alone. So a row ends the same, bit for
bit, whichever rank holds it. A crashed row reads no batch, its optimizer state stays as
it was, and it takes no local step.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from fedcore.algorithms.optim import Optimizer, keep_rows
from fedcore.algorithms.rule import Rows, Rule
from fedcore.engines.shard_faults import keep_up

__all__ = ["LocalRows", "train_rows"]


class LocalRows(Protocol):
    """What :func:`train_rows` reads and sets of a rank's block
    (:class:`~fedcore.engines.sharded.ShardedNetwork`)."""

    rule: Rule
    state: Any
    optimizer: Optimizer | None
    opt_state: Any
    local_steps: int

    def _gradients(
        self, params: torch.Tensor, up: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def _rows(self, t: int, lr: float, up: torch.Tensor, compressed: set[int]) -> Rows: ...


def step_lr(net: LocalRows, lr: float) -> float:
    """The step size the rule's steps take: ``lr``, or 1 with a node optimizer (whose
    direction ``u`` already holds the learning rate)."""
    return lr if net.optimizer is None else 1.0


def train_rows(net: LocalRows, t: int, lr: float, up: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The losses (float64, ``[B]``; NaN for a crashed row, the mean over the local steps)
    and the direction the round's own step takes (``[B, d]``: the gradient, or the
    optimizer's ``u``) of round ``t``, after its first ``run.local_steps - 1`` steps;
    ``up`` (``[B]`` bool) says which rows run the round. Sets ``net.state`` (the local
    steps) and ``net.opt_state``."""
    optimizer = net.optimizer
    steps = net.local_steps
    every = bool(up.all())
    total: torch.Tensor | None = None
    for k in range(steps):  # as the one-process engine: the last step is the rule's own
        params = net.rule.model(net.state)
        loss, grad = net._gradients(params, up)
        if optimizer is not None:
            u, opt_state = optimizer.update(grad, net.opt_state, params, lr)
            net.opt_state = opt_state if every else keep_rows(up, opt_state, net.opt_state)
            grad = u if every else torch.where(up.unsqueeze(1), u, 0.0)
        if steps > 1:
            total = loss if total is None else total + loss
        if k + 1 < steps:
            net.state = keep_up(up, _local_step(net, t, step_lr(net, lr), up, grad), net.state)
    if total is not None:
        loss = total / steps
    return loss, grad


def _local_step(net: LocalRows, t: int, lr: float, up: torch.Tensor, grad: torch.Tensor) -> Any:
    """One local step of the rows (the rule's ``local_step``, else ``x <- x - lr * grad``)."""
    own = net.rule.local_step
    if own is not None:
        return own(net.state, grad, net._rows(t, lr, up, set()))
    return net.state._replace(x=net.state.x - lr * grad)
