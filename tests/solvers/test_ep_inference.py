"""FedEP's neural tilted inference (Guo et al. 2023, Sec. 2.2.2): the SG-MCMC moment estimator with shrinkage (M)
and NGVI with the cavity as prior (V), checked against their formulas written out and on problems whose tilted
distribution is known."""

import math
from dataclasses import dataclass

import pytest
import torch

from bayesadmm.families import DiagonalGaussian
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.ep_inference import (
    NGVI,
    SGMCMC,
    ScaledIdentity,
    clip_and_rescale,
    sgd_chain,
    shrunk_moments,
    tilted_mean,
)


@dataclass(frozen=True, eq=False)
class QuadraticData:
    """A Gaussian likelihood on θ itself: ℓ̄(θ) = mean_i ½ Σ_j h_j (θ_j − x_ij)², so the per-example Fisher (= Hessian)
    is h, whatever θ, and the tilted distribution with a Gaussian cavity is Gaussian with precision n h + Λ_{−k}."""

    X: torch.Tensor
    h: torch.Tensor

    @property
    def num_examples(self) -> int:
        return self.X.shape[0]

    def batch_loss(self, theta, idx):
        return 0.5 * (self.h * (theta - self.X[idx]).square()).sum(-1).mean()

    def tilted_mean(self, cavity):
        """argmin ℓ̄ + (½θᵀΛθ − ηᵀθ)/n:  h(θ − x̄) + (Λθ − η)/n = 0."""
        n, precision = self.num_examples, -2.0 * cavity[1]
        return (self.h * self.X.mean(0) + cavity[0] / n) / (self.h + precision / n)


def _quadratic(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return QuadraticData(torch.randn(n, 3, generator=g) + torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.5, 1.0, 2.0]))


def _constant_fisher(data, theta, idx, generator):
    return idx.shape[0] * data.h


FAMILY = DiagonalGaussian(3)


# --- M: moment estimator ---------------------------------------------------------------------------------------------


def test_shrunk_moments_on_known_samples():
    samples = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 10.0]])
    mean, variance = shrunk_moments(samples, shrinkage=0.25)
    # mean (3, 4); population variances 8/3 and (16 + 4 + 36)/3 = 56/3; Σ = ρ + (1 − ρ) Var
    assert torch.allclose(mean, torch.tensor([3.0, 4.0]), atol=1e-15)
    assert torch.allclose(variance, torch.tensor([0.25 + 0.75 * 8 / 3, 0.25 + 0.75 * 56 / 3]), atol=1e-14)
    assert torch.allclose(shrunk_moments(samples, 1.0)[1], torch.ones(2))          # ρ = 1: the identity
    _, single = shrunk_moments(samples[:1], 1e-3)                                  # one sample: Σ = ρ
    assert torch.allclose(single, torch.full((2,), 1e-3))
    with pytest.raises(ValueError, match="shrinkage"):
        shrunk_moments(samples, 1.5)


def test_clip_and_rescale_on_known_precisions():
    values = [1.0] * 9 + [100.0]
    centre = sum(values) / 10
    spread = math.sqrt(sum((v - centre) ** 2 for v in values) / 10)           # population std: 29.7
    upper = centre + 2 * spread                                                # 70.3: clips the 100
    assert centre - 2 * spread < 1.0                                           # the lower bound does not bind
    clipped = torch.tensor(values[:9] + [upper])
    out = clip_and_rescale(torch.tensor(values), target_norm=7.0)
    assert torch.allclose(out, clipped * 7.0 / clipped.norm(), atol=1e-13)
    assert abs(float(out.norm()) - 7.0) < 1e-12
    raw = clip_and_rescale(torch.tensor(values), target_norm=7.0, clip_std=None)
    assert torch.allclose(raw, torch.tensor(values) * 7.0 / torch.tensor(values).norm(), atol=1e-13)


def test_sgd_chain_keeps_one_momentum_sgd_iterate_per_epoch():
    data = _quadratic(n=10)
    linear, weight = torch.tensor([0.1, -0.2, 0.3]), torch.tensor([0.5, 0.0, 2.0])
    start = torch.tensor([2.0, 2.0, -1.0])
    lr, m, epochs, batch = 0.05, 0.9, 4, 4
    samples = sgd_chain(data, start, torch.Generator().manual_seed(3), lr, m, epochs, batch, linear, weight)
    # written out: v ← m v + g, θ ← θ − lr v, with g the minibatch gradient plus a + b∘θ; sample after each epoch
    g = torch.Generator().manual_seed(3)
    theta, velocity, expected = start.clone(), torch.zeros(3), []
    for _ in range(epochs):
        order = torch.randperm(10, generator=g)
        for s in range(0, 10, batch):
            x = data.X[order[s:s + batch]]
            grad = data.h * (theta - x).mean(0) + linear + weight * theta
            velocity = m * velocity + grad
            theta = theta - lr * velocity
        expected.append(theta)
    assert samples.shape == (epochs, 3)
    assert torch.allclose(samples, torch.stack(expected), atol=1e-12)


def test_sgmcmc_recovers_the_tilted_mean_of_a_gaussian_target():
    data = _quadratic(n=64)
    n = data.num_examples
    cavity = FAMILY.from_moments(torch.tensor([-1.0, 3.0, 0.0]), torch.tensor([20.0, 40.0, 5.0]))
    target = data.tilted_mean(cavity)
    assert (target - FAMILY.to_moments(cavity)[0]).norm() > 1.0                 # the cavity mean is not the answer
    method = SGMCMC(alpha=0.1, shrinkage=1e-4, lr=0.05, epochs=400, batch_size=8)
    tilted = method(FAMILY, data, cavity, torch.Generator().manual_seed(0), start=torch.full((3,), 5.0))
    mean, precision = FAMILY.to_moments(tilted)
    assert (mean - target).abs().max() < 0.05
    # the precision is 1/Σ of the same samples, clipped, and rescaled to the norm of Λ_{−k} + α n
    samples = method.samples(data, cavity, torch.Generator().manual_seed(0), start=torch.full((3,), 5.0))
    _, variance = shrunk_moments(samples, 1e-4)
    expected = clip_and_rescale(1.0 / variance, (torch.tensor([20.0, 40.0, 5.0]) + 0.1 * n).norm())
    assert torch.allclose(precision, expected, rtol=1e-12)
    assert torch.allclose(mean, samples.mean(0), atol=1e-12)


def test_sgmcmc_rejects_bad_settings():
    with pytest.raises(ValueError, match="shrinkage"):
        SGMCMC(shrinkage=-0.1)
    with pytest.raises(ValueError, match="momentum"):
        SGMCMC(momentum=1.0)
    with pytest.raises(ValueError, match="epochs"):
        SGMCMC(epochs=0)


# --- V: NGVI ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("debias", [True, False])
def test_ngvi_on_a_gaussian_likelihood_gives_the_exact_tilted_precision(debias):
    """Per-example Fisher h whatever θ: s_T = h with the bias correction, (1 − β^T) h without (Alg. 5 with s_0 = 0),
    and with α = 0 the tilted precision n s + Λ_{−k} is then the exact one, n h + Λ_{−k}."""
    data = _quadratic(n=32)
    n = data.num_examples
    cav_prec = torch.tensor([1.0, 2.0, 3.0])
    cavity = FAMILY.from_moments(torch.tensor([0.2, 0.1, -0.3]), cav_prec)
    solver = LocalAdam(lr=0.05, epochs=5, batch_size=8)
    method = NGVI(alpha=0.0, beta=0.9, epochs=7, samples=2, batch_size=None, debias=debias, solver=solver,
                  fisher=_constant_fisher)
    s = method.average_fisher(data, torch.zeros(3), cavity, torch.Generator().manual_seed(1))
    expected_s = data.h if debias else (1 - 0.9 ** 7) * data.h
    assert torch.allclose(s, expected_s, atol=1e-13)
    tilted = method(FAMILY, data, cavity, torch.Generator().manual_seed(2))
    mean, precision = FAMILY.to_moments(tilted)
    assert torch.allclose(precision, n * expected_s + cav_prec, atol=1e-11)
    # the mean is the tilted mean of the objective (NGVI does not move it): the same as method I's
    identity = ScaledIdentity(alpha=0.0, solver=solver)(FAMILY, data, cavity, torch.Generator().manual_seed(2))
    assert torch.allclose(mean, FAMILY.to_moments(identity)[0], atol=1e-13)
    # α > 0 adds α n to the precision
    floor = NGVI(alpha=0.5, beta=0.9, epochs=7, samples=2, batch_size=None, debias=debias, solver=solver,
                 fisher=_constant_fisher)(FAMILY, data, cavity, torch.Generator().manual_seed(2))
    assert torch.allclose(FAMILY.to_moments(floor)[1], n * expected_s + cav_prec + 0.5 * n, atol=1e-11)


def test_ngvi_draws_parameters_from_the_current_tilted_approximation():
    """The Fisher of update t is evaluated at θ ∼ N(mean, Σ_{t−1}), Σ_{t−1} = (n ŝ_{t−1} + Λ_{−k} + α n)⁻¹."""
    data = _quadratic(n=16)
    n = data.num_examples
    cav_prec = torch.tensor([4.0, 0.5, 1.0])
    cavity = FAMILY.from_moments(torch.zeros(3), cav_prec)
    draws = []

    def spy(data_, theta, idx, generator):
        draws.append(theta)
        return _constant_fisher(data_, theta, idx, generator)

    mean = torch.tensor([1.0, -1.0, 2.0])
    method = NGVI(alpha=0.25, beta=0.5, epochs=3, samples=4000, batch_size=None, fisher=spy)
    method.average_fisher(data, mean, cavity, torch.Generator().manual_seed(4))
    assert len(draws) == 3 * 4000
    for t in range(3):
        batch = torch.stack(draws[t * 4000:(t + 1) * 4000])
        s_prev = torch.zeros(3) if t == 0 else data.h                          # bias-corrected: s_t = h from t = 1
        variance = 1.0 / (n * s_prev + cav_prec + 0.25 * n)
        assert torch.allclose(batch.mean(0), mean, atol=4 * variance.sqrt().max() / math.sqrt(4000))
        assert torch.allclose(batch.var(0), variance, rtol=0.1)


def _logistic(n=40, d=3, seed=11):
    from torch import nn

    from bayesadmm.models import FlatModel
    from bayesadmm.problems.neural import ClassificationData

    model = FlatModel(lambda: nn.Linear(d, 2))
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    y = (X[:, 0] + 0.5 * torch.randn(n, generator=g) > 0).long()
    return model, ClassificationData(model, X, y)


def _expected_fisher(model, data, theta):
    """(1/n) Σ_i Σ_y p(y|x_i,θ) (∇_θ log p(y|x_i,θ))², by autograd one example and label at a time."""
    total = torch.zeros_like(theta)
    for i in range(data.num_examples):
        t = theta.clone().requires_grad_(True)
        logp = torch.log_softmax(model.forward(t, data.X[i:i + 1])[0], -1)
        for y in range(logp.shape[0]):
            (grad,) = torch.autograd.grad(logp[y], t, retain_graph=True)
            total += logp[y].exp().detach() * grad.square()
    return total / data.num_examples


def test_ngvi_on_logistic_regression_averages_the_sampled_label_fisher():
    model, data = _logistic()
    family = DiagonalGaussian(model.dim)
    n = data.num_examples
    mean = torch.tensor([0.8, -0.3, 0.2, 0.1, -0.5, 0.4, 0.0, 0.3])[:model.dim]
    # a tight cavity: the draws stay at the mean, so s estimates the average Fisher there
    tight = family.from_moments(torch.zeros(model.dim), torch.full((model.dim,), 1e8))
    method = NGVI(alpha=0.0, beta=0.98, epochs=40, samples=1, batch_size=None, fisher_samples=3)
    s = method.average_fisher(data, mean, tight, torch.Generator().manual_seed(0))
    expected = _expected_fisher(model, data, mean)
    assert (s - expected).norm() < 0.05 * expected.norm()
    # ... and not n times it (the (1/|D_k|) Fisher of Alg. 5)
    assert (s - n * expected).norm() > 0.5 * n * expected.norm()
    # the tilted precision is Λ_{−k} + n s (+ α n) with s from the same draws, at a moderate cavity
    cav_prec = torch.full((model.dim,), 2.0)
    cavity = family.from_moments(torch.full((model.dim,), 0.1), cav_prec)
    solver = LocalAdam(lr=0.05, epochs=20, batch_size=10)
    method = NGVI(alpha=0.01, beta=0.9, epochs=3, samples=2, batch_size=10, solver=solver)
    tilted = method(family, data, cavity, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    theta = tilted_mean(solver, data, cavity, g)
    s = method.average_fisher(data, theta, cavity, g)
    assert torch.allclose(family.to_moments(tilted)[0], theta, atol=1e-12)
    assert torch.allclose(family.to_moments(tilted)[1], cav_prec + n * s + 0.01 * n, atol=1e-12)


def test_ngvi_rejects_bad_settings_and_an_undefined_first_draw():
    with pytest.raises(ValueError, match="beta"):
        NGVI(beta=1.0)
    with pytest.raises(ValueError, match="samples"):
        NGVI(samples=0)
    from bayesadmm.solvers.von import SubproblemError

    data = _quadratic(n=8)
    uniform = (torch.zeros(3), torch.zeros(3))
    with pytest.raises(SubproblemError, match="alpha > 0"):
        NGVI(alpha=0.0, fisher=_constant_fisher).average_fisher(data, torch.zeros(3), uniform,
                                                               torch.Generator().manual_seed(0))
