"""``fedcore summarize``, and the end of every launch: the peers' folders ``nodes/<id>/`` of a
run merged into the ``metrics.jsonl``, ``summary.json`` and ``curves.png`` that ``simulate``
writes (``"transport": "grpc"``), a peer that died counted as down from its last record."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedcore.config import Config, config_to_dict, dumps_toml, load_config
from fedcore.deploy.peer import model_path
from fedcore.errors import ConfigError
from fedcore.ids import child_path
from fedcore.metrics import JsonlWriter
from fedcore.node import RoundRecord
from fedcore.progress import current_warnings, run_warnings
from fedcore.setup.plan import round_drift
from fedcore.setup.prepare import RunSetup, prepare_run
from fedcore.simulation.observer import RunObserver
from fedcore.simulation.results import finish_run, run_name
from fedcore.simulation.simulate import keep_late_warnings
from fedcore.simulation.tracking import make_tracker

__all__ = [
    "LAUNCH_FILE",
    "peer_dir",
    "read_params",
    "summarize",
]


LAUNCH_FILE = "launch.json"
"""What a launch writes as it starts its peers: its name, overrides and
``peers_per_process`` (``--resume`` reads them if the launcher died before its summary)."""


def peer_dir(out: Path, node: str) -> Path:
    """``out/nodes/<node>``: a peer's folder, checked to stay inside ``out/nodes``.

    Graph ids are safe names already (:mod:`fedcore.ids`); this makes sure no other path
    (``..``, ``a/b``) can put a peer's files outside the run folder or over its merged
    ``metrics.jsonl``.
    """
    return child_path(out / "nodes", node, ConfigError)


def read_params(path: Path) -> torch.Tensor:
    """Parameters written by :func:`fedcore.deploy.peer.write_params`."""
    return torch.from_numpy(np.fromfile(path, dtype="<f4").copy())


def _read_record(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty if there is none, or not an object."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _launch_name(
    config: Config, setup: RunSetup, *records: Mapping[str, Any]
) -> tuple[list[str], str]:
    """The overrides and name of a launch, from the first of ``records`` (the summary,
    then ``launch.json``) that has them; else as :func:`run_name` names it without
    overrides."""
    for record in records:
        overrides, name = record.get("overrides"), record.get("name")
        if not isinstance(overrides, list) or not isinstance(name, str) or not name:
            continue
        if all(isinstance(o, str) for o in overrides):
            return [str(o) for o in overrides], name
    return [], run_name(config, setup, ())


def summarize(
    run_dir: str | Path, config: Config | None = None, *, quiet: bool = False
) -> dict[str, Any]:
    """Merge the peer folders ``run_dir/nodes/<id>/`` of a run whose peers ran elsewhere
    (``fedcore compose``, one ``fedcore node`` per host) into ``metrics.jsonl``,
    ``summary.json`` and ``curves.png`` in ``run_dir``; return the summary.

    ``config`` defaults to ``run_dir/config.toml``. A peer without ``node.json`` did not
    finish: it counts as down from the round after its last record (exit status unknown).
    When no peer reached the last round (the run was stopped), the summary covers the
    rounds that ran (``rounds_completed``, ``status = "interrupted"``).

    ``quiet``: fedcore's warnings stay off the terminal (the summary's ``warnings`` lists
    them either way).

    Raises:
        ConfigError: no config, or a node of the graph with no folder at all.
    """
    with run_warnings(quiet=quiet):
        return _summarize(Path(run_dir), config)


def _summarize(out: Path, config: Config | None) -> dict[str, Any]:
    """:func:`summarize`, its warnings collected."""
    if config is None:
        config = load_config(out / "config.toml")
    graph_file = Path(config.topology.file) if config.topology.file else None
    if graph_file and not graph_file.is_absolute() and (out / graph_file).is_file():
        # A graph file named relative to the run folder (fedcore compose writes it there);
        # its name is not part of the run fingerprint, so the run stays the same run.
        topology = dataclasses.replace(config.topology, file=str(out / graph_file))
        config = dataclasses.replace(config, topology=topology)
    setup = prepare_run(config)
    nodes = setup.graph.nodes
    absent = [n for n in nodes if not peer_dir(out, n).is_dir()]
    if absent:
        raise ConfigError(
            f"{out / 'nodes'} has no folder for {', '.join(absent)}; copy every peer's --out "
            "folder there (as nodes/<id>) first."
        )
    unfinished: dict[str, int | None] = {
        n: None for n in nodes if not (peer_dir(out, n) / "node.json").exists()
    }
    # A launch named it: keep its name.
    records = (_read_record(out / "summary.json"), _read_record(out / LAUNCH_FILE))
    overrides, name = _launch_name(config, setup, *records)
    summary = _merge(setup, out, name, None, unfinished, overrides=overrides)
    summary["out_dir"] = str(out)
    return summary


def _merge(
    setup: RunSetup,
    out: Path,
    name: str,
    wall: float | None,
    dead: Mapping[str, int | None],
    *,
    status: str | None = None,
    error: str | None = None,
    overrides: Sequence[str] = (),
    peers_per_process: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Replay the peers' records into the same metrics and summary as ``simulate``.

    ``peers_per_process`` and ``threads`` (each process's torch threads) of a ``launch``
    are recorded (None: not known, peers that ran elsewhere). As ``simulate`` says which
    engine ran, the summary says ``"engine": "peers"`` (with ``"transport": "grpc"``):
    every peer its own node loop, module and server, on the CPU.

    A peer that died or stopped (``dead``: id -> exit status, None where unknown) is
    counted as down from the round after its last record up to the last round any peer
    reached, and its last model snapshot (or the initial model) stands for it. ``wall``
    None (peers that ran elsewhere): the longest time a peer spent in its rounds.
    ``status`` None: ``completed`` if a peer reached the last round, else ``interrupted``.
    """
    config = setup.config
    nodes = setup.graph.nodes
    records: list[RoundRecord] = []
    last_round: dict[str, int] = {}
    spent = 0.0  # the longest time a peer spent in its rounds
    for n in nodes:
        path = peer_dir(out, n) / "metrics.jsonl"
        mine = []
        if path.exists():
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    if line.endswith("\n"):  # a killed peer may leave half a line
                        mine.append(RoundRecord.from_json(json.loads(line)))
        last_round[n] = mine[-1].round if mine else -1
        spent = max(spent, sum(r.wall_s for r in mine))
        records.extend(mine)
    # The rounds that really ran. Peers stopped together (no exit status) end within the
    # rounds a sender may run ahead of the others: the run covers the rounds all of them
    # completed, and their records of later rounds are left out. A peer that exited on
    # its way (or stopped far behind) counts as down from its last record.
    top = max(last_round.values(), default=-1)
    slack = round_drift(config.transport, config.faults, config.run.rounds) + 2
    stopped = {n for n, s in dead.items() if s is None and last_round[n] >= top - slack}
    ran = min(config.run.rounds, min((last_round[n] for n in stopped), default=top) + 1)
    records = [r for r in records if r.round < ran]
    gone = {n: s for n, s in dead.items() if n not in stopped}
    for n in gone:
        records.extend(
            RoundRecord.down_round(n, t, lr=0.0, wall_s=0.0) for t in range(last_round[n] + 1, ran)
        )
    if status is None:
        status = "completed" if ran == config.run.rounds else "interrupted"
    order = {n: i for i, n in enumerate(nodes)}
    records.sort(key=lambda r: (r.round, order[r.node]))
    writer = JsonlWriter(out / "metrics.jsonl")
    observer = RunObserver(
        nodes=nodes,
        config=config,
        evaluator=setup.evaluator,
        dataset=setup.dataset,
        writer=writer,
        progress=None,
        server=setup.algorithm.server,
        own_tests=setup.own_tests(),
        tracker=make_tracker(config, out, dumps_toml(config_to_dict(config))),
    )
    dtype = setup.evaluator.dtype
    models: dict[str, torch.Tensor] = dict.fromkeys(nodes, setup.start)
    try:
        for record in records:
            model = None
            if observer.is_eval_round(record.round):
                path = model_path(peer_dir(out, record.node), record.round)
                if path.exists():
                    models[record.node] = read_params(path).to(dtype)
                model = models[record.node]
            observer.observe(record, model)
    finally:
        writer.close()
    exits = {n: {"status": s, "last_round": last_round[n]} for n, s in sorted(gone.items())}
    summary = finish_run(
        setup,
        observer,
        out,
        name=name,
        transport="grpc",
        wall_seconds=spent if wall is None else wall,
        final_params=models,
        extra={
            "engine": "peers",
            "device": "cpu",
            "gradients": "per-node",
            **({} if threads is None else {"threads": threads}),
            "peer_exits": exits,
            "overrides": list(overrides),
            **({} if peers_per_process is None else {"peers_per_process": peers_per_process}),
            "warnings": current_warnings(),  # the launcher's; each peer's are in its log
        },
        status=status,
        error=error,
    )
    keep_late_warnings(out, summary)
    return summary
