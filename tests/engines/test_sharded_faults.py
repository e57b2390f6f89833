"""Codecs and fault plans on a sharded run (``fedcore simulate --ranks R``) against one
process: every sharded algorithm with ``fp32``, ``sign`` and ``topk`` (and the stochastic
``qsgd`` and ``randk``, whose draws come from each sender's own generator; push-sum's
shares of distinct weights), without faults and with drops, a partition and a crash, ends
with the one-process run's parameters (``params_sha256``), traffic, byte and fault counts,
evaluations and per-node records, on a random graph with odd ids. The world sizes 1 to 4
take turns over the matrix (each case one of them, every size many times). The halo
carries encoded rows: a compressing codec shrinks it. What stays refused is refused in one
line.

The ranks are forked processes, as in ``tests/engines/test_sharded.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from fedcore.cli import main
from fedcore.compression import make_row_codec
from fedcore.compression.rowwire import encode_rows, wire_width
from fedcore.config import Config, load_config
from fedcore.engines.halo_rows import block_sums, layout_of, pack_rows, unpack_rows
from fedcore.engines.shard_faults import RowCounts, pack_counts, unpack_counts
from fedcore.engines.shard_server import SERVER_ALGORITHMS
from fedcore.engines.sharded import EDGE_ALGORITHMS, SHARDED_ALGORITHMS, config_refusal
from fedcore.errors import FedcoreError
from fedcore.simulation.simulate import simulate
from tests.engines.test_sharded import SAME, _config, _records, run_ranks
from tests.engines.test_vectorized import GRAPHS, ODD_IDS

CODECS = {
    "fp32": [],
    "sign": ["compression.codec=sign"],
    "topk": ["compression.codec=topk", "compression.ratio=0.1"],
    "qsgd": ["compression.codec=qsgd", "compression.bits=4"],
    "randk": ["compression.codec=randk", "compression.ratio=0.2"],
    "bf16": ["compression.codec=bf16"],
    "fp16": ["compression.codec=fp16"],
}

FAULTS = [
    "faults.drop=0.2",
    f"faults.crashes=[{{node={ODD_IDS[3]!r},at=1,back=3}}]",
    f"faults.partitions=[{{nodes={list(ODD_IDS[:3])!r},start=4,end=5}}]",
]
"""Within the 6 rounds: drops every round, a peer down in rounds 1 and 2, a partition in
round 4."""

TRACKING = ("beer", "dsgt", "exact-diffusion", "push-diging", "push-pull")
"""The gradient-tracking rules: each once here, with a compressing codec and the fault plan
(BEER, which needs every message, without it); without either on R = 1, 2 and 3 in
tests/engines/test_sharded.py."""

CASES = [
    (algorithm, codec, faults)
    for algorithm in SHARDED_ALGORITHMS
    if algorithm not in EDGE_ALGORITHMS  # tests/engines/test_sharded_edges.py
    and algorithm not in SERVER_ALGORITHMS  # tests/engines/test_sharded_server.py
    and algorithm not in TRACKING
    for codec in ("fp32", "sign", "topk")
    for faults in (False, True)
    # CHOCO needs every message: a fault plan is refused by one process too.
    if not (algorithm == "choco" and faults)
] + [("dpsgd", "qsgd", True), ("deepsqueeze", "randk", True), ("dog", "bf16", False)]
CASES += [(algorithm, "sign", algorithm != "beer") for algorithm in TRACKING]


def _case(algorithm: str, codec: str, faults: bool, folder: Path, *extra: str) -> Config:
    return _config(
        algorithm,
        folder,
        *(s for s in GRAPHS[algorithm] if "topology" not in s),
        *CODECS[codec],
        *(FAULTS if faults else []),
        *extra,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded-faults")


@pytest.mark.parametrize(("algorithm", "codec", "faults"), CASES)
def test_codecs_and_faults_on_ranks_equal_one_process(
    algorithm: str, codec: str, faults: bool, folder: Path
) -> None:
    world = 1 + CASES.index((algorithm, codec, faults)) % 4
    case = f"{algorithm}-{codec}-{'faults' if faults else 'none'}"
    config = _case(algorithm, codec, faults, folder)
    assert config_refusal(config) is None
    one = folder / f"{case}-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    assert expected["engine"] == "vectorized"
    out = folder / f"{case}-{world}"
    assert run_ranks(config, world, out) == dict.fromkeys(range(world), "ok")
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert got["ranks"] == world
    for key in SAME:
        assert got.get(key) == expected.get(key), (world, key)
    sends = algorithm != "local"
    if faults:  # the plan lost messages, and a crashed peer sent none
        assert got["faults"]["down_rounds"] == {ODD_IDS[3]: [[1, 2]]}
    if faults and sends:
        assert got["traffic"]["messages_dropped"] > 0
        assert got["faults"]["lost_per_edge"] and got["faults"]["missing_per_edge"]
    if codec != "fp32" and sends:
        assert got["traffic"]["compression_ratio_vs_fp32"] > 1.5
    assert _records(out) == _records(one), world


def test_the_matrix_covers_every_world_size() -> None:
    sizes = {1 + i % 4 for i, (_, _, faults) in enumerate(CASES) if faults}
    assert sizes == {1, 2, 3, 4}
    assert {1 + i % 4 for i, (_, codec, _) in enumerate(CASES) if codec != "fp32"} == {1, 2, 3, 4}


@pytest.mark.parametrize(
    ("algorithm", "codec", "world"), [("ops", "qsgd", 3), ("dol", "sign", 2), ("ops", "randk", 2)]
)
def test_push_sum_shares_of_distinct_weights(
    algorithm: str, codec: str, world: int, folder: Path
) -> None:
    """Push-sum encodes one share per sender and distinct out-weight: on a graph whose
    every sender pushes three different weights, the encoded shares cross ranks and the
    run is the one-process run, with faults."""
    ids = list(ODD_IDS[:8])
    edges: list[list[object]] = []
    for i, u in enumerate(ids):
        edges.append([u, u, 0.4])
        for step, w in zip((1, 3, 4), (0.3, 0.2, 0.1), strict=True):
            edges.append([u, ids[(i + step) % len(ids)], w])
    graph = folder / "three-weights.json"
    graph.write_text(json.dumps({"nodes": ids, "edges": edges}), encoding="utf-8")
    config = _config(algorithm, folder, f"topology.file={graph}", *CODECS[codec], *FAULTS)
    one = folder / f"weights-{algorithm}-{codec}-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    out = folder / f"weights-{algorithm}-{codec}-{world}"
    assert run_ranks(config, world, out) == dict.fromkeys(range(world), "ok")
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    assert _records(out) == _records(one)


def test_unannounced_faults_in_strict_mode_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Unannounced faults run in deadline mode (``tests/engines/test_sharded_time.py``);
    in strict mode a receiver would wait for a lost message for good, as one process
    refuses."""
    argv = ["simulate", "--ranks", "2", "--quiet", "--set", "faults.drop=0.1"]
    assert main([*argv, "--set", "faults.announce=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a sharded run cannot run this config" in err[0], err
    assert "faults.announce = false" in err[0] and "needs deadline mode" in err[0]


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (["faults.drop=0.1", "faults.announce=false"], "faults.announce = false"),
        (
            ["faults.drop=0.1", "faults.announce=false", "transport.mode=deadline"],
            None,
        ),
        (["faults.drop=1"], None),
        (["faults.drop=0.1", "faults.delay_s=0.5"], None),
        (["faults.crashes=[{node='n0',at=0}]"], None),
    ],
)
def test_fault_plans_run_but_unannounced_ones_in_strict_mode(
    settings: list[str], says: str | None
) -> None:
    why = config_refusal(load_config(None, ["algorithm.name=dpsgd", *settings]))
    assert why == says or (says is not None and why is not None and says in why), why


def test_every_message_lost_and_a_peer_down_for_good(folder: Path) -> None:
    """The extremes of a plan: every message lost (drop = 1) and a peer down from the first
    round to the last: still the one-process run's figures, on 2 ranks."""
    down = f"faults.crashes=[{{node={ODD_IDS[1]!r},at=0}}]"
    config = _case("dpsgd", "sign", False, folder, "faults.drop=1", down)
    one = folder / "extreme-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    out = folder / "extreme-2"
    assert run_ranks(config, 2, out) == {0: "ok", 1: "ok"}
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    assert got["traffic"]["messages_sent"] == 0
    assert _records(out) == _records(one)


@pytest.mark.parametrize(
    ("codec", "lr", "world", "error"),
    [("sign", "1e38", 2, "CompressionError"), ("fp16", "1e5", 3, "ProtocolError")],
)
def test_a_diverged_sender_stops_every_rank_in_one_line(
    codec: str, lr: str, world: int, error: str, folder: Path
) -> None:
    """A diverged run stops on ranks with the one-process run's error, in one line: the
    codec's own refusal (a sign scale not finite), or a receiver's of a decoded message
    that is not (fp16 overflows)."""
    config = _case("dpsgd", codec, True, folder, f"algorithm.lr={lr}")
    with pytest.raises(FedcoreError) as one:
        simulate(config, out_dir=folder / f"diverged-{codec}", show_progress=False, threads=1)
    assert type(one.value).__name__ == error
    outcomes = run_ranks(config, world, folder / f"diverged-{codec}-{world}")
    assert set(outcomes) == set(range(world))
    # The rank that holds the first diverged peer names it as one process does.
    said = {f"{error}: rank {r} of {world}: {one.value}" for r in range(world)}
    assert said & set(outcomes.values()), outcomes
    assert all("\n" not in what for what in outcomes.values())


@pytest.mark.parametrize("codec", ["raw", "sign", "topk", "randk", "qsgd", "fp16", "fp8"])
def test_halo_rows_carry_what_the_codec_encodes(codec: str) -> None:
    """A halo row of an up sender is its codec's encoded bytes (far fewer than the values
    where the codec compresses), a crashed sender's row its values; the receiving end
    decodes exactly what the sender decoded."""
    rows_codec = make_row_codec(codec, seeds=range(6), ratio=0.1, bits=4)
    g = torch.Generator().manual_seed(5)
    values = torch.randn(6, 100, generator=g)
    scalars = {"w": torch.rand(6, generator=g, dtype=torch.float64)}
    up = torch.tensor([True, True, False, True, True, True])
    owners = torch.nonzero(up).squeeze(1)
    width = wire_width(rows_codec, 100, values.dtype)
    decoded, encoded = values.clone(), {}
    if width is not None:  # as the sending rank encodes its up rows
        bytes_ = torch.zeros(6, width, dtype=torch.uint8)
        decoded[owners], bytes_[owners] = encode_rows(rows_codec, values[owners], owners)
        encoded["x"] = bytes_
    elif not rows_codec.lossless(values.dtype):
        decoded[owners] = rows_codec.roundtrip(values[owners], owners)
    layout = layout_of({"x": decoded}, scalars, rows_codec)
    sent = torch.tensor([4, 0, 2, 5])
    flat = pack_rows(layout, {"x": decoded}, encoded, scalars, sent, up)
    assert flat.numel() == int(layout.widths(up[sent]).sum())
    assert layout.width_down == 100 * 4 + 8
    if codec in ("sign", "topk", "randk", "qsgd", "fp16"):
        assert layout.width_up <= 100 * 2 + 8  # the codec's bytes, not 4 a value
    if codec == "sign":
        assert layout.width_up == 13 + 8 + 8  # the bits, the scale, the scalar
    got, got_scalars = unpack_rows(layout, flat, up[sent], make_row_codec(codec, ratio=0.1, bits=4))
    assert torch.equal(got["x"].view(torch.int32), decoded[sent].view(torch.int32))
    assert torch.equal(got_scalars["w"], scalars["w"][sent])
    assert torch.equal(got["x"][2], values[2])  # the crashed sender's row, as it is


def test_halo_byte_blocks_per_rank() -> None:
    widths = torch.tensor([3, 5, 7, 11, 13])
    assert block_sums(widths, [2, 0, 3]) == [8, 0, 31]
    assert block_sums(widths[:0], [0, 0]) == [0, 0]


def test_a_compressing_codec_shrinks_the_halo(folder: Path) -> None:
    """The summary's ``halo_bytes`` (what every rank sent the others) of a sign run is a
    small part of the fp32 run's: encoded rows cross ranks, not decoded values."""
    sizes = {}
    for codec in ("fp32", "sign"):
        config = _case("dpsgd", codec, False, folder)
        out = folder / f"halo-{codec}"
        assert run_ranks(config, 2, out) == {0: "ok", 1: "ok"}
        sizes[codec] = json.loads((out / "summary.json").read_text(encoding="utf-8"))["halo_bytes"]
    assert sizes["fp32"] > 0
    assert sizes["sign"] * 20 < sizes["fp32"], sizes


def test_row_counts_travel_with_the_losses_exactly() -> None:
    """A rank's counts ride in the float64 columns of the losses' gather as bits: any
    integer comes back as it was, NaN losses (crashed rows) too."""
    counts = RowCounts(3)
    counts.add("bytes_sent", torch.tensor([0, 2, 2]), torch.tensor([2**62, 1, 5]))
    counts.add("missing_senders", torch.tensor([1]), torch.tensor([True]))
    loss = torch.tensor([0.5, math.nan, -1.0], dtype=torch.float64)
    got_loss, counter = unpack_counts(pack_counts(loss, counts), torch.device("cpu"))
    assert torch.equal(got_loss.view(torch.long), loss.view(torch.long))
    assert counter.bytes_sent.tolist() == [2**62, 0, 6]
    assert counter.missing_senders.tolist() == [False, True, False]
    assert counter.sent.tolist() == [0, 0, 0]


@pytest.mark.parametrize("records", ["eval", "none"])
def test_fault_lists_of_the_records_written(records: str, folder: Path) -> None:
    """Rank 0 lists the lost messages of the rounds whose node records it writes
    (``simulate.node_records``): the records and tables are one process's."""
    config = _case("dog", "topk", True, folder, f"simulate.node_records={records}")
    one = folder / f"records-{records}-one"
    torch.set_num_threads(1)
    expected = simulate(config, out_dir=one, show_progress=False, threads=1)
    out = folder / f"records-{records}-2"
    assert run_ranks(config, 2, out) == {0: "ok", 1: "ok"}
    got = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for key in SAME:
        assert got.get(key) == expected.get(key), key
    if records == "eval":
        assert _records(out) == _records(one)
        assert any(r.get("missing") for r in _records(out))
