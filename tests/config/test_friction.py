"""Issue 27 items 6 and 7: a typo is answered with the name meant, and a value that can
only fail (or that is silently not used) is refused when the config is loaded.

Item 6: every unknown table, key, option and name (algorithm, codec, optimizer, topology
kind, dataset, model, and the other choices) is answered with "did you mean `x`?"
(:func:`fedcore.registry.did_you_mean`, :mod:`difflib`), one test per kind of name.

Item 7: names with whitespace around them, a device the engine would not use (or an
empty GPU number), an ``optimizer.eps`` of 0 and a step size or weight decay beyond
float32 (each diverged at round 0), a synthetic stream's shape that was checked only
when the stream is used, and unknown algorithm, model, dataset, stream and
topology kind names: refused by :func:`fedcore.config.load_config`, one line, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedcore.config import load_config
from fedcore.errors import ConfigError
from fedcore.registry import ALGORITHMS
from tests.clitools import TINY, cli, one_line_error

# --- item 6: did you mean ---------------------------------------------------------------------

TYPOS = {
    "table-key": (["run.rouns=3"], "unknown key run.rouns; did you mean `rounds`?"),
    "algorithm-key-name": (["algorithm.nmae=ops"], "nmae (did you mean `name`?)"),
    "algorithm-key-lr": (["algorithm.lrr=0.1"], "lrr (did you mean `lr`?)"),
    "algorithm-option": (["algorithm.robsut=true"], "robsut (did you mean `robust`?)"),
    "algorithm": (["algorithm.name=dpgsd"], "unknown algorithm 'dpgsd'; did you mean `dpsgd`"),
    "codec": (["compression.codec=qsdg"], "did you mean `qsgd`?"),
    "server-optimizer": (
        ["algorithm.name=fedavg", "topology.kind=star", "algorithm.server_optimizer=adma"],
        "got 'adma'; did you mean `adam`?",
    ),
    "optimizer": (["optimizer.name=lmab"], "did you mean `lamb`?"),
    "topology-kind": (["topology.kind=rign"], "unknown topology kind 'rign'; did you mean `ring`?"),
    "dataset": (["data.dataset=digts"], "unknown dataset 'digts'; did you mean `digits`?"),
    "model": (["model.name=mpl"], "unknown model 'mpl'; did you mean `mlp`?"),
    "model-option": (["model.name=mlp", "model.hiden=8"], "did you mean `hidden`?"),
    "stream": (["data.stream=synthetc"], "did you mean `synthetic`?"),
    "choice": (["data.partition=iidd"], "data.partition = 'iidd' is invalid"),
    "schedule": (["algorithm.lr_schedule=cosin"], "did you mean `cosine`?"),
    "tls-key": (["transport.tls.dri=certs"], "transport.tls.dri; did you mean `dir`?"),
    "crash-key": (['faults.crashes=[{node="n1", at=1, bakc=2}]'], "bakc: did you mean `back`?"),
}


@pytest.mark.parametrize(("sets", "needle"), TYPOS.values(), ids=TYPOS.keys())
def test_a_typo_is_answered_with_the_name_meant(
    capsys: pytest.CaptureFixture[str], sets: list[str], needle: str
) -> None:
    argv = ["simulate", "-q", *TINY, *(arg for s in sets for arg in ("--set", s))]
    line = one_line_error(capsys, argv, needle)
    if "partition" in needle:
        assert "did you mean `iid`?" in line


def test_a_typo_of_a_table_names_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[algoritm]\nname = 'ops'\n", encoding="utf-8")
    one_line_error(capsys, ["simulate", "-q", str(path)], "[algoritm]; did you mean [algorithm]?")


def test_did_you_mean_is_difflibs_closest_names() -> None:
    from fedcore.algorithms.optim import make_optimizer
    from fedcore.compression import make_codec
    from fedcore.errors import CompressionError
    from fedcore.registry import did_you_mean

    with pytest.raises(CompressionError, match="did you mean `qsgd`"):
        make_codec("qsdg")
    with pytest.raises(ConfigError, match="did you mean `adam` or `adamw`"):
        make_optimizer("adma")
    assert did_you_mean("lrr", ["name", "lr", "robust"]) == "did you mean `lr`?"
    assert did_you_mean(" ops", ALGORITHMS.names).startswith("did you mean `ops`")
    assert did_you_mean("zzzz", ALGORITHMS.names) == ""
    assert ALGORITHMS.did_you_mean("choko") == "did you mean `choco`?"


# --- item 7: refused at load ------------------------------------------------------------------

AT_LOAD = {
    "run-name-spaces": (['run.name=" x "'], "run.name = ' x ' has whitespace around it"),
    "algorithm-spaces": (['algorithm.name=" ops"'], "write 'ops'"),
    "model-spaces": (['model.name="mlp "'], "write 'mlp'"),
    "dataset-spaces": (['data.dataset=" digits"'], "write 'digits'"),
    "codec-spaces": (['compression.codec="qsgd "'], "write 'qsgd'"),
    "kind-spaces": (['topology.kind=" ring"'], "write 'ring'"),
    "algorithm": (["algorithm.name=nope"], "unknown algorithm 'nope'"),
    "model": (["model.name=nope"], "unknown model 'nope'"),
    "dataset": (["data.dataset=nope"], "unknown dataset 'nope'"),
    "stream": (["data.stream=nope"], "data.stream = 'nope' is invalid"),
    "topology-kind": (["topology.kind=nope"], "unknown topology kind 'nope'"),
    "device-empty-gpu": (['simulate.device="cuda:"'], "simulate.device = 'cuda:' is invalid"),
    "device-messages": (
        ["simulate.engine=messages", "simulate.device=cuda"],
        "simulate.device = 'cuda' is invalid: it needs the vectorized engine",
    ),
    "noise-without-stream": (["data.noise=-1"], "data.noise = -1.0 is invalid"),
    "eps-zero": (["optimizer.name=adam", "optimizer.eps=0"], "optimizer.eps = 0.0 is invalid"),
    "lr-beyond-float32": (["algorithm.lr=1e300"], "algorithm.lr = 1e+300 is invalid"),
    "decay-beyond-float32": (
        ["optimizer.weight_decay=1e300"],
        "optimizer.weight_decay = 1e+300 is invalid",
    ),
}


@pytest.mark.parametrize(("sets", "needle"), AT_LOAD.values(), ids=AT_LOAD.keys())
def test_a_value_that_cannot_work_is_refused_at_load(
    capsys: pytest.CaptureFixture[str], sets: list[str], needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, sets)
    assert needle in str(caught.value)
    argv = ["simulate", "-q", *TINY, *(arg for s in sets for arg in ("--set", s))]
    one_line_error(capsys, argv, needle)


def test_float64_models_keep_their_range() -> None:
    config = load_config(None, ["model.dtype=float64", "algorithm.lr=1e300"])
    assert config.algorithm.lr == 1e300


def test_a_device_the_fallback_engine_would_not_use_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``auto`` falls back to the message engine (RPS with a stochastic codec): the GPU
    asked for would go unused, silently; it is refused, naming why the vectorized engine
    cannot run."""
    rps = ["algorithm.name=rps", "topology.kind=complete", "compression.codec=qsgd"]
    argv = ["simulate", "-q", *TINY, *(f"--set={item}" for item in rps), "--device", "cuda"]
    status, out, err = cli(capsys, *argv)
    assert status == 2, (out, err)
    assert "simulate.device = 'cuda' needs the vectorized engine" in err
    assert "stochastic codec" in err and "Traceback" not in err
