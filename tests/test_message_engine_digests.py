"""The message engine's final parameters stay bit for bit what they were.

The one-peer fast paths of :class:`~fedcore.algorithms.rule.NodeRule` (``gossip`` and
``pull`` coefficients made once per distinct round, cached in-neighbour tables and round
contexts) must not change a single bit. The digests below were recorded with
``fedcore simulate --engine messages`` on main before those fast paths (torch
``RECORDED_WITH``, x86-64 CPU): the default run (OPS, which mixes without ``gossip``),
D-PSGD on a ring losing messages in deadline mode (``gossip`` with missing slots) and
CHOCO with QSGD (``pull``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from tests.clitools import cli

RECORDED_WITH = "2.13"
"""The torch release the digests were recorded with (other kernels may round otherwise)."""

RING8 = ["--set", "topology.kind=ring", "--set", "topology.nodes=8"]
DROPS = ["--set", "faults.drop=0.3", "--set", "transport.mode=deadline"]
CASES = {
    "default": (
        [],
        "58b8c15a52c3658bb29c76d9a7441150356c136418badf9dda816c4952ca03ba",
    ),
    "dpsgd-drops": (
        [*RING8, "--set", "algorithm.name=dpsgd", *DROPS],
        "afbb370fa77d985a7b96673df3f0c8f0264dc9defde639ced175c4cc7bd45b64",
    ),
    "choco-qsgd": (
        [*RING8, "--set", "algorithm.name=choco", "--set", "compression.codec=qsgd"],
        "781c265374034282870af0ade792a9f1820edf7ebe2b32ae85bfa05994df294d",
    ),
}


@pytest.mark.skipif(
    not torch.__version__.startswith(RECORDED_WITH),
    reason=f"digests recorded with torch {RECORDED_WITH}",
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_message_engine_params_unchanged(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sets, expected = CASES[case]
    out = tmp_path / "run"
    argv = ["simulate", "--engine", "messages", "--set", "run.rounds=10", *sets]
    status, stdout, stderr = cli(capsys, *argv, "--out", str(out), "-q")
    assert status == 0, (stdout, stderr)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    digests = summary["params_sha256"]
    got = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    assert got == expected, digests
