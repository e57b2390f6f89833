"""Attacks on hand-built inputs: each produces what its definition says (property tests),
the Byzantine peers are chosen reproducibly, and ``[adversary]`` refuses bad input in one
line."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.adversary import attacked, byzantine
from fedcore.adversary.attacks import (
    alie,
    alie_z,
    dissensus,
    gaussian,
    honest_moments,
    ipm,
    signflip,
)
from fedcore.algorithms import make_algorithm
from fedcore.algorithms.rule import Rows, Slot
from fedcore.config import AdversaryConfig, config_from_dict
from fedcore.errors import ConfigError

FINITE = st.floats(-1e6, 1e6, allow_nan=False, width=32)


def _rows(b: int, nodes: tuple[str, ...] = ()) -> Rows:
    nodes = nodes or tuple(f"n{i}" for i in range(b))
    return Rows(
        round=3,
        lr=0.0,
        self_weight=torch.full((b,), 0.25, dtype=torch.float64),
        nodes=nodes,
        ids=nodes[:b],
        n=len(nodes),
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(FINITE, min_size=3, max_size=3), min_size=1, max_size=6), st.data())
def test_honest_moments_are_the_masked_mean_and_deviation(values: list, data) -> None:  # type: ignore[no-untyped-def]
    """Mean and population deviation of the values a row's mask keeps, per coordinate."""
    slots = [torch.tensor([v], dtype=torch.float32) for v in values]
    keep = [data.draw(st.booleans()) for _ in values]
    masks = [torch.tensor([k]) for k in keep]
    mean, sd, count = honest_moments(slots, masks)
    kept = torch.tensor([v for v, k in zip(values, keep, strict=True) if k], dtype=torch.float64)
    assert int(count[0]) == len(kept)
    if len(kept):
        assert torch.allclose(mean[0], kept.mean(0), rtol=1e-12, atol=1e-9)
        assert torch.allclose(sd[0], kept.std(0, correction=0), rtol=1e-9, atol=1e-6)
    else:
        assert not mean.any() and not sd.any()


@settings(max_examples=30, deadline=None)
@given(st.lists(FINITE, min_size=2, max_size=5), st.floats(0, 10), st.floats(0, 10))
def test_alie_ipm_and_signflip_follow_their_definitions(v: list, z: float, eps: float) -> None:
    x = torch.tensor([v], dtype=torch.float64)
    sd = x.abs()
    assert torch.equal(alie(x, sd, z), x - sd * z)
    assert torch.equal(ipm(x, eps), x * -eps)
    assert torch.equal(signflip(x, 2.0), -2.0 * x)
    if eps > 0 and bool(x.any()):  # IPM's inner product with the honest mean is negative
        assert float((ipm(x, eps) * x).sum()) < 0


def test_alie_z_is_the_papers_z_max() -> None:
    """n = 10, f = 2: s = floor(6) - 2 = 4, z = Phi^-1(6 / 10) = 0.2533."""
    assert alie_z(10, 2) == pytest.approx(0.253347, abs=1e-6)
    assert alie_z(50, 24) > alie_z(50, 5) >= 0  # more liars, a bolder lie
    assert alie_z(3, 0) == 0.0  # (n - s) / n not above one half: no lie beyond the mean


@settings(max_examples=30, deadline=None)
@given(st.lists(FINITE, min_size=2, max_size=2), st.lists(FINITE, min_size=2, max_size=2))
def test_dissensus_turns_the_targets_step_by_one_minus_push(own: list, other: list) -> None:
    """A target with one honest (weight 0.25) and one Byzantine in-neighbour (0.25): its
    gossip step with the lie is (1 - push) times its honest step."""
    push = 1.5
    x = torch.tensor([own], dtype=torch.float64)
    v = torch.tensor([other], dtype=torch.float64)
    w = torch.tensor([0.25], dtype=torch.float64)
    lie = dissensus(x, [v], [w], [torch.tensor([True])], w, push)
    honest_step = 0.25 * (v - x)
    with_lie = 0.25 * (v - x) + 0.25 * (lie - x)
    assert torch.allclose(with_lie, (1 - push) * honest_step, rtol=1e-9, atol=1e-3)


def test_gaussian_noise_is_keyed_and_row_by_row_the_same() -> None:
    v = torch.zeros(3, 5)
    key = torch.tensor([11, 12, 13])
    out = gaussian(v, 2.0, key)
    assert torch.equal(out, gaussian(v, 2.0, key))
    for i in range(3):  # one row alone gets the bits it gets among others
        assert torch.equal(out[i : i + 1], gaussian(v[i : i + 1], 2.0, key[i : i + 1]))
    assert not torch.equal(out[0], out[1]) and 0.5 < float(out.std()) < 4


def _inbox(values: list[list[float]], senders: list[int], arrived: list[bool]) -> list[Slot]:
    return [
        Slot(
            {"x": torch.tensor([v])},
            {},
            torch.tensor([0.25], dtype=torch.float64),
            torch.tensor([a]),
            sender=torch.tensor([s]),
        )
        for v, s, a in zip(values, senders, arrived, strict=True)
    ]


def test_targeted_lies_replace_only_arrived_byzantine_slots() -> None:
    """n0 hears n1 (honest), n2 (Byzantine) and n3 (Byzantine, lost): only n2's slot
    changes, to ALIE of the one honest value (deviation 0: the value itself)."""
    rule = attacked(make_algorithm("dpsgd"), AdversaryConfig(peers=("n2", "n3"), attack="alie"), 0)
    rows = _rows(1, ("n0", "n1", "n2", "n3"))
    state = rule.init(torch.tensor([[1.0, 1.0]]))
    state, _ = rule.step(state, torch.zeros(1, 2), rows)
    seen: list[list[Slot]] = []
    inner_mix = rule.rule.mix

    def spy(state, phase, inbox, rows):  # type: ignore[no-untyped-def]
        seen.append(inbox)
        return inner_mix(state, phase, inbox, rows)

    rule.rule.mix = spy  # type: ignore[method-assign]
    inbox = _inbox([[3.0, 5.0], [9.0, 9.0], [7.0, 7.0]], [1, 2, 3], [True, True, False])
    rule.mix(state, 0, inbox, rows)
    got = [slot.tensors["x"].tolist() for slot in seen[0]]
    assert got == [[[3.0, 5.0]], [[3.0, 5.0]], [[7.0, 7.0]]]


def test_sender_attacks_change_only_byzantine_rows() -> None:
    rule = attacked(make_algorithm("dpsgd"), AdversaryConfig(peers=("n1",), scale=3.0), 0)
    rows = _rows(3)
    state = rule.init(torch.tensor([[1.0], [2.0], [4.0]]))
    _, send = rule.step(state, torch.zeros(3, 1), rows)
    assert send is not None and send.tensors["x"].tolist() == [[1.0], [-6.0], [4.0]]


def test_the_byzantine_peers_are_chosen_by_keyed_hash() -> None:
    nodes = tuple(f"n{i}" for i in range(20))
    config = AdversaryConfig(fraction=0.2)
    chosen = byzantine(config, 5, nodes, None)
    assert len(chosen) == 4
    assert set(byzantine(config, 5, nodes[::-1], None)) == set(chosen)  # any node order
    assert set(byzantine(config, 6, nodes, None)) != set(chosen)  # another run seed
    assert byzantine(AdversaryConfig(fraction=0.01), 5, nodes, None)  # at least one
    assert "s" not in byzantine(AdversaryConfig(fraction=0.5), 0, ("s", *nodes[:4]), "s")


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"peers": ["n1"], "fraction": 0.2}, "give one of them"),
        ({"peers": "n1"}, "must be a list of node ids"),
        ({"peers": ["n1", "n1"]}, "twice"),
        ({"peers": ["bad id!"]}, "adversary.peers"),
        ({"attack": "alei"}, "alie"),
        ({"fraction": 1.0}, "[0, 1)"),
        ({"scale": -1.0}, ">= 0"),
        ({"sigma": math.inf}, "adversary.sigma"),
        ({"peers": ["n1"], "push": math.nan}, "adversary.push"),
        ({"peers": ["n1"], "attack": "withhold"}, "(0, 1)"),
        ({"peers": ["n1"], "attack": "inflate", "scale": 0.5}, "above 1"),
    ],
)
def test_bad_adversary_tables_are_refused_in_one_line(table: dict, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as err:
        config_from_dict({"adversary": table})
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("config", "nodes", "says"),
    [
        (AdversaryConfig(peers=("n9",)), ("n0", "n1"), "not a node of the graph"),
        (AdversaryConfig(peers=("s",)), ("s", "n1", "n2"), "is the server"),
        (AdversaryConfig(peers=("n0", "n1")), ("n0", "n1"), "at least one honest"),
        (AdversaryConfig(fraction=0.9), ("n0", "n1", "n2"), "at least one honest"),
    ],
)
def test_impossible_choices_are_refused(config: AdversaryConfig, nodes: tuple, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=says):
        byzantine(config, 0, nodes, "s" if "s" in nodes else None)


@pytest.mark.parametrize(
    ("algorithm", "attack", "says"),
    [
        ("rps", "signflip", "per edge"),
        ("fedavg", "dissensus", "does not gossip"),
        ("local", "alie", "sends nobody anything"),
        ("ops", "dissensus", "push-sum"),
        ("adpsgd", "signflip", "synchronous rules"),
    ],
)
def test_attacks_a_rule_cannot_take_are_refused(algorithm: str, attack: str, says: str) -> None:
    options = {"server": "s"} if algorithm == "fedavg" else {}
    rule = make_algorithm(algorithm, **options)
    with pytest.raises(ConfigError, match=says):
        attacked(rule, AdversaryConfig(peers=("n1",), attack=attack), 0)


def test_label_flipping_poisons_only_the_liars_examples() -> None:
    import numpy as np

    from fedcore.adversary.poison import flip_labels
    from fedcore.data.types import Dataset

    y = torch.tensor([0, 1, 2, 0, 1, 2])
    data = Dataset(
        name="t",
        x_train=torch.arange(6.0).view(6, 1),
        y_train=y,
        x_test=torch.zeros(1, 1),
        y_test=torch.zeros(1, dtype=torch.long),
        num_classes=3,
    )
    parts = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
    out, new = flip_labels(data, parts, ("a", "b", "c"), {"b"})
    assert new[0] is parts[0] and new[2] is parts[2]  # the honest parts as they were
    assert out.x_train[new[1]].view(-1).tolist() == [2.0, 3.0]  # the same examples ...
    assert out.y_train[new[1]].tolist() == [0, 2]  # ... with labels C - 1 - y
    assert torch.equal(out.y_train[:6], y)


def test_inflated_weights_stay_legal_shares() -> None:
    """``inflate`` by 1e9 on push-sum: the weight is cut to the schema's bound, and the
    value with it, so the de-biased value is the honest one and the message well-formed."""
    rule = attacked(
        make_algorithm("ops"), AdversaryConfig(peers=("n1",), attack="inflate", scale=1e9), 0
    )
    rows = _rows(2, ("n0", "n1"))
    state = rule.init(torch.tensor([[1.0], [2.0]]))
    _, send = rule.step(state, torch.zeros(2, 1), rows)
    assert send is not None
    omega, x = send.scalars["omega"], send.tensors["x"]
    spec = rule.schema(0, rows).scalars["omega"]
    assert spec.problem(float(omega[1])) is None and float(omega[1]) > 1.5
    assert float(omega[0]) == 1.0 and torch.allclose(x[1] / omega[1].float(), torch.tensor([2.0]))


ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.text(max_size=6), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "peers",
                "fraction",
                "attack",
                "scale",
                "sigma",
                "z",
                "epsilon",
                "push",
                "seed",
                "bogus",
            ]
        ),
        ANY,
        max_size=4,
    )
)
def test_any_adversary_table_loads_or_is_refused_in_one_line(table: dict) -> None:  # type: ignore[type-arg]
    """Whatever a config file puts in [adversary]: a table, or one ConfigError line."""
    try:
        config = config_from_dict({"adversary": table})
    except ConfigError as err:
        assert "\n" not in str(err) and str(err)
        return
    a = config.adversary
    assert isinstance(a.peers, tuple) and 0 <= a.fraction < 1 and math.isfinite(a.scale)
