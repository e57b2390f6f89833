"""Curve labels and figure titles: what differs between the runs, the engine each ran on,
and the runs of one config that differ only in their seed."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcore.ids import shorten
from fedcore.plotting.runs import RunRecords, config_value

_SEED_KEYS = ("seed", "name")
"""The ``[run]`` keys in which the runs of one ``bands`` group may differ."""

_SEED_PART = re.compile(r"(?:^|[-_ ,]+)(?:run\.)?seed[-=_]?\d+(?=$|[-_ ,])", re.IGNORECASE)


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
