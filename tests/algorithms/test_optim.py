"""Contract of the node optimizers (issue 15, item 1; algorithms.md section 11).

Every optimizer in the registry is checked here: plain SGD is today's ``lr * g`` bit for
bit, momentum 0 is SGD, Adam and LAMB match the formulas written out by hand, LAMB's step
length is the trust ratio and its direction does not depend on the gradient's scale, LARS
takes one rate per layer, states survive a checkpoint, and stacked ``[N, d]`` parameters
give each row what that row alone gives.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedcore.algorithms.optim import OPTIMIZERS, make_optimizer
from fedcore.errors import ConfigError
from fedcore.setup import checkpoint

D = 7
SEGMENTS = [("w", 0, 5), ("b", 5, 2)]


def _grads(steps: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(D, generator=g, dtype=torch.float64) for _ in range(steps)]


def _params(seed: int = 1) -> torch.Tensor:
    return torch.randn(D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _run(name: str, grads: list[torch.Tensor], x: torch.Tensor, lr: float, **options: object):
    opt = make_optimizer(name, segments=SEGMENTS, **options)
    state = opt.init(x)
    out = []
    for g in grads:
        u, state = opt.update(g, state, x, lr)
        out.append(u)
        x = x - u
    return out, x, state


def test_sgd_is_todays_step_bit_for_bit() -> None:
    x = _params().float()
    for g in _grads(3):
        g = g.float()
        u, _ = make_optimizer("sgd").update(g, make_optimizer("sgd").init(x), x, 0.3)
        assert torch.equal(x - u, x - 0.3 * g)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_zero_is_sgd(nesterov: bool) -> None:
    grads, x = _grads(4), _params()
    plain, _, _ = _run("sgd", grads, x, 0.1)
    heavy, _, _ = _run("momentum", grads, x, 0.1, momentum=0.0, nesterov=nesterov)
    assert all(torch.equal(a, b) for a, b in zip(plain, heavy, strict=True))


def test_momentum_and_nesterov_follow_their_formulas() -> None:
    grads, x = _grads(3), _params()
    for nesterov in (False, True):
        got, _, _ = _run("momentum", grads, x, 0.1, momentum=0.9, nesterov=nesterov)
        b = torch.zeros(D, dtype=torch.float64)
        for g, u in zip(grads, got, strict=True):
            b = 0.9 * b + g
            want = 0.1 * (g + 0.9 * b) if nesterov else 0.1 * b
            torch.testing.assert_close(u, want, rtol=0, atol=1e-15)


def _adam_by_hand(grads, x, lr, b1, b2, eps, wd, decoupled):
    m = torch.zeros(D, dtype=torch.float64)
    v = torch.zeros(D, dtype=torch.float64)
    out = []
    for t, g in enumerate(grads, 1):
        if wd and not decoupled:
            g = g + wd * x
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g**2
        r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        if decoupled:
            r = r + wd * x
        u = lr * r
        out.append(u)
        x = x - u
    return out


@pytest.mark.parametrize(("name", "decoupled"), [("adam", False), ("adamw", True)])
def test_adam_matches_the_formulas(name: str, decoupled: bool) -> None:
    grads, x = _grads(5), _params()
    got, _, _ = _run(name, grads, x, 0.01, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.1)
    want = _adam_by_hand(grads, x, 0.01, 0.8, 0.99, 1e-8, 0.1, decoupled)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_lamb_matches_the_formulas_per_layer() -> None:
    grads, x = _grads(4), _params()
    got, _, _ = _run("lamb", grads, x, 0.05, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    m = torch.zeros(D, dtype=torch.float64)
    v = torch.zeros(D, dtype=torch.float64)
    for t, (g, u) in enumerate(zip(grads, got, strict=True), 1):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g**2
        r = (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-6) + 0.01 * x
        want = torch.empty(D, dtype=torch.float64)
        for _, off, n in SEGMENTS:
            layer = slice(off, off + n)
            want[layer] = 0.05 * x[layer].norm() / r[layer].norm() * r[layer]
        torch.testing.assert_close(u, want, rtol=1e-12, atol=0)
        x = x - u


def test_lamb_step_length_is_the_trust_ratio() -> None:
    """One layer, no decay: ``||u|| = lr ||x||`` at every step."""
    x = _params()
    opt = make_optimizer("lamb")
    state = opt.init(x)
    for g in _grads(5):
        u, state = opt.update(g, state, x, 0.02)
        assert math.isclose(float(u.norm()), 0.02 * float(x.norm()), rel_tol=1e-12)
        x = x - u


def test_lamb_direction_does_not_depend_on_the_gradients_scale() -> None:
    grads, x = _grads(4), _params()
    base, _, _ = _run("lamb", grads, x, 0.05, eps=0.0)
    scaled, _, _ = _run("lamb", [7.5 * g for g in grads], x, 0.05, eps=0.0)
    for a, b in zip(base, scaled, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_lamb_trust_clip_caps_the_weight_norm() -> None:
    x = 10 * _params()
    g = _grads(1)[0]
    u, _ = make_optimizer("lamb", trust_clip=0.5).update(g, make_optimizer("lamb").init(x), x, 0.1)
    assert math.isclose(float(u.norm()), 0.1 * 0.5, rel_tol=1e-12)


def test_lars_takes_one_rate_per_layer() -> None:
    x, g = _params(), _grads(1)[0]
    u, state = make_optimizer("lars", eta=0.01, weight_decay=0.1, segments=SEGMENTS).update(
        g, make_optimizer("lars", segments=SEGMENTS).init(x), x, 0.5
    )
    for _, off, n in SEGMENTS:
        layer = slice(off, off + n)
        wn, gn = x[layer].norm(), g[layer].norm()
        lam = 0.01 * wn / (gn + 0.1 * wn)
        torch.testing.assert_close(u[layer], 0.5 * lam * (g[layer] + 0.1 * x[layer]))
    assert torch.equal(state.velocity, u)


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_a_zero_layer_gets_a_ratio_of_one(name: str) -> None:
    x = _params()
    x[5:] = 0  # the bias layer is all zeros, as at initialisation
    g = _grads(1)[0]
    opt = make_optimizer(name, segments=SEGMENTS)
    u, _ = opt.update(g, opt.init(x), x, 0.1)
    assert torch.isfinite(u).all()
    if name == "lars":
        torch.testing.assert_close(u[5:], 0.1 * g[5:])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_survives_a_checkpoint(name: str) -> None:
    grads, x = _grads(6), _params()
    opt = make_optimizer(name, segments=SEGMENTS)
    state = opt.init(x)
    for g in grads[:3]:
        u, state = opt.update(g, state, x, 0.1)
        x = x - u
    restored = checkpoint.from_tree(checkpoint.to_tree(state))
    assert type(restored) is type(state)
    a, b = (x, state), (x.clone(), restored)
    for g in grads[3:]:
        ua, sa = opt.update(g, a[1], a[0], 0.1)
        ub, sb = opt.update(g, b[1], b[0], 0.1)
        assert torch.equal(ua, ub)
        a, b = (a[0] - ua, sa), (b[0] - ub, sb)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_stacked_rows_are_each_rows_own_run(name: str) -> None:
    n = 4
    xs = torch.stack([_params(seed) for seed in range(n)])
    grads = [torch.stack([_grads(3, seed)[t] for seed in range(n)]) for t in range(3)]
    opt = make_optimizer(name, segments=SEGMENTS)
    stacked, state = xs, opt.init(xs)
    for g in grads:
        u, state = opt.update(g, state, stacked, 0.1)
        stacked = stacked - u
    for i in range(n):
        row, s = xs[i], opt.init(xs[i])
        for g in grads:
            u, s = opt.update(g[i], s, row, 0.1)
            row = row - u
        torch.testing.assert_close(stacked[i], row, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("rmsprop", {}, "unknown optimizer"),
        ("sgd", {"momentum": 0.9}, "no option momentum"),
        ("adam", {"betas": (0.9, 1.0)}, "betas"),
        ("lamb", {"weight_decay": -1.0}, ">= 0"),
        ("momentum", {"momentum": math.nan}, "finite"),
    ],
)
def test_bad_options_are_one_clear_error(name: str, options: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_optimizer(name, **options)


def test_segments_must_tile_the_vector() -> None:
    opt = make_optimizer("lamb", segments=[("w", 0, 5)])
    with pytest.raises(ConfigError, match="cover 5 of 7"):
        opt.init(_params())


def test_a_models_segments_tile_its_flat_vector() -> None:
    from fedcore.models import Objective, build_model

    objective = Objective(build_model("mlp", input_dim=64, num_classes=10, seed=0))
    segments = objective.segments
    assert [name for name, _, _ in segments] == [
        name for name, p in objective.module.named_parameters()
    ]
    assert sum(n for _, _, n in segments) == objective.numel
    x = objective.initial_params()
    opt = make_optimizer("lamb", segments=segments)
    opt.update(torch.ones_like(x), opt.init(x), x, 0.1)  # segments accepted as they are
