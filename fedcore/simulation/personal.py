"""A personal model per peer (``[personal]``), made once a run is over and measured on the
peer's own test set beside the model it ended with.

The run trains as it would without ``[personal]``: this module reads the peers' final
models (whatever engine, or gRPC peers, made them) and nothing else, so a run's
parameters, records and digests do not change, and every engine that ends with the same
models reports the same figures.

**The personal model** (``mode = "finetune"``): the peer's final model after ``steps``
plain SGD steps (``w <- w - lr g``, ``g`` the gradient of the mean cross-entropy) on
minibatches of ``data.batch_size`` drawn from its own training part by a stream keyed by
the run's seed and the peer's place in node order (not the run's own batch stream); what a
model draws as it trains (dropout) comes from torch's generator seeded the same way, and
the process's generator is left as it was.

**The peer's own test set**: under a ``natural`` partition with per-peer test sets, its own
test examples (those of its writers); otherwise the whole test split weighted by the peer's
class mix (the share of each class among its training examples): the accuracy is
``sum_c share_c * accuracy on class c``, what a test set drawn from the peer's own label
distribution measures in expectation, without the noise of drawing one. Under a Dirichlet
split a peer that holds two classes is measured on those two.

**The shared model** of a peer is the model it ended with; in the server family (a run
with a ``server``: ``fedavg``, ...) it is the server's final model, the global model a
worker would start its next round from (a FedAvg worker holds the global model of the
last round it was sampled in, or its first model if it never was: not the shared part).

Both models of a peer are measured on the same test set; the figures are the mean and the
worst over the peers (the Byzantine peers and a server left out, and only the
``run.eval_peers`` sample where there is one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedcore.config import NODE_MAPS_NODES
from fedcore.counter_random import make_key
from fedcore.data import BatchStream
from fedcore.metrics import measured_nodes
from fedcore.models import Objective
from fedcore.setup.prepare import RunSetup

__all__ = ["class_mix", "finetune", "personal_figures", "weighted_accuracy"]

_SEED_BITS = (1 << 63) - 1


def finetune(
    objective: Objective, params: torch.Tensor, stream: BatchStream, steps: int, lr: float
) -> torch.Tensor:
    """``params`` after ``steps`` SGD steps of step ``lr`` on the minibatches of ``stream``
    (a new tensor; ``params`` itself unchanged, and so are the buffers of ``objective``'s
    module, which a BatchNorm step updates)."""
    out = params.to(objective.dtype).clone()
    kept = [b.clone() for b in objective.module.buffers()]
    for _ in range(steps):
        x, y = stream.next_batch()
        _, grad = objective.loss_and_grad(out, x, y)
        out = out - lr * grad
    with torch.no_grad():  # BatchNorm's running statistics: the next peer's as they were
        for buffer, value in zip(objective.module.buffers(), kept, strict=True):
            buffer.copy_(value)
    return out


def class_mix(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """Each class's share of ``labels`` (float64 ``[classes]``, summing to 1)."""
    counts = torch.bincount(labels.to(torch.int64), minlength=classes).to(torch.float64)
    return counts / counts.sum()


def weighted_accuracy(
    objective: Objective,
    params: torch.Tensor,
    by_class: Sequence[tuple[torch.Tensor, torch.Tensor]],
    mix: torch.Tensor,
) -> float:
    """``sum_c mix[c] * accuracy on class c``, ``by_class[c]`` the test examples of class
    ``c``; the classes with no test example or no share are left out and the shares of
    the others renormalized."""
    total, weight = 0.0, 0.0
    for c, (x, y) in enumerate(by_class):
        share = float(mix[c])
        if share <= 0 or len(y) == 0:
            continue
        total += share * objective.evaluate(params, x, y)[1]
        weight += share
    return total / weight if weight > 0 else float("nan")


def _mean_and_worst(values: Sequence[float]) -> dict[str, float]:
    """``{"mean": ..., "worst": ...}`` of ``values`` (NaN where there are none)."""
    if not values:
        return {"mean": math.nan, "worst": math.nan}
    return {"mean": sum(values) / len(values), "worst": min(values)}


def personal_figures(
    setup: RunSetup,
    final: Mapping[str, torch.Tensor],
    *,
    nodes: Sequence[str],
    server: str | None = None,
    liars: frozenset[str] = frozenset(),
    sample: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The summary's ``personal`` block of a run whose peers ended with the models
    ``final``: each peer's shared model (its final one) and personal model on its own test
    set, and their mean and worst over the peers ``nodes`` (node order; ``server``,
    ``liars`` and the ``run.eval_peers`` ``sample`` as the run's evaluation has them; a
    ``server``'s final model is every worker's shared model, see the module docstring). A
    peer none of whose classes has a test example is left out of the figures and named
    under ``unmeasured``."""
    config = setup.config
    personal = config.personal
    lr = personal.lr or setup.options.lr
    objective = setup.evaluator
    dataset = setup.dataset
    x_test, y_test = dataset.x_test, dataset.y_test
    own = setup.own_tests()
    classes = int(max(int(dataset.y_train.max()), int(y_test.max()))) + 1
    by_class = [(x_test[y_test == c], y_test[y_test == c]) for c in range(classes)]
    place = {n: i for i, n in enumerate(setup.graph.nodes)}
    key = make_key("fedcore.personal", config.run.seed)

    def accuracy(params: torch.Tensor, peer: str, mix: torch.Tensor) -> float:
        if own is not None:
            at = torch.as_tensor(own[peer], dtype=torch.int64)
            return objective.evaluate(params, x_test[at], y_test[at])[1]
        return weighted_accuracy(objective, params, by_class, mix)

    shared: list[float] = []
    mine: list[float] = []
    peers = measured_nodes(nodes, server, liars, sample)  # as the run's evaluations
    # the server family: every worker's shared model is the server's (the global model)
    glob = final.get(server) if server is not None else None
    for peer in peers:
        i = place[peer]
        idx = torch.as_tensor(setup.parts[i], dtype=torch.int64)
        x, y = dataset.x_train[idx], dataset.y_train[idx]
        mix = class_mix(y, classes)
        start = (final[peer] if glob is None else glob).to(objective.dtype)
        shared.append(accuracy(start, peer, mix))
        stream = BatchStream(
            x,
            y,
            batch_size=config.data.batch_size,
            seed=make_key("fedcore.personal.peer", key, i) & _SEED_BITS,
        )
        with torch.random.fork_rng(devices=[]):  # a model that draws (dropout): keyed
            torch.manual_seed(make_key("fedcore.personal.torch", key, i) & _SEED_BITS)
            tuned = finetune(objective, start, stream, personal.steps, lr)
        mine.append(accuracy(tuned, peer, mix))
    # A peer none of whose classes has a test example has no test set: left out, named.
    unmeasured = [peer for peer, a in zip(peers, shared, strict=True) if math.isnan(a)]
    kept = [k for k, a in enumerate(shared) if not math.isnan(a)]
    out: dict[str, Any] = {
        "mode": personal.mode,
        "steps": personal.steps,
        "lr": lr,
        "batch_size": config.data.batch_size,
        "test_sets": "own" if own is not None else "class mix",
        "peers": len(kept),
        **{
            f"{which}_{figure}_accuracy": value
            for which, values in (("shared", shared), ("personal", mine))
            for figure, value in _mean_and_worst([values[k] for k in kept]).items()
        },
    }
    if unmeasured:
        out["unmeasured"] = unmeasured
    if len(peers) <= NODE_MAPS_NODES:
        out["node_accuracy"] = {
            peer: {"shared": a, "personal": b}
            for peer, a, b in zip(peers, shared, mine, strict=True)
        }
    return out
