"""Hash pins: every generator, weight rule, neighbour table and run fingerprint equals what
the per-edge Python code made before set-up moved to arrays (issue 25).

The hashes were recorded with that code (commit 9d8cbce) on these seeded graphs; a change
of any edge, weight (to the last bit), node order, name or table entry changes a hash. A
user's seed must keep naming the same graph, so a failure here is a bug, not a pin to
refresh.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import torch

from fedcore import topology
from fedcore.config import load_config
from fedcore.engines.stacked_graph import stack_graph
from fedcore.setup.graph import build_topology
from fedcore.setup.prepare import prepare_run
from fedcore.topology import Schedule, TrustGraph

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ring-2": ("ring", {"nodes": 2}),
    "ring-3": ("ring", {"nodes": 3}),
    "ring-100": ("ring", {"nodes": 100}),
    "directed-ring-2": ("directed-ring", {"nodes": 2}),
    "directed-ring-9": ("directed-ring", {"nodes": 9}),
    "exponential-2": ("exponential", {"nodes": 2}),
    "exponential-5": ("exponential", {"nodes": 5}),
    "exponential-16": ("exponential", {"nodes": 16}),
    "exponential-100": ("exponential", {"nodes": 100}),
    "torus-2x2": ("torus", {"nodes": 4}),
    "torus-2x3": ("torus", {"nodes": 6, "rows": 2}),
    "torus-3x4": ("torus", {"nodes": 12, "rows": 3, "cols": 4}),
    "torus-10x10": ("torus", {"nodes": 100}),
    "complete-2": ("complete", {"nodes": 2}),
    "complete-5": ("complete", {"nodes": 5}),
    "complete-30": ("complete", {"nodes": 30}),
    "erdos-renyi-10-s0": ("erdos-renyi", {"nodes": 10, "p": 0.3}),
    "erdos-renyi-10-s1": ("erdos-renyi", {"nodes": 10, "p": 0.3, "seed": 1}),
    "erdos-renyi-60-s7": ("erdos-renyi", {"nodes": 60, "p": 0.1, "seed": 7}),
    "erdos-renyi-30-p1": ("erdos-renyi", {"nodes": 30, "p": 1.0, "seed": 2}),
    "social-2": ("social", {"nodes": 2}),
    "social-3": ("social", {"nodes": 3}),
    "social-10": ("social", {"nodes": 10}),
    "social-200-s3": ("social", {"nodes": 200, "seed": 3}),
    "social-3000-s5": ("social", {"nodes": 3000, "seed": 5}),
    "random-regular-10-d3": ("random-regular", {"nodes": 10, "degree": 3}),
    "random-regular-11-d4-s1": ("random-regular", {"nodes": 11, "degree": 4, "seed": 1}),
    "random-regular-100-d4-s1": ("random-regular", {"nodes": 100, "degree": 4, "seed": 1}),
    "random-regular-500-d15-s2": ("random-regular", {"nodes": 500, "degree": 15, "seed": 2}),
    "random-regular-3000-d5-s3": ("random-regular", {"nodes": 3000, "degree": 5, "seed": 3}),
    "random-regular-20-d19": ("random-regular", {"nodes": 20, "degree": 19}),
    "one-peer-exponential-5": ("one-peer-exponential", {"nodes": 5}),
    "one-peer-exponential-16": ("one-peer-exponential", {"nodes": 16}),
    "star-2": ("star", {"nodes": 2}),
    "star-6": ("star", {"nodes": 6}),
}
"""Generator cases: name -> (kind, build's keywords)."""


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:24]


def _graph_record(g: TrustGraph) -> list[Any]:
    return [g.name, list(g.nodes), [[u, v, w] for u, v, w in g.weighted_edges()]]


def graph_hash(t: topology.Topology) -> str:
    """The hash of a topology's name, node order and edges (weights included, bit exact:
    JSON writes floats with ``repr``)."""
    graphs = t.graphs if isinstance(t, Schedule) else (t,)
    return _digest([t.name, [_graph_record(g) for g in graphs]])


def _built(case: str) -> topology.Topology:
    kind, params = CASES[case]
    params = dict(params)
    return topology.build(kind, nodes=params.pop("nodes"), seed=params.pop("seed", 0), **params)


def _symmetric(t: topology.Topology) -> bool:
    graphs = t.graphs if isinstance(t, Schedule) else (t,)
    return all(g.is_symmetric() for g in graphs)


def table_hash(g: TrustGraph) -> str:
    """The hash of every tensor of the vectorized engine's table of ``g``."""
    stacked = stack_graph(g, device=torch.device("cpu"))
    parts = [
        stacked.n,
        *(
            getattr(stacked, name).tolist()
            for name in (
                "src",
                "dst",
                "weight",
                "self_weight",
                "nbr",
                "slot_edge",
                "out_order",
                "edge_id",
            )
        ),
        list(stacked.cache["rank"]),
    ]
    return _digest(parts)


GRAPHS: dict[str, str] = {
    "complete-2": "7d7de52262e7eed6b8f61c8e",
    "complete-30": "ce85a71e819157c26bef66ad",
    "complete-5": "b84ac4ec50f66c599ee07acc",
    "directed-ring-2": "0d06fbca29924ca8781dd2cf",
    "directed-ring-9": "a139c38dd94d1eee0f8f6814",
    "erdos-renyi-10-s0": "189e5f72d3ad9e4b96e78d7a",
    "erdos-renyi-10-s1": "8d1baa04d866ae5b551a2e00",
    "erdos-renyi-30-p1": "58de899a37f9c72d95196819",
    "erdos-renyi-60-s7": "af03dc66a0a677cc7c80678c",
    "exponential-100": "abce8a19c007c4da2f532cab",
    "exponential-16": "51a9143e2dda97239ffc432d",
    "exponential-2": "be852dd874482940de7c671e",
    "exponential-5": "48e85a4aa60455504a6e1c7c",
    "one-peer-exponential-16": "a24207ffd890d7d5de0ac5e2",
    "one-peer-exponential-5": "4122be6fbfd83cef30d2b00f",
    "random-regular-10-d3": "de1f29965fc0f08a6eb0399d",
    "random-regular-100-d4-s1": "caeea563419ce0e6788c7864",
    "random-regular-11-d4-s1": "297bf41c93fd70eec0064367",
    "random-regular-20-d19": "5f02c45384f3ec30171f743e",
    "random-regular-3000-d5-s3": "5e6fb3c107546501bf519245",
    "random-regular-500-d15-s2": "88006714e33c02d88d16519c",
    "ring-100": "da18a8789c0fcc337a12441f",
    "ring-2": "e61b9ff5e1e843f1b2197630",
    "ring-3": "7c2d709b220514090bf68512",
    "social-10": "0c90c8e0f36ac8f48c7f5ff2",
    "social-2": "9fea10284078cb41bb7f6af1",
    "social-200-s3": "24c5cca6359929baadda8f72",
    "social-3": "cd415c2263c22245849a9e28",
    "social-3000-s5": "2ea4c28123342ecc302ce5e0",
    "star-2": "766677c83108784521d7e863",
    "star-6": "cede230ddd2c1cb8da3533a4",
    "torus-10x10": "a9bc4ccc5faed3911c4dc190",
    "torus-2x2": "708a359b760777286ff98376",
    "torus-2x3": "90035e2aece278a130a1e2e7",
    "torus-3x4": "835b41e74e888655114444e1",
}
PUSH_SUM: dict[str, str] = {
    "complete-2": "09cee01220db20bd97fecda0",
    "complete-30": "c73525081fbf1abedfa313f7",
    "complete-5": "a3a170d4a2d09de8bb023b56",
    "directed-ring-2": "996460bd829e005c7bd48aed",
    "directed-ring-9": "7209c5c29a7f61fdcddd43fd",
    "erdos-renyi-10-s0": "e1f8a8b813e3175755c88b83",
    "erdos-renyi-10-s1": "3968b72dea2920353572a9b7",
    "erdos-renyi-30-p1": "5519bae5a39d3afd540cb8df",
    "erdos-renyi-60-s7": "9087674c2d997207a0c1d79a",
    "exponential-100": "733ecc0f4ed5177d16ddf054",
    "exponential-16": "2ccafcba67954eadd5803b83",
    "exponential-2": "7fc941f2d1a49bec37b011d8",
    "exponential-5": "50af1ddfbe34a6aa18dda499",
    "one-peer-exponential-16": "544b9e25c3d8b1e405ba3e04",
    "one-peer-exponential-5": "54a6dd9e90eb381e39ae14f3",
    "random-regular-10-d3": "07fee4c7be422c41d6ddc4b3",
    "random-regular-100-d4-s1": "1b961d2bc00bf557d5da425a",
    "random-regular-11-d4-s1": "6496f20a287a2b06299a58c0",
    "random-regular-20-d19": "3624592e175e3f9684bad8a7",
    "random-regular-3000-d5-s3": "6a9d690d29ba2f25a7eadd27",
    "random-regular-500-d15-s2": "8b985ac034a53d1cf1db3957",
    "ring-100": "363de132f043e907b42eedc4",
    "ring-2": "b2d2100d29ae72708c142af7",
    "ring-3": "99c6e11ab6591cc55b5a663a",
    "social-10": "0a1033286fa59546801af401",
    "social-2": "64955bc61574065eaad69fc2",
    "social-200-s3": "0039f34a7a908358ecbd8395",
    "social-3": "13a18ef7c5977abfe745f5cd",
    "social-3000-s5": "0b081bde3906f2f621da4db2",
    "star-2": "80c74e174d8b3e5923bb59fa",
    "star-6": "96229bc9562a7fc71846d922",
    "torus-10x10": "1edf289ecf6dc6885930b250",
    "torus-2x2": "29c3dbab6962ee8ff9798fcd",
    "torus-2x3": "4c956c39e5ad4b8eac3ace34",
    "torus-3x4": "3fa7241a7dbe36e570a4fdba",
}
METROPOLIS: dict[str, str] = {
    "complete-2": "09cee01220db20bd97fecda0",
    "complete-30": "32192ae1b87a32590b764544",
    "complete-5": "a91cc89442e859355f7bfcf5",
    "directed-ring-2": "996460bd829e005c7bd48aed",
    "erdos-renyi-30-p1": "84933316bf652aa4be8252ee",
    "exponential-2": "7fc941f2d1a49bec37b011d8",
    "random-regular-10-d3": "07fee4c7be422c41d6ddc4b3",
    "random-regular-100-d4-s1": "5d00a2f9d9549efc01076374",
    "random-regular-11-d4-s1": "a3dac4720d9125e5a450fe0a",
    "random-regular-20-d19": "628acc4f883450709051b555",
    "random-regular-3000-d5-s3": "423ec105ec918ac6e576d626",
    "random-regular-500-d15-s2": "8b985ac034a53d1cf1db3957",
    "ring-100": "a2dbbe9d18892275a761a538",
    "ring-2": "b2d2100d29ae72708c142af7",
    "ring-3": "7f91d2f5aab817a75f3c013b",
    "social-2": "64955bc61574065eaad69fc2",
    "star-2": "cb487cd3fa2d7ab2965760b3",
    "star-6": "e61d27d2915526b40de228e7",
    "torus-10x10": "c824e7ba33cd402e10d9b5e7",
    "torus-2x2": "1ec81823e79d6935148edfa7",
    "torus-2x3": "4c956c39e5ad4b8eac3ace34",
    "torus-3x4": "827bba8f29987443539a3fde",
}
TABLES: dict[str, str] = {
    "complete-2": "9613df33a95b97fd9c6e7a0e",
    "complete-30": "450b82c059e92e3fdae2d01d",
    "complete-5": "1437874b8ba7fbd997c20cd4",
    "directed-ring-2": "9613df33a95b97fd9c6e7a0e",
    "directed-ring-9": "eb681d16c0a65fc0b5db542b",
    "erdos-renyi-10-s0": "26af591da061c32b32edf79a",
    "erdos-renyi-10-s1": "86e5f45c8d229ec4630f7737",
    "erdos-renyi-30-p1": "450b82c059e92e3fdae2d01d",
    "erdos-renyi-60-s7": "28e412cedb0922792427195a",
    "exponential-100": "6fd229bd8424b5d3d77de1d3",
    "exponential-16": "bd39d26ed63078d77bf98a2a",
    "exponential-2": "9613df33a95b97fd9c6e7a0e",
    "exponential-5": "a65b426c71c2fd584272167a",
    "random-regular-10-d3": "053a3cbb2c32269f278a85b8",
    "random-regular-100-d4-s1": "821a440e28e5f09cf9b2a200",
    "random-regular-11-d4-s1": "264f6ae3ea75828f7da8ebf3",
    "random-regular-20-d19": "14a367732e074edb1b3cfe42",
    "random-regular-3000-d5-s3": "cc76301ccb21649c3c5481d0",
    "random-regular-500-d15-s2": "944cf3aab45dfafc4a028b4a",
    "ring-100": "ea3f9576e994fc7c82d74247",
    "ring-2": "9613df33a95b97fd9c6e7a0e",
    "ring-3": "a6963442ddc771c4d604be6d",
    "social-10": "e0ee7a18c0a87a7fd7def789",
    "social-2": "9613df33a95b97fd9c6e7a0e",
    "social-200-s3": "98abb73b34c003d8ef444073",
    "social-3": "07a09e3ad5ea49304624ff70",
    "social-3000-s5": "29a3a67c597792949d8b89f9",
    "star-2": "9a007b52a7d5812ce11e1fab",
    "star-6": "8fbd2bb79a7b0f3354a05e23",
    "torus-10x10": "ed8a8746b3d8108db843b66d",
    "torus-2x2": "41f52c7a5c91a9da91dd9a1b",
    "torus-2x3": "d98129e64c9b24d21a001d95",
    "torus-3x4": "8b21d408e094bc7e28631a50",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_generator_graph(case: str) -> None:
    assert graph_hash(_built(case)) == GRAPHS[case]


@pytest.mark.parametrize("case", sorted(CASES))
def test_push_sum_weights(case: str) -> None:
    assert graph_hash(topology.uniform_push_sum(_built(case))) == PUSH_SUM[case]


@pytest.mark.parametrize("case", sorted(CASES))
def test_metropolis_hastings_weights(case: str) -> None:
    g = _built(case)
    assert _symmetric(g) == (case in METROPOLIS)
    if case in METROPOLIS:
        assert graph_hash(topology.metropolis_hastings(g)) == METROPOLIS[case]


@pytest.mark.parametrize("case", sorted(CASES))
def test_neighbour_tables(case: str) -> None:
    g = _built(case)
    assert isinstance(g, TrustGraph) == (case in TABLES)
    if case not in TABLES:
        return
    assert isinstance(g, TrustGraph)
    mixed = topology.metropolis_hastings(g) if g.is_symmetric() else topology.uniform_push_sum(g)
    assert isinstance(mixed, TrustGraph)
    assert table_hash(mixed) == TABLES[case]


RUNS: dict[str, list[str]] = {
    "dpsgd-random-regular": [
        "algorithm.name=dpsgd",
        "topology.kind=random-regular",
        "topology.nodes=40",
        "topology.degree=5",
        "topology.seed=3",
    ],
    "ops-social": ["algorithm.name=ops", "topology.kind=social", "topology.nodes=30"],
    "dog-undirected-er": [
        "algorithm.name=dog",
        "topology.kind=erdos-renyi",
        "topology.nodes=20",
        "topology.p=0.2",
        "topology.undirected=true",
        "topology.seed=4",
    ],
    "ops-one-peer": [
        "algorithm.name=ops",
        "topology.kind=one-peer-exponential",
        "topology.nodes=8",
    ],
    "central-ring": ["algorithm.name=central", "topology.kind=ring", "topology.nodes=6"],
    "fedavg-star": ["algorithm.name=fedavg", "topology.kind=star", "topology.nodes=5"],
}
"""Configs whose run fingerprints are pinned (the digits dataset, 3 rounds)."""

FINGERPRINTS: dict[str, str] = {
    "central-ring": "96dc28f1ee176ac734bc5315d5837f9313987c710b311a6dc307151f7cd8b046",
    "dog-undirected-er": "03a9faa541619de58dad507d3b8bdedc2bb1df1e1d14ca91c5dac64b77910997",
    "dpsgd-random-regular": "e1944111c99a04d82d65908fffd115b850d2ba10e453bd48a4d5a4ea6f7da518",
    "fedavg-star": "6ef74f78cbe9905d9af0fa328d38ab8165aefc1dfbb42ddf8c9e519e44cfb233",
    "ops-one-peer": "cf925a759240daec519c5780e057586b177ae9242fd87e6c937d2ebac85f6b6b",
    "ops-social": "9fcf7ca1d08265baa951498dc2fa6c0ab0d1669e7e55f904644dc11c5833e0cf",
}
"""Re-recorded when ``transport.kind`` left the config (issue 26): each pin recorded with the
per-edge code equals this fingerprint's formula with ``"kind": "inproc"`` put back into the
transport table (checked once, for all six), so the edges part is unchanged."""


@pytest.mark.parametrize("case", sorted(RUNS))
def test_run_fingerprint(case: str) -> None:
    config = load_config(None, ["run.rounds=3", "data.stream=synthetic", *RUNS[case]])
    if config.algorithm.name == "fedavg":
        config = load_config(None, ["run.rounds=3", *RUNS[case]])
    assert prepare_run(config).run_id == FINGERPRINTS[case]
    assert build_topology(config.topology).name


@pytest.mark.parametrize(
    ("n", "degree", "seed"), [(40, 30, 3), (30, 25, 1), (60, 40, 5), (500, 7, 4)]
)
def test_random_regular_is_networkx_pairing(n: int, degree: int, seed: int) -> None:
    """Dense graphs retry passes and whole tries: still networkx's graph for the seed."""
    import networkx as nx

    ref = nx.random_regular_graph(degree, n, seed=seed)
    want = sorted({(f"n{u}", f"n{v}") for a, b in ref.edges() for u, v in ((a, b), (b, a))})
    got = topology.random_regular(n, degree, seed=seed).edges()
    assert sorted(got) == want


def test_erdos_renyi_is_python_draws() -> None:
    """The array form reads the numbers ``random.Random(seed).random()`` gives, in order."""
    import random

    n, p = 700, 0.02
    rng = random.Random(9)
    want = [(f"n{u}", f"n{v}") for u in range(n) for v in range(n) if u != v and rng.random() < p]
    assert list(topology.erdos_renyi(n, p, seed=9).edges()) == want


def _user_graph() -> TrustGraph:
    """Ids whose sorted order differs from the node order (and from their lengths)."""
    names = ["b", "a10", "A2", "a9", "z", "a1"]
    edges = [(names[i], names[j]) for i in range(6) for j in range(6) if i != j and (i + j) % 3]
    return TrustGraph.from_edges(edges, name="odd-ids", nodes=names)


def test_fingerprint_text_is_json_dumps() -> None:
    """The numpy-written edge list is ``json.dumps(sorted(...))`` byte for byte, for a
    schedule listing an edge in several rounds with different weights, for ids that sort
    differently from the node order, and for -0.0 (left to json)."""
    from fedcore.topology.digest import edges_json

    def reference(t: topology.Topology) -> bytes:
        graphs = t.graphs if isinstance(t, Schedule) else (t,)
        triples = [(u, v, g.weight(u, v)) for g in graphs for u, v in g.edges()]
        return json.dumps(sorted(triples)).encode()

    g = _user_graph()
    ring = topology.ring(6)
    twice = Schedule(
        [topology.uniform_push_sum(ring), topology.metropolis_hastings(ring)], name="two"
    )
    negative = g.with_weights({e: -0.0 if i == 3 else 0.25 for i, e in enumerate(g.edges())})
    for t in (
        topology.uniform_push_sum(g),
        twice,
        negative,
        topology.uniform_push_sum(_built("social-200-s3")),
    ):
        assert b"".join(edges_json(t)) == reference(t)


def test_edge_union_numbers_edges_by_first_appearance() -> None:
    """A schedule's union numbers each edge where it first appears, round by round (as
    the engine's dict of edges did), and every round's table finds its edges in it."""
    from fedcore.engines.stacked_graph import EdgeUnion

    t = topology.build("one-peer-exponential", nodes=6)
    assert isinstance(t, Schedule)
    mixed = topology.uniform_push_sum(t)
    assert isinstance(mixed, Schedule)
    old: dict[tuple[str, str], int] = {}
    for g in mixed.graphs:
        for e in g.edges():
            old.setdefault(e, len(old))
    union = EdgeUnion.of(mixed.graphs)
    assert len(union) == len(old)
    for g in mixed.graphs:
        stacked = stack_graph(g, union=union, device=torch.device("cpu"))
        names = g.nodes
        pairs = zip(stacked.src.tolist(), stacked.dst.tolist(), strict=True)
        assert stacked.edge_id.tolist() == [old[(names[s], names[d])] for s, d in pairs]


def test_array_views_agree_with_the_mapping_views() -> None:
    """The per-node views built from the arrays say what the arrays say."""
    g = topology.metropolis_hastings(_user_graph().union())
    assert isinstance(g, TrustGraph)
    src, dst, w = g.index_edges()
    assert w is not None
    names = g.nodes
    for s, d, x in zip(src.tolist(), dst.tolist(), w.tolist(), strict=True):
        assert g.weight(names[s], names[d]) == x
        assert names[d] in g.out_neighbours(names[s]) and names[s] in g.in_neighbours(names[d])
    assert [g.self_weight(v) for v in names] == g.self_weights().tolist()
    assert g.digraph.number_of_edges() == src.size + len(names)
    assert TrustGraph(g.digraph, name=g.name, nodes=names) == g
