"""Tests of the reference models and the flat-parameter Objective."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional

from fedcore.errors import DataError
from fedcore.models import MODELS, Objective, build_model, logreg, mlp, parameter_count

REPO = Path(__file__).resolve().parents[1]
CUSTOM = "examples.custom.my_experiment"
DIM, CLASSES = 12, 5

DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.float64, id="float64")]
NAMES = ["logreg", "mlp", "cnn1d"]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))


def not_a_module(*, input_dim: int, num_classes: int) -> object:
    """A user factory that returns something other than an nn.Module."""
    return [input_dim, num_classes]


def make(name: str, seed: int = 0, **options: object) -> nn.Module:
    if name in ("mlp", "cnn1d"):
        options.setdefault("hidden", 7)
    return build_model(name, input_dim=DIM, num_classes=CLASSES, seed=seed, **options)


def batch(n: int = 16, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, DIM, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen)


def flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def reference_loss_and_grad(
    name: str, dtype: torch.dtype, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same loss and gradient by plain autograd on a fresh, identical module."""
    module = make(name).to(dtype)
    nn.utils.vector_to_parameters(params.detach().clone().to(dtype), module.parameters())
    loss = functional.cross_entropy(module(x.to(dtype)), y)
    grads = torch.autograd.grad(loss, list(module.parameters()))
    return loss.detach(), torch.cat([g.reshape(-1) for g in grads])


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return (
        {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-14}
    )


# --- Objective ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_loss_and_grad_matches_autograd(name: str, dtype: torch.dtype) -> None:
    obj = Objective(make(name), dtype)
    x, y = batch()
    start = obj.initial_params()
    assert start.dtype == dtype and start.shape == (obj.numel,)
    moved = start + 0.3 * torch.randn(obj.numel, generator=torch.Generator().manual_seed(5)).to(
        dtype
    )
    for params in (start, moved):
        loss, grad = obj.loss_and_grad(params, x, y)
        ref_loss, ref_grad = reference_loss_and_grad(name, dtype, params, x, y)
        assert isinstance(loss, float)
        assert grad.dtype == dtype and grad.shape == (obj.numel,)
        torch.testing.assert_close(torch.tensor(loss, dtype=dtype), ref_loss, **tolerance(dtype))
        torch.testing.assert_close(grad, ref_grad, **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_loss_and_grad_does_not_mutate_params(name: str, dtype: torch.dtype) -> None:
    obj = Objective(make(name), dtype)
    x, y = batch()
    params = obj.initial_params() + 0.1
    before = params.clone()
    _, grad = obj.loss_and_grad(params, x, y)
    assert torch.equal(params, before)
    assert grad.data_ptr() != params.data_ptr()
    obj.evaluate(params, x, y)
    assert torch.equal(params, before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_repeated_calls_give_identical_results(name: str, dtype: torch.dtype) -> None:
    obj = Objective(make(name), dtype)
    x, y = batch()
    params = obj.initial_params()
    loss1, grad1 = obj.loss_and_grad(params, x, y)
    kept = grad1.clone()
    loss2, grad2 = obj.loss_and_grad(params, x, y)  # a stale gradient would double here
    assert loss1 == loss2
    assert torch.equal(grad1, grad2)
    obj.loss_and_grad(params * 2, *batch(seed=9))  # somewhere else in between
    loss3, grad3 = obj.loss_and_grad(params, x, y)
    assert loss3 == loss1
    assert torch.equal(grad3, kept)
    assert torch.equal(grad1, kept)  # returned gradients are not views of the buffer


def test_gradient_descent_on_the_objective_lowers_the_loss() -> None:
    obj = Objective(make("logreg"))
    x, y = batch(64)
    params = obj.initial_params()
    first, _ = obj.loss_and_grad(params, x, y)
    for _ in range(30):
        _, grad = obj.loss_and_grad(params, x, y)
        params = params - 0.5 * grad
    last, _ = obj.loss_and_grad(params, x, y)
    assert last < first * 0.7


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_evaluate_returns_loss_and_accuracy(name: str, dtype: torch.dtype) -> None:
    obj = Objective(make(name), dtype)
    x, y = batch(50)
    params = obj.initial_params()
    loss, acc = obj.evaluate(params, x, y)
    assert 0.0 <= acc <= 1.0
    ref_loss, _ = reference_loss_and_grad(name, dtype, params, x, y)
    assert loss == pytest.approx(float(ref_loss), rel=1e-5)
    module = make(name).to(dtype)
    expected = (module(x.to(dtype)).argmax(dim=1) == y).double().mean().item()
    assert acc == pytest.approx(expected)
    assert obj.loss_and_grad(params, x, y)[0] == pytest.approx(loss, rel=1e-6)


def test_evaluate_reaches_full_accuracy_on_separable_data() -> None:
    obj = Objective(nn.Linear(2, 2, bias=False), torch.float64)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.5]])
    y = torch.tensor([0, 1, 0])
    _, acc = obj.evaluate(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), x, y)
    assert acc == 1.0
    _, acc = obj.evaluate(torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64), x, y)
    assert acc == 0.0


def test_objective_numel_and_wrong_shape() -> None:
    obj = Objective(make("logreg"))
    assert obj.numel == DIM * CLASSES + CLASSES
    assert Objective(make("mlp", hidden=3)).numel == DIM * 3 + 3 + 3 * CLASSES + CLASSES
    with pytest.raises(DataError, match="parameters"):
        obj.loss_and_grad(torch.zeros(obj.numel + 1), *batch())
    with pytest.raises(DataError, match="parameters"):
        obj.evaluate(torch.zeros(2, obj.numel), *batch())


def test_objective_needs_trainable_parameters() -> None:
    with pytest.raises(DataError, match="no trainable parameters"):
        Objective(nn.ReLU())


def test_initial_params_are_the_modules_and_a_copy() -> None:
    module = make("mlp")
    expected = flat(module)
    obj = Objective(module)
    start = obj.initial_params()
    assert torch.equal(start, expected)
    start += 1.0
    assert torch.equal(obj.initial_params(), expected)


# --- build_model ----------------------------------------------------------------------------


def test_builtin_registry() -> None:
    assert sorted(MODELS) == [
        "char-lstm",
        "cnn1d",
        "cnn32",
        "femnist-cnn",
        "logreg",
        "mlp",
        "resnet20",
    ]
    assert MODELS["logreg"] is logreg and MODELS["mlp"] is mlp


@pytest.mark.parametrize("name", NAMES)
def test_build_model_is_seeded(name: str) -> None:
    a, b, c = make(name, seed=3), make(name, seed=3), make(name, seed=4)
    assert torch.equal(flat(a), flat(b))
    assert not torch.equal(flat(a), flat(c))


def test_build_model_leaves_the_global_generator_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make("mlp", seed=99)
    assert torch.equal(torch.rand(3), expected)


def test_mlp_hidden_width() -> None:
    module = make("mlp", hidden=11)
    assert [m.out_features for m in module.modules() if isinstance(m, nn.Linear)] == [11, CLASSES]
    with pytest.raises(DataError, match="hidden"):
        make("mlp", hidden=0)


@pytest.mark.parametrize("length", [8, 9, 40, 41])
def test_cnn1d_shapes(length: int) -> None:
    """Logits for any signal length from 8 up, odd ones included."""
    module = build_model("cnn1d", input_dim=length, num_classes=CLASSES, seed=0, hidden=4)
    assert module(torch.randn(3, length)).shape == (3, CLASSES)
    with pytest.raises(DataError, match="at least 8"):
        build_model("cnn1d", input_dim=7, num_classes=CLASSES, seed=0)


def test_user_model_by_import_path_with_options() -> None:
    module = build_model(f"{CUSTOM}:make_model", input_dim=2, num_classes=4, seed=0, width=5)
    widths = [m.out_features for m in module.modules() if isinstance(m, nn.Linear)]
    assert widths == [5, 4]
    default = build_model(f"{CUSTOM}:make_model", input_dim=2, num_classes=4, seed=0)
    assert [m.out_features for m in default.modules() if isinstance(m, nn.Linear)] == [16, 4]
    again = build_model(f"{CUSTOM}:make_model", input_dim=2, num_classes=4, seed=0, width=5)
    assert torch.equal(flat(module), flat(again))
    obj = Objective(module)
    loss, grad = obj.loss_and_grad(obj.initial_params(), torch.randn(8, 2), torch.arange(8) % 4)
    assert loss > 0 and grad.shape == (obj.numel,)


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("nope", {}, "unknown model 'nope'"),
        ("nosuchpkg.mod:f", {}, "cannot import module 'nosuchpkg.mod'"),
        (f"{CUSTOM}:nope", {}, "has no attribute 'nope'"),
        (f"{CUSTOM}:__doc__", {}, "not callable"),
        (f"{CUSTOM}:make_model", {"depth": 3}, "does not accept"),
        ("logreg", {"hidden": 3}, "does not accept"),
        (f"{__name__}:not_a_module", {}, "returned list, not nn.Module"),
    ],
)
def test_build_model_errors(name: str, options: dict[str, object], match: str) -> None:
    with pytest.raises(DataError, match=match) as info:
        build_model(name, input_dim=DIM, num_classes=CLASSES, seed=0, **options)
    assert isinstance(info.value, ValueError)


# --- the models the field publishes on ------------------------------------------------------

PUBLISHED = {
    # name: (input_dim, classes, options, parameters)
    "resnet20": (3 * 32 * 32, 10, {}, 269_722),
    "femnist-cnn": (28 * 28, 62, {}, 6_603_710),
    "char-lstm": (80, 80, {}, 819_920),
    "cnn32": (3 * 32 * 32, 10, {}, 579_402),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_models_have_their_parameter_counts(name: str) -> None:
    d, c, options, count = PUBLISHED[name]
    module = build_model(name, input_dim=d, num_classes=c, seed=0, **options)
    assert sum(p.numel() for p in module.parameters()) == count
    assert parameter_count(name, input_dim=d, num_classes=c, **options) == count


@pytest.mark.parametrize(
    ("norm", "count", "layer"),
    [("group", 269_722, nn.GroupNorm), ("batch", 269_722, nn.BatchNorm2d), ("none", 269_034, None)],
)
def test_resnet20_norms(norm: str, count: int, layer: type[nn.Module] | None) -> None:
    module = build_model("resnet20", input_dim=3072, num_classes=10, seed=0, norm=norm)
    assert sum(p.numel() for p in module.parameters()) == count
    norms = [m for m in module.modules() if isinstance(m, nn.GroupNorm | nn.BatchNorm2d)]
    assert len(norms) == (19 if layer else 0) and all(
        isinstance(m, layer or nn.Module) for m in norms
    )
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    module.eval()
    # Image-shaped or flat examples alike.
    assert torch.equal(module(x), module(x.reshape(2, -1)))
    assert module(x).shape == (2, 10)


@pytest.mark.parametrize(
    ("name", "input_dim", "needle"),
    [
        ("resnet20", 64, "resnet20 takes 32x32 images of 3 channels (3,072 values an example)"),
        ("cnn32", 784, "cnn32 takes 32x32 images of 3 channels"),
        ("femnist-cnn", 3072, "femnist-cnn takes 28x28 images of 1 channel (784 values"),
    ],
)
def test_image_models_refuse_other_sizes_in_one_line(
    name: str, input_dim: int, needle: str
) -> None:
    with pytest.raises(DataError, match=r"^" + needle.replace("(", r"\(").replace(")", r"\)")) as e:
        build_model(name, input_dim=input_dim, num_classes=10, seed=0)
    assert "\n" not in str(e.value) and f"have {input_dim:,}" in str(e.value)


def test_a_published_model_on_the_wrong_dataset_stops_the_run_in_one_line() -> None:
    from fedcore.config import load_config
    from fedcore.setup.prepare import prepare_run

    with pytest.raises(DataError, match="resnet20 takes 32x32 images") as e:
        prepare_run(load_config(None, ["model.name=resnet20"]))  # digits: 64 features
    assert "\n" not in str(e.value) and "64" in str(e.value)
    with pytest.raises(DataError, match="char-lstm takes int64 character indices") as e:
        # digits' float rows of 64 values: the refusal of any float data, as mnist1d's rows
        # of 40 (seconds to generate) would give it.
        prepare_run(load_config(None, ["model.name=char-lstm", "data.dataset=digits"]))
    assert "\n" not in str(e.value)


def test_model_norm_is_checked_when_the_config_is_read() -> None:
    from fedcore.config import load_config
    from fedcore.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean `batch`"):
        load_config(None, ["model.name=resnet20", "model.norm=btach"])
    with pytest.raises(ConfigError, match="has no option 'nrom'; did you mean `norm`"):
        load_config(None, ["model.name=resnet20", "model.nrom=group"])
    assert load_config(None, ["model.name=resnet20", "model.norm=none"]).model.options == {
        "norm": "none"
    }
    with pytest.raises(DataError, match="must be one of group, none, batch"):
        build_model("resnet20", input_dim=3072, num_classes=10, seed=0, norm="layer")
    with pytest.raises(DataError, match="does not accept"):
        build_model("cnn32", input_dim=3072, num_classes=10, seed=0, norm="group")


def test_char_lstm_takes_int64_indices() -> None:
    module = build_model("char-lstm", input_dim=80, num_classes=80, seed=0)
    x = torch.randint(0, 80, (3, 80), generator=torch.Generator().manual_seed(0))
    assert module(x).shape == (3, 80)
    with pytest.raises(DataError, match="int64 character indices"):
        module(x.float())
    obj = Objective(module, sample=(torch.cat([x, x]), torch.arange(6)))
    assert obj.rows.mode == "module" and "aten::mkldnn_rnn_layer" in obj.rows.why
    loss, grad = obj.loss_and_grad(obj.initial_params(), x, torch.tensor([1, 2, 3]))
    assert math.isfinite(loss) and grad.shape == (819_920,) and bool(grad.isfinite().all())
    assert obj.evaluate(obj.initial_params(), x, torch.tensor([1, 2, 3]))[1] >= 0.0


@pytest.mark.parametrize(
    ("name", "shape", "classes", "mode"),
    [
        ("resnet20", (3, 32, 32), 10, "vmap"),
        ("femnist-cnn", (1, 28, 28), 62, "vmap"),
        ("cnn32", (3, 32, 32), 10, "vmap"),
    ],
)
def test_image_models_are_mapped_by_vmap(
    name: str, shape: tuple[int, ...], classes: int, mode: str
) -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, *shape, generator=gen), torch.randint(0, classes, (6,), generator=gen)
    size = 1
    for v in shape:
        size *= v
    obj = Objective(build_model(name, input_dim=size, num_classes=classes, seed=0), sample=(x, y))
    assert obj.rows.mode == mode, obj.rows.why
