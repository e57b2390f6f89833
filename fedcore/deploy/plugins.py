"""The names of a config that peers started elsewhere cannot see: those only
:meth:`~fedcore.registry.Family.register` in this process made known.

A peer that ``fedcore launch`` starts, or that a compose, Swarm or Kubernetes deployment
runs, imports fedcore afresh and sees the installed entry points only, so it would stop on
such a name; the writers and the launcher refuse it first, in one line.
"""

from __future__ import annotations

from fedcore import registry
from fedcore.config import Config
from fedcore.errors import ConfigError

__all__ = ["PLUGINS_DOCS", "refuse_registered_here"]

PLUGINS_DOCS = "docs/writing-your-own.md, Plug-ins"
"""Where the docs say how to install a plug-in."""


def refuse_registered_here(config: Config, peers: str) -> None:
    """Refuse a name of ``config`` registered in this process only (its algorithm, codec,
    topology kind, dataset or model); ``peers`` names who would not see it (``"the peers
    fedcore launch starts"``).

    Raises:
        ConfigError: one line naming the setting, where it was registered, and the fix.
    """
    kind = "" if config.topology.file else config.topology.kind
    named = (
        ("algorithm.name", registry.ALGORITHMS, config.algorithm.name),
        ("compression.codec", registry.CODECS, config.compression.codec),
        ("topology.kind", registry.TOPOLOGY_KINDS, kind),
        ("data.dataset", registry.DATASETS, config.data.dataset),
        ("model.name", registry.MODELS, config.model.name),
    )
    for key, family, name in named:
        origin = family.registered_here(name) if name else ""
        if origin:
            raise ConfigError(
                f"{key} = {name!r} is a {family.what} registered in-process with register() "
                f"({origin}); {peers} see only installed entry points: install it as a "
                f"plug-in, an entry point of group {family.group} ({PLUGINS_DOCS})."
            )
