"""``fedcore plot``: compare runs at a glance.

Four panels: training loss and test accuracy, each against rounds and against bytes sent
per node, and two against virtual seconds where the runs have virtual time (``[time]``).
The training loss is every round's (the ``"kind": "round"`` records of ``metrics.jsonl``:
one a round, however many peers), the accuracy the evaluations'; in the
accuracy panels the solid line is the average model and the dashed line the mean of the
peers' own models. Runs with regret records (``run.regret``) add two panels against
rounds: the average static regret ``R_t / (n t)`` and the average dynamic regret (where
the stream has a comparator).

Each curve has its own colour, marker and line style, and is labelled by what differs
between the runs (:func:`default_labels`: algorithm, codec, graph, engine, other config
keys), or, with ``label``, by the value of a key of its ``config.toml``. Runs of one config
on different engines (the message and the vectorized engine, ``simulate`` and ``launch``)
never share a label: where theirs would be the same, each says its engine
(:func:`run_engine`). The title names the runs' config, algorithm and graph
(:func:`default_title`). The bytes axes go log by themselves when the runs' bytes differ
more than ten times.

A sweep folder (one holding ``sweep.json``, see :mod:`fedcore.simulation.sweep`) stands for
its completed runs. With ``bands``, runs whose ``config.toml`` differ only in ``run.seed``
(and ``run.name``), and that ran on the same engine, become one curve: their mean, in a
band of +- one (sample) standard deviation, at the rounds every run of the group reached.
A grid folder (its ``sweep.json`` of kind ``grid``, see :mod:`fedcore.simulation.grid`)
stands for its cells' runs, labelled by the grid's keys.

The package: :mod:`~fedcore.plotting.runs` reads run, sweep and grid folders,
:mod:`~fedcore.plotting.labels` names the curves and the figure,
:mod:`~fedcore.plotting.curves` turns runs into the curves to draw, and
:mod:`~fedcore.plotting.figure` draws them (:func:`plot_runs`).
"""

from __future__ import annotations

from fedcore.plotting.figure import LEGEND_OUTSIDE, curve_style, plot_runs
from fedcore.plotting.labels import (
    curve_labels,
    default_labels,
    default_title,
    run_engine,
    seed_groups,
    strip_seed,
)
from fedcore.plotting.runs import (
    RunRecords,
    config_value,
    expand_runs,
    grid_keys,
    load_evals,
    load_records,
    load_run,
    load_run_config,
)

__all__ = [
    "LEGEND_OUTSIDE",
    "RunRecords",
    "config_value",
    "curve_labels",
    "curve_style",
    "default_labels",
    "default_title",
    "expand_runs",
    "grid_keys",
    "load_evals",
    "load_records",
    "load_run",
    "load_run_config",
    "plot_runs",
    "run_engine",
    "seed_groups",
    "strip_seed",
]
