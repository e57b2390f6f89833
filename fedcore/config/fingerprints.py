"""The run fingerprint: a SHA-256 over what a run is (its config, less what only says
where or how one host runs it, and its weighted graph). Peers of other runs, checkpoints
of other runs and resumed runs of changed configs are told apart by it: its bytes must
never change for a config that means the same run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from fedcore.config.constants import TRACKING_KEYS
from fedcore.config.dump import config_to_dict
from fedcore.config.experiment import Config

__all__ = ["fingerprint", "fingerprint_json"]


def fingerprint(config: Config, graph_edges: Iterable[tuple[str, str, float]]) -> str:
    """SHA-256 over the config and the weighted graph: peers of other runs differ.

    Local paths that peers may keep in different places are left out: the certificate
    folder (``transport.tls``), the graph file's name (``topology.file``; its edges
    and weights are in) and the datasets' folder (``data.root``).
    """
    edges = json.dumps(sorted(graph_edges), sort_keys=True, default=str)
    return fingerprint_json(config, [edges.encode()])


def fingerprint_json(config: Config, edges_json: Iterable[bytes]) -> str:
    """:func:`fingerprint` with the sorted edges given as JSON text, in chunks
    (:func:`fedcore.topology.digest.edges_json` writes them from a graph's arrays)."""
    tables = config_to_dict(config)
    tables.pop("simulate", None)  # how one process runs it, not what runs
    for key in TRACKING_KEYS:  # what is written beside the records, not what runs
        tables["run"].pop(key, None)
    tables["run"].pop("eval_peers", None)  # whose models are measured, not what runs
    tables.pop("personal", None)  # made from the models after the run, not what runs
    tables["transport"].pop("tls", None)
    tables["topology"].pop("file", None)
    tables["data"].pop("root", None)
    if not config.data.examples_per_node:  # fingerprints of runs without it as they were
        tables["data"].pop("examples_per_node", None)
    if not config.adversary.active:  # fingerprints of runs without liars as they were
        tables.pop("adversary", None)
    if not config.privacy.active:  # fingerprints of runs without [privacy] as they were
        tables.pop("privacy", None)
    if not config.time.active:  # fingerprints of runs without [time] as they were
        tables.pop("time", None)
    else:  # the traces' contents are in the run's times, not where a host keeps them
        tables["time"].pop("compute_trace", None)
        tables["time"].pop("availability_trace", None)
    # json.dumps({"config": tables, "edges": edges}, sort_keys=True), written in parts.
    digest = hashlib.sha256(b'{"config": ')
    digest.update(json.dumps(tables, sort_keys=True, default=str).encode())
    digest.update(b', "edges": ')
    for chunk in edges_json:
        digest.update(chunk)
    digest.update(b"}")
    return digest.hexdigest()
