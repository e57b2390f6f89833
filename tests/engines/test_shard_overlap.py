"""The halo exchange overlapped with the mix (``fedcore.engines.shard_overlap``): on random
neighbour tables of local and remote slots, the overlapped mix of D-PSGD and push-sum (its
weighted shares) gives the bits of one mix after the exchange; a mix that asks for a codec
round trip or fails a check on a stand-in slot falls back to that mix; a plan with no
interior or no boundary row, or too many boundary rows, is not overlapped. The sharded
engine's equality tests (``tests/engines/test_sharded.py``) run it on real ranks."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms.dpsgd import DPSGDRule, DPSGDState
from fedcore.algorithms.ops import OPS
from fedcore.algorithms.rule import Rows, Slot
from fedcore.engines import shard_overlap
from fedcore.engines.shard_overlap import mix_overlapped, slots_of
from fedcore.errors import AlgorithmError


@dataclass
class _Net:
    """A rank's block as :func:`mix_overlapped` reads it, its exchange answered at once."""

    rule: Any
    b: int
    nbr: torch.Tensor
    slot_weight: torch.Tensor
    far: dict[str, torch.Tensor]
    far_scalars: dict[str, torch.Tensor]
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        self.codec = SimpleNamespace(lossless=lambda dtype: True)
        self.mine = torch.arange(self.b)
        h = next(iter(self.far.values())).shape[0]
        self.halo = SimpleNamespace(
            send_rows=torch.arange(0), send_counts=[0], recv_rows=torch.arange(h), recv_counts=[h]
        )
        self.started = 0

    def _roundtrip(self, values: torch.Tensor, sending: Any, t: int, rows: Any = None) -> Any:
        return values

    def _exchange_start(self, tensors: Any, scalars: Any, *_: Any) -> Any:
        self.started += 1
        return lambda: (self.far, self.far_scalars)


def _case(rule: Any, b: int, h: int, k: int, seed: int) -> tuple[_Net, Any, Any, Rows, Any]:
    """``(net, state, send, rows, arrived)`` of ``b`` rows, ``h`` halo rows, ``k`` slots."""
    gen = torch.Generator().manual_seed(seed)
    nbr = torch.randint(0, b + h, (b, k), generator=gen)
    weight = torch.rand((b, k), generator=gen, dtype=torch.float64) / k
    x = torch.randn((b, 5), generator=gen)
    rows = Rows(
        round=0,
        lr=0.1,
        self_weight=1 - weight.sum(dim=1),
        in_degree=torch.full((b,), k),
        ids=tuple(f"p{i}" for i in range(b)),
    )
    state, send = rule.step(rule.init(x), torch.randn((b, 5), generator=gen), rows)
    far = {name: torch.randn((h, 5), generator=gen) for name in send.tensors}
    far_scalars = {name: torch.rand(h, generator=gen, dtype=torch.float64) for name in send.scalars}
    arrived = torch.rand((b, k), generator=gen) < 0.8
    return _Net(rule, b, nbr, weight, far, far_scalars), state, send, rows, arrived


def _after_the_exchange(net: _Net, state: Any, send: Any, rows: Rows, arrived: Any) -> Any:
    tensors = {k: torch.cat([v, net.far[k]]) for k, v in send.tensors.items()}
    scalars = {k: torch.cat([v, net.far_scalars[k]]) for k, v in send.scalars.items()}
    inbox = slots_of(tensors, scalars, send.weighted, net.nbr, net.slot_weight, arrived)
    return net.rule.mix(state, 0, inbox, rows)[0]


def _same(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@settings(max_examples=40, deadline=None)
@given(
    rule=st.sampled_from(["dpsgd", "ops"]),
    b=st.integers(2, 9),
    h=st.integers(1, 4),
    k=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_the_overlapped_mix_is_the_mix_after_the_exchange(
    rule: str, b: int, h: int, k: int, seed: int
) -> None:
    made = DPSGDRule() if rule == "dpsgd" else OPS()
    net, state, send, rows, arrived = _case(made, b, h, k, seed)
    up = torch.ones(b + h, dtype=torch.bool)
    with mock.patch.object(shard_overlap, "MOST_BOUNDARY", 1.0):
        got = mix_overlapped(net, state, send, 0, up, arrived, set(), rows)
    remote = (net.nbr >= b).any(dim=1)
    if bool(remote.all()) or not bool(remote.any()):  # nothing to overlap with, or no halo
        assert got is None and net.started == 0
        return
    assert got is not None and net.started == 1
    assert _same(got, _after_the_exchange(net, state, send, rows, arrived))


class _Compressing(DPSGDRule):
    """A mix that asks for a codec round trip (the overlap cannot split it)."""

    def mix(self, state: DPSGDState, phase: int, inbox: list[Slot], rows: Rows) -> Any:
        mixed, _ = super().mix(state, phase, inbox, rows)
        return DPSGDState(rows.compress(mixed.x), mixed.pending), None


class _Checking(DPSGDRule):
    """A mix that stops the run unless every slot's message arrived: the stand-in slots of
    the first mix fail it, the real ones (all arrived) pass."""

    def mix(self, state: DPSGDState, phase: int, inbox: list[Slot], rows: Rows) -> Any:
        heard = sum(slot.arrived.long() for slot in inbox)
        rows.check(heard < rows.in_degree, "node {node} missed a message in round {round}")
        return super().mix(state, phase, inbox, rows)


@pytest.mark.parametrize("rule", [_Compressing(), _Checking()])
def test_a_mix_that_cannot_be_split_runs_after_the_exchange(
    rule: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_overlap, "MOST_BOUNDARY", 1.0)
    net, state, send, rows, _ = _case(rule, 6, 2, 2, seed=3)
    net.nbr = torch.tensor([[0, 1], [1, 2], [2, 6], [3, 4], [4, 7], [5, 0]])
    arrived = torch.ones((6, 2), dtype=torch.bool)
    up = torch.ones(8, dtype=torch.bool)
    got = mix_overlapped(net, state, send, 0, up, arrived, set(), rows)
    assert got is not None and net.started == 1
    assert _same(got, _after_the_exchange(net, state, send, rows, arrived))
    missing = arrived.clone()
    missing[0, 1] = False  # a real message lost: the real error, naming its row
    if isinstance(rule, _Checking):
        with pytest.raises(AlgorithmError, match="node row 0 missed a message"):
            mix_overlapped(net, state, send, 0, up, missing, set(), rows)


def test_too_many_boundary_rows_are_not_overlapped() -> None:
    net, state, send, rows, arrived = _case(DPSGDRule(), 4, 2, 1, seed=1)
    up = torch.ones(6, dtype=torch.bool)
    net.nbr = torch.tensor([[4], [5], [4], [0]])  # 3 of 4 rows read the halo
    assert mix_overlapped(net, state, send, 0, up, arrived, set(), rows) is None
    net.nbr = torch.tensor([[1], [0], [4], [0]])  # 1 of 4
    assert mix_overlapped(net, state, send, 0, up, arrived, set(), rows) is not None
    assert _same(
        mix_overlapped(net, state, send, 0, up, arrived, set(), rows),
        _after_the_exchange(net, state, send, rows, arrived),
    )
