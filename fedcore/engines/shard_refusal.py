"""What a sharded run cannot run, as far as its config tells (:func:`config_refusal`),
checked before any rank starts, by the launcher of ``fedcore simulate --ranks R`` too,
which imports no torch (each rank loads its own; the launcher's would be seconds before
any rank starts). :mod:`fedcore.engines.sharded` re-exports these names.
"""

from __future__ import annotations

import importlib.util

from fedcore.config import Config

__all__ = [
    "EDGE_ALGORITHMS",
    "HOLDS_IN_DEADLINE_MODE",
    "METIS_MISSING",
    "SERVER_ALGORITHMS",
    "SHARDED_ALGORITHMS",
    "config_refusal",
    "metis_available",
    "time_refusal",
]

METIS_MISSING = (
    "simulate.partition = 'metis' needs pymetis, which is not installed: pip install "
    "'fedcore[partition]' (or use 'graph')"
)
"""What a run that asks for METIS without pymetis is told (one line)."""


def metis_available() -> bool:
    """Whether ``pymetis`` can be imported (the ``partition`` extra)."""
    return importlib.util.find_spec("pymetis") is not None


SERVER_ALGORITHMS = ("apmsqueeze", "doublesqueeze", "fedavg")
"""The algorithms whose rule chooses who talks (a server and its workers on a star), held
equal to one process by ``tests/engines/test_sharded_server.py``
(:mod:`fedcore.engines.shard_server`)."""

SHARDED_ALGORITHMS = (
    "beer",
    "central",
    "choco",
    "deepsqueeze",
    "dog",
    "dol",
    "dpsgd",
    "dsgt",
    "exact-diffusion",
    "local",
    "ops",
    "push-diging",
    "push-pull",
    "rps",
    *SERVER_ALGORITHMS,
)
"""The algorithms a sharded run runs: the synchronous rules whose peers send one message to
every out-neighbour (pattern ``"neighbours"``, or ``"none"``), each held equal to one
process by ``tests/engines/test_sharded.py``, and those whose state and messages are per
edge (pattern ``"edges"``: RPS, and ``ops`` with ``robust = true``, robust push-sum), held
equal by ``tests/engines/test_sharded_edges.py``, and the server family (pattern
``"chosen"``: :data:`SERVER_ALGORITHMS`); the asynchronous
ones run on the event engine."""

EDGE_ALGORITHMS = ("rps",)
"""The algorithms of :data:`SHARDED_ALGORITHMS` whose state is per edge whatever their
options (robust push-sum is ``ops`` with ``robust = true``)."""


def config_refusal(config: Config) -> str | None:
    """Why a sharded run cannot run ``config``, as far as the config tells (one clause),
    or None: checked before any rank starts."""
    algorithm = config.algorithm
    if config.simulate.engine == "cohort":  # the cohort shards by client (fedcore.engines.cohort)
        from fedcore.engines.cohort import cohort_refusal

        why = cohort_refusal(config)
        return None if why is None else f"simulate.engine = 'cohort': {why}"
    if config.simulate.engine == "messages":
        return (
            "simulate.engine = 'messages' runs every peer in one process; ranks shard the "
            "vectorized engine (simulate.engine = 'auto')"
        )
    if config.adversary.active:
        return "Byzantine peers ([adversary]) are not sharded yet (one process runs them)"
    if config.simulate.device != "cpu":
        device = config.simulate.device
        return f"simulate.device = {device!r}: ranks run on the CPU (gloo) for now"
    if algorithm.name not in SHARDED_ALGORITHMS and not _import_path(algorithm.name):
        return (
            f"algorithm {algorithm.name!r} is not sharded yet (ranks run "
            f"{', '.join(SHARDED_ALGORITHMS)} and a user's rule)"
        )
    if config.privacy.active:
        return "[privacy] runs in one process (simulate.engine 'vectorized' or 'messages')"
    if config.personal.active:
        return "[personal] fine-tunes every peer's final model in one process (no --ranks)"
    why = time_refusal(config)  # deadline mode: what one process refuses too
    if why is not None:
        return why
    if config.simulate.partition == "metis" and not metis_available():
        return METIS_MISSING
    return None


HOLDS_IN_DEADLINE_MODE = ("ops",)
"""The built-in sharded algorithms whose peers hold their pushes when silent in deadline
mode (``holds_in_deadline_mode``: push-sum), which only the message engine models."""


def time_refusal(config: Config) -> str | None:
    """Why a sharded run cannot run ``config``'s waits (one clause), or None: what one
    process refuses too (checked before any rank starts)."""
    deadline = config.transport.mode == "deadline"
    if config.faults.active and not config.faults.announce and not deadline:
        return "faults.announce = false loses messages silently, which needs deadline mode"
    name = config.algorithm.name
    if deadline and name in HOLDS_IN_DEADLINE_MODE:
        return f"{name} holds a silent peer's pushes in deadline mode (strict mode runs)"
    if (deadline or config.time.active) and name in SERVER_ALGORITHMS:
        return f"virtual time ([time], deadline mode) with {name} is not sharded yet"
    return None


def _import_path(name: str) -> bool:
    """Whether ``name`` names a user's rule by import path (loaded only where asked: the
    launcher imports no torch for the algorithms it knows)."""
    from fedcore.algorithms.user import is_import_path

    return is_import_path(name)
