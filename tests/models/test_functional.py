"""A FlatModel computes exactly what its nn.Module computes, as a function of one flat parameter vector."""

import pickle

import pytest
import torch
from torch import nn
from torch.func import grad
from torch.nn import functional as F

from bayesadmm.models import FlatModel, logistic, make_model, mean_nll, mlp


def _small_mlp():
    return mlp(in_features=12, hidden=(7, 5), num_classes=3)


def _data(model_in=12, n=9, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, model_in, generator=g), torch.randint(0, classes, (n,), generator=g)


def _loaded_module(model, theta):
    """A real nn.Module holding the parameters theta, through the module's own load_state_dict."""
    module = model.build()
    module.load_state_dict(model.unflatten(theta.detach()))
    return module


def test_mlp_dimension_matches_the_papers_architecture():
    assert mlp().dim == 784 * 200 + 200 + 200 * 100 + 100 + 100 * 10 + 10 == 178110
    assert logistic(5, 3).dim == 5 * 3 + 3


def test_papers_mlp_forward_on_images():
    model = mlp()
    theta = model.initial_params(torch.Generator().manual_seed(0))
    X = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model.forward(theta, X), _loaded_module(model, theta)(X))


@pytest.mark.parametrize("factory", [_small_mlp, lambda: logistic(12, 3)])
def test_forward_equals_the_modules_own_forward(factory):
    model = factory()
    theta = model.initial_params(torch.Generator().manual_seed(0))
    X, _ = _data()
    out = model.forward(theta, X)
    assert out.shape == (9, 3)
    torch.testing.assert_close(out, _loaded_module(model, theta)(X))


def test_unflatten_returns_views_and_flatten_inverts_it():
    model = _small_mlp()
    theta = torch.randn(model.dim, generator=torch.Generator().manual_seed(0))
    params = model.unflatten(theta)
    assert [(name, tuple(p.shape)) for name, p in params.items()] == [
        (name, tuple(p.shape)) for name, p in model.build().named_parameters()
    ]
    for p in params.values():
        assert p.untyped_storage().data_ptr() == theta.untyped_storage().data_ptr()
    torch.testing.assert_close(model.flatten(params), theta, rtol=0, atol=0)
    with pytest.raises(ValueError, match="shape"):
        model.unflatten(theta[:-1])


def test_float32_inputs_follow_the_parameter_dtype():
    model = _small_mlp()
    theta = model.initial_params(torch.Generator().manual_seed(0))
    X, _ = _data()
    assert theta.dtype == torch.float64
    torch.testing.assert_close(model.forward(theta, X.float()), model.forward(theta, X))


def test_initial_params_depend_only_on_the_generator():
    model = _small_mlp()
    global_state = torch.get_rng_state()
    a = model.initial_params(torch.Generator().manual_seed(3))
    b = model.initial_params(torch.Generator().manual_seed(3))
    c = model.initial_params(torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), global_state)
    assert a.shape == (model.dim,) and not a.requires_grad
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    # PyTorch's default initialisation: Linear weights are U(−1/√fan_in, 1/√fan_in).
    first_weight = model.unflatten(a)["1.weight"]
    assert first_weight.abs().max() <= 1 / 12**0.5


def test_forward_batched_equals_a_loop():
    model = _small_mlp()
    thetas = torch.randn(6, model.dim, generator=torch.Generator().manual_seed(0))
    X, _ = _data()
    batched = model.forward_batched(thetas, X)
    assert batched.shape == (6, 9, 3)
    torch.testing.assert_close(batched, torch.stack([model.forward(t, X) for t in thetas]))
    with pytest.raises(ValueError, match="shape"):
        model.forward_batched(thetas[0], X)


def test_mean_nll_gradient_equals_the_modules_autograd_gradient():
    model = _small_mlp()
    theta = model.initial_params(torch.Generator().manual_seed(0))
    X, y = _data()

    module = _loaded_module(model, theta)
    F.cross_entropy(module(X), y).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in module.parameters()])

    theta = theta.clone().requires_grad_(True)
    loss = mean_nll(model, theta, X, y)
    loss.backward()
    torch.testing.assert_close(theta.grad, expected)
    torch.testing.assert_close(grad(lambda t: mean_nll(model, t, X, y))(theta.detach()), expected)
    torch.testing.assert_close(loss.detach(), F.cross_entropy(module(X), y).detach())


def test_buffers_are_carried_as_constants():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    module.train()
    module(torch.randn(64, 3) * 3 + 1)   # running statistics away from their initial values
    model = FlatModel.from_module(module)
    assert set(model.buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    theta = model.flatten(dict(module.named_parameters())).detach()
    X = torch.randn(5, 3)
    expected = module.eval()(X)
    torch.testing.assert_close(model.forward(theta, X), expected)
    theta64 = theta.double()   # buffers follow θ's dtype
    torch.testing.assert_close(model.forward(theta64, X), expected.double(), rtol=1e-5, atol=1e-6)
    assert torch.equal(model.initial_params(torch.Generator()), theta)   # from_module: the module's own values
    module.train()(torch.randn(8, 3))   # the user's module changes later; the model keeps what it carried
    torch.testing.assert_close(model.forward(theta, X), expected)


def test_modules_without_parameters_are_rejected():
    with pytest.raises(ValueError, match="no parameters"):
        FlatModel(nn.ReLU)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        FlatModel.from_module("mlp")


def _every_planned_layer():
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.Identity(), nn.ReLU(), nn.Linear(6, 5), nn.Tanh(),
                         nn.Linear(5, 4), nn.Sigmoid(), nn.Linear(4, 3, bias=False))


@pytest.mark.parametrize("factory", [_small_mlp, lambda: FlatModel(_every_planned_layer)])
def test_models_survive_pickling(factory):
    """Worker processes receive the model pickled, with its forward plan."""
    model = factory()
    theta = model.initial_params(torch.Generator().manual_seed(0))
    X, _ = _data()
    clone = pickle.loads(pickle.dumps(model))
    assert torch.equal(clone.forward(theta, X), model.forward(theta, X))
    assert torch.equal(model.forward(theta, X), _through_functional_call(model, theta, X))


def test_make_model():
    model = make_model("mlp", in_features=4, hidden=(5,), num_classes=2, activation="relu")
    assert model.dim == 4 * 5 + 5 + 5 * 2 + 2
    assert make_model("logistic", in_features=4, num_classes=2).dim == 10
    with pytest.raises(ValueError, match="logistic, mlp"):
        make_model("resnet-1000")
    with pytest.raises(ValueError, match="relu, sigmoid, tanh"):
        mlp(activation="swish")


def _through_functional_call(model, theta, X):
    """The general route the sequential plan stands in for: torch.func.functional_call on the template module."""
    from torch.func import functional_call

    if X.dtype != theta.dtype:
        X = X.to(theta.dtype)
    return functional_call(model.module, model.unflatten(theta), (X,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("factory", [
    _small_mlp, lambda: logistic(12, 3),
    lambda: mlp(in_features=12, hidden=(6,), num_classes=3, activation="relu"),
    lambda: mlp(in_features=12, hidden=(6, 4, 5), num_classes=3, activation="tanh")])
def test_sequential_plan_gives_the_bits_of_functional_call(factory, dtype):
    """The fast route of plain MLPs must be the same computation: equal values and gradients bit for bit, also under
    vmap (forward_batched), on image-shaped inputs that the Flatten layer reshapes."""
    model = factory()
    assert model._plan is not None   # these models take the fast route
    theta = model.initial_params(torch.Generator().manual_seed(0)).to(dtype)
    X = torch.randn(9, 3, 4, generator=torch.Generator().manual_seed(1))     # 12 features as a 3×4 image
    y = torch.randint(0, 3, (9,), generator=torch.Generator().manual_seed(2))
    assert torch.equal(model.forward(theta, X), _through_functional_call(model, theta, X))
    loss = lambda fwd: lambda t: F.cross_entropy(fwd(model, t, X) if fwd else model.forward(t, X), y)  # noqa: E731
    assert torch.equal(grad(loss(None))(theta), grad(loss(_through_functional_call))(theta))
    thetas = torch.stack([theta, 2 * theta])
    general = torch.func.vmap(lambda t: _through_functional_call(model, t, X))(thetas)
    assert torch.equal(model.forward_batched(thetas, X), general)


def test_other_modules_take_the_general_route():
    """Anything but Sequential(Flatten, Linear, activations) runs through functional_call, and still matches the
    module: an inplace activation, a nested module, a CNN."""
    inplace = FlatModel(lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU(inplace=True), nn.Linear(3, 2)))
    nested = FlatModel(lambda: nn.Sequential(nn.Sequential(nn.Linear(4, 3)), nn.Linear(3, 2)))
    cnn = make_model("zenke-cnn")
    for model in (inplace, nested, cnn):
        assert model._plan is None
    theta = nested.initial_params(torch.Generator().manual_seed(0))
    X = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(nested.forward(theta, X), _loaded_module(nested, theta)(X))
