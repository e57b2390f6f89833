"""Trust graph generators, the ``build`` registry and the ``KIND:NODES`` spec parser.

Every generator names its nodes ``"n0" ... "n{N-1}"`` in that order and returns an unweighted
graph; :func:`fedcore.topology.prepare` adds mixing weights. Random generators take an explicit
seed and use only ``random.Random(seed).random()``, whose stream Python keeps stable across
versions, so a seed names the same graph everywhere (shipped files depend on it).

Generators build index arrays (numpy), never a networkx graph or a Python tuple per edge, so
a million-node graph takes seconds. Where the edges follow from a random stream drawn one
number at a time, the array form draws the very same numbers: Erdős–Rényi reads Python's
Mersenne Twister words through numpy's MT19937 started from the same state, and
random-regular replays networkx's pairing method (Python's own shuffle, then the pairing
passes in numpy), so every seed keeps its graph (``tests/topology/test_pins.py``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from fedcore import registry
from fedcore.config import MAX_NODES, SEED_LIMIT
from fedcore.errors import FedcoreError, TopologyError
from fedcore.ids import check_node_id, error_text
from fedcore.topology.graph import TrustGraph
from fedcore.topology.schedule import Schedule, Topology

__all__ = [
    "KINDS",
    "build",
    "complete",
    "erdos_renyi",
    "exponential",
    "one_peer_exponential",
    "parse_spec",
    "random_regular",
    "ring",
    "social",
    "star",
    "torus",
]

KINDS: tuple[str, ...] = registry.TOPOLOGY_KINDS.builtin
"""Every topology kind a config or spec may name (:data:`fedcore.registry.TOPOLOGY_KINDS`)."""

MAX_PAIRS = 10**8
"""Most ordered node pairs ``erdos_renyi`` may draw for (one random number each): 10,000
nodes, under a minute of drawing; beyond it a typo costs hours."""
MAX_EDGES = 10**7
"""Most edges ``complete`` may build (about 3,000 nodes): each edge costs a few hundred
bytes in the graph, so 10**7 edges are gigabytes already."""

_SPEC_GRAMMAR = (
    "KIND:NODES[:KEY=VALUE[,KEY=VALUE...]] (a torus also takes KIND:ROWSxCOLS), "
    "for example 'ring:8', 'torus:4x4', 'social:32:seed=3' or 'erdos-renyi:20:p=0.2,seed=1'; "
    f"KIND is one of {', '.join(KINDS)}"
)


def _names(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


def _check_count(value: object, what: str, minimum: int = 2, maximum: int = MAX_NODES) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TopologyError(f"The {what} must be an integer of at least {minimum}, not {value!r}.")
    if value > maximum:
        raise TopologyError(f"The {what} must be at most {maximum:,}, not {value:,}.")
    return value


def _check_pairs(n: int, what: str, limit: int) -> None:
    """Refuse a generator that would visit more than ``limit`` ordered pairs of nodes."""
    if n * (n - 1) > limit:
        raise TopologyError(
            f"A {what} of {n:,} nodes has {n * (n - 1):,} ordered pairs of nodes, more than the "
            f"{limit:,} it may visit; use fewer nodes or a sparse kind (ring, exponential, "
            "social)."
        )


_Ints = npt.NDArray[np.int64]


def _from_index_edges(name: str, n: int, src: npt.ArrayLike, dst: npt.ArrayLike) -> TrustGraph:
    return TrustGraph.from_index_edges(src, dst, name=name, nodes=_names(n), trusted_ids=True)


def _both_ways(src: _Ints, dst: _Ints) -> tuple[_Ints, _Ints]:
    return np.concatenate([src, dst]), np.concatenate([dst, src])


def ring(n: int, *, directed: bool = False) -> TrustGraph:
    """A cycle ``n0 -> n1 -> ... -> n{n-1} -> n0``; both ways unless ``directed``.

    Args:
        n: Number of nodes, at least 2 (an undirected 2-ring is one edge each way).
        directed: Keep only the forward direction, giving every node one in- and one out-edge.
    """
    n = _check_count(n, "number of ring nodes")
    src = np.arange(n, dtype=np.int64)
    dst = (src + 1) % n
    if not directed:
        src, dst = _both_ways(src, dst)
    return _from_index_edges(f"{'directed-' if directed else ''}ring-{n}", n, src, dst)


def exponential(n: int) -> TrustGraph:
    """The static exponential graph: node i sends to ``(i + 2**k) % n`` for every ``2**k < n``.

    Each node has ``ceil(log2 n)`` out-neighbours, yet information spreads in ``log2 n`` hops,
    which is why SGP and OPS experiments use it.
    """
    n = _check_count(n, "number of exponential-graph nodes")
    offsets = np.array([2**k for k in range(n.bit_length()) if 2**k < n], dtype=np.int64)
    src = np.repeat(np.arange(n, dtype=np.int64), offsets.size)
    return _from_index_edges(f"exponential-{n}", n, src, (src + np.tile(offsets, n)) % n)


def torus(rows: int, cols: int) -> TrustGraph:
    """An undirected 2-D periodic grid; node ``r * cols + c`` sits at row r, column c.

    Each node links to its up, down, left and right neighbour with wrap-around. With 2 rows or
    2 columns the two vertical (or horizontal) neighbours coincide, so such nodes have degree 3
    (2 for a 2x2 torus) and no edge is listed twice.
    """
    rows = _check_count(rows, "number of torus rows")
    cols = _check_count(cols, "number of torus columns")
    _check_count(rows * cols, "number of torus nodes (rows * cols)")
    r, c = np.divmod(np.arange(rows * cols, dtype=np.int64), cols)
    here = r * cols + c
    src = np.concatenate([here] * 4)
    dst = np.concatenate(
        [
            ((r + dr) % rows) * cols + (c + dc) % cols
            for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))
        ]
    )
    return _from_index_edges(f"torus-{rows}x{cols}", rows * cols, src, dst)


def complete(n: int) -> TrustGraph:
    """Every node sends to every other node."""
    n = _check_count(n, "number of complete-graph nodes")
    _check_pairs(n, "complete graph", MAX_EDGES)
    src, dst = np.divmod(np.arange(n * n, dtype=np.int64), n)
    off = src != dst
    return _from_index_edges(f"complete-{n}", n, src[off], dst[off])


def star(n: int, *, server: str = "server") -> TrustGraph:
    """``n`` workers ``n0 .. n{n-1}`` and a parameter server ``server`` (the last node),
    with edges both ways between the server and every worker and none between workers: the
    trust graph of the server family (FedAvg, DoubleSqueeze, APMSqueeze).

    Raises:
        TopologyError: fewer than one worker, or a server id that is not a valid node id or
            is a worker's name.
    """
    n = _check_count(n, "number of star workers", minimum=1)
    workers = _names(n)
    check_node_id(server, "the server of a star (topology.server)", TopologyError)
    if server in workers:
        raise TopologyError(
            f"The server id {server!r} of a star is also a worker's name; workers are "
            f"n0..n{n - 1}. Pick another topology.server."
        )
    spokes = np.arange(n, dtype=np.int64)
    hub = np.full(n, n, dtype=np.int64)
    src, dst = _both_ways(spokes, hub)
    return TrustGraph.from_index_edges(src, dst, name=f"star-{n}", nodes=[*workers, server])


def erdos_renyi(n: int, p: float, *, seed: int) -> TrustGraph:
    """A directed G(n, p) graph: each ordered pair is an edge with probability p.

    Connectivity is not forced; :func:`fedcore.topology.prepare` reports a graph that is not
    strongly connected, which keeps the model honest for studies of sparse random graphs.
    """
    n = _check_count(n, "number of Erdős–Rényi nodes")
    _check_pairs(n, "Erdős–Rényi graph", MAX_PAIRS)
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise TopologyError(f"The edge probability p must be a number in [0, 1], not {p!r}.")
    seed = _check_count(seed, "seed", minimum=0, maximum=SEED_LIMIT - 1)
    draws = _PythonUniforms(random.Random(seed))
    srcs, dsts = [], []
    rows = max(1, 2**22 // n)  # draws of about 4M pairs at a time
    for first in range(0, n, rows):
        u, v = np.divmod(np.arange(first * n, min(n, first + rows) * n, dtype=np.int64), n)
        u, v = u[u != v], v[u != v]  # a node draws nothing for itself
        hit = draws.next(u.size) < p
        srcs.append(u[hit])
        dsts.append(v[hit])
    return _from_index_edges(
        f"erdos-renyi-{n}-p{p:g}-seed{seed}", n, np.concatenate(srcs), np.concatenate(dsts)
    )


class _PythonUniforms:
    """The numbers ``rng.random()`` would return next, many at a time.

    numpy's MT19937 started from ``rng``'s state gives the same 32-bit words, and a
    ``random()`` double is made from two of them exactly as CPython makes it (27 and 26
    high bits, scaled by ``2**-53``), so ``next(k)`` equals ``k`` calls of ``rng.random()``.
    """

    def __init__(self, rng: random.Random) -> None:
        state = rng.getstate()[1]
        self._bits = np.random.MT19937()
        self._bits.state = {
            "bit_generator": "MT19937",
            "state": {"key": np.array(state[:-1], dtype=np.uint32), "pos": state[-1]},
        }

    def next(self, count: int) -> npt.NDArray[np.float64]:
        """The next ``count`` draws."""
        words = self._bits.random_raw(2 * count)
        high = (words[0::2] >> np.uint64(5)).astype(np.float64)
        low = (words[1::2] >> np.uint64(6)).astype(np.float64)
        return (high * 67108864.0 + low) * (1.0 / 9007199254740992.0)


def random_regular(n: int, degree: int, *, seed: int) -> TrustGraph:
    """A seeded random ``degree``-regular undirected graph, as edges both ways.

    Every node trusts and is trusted by exactly ``degree`` others, chosen at random (the
    DOG paper's "each node linked to about 15 random others", with every degree equal, so
    Metropolis-Hastings weights are uniform). Built in ``O(n * degree)`` (networkx's
    pairing method), so 100,000 nodes take seconds. Connectivity is not forced, but a random
    regular graph of degree 3 or more is connected with high probability; ``prepare``
    reports one that is not.
    """
    n = _check_count(n, "number of random-regular nodes")
    degree = _check_count(degree, "degree of a random-regular graph", minimum=1, maximum=n - 1)
    if n * degree % 2:
        raise TopologyError(
            f"A {degree}-regular graph of {n} nodes does not exist: n * degree must be even."
        )
    seed = _check_count(seed, "seed", minimum=0, maximum=SEED_LIMIT - 1)
    rng = random.Random(seed)  # what networkx.random_regular_graph(degree, n, seed) draws from
    keys = _pairing(n, degree, rng)
    while keys is None:
        keys = _pairing(n, degree, rng)
    src, dst = _both_ways(*np.divmod(keys, n))
    return _from_index_edges(f"random-regular-{n}-d{degree}-seed{seed}", n, src, dst)


def _known(keys: _Ints, sorted_keys: _Ints) -> npt.NDArray[np.bool_]:
    """Which of ``keys`` are in ``sorted_keys`` (ascending)."""
    if not sorted_keys.size:
        return np.zeros(keys.size, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    found: npt.NDArray[np.bool_] = sorted_keys[at] == keys
    return found


def _pairing(n: int, degree: int, rng: random.Random) -> _Ints | None:
    """One try of networkx's pairing method (``random_regular_graph``'s ``_try_creation``,
    networkx 3.x), drawing the same numbers from ``rng``: the edges ``u < v`` as keys
    ``u * n + v``, sorted, or None where the try failed.

    Each pass shuffles the stubs with ``rng.shuffle`` (Python's, as networkx) and pairs
    them in order; a pair becomes an edge unless it is a loop or repeats an edge (one made
    earlier in the pass included). The nodes of failed pairs, in order of first
    appearance and once per failed pair, are the next pass's stubs. A pass whose leftover
    nodes have no non-edge pair among them fails the try.
    """
    stubs: list[int] = list(range(n)) * degree
    made: list[_Ints] = []  # sorted keys of earlier passes
    base = np.zeros(0, dtype=np.int64)
    while stubs:
        rng.shuffle(stubs)
        pairs = np.array(stubs, dtype=np.int64).reshape(-1, 2)
        s1, s2 = pairs.min(axis=1), pairs.max(axis=1)
        key = s1 * n + s2
        ok = s1 != s2
        ok &= ~_known(key, base)
        for extra in made[1:]:
            ok &= ~_known(key, extra)
        cand = np.flatnonzero(ok)
        _, first = np.unique(key[cand], return_index=True)
        taken = np.zeros(key.size, dtype=bool)
        taken[cand[first]] = True  # the first of repeated pairs becomes the edge
        fresh = np.sort(key[taken])
        if not made:
            base = fresh
        made.append(fresh)
        failed = np.stack([s1[~taken], s2[~taken]], axis=1).reshape(-1)
        if not failed.size:
            break
        nodes, first_at, counts = np.unique(failed, return_index=True, return_counts=True)
        order = np.argsort(first_at, kind="stable")
        nodes, counts = nodes[order], counts[order]
        every = np.concatenate(made)
        every.sort()
        if not _non_edge_among(nodes, n, every):
            return None
        stubs = np.repeat(nodes, counts).tolist()
    keys = np.concatenate(made)
    keys.sort()
    return keys


def _non_edge_among(nodes: _Ints, n: int, edges: _Ints) -> bool:
    """networkx's ``_suitable`` over the leftover ``nodes`` (in order) and the sorted edge
    keys ``edges``, step for step: its inner loop swaps the outer loop's variable when
    a pair comes in descending order, which changes the pairs it looks at next, so the
    answer is not simply "some pair is not an edge"."""
    listed = nodes.tolist()

    def known(u: int, v: int) -> bool:
        key = u * n + v
        at = int(np.searchsorted(edges, key))
        return at < edges.size and int(edges[at]) == key

    for s1 in listed:
        for s2 in listed:
            if s1 == s2:
                break
            if s1 > s2:
                s1, s2 = s2, s1  # rebinds the outer variable, as networkx does
            if not known(s1, s2):
                return True
    return False


class _Popularity:
    """Integer weights of peers ``0 .. size-1`` in a Fenwick tree: add to one, or pick one.

    :meth:`pick` is the linear scan "first i whose running sum of weights exceeds
    ``rng.random() * total``" in ``O(log n)``; sums are exact integers compared with the
    same float target, so it picks exactly what the scan picks (graphs stay the same for a
    seed) while growing an n-node graph takes ``O(n log n)``, not ``O(n**2)``.
    """

    __slots__ = ("_step", "_total", "_tree")

    def __init__(self, size: int) -> None:
        self._tree = [0] * (size + 1)
        self._total = 0
        self._step = 1 << size.bit_length()

    def add(self, i: int, delta: int) -> None:
        """Add ``delta`` to the weight of peer ``i``."""
        self._total += delta
        i += 1
        while i < len(self._tree):
            self._tree[i] += delta
            i += i & -i

    def pick(self, rng: random.Random, present: int) -> int:
        """The first peer whose running weight sum exceeds one ``rng.random()`` draw times
        the total; ``present - 1`` when rounding puts the draw at the total (as the scan)."""
        target = rng.random() * self._total
        pos, acc, step = 0, 0, self._step
        while step:
            nxt = pos + step
            if nxt < len(self._tree) and acc + self._tree[nxt] <= target:
                pos = nxt
                acc += self._tree[nxt]
            step >>= 1
        return min(pos, present - 1)


def _social_edges(n: int, follows: int, rng: random.Random) -> set[tuple[int, int]]:
    """Grow a one-way trust graph by preferential attachment on popularity.

    Start from a directed cycle of ``follows + 1`` peers. Each newcomer ``v`` then trusts
    ``follows`` distinct existing peers, each picked with probability proportional to
    (number of peers already trusting it) + 1, i.e. edges ``u -> v``; and one existing peer
    picked uniformly trusts the newcomer back, edge ``v -> w``. Popular peers become hubs
    that many trust (heavy-tailed out-degree), every peer listens to at least one other, and
    every newcomer both reaches and is reached by the strongly connected core, so the whole
    graph is strongly connected by construction with no repair step. A peer already picked
    weighs 0 until the newcomer has all its picks (:class:`_Popularity` keeps it
    ``O(n log n)``).
    """
    core = min(n, follows + 1)
    edges = {(i, (i + 1) % core) for i in range(core)} if core > 1 else set()
    weights = _Popularity(n)  # (out-degree so far) + 1 of each peer
    for u in range(core):
        weights.add(u, 2)
    popularity = [1] * core  # out-degree of each peer so far
    for v in range(core, n):
        chosen: set[int] = set()
        while len(chosen) < follows:
            u = weights.pick(rng, v)
            if u not in chosen:
                chosen.add(u)
                weights.add(u, -(popularity[u] + 1))
        for u in sorted(chosen):
            edges.add((u, v))
            popularity[u] += 1
            weights.add(u, popularity[u] + 1)
        w = min(int(rng.random() * v), v - 1)
        edges.add((v, w))
        popularity.append(1)
        weights.add(v, 2)
    return edges


def social(n: int, *, seed: int, follows: int = 2) -> TrustGraph:
    """A directed scale-free "social" trust graph, strongly connected by construction.

    Newcomers trust ``follows`` popular peers (chosen by how many already trust them) and
    are trusted back by one random peer (see ``_social_edges``). Trust is one-way: the graph
    is not symmetric for n >= 4, and a few hubs are trusted by many (heavy-tailed out-degree).
    Every peer hears from at least one other, which keeps push-sum weights well conditioned.
    The name is ``social-{n}``, with a ``-seed{seed}`` suffix for seeds other than 0. Only
    ``random.Random(seed).random()`` is drawn from, so a seed gives the same graph everywhere.
    """
    n = _check_count(n, "number of social-graph nodes")
    seed = _check_count(seed, "seed", minimum=0, maximum=SEED_LIMIT - 1)
    follows = _check_count(follows, "social-graph follows", minimum=1)
    edges = _social_edges(n, follows, random.Random(seed))
    pairs = np.array(sorted(edges), dtype=np.int64).reshape(-1, 2)
    name = f"social-{n}" if seed == 0 else f"social-{n}-seed{seed}"
    return _from_index_edges(name, n, pairs[:, 0], pairs[:, 1])


def one_peer_exponential(n: int) -> Schedule:
    """The one-peer exponential schedule: in round t node i sends only to ``i + 2**(t % K)``.

    ``K = ceil(log2 n)`` rounds make one period, whose union is the static exponential graph.
    Every node sends one message a round; for n a power of two, K rounds of uniform push-sum
    averaging give the exact average.
    """
    n = _check_count(n, "number of one-peer exponential nodes")
    period = max(1, math.ceil(math.log2(n)))
    nodes = np.arange(n, dtype=np.int64)
    graphs = [
        _from_index_edges(f"one-peer-exponential-{n}-round{t}", n, nodes, (nodes + 2**t) % n)
        for t in range(period)
    ]
    return Schedule(graphs, name=f"one-peer-exponential-{n}")


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


def build(kind: str, *, nodes: int, seed: int = 0, **params: object) -> Topology:
    """Build a topology by kind name, as configs and the CLI name them.

    Args:
        kind: One of :data:`KINDS`.
        nodes: Number of nodes.
        seed: Seed of the random kinds (``erdos-renyi``, ``social``, ``random-regular``);
            others ignore it.
        **params: Kind-specific parameters: ``rows`` and ``cols`` for ``torus`` (default: a
            square of side ``isqrt(nodes)``), ``p`` for ``erdos-renyi`` (default 0.3),
            ``degree`` for ``random-regular`` (default 4), ``server`` for ``star`` (the
            server's id, default ``"server"``; ``nodes`` counts the workers).

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
    if kind not in KINDS:
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
