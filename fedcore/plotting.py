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
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import tomllib
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError
from fedcore.ids import child_path, clip, shorten

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

LEGEND_OUTSIDE = 6
"""From this many curves on (or with labels of over 40 characters), the legend goes below
the panels, off the curves."""

SWEEP_FILE = "sweep.json"  # as fedcore.simulation.sweep writes it (not imported: no torch here)

_SEED_KEYS = ("seed", "name")
"""The ``[run]`` keys in which the runs of one ``bands`` group may differ."""

_SEED_PART = re.compile(r"(?:^|[-_ ,]+)(?:run\.)?seed[-=_]?\d+(?=$|[-_ ,])", re.IGNORECASE)


def load_evals(run_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """The run's name and its evaluation records (see :func:`load_records`)."""
    name, evals, _ = load_records(run_dir)
    return name, evals


def load_records(run_dir: Path) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's name, its evaluation records and its regret records (maybe none).

    Raises:
        ConfigError: no such folder, or it has no readable ``metrics.jsonl`` with
            evaluations.
    """
    run = load_run(run_dir)
    return run.name, run.evals, run.regret


@dataclass
class RunRecords:
    """What ``fedcore plot`` reads of one run folder."""

    path: Path
    name: str
    """``summary.json``'s name (the folder's name without one)."""
    evals: list[dict[str, Any]]
    regret: list[dict[str, Any]]
    rounds: list[dict[str, Any]]
    """The ``"kind": "round"`` records, one a round, in round order (none in old runs)."""
    summary: dict[str, Any]
    """``summary.json`` (empty without one)."""


_NODE_LINE = '{"node"'
"""How a ``"kind": "node"`` record's line starts (``RoundRecord.to_json``): skipped unread,
there may be a million a round."""


def load_run(run_dir: Path) -> RunRecords:
    """A run folder's records: evaluations, regret, rounds, and its summary.

    Raises:
        ConfigError: no such folder, or it has no readable ``metrics.jsonl`` with
            evaluations.
    """
    path = run_dir / "metrics.jsonl"
    if not run_dir.exists():
        raise ConfigError(
            f"{str(run_dir)!r} does not exist; give a run folder (one holding metrics.jsonl) "
            "or a sweep folder."
        )
    if not run_dir.is_dir():
        raise ConfigError(
            f"{str(run_dir)!r} is a file, not a run folder; give the folder that holds its "
            "metrics.jsonl."
        )
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run folder: it has no metrics.jsonl.")
    evals: list[dict[str, Any]] = []
    regret: list[dict[str, Any]] = []
    rounds: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.startswith(_NODE_LINE):
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ConfigError(f"{path}: line {lineno} is not JSON.") from None
            kind = record.get("kind")
            if kind == "eval":
                evals.append(record)
            elif kind == "regret":
                regret.append(record)
            elif kind == "round" and isinstance(record.get("round"), int):
                rounds[record["round"]] = record  # a round written twice: the last one
    if not evals:
        raise ConfigError(f"{path} has no evaluation records to plot.")
    summary: dict[str, Any] = {}
    with contextlib.suppress(OSError, UnicodeError, json.JSONDecodeError):
        loaded = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            summary = loaded
    name = summary.get("name")
    return RunRecords(
        run_dir,
        name if isinstance(name, str) and name else run_dir.name,
        evals,
        regret,
        [rounds[t] for t in sorted(rounds)],
        summary,
    )


def expand_runs(paths: Sequence[Path]) -> list[Path]:
    """``paths`` with every sweep folder (one holding ``sweep.json``) replaced by the
    folders of its completed runs, in seed order.

    Raises:
        ConfigError: an unreadable ``sweep.json``, or a sweep with no completed run.
    """
    out: list[Path] = []
    for path in paths:
        sweep = path / SWEEP_FILE
        if not sweep.is_file():
            out.append(path)
            continue
        try:
            record = json.loads(sweep.read_text(encoding="utf-8"))
            if record.get("kind") == "grid":  # a grid: the sweep folders of its cells
                cells = [c for c in record["cells"] if c.get("completed")]
                found = [child_path(path, str(c["out_dir"]), ConfigError) for c in cells]
            else:
                runs = [r for r in record["runs"] if r.get("status") == "completed"]
                found = [child_path(path, str(r["out_dir"]), ConfigError) for r in runs]
        except (OSError, UnicodeError, ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(f"{sweep} is not a readable sweep file.") from None
        if found and record.get("kind") == "grid":
            out.extend(expand_runs(found))
            continue
        if not found:
            raise ConfigError(f"sweep folder {str(path)!r} has no completed run to plot.")
        out.extend(found)
    return out


def grid_keys(paths: Sequence[Path]) -> list[str]:
    """The grid keys of the grid folders among ``paths`` (``sweep.json`` of kind
    ``grid``), in order, each once; none for runs and seed sweeps."""
    keys: list[str] = []
    for path in paths:
        with contextlib.suppress(OSError, UnicodeError, ValueError, AttributeError):
            record = json.loads((path / SWEEP_FILE).read_text(encoding="utf-8"))
            if record.get("kind") == "grid":
                keys += [str(k) for k in record.get("grid", {}) if str(k) not in keys]
    return keys


def load_run_config(run_dir: Path, why: str) -> dict[str, Any]:
    """The run's ``config.toml`` as a dict.

    Raises:
        ConfigError: no readable ``config.toml`` (``why`` says what needed it).
    """
    path = run_dir / "config.toml"
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{why}: run {str(run_dir)!r} has no config.toml.") from None
    except (OSError, UnicodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{why}: cannot read {path}: {exc}.") from None


def config_value(config: Mapping[str, Any], key: str, run_dir: Path) -> Any:
    """The value of dotted ``key`` (``algorithm.name``) in a run's config.

    Raises:
        ConfigError: the config has no such key.
    """
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise ConfigError(
                f"--label {clip(key, 60)}: run {str(run_dir)!r} has no such key in its "
                "config.toml; give a dotted key such as algorithm.name or compression.codec."
            )
        value = value[part]
    return value


def _label_text(key: str, value: Any) -> str:
    """A config value as a legend label: strings as they are, others as ``key=value``."""
    if isinstance(value, str):
        return value
    return _key_text(key, value)


def _key_text(key: str, value: Any) -> str:
    """``key=value``, as ``--set`` would give it."""
    shown = json.dumps(value) if isinstance(value, bool | list | dict) else str(value)
    return f"{key}={shown}"


_PLAIN_KEYS = ("algorithm.name", "compression.codec")
"""Config keys a default label shows by their value alone, first, in this order (then the
graph, then every other key as ``key=value``)."""

_GRAPH_KEYS = frozenset({"topology.kind", "topology.nodes", "topology.rows", "topology.cols"})
"""Config keys that the graph's name (``summary.json``'s ``topology.name``, e.g.
``torus-4x4``) stands for in a label."""


_ENGINE_KEYS = frozenset({"simulate.engine"})
"""Config keys that the engine a run ran on (:func:`run_engine`) stands for in a label: the
config may say ``auto``, the summary says what ran."""


def run_engine(summary: Mapping[str, Any]) -> str:
    """What ran a run, by its ``summary.json``: an in-process engine of ``fedcore simulate``
    (``messages``, ``vectorized``, ``events``), or ``grpc peers`` (``fedcore launch``, and
    ``fedcore summarize`` of peers that ran elsewhere); "" where the summary does not say."""
    if summary.get("transport") == "grpc":
        return "grpc peers"
    engine = summary.get("engine")
    if isinstance(engine, str) and engine.strip():
        return shorten(" ".join(engine.split()), 40)  # a file's text: one short line
    # Summaries from before the engine was recorded: the in-process runs were the message
    # engine's.
    return "messages" if summary.get("transport") == "inproc" else ""


def _flat(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config as ``table.key: value`` (inline tables such as ``transport.tls`` whole)."""
    out: dict[str, Any] = {}
    for table, keys in config.items():
        if isinstance(keys, Mapping):
            out.update({f"{table}.{key}": value for key, value in keys.items()})
        else:
            out[table] = keys
    return out


def default_labels(
    configs: Sequence[Mapping[str, Any] | None],
    graphs: Sequence[str],
    names: Sequence[str],
    *,
    ignore: Collection[str] = ("run.name",),
    engines: Sequence[str] | None = None,
) -> list[str]:
    """Curve labels that say what differs between the runs (one config each).

    The algorithm and the codec by their value, the graph by its name (``graphs``) and the
    engine each ran on (``engines``, :func:`run_engine`; it stands for ``simulate.engine``),
    where the runs differ in them; then every other config key whose value differs (a
    ``--set`` key, say) as ``key=value``, in the config's order, on the runs whose value
    is not the one most runs share (on all of them if no value has a majority, or if a
    label would be left empty). Keys in ``ignore``, and keys that only some runs have (one
    algorithm's own parameters), are left out. Where that tells the runs apart nothing,
    or a run has no config, the labels are ``names``.
    """
    if len(configs) < 2 or any(c is None for c in configs):
        return list(names)
    flats = [_flat(c) for c in configs if c is not None]
    texts = [{k: json.dumps(v, sort_keys=True, default=str) for k, v in f.items()} for f in flats]
    differ = [
        key
        for key in flats[0]
        if key not in ignore and all(key in t for t in texts) and len({t[key] for t in texts}) > 1
    ]
    graph = len(set(graphs)) > 1 or any(key in _GRAPH_KEYS for key in differ)
    engine = engines is not None and len(set(engines)) > 1
    others = [
        k
        for k in differ
        if k not in _PLAIN_KEYS
        and not (graph and k in _GRAPH_KEYS)
        and not (engine and k in _ENGINE_KEYS)
    ]
    common: dict[str, str] = {}  # each other key's majority value, where one has it
    for key in others:
        value, count = Counter(t[key] for t in texts).most_common(1)[0]
        if 2 * count > len(texts):
            common[key] = value

    def label(i: int, omit: Mapping[str, str]) -> str:
        parts = [str(flats[i][key]) for key in _PLAIN_KEYS if key in differ]
        if graph and graphs[i]:
            parts.append(graphs[i])
        if engine and engines is not None and engines[i]:
            parts.append(engines[i])
        parts += [_key_text(key, flats[i][key]) for key in others if omit.get(key) != texts[i][key]]
        return ", ".join(parts)

    for omit in (common, {}):
        labels = [label(i, omit) for i in range(len(flats))]
        if all(labels) and len(set(labels)) == len(labels):
            return labels
    return list(names)


def _graph_name(run: RunRecords, config: Mapping[str, Any] | None) -> str:
    """The run's graph: ``summary.json``'s ``topology.name`` (``torus-4x4``), else
    ``<kind>-<nodes>`` from its config ("" when neither says)."""
    topology = run.summary.get("topology")
    if isinstance(topology, Mapping) and isinstance(topology.get("name"), str):
        return str(topology["name"])
    table = (config or {}).get("topology")
    if isinstance(table, Mapping) and "kind" in table:
        return f"{table['kind']}-{table.get('nodes', '?')}"
    return ""


def _some(values: Sequence[str], noun: str, most: int = 3) -> str:
    """Distinct ``values`` joined, or how many there are when over ``most``."""
    distinct = list(dict.fromkeys(v for v in values if v))
    return ", ".join(distinct) if len(distinct) <= most else f"{len(distinct)} {noun}"


def default_title(runs: Sequence[RunRecords], configs: Sequence[Mapping[str, Any] | None]) -> str:
    """The figure's title: the runs' config name, algorithm and graph
    (``dpsgd-torus16: dpsgd on torus-4x4``); several of each joined, or counted when many."""
    names, algorithms, graphs = [], [], []
    for run, config in zip(runs, configs, strict=True):
        table = (config or {}).get("run")
        name = table.get("name") if isinstance(table, Mapping) else strip_seed(run.name)
        names.append(name if isinstance(name, str) else "")
        algorithm = run.summary.get("algorithm")
        if not isinstance(algorithm, str):
            table = (config or {}).get("algorithm")
            algorithm = table.get("name") if isinstance(table, Mapping) else None
        algorithms.append(algorithm if isinstance(algorithm, str) else "")
        graphs.append(_graph_name(run, config))
    what = _some(algorithms, "algorithms", most=4)
    where = _some(graphs, "graphs")
    text = f"{what} on {where}" if what and where else what or where
    if not 0 < len({n for n in names if n}) <= 3:
        return text  # many configs: their algorithms and graphs say enough
    name = _some(names, "configs")
    return f"{name}: {text}" if text else name


def seed_groups(
    configs: Sequence[Mapping[str, Any]], engines: Sequence[str] | None = None
) -> list[list[int]]:
    """Indices of ``configs`` grouped by config, ``run.seed`` and ``run.name`` left out,
    and by engine (``engines``, one a config: runs of one config on the message engine and
    over gRPC are two curves); groups in order of their first run, runs in their given
    order."""
    groups: dict[str, list[int]] = {}
    for i, config in enumerate(configs):
        reduced = dict(config)
        run = reduced.get("run")
        if isinstance(run, Mapping):
            reduced["run"] = {k: v for k, v in run.items() if k not in _SEED_KEYS}
        engine = engines[i] if engines is not None else ""
        key = json.dumps([reduced, engine], sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def strip_seed(name: str) -> str:
    """``name`` without its seed part: ``ops-ring-run.seed=3`` -> ``ops-ring``."""
    return _SEED_PART.sub("", name).strip("-_ ,")


def _group_name(names: Sequence[str], dirs: Sequence[Path]) -> str:
    """The common name of a group of runs, without the seed part."""
    stripped = {strip_seed(n) for n in names}
    if len(stripped) == 1 and (only := stripped.pop()):
        return only
    prefix = strip_seed(_common_prefix(names)).rstrip("-_=.")
    if prefix:
        return prefix
    parents = {d.parent.name for d in dirs}
    return parents.pop() if len(parents) == 1 else names[0]


def _common_prefix(names: Sequence[str]) -> str:
    first, last = min(names), max(names)
    k = 0
    while k < min(len(first), len(last)) and first[k] == last[k]:
        k += 1
    return first[:k]


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


def _optional_config(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``config.toml``, or None where it has no readable one."""
    try:
        return load_run_config(run_dir, "")
    except ConfigError:
        return None


def curve_labels(
    groups: Sequence[Sequence[int]],
    runs: Sequence[RunRecords],
    configs: Sequence[Mapping[str, Any] | None],
    *,
    label: str | None,
    bands: bool,
) -> list[str]:
    """Each curve's label (a curve: a group of ``runs``, one run without ``bands``): the
    value of config key ``label`` (several values of a group joined), else what differs
    between the curves (:func:`default_labels`), else the runs' (common) name. A label
    that curves of different engines would share says each one's engine too (the same
    config on the message and the vectorized engine, or ``simulate`` and ``launch``).

    Raises:
        ConfigError: a run without ``label`` in its config.
    """
    engines = [run_engine(runs[g[0]].summary) for g in groups]
    if label is not None:
        keys = [key.strip() for key in label.split(",")]  # several keys: "k1=v1, v2"

        def value(i: int) -> str:
            return ", ".join(
                _label_text(key, config_value(configs[i] or {}, key, runs[i].path)) for key in keys
            )

        texts = [", ".join(dict.fromkeys(value(i) for i in group)) for group in groups]
        return _tell_engines(texts, engines)
    names = [
        _group_name([runs[i].name for i in g], [runs[i].path for i in g])
        if len(g) > 1
        else runs[g[0]].name
        for g in groups
    ]
    texts = default_labels(
        [configs[g[0]] for g in groups],
        [_graph_name(runs[g[0]], configs[g[0]]) for g in groups],
        names,
        ignore=("run.name", "run.seed") if bands else ("run.name",),
        engines=engines,
    )
    return _tell_engines(texts, engines)


def _tell_engines(labels: Sequence[str], engines: Sequence[str]) -> list[str]:
    """``labels`` with ``, <engine>`` added to each that a curve of another engine shares
    (one label the same config's runs on two engines would otherwise both have)."""
    shared: dict[str, set[str]] = {}
    for text, engine in zip(labels, engines, strict=True):
        shared.setdefault(text, set()).add(engine)
    return [
        f"{text}, {engine}" if len(shared[text]) > 1 and engine else text
        for text, engine in zip(labels, engines, strict=True)
    ]


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


_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
"""matplotlib's ``tab10``, whatever the user's style says."""

_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h")
_LINESTYLES = ("-", "-.", ":")
"""Solid for the first ten curves, then the next (dashed is the mean node accuracy's)."""


def curve_style(i: int) -> dict[str, Any]:
    """Curve ``i``'s colour, marker and line style: no two alike among the first 330."""
    return {
        "color": _COLORS[i % len(_COLORS)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "linestyle": _LINESTYLES[i // len(_COLORS) % len(_LINESTYLES)],
    }


def _bytes_differ_tenfold(curves: Sequence[_Curve]) -> bool:
    """Whether the runs' bytes differ more than ten times (of runs that sent any)."""
    sent = [c.mb for c in curves if c.mb > 0]
    return len(sent) > 1 and max(sent) > 10 * min(sent)


def _legend_columns(labels: Sequence[str]) -> int:
    """As many columns (up to 4) as labels this long fit across the figure (some 170
    characters of the small font, less a handle of 8 a column)."""
    return max(1, min(4, 170 // (max(len(text) for text in labels) + 8)))


def _draw(
    ax: Any,
    xs: Sequence[float],
    ys: Sequence[float],
    spread: Sequence[float] | None,
    *,
    positive_x: bool,
    **style: Any,
) -> Any:
    """One line (and its band) on ``ax``; points at x <= 0 left out on a log axis; markers
    on every point of a short line, about a dozen along a long one."""
    keep = [i for i, x in enumerate(xs) if x > 0 or not positive_x]
    x = [xs[i] for i in keep]
    y = [ys[i] for i in keep]
    drawn = sum(not (math.isnan(a) or math.isnan(b)) for a, b in zip(x, y, strict=True))
    # By distance: even on a log axis (matplotlib cannot place them on a line of no point).
    every = 0.08 if drawn > 12 else None
    (line,) = ax.plot(x, y, markevery=every, markersize=4, **style)
    if spread is not None and x:
        low = [y[j] - spread[i] for j, i in enumerate(keep)]
        high = [y[j] + spread[i] for j, i in enumerate(keep)]
        alpha = 0.1 if style.get("linestyle") == "--" else 0.2
        ax.fill_between(x, low, high, color=line.get_color(), alpha=alpha, linewidth=0)
    return line


def plot_runs(
    run_dirs: Sequence[Path],
    out: Path,
    *,
    label: str | None = None,
    title: str | None = None,
    log_bytes: bool | None = None,
    bands: bool = False,
    time: bool | None = None,
) -> Path:
    """Draw the comparison panels for ``run_dirs`` into ``out`` (PNG, PDF or SVG).

    Args:
        run_dirs: Run folders, or sweep folders (their completed runs).
        out: The picture to write (its format by its suffix).
        label: A dotted config key (``algorithm.name``), or several joined by commas:
            label each curve by their values in the run's ``config.toml`` instead of by
            what differs between the runs (:func:`default_labels`). Grid folders without
            ``label``: by the grid's keys (and ``run.seed`` without ``bands``).
        title: The figure's title (default: :func:`default_title`).
        log_bytes: A log scale on the bytes-sent axes (points at 0 bytes left out);
            None: when the runs' bytes differ more than ten times.
        bands: One curve per group of runs that differ only in ``run.seed``: the mean
            over seeds in a band of +- one standard deviation.
        time: Two more panels, loss and accuracy against virtual seconds (``[time]``);
            None: when every run has virtual time.

    Raises:
        ConfigError: a folder that is not a run, a run without ``config.toml`` or
            without ``label``, runs of a band that share no evaluation round.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if label is None and (keys := grid_keys([Path(d) for d in run_dirs])):
        label = ",".join(keys if bands else [*keys, "run.seed"])  # a grid's runs by cell
    curves, with_regret, default = _curves(expand_runs([Path(d) for d in run_dirs]), label, bands)
    if log_bytes is None:
        log_bytes = _bytes_differ_tenfold(curves)
    timed = all(_timed(c) for c in curves)
    if time and not timed:
        raise ConfigError(
            "fedcore plot --time: some of the runs have no virtual time (runs with [time], "
            "or deadline mode in fedcore simulate, have it); leave out --time."
        )
    time = timed if time is None else time
    labels = [c.label for c in curves]
    # Many curves, or long names, would hide the curves: the legend goes below instead.
    outside = len(curves) >= LEGEND_OUTSIDE or max(len(text) for text in labels) > 40
    rows = 2 + int(with_regret) + int(time)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.75 * rows))
    mb = "MB sent per node" + (" (log)" if log_bytes else "")
    styles = [curve_style(i) for i in range(len(curves))]
    handles: list[Any] = []
    for ax, by_bytes in ((axes[0][0], False), (axes[1][0], True)):
        positive = by_bytes and log_bytes
        for c, style in zip(curves, styles, strict=True):
            line = _draw(
                ax,
                c.loss.mb if by_bytes else c.loss.rounds,
                c.loss.loss,
                c.loss.spread,
                positive_x=positive,
                label=c.label,
                **style,
            )
            if not by_bytes:
                handles.append(line)
    for ax, by_bytes in ((axes[0][1], False), (axes[1][1], True)):
        positive = by_bytes and log_bytes
        for c, style in zip(curves, styles, strict=True):
            xs = [b / 1e6 for b in c.series["bytes_sent_per_node"]] if by_bytes else c.rounds
            sd = c.spread
            for key, extra in (
                ("avg_model_accuracy", {}),
                ("mean_node_accuracy", {"linestyle": "--", "markerfacecolor": "none"}),
            ):
                _draw(
                    ax,
                    xs,
                    c.series[key],
                    sd[key] if sd else None,
                    positive_x=positive,
                    label=c.label if not extra else f"{c.label} (mean node)",
                    **{**style, **extra},
                )
    for ax, by_bytes, ylabel in (
        (axes[0][0], False, "training loss"),
        (axes[0][1], False, "test accuracy"),
        (axes[1][0], True, "training loss"),
        (axes[1][1], True, "test accuracy"),
    ):
        if by_bytes and log_bytes and any(ln.get_xdata().size for ln in ax.get_lines()):
            ax.set_xscale("log")
        ax.set_xlabel(mb if by_bytes else "round")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    dashed_text = "dashed: mean node accuracy"
    dashed = Line2D([], [], color="grey", linestyle="--", label=dashed_text)
    if not outside:
        axes[0][1].legend(handles=[*handles, dashed], loc="lower right", fontsize="small")
    if time:
        _time_panels(axes[2], curves, styles)
    if with_regret:
        row = axes[3 if time else 2]
        for ax, key, ylabel in (
            (row[0], "average_static_regret", "average static regret R_t / (n t)"),
            (row[1], "average_dynamic_regret", "average dynamic regret"),
        ):
            for c, style in zip(curves, styles, strict=True):
                if key in c.regret:
                    rx, ry, rsd = c.regret[key]
                    _draw(ax, rx, ry, rsd, positive_x=False, label=c.label, **style)
            ax.set_xlabel("round")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        if not outside:
            row[0].legend(fontsize="small")
    fig.suptitle(title or default)
    fig.tight_layout()
    if outside:
        fig.legend(
            handles=[*handles, dashed],
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=_legend_columns([*labels, dashed_text]),
            fontsize="small",
            frameon=False,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out


def _timed(curve: _Curve) -> bool:
    """Whether a curve has virtual times (every evaluation's)."""
    times = curve.series["vtime"]
    return bool(times) and not any(math.isnan(v) for v in times)


def _time_panels(row: Any, curves: Sequence[_Curve], styles: Sequence[dict[str, Any]]) -> None:
    """Training loss and test accuracy against virtual seconds."""
    for c, style in zip(curves, styles, strict=True):
        loss = c.loss
        keep = [i for i, v in enumerate(loss.vtime) if not math.isnan(v)]
        _draw(
            row[0],
            [loss.vtime[i] for i in keep],
            [loss.loss[i] for i in keep],
            [loss.spread[i] for i in keep] if loss.spread else None,
            positive_x=False,
            label=c.label,
            **style,
        )
        sd = c.spread
        for key, extra in (
            ("avg_model_accuracy", {}),
            ("mean_node_accuracy", {"linestyle": "--", "markerfacecolor": "none"}),
        ):
            _draw(
                row[1],
                c.series["vtime"],
                c.series[key],
                sd[key] if sd else None,
                positive_x=False,
                label=c.label,
                **{**style, **extra},
            )
    for ax, ylabel in ((row[0], "training loss"), (row[1], "test accuracy")):
        ax.set_xlabel("virtual seconds")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
