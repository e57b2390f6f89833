"""The one-peer fast paths of the message engine change no bit.

:class:`~fedcore.algorithms.rule.NodeRule` and the helpers ``gossip``, ``pull`` and
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

from fedcore.algorithms import rule
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

    monkeypatch.setattr(rule, "_one_row", off)
    slow = _digests(capsys, tmp_path / "slow", CASES[case])
    assert calls, "the fast path was never asked for"
    assert fast == slow
