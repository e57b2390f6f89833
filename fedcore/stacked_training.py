"""Many nodes' models at once, for the vectorized engine.

:class:`StackedObjective`: the loss and gradient of ``N`` models in one call, from their
parameters stacked as ``[N, d]`` (each row the flat vector a per-node
:class:`~fedcore.models.Objective` holds), through the same
:class:`~fedcore.gradients.RowGradient` code a peer runs on its one row; and every row's
accuracy. :attr:`StackedObjective.mode` says how the run computes gradients (batched
layers, vmap, or the module row by row), and :attr:`why` why. (Every node's minibatches at
once are data: :class:`fedcore.data.StackedBatches`.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from fedcore.evaluation import row_accuracy
from fedcore.gradients import RowGradient
from fedcore.models import Objective

__all__ = ["StackedObjective"]

logger = logging.getLogger(__name__)


class StackedObjective:
    """Loss, gradient and accuracy of ``N`` stacked models (see the module docstring).

    Args:
        make: A fresh per-node objective (the run's model, same initialization, and the
            run's gradient mode).
        device: Where the stacked parameters and batches live.
        evaluator: The run's evaluating objective, which mode ``"module"`` evaluates every
            node's model with (as the message engine does; a model's buffers, such as
            BatchNorm statistics, are then the evaluator's).
    """

    def __init__(
        self,
        make: Callable[[], Objective],
        device: torch.device,
        evaluator: Objective | None = None,
    ) -> None:
        """Take the model's layout and the run's gradient mode from one objective."""
        self._make = make
        self.device = device
        template = self._build()
        self.dtype = template.dtype
        self.numel = template.numel
        self.mode = template.rows.mode
        self.why = (evaluator or template).rows.why  # the run decided on the evaluator
        self._evaluator = evaluator
        if self.mode == "module":
            self.rows = template.rows
        else:
            module = self._build().module.to(device)
            self.rows = RowGradient(
                module, self.dtype, template.module_loss_and_grad, mode=self.mode
            )

    def _build(self) -> Objective:
        """A per-node objective, built on the CPU (as the message engine builds it)."""
        with torch.device("cpu"):
            return self._make()

    def loss_and_grad(
        self,
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row mean cross-entropy ``[M]`` and gradient ``[M, d]``
        (:meth:`~fedcore.gradients.RowGradient.loss_and_grad`)."""
        return self.rows.loss_and_grad(params, x, y, mask)

    @torch.no_grad()
    def accuracy(self, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Accuracy ``[M]`` (float64) of every row of ``params`` on the test set ``(x, y)``."""
        out = torch.empty(params.shape[0], dtype=torch.float64, device=params.device)
        if self.mode == "module":
            # As the message engine evaluates: with the run's evaluator for every node.
            if self._evaluator is None:
                self._evaluator = self._build()
            objective = self._evaluator
            for i in range(params.shape[0]):
                out[i] = objective.evaluate(params[i].cpu(), x.cpu(), y.cpu())[1]
            return out
        return row_accuracy(self.rows, params, x, y)
