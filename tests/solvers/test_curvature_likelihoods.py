"""Curvature of any likelihood (issue #38): the diagonal GGN and the sampled-target Fisher read the likelihood's output
Hessian and its target draws, so a regression or count model gets its own curvature, not the softmax's (which gave
exactly 0 for a one-output head). Checked against closed forms written out here in numpy (float64), and the methods
that consume the curvature against answers known exactly for linear-Gaussian models."""

import functools

import numpy as np
import pytest
import torch
from torch import nn

from bayesadmm.algorithms import fedlap_cov
from bayesadmm.clients import SupervisedData
from bayesadmm.engine.simulate import run_rounds
from bayesadmm.likelihoods import GaussianRegression, NegLogLikelihood, Poisson
from bayesadmm.models import FlatModel
from bayesadmm.solvers import curvature
from bayesadmm.solvers.curvature import GGN, MonteCarloFisher

SIGMA = 0.5


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny problems: torch's thread pool only adds overhead (and noise when the machine is shared)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _linear_head(d: int, outputs: int = 1) -> nn.Module:
    return nn.Sequential(nn.Linear(d, outputs))          # a linear chain: the fast path


class _Wrapped(nn.Module):                                 # the same function, not a Sequential: per-example path
    def __init__(self, d: int, outputs: int = 1):
        super().__init__()
        self.net = nn.Linear(d, outputs)

    def forward(self, x):
        return self.net(x)


def _model(d: int, fast: bool, outputs: int = 1) -> FlatModel:
    return FlatModel((lambda: _linear_head(d, outputs)) if fast else (lambda: _Wrapped(d, outputs)))


def _inputs(n=25, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) + torch.tensor([0.5, -1.0, 0.3], dtype=torch.float64)


def _theta(model: FlatModel, seed=1) -> torch.Tensor:
    return 0.3 * model.initial_params(torch.Generator().manual_seed(seed)).double()


def _with_bias(X: np.ndarray) -> np.ndarray:
    """[x, 1]: the features of the flat θ = (weight row(s), bias)."""
    return np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)


# --- the exact GGN of each likelihood, on both paths ------------------------------------------------------------------


@pytest.mark.parametrize("fast", [True, False], ids=["linear-chain", "per-example"])
def test_ggn_of_a_linear_gaussian_model_is_x_squared_over_sigma_squared(fast):
    """Σ_i x_ij² / σ² (and n / σ² for the bias): the Hessian of Σ_i (y_i − wᵀx_i − b)² / 2σ², whatever θ and y. The
    softmax's curvature gave 0 here."""
    X = _inputs()
    model = _model(3, fast)
    data = SupervisedData(model, X, torch.zeros(25, dtype=torch.float64), GaussianRegression(SIGMA))
    assert (curvature.linear_chain(data) is not None) == fast
    expected = (_with_bias(X.numpy()) ** 2).sum(0) / SIGMA**2
    np.testing.assert_allclose(GGN()(data, _theta(model)).numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("fast", [True, False], ids=["linear-chain", "per-example"])
def test_ggn_of_a_poisson_glm_is_its_hessian_diagonal(fast):
    """Σ_i exp(wᵀx_i + b) x_ij²: the Hessian diagonal of Σ_i exp(f_i) − y_i f_i (a GLM with its canonical link)."""
    X = _inputs(seed=2)
    model = _model(3, fast)
    theta = _theta(model)
    data = SupervisedData(model, X, torch.zeros(25, dtype=torch.float64), Poisson())
    features = _with_bias(X.numpy())
    rates = np.exp(features @ theta.numpy())
    np.testing.assert_allclose(GGN()(data, theta).numpy(), rates @ features**2, rtol=1e-12)


def _correlated_nll(outputs, targets):
    """½ (y − f)ᵀ P (y − f) per example, P = PRECISION: a two-output Gaussian with correlated noise."""
    r = targets - outputs
    return 0.5 * torch.einsum("ni,ij,nj->n", r, PRECISION.to(r.dtype), r)


def _correlated_hessian(outputs):
    return PRECISION.to(outputs.dtype).expand(outputs.shape[0], 2, 2).clone()


PRECISION = torch.tensor([[4.0, -1.5], [-1.5, 2.0]], dtype=torch.float64)


@pytest.mark.parametrize("fast", [True, False], ids=["linear-chain", "per-example"])
def test_ggn_of_a_user_likelihood_with_a_full_output_hessian(fast):
    """A NegLogLikelihood given only output_hessian = P (not diagonal, no closed-form factor): the GGN takes its
    symmetric square root. For f = W x + b, diag(Σ_i J_iᵀ P J_i) is P_aa x_ij² for W_aj and P_aa for b_a."""
    X = _inputs(seed=3)
    model = _model(3, fast, outputs=2)
    likelihood = NegLogLikelihood(_correlated_nll, output_hessian=_correlated_hessian)
    data = SupervisedData(model, X, torch.zeros(25, 2, dtype=torch.float64), likelihood)
    squares = (X.numpy() ** 2).sum(0)
    P = PRECISION.numpy()
    expected = np.concatenate([P[0, 0] * squares, P[1, 1] * squares, [25 * P[0, 0], 25 * P[1, 1]]])
    np.testing.assert_allclose(GGN()(data, _theta(model)).numpy(), expected, rtol=1e-12)


def test_mc_fisher_is_an_unbiased_estimate_of_the_ggn_for_regression_and_counts():
    """R copies of the data = R independent target draws per example in one call; `samples` draws per example
    average the same squares."""
    R = 4000
    X = _inputs(n=10, seed=4)
    for likelihood in (GaussianRegression(SIGMA), Poisson()):
        model = _model(3, fast=True)
        theta = _theta(model)
        data = SupervisedData(model, X, torch.zeros(10, dtype=torch.float64), likelihood)
        copies = SupervisedData(model, X.repeat(R, 1), torch.zeros(10 * R, dtype=torch.float64), likelihood)
        exact = GGN()(data, theta)
        estimate = MonteCarloFisher()(copies, theta, torch.Generator().manual_seed(0)) / R
        torch.testing.assert_close(estimate, exact, rtol=0.05, atol=0)
        averaged = MonteCarloFisher(samples=R)(data, theta, torch.Generator().manual_seed(1))
        torch.testing.assert_close(averaged, exact, rtol=0.05, atol=0)


@pytest.mark.parametrize("likelihood", [GaussianRegression(SIGMA), Poisson()], ids=["gaussian", "poisson"])
def test_fast_curvature_of_a_regression_mlp_equals_per_example_gradients(likelihood):
    """The linear-chain path and the per-example path agree for a one-output MLP, for "ggn" and for "mc-fisher"
    with the same generator, every coordinate to relative 1e-10."""
    g = torch.Generator().manual_seed(5)
    model = FlatModel(lambda: nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 4), nn.Sigmoid(), nn.Linear(4, 1)))
    X = _inputs(n=30, seed=6)
    data = SupervisedData(model, X, torch.zeros(30, dtype=torch.float64), likelihood)
    theta = model.initial_params(g).double()
    assert curvature.linear_chain(data) is not None
    big = 2**40
    for kind in (GGN(max_elements=big), MonteCarloFisher(max_elements=big)):
        fast = kind(data, theta, torch.Generator().manual_seed(7))
        slow = curvature.per_example_diagonal_ggn(data, theta, kind, torch.Generator().manual_seed(7), big)
        assert slow.abs().min() > 0                                                    # nothing silently zero
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=0)


def _gaussian_nll_half(outputs, targets):
    return 2.0 * (targets - outputs) ** 2


def _indefinite(outputs):
    return torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=outputs.dtype).expand(outputs.shape[0], 2, 2).clone()


def _wrong_shape(outputs):
    return torch.ones(outputs.shape[0], dtype=outputs.dtype)


def test_curvature_refuses_a_likelihood_without_what_it_reads():
    X = _inputs(n=8, seed=8)
    model = _model(3, fast=True)
    bare = SupervisedData(model, X, torch.zeros(8, dtype=torch.float64), NegLogLikelihood(_gaussian_nll_half))
    with pytest.raises(TypeError, match=r"the ggn curvature needs the likelihood's output_hessian.*NegLogLikelihood"):
        GGN()(bare, _theta(model))
    with pytest.raises(TypeError, match=r"the mc-fisher curvature needs the likelihood's sample_targets"):
        MonteCarloFisher()(bare, _theta(model), torch.Generator().manual_seed(0))
    two = _model(3, fast=True, outputs=2)
    for hessian, message in ((_indefinite, "positive semi-definite"), (_wrong_shape, r"\(N, C, C\) = \(8, 2, 2\)")):
        likelihood = NegLogLikelihood(_correlated_nll, output_hessian=hessian)
        data = SupervisedData(two, X, torch.zeros(8, 2, dtype=torch.float64), likelihood)
        with pytest.raises(ValueError, match=message):
            GGN()(data, _theta(two))
    with pytest.raises(ValueError, match="samples"):
        MonteCarloFisher(samples=0)


# --- FedLap-Cov: the server precision of a linear-Gaussian model in closed form ---------------------------------------


def _gaussian_clients(K=3, n=20, d=3, seed=0, fast=True):
    """K clients of y = xᵀw + b + σε with shifted inputs (heterogeneous), as SupervisedData of one linear model."""
    g = torch.Generator().manual_seed(seed)
    w, b = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), 0.7
    model = _model(d, fast)
    clients = []
    for _ in range(K):
        X = torch.randn(n, d, generator=g, dtype=torch.float64) + 1.5 * torch.randn(d, generator=g, dtype=torch.float64)
        y = X @ w + b + SIGMA * torch.randn(n, generator=g, dtype=torch.float64)
        clients.append(SupervisedData(model, X, y, GaussianRegression(SIGMA)))
    return model, clients


def _exact_posterior(clients, delta):
    """N(μ, Σ) of θ = (w, b) under the prior N(0, I/δ) and all clients' data, in numpy: Σ⁻¹ = δI + Σ_k X̃ᵀX̃/σ²,
    μ = Σ Σ_k X̃ᵀy/σ²."""
    features = [_with_bias(c.X.numpy()) for c in clients]
    precision = delta * np.eye(features[0].shape[1]) + sum(F.T @ F for F in features) / SIGMA**2
    mean = np.linalg.solve(precision, sum(F.T @ c.y.numpy() for F, c in zip(features, clients, strict=True)) / SIGMA**2)
    return mean, precision


@pytest.mark.parametrize("fast", [True, False], ids=["linear-chain", "per-example"])
def test_fedlap_cov_server_precision_is_delta_plus_the_clients_curvatures_in_closed_form(fast):
    """S_g = δ + Σ_k V_k with V_k = (1 − (1 − ρ)^R) H_k after R rounds from V_k = 0, and H_k = diag(X̃_kᵀX̃_k)/σ²
    (constant in θ for a linear-Gaussian model): in summed-loss units, as FedLap-Cov's prior δ."""
    K, delta, rounds = 3, 2.0, 4
    model, clients = _gaussian_clients(fast=fast)
    curvatures = sum((_with_bias(c.X.numpy()) ** 2).sum(0) for c in clients) / SIGMA**2
    theta0 = _theta(model)
    for rho in (1.0 / K, 1.0):
        alg = fedlap_cov.make(delta=delta, lr=0.05, epochs=2, batch_size=10, num_clients=K, rho=rho)
        server, _ = run_rounds(alg, clients, theta0, rounds=rounds, seed=0)
        expected = delta + (1 - (1 - rho) ** rounds) * curvatures
        np.testing.assert_allclose(alg.posterior(server).precision.numpy(), expected, rtol=1e-12)


# --- FedEP: Laplace and NGVI inference on a linear-Gaussian model -----------------------------------------------------


def test_fedep_with_laplace_reaches_the_exact_posterior_mean_of_a_linear_gaussian_model():
    """Every EP fixed point has the MAP as its mean whatever the sites' (diagonal, sampled) precisions: Σ_k ∇ℓ_k(μ) +
    δμ = 0 from the tilted means; for a linear-Gaussian model that is the exact posterior mean (numpy). The precision
    is δ + Σ_k (H_k + α n_k) with H_k the Gaussian likelihood's sampled-target Fisher, whose mean is
    diag(X̃_kᵀX̃_k)/σ²: here within the Monte-Carlo error of 500 draws per example (the softmax's gave 0)."""
    from bayesadmm.algorithms import fedep
    from bayesadmm.families import DiagonalGaussian
    from bayesadmm.solvers.adam import LocalAdam
    from bayesadmm.solvers.ep_inference import Laplace

    K, n, delta, alpha = 3, 20, 2.0, 1e-3
    model, clients = _gaussian_clients(K=K, n=n)
    mean, precision = _exact_posterior(clients, delta)
    laplace = Laplace(alpha=alpha, fisher_samples=500, solver=LocalAdam(lr=0.05, epochs=200, batch_size=n))
    alg = fedep.make(DiagonalGaussian(model.dim), laplace, num_clients=K, damping=1.0, prior_precision=delta,
                     client_sizes=[n] * K, init_site_precision=alpha)
    server, _ = run_rounds(alg, clients, _theta(model), rounds=10, seed=0)
    posterior = alg.posterior(server)
    assert np.abs(posterior.mean.numpy() - mean).max() < 1e-4
    expected = delta + sum((_with_bias(c.X.numpy()) ** 2).sum(0) for c in clients) / SIGMA**2 + alpha * K * n
    np.testing.assert_allclose(posterior.precision.numpy(), expected, rtol=0.05)
    # (the exact posterior's precision diagonal is the same without the floor α n_k)
    np.testing.assert_allclose(np.diag(precision), expected - alpha * K * n, rtol=1e-12)


def test_ngvi_averages_the_gaussian_likelihoods_fisher():
    """For a linear-Gaussian model the per-example Fisher is x̃_i²/σ² whatever θ, so NGVI's running average s (with
    the bias correction) is its mean over the examples, (1/n) Σ_i x̃_i²/σ², within the Monte-Carlo error."""
    from bayesadmm.families import DiagonalGaussian
    from bayesadmm.solvers.ep_inference import NGVI

    model, clients = _gaussian_clients(K=1, n=20)
    data = clients[0]
    family = DiagonalGaussian(model.dim)
    cavity = family.from_moments(torch.zeros(model.dim, dtype=torch.float64),
                                 torch.full((model.dim,), 10.0, dtype=torch.float64))
    method = NGVI(alpha=0.0, beta=0.9, epochs=60, samples=2, batch_size=None, fisher_samples=50)
    s = method.average_fisher(data, _theta(model), cavity, torch.Generator().manual_seed(0))
    expected = (_with_bias(data.X.numpy()) ** 2).mean(0) / SIGMA**2
    np.testing.assert_allclose(s.numpy(), expected, rtol=0.05)


def _squared_error(outputs, targets):
    return (targets - outputs) ** 2


def test_ep_methods_refuse_laplace_and_ngvi_for_a_likelihood_that_cannot_draw_targets():
    """Before any training: the factory names the method, the inference, the likelihood and what to supply; the
    inference that reads only the loss is built."""
    from bayesadmm.algorithms import make as make_method

    bare = NegLogLikelihood(_squared_error)
    sizes = {0: 10, 1: 10}
    for make in (functools.partial(make_method, "fedep"), functools.partial(make_method, "fedsep")):
        for inference in ("laplace", "ngvi"):
            with pytest.raises(TypeError, match=rf"with inference='{inference}' needs the likelihood's "
                                                r"sample_targets.*NegLogLikelihood.*sample_targets="):
                make(dim=4, num_clients=2, client_sizes=sizes, inference=inference, likelihood=bare)
        make(dim=4, num_clients=2, client_sizes=sizes, inference="identity", likelihood=bare)
        make(dim=4, num_clients=2, client_sizes=sizes, inference="laplace", likelihood=Poisson())
    with pytest.raises(TypeError, match="fedpa with inference='laplace'"):
        make_method("fedpa", dim=4, inference="laplace", likelihood=bare)
    make_method("fedpa", dim=4, inference="mcmc", likelihood=bare)
