"""The vectorized engine is device-generic: every tensor it makes names its device.

These machines have no GPU. What can be checked here: with torch's *default* device set to
``meta`` (a device with no data), the engine still runs on the CPU and gives the same
result, so no tensor in its round loop, its batches, codecs, fault masks, evaluation or
accounting is created on an implicit device; such a tensor would land on ``meta`` and the
run would fail. A CUDA run of the same cases runs where torch sees a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from fedcore.config import load_config
from fedcore.engines.vectorized import VectorizedNetwork, resolve_device
from fedcore.errors import ConfigError
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.drivers import run_vectorized
from fedcore.simulation.observer import RunObserver

CASES = {
    "ops-robust-faults": [
        "algorithm.robust=true",
        "faults.drop=0.3",
        "faults.crashes=[{node='n2',at=1,back=3}]",
    ],
    "deepsqueeze-qsgd": [
        "algorithm.name=deepsqueeze",
        "topology.kind=ring",
        "compression.codec=qsgd",
    ],
    "choco-randk": ["algorithm.name=choco", "topology.kind=ring", "compression.codec=randk"],
    "rps-sign": [
        "algorithm.name=rps",
        "topology.kind=complete",
        "topology.nodes=6",
        "compression.codec=sign",
    ],
    "central-drops": ["algorithm.name=central", "topology.kind=complete", "faults.drop=0.2"],
    "dog-stream": ["algorithm.name=dog", "topology.kind=ring", "data.stream=synthetic"],
    "dol-schedule-topk": [
        "algorithm.name=dol",
        "topology.kind=one-peer-exponential",
        "compression.codec=topk",
    ],
    "clippedgossip-drops": [
        "algorithm.name=clippedgossip",
        "topology.kind=ring",
        "faults.drop=0.2",
    ],
    "median-gossip-buckets": [
        "algorithm.name=median-gossip",
        "topology.kind=ring",
        "algorithm.bucket=2",
    ],
    "trimmed-gossip": [
        "algorithm.name=trimmed-gossip",
        "topology.kind=exponential",
        "topology.undirected=true",
    ],
    "mlp-float64": [
        "model.name=mlp",
        "model.hidden=8",
        "model.dtype=float64",
        "data.partition=iid",
    ],
}


@pytest.fixture
def meta_default() -> Iterator[None]:
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _run(settings: list[str], device: torch.device) -> torch.Tensor:
    config = load_config(None, ["run.rounds=4", "run.eval_every=2", "topology.nodes=8", *settings])
    with torch.device("cpu"):  # data, graph and models as every engine prepares them
        setup = prepare_run(config)
    net = VectorizedNetwork(setup, device=device)
    observer = RunObserver(
        nodes=net.nodes,
        config=config,
        evaluator=setup.evaluator,
        dataset=setup.dataset,
        writer=None,
        progress=None,
    )
    final = run_vectorized(net, observer, None, None)
    assert len(observer.evals) == 2
    return torch.stack(list(final.values()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_tensor_on_an_implicit_device(case: str, request: pytest.FixtureRequest) -> None:
    expected = _run(CASES[case], torch.device("cpu"))
    request.getfixturevalue("meta_default")
    got = _run(CASES[case], torch.device("cpu"))
    assert got.device.type == "cpu"
    assert torch.equal(got, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_matches_cpu(case: str) -> None:  # pragma: no cover - no GPU here
    cpu = _run(CASES[case], torch.device("cpu"))
    gpu = _run(CASES[case], torch.device("cuda"))
    assert float((cpu - gpu.cpu()).abs().max()) < 1e-4


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda")
