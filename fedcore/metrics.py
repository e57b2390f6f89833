"""Run-level measurements: accuracy of the average model and of each node, consensus
distance, parameter digests, and the ``metrics.jsonl`` writer.

Definitions (every run reports them the same way):

* **average model**: ``x_bar = (1/n) sum_i m_i`` where ``m_i`` is node ``i``'s model
  (the de-biased ``z_i`` for push-sum); its test accuracy is ``avg_model_accuracy``.
* **mean node accuracy**: the mean over nodes of each node's own model's test accuracy;
  under label skew this is what a peer actually gets.
* **consensus distance**: ``(1/n) sum_i ||m_i - x_bar||_2``.
* **average loss**: the mean, over every node and every round so far, of the training
  loss a node suffered on its minibatch *before* its update (the online average loss).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from fedcore.models import Objective

__all__ = ["JsonlWriter", "consensus_distance", "evaluate_models", "params_sha256"]


def consensus_distance(models: Sequence[torch.Tensor]) -> float:
    """``(1/n) sum_i ||m_i - mean||_2``."""
    stacked = torch.stack([m.to(torch.float64) for m in models])
    return float((stacked - stacked.mean(dim=0)).norm(dim=1).mean())


def evaluate_models(
    objective: Objective, models: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> dict[str, Any]:
    """Accuracy and loss of the average model and of every node's model on ``(x, y)``."""
    tensors = list(models.values())
    average = torch.stack(tensors).mean(dim=0)
    avg_loss, avg_acc = objective.evaluate(average, x, y)
    node_acc = {nid: objective.evaluate(m, x, y)[1] for nid, m in models.items()}
    return {
        "avg_model_accuracy": avg_acc,
        "avg_model_test_loss": avg_loss,
        "mean_node_accuracy": sum(node_acc.values()) / len(node_acc),
        "min_node_accuracy": min(node_acc.values()),
        "consensus_distance": consensus_distance(tensors),
        "node_accuracy": node_acc,
    }


def params_sha256(params: torch.Tensor) -> str:
    """Hex SHA-256 of ``params`` as float32 little-endian bytes."""
    array = params.detach().to(torch.float32).contiguous().numpy().astype("<f4", copy=False)
    return hashlib.sha256(array.tobytes()).hexdigest()


class JsonlWriter:
    """Appends one JSON object per line, flushing often so a crash loses little."""

    def __init__(self, path: Path) -> None:
        """Open ``path`` for writing (truncating it)."""
        self.path = path
        self._fh: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._pending = 0

    def write(self, record: Mapping[str, Any]) -> None:
        """Write one record."""
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._pending += 1
        if self._pending >= 256:
            self.flush()

    def flush(self) -> None:
        """Push buffered lines to the file."""
        self._fh.flush()
        self._pending = 0

    def close(self) -> None:
        """Flush and close."""
        self._fh.close()
