"""LocalAdam minimises ℓ̄_k + aᵀθ + ½Σ b(θ − c)² + wd/2‖θ‖², the shared client problem of the point methods."""

import pytest
import torch

from bayesadmm.problems import synthetic
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.newton import ProxNewton


def test_reaches_the_minimiser_of_the_proximal_problem():
    loss = synthetic.logistic_clients(num_clients=1, per_client=200, dim=3, seed=0)[0]
    n = loss.num_examples
    linear, center, weight = torch.tensor([0.3, -0.2, 0.1]), torch.tensor([1.0, 0.5, -1.0]), 0.4
    # the same problem in summed-loss units, solved by Newton: ℓ + (N a)ᵀθ + (N b)/2 ‖θ − c‖²
    exact = ProxNewton().minimize(loss, n * linear, n * weight, center).theta
    solver = LocalAdam(lr=0.01, epochs=2000, batch_size=200)
    theta, steps = solver.train(loss, torch.zeros(3), torch.Generator().manual_seed(0), linear=linear,
                                prox_weight=weight, prox_center=center)
    assert steps == 2000
    torch.testing.assert_close(theta, exact, atol=2e-3, rtol=0)
    # and the objective it reports is minimal there
    assert solver.objective(loss, theta, linear, weight, center) <= solver.objective(loss, theta + 0.05, linear,
                                                                                      weight, center)


def test_per_coordinate_prox_and_weight_decay():
    loss = synthetic.logistic_clients(num_clients=1, per_client=100, dim=3, seed=1)[0]
    weight = torch.tensor([0.1, 1.0, 10.0])
    theta, _ = LocalAdam(lr=0.01, epochs=400, batch_size=100, weight_decay=0.05).train(
        loss, torch.zeros(3), torch.Generator().manual_seed(0), prox_weight=weight, prox_center=torch.ones(3))
    n = loss.num_examples
    # gradient of the mean objective vanishes at the result
    grad = loss.grad(theta) / n + weight * (theta - 1.0) + 0.05 * theta
    assert grad.abs().max() < 2e-3


def test_pure_and_reproducible():
    loss = synthetic.logistic_clients(num_clients=1, per_client=50, dim=3, seed=2)[0]
    theta0 = torch.zeros(3)
    solver = LocalAdam(lr=0.05, epochs=2, batch_size=8)
    a, _ = solver.train(loss, theta0, torch.Generator().manual_seed(5))
    b, _ = solver.train(loss, theta0, torch.Generator().manual_seed(5))
    c, _ = solver.train(loss, theta0, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(theta0, torch.zeros(3))


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="lr"):
        LocalAdam(lr=0)
    with pytest.raises(ValueError, match="centre"):
        LocalAdam().objective(synthetic.logistic_clients(1, 5, 2)[0], torch.zeros(2), prox_weight=1.0)
