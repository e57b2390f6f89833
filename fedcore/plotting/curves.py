"""The curves of ``fedcore plot``: each run's (or each seed group's mean and band) loss,
accuracy, bytes, virtual time and regret, as the panels draw them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from fedcore.ids import clip
from fedcore.plotting.labels import curve_labels, default_title, run_engine, seed_groups
from fedcore.plotting.runs import RunRecords, _optional_config, load_run, load_run_config


def _value(value: Any) -> float:
    """A figure as written (``null``: not a number, a diverged run) as a float to plot."""
    return math.nan if value is None else float(value)


_EVAL_KEYS = (
    "train_loss",
    "avg_model_accuracy",
    "mean_node_accuracy",
    "bytes_sent_per_node",
    "vtime",
)
_REGRET_KEYS = ("average_static_regret", "average_dynamic_regret")


@dataclass
class _Loss:
    """The training loss of every round (the evaluation rounds' in a run without round
    records): 1-based rounds, loss, MB each node had sent by then, the band, and the
    virtual seconds of each point (NaN: a run without virtual time)."""

    rounds: list[float]
    loss: list[float]
    mb: list[float]
    spread: list[float] | None = None
    vtime: list[float] = field(default_factory=list)


def _loss(run: RunRecords, every_round: bool = True) -> _Loss:
    """The run's training loss, from its ``"kind": "round"`` records (one a round, however
    many peers) where it has them and ``every_round``, else from its evaluations.

    A round record counts the bytes all peers sent; the evaluations' bytes per node give
    the divisor (the peer count, a server included; ``summary.json``'s ``nodes`` where no
    evaluation has bytes to go by).
    """
    if not (every_round and run.rounds):
        return _Loss(
            [e["round"] + 1 for e in run.evals],
            [_value(e.get("train_loss")) for e in run.evals],
            [_value(e.get("bytes_sent_per_node")) / 1e6 for e in run.evals],
            vtime=[_value(e.get("vtime")) for e in run.evals],
        )
    total = 0.0
    sent: dict[int, float] = {}
    for record in run.rounds:
        total += float(record.get("bytes_sent") or 0)
        sent[record["round"]] = total
    nodes = run.summary.get("nodes")
    per_node = 1.0 / nodes if isinstance(nodes, int) and nodes > 0 else 1.0
    for e in run.evals:  # the evaluations' own figure, where there is one to go by
        mine, theirs = sent.get(e["round"], 0.0), e.get("bytes_sent_per_node")
        if mine > 0 and isinstance(theirs, int | float) and theirs > 0:
            per_node = theirs / mine
    return _Loss(
        [r["round"] + 1 for r in run.rounds],
        [_value(r.get("train_loss")) for r in run.rounds],
        [sent[r["round"]] * per_node / 1e6 for r in run.rounds],
        vtime=[_value(r.get("vtime")) for r in run.rounds],
    )


@dataclass
class _Curve:
    """One line (or mean with band) of every panel."""

    label: str
    rounds: list[float]
    series: dict[str, list[float]]
    loss: _Loss
    spread: dict[str, list[float]] | None = None
    regret: dict[str, tuple[list[float], list[float], list[float] | None]] = field(
        default_factory=dict
    )

    @property
    def mb(self) -> float:
        """The most MB a node sent (0 for a run that sent nothing)."""
        sent = [*self.loss.mb, *(b / 1e6 for b in self.series["bytes_sent_per_node"])]
        return max((x for x in sent if not math.isnan(x)), default=0.0)


def _run_curve(label: str, run: RunRecords) -> _Curve:
    curve = _Curve(
        label,
        [r["round"] + 1 for r in run.evals],
        {k: [_value(r.get(k)) for r in run.evals] for k in _EVAL_KEYS},
        _loss(run),
    )
    for key in _REGRET_KEYS:
        points = [(r["round"] + 1, float(r[key])) for r in run.regret if r.get(key) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            curve.regret[key] = (list(xs), list(ys), None)
    return curve


def _mean_loss(runs: Sequence[RunRecords]) -> _Loss:
    """Mean and sample standard deviation of the runs' training loss at the rounds all of
    them have (every round where all have round records)."""
    import numpy as np

    every_round = all(run.rounds for run in runs)
    losses = [_loss(run, every_round) for run in runs]
    by_round = [
        {t: (y, mb, v) for t, y, mb, v in zip(x.rounds, x.loss, x.mb, x.vtime, strict=True)}
        for x in losses
    ]
    common = sorted(set.intersection(*(set(b) for b in by_round)))
    loss, mb, vtime = (
        np.array([[b[t][k] for t in common] for b in by_round]).reshape(len(runs), -1)
        for k in range(3)
    )
    return _Loss(
        common,
        loss.mean(axis=0).tolist(),
        mb.mean(axis=0).tolist(),
        loss.std(axis=0, ddof=1).tolist(),
        vtime=vtime.mean(axis=0).tolist(),
    )


def _mean_curve(label: str, runs: Sequence[RunRecords]) -> _Curve:
    """Mean and sample standard deviation over runs, at the rounds all of them reached."""
    import numpy as np

    by_round = [{r["round"]: r for r in run.evals} for run in runs]
    common = sorted(set.intersection(*(set(b) for b in by_round)))
    if not common:
        raise ConfigError(
            f"--bands: the runs of {label!r} share no evaluation round; give runs that "
            "evaluated the same rounds (the same run.rounds and run.eval_every)."
        )
    series: dict[str, list[float]] = {}
    spread: dict[str, list[float]] = {}
    for key in _EVAL_KEYS:
        table = np.array([[_value(b[t].get(key)) for t in common] for b in by_round])
        series[key] = table.mean(axis=0).tolist()
        spread[key] = table.std(axis=0, ddof=1).tolist()
    curve = _Curve(label, [t + 1 for t in common], series, _mean_loss(runs), spread)
    for key in _REGRET_KEYS:
        per_run = [
            {r["round"]: float(r[key]) for r in run.regret if r.get(key) is not None}
            for run in runs
        ]
        rounds = sorted(set.intersection(*(set(p) for p in per_run)))
        if rounds:
            table = np.array([[p[t] for t in rounds] for p in per_run])
            curve.regret[key] = (
                [t + 1 for t in rounds],
                table.mean(axis=0).tolist(),
                table.std(axis=0, ddof=1).tolist(),
            )
    return curve


def _curves(
    run_dirs: Sequence[Path], label: str | None, bands: bool
) -> tuple[list[_Curve], bool, str]:
    """The curves to draw, whether any run has regret records, and the default title."""
    runs = [load_run(d) for d in run_dirs]
    with_regret = any(run.regret for run in runs)
    why = f"fedcore plot --label {clip(label, 60)}" if label else "fedcore plot --bands"
    if label or bands:
        configs: list[dict[str, Any] | None] = [load_run_config(d, why) for d in run_dirs]
    else:
        configs = [_optional_config(d) for d in run_dirs]
    title = default_title(runs, configs)
    engines = [run_engine(run.summary) for run in runs]
    groups = (
        seed_groups([c or {} for c in configs], engines)
        if bands
        else [[i] for i in range(len(runs))]
    )
    texts = curve_labels(groups, runs, configs, label=label, bands=bands)
    curves = []
    for group, text in zip(groups, texts, strict=True):
        if len(group) == 1:
            curves.append(_run_curve(text, runs[group[0]]))
        else:
            text += f" (mean ± std, {len(group)} seeds)"
            curves.append(_mean_curve(text, [runs[i] for i in group]))
    return curves, with_regret, title


def _timed(curve: _Curve) -> bool:
    """Whether a curve has virtual times (every evaluation's)."""
    times = curve.series["vtime"]
    return bool(times) and not any(math.isnan(v) for v in times)
