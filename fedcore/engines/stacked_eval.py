"""Evaluation of stacked peers' models, in one process or split over ranks.

An evaluation (:func:`~fedcore.metrics.evaluation_record`) has three parts, and only the
first reads every peer's model at once:

1. **the average model** ``mean_i m_i``, from exact column sums
   (:func:`~fedcore.evaluation.column_sums`): a rank sums its own rows, the ranks' sums are
   added (integers: any order gives the same sums), and every rank holds the same mean;
2. **each peer's figures**: its accuracy on the test set (the costly part: ``N x B x C``
   logits, in batched passes of bounded memory, :func:`~fedcore.evaluation.row_figures`)
   and its distance to the mean, computed where its row lives (:func:`row_figures_of`);
   with ``run.eval_peers`` only the sampled peers' accuracy is taken;
3. **the record** (:func:`record_of`), made where the figures meet: the average model's
   loss and accuracy (one model), the mean and worst of the peers' accuracies in node
   order, the mean distance.

Each peer's figures are a function of its own row only, and the sums are exact, so one
process and any number of ranks give the same record, bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fedcore.adversary import byzantine
from fedcore.evaluation import exact_mean, row_figures
from fedcore.metrics import eval_peers_sample, evaluation_record, own_test_accuracy
from fedcore.setup.prepare import RunSetup
from fedcore.stacked_training import StackedObjective

__all__ = ["PICK_ROWS", "evaluate_rows", "record_of", "row_figures_of", "sample_of"]

_CPU = torch.device("cpu")

PICK_ROWS = 1 << 14
"""Sampled rows copied out of the stack at a time (:func:`row_figures_of`)."""


def sample_of(setup: RunSetup, population: int) -> torch.Tensor | None:
    """The places (in node order, the server left out) of the peers ``run.eval_peers``
    samples among ``population``; ``None`` for all of them."""
    run = setup.config.run
    return eval_peers_sample(run.seed, population, run.eval_peers)


@torch.no_grad()
def row_figures_of(
    setup: RunSetup,
    objective: StackedObjective,
    ids: Sequence[str],
    params: torch.Tensor,
    mean: torch.Tensor,
    pick: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accuracy, distance)`` of each row of ``params`` (the models of the peers
    ``ids``), both ``[M]`` float64 on the CPU: its test accuracy (NaN for a row not in
    ``pick``, local row indices, sorted; ``None``: every row) and its distance to
    ``mean``."""
    device = params.device
    x, y = setup.dataset.x_test, setup.dataset.y_test
    xd, yd = x.to(device), y.to(device)
    rows = objective.rows
    total = params.shape[0]
    own = setup.own_tests()
    fused = pick is None and own is None and objective.mode != "module"
    if fused:  # accuracy and distance in one pass
        acc, norms = row_figures(rows, params, xd, yd, mean=mean)
        return acc.cpu(), norms.cpu()
    _, norms = row_figures(rows, params, xd, yd, mean=mean, accuracy=False)
    acc = torch.full((total,), float("nan"), dtype=torch.float64, device=_CPU)
    chosen = torch.arange(total, device=_CPU) if pick is None else pick
    for start in range(0, len(chosen), PICK_ROWS):
        at = chosen[start : start + PICK_ROWS]
        some = params.index_select(0, at.to(device))
        if own is not None:  # per-node test sets: node by node
            parts = [own[ids[i]] for i in at.tolist()]
            mine = own_test_accuracy(setup.evaluator, list(some.cpu()), x, y, parts)
            acc[at] = torch.tensor(mine, dtype=torch.float64, device=_CPU)
        elif objective.mode == "module":
            acc[at] = objective.accuracy(some, xd, yd).cpu().to(torch.float64)
        else:
            acc[at] = row_figures(rows, some, xd, yd, mean=None)[0].cpu()
    return acc, norms.cpu()


def record_of(
    setup: RunSetup,
    nodes: Sequence[str],
    average: torch.Tensor,
    acc: torch.Tensor,
    norms: torch.Tensor,
    sample: torch.Tensor | None,
) -> dict[str, Any]:
    """The evaluation record of the peers ``nodes`` (node order) from each one's
    ``acc`` and ``norms`` (:func:`row_figures_of`, every row in node order), the
    ``average`` model and the ``sample`` (:func:`sample_of`)."""
    x, y = setup.dataset.x_test, setup.dataset.y_test
    avg_loss, avg_acc = setup.evaluator.evaluate(average.cpu(), x, y)
    distance = float(norms.mean())
    names = list(nodes)
    if sample is not None:
        acc = acc[sample]
        names = [names[i] for i in sample.tolist()]
    return evaluation_record(
        avg_acc,
        avg_loss,
        names,
        acc.tolist(),
        distance,
        own=setup.own_tests() is not None,
        sampled=None if sample is None else (len(names), len(nodes)),
    )


def evaluate_rows(
    setup: RunSetup,
    objective: StackedObjective,
    nodes: Sequence[str],
    params: torch.Tensor,
) -> dict[str, Any]:
    """:func:`~fedcore.metrics.evaluate_models` of every row of ``params`` (the models of
    ``nodes``, in one process): the average model's loss and accuracy, each peer's accuracy
    (of the ``run.eval_peers`` sample), the consensus distance."""
    server = setup.algorithm.server
    average: torch.Tensor | None = None
    if server is not None and server in nodes:
        # As evaluate_models: the server's model is the "average model"; the per-node
        # figures are the workers' alone.
        at = list(nodes).index(server)
        average = params[at]
        keep = [i for i in range(len(nodes)) if i != at]
        params = params[torch.tensor(keep, device=params.device)]
        nodes = tuple(nodes[i] for i in keep)
    liars = set(byzantine(setup.config.adversary, setup.config.run.seed, nodes, server))
    if liars:  # as evaluate_models: the honest peers' figures alone
        keep = [i for i, v in enumerate(nodes) if v not in liars]
        params = params[torch.tensor(keep, device=params.device)]
        nodes = tuple(nodes[i] for i in keep)
    mean = exact_mean(params)
    if average is None:
        average = mean.to(params.dtype)
    sample = sample_of(setup, len(nodes))
    acc, norms = row_figures_of(setup, objective, nodes, params, mean, sample)
    return record_of(setup, nodes, average, acc, norms, sample)
