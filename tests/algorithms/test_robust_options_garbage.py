"""The options of the robust and tracking rules (and FedAvg's aggregators) fed garbage:
each builds, or is refused in one line naming the algorithm or its key; nothing else
escapes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore.algorithms import make_algorithm
from fedcore.errors import ConfigError

ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
)

OPTIONS = {
    "clippedgossip": ["tau", "clipped"],
    "trimmed-gossip": ["trim", "bucket", "seed"],
    "median-gossip": ["bucket", "seed"],
    "clipped-push-sum": ["tau", "kappa", "step_scale"],
    "fedavg": ["aggregator", "f", "m", "trim", "bucket", "nnm", "iterations", "tau", "nu"],
    "dsgt": ["foo", "robust"],
    "push-pull": ["bogus", "robust"],
    "push-diging": ["robust", "bogus"],
    "exact-diffusion": ["psi"],
    "beer": ["gamma", "eta"],
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(OPTIONS)), st.data())
def test_garbage_options_build_or_are_refused_in_one_line(name: str, data: st.DataObject) -> None:
    keys = data.draw(st.lists(st.sampled_from(OPTIONS[name]), max_size=3, unique=True))
    options = {k: data.draw(ANY) for k in keys}
    if name == "fedavg":
        options["server"] = "s"
    try:
        make_algorithm(name, **options)
    except ConfigError as err:
        text = str(err)
        assert "\n" not in text and "algorithm" in text  # the key or the algorithm named


@pytest.mark.parametrize(
    ("name", "has"),
    [
        ("dsgt", "robust"),
        ("push-pull", "robust"),
        ("push-diging", "robust"),
        ("exact-diffusion", "none"),
        ("dpsgd", "none"),
    ],
)
def test_a_rule_says_which_options_it_has(name: str, has: str) -> None:
    with pytest.raises(ConfigError, match=rf"has no option foo; its options: {has}\."):
        make_algorithm(name, foo=0.1)
