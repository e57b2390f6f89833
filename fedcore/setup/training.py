"""The training half of a run's set-up: its data (a dataset split across the nodes, or
one online stream for all) and its model (built, probed, as a flat-parameter objective).

The data steps read :class:`TrainingInputs` (``[data]`` and what of ``[run]`` and
``[algorithm]`` a split or a stream needs), the model steps ``[model]`` and ``run.seed``.

Nothing here builds a graph: a run's :class:`~fedcore.setup.plan.Shape` (how many nodes,
where a server sits) is all the split needs, so a split that cannot be made (a Dirichlet
one over too many nodes, say) is refused before the graph is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedcore import registry
from fedcore.config import Config, DataConfig, ModelConfig
from fedcore.data import (
    Dataset,
    check_partition_size,
    load_dataset,
    own_test_parts,
    partition,
    training_examples,
)
from fedcore.errors import DataError
from fedcore.gradients import model_input
from fedcore.ids import error_text
from fedcore.models import Objective, build_model
from fedcore.setup.plan import Laps, ModelSize, Shape
from fedcore.streams import OnlineSource, load_source

logger = logging.getLogger(__name__)

__all__ = [
    "TrainingData",
    "TrainingInputs",
    "build_evaluator",
    "load_training_data",
    "make_objective",
    "model_size",
]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(slots=True)
class TrainingData:
    """A run's data.

    Attributes:
        dataset: The dataset (with its test split); a stream's own for an online run.
        parts: Per node in graph order, the indices of its training examples (empty for
            a server, and for every node of a stream, which holds its own data).
        source: The online stream of ``data.stream``, or ``None``.
        test_parts: Per node in graph order, the indices of its own test examples (a
            ``natural`` partition of data whose every test writer has training data:
            :func:`~fedcore.data.own_test_parts`), or ``None``: every node is evaluated on
            the whole test split.
    """

    dataset: Dataset
    parts: list[Any]
    source: OnlineSource | None
    test_parts: list[Any] | None = None


@dataclass(frozen=True, slots=True)
class TrainingInputs:
    """What the data steps (:func:`load_training_data`) read of a config (:meth:`of`).

    Attributes:
        data: ``[data]``: the dataset or stream, and how it is split.
        seed: ``run.seed``, which seeds the split and the stream.
        rounds: ``run.rounds``, the length of a stream.
        lr_scaling: ``algorithm.lr_scaling``, which the warning of a too large batch names.
    """

    data: DataConfig
    seed: int
    rounds: int
    lr_scaling: str

    @classmethod
    def of(cls, config: Config) -> TrainingInputs:
        """The data steps' part of ``config``."""
        return cls(config.data, config.run.seed, config.run.rounds, config.algorithm.lr_scaling)


def load_training_data(
    inputs: TrainingInputs,
    shape: Shape,
    *,
    dataset: Dataset | None = None,
    laps: Laps | None = None,
) -> TrainingData:
    """The stream of ``data.stream``, or ``dataset`` (default: ``data.dataset``, loaded)
    split across the run's data holders.

    Raises:
        DataError, ConfigError: an unknown dataset or stream, or a split that cannot be made.
    """
    laps = laps or Laps()
    data = inputs.data
    if data.stream:
        source = _stream(inputs, shape.nodes)
        laps.done("made the stream %s for %d nodes", data.stream, shape.nodes)
        # Streams hold their own data: one shared empty part, not an array per node.
        return TrainingData(source.dataset, [np.zeros(0, dtype=np.int64)] * shape.nodes, source)
    if dataset is None:
        known = training_examples(data.dataset, test_fraction=data.test_fraction)
        if known is not None:  # refuse too many nodes before even loading the data
            check_partition_size(
                known,
                shape.holders,
                data.partition,
                shards_per_node=data.shards_per_node,
                examples_per_node=data.examples_per_node,
            )
        dataset = load_dataset(
            data.dataset, seed=inputs.seed, test_fraction=data.test_fraction, root=data.root
        )
        laps.done("loaded dataset %s: %d training examples", dataset.name, len(dataset.y_train))
    parts = _split(inputs, dataset, shape)
    laps.done("split the data %s across %d nodes", data.partition, shape.holders)
    return TrainingData(dataset, parts, None, _own_tests(inputs, dataset, shape))


def _own_tests(inputs: TrainingInputs, dataset: Dataset, shape: Shape) -> list[Any] | None:
    """Each node's own test examples (see :class:`TrainingData`), the server's empty."""
    if inputs.data.partition != "natural" or dataset.groups_train is None:
        return None
    assert dataset.groups_test is not None
    parts = own_test_parts(
        dataset.groups_train, dataset.groups_test, shape.holders, seed=inputs.seed
    )
    if parts is None:
        logger.info(
            "some test writers of %s have no training data (a split by writer), or some "
            "node has no test example: every node is evaluated on the whole test split",
            dataset.name,
        )
        return None
    if shape.server_at is not None:
        parts.insert(shape.server_at, np.zeros(0, dtype=np.int64))
    return parts


def _stream(inputs: TrainingInputs, nodes: int) -> OnlineSource:
    data = inputs.data
    options: dict[str, Any] = {}
    if data.stream == "synthetic":
        options = {
            "features": data.features,
            "adversarial": data.adversarial,
            "noise": data.noise,
            "drift": data.drift,
        }
    return load_source(
        data.stream,
        nodes=nodes,
        rounds=inputs.rounds,
        batch_size=data.batch_size,
        seed=inputs.seed,
        options=options,
    )


def _split(inputs: TrainingInputs, dataset: Dataset, shape: Shape) -> list[Any]:
    """Each data holder's example indices, with an empty part at the server's place."""
    data = inputs.data
    parts = partition(
        dataset.y_train,
        shape.holders,
        data.partition,
        seed=inputs.seed,
        alpha=data.alpha,
        shards_per_node=data.shards_per_node,
        groups=dataset.groups_train,
        examples_per_node=data.examples_per_node,
    )
    smallest = min(len(p) for p in parts)
    if data.batch_size > smallest:
        # Said once a set-up (a warning: the batches are not the size asked for). Under
        # lr_scaling the step size assumes batches of data.batch_size: say that too.
        scaled = inputs.lr_scaling != "none"
        logger.warning(
            "data.batch_size = %d is larger than the %d training examples of the smallest "
            "peer; a peer with fewer examples than that uses all of its own as its batch "
            "(used: %d for the smallest)%s",
            data.batch_size,
            smallest,
            smallest,
            "; algorithm.lr_scaling still scales by data.batch_size" if scaled else "",
        )
    if shape.server_at is not None:
        parts.insert(shape.server_at, np.zeros(0, dtype=np.int64))
    return parts


def make_objective(
    model: ModelConfig, seed: int, dataset: Dataset, gradient_mode: str | None = None
) -> Objective:
    """The model of ``[model]``, initialized from ``seed`` (``run.seed``), as a
    flat-parameter objective.

    ``gradient_mode`` (:data:`~fedcore.gradients.GRADIENT_MODES`): how its gradients are
    computed; ``None`` decides it on the first training examples (once a run: every peer
    and engine then reuses the run's decision, :meth:`RunSetup.objective`)."""
    options = dict(model.options)
    if model.name in registry.MODELS and "hidden" in registry.MODELS.entry(model.name).keys:
        options["hidden"] = model.hidden
    module = build_model(
        model.name,
        input_dim=dataset.input_dim,
        num_classes=dataset.num_classes,
        seed=seed,
        **options,
    )
    sample = None if gradient_mode is not None else (dataset.x_train[:6], dataset.y_train[:6])
    return Objective(module, _DTYPES[model.dtype], gradient_mode=gradient_mode, sample=sample)


def build_evaluator(model: ModelConfig, seed: int, dataset: Dataset) -> Objective:
    """The run's model (``[model]``, initialized from ``seed``) as an objective, probed on
    two examples of ``dataset`` (a broken model fails here, clearly); it decides how the
    run computes gradients."""
    evaluator = make_objective(model, seed, dataset)
    _probe(evaluator, dataset, model.name)
    return evaluator


def model_size(objective: Objective) -> ModelSize:
    """The parameter count and bytes per parameter of ``objective``'s model."""
    itemsize = torch.empty((), dtype=objective.dtype).element_size()
    return ModelSize(params=objective.initial_params().numel(), itemsize=itemsize)


def _probe(objective: Objective, dataset: Dataset, name: str) -> None:
    """Run the model once on two examples so a broken model fails here, clearly."""
    x, y = dataset.x_train[:2], dataset.y_train[:2]
    try:
        logits = objective.module(model_input(x, objective.dtype))
    except Exception as exc:  # a user model can raise anything; report it as a config error
        raise DataError(
            f"model {name!r} failed on a batch of dataset {dataset.name!r}: {error_text(exc)}"
        ) from exc
    if not isinstance(logits, torch.Tensor):
        raise DataError(
            f"model {name!r} maps a batch of 2 examples to a {type(logits).__name__}; "
            f"expected (2, {dataset.num_classes}) class logits as a tensor."
        )
    if tuple(logits.shape) != (2, dataset.num_classes):
        raise DataError(
            f"model {name!r} maps a batch of 2 examples to shape {tuple(logits.shape)}; "
            f"expected (2, {dataset.num_classes}) class logits."
        )
    try:
        objective.loss_and_grad(objective.initial_params(), x, y)
    except Exception as exc:  # its backward pass, say
        raise DataError(
            f"model {name!r} failed to give a loss and gradient on a batch of dataset "
            f"{dataset.name!r}: {error_text(exc)}"
        ) from exc
