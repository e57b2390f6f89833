"""The vectorized engine's large-model paths: per-round work proportional to the math.

* A slot or a gathered message of a large model is added row by row where its sender holds
  it (:data:`~fedcore.algorithms.inbox.ROW_BY_ROW`) instead of being gathered into a copy
  of the stack first: the same elementwise op per row, so the bits are the gathered path's
  and the message engine's (checked over the whole registry with the threshold forced
  down to every model).
* A lossless codec (``raw``; ``fp32`` on float32 models) is never round-tripped: receivers
  read the sender's tensor itself.
* Finiteness is checked by one sum per row; the exact test only runs on rows whose sum is
  not finite, so a large finite row whose sum overflows is not refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import inbox, make_algorithm
from fedcore.algorithms.rule import Gathered, SenderRows, Slot, add_slot
from fedcore.compression.batched import make_row_codec
from fedcore.engines.batched import BatchRound
from fedcore.errors import ProtocolError
from fedcore.runtime import keep_freed_memory

from .test_vectorized import BATCHED, assert_same_run, odd_config


@contextlib.contextmanager
def _every_row_by_row() -> Iterator[None]:
    """Every model counts as large: rows are added one by one wherever they can be (a
    context, for hypothesis tests, which cannot take function-scoped fixtures)."""
    old = inbox.ROW_BY_ROW
    inbox.ROW_BY_ROW = 1
    try:
        yield
    finally:
        inbox.ROW_BY_ROW = old


@pytest.fixture
def row_by_row() -> Iterator[None]:
    """:func:`_every_row_by_row` for a whole test."""
    with _every_row_by_row():
        yield


@pytest.mark.parametrize("algorithm", BATCHED)
def test_row_by_row_engines_agree(algorithm: str, row_by_row: None, tmp_path: Path) -> None:
    """The engine contract (bit-identical parameters, traffic and faults) holds with every
    slot and gathered message added row by row, faults on (where the rule takes them: CHOCO
    and BEER refuse lost messages)."""
    faults = not getattr(make_algorithm(algorithm), "needs_every_message", False)
    assert_same_run(odd_config(algorithm, "fp32", faults, tmp_path))


@pytest.mark.parametrize("algorithm", ["dpsgd", "central", "fedavg", "deepsqueeze"])
def test_row_by_row_engines_agree_with_a_lossy_codec(
    algorithm: str, row_by_row: None, tmp_path: Path
) -> None:
    """Decoded messages (not the senders' own tensors) added row by row."""
    assert_same_run(odd_config(algorithm, "sign", False, tmp_path))


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 6),
    b=st.integers(1, 5),
    d=st.integers(1, 40),
    with_base=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_add_slot_row_by_row_equals_the_gathered_op(
    n: int, b: int, d: int, with_base: bool, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, d, generator=g)
    rows = torch.randint(0, n, (b,), generator=g)
    coef = torch.rand(b, 1, generator=g) * (torch.rand(b, 1, generator=g) > 0.3)
    base = torch.randn(b, d, generator=g) if with_base else None
    start = torch.randn(b, d, generator=g)
    arrived = torch.ones(b, dtype=torch.bool)
    weight = torch.ones(b, dtype=torch.float64)
    lazy = Slot(SenderRows({"x": values}, rows), {}, weight, arrived)
    eager = Slot({"x": values[rows]}, {}, weight, arrived)
    gathered = start.clone()
    add_slot(gathered, eager, "x", coef, base)
    by_rows = start.clone()
    with _every_row_by_row():
        add_slot(by_rows, lazy, "x", coef, base)
    assert torch.equal(by_rows, gathered)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6),
    m=st.integers(0, 12),
    b=st.integers(1, 4),
    d=st.integers(1, 40),
    weighted=st.booleans(),
    integral=st.booleans(),
    subset=st.integers(0, 15),
    seed=st.integers(0, 2**16),
)
def test_gathered_total_row_by_row_equals_index_add(
    n: int, m: int, b: int, d: int, weighted: bool, integral: bool, subset: int, seed: int
) -> None:
    """Row by row (with integer weights in float64: one fused multiply-add a message) and
    on a subset of rows, the same bits as index_add_ over every row."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, d, generator=g)
    src = torch.randint(0, n, (m,), generator=g)
    dst = torch.sort(torch.randint(0, b, (m,), generator=g)).values
    w = torch.rand(m, generator=g, dtype=torch.float64) * 50
    scalars = {"w": (w * 2**22).round() if integral else w}  # integers up to 2**28
    weight = "w" if weighted else None
    eager = Gathered({"x": values[src]}, scalars, dst, b)
    lazy = Gathered(SenderRows({"x": values}, src), scalars, dst, b)
    rows = torch.tensor([r for r in range(b) if subset >> r & 1], dtype=torch.long)
    for dtype in (None, torch.float64):
        expected = eager.total("x", weight=weight, dtype=dtype)
        with _every_row_by_row():
            got = lazy.total("x", weight=weight, dtype=dtype)
            got_rows = lazy.total("x", weight=weight, dtype=dtype, rows=rows)
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected)
        assert torch.equal(got_rows, expected[rows])
        assert torch.equal(eager.total("x", weight=weight, dtype=dtype, rows=rows), expected[rows])


def _round(codec: str = "fp32", n: int = 3) -> BatchRound:
    return BatchRound(
        round=0,
        lr=0.1,
        graph=None,  # type: ignore[arg-type]  # not read by roundtrip or finite
        up=torch.ones(n, dtype=torch.bool),
        arrived=(),
        codec=make_row_codec(codec, seeds=list(range(n))),
        nodes=tuple(f"n{i}" for i in range(n)),
    )


def test_a_lossless_codec_is_not_round_tripped() -> None:
    x = torch.randn(3, 5)
    owners = torch.arange(3)
    assert _round("fp32").roundtrip(x, owners) is x
    assert _round("raw").roundtrip(x, owners) is x
    assert _round("raw").roundtrip(x.double(), owners).dtype == torch.float64
    wide = x.double()
    assert _round("fp32").roundtrip(wide, owners) is not wide  # float64 -> float32 is lossy
    assert _round("fp16").roundtrip(x, owners) is not x


def test_finite_check_refuses_non_finite_rows_only() -> None:
    ctx = _round()
    big = torch.full((3, 4), 3e38)  # finite values whose row sums overflow
    ctx.finite(big, torch.arange(3))
    bad = big.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ProtocolError, match="'n1'"):
        ctx.finite(bad, torch.arange(3))
    # Only the rows that are messages count: row 1 is not sent here.
    ctx.finite(bad, torch.tensor([0, 2]), torch.tensor([0, 2]))
    with pytest.raises(ProtocolError, match="'n2'"):
        ctx.finite(bad, torch.tensor([2]), torch.tensor([1]))
    inf = torch.zeros(3, 4)
    inf[2, 0] = float("inf")
    with pytest.raises(ProtocolError, match="'n2'"):
        ctx.finite(inf, torch.arange(3))


def test_keep_freed_memory_is_idempotent() -> None:
    first = keep_freed_memory()
    assert keep_freed_memory() is first
    assert isinstance(first, bool)


def test_per_node_maps_are_left_out_above_the_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Above NODE_MAPS_NODES peers, no per-node map in evaluations or the summary: one
    digest of every node's parameters instead."""
    import importlib

    from fedcore import metrics
    from fedcore.config import load_config

    sim = importlib.import_module("fedcore.simulation.simulate")
    results = importlib.import_module("fedcore.simulation.results")

    config = load_config(None, ["run.rounds=2", "topology.nodes=6", "run.eval_every=1"])
    small = sim.simulate(config, out_dir=tmp_path / "small", show_progress=False)
    assert len(small["params_sha256"]) == 6 and "node_accuracy" in small["final"]
    for module in (results, metrics):
        monkeypatch.setattr(module, "NODE_MAPS_NODES", 5)
    large = sim.simulate(config, out_dir=tmp_path / "large", show_progress=False)
    assert "params_sha256" not in large and "node_accuracy" not in large["final"]
    assert large["final"]["mean_node_accuracy"] == small["final"]["mean_node_accuracy"]
    stack = [bytes.fromhex(h) for h in small["params_sha256"].values()]
    assert len(large["params_sha256_all"]) == 64 and bytes.fromhex(large["params_sha256_all"])
    assert large["params_sha256_all"] not in {h.hex() for h in stack}
