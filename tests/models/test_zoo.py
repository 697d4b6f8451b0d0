"""The image architectures of the zoo: shapes, parameter counts, and FlatModel ≡ the module's own forward."""

import pickle

import pytest
import torch
from torch import nn

from bayesadmm.models import FlatModel, make_model
from bayesadmm.models.zoo import MODELS, acar_cnn, resnet20, zenke_cnn


def _conv(c_in, c_out, k, bias=True):
    return c_in * c_out * k * k + (c_out if bias else 0)


def _fc(n_in, n_out):
    return n_in * n_out + n_out


def _images(n=2, seed=1, channels=3):
    return torch.rand(n, channels, 32, 32, generator=torch.Generator().manual_seed(seed))


def _loaded_module(model, theta):
    """A real nn.Module holding the parameters theta, through the module's own load_state_dict."""
    module = model.build().eval()
    module.load_state_dict(model.unflatten(theta.detach()))
    return module


FACTORIES = {"zenke-cnn": zenke_cnn, "acar-cnn": acar_cnn, "resnet20": resnet20}


def test_zenke_cnn_parameter_count():
    expected = (
        _conv(3, 32, 3) + _conv(32, 32, 3) + _conv(32, 64, 3) + _conv(64, 64, 3) + _fc(64 * 6 * 6, 512) + _fc(512, 10)
    )
    assert zenke_cnn().dim == expected == 1_250_858
    assert zenke_cnn(num_classes=100, in_channels=1).dim == expected - _conv(3, 32, 3) + _conv(1, 32, 3) + 90 * 513


def test_acar_cnn_parameter_count():
    expected = _conv(3, 64, 5) + _conv(64, 64, 5) + _fc(64 * 5 * 5, 384) + _fc(384, 192) + _fc(192, 10)
    assert acar_cnn().dim == expected == 797_962


def test_resnet20_parameter_count():
    gn = lambda c: 2 * c  # noqa: E731  (GroupNorm weight and bias)
    stem = _conv(3, 16, 3, bias=False) + gn(16)
    block = lambda c: 2 * (_conv(c, c, 3, bias=False) + gn(c))  # noqa: E731
    down = lambda c_in, c: (  # noqa: E731
        _conv(c_in, c, 3, bias=False) + gn(c) + _conv(c, c, 3, bias=False) + gn(c) + _conv(c_in, c, 1, bias=False) + gn(c)
    )
    body = 3 * block(16) + down(16, 32) + 2 * block(32) + down(32, 64) + 2 * block(64)
    expected = stem + body + _fc(64, 10)
    assert resnet20(num_classes=10).dim == expected == 272_474  # ~0.27 M
    assert resnet20().dim == expected + 90 * 65 == 278_324  # default: 100 classes
    module = resnet20(num_classes=10).build()
    assert sum(isinstance(m, nn.Conv2d) for m in module.modules()) == 19 + 2  # 19 3×3 convs + 2 projections
    assert sum(isinstance(m, nn.Linear) for m in module.modules()) == 1
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_output_shape_and_no_buffers(name):
    model = FACTORIES[name](num_classes=7)
    theta = model.initial_params(torch.Generator().manual_seed(0))
    assert model.forward(theta, _images(3)).shape == (3, 7)
    assert list(model.build().named_buffers()) == []


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_forward_equals_the_modules_own_forward(name):
    model = FACTORIES[name](num_classes=10)
    theta = model.initial_params(torch.Generator().manual_seed(0))
    assert theta.dtype == torch.float64
    X = _images(2)
    out = model.forward(theta, X)
    torch.testing.assert_close(out, _loaded_module(model, theta)(X), rtol=1e-12, atol=1e-12)
    # float32 images are evaluated in the parameters' precision
    Xf = X.float()
    torch.testing.assert_close(model.forward(theta, Xf), model.forward(theta, Xf.double()), rtol=0, atol=0)


def test_cnn_spatial_sizes():
    """The flatten widths 2304 and 1600 come from the stated valid/same convolutions and poolings."""
    x = _images(1)
    zenke = zenke_cnn().build()
    assert zenke[:11](x).shape == (1, 64 * 6 * 6)
    acar = acar_cnn().build()
    assert acar[:7](x).shape == (1, 64 * 5 * 5)


def test_resnet_stage_resolutions():
    module = resnet20(num_classes=10).build()
    x = _images(1)
    h = torch.relu(module.norm1(module.conv1(x)))
    h1 = module.layer1(h)
    h2 = module.layer2(h1)
    h3 = module.layer3(h2)
    assert (h1.shape, h2.shape, h3.shape) == ((1, 16, 32, 32), (1, 32, 16, 16), (1, 64, 8, 8))


def test_in_channels():
    for factory in FACTORIES.values():
        model = factory(num_classes=4, in_channels=1)
        theta = model.initial_params(torch.Generator().manual_seed(0))
        assert model.forward(theta, _images(2, channels=1)).shape == (2, 4)


@pytest.mark.parametrize("name", ["acar-cnn", "resnet20"])
def test_forward_batched_equals_a_loop(name):
    model = FACTORIES[name](num_classes=10)
    thetas = torch.stack([model.initial_params(torch.Generator().manual_seed(s)) for s in (0, 1)])
    X = _images(2)
    out = model.forward_batched(thetas, X)
    assert out.shape == (2, 2, 10)
    torch.testing.assert_close(out, torch.stack([model.forward(t, X) for t in thetas]), rtol=1e-12, atol=1e-12)


def test_registry_names():
    assert {"zenke-cnn", "acar-cnn", "resnet20"} <= set(MODELS)
    assert make_model("zenke-cnn").dim == 1_250_858
    assert make_model("acar-cnn", num_classes=100).dim == 797_962 + 90 * 193
    assert make_model("resnet20", num_classes=10).dim == 272_474
    assert isinstance(make_model("resnet20", groups=4), FlatModel)


def test_resnet_groups_must_divide_the_widths():
    for groups in (1, 2, 4, 8, 16):
        resnet20(num_classes=10, groups=groups)
    for groups in (0, 3, 32):
        with pytest.raises(ValueError, match="groups"):
            resnet20(groups=groups)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_pickle_round_trip(name):
    model = FACTORIES[name](num_classes=10)
    theta = model.initial_params(torch.Generator().manual_seed(0))
    X = _images(2)
    clone = pickle.loads(pickle.dumps(model))
    assert clone.dim == model.dim
    torch.testing.assert_close(clone.forward(theta, X), model.forward(theta, X), rtol=0, atol=0)
