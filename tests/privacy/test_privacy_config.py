"""``[privacy]``: every key refused at its extremes in one line, and the fingerprint of a
run without it unchanged."""

from __future__ import annotations

import importlib.util

import pytest

from fedcore.config import load_config
from fedcore.config.fingerprints import fingerprint
from fedcore.config.tables import privacy
from fedcore.errors import ConfigError

needs_opacus = pytest.mark.skipif(
    importlib.util.find_spec("opacus") is None, reason="needs the fedcore[dp] extra (opacus)"
)

DPSGD = "privacy.mechanism=dp-sgd"


@pytest.mark.parametrize(
    "override,match",
    [
        ("privacy.clip=0", "privacy.clip = 0.0 is invalid: it must be > 0"),
        ("privacy.clip=-1", "must be > 0"),
        ("privacy.noise=-0.5", "privacy.noise = -0.5 is invalid: it must be >= 0"),
        ("privacy.delta=0", "must be in \\(0, 1\\)"),
        ("privacy.delta=1", "must be in \\(0, 1\\)"),
        ("privacy.target_epsilon=-1", "must be an epsilon > 0"),
        ("privacy.accountant='gdp'", "must be one of prv, rdp"),
        ("privacy.noise_key='secrets'", "must be one of seed, secret"),
        ("privacy.target_epsilon=inf", "must be an epsilon > 0"),
    ],
)
@needs_opacus
def test_each_key_is_refused_at_its_extremes(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        load_config(None, [DPSGD, override])
    assert "\n" not in str(caught.value)


@needs_opacus
def test_table_level_refusals() -> None:
    with pytest.raises(ConfigError, match="did you mean `dp-sgd`"):
        load_config(None, ["privacy.mechanism=dpsgd"])
    with pytest.raises(ConfigError, match=r"does nothing with privacy\.mechanism = 'none'"):
        load_config(None, ["privacy.noise=2.0"])
    with pytest.raises(ConfigError, match=r"cannot be met with privacy\.noise = 0"):
        load_config(None, [DPSGD, "privacy.noise=0", "privacy.target_epsilon=4"])
    ok = load_config(None, [DPSGD, "privacy.noise=0"])  # no noise: epsilon is reported as inf
    assert ok.privacy.active and ok.privacy.noise == 0


def test_without_opacus_a_mechanism_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        privacy.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "opacus" else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install 'fedcore\[dp\]'"):
        load_config(None, [DPSGD])
    assert not load_config(None, []).privacy.active  # no table: nothing needed


@needs_opacus
def test_fingerprint_leaves_out_an_inactive_table() -> None:
    edges = [("n0", "n1", 1.0)]
    plain = fingerprint(load_config(None, []), edges)
    private = fingerprint(load_config(None, [DPSGD]), edges)
    noisier = fingerprint(load_config(None, [DPSGD, "privacy.noise=2.0"]), edges)
    assert len({plain, private, noisier}) == 3
    # tests/topology/test_pins.py pins the fingerprints of runs without the table.


@needs_opacus
def test_engines_that_do_not_run_privacy_say_so() -> None:
    from fedcore.engines.cohort import cohort_refusal
    from fedcore.engines.seed_blocks import config_refusal as seeds_refusal
    from fedcore.engines.shard_refusal import config_refusal as ranks_refusal

    private = load_config(None, [DPSGD])
    assert "[privacy] runs in one process" in str(ranks_refusal(private))
    assert "[privacy] runs one seed at a time" in str(seeds_refusal(private))
    cohort = load_config(
        None,
        [
            "privacy.mechanism=dp-fedavg",
            "algorithm.name=fedavg",
            "topology.kind=star",
            "algorithm.sampler=floyd",
            "data.partition=slices",
            "simulate.node_records=none",
        ],
    )
    assert "without differential privacy" in str(cohort_refusal(cohort))
    plain = load_config(None, [])
    assert ranks_refusal(plain) is None and seeds_refusal(plain) is None


GARBAGE = [
    None,
    True,
    -1,
    0,
    2**70,
    float("nan"),
    float("inf"),
    -0.0,
    "",
    "dp-sgd ",
    [1],
    {"a": 1},
]


@pytest.mark.parametrize(
    "key", ["mechanism", "clip", "noise", "delta", "target_epsilon", "accountant", "noise_key"]
)
@pytest.mark.parametrize("value", GARBAGE, ids=repr)
def test_garbage_in_any_key_loads_or_is_refused_in_one_line(key: str, value: object) -> None:
    """Whatever a config file puts in [privacy] (here beside a mechanism, so every key
    counts): a table, or one ConfigError line naming privacy's key."""
    from fedcore.config import config_from_dict

    table = {"mechanism": "dp-sgd", key: value}
    try:
        config = config_from_dict({"privacy": table})
    except ConfigError as err:
        assert "\n" not in str(err) and "privacy" in str(err)
        return
    assert config.privacy.clip > 0 and 0 < config.privacy.delta < 1
