"""The closed-form gradients and Hessians of the convex losses agree with autograd."""

import pytest
import torch
from torch.func import grad, hessian

from bayesadmm.problems.losses import LogisticLoss, QuadraticLoss, SoftmaxLoss, ridge_loss


def _losses():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 4, generator=g)
    y01 = (torch.rand(30, generator=g) < 0.5).double()
    yc = torch.randint(0, 3, (30,), generator=g)
    Y = torch.randn(30, 2, generator=g)
    M = torch.randn(5, 5, generator=g)
    return {
        "quadratic": QuadraticLoss(A=M @ M.T + torch.eye(5), b=torch.randn(5, generator=g), c=1.5),
        "ridge": ridge_loss(X, Y),
        "logistic": LogisticLoss(X, y01),
        "softmax": SoftmaxLoss(X, yc, num_classes=3),
    }


@pytest.mark.parametrize("name", ["quadratic", "ridge", "logistic", "softmax"])
def test_derivatives_match_autograd(name):
    loss = _losses()[name]
    theta = torch.randn(loss.dim, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loss.grad(theta), grad(loss.value)(theta))
    H = hessian(loss.value)(theta)
    torch.testing.assert_close(loss.hess(theta), H)
    torch.testing.assert_close(loss.hess_diag(theta), torch.diagonal(H))


def test_ridge_value_is_half_squared_residual():
    g = torch.Generator().manual_seed(2)
    X, Y = torch.randn(10, 3, generator=g), torch.randn(10, 2, generator=g)
    W = torch.randn(2, 3, generator=g)  # output-major θ = vec(W)
    torch.testing.assert_close(ridge_loss(X, Y).value(W.reshape(-1)), 0.5 * ((X @ W.T - Y) ** 2).sum())


def test_quadratic_rejects_bad_shapes():
    with pytest.raises(ValueError, match="shape"):
        QuadraticLoss(A=torch.eye(3), b=torch.zeros(4))


@pytest.mark.parametrize("name", ["logistic", "softmax"])
def test_batch_loss_is_the_mean_over_the_batch(name):
    loss = _losses()[name]
    theta = torch.randn(loss.dim, generator=torch.Generator().manual_seed(3))
    everything = torch.arange(loss.num_examples)
    torch.testing.assert_close(loss.batch_loss(theta, everything), loss.value(theta) / loss.num_examples)
    idx = torch.tensor([0, 5, 7])
    parts = [loss.batch_loss(theta, idx[i:i + 1]) for i in range(3)]
    torch.testing.assert_close(loss.batch_loss(theta, idx), sum(parts) / 3)
