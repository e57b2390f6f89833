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
  It is not a regret: nothing is subtracted (public OPS/DOG code plots it as "regret").

Online learning (node ``i`` suffers ``f_{i,t}(x_{i,t})``: the mean loss of its round-``t``
batch at its model *before* the round's update; ``n`` nodes, rounds ``t = 0..T-1``):

* **static regret** ``R_T = sum_{t,i} f_{i,t}(x_{i,t}) - min_x sum_{t,i} f_{i,t}(x)``:
  against the best single model in hindsight for the whole network's stream, found by
  :func:`minimize` (L-BFGS to a gradient tolerance; exact for convex losses such as
  logistic regression, a lower bound on the regret otherwise).
* **dynamic regret** ``R^dyn_T = sum_{t,i} f_{i,t}(x_{i,t}) - sum_{t,i} f_{i,t}(x*_t)``:
  against a comparator sequence ``x*_t`` the stream knows (its path length
  ``sum_t ||x*_{t+1} - x*_t||`` bounds how fast it drifts).
* **average regret**: ``R_T / (n T)``, comparable across network sizes and horizons.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from fedcore.config import NODE_MAPS_NODES
from fedcore.errors import ConfigError
from fedcore.evaluation import eval_sample, exact_mean, row_accuracy
from fedcore.models import Objective

__all__ = [
    "JsonlWriter",
    "ParamDigests",
    "all_params_sha256",
    "check_eval_peers",
    "consensus_distance",
    "dynamic_regret",
    "eval_peers_sample",
    "evaluate_models",
    "evaluation_record",
    "measured_nodes",
    "minimize",
    "own_test_accuracy",
    "params_sha256",
    "round_record",
    "static_regret",
    "strict_json",
    "to_json_text",
    "write_text_atomic",
]


def consensus_distance(models: Sequence[torch.Tensor]) -> float:
    """``(1/n) sum_i ||m_i - mean||_2``, the mean from exact sums
    (:func:`~fedcore.evaluation.exact_mean`)."""
    stacked = torch.stack(list(models))
    mean = exact_mean(stacked)
    return float((stacked.to(torch.float64) - mean).norm(dim=1).mean())


def measured_nodes(
    nodes: Iterable[str],
    server: str | None = None,
    liars: Collection[str] = (),
    sample: torch.Tensor | None = None,
) -> list[str]:
    """The nodes whose own models an evaluation measures, in ``nodes``' order: not the
    server family's ``server``, not the Byzantine ``liars``, and of the rest only the
    places ``sample`` (:func:`eval_peers_sample`) names, if given."""
    evaluated = [n for n in nodes if n != server and n not in liars]
    return evaluated if sample is None else [evaluated[i] for i in sample.tolist()]


def eval_peers_sample(seed: int, population: int, eval_peers: int | str) -> torch.Tensor | None:
    """The peers whose own models an evaluation measures (``run.eval_peers``): ``None`` for
    ``"all"``, else the sorted places in node order of a seeded sample of ``eval_peers`` of
    the ``population`` peers evaluated (:func:`~fedcore.evaluation.eval_sample`).

    Raises:
        ConfigError: more peers than the population (one line)."""
    check_eval_peers(eval_peers, population)
    if not isinstance(eval_peers, int):
        return None
    return eval_sample(seed, population, eval_peers)


def check_eval_peers(eval_peers: int | str, population: int) -> None:
    """Refuse ``run.eval_peers`` above the ``population`` of peers whose own models are
    evaluated (one line).

    Raises:
        ConfigError: more peers than there are."""
    if isinstance(eval_peers, int) and eval_peers > population:
        raise ConfigError(
            f"run.eval_peers = {eval_peers} is more than the {population} peers whose models "
            f'are evaluated; give at most {population}, or "all".'
        )


def evaluate_models(
    objective: Objective,
    models: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    server: str | None = None,
    own_tests: Mapping[str, Any] | None = None,
    sample: torch.Tensor | None = None,
    liars: Collection[str] = (),
) -> dict[str, Any]:
    """Accuracy and loss of the average model and of every node's model on ``(x, y)``.

    ``liars`` (the Byzantine peers of ``[adversary]``) are left out: the average model,
    the per-node figures and the consensus distance are the honest peers'.

    With ``own_tests`` (node id -> indices into ``(x, y)``: per-node test sets), each
    node's accuracy is on its own test examples (:func:`own_test_accuracy`); the average
    model's is on all of them.

    With a ``server`` (the server family), the "average model" is the server's (the global
    model) and the per-node figures are the workers' alone. The nodes' models are evaluated
    together, chunk by chunk, with the consensus distance in the same pass
    (:func:`fedcore.evaluation.stacked_figures`), unless the objective's gradient mode is
    ``module`` (one model at a time, as :meth:`~fedcore.models.Objective.evaluate`).

    With a ``sample`` (:func:`eval_peers_sample`: places in the order of ``models``, the
    server left out), only those nodes' own models are evaluated and the per-node figures
    are theirs, labelled ``eval_peers``; the average model and the consensus distance are
    every node's."""
    if server is not None:
        average = models[server]
        models = {nid: m for nid, m in models.items() if nid != server}
    if liars:
        models = {nid: m for nid, m in models.items() if nid not in liars}
    tensors = list(models.values())
    stacked = torch.stack(tensors)
    mean = exact_mean(stacked)
    if server is None:
        average = mean.to(stacked.dtype)
    avg_loss, avg_acc = objective.evaluate(average, x, y)
    distance = float((stacked.to(torch.float64) - mean).norm(dim=1).mean())
    names = measured_nodes(models, sample=sample)
    if sample is not None:
        tensors = [models[nid] for nid in names]
    label = None if sample is None else (len(names), len(models))
    if own_tests is not None:
        mine = own_test_accuracy(objective, tensors, x, y, [own_tests[nid] for nid in names])
        return evaluation_record(avg_acc, avg_loss, names, mine, distance, own=True, sampled=label)
    if objective.rows.mode == "module":
        accuracy = [objective.evaluate(m, x, y)[1] for m in tensors]
    else:  # every model at once, chunk by chunk (fedcore.evaluation)
        rows = torch.stack([m.to(objective.dtype) for m in tensors])
        accuracy = row_accuracy(objective.rows, rows, x, y).tolist()
    return evaluation_record(avg_acc, avg_loss, names, accuracy, distance, sampled=label)


def evaluation_record(
    avg_acc: float,
    avg_loss: float,
    nodes: Sequence[str],
    accuracy: Sequence[float],
    distance: float,
    *,
    own: bool = False,
    sampled: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """An evaluation's figures (both engines' record): the average model's accuracy and
    loss, the nodes' mean and worst accuracy (``accuracy[i]`` is ``nodes[i]``'s), the
    consensus distance, and each node's accuracy up to
    :data:`~fedcore.config.NODE_MAPS_NODES` nodes. ``sampled``: ``(k, n)`` where the
    nodes are a sample of ``k`` of the ``n`` (``run.eval_peers``): the record says
    ``"eval_peers": {"sampled": k, "of": n}``, so that the per-node figures are never
    read as every node's."""
    out: dict[str, Any] = {
        "avg_model_accuracy": avg_acc,
        "avg_model_test_loss": avg_loss,
        "mean_node_accuracy": sum(accuracy) / len(accuracy),
        "min_node_accuracy": min(accuracy),
        "consensus_distance": distance,
    }
    if sampled is not None:
        out["eval_peers"] = {"sampled": sampled[0], "of": sampled[1]}
    if own:
        out["node_test_sets"] = "own"
    if len(accuracy) <= NODE_MAPS_NODES:
        out["node_accuracy"] = dict(zip(nodes, accuracy, strict=True))
    return out


def own_test_accuracy(
    objective: Objective,
    models: Sequence[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    parts: Sequence[Any],
) -> list[float]:
    """Each model's accuracy on its own test examples ``(x[parts[i]], y[parts[i]])`` (one
    node's small test set at a time: no model's predictions outlive its turn)."""
    out = []
    for params, idx in zip(models, parts, strict=True):
        at = torch.as_tensor(idx, dtype=torch.int64)
        out.append(objective.evaluate(params, x[at], y[at])[1])
    return out


def minimize(
    loss_and_grad: Callable[[torch.Tensor], tuple[float, torch.Tensor]],
    start: torch.Tensor,
    *,
    tol: float = 1e-8,
    max_iter: int = 2000,
) -> tuple[torch.Tensor, float, float]:
    """Minimize a smooth function from ``start`` with L-BFGS (strong Wolfe), in float64.

    ``loss_and_grad(w)`` returns the value and gradient at ``w``. Returns the minimizer,
    the minimum and the final gradient norm (compare it with ``tol`` to know whether the
    tolerance was reached within ``max_iter`` evaluations).
    """
    w = start.detach().to(torch.float64).clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [w],
        lr=1.0,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        tolerance_grad=tol,
        tolerance_change=1e-15,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        value, grad = loss_and_grad(w.detach())
        w.grad = grad.to(torch.float64)
        return torch.tensor(value, dtype=torch.float64)

    optimizer.step(closure)  # type: ignore[no-untyped-call]
    value, grad = loss_and_grad(w.detach())
    return w.detach(), float(value), float(grad.abs().max())


def static_regret(suffered: float, hindsight_minimum: float) -> float:
    """``sum of suffered losses - min_x sum_t f_t(x)`` (see the module docstring)."""
    return suffered - hindsight_minimum


def dynamic_regret(suffered: float, comparator_losses: float) -> float:
    """``sum of suffered losses - sum_t f_t(x*_t)`` (see the module docstring)."""
    return suffered - comparator_losses


def params_sha256(params: torch.Tensor) -> str:
    """Hex SHA-256 of ``params`` as float32 little-endian bytes."""
    return all_params_sha256([params])


def all_params_sha256(params: Iterable[torch.Tensor]) -> str:
    """Hex SHA-256 of every tensor of ``params``, in order, as float32 little-endian bytes
    (one digest for many nodes: :data:`~fedcore.config.NODE_MAPS_NODES`)."""
    digest = hashlib.sha256()
    for p in params:
        array = p.detach().to(torch.float32).contiguous().numpy().astype("<f4", copy=False)
        digest.update(array.tobytes())
    return digest.hexdigest()


class ParamDigests(dict[str, torch.Tensor]):
    """What stands for every node's final parameters where they were hashed where they are
    (a sharded run's ranks, block by block: no process holds every model): no tensor, only
    the summary's digest keys in :attr:`digests` (``params_sha256``, else
    ``params_sha256_all``), the same digests :func:`params_sha256` and
    :func:`all_params_sha256` give of the parameters."""

    def __init__(self, digests: Mapping[str, Any]) -> None:
        super().__init__()
        self.digests = dict(digests)


def round_record(
    round: int,
    *,
    train_loss: float,
    nodes_up: int,
    messages_sent: int,
    bytes_sent: int,
    messages_missing: int,
    messages_dropped: int,
    vtime: float | None = None,
) -> dict[str, Any]:
    """The network-wide line of one round in ``metrics.jsonl`` (``"kind": "round"``): mean
    loss over the nodes that ran it (``null`` when none did), nodes up, messages and bytes
    that went, messages missing at receivers and lost by the fault plan, and (with a
    virtual clock) ``vtime``, the virtual seconds at which the last node ended the round."""
    record: dict[str, Any] = {
        "kind": "round",
        "round": round,
        "train_loss": None if math.isnan(train_loss) else train_loss,
        "nodes_up": nodes_up,
        "messages_sent": messages_sent,
        "bytes_sent": bytes_sent,
        "messages_missing": messages_missing,
        "messages_dropped": messages_dropped,
    }
    if vtime is not None:
        record["vtime"] = vtime
    return record


def strict_json(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, +-inf: a diverged run, a round
    no node ran) replaced by ``None``, in nested dicts, lists and tuples, so that it is
    strict JSON (``null``), which every parser reads."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def to_json_text(value: Any, *, indent: int | None = None) -> str:
    """``value`` as strict JSON text (see :func:`strict_json`); never writes ``NaN``."""
    separators = (",", ":") if indent is None else None
    try:  # most values hold only finite floats: written as they are, no copy first
        return json.dumps(value, indent=indent, separators=separators, allow_nan=False)
    except (ValueError, TypeError):  # a NaN or an infinity (or a mapping json cannot take)
        pass
    return json.dumps(strict_json(value), indent=indent, separators=separators, allow_nan=False)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader (or a
    kill mid-write) sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class JsonlWriter:
    """Appends one JSON object per line, flushing often so a crash loses little."""

    def __init__(self, path: Path, *, append: bool = False) -> None:
        """Open ``path`` for writing (truncating it, unless ``append``)."""
        self.path = path
        mode = "a" if append else "w"
        self._fh: IO[str] = open(path, mode, encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._pending = 0

    def write(self, record: Mapping[str, Any]) -> None:
        """Write one record."""
        self._fh.write(to_json_text(record) + "\n")
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
