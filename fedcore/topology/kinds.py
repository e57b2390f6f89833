"""Topology kinds by name: :func:`build` (a kind, a node count, a seed and the kind's
parameters, as configs name them) and :func:`parse_spec` (the ``KIND:NODES`` spec of the
command line).

Each kind is an entry of :data:`fedcore.registry.TOPOLOGY_KINDS` whose builder is one of
the ``_kind_*`` functions below, which read the kind's parameters and call its generator
(:mod:`fedcore.topology.generators`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fedcore import registry
from fedcore.config import SEED_LIMIT
from fedcore.errors import FedcoreError, TopologyError
from fedcore.ids import error_text
from fedcore.topology.epidemic import epidemic_local, epidemic_oracle
from fedcore.topology.generators import (
    _check_count,
    complete,
    erdos_renyi,
    exponential,
    one_peer_exponential,
    random_regular,
    ring,
    social,
    star,
    torus,
)
from fedcore.topology.graph import TrustGraph
from fedcore.topology.schedule import Schedule, Topology

__all__ = ["KINDS", "build", "parse_spec"]

KINDS: tuple[str, ...] = registry.TOPOLOGY_KINDS.builtin
"""Every topology kind a config or spec may name (:data:`fedcore.registry.TOPOLOGY_KINDS`)."""

_SPEC_GRAMMAR = (
    "KIND:NODES[:KEY=VALUE[,KEY=VALUE...]] (a torus also takes KIND:ROWSxCOLS), "
    "for example 'ring:8', 'torus:4x4', 'social:32:seed=3' or 'erdos-renyi:20:p=0.2,seed=1'; "
    f"KIND is one of {', '.join(KINDS)}"
)


def _take_int(params: dict[str, object], key: str, kind: str) -> int | None:
    value = params.pop(key, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyError(f"Parameter {key}={value!r} of topology '{kind}' must be an integer.")
    return value


# Each kind's builder, as the registry names it: (nodes, seed, parameters) -> topology.
def _kind_torus(nodes: int, seed: int, params: dict[str, object]) -> TrustGraph:
    rows = _take_int(params, "rows", "torus")
    cols = _take_int(params, "cols", "torus")
    if rows is None and cols is None:
        side = math.isqrt(nodes)
        if side * side != nodes:
            raise TopologyError(
                f"A torus of {nodes} nodes needs rows and cols because {nodes} is not a perfect "
                "square. Give them, for example 'torus:3x4' or build('torus', nodes=12, rows=3, "
                "cols=4)."
            )
        rows = cols = side
    elif rows is None or cols is None:
        given = rows if rows is not None else cols
        assert given is not None
        if given <= 0 or nodes % given:
            raise TopologyError(
                f"A torus of {nodes} nodes cannot have {given} rows or columns: {nodes} is not "
                f"a multiple of {given}. Give rows and cols whose product is {nodes}."
            )
        rows, cols = (given, nodes // given) if rows is not None else (nodes // given, given)
    if rows * cols != nodes:
        raise TopologyError(
            f"A torus of rows={rows} and cols={cols} has {rows * cols} nodes, not {nodes}. "
            "Make nodes equal rows * cols."
        )
    return torus(rows, cols)


def _kind_random_regular(nodes: int, seed: int, params: dict[str, object]) -> TrustGraph:
    degree = _take_int(params, "degree", "random-regular")
    return random_regular(nodes, 4 if degree is None else degree, seed=seed)


def _kind_erdos_renyi(nodes: int, seed: int, params: dict[str, object]) -> TrustGraph:
    p = params.pop("p", 0.3)
    if isinstance(p, bool) or not isinstance(p, int | float):
        raise TopologyError(f"Parameter p={p!r} of topology 'erdos-renyi' must be a number.")
    return erdos_renyi(nodes, float(p), seed=seed)


def _kind_ring(n: int, s: int, p: dict[str, object]) -> Topology:
    return ring(n)


def _kind_directed_ring(n: int, s: int, p: dict[str, object]) -> Topology:
    return ring(n, directed=True)


def _kind_exponential(n: int, s: int, p: dict[str, object]) -> Topology:
    return exponential(n)


def _kind_complete(n: int, s: int, p: dict[str, object]) -> Topology:
    return complete(n)


def _kind_social(n: int, s: int, p: dict[str, object]) -> Topology:
    return social(n, seed=s)


def _kind_one_peer_exponential(n: int, s: int, p: dict[str, object]) -> Topology:
    return one_peer_exponential(n)


def _kind_star(n: int, s: int, p: dict[str, object]) -> Topology:
    return star(n, server=str(p.get("server", "server")))


def _epidemic(kind: str, params: dict[str, object]) -> tuple[object, object]:
    """The ``degree`` (default 4, as ``[topology]``'s) and ``period`` of an epidemic kind,
    left to its generator to check; no period is refused here, in one line."""
    if "period" not in params:
        raise TopologyError(
            f"Topology '{kind}' needs period, the rounds of fresh graphs before it repeats "
            f"(for example '{kind}:16:degree=2,period=100'; in a config, topology.period = 0 "
            "is the run's rounds)."
        )
    return params.pop("degree", 4), params.pop("period")


def _kind_epidemic_local(n: int, s: int, p: dict[str, object]) -> Topology:
    degree, period = _epidemic("epidemic-local", p)
    return epidemic_local(n, degree, seed=s, period=period)  # type: ignore[arg-type]


def _kind_epidemic_oracle(n: int, s: int, p: dict[str, object]) -> Topology:
    degree, period = _epidemic("epidemic-oracle", p)
    return epidemic_oracle(n, degree, seed=s, period=period)  # type: ignore[arg-type]


def build(kind: str, *, nodes: int, seed: int = 0, **params: object) -> Topology:
    """Build a topology by kind name, as configs and the CLI name them.

    Args:
        kind: One of :data:`KINDS`.
        nodes: Number of nodes.
        seed: Seed of the random kinds (``erdos-renyi``, ``social``, ``random-regular``,
            ``epidemic-local``, ``epidemic-oracle``); others ignore it.
        **params: Kind-specific parameters: ``rows`` and ``cols`` for ``torus`` (default: a
            square of side ``isqrt(nodes)``), ``p`` for ``erdos-renyi`` (default 0.3),
            ``degree`` for ``random-regular`` (default 4), ``server`` for ``star`` (the
            server's id, default ``"server"``; ``nodes`` counts the workers), ``degree``
            (default 4) and ``period`` (required) for ``epidemic-local`` and
            ``epidemic-oracle`` (:mod:`fedcore.topology.epidemic`).

    Raises:
        TopologyError: On an unknown kind, an unknown parameter or a bad value.
    """
    if kind not in registry.TOPOLOGY_KINDS:
        hint = registry.TOPOLOGY_KINDS.did_you_mean(kind)
        raise TopologyError(
            f"Unknown topology kind {kind!r}"
            + (f"; {hint}" if hint else "")
            + f" Use one of: {', '.join(KINDS)}."
        )
    allowed = registry.TOPOLOGY_KINDS.entry(kind).keys
    builder: Callable[[int, int, dict[str, object]], Topology] = registry.TOPOLOGY_KINDS.load(kind)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) if allowed else "no parameters besides nodes and seed"
        hints = [registry.did_you_mean(u, allowed) for u in unknown]
        takes += "".join(f" ({h})" for h in hints if h)
        raise TopologyError(
            f"Unknown parameter(s) {', '.join(unknown)} for topology kind '{kind}'; it takes "
            f"{takes}."
        )
    nodes = _check_count(nodes, f"number of nodes of a '{kind}' topology")
    seed = _check_count(seed, "seed", minimum=0, maximum=SEED_LIMIT - 1)
    if kind in registry.TOPOLOGY_KINDS.builtin:
        return builder(nodes, seed, dict(params))
    return _plugged_in(kind, builder, nodes, seed, dict(params))


def _plugged_in(
    kind: str,
    builder: Callable[[int, int, dict[str, object]], Topology],
    nodes: int,
    seed: int,
    params: dict[str, object],
) -> Topology:
    """What a plug-in's builder makes: a failure or anything but a graph, one line."""
    what = f"topology kind {kind!r} ({registry.TOPOLOGY_KINDS.entry(kind).target})"
    try:
        made = builder(nodes, seed, params)
    except FedcoreError:
        raise
    except Exception as exc:  # a plug-in's builder can raise anything
        raise TopologyError(
            f"{what} failed: {error_text(exc)}; fix it (fedcore -v shows the traceback)."
        ) from exc
    if not isinstance(made, TrustGraph | Schedule):
        raise TopologyError(f"{what} returned {type(made).__name__}, not a TrustGraph or Schedule.")
    return made


def _parse_value(text: str) -> object:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str) -> Topology:
    """Build a topology from a short spec such as ``"ring:8"`` or ``"social:32:seed=3"``.

    The grammar is ``KIND:NODES[:KEY=VALUE[,KEY=VALUE...]]``; a torus may give ``ROWSxCOLS`` in
    place of NODES (``"torus:4x4"``). ``seed`` is one of the keys; the others are
    :func:`build`'s parameters.

    Raises:
        TopologyError: If the spec does not parse (the message shows the grammar) or
            :func:`build` refuses it.
    """

    def fail(why: str) -> TopologyError:
        return TopologyError(f"Topology spec {spec!r} {why}. Write it as {_SPEC_GRAMMAR}.")

    if not isinstance(spec, str):
        raise fail("is not a string")
    parts = spec.strip().split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise fail("does not have the form KIND:NODES")
    kind, count = parts[0].strip(), parts[1].strip()
    if kind not in registry.TOPOLOGY_KINDS:  # a built-in kind, or a plug-in's
        raise fail(f"names the unknown kind {kind!r}")
    params: dict[str, object] = {}
    if len(parts) == 3:
        for item in parts[2].split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise fail(f"has the parameter {item!r}, which is not KEY=VALUE")
            params[key.strip()] = _parse_value(value.strip())
    rows, x, cols = count.lower().partition("x")
    if x and kind == "torus":
        if not (rows.isdigit() and cols.isdigit()):
            raise fail(f"has the torus size {count!r}, which is not ROWSxCOLS")
        params.update(rows=int(rows), cols=int(cols))
        nodes = int(rows) * int(cols)
    elif count.isdigit():
        nodes = int(count)
    else:
        raise fail(f"has the node count {count!r}, which is not a whole number")
    seed = params.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise fail(f"has seed={seed!r}, which is not a whole number")
    return build(kind, nodes=nodes, seed=seed, **params)
