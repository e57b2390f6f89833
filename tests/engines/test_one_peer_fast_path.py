"""The one-peer fast paths of the message engine change no bit.

:class:`~fedcore.node.rule.NodeRule` and the helpers ``gossip``, ``pull`` and
``received`` take a fast path on one peer: the per-slot coefficients made once per distinct
round from Python values, instead of ``torch.where`` on ``[1]`` tensors each round. Both
paths run the same float32 operations in the same order, so a run ends with the same
parameters either way, on any CPU: each case runs ``fedcore simulate --engine messages``
with the fast path and with it switched off and compares every node's ``params_sha256``.
The cases: D-PSGD on a ring losing messages in deadline mode (``gossip`` with missing
slots), CHOCO with QSGD (``received``) and DeepSqueeze (``pull``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import inbox
from tests.clitools import cli

RING8 = ["--set", "topology.kind=ring", "--set", "topology.nodes=8"]
DROPS = ["--set", "faults.drop=0.3", "--set", "transport.mode=deadline"]
CASES = {
    "dpsgd-drops": [*RING8, "--set", "algorithm.name=dpsgd", *DROPS],
    "choco-qsgd": [*RING8, "--set", "algorithm.name=choco", "--set", "compression.codec=qsgd"],
    "deepsqueeze-sign": [
        *RING8,
        "--set",
        "algorithm.name=deepsqueeze",
        "--set",
        "compression.codec=sign",
    ],
}


def _digests(capsys: pytest.CaptureFixture[str], out: Path, sets: list[str]) -> object:
    argv = ["simulate", "--engine", "messages", "--set", "run.rounds=10", *sets]
    status, stdout, stderr = cli(capsys, *argv, "--out", str(out), "-q")
    assert status == 0, (stdout, stderr)
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))["params_sha256"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_one_peer_fast_path_changes_no_bit(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _digests(capsys, tmp_path / "fast", CASES[case])
    calls = []

    def off(*args: object) -> None:
        calls.append(1)

    monkeypatch.setattr(inbox, "_one_row", off)
    slow = _digests(capsys, tmp_path / "slow", CASES[case])
    assert calls, "the fast path was never asked for"
    assert fast == slow


@settings(max_examples=40)
@given(
    edges=st.integers(0, 9),
    width=st.integers(1, 70),
    start=st.booleans(),
    double=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_one_row_edge_totals_are_the_rows_index_add(
    edges: int, width: int, start: bool, double: bool, seed: int
) -> None:
    """``Edges.in_total`` on one row adds the edges as one flat ``index_add_`` (no thread
    team); the bits are those of the ``[E, w]`` ``index_add_`` every peer's rows run."""
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if double else torch.float32
    values = torch.randn(edges, 3, width, generator=gen, dtype=dtype) * 1e3
    base = torch.randn(1, 3, width, generator=gen, dtype=dtype) if start else None
    rows = torch.zeros(edges, dtype=torch.long)
    got = inbox._added(1, rows, values, base)
    expected = (torch.zeros(1, 3, width, dtype=dtype) if base is None else base.clone()).index_add_(
        0, rows, values
    )
    assert torch.equal(got, expected)
