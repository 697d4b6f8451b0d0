"""`FlatModel.batched_gradients`: row s of the result is the gradient of row s's own loss, by either route (the
written-out backward pass of plan-run models, vmap of grad for any other), in float64 to 1e-12."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bayesadmm.models import FlatModel

ROWS, BATCH, CLASSES = 4, 6, 3


class _Residual(nn.Module):  # not a Sequential: runs through functional_call and the vmap route
    def __init__(self):
        super().__init__()
        self.inner, self.outer = nn.Linear(5, 5), nn.Linear(5, CLASSES)

    def forward(self, x):
        return self.outer(x + torch.tanh(self.inner(x)))


NETS = {
    "sigmoid": (lambda: nn.Sequential(nn.Linear(5, 7), nn.Sigmoid(), nn.Linear(7, 4), nn.Sigmoid(),
                                      nn.Linear(4, CLASSES)), (5,)),
    "tanh-no-bias": (lambda: nn.Sequential(nn.Linear(5, 7, bias=False), nn.Tanh(), nn.Linear(7, CLASSES)), (5,)),
    "relu-identity": (lambda: nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Identity(), nn.Linear(7, CLASSES)), (5,)),
    "flatten-images": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, CLASSES)),
                       (1, 3, 4)),
    "logistic": (lambda: nn.Sequential(nn.Linear(5, CLASSES)), (5,)),
    "residual": (_Residual, (5,)),
}


@pytest.mark.parametrize("name", sorted(NETS))
def test_each_row_is_the_gradient_of_its_own_loss(name):
    build, shape = NETS[name]
    model = FlatModel(build)
    assert (model._plan is None) == (name == "residual")  # both routes are exercised
    gen = torch.Generator().manual_seed(0)
    thetas = torch.randn(ROWS, model.dim, generator=gen, dtype=torch.float64)
    X = torch.randn(ROWS, BATCH, *shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (ROWS, BATCH), generator=gen)
    out = torch.full_like(thetas, float("nan"))
    got = model.batched_gradients(thetas, X, F.cross_entropy, y, out=out)
    for s in range(ROWS):
        theta = thetas[s].clone().requires_grad_()
        (expected,) = torch.autograd.grad(F.cross_entropy(model.forward(theta, X[s]), y[s]), theta)
        torch.testing.assert_close(got[s], expected, rtol=1e-12, atol=1e-12)
    if model._plan is not None:  # written in place, every coordinate
        assert got.data_ptr() == out.data_ptr() and bool(torch.isfinite(out).all())


def test_float32_images_are_computed_in_the_parameters_dtype():
    model = FlatModel(NETS["flatten-images"][0])
    thetas = torch.randn(2, model.dim, dtype=torch.float64)
    X, y = torch.rand(2, BATCH, 1, 3, 4), torch.randint(0, CLASSES, (2, BATCH))
    got = model.batched_gradients(thetas, X, F.cross_entropy, y)
    assert got.dtype == torch.float64
    theta = thetas[1].clone().requires_grad_()
    (expected,) = torch.autograd.grad(F.cross_entropy(model.forward(theta, X[1]), y[1]), theta)
    torch.testing.assert_close(got[1], expected)


def test_shapes_that_do_not_match_are_refused():
    model = FlatModel(NETS["logistic"][0])
    with pytest.raises(ValueError, match="thetas must have shape"):
        model.batched_gradients(torch.zeros(2, model.dim + 1), torch.zeros(2, BATCH, 5), lambda o: o.sum())
    with pytest.raises(ValueError, match="thetas must have shape"):
        model.batched_gradients(torch.zeros(2, model.dim), torch.zeros(3, BATCH, 5), lambda o: o.sum())


def test_per_row_arguments_weigh_each_rows_examples():
    """A loss with a second per-row argument (the cohort's padded minibatches: weights 1/b, 0 on padding)."""
    for name in ("sigmoid", "residual"):
        model = FlatModel(NETS[name][0])
        gen = torch.Generator().manual_seed(3)
        thetas = torch.randn(ROWS, model.dim, generator=gen, dtype=torch.float64)
        X = torch.randn(ROWS, BATCH, 5, generator=gen, dtype=torch.float64)
        y = torch.randint(0, CLASSES, (ROWS, BATCH), generator=gen)
        w = torch.rand(ROWS, BATCH, generator=gen, dtype=torch.float64)

        def weighted(outputs, targets, weights):
            return (F.cross_entropy(outputs, targets, reduction="none") * weights).sum()

        got = model.batched_gradients(thetas, X, weighted, y, w)
        for s in range(ROWS):
            theta = thetas[s].clone().requires_grad_()
            (expected,) = torch.autograd.grad(weighted(model.forward(theta, X[s]), y[s], w[s]), theta)
            torch.testing.assert_close(got[s], expected, rtol=1e-12, atol=1e-12)


def test_parameters_that_require_grad_are_taken_as_values():
    model = FlatModel(NETS["sigmoid"][0])
    thetas = torch.randn(2, model.dim, dtype=torch.float64, requires_grad=True)
    X, y = torch.randn(2, BATCH, 5, dtype=torch.float64), torch.randint(0, CLASSES, (2, BATCH))
    got = model.batched_gradients(thetas, X, F.cross_entropy, y)
    expected = model.batched_gradients(thetas.detach(), X, F.cross_entropy, y)
    assert not got.requires_grad and torch.equal(got, expected)


def test_a_closed_form_loss_gradient_gives_the_autograd_routes_bits():
    """`loss_grad` (the likelihood's `nll_grad`, as cohort training passes it) replaces autograd of the loss, with
    the same bits: in float32 and float64, for the mean and for per-example weights."""
    from bayesadmm.likelihoods import Classification

    likelihood, model = Classification(), FlatModel(NETS["sigmoid"][0])
    for dtype in (torch.float32, torch.float64):
        gen = torch.Generator().manual_seed(5)
        thetas = torch.randn(ROWS, model.dim, generator=gen, dtype=dtype)
        X = torch.randn(ROWS, BATCH, 5, generator=gen, dtype=dtype)
        y = torch.randint(0, CLASSES, (ROWS, BATCH), generator=gen)
        w = torch.rand(ROWS, BATCH, generator=gen, dtype=dtype)

        def mean_grad(outputs, targets):
            return likelihood.nll_grad(outputs, targets, 1.0 / BATCH)

        def weighted(outputs, targets, weights):
            per_example = torch.func.vmap(lambda o, t: F.cross_entropy(o[None], t[None]))(outputs, targets)
            return (per_example * weights).sum()

        closed = model.batched_gradients(thetas, X, F.cross_entropy, y, loss_grad=mean_grad)
        assert torch.equal(closed, model.batched_gradients(thetas, X, F.cross_entropy, y))
        closed = model.batched_gradients(thetas, X, weighted, y, w, loss_grad=likelihood.nll_grad)
        assert torch.equal(closed, model.batched_gradients(thetas, X, weighted, y, w))


@pytest.mark.parametrize("name", ["sigmoid", "flatten-images", "residual"])
def test_a_clients_batch_grad_is_the_gradient_of_its_batch_loss(name):
    """SupervisedData.batch_grad (the per-client solvers' gradient): autograd of batch_loss, in float64 to 1e-12, by
    the written-out route for plan-run models and by autograd for any other model or a likelihood without nll_grad."""
    from bayesadmm.clients import SupervisedData
    from bayesadmm.likelihoods import Classification

    class _NoClosedForm(Classification):  # mean_nll only: batch_grad must fall back to autograd
        nll_grad = None

    build, shape = NETS[name]
    model = FlatModel(build)
    gen = torch.Generator().manual_seed(4)
    X = torch.randn(20, *shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (20,), generator=gen)
    theta = model.initial_params(gen).to(torch.float64).requires_grad_()
    idx = torch.randperm(20, generator=gen)[:7]
    for likelihood in (Classification(), _NoClosedForm()):
        data = SupervisedData(model, X, y, likelihood)
        (expected,) = torch.autograd.grad(data.batch_loss(theta, idx), theta)
        got = data.batch_grad(theta, idx)
        assert got.shape == theta.shape and not got.requires_grad
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert model.written_out_backward == (name != "residual")
