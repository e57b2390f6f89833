"""DoubleSqueeze and APMSqueeze on a star: reference/algorithms.md sections 5.1, 5.2, 13."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcore.algorithms import ALGORITHMS, make_algorithm
from fedcore.algorithms.base import RoundContext
from fedcore.algorithms.squeeze import APMSqueeze, APMSqueezeRule, DoubleSqueeze
from fedcore.compression import Codec, RawCodec, get_codec, make_codec
from fedcore.config import load_config
from fedcore.engines.messages import build_network
from fedcore.errors import AlgorithmError, ConfigError
from fedcore.messages import EncodedTensor, Payload
from fedcore.node import NodeRule
from fedcore.setup.prepare import prepare_run
from tests.resume import assert_resumes_exactly

DOUBLE = ["algorithm.name=doublesqueeze", "topology.kind=star", "model.name=mlp"]
APM = ["algorithm.name=apmsqueeze", "topology.kind=star", "model.name=mlp"]
SMALL = ["topology.nodes=3"]
WORKERS = ("n0", "n1", "n2")
NODES = (*WORKERS, "server")


def _run(overrides: list[str], rounds: int) -> Any:
    network = build_network(load_config(None, [*overrides, f"run.rounds={rounds}"]))
    network.run(rounds)
    return network


# -- stepping the algorithm objects directly ------------------------------------------------


def _ctx(node: str, t: int, codec: Codec | None, lr: float = 0.1) -> RoundContext:
    # The star's edges both ways: a worker talks to the server, the server to every worker.
    peers = dict.fromkeys(WORKERS, 1.0) if node == "server" else {"server": 1.0}
    return RoundContext(
        node=node,
        round=t,
        lr=lr,
        self_weight=0.0,
        out_weights=peers,
        in_weights=peers,
        nodes=NODES,
        codec=codec,
    )


def _decode(codec: Codec | None, value: torch.Tensor | EncodedTensor) -> torch.Tensor:
    """What a receiver decodes (by the codec the tensor names, as a node does)."""
    if isinstance(value, torch.Tensor):
        return value
    if codec is not None and value.codec == codec.name:
        return codec.decode(value)
    return get_codec(value.codec).decode(value)


def _deliver(codec: Codec | None, payload: Payload) -> Payload:
    return Payload({k: _decode(codec, v) for k, v in payload.tensors.items()})


class _Star:
    """Every node's state, run round by round with optional message loss."""

    def __init__(self, algorithm: Any, codec: Codec | None, d: int = 50, seed: int = 0) -> None:
        self.algorithm = algorithm
        self.codec = codec
        self.gen = torch.Generator().manual_seed(seed)
        self.loss = random.Random(seed)
        start = torch.randn(d, generator=self.gen)
        self.states = {n: algorithm.init(start) for n in NODES}
        self.sent: dict[str, list[torch.Tensor]] = {n: [] for n in NODES}
        self.arrived: dict[str, list[bool]] = {n: [] for n in NODES}
        self.server_in: list[torch.Tensor] = []

    def round(
        self,
        t: int,
        grads: dict[str, torch.Tensor],
        drop: float = 0.0,
        lr: float = 0.1,
        miss: tuple[str, ...] = (),
    ) -> None:
        alg, codec = self.algorithm, self.codec
        outboxes = {}
        for node in NODES:
            grad = grads.get(node, torch.zeros_like(self.states[node].x.reshape(-1)))
            self.states[node], outboxes[node] = alg.step(
                self.states[node], grad, _ctx(node, t, codec, lr)
            )
        inbox = {}
        for w in WORKERS:
            value = _deliver(codec, outboxes[w]["server"])
            self.sent[w].append(next(iter(value.tensors.values())))  # type: ignore[arg-type]
            if self.loss.random() >= drop:
                inbox[w] = value
        self.server_in.append(
            torch.stack([p.tensor(next(iter(p.tensors))) for p in inbox.values()]).mean(0)
            if inbox
            else torch.zeros_like(self.states["server"].x.reshape(-1))
        )
        for w in WORKERS:  # workers mix phase 0 with nothing
            self.states[w], out = alg.mix(self.states[w], 0, {}, _ctx(w, t, codec, lr))
            assert out == {}
        self.states["server"], broadcast = alg.mix(
            self.states["server"], 0, inbox, _ctx("server", t, codec, lr)
        )
        assert sorted(broadcast) == list(WORKERS)
        down = _deliver(codec, broadcast["n0"])
        self.sent["server"].append(next(iter(down.tensors.values())))  # type: ignore[arg-type]
        for w in WORKERS:
            got = self.loss.random() >= drop and w not in miss
            self.arrived[w].append(got)
            inbox_w = {"server": down} if got else {}
            self.states[w], out = alg.mix(self.states[w], 1, inbox_w, _ctx(w, t, codec, lr))
            assert out == {}


def _grads(gen: torch.Generator, d: int = 50) -> dict[str, torch.Tensor]:
    return {w: torch.randn(d, generator=gen) for w in WORKERS}


LOSSY = ["sign", "qsgd", "topk"]


def _codec(name: str) -> Codec:
    return make_codec(name, bits=2, ratio=0.1, seed=1)


@pytest.mark.parametrize("codec", LOSSY)
@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_doublesqueeze_error_memories_telescope(codec: str, drop: float) -> None:
    """Every round, on every worker and on the server: the sum of what it sent plus its
    current memory is the sum of what it meant to send (lr g_i; the mean it received),
    with or without lost messages."""
    lr = 0.1
    star = _Star(NodeRule(DoubleSqueeze()), _codec(codec))
    intended = {w: torch.zeros(50, dtype=torch.float64) for w in WORKERS}
    server_intended = torch.zeros(50, dtype=torch.float64)
    start = star.states["server"].x.reshape(-1).clone()
    lossy = 0.0
    for t in range(12):
        grads = _grads(star.gen)
        star.round(t, grads, drop=drop, lr=lr)
        for w in WORKERS:
            intended[w] += lr * grads[w].double()
            sent = torch.stack(star.sent[w]).double().sum(0)
            assert torch.allclose(
                sent + star.states[w].delta.reshape(-1).double(), intended[w], atol=1e-5
            )
            lossy = max(lossy, float(star.states[w].delta.reshape(-1).abs().max()))
        server_intended += star.server_in[-1].double()
        broadcast = torch.stack(star.sent["server"]).double().sum(0)
        delta_s = star.states["server"].delta.reshape(-1).double()
        assert torch.allclose(broadcast + delta_s, server_intended, atol=1e-5)
        # The global model moved by exactly the broadcasts; a worker by those it received.
        assert torch.allclose(
            star.states["server"].x.reshape(-1).double(), start.double() - broadcast
        )
        for w in WORKERS:
            got = [s for s, a in zip(star.sent["server"], star.arrived[w], strict=True) if a]
            moved = torch.stack(got).double().sum(0) if got else torch.zeros(50).double()
            assert torch.allclose(
                star.states[w].x.reshape(-1).double(), start.double() - moved, atol=1e-5
            )
    assert lossy > 1e-3  # the codec really lost something: the memories are not trivial
    if drop == 0:
        for w in WORKERS:
            assert torch.equal(star.states[w].x.reshape(-1), star.states["server"].x.reshape(-1))


def test_doublesqueeze_without_error_feedback_keeps_no_memory_and_differs() -> None:
    gen_seed = 5
    runs = {}
    for feedback in (True, False):
        star = _Star(
            NodeRule(DoubleSqueeze(error_feedback=feedback)), _codec("sign"), seed=gen_seed
        )
        for t in range(8):
            star.round(t, _grads(star.gen))
        runs[feedback] = star
    for node in NODES:
        assert torch.count_nonzero(runs[False].states[node].delta.reshape(-1)) == 0
    assert float(runs[True].states["n0"].delta.reshape(-1).abs().max()) > 0
    assert not torch.allclose(
        runs[True].states["server"].x.reshape(-1), runs[False].states["server"].x.reshape(-1)
    )


def test_doublesqueeze_identity_codec_is_parameter_server_sgd_step_by_step() -> None:
    star = _Star(NodeRule(DoubleSqueeze()), RawCodec())
    x = star.states["server"].x.reshape(-1).clone()
    for t in range(6):
        lr = 0.1 * (t + 1)  # a schedule: lr belongs in the step
        grads = _grads(star.gen)
        star.round(t, grads, lr=lr)
        x = x - lr * torch.stack(list(grads.values())).mean(0)
        for node in NODES:
            assert torch.allclose(star.states[node].x.reshape(-1), x, atol=1e-6)
            assert torch.count_nonzero(star.states[node].delta.reshape(-1)) == 0


def test_doublesqueeze_identity_codec_is_central() -> None:
    """fp32 (lossless for float32 models): the same trajectory as CENTRAL, mini-batch SGD
    on the union of equal iid splits; every worker holds the global model bit for bit."""
    common = ["topology.nodes=3", "data.partition=iid", "model.name=mlp", "algorithm.lr=0.3"]
    setup = prepare_run(load_config(None, [*DOUBLE, *common]))
    assert [len(p) for p in setup.parts] == [479, 479, 479, 0]
    double = _run([*DOUBLE, *common, "compression.codec=fp32"], 20).nodes
    central = _run(["algorithm.name=central", "topology.kind=complete", *common], 20).nodes
    start = setup.start
    assert not torch.allclose(double["server"].model(), start, atol=1e-3)
    for worker in WORKERS:
        assert torch.allclose(double["server"].model(), central[worker].model(), atol=1e-5)
        assert torch.equal(double[worker].model(), double["server"].model())
    for node in double.values():
        assert torch.count_nonzero(node.state.delta) == 0


def test_doublesqueeze_lossy_network_run_learns_with_nonzero_memories() -> None:
    network = _run([*DOUBLE, *SMALL, "compression.codec=sign", "algorithm.lr=0.3"], 15)
    nodes = network.nodes
    for worker in WORKERS:
        assert torch.equal(nodes[worker].model(), nodes["server"].model())
        assert float(nodes[worker].state.delta.abs().max()) > 0
    assert float(nodes["server"].state.delta.abs().max()) > 0
    setup = prepare_run(load_config(None, [*DOUBLE, *SMALL]))
    _, accuracy = setup.evaluator.evaluate(
        nodes["server"].model(), setup.dataset.x_test, setup.dataset.y_test
    )
    assert accuracy > 0.5


def test_doublesqueeze_steps_by_the_node_optimizer_direction() -> None:
    """With a node optimizer the node passes u (here momentum 0: u = lr g) and lr = 1:
    the same run as without one, so the step size is applied exactly once."""
    common = [*DOUBLE, *SMALL, "compression.codec=qsgd", "algorithm.lr=0.2"]
    plain = _run(common, 6).nodes
    direction = _run([*common, "optimizer.name=momentum", "optimizer.momentum=0"], 6).nodes
    for nid, node in plain.items():
        assert torch.allclose(direction[nid].model(), node.model(), atol=1e-6), nid


# -- APMSqueeze -----------------------------------------------------------------------------


def test_apmsqueeze_warm_up_is_adam_on_the_averaged_gradient() -> None:
    """Full-precision warm-up with a lossy codec: every node follows torch.optim.Adam
    fed the mean gradient; the moments are identical everywhere."""
    rounds = 6
    star = _Star(
        NodeRule(APMSqueeze(precondition_rounds=rounds, betas=(0.8, 0.99), eps=1e-6)),
        _codec("sign"),
    )
    p = torch.nn.Parameter(star.states["server"].x.reshape(-1).clone())
    adam = torch.optim.Adam([p], lr=0.05, betas=(0.8, 0.99), eps=1e-6)
    for t in range(rounds):
        grads = _grads(star.gen)
        star.round(t, grads, lr=0.05)
        p.grad = torch.stack(list(grads.values())).mean(0)
        adam.step()
        for node in NODES:
            s = star.states[node]
            assert torch.allclose(s.x, p.detach(), atol=1e-5), (t, node)
            assert torch.count_nonzero(s.delta) == 0
            assert torch.equal(s.v, star.states["server"].v)
        assert torch.allclose(star.states["server"].v, adam.state[p]["exp_avg_sq"], atol=1e-6)


def test_apmsqueeze_warm_up_messages_are_raw_then_compressed() -> None:
    alg = NodeRule(APMSqueeze(precondition_rounds=2))
    codec = _codec("sign")
    state = alg.init(torch.zeros(8))
    for t, want in ((0, "raw"), (1, "raw"), (2, "sign")):
        _, out = alg.step(state, torch.randn(8), _ctx("n0", t, codec))
        value = out["server"].tensors["g" if want == "raw" else "m"]
        assert isinstance(value, EncodedTensor) and value.codec == want
        inbox = {w: Payload({k: torch.randn(8)}) for w in WORKERS for k in out["server"].tensors}
        _, down = alg.mix(state, 0, inbox, _ctx("server", t, codec))
        names = ("m", "v", "x") if want == "raw" else ("m",)
        assert sorted(down["n1"].tensors) == list(names)
        for k in names:
            value = down["n1"].tensors[k]
            assert isinstance(value, EncodedTensor) and value.codec == want
        schema = alg.message_schema(1, "server", _ctx("n1", t, codec))
        assert sorted(schema.tensors) == list(names)


def test_apmsqueeze_worker_missing_a_warm_up_broadcast_rejoins_at_the_next() -> None:
    star = _Star(NodeRule(APMSqueeze(precondition_rounds=3)), _codec("qsgd"))
    star.round(0, _grads(star.gen), lr=0.01, miss=("n0",))
    assert not torch.equal(star.states["n0"].x.reshape(-1), star.states["server"].x.reshape(-1))
    star.round(1, _grads(star.gen), lr=0.01)
    for field in ("x", "m", "v"):
        assert torch.equal(getattr(star.states["n0"], field), getattr(star.states["server"], field))


@pytest.mark.parametrize("codec", [*LOSSY, "raw"])
def test_apmsqueeze_freezes_v_and_its_memories_telescope(codec: str) -> None:
    """After warm-up v never changes; worker and server memories telescope; with the
    identity codec the run is momentum SGD preconditioned by the frozen v."""
    warm, b1, b2, eps, lr = 3, 0.9, 0.99, 1e-8, 0.01
    alg = NodeRule(APMSqueeze(precondition_rounds=warm, betas=(b1, b2), eps=eps))
    star = _Star(alg, RawCodec() if codec == "raw" else _codec(codec))
    for t in range(warm):
        star.round(t, _grads(star.gen), lr=lr)
    frozen = {n: star.states[n].v.clone() for n in NODES}
    x, m = star.states["server"].x.reshape(-1).clone(), star.states["server"].m.clone()
    vhat = frozen["server"] / (1 - b2**warm)
    intended = {w: torch.zeros(50, dtype=torch.float64) for w in WORKERS}
    sent0 = {w: len(star.sent[w]) for w in WORKERS}
    server_intended = torch.zeros(50, dtype=torch.float64)
    for t in range(warm, warm + 8):
        before = {
            w: (star.states[w].m.clone(), star.states[w].delta.reshape(-1).clone()) for w in WORKERS
        }
        grads = _grads(star.gen)
        star.round(t, grads, lr=lr)
        m = b1 * m + (1 - b1) * torch.stack(list(grads.values())).mean(0)
        x = x - lr * (m / (1 - b1 ** (t + 1))) / (vhat.sqrt() + eps)
        for node in NODES:
            assert torch.equal(star.states[node].v, frozen[node])
        for w in WORKERS:
            m_w, _ = before[w]
            intended[w] += (b1 * m_w.reshape(-1) + (1 - b1) * grads[w]).double()
            sent = torch.stack(star.sent[w][sent0[w] :]).double().sum(0)
            assert torch.allclose(
                sent + star.states[w].delta.reshape(-1).double(), intended[w], atol=1e-5
            )
        server_intended += star.server_in[-1].double()
        broadcast = torch.stack(star.sent["server"][warm:]).double().sum(0)
        delta = star.states["server"].delta.reshape(-1).double()
        assert torch.allclose(broadcast + delta, server_intended, atol=1e-5)
        for w in WORKERS:  # everyone holds the model and the shared momentum mbar
            assert torch.equal(star.states[w].x.reshape(-1), star.states["server"].x.reshape(-1))
            assert torch.equal(star.states[w].m, star.states["server"].m)
        if codec == "raw":
            assert torch.allclose(star.states["server"].x.reshape(-1), x, atol=1e-5), t
    if codec != "raw":
        assert float(star.states["n0"].delta.reshape(-1).abs().max()) > 1e-4
        assert not torch.allclose(star.states["server"].x.reshape(-1), x, atol=1e-5)


def test_apmsqueeze_network_run_freezes_v_after_warm_up() -> None:
    settings = [*APM, *SMALL, "compression.codec=qsgd", "algorithm.precondition_rounds=4"]
    settings += ["algorithm.lr=0.01"]
    config = load_config(None, [*settings, "run.rounds=10"])
    network = build_network(config)
    network.run(4)
    frozen = {nid: node.state.v.clone() for nid, node in network.nodes.items()}
    assert float(frozen["server"].abs().max()) > 0
    network.run(10)
    for nid, node in network.nodes.items():
        assert torch.equal(node.state.v, frozen[nid])
        assert torch.equal(node.model(), network.nodes["server"].model())
    assert float(network.nodes["n0"].state.delta.abs().max()) > 0


# -- lost messages, checkpoints, options ----------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        [*DOUBLE, "compression.codec=sign", "algorithm.lr=0.3"],
        [*APM, "compression.codec=qsgd", "algorithm.lr=0.01", "algorithm.precondition_rounds=3"],
    ],
)
def test_lost_messages_keep_models_finite(settings: list[str]) -> None:
    network = _run([*settings, *SMALL, "faults.drop=0.3"], 12)
    lagging = 0
    for node in network.nodes.values():
        for field in node.state:
            assert bool(torch.isfinite(field).all())
        lagging += not torch.equal(node.model(), network.nodes["server"].model())
    assert lagging > 0  # some broadcasts really were lost
    setup = prepare_run(load_config(None, [*settings, *SMALL]))
    assert not torch.equal(network.nodes["server"].model(), setup.start)


@pytest.mark.parametrize(
    "settings",
    [
        [*DOUBLE, "compression.codec=qsgd"],
        [*APM, "compression.codec=qsgd", "algorithm.precondition_rounds=3", "algorithm.lr=0.01"],
    ],
)
def test_squeeze_resumes_exactly(tmp_path: Path, settings: list[str]) -> None:
    config = load_config(None, [*settings, *SMALL])
    # APMSqueeze stops inside its warm-up.
    whole, second = assert_resumes_exactly(config, tmp_path, stop=2, end=7)
    for nid, node in whole.nodes.items():
        for a, b in zip(second.nodes[nid].state, node.state, strict=True):
            assert torch.equal(a, b), nid


def test_local_steps_are_refused() -> None:
    network = build_network(load_config(None, [*DOUBLE, *SMALL, "run.local_steps=2"]))
    with pytest.raises(AlgorithmError, match=r"run\.local_steps = 1"):
        network.run(1)


def test_registered() -> None:
    assert ALGORITHMS["doublesqueeze"] is DoubleSqueeze
    assert ALGORITHMS["apmsqueeze"] is APMSqueeze
    alg = NodeRule(make_algorithm("apmsqueeze", precondition_rounds=2, betas=[0.5, 0.9], eps=1e-3))
    assert isinstance(alg.rule, APMSqueezeRule) and alg.betas == (0.5, 0.9)
    network = build_network(load_config(None, [*DOUBLE, *SMALL, "topology.server=ps"]))
    assert "ps" in network.nodes and network.algorithm.server == "ps"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (["algorithm.name=doublesqueeze", "topology.kind=ring"], "runs on a star"),
        (["algorithm.name=apmsqueeze", "topology.kind=ring"], "runs on a star"),
        ([*DOUBLE, "algorithm.error_feedback=1"], "error_feedback"),
        ([*DOUBLE, "algorithm.warmup=3"], "no option warmup"),
        ([*APM, "algorithm.precondition_rounds=0"], "precondition_rounds"),
        ([*APM, "algorithm.precondition_rounds=-2"], "precondition_rounds"),
        ([*APM, "algorithm.precondition_rounds=1.5"], "precondition_rounds"),
        ([*APM, "algorithm.precondition_rounds=true"], "precondition_rounds"),
        ([*APM, "algorithm.betas=[0.9]"], "betas"),
        ([*APM, "algorithm.betas=[0.9, 1.0]"], "betas"),
        ([*APM, "algorithm.betas=[0.9, -0.1]"], "betas"),
        ([*APM, "algorithm.eps=0"], "algorithm.eps"),
        ([*APM, "algorithm.eps=-1e-8"], "algorithm.eps"),
        ([*APM, "algorithm.eps=inf"], "algorithm.eps"),
        ([*APM, "algorithm.error_feedback=true"], "no option error_feedback"),
    ],
)
def test_bad_options_are_config_errors(settings: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        prepare_run(load_config(None, settings))
