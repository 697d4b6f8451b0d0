"""Likelihoods: training losses and metrics against closed forms computed by hand, and their input errors."""

import math
import pickle
from statistics import NormalDist

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bayesadmm.evaluation.metrics import classification_metrics, evaluate
from bayesadmm.families import DiagonalGaussian, Posterior
from bayesadmm.likelihoods import (
    COVERAGE_LEVELS,
    Classification,
    CurvatureLikelihood,
    GaussianRegression,
    Likelihood,
    NegLogLikelihood,
    Poisson,
    require,
)
from bayesadmm.models import FlatModel


def _gaussian_nll(outputs, targets, noise):
    """Per-example −log N(y; f, noise²), summed over any output dimensions: a module-level fn, so it pickles."""
    nll = 0.5 * ((targets - outputs) / noise) ** 2 + 0.5 * math.log(2 * math.pi * noise**2)
    return nll.reshape(nll.shape[0], -1).sum(dim=1)


def _gaussian_nll_half(outputs, targets):
    return _gaussian_nll(outputs, targets, 0.5)


def _regressor():
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def _normal(mean, sd):
    return torch.distributions.Normal(mean, sd)


# --- classification -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_classification_loss_is_cross_entropy_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(17, 5, generator=g, dtype=dtype), torch.randint(0, 5, (17,), generator=g)
    assert torch.equal(Classification().mean_nll(logits, y), F.cross_entropy(logits, y))


def test_classification_nll_grad_is_the_weighted_losss_gradient():
    """nll_grad(F, Y, W) = ∂/∂F Σ w_i (−log softmax(f_i)_{y_i}) in float64, for labels and for class probabilities,
    over any leading dimensions, with one weight or one per example; and mean_nll's backward's bits for W = 1/N."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 7, 5, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 5, (3, 7), generator=g)
    probabilities = torch.softmax(torch.randn(3, 7, 5, generator=g, dtype=torch.float64), -1)
    weights = torch.rand(3, 7, generator=g, dtype=torch.float64)
    for targets in (labels, probabilities):
        for w in (weights, 0.25):
            f = logits.clone().requires_grad_()
            per_example = F.cross_entropy(f.reshape(21, 5), targets.reshape(21, -1).squeeze(-1), reduction="none")
            (expected,) = torch.autograd.grad((per_example.reshape(3, 7) * w).sum(), f)
            got = Classification().nll_grad(logits, targets, w)
            torch.testing.assert_close(got, expected, rtol=1e-14, atol=1e-15)
    for dtype in (torch.float32, torch.float64):
        f = logits[0].to(dtype).requires_grad_()
        (expected,) = torch.autograd.grad(Classification().mean_nll(f, labels[0]), f)
        assert torch.equal(Classification().nll_grad(f.detach(), labels[0], 1 / 7), expected)


def test_classification_predictive_averages_probabilities():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 40, 6, generator=g)
    # one draw (the posterior mean): the same bits as softmax alone
    assert torch.equal(Classification().predictive(logits), torch.softmax(logits[0], dim=-1))
    draws = torch.randn(4, 40, 6, generator=g, dtype=torch.float64)
    expected = sum(torch.softmax(d, dim=-1) for d in draws) / 4
    torch.testing.assert_close(Classification().predictive(draws), expected, rtol=1e-15, atol=1e-15)


def test_classification_metrics_use_its_bins():
    g = torch.Generator().manual_seed(2)
    probs, y = torch.softmax(torch.randn(30, 3, generator=g), -1), torch.randint(0, 3, (30,), generator=g)
    assert Classification(bins=4).metrics(probs, y) == classification_metrics(probs, y, bins=4)
    assert Classification().metrics(probs, y) == classification_metrics(probs, y, bins=15)
    with pytest.raises(ValueError, match="bins"):
        Classification(bins=0)


def test_likelihoods_satisfy_the_protocol_and_pickle():
    for likelihood in (Classification(), GaussianRegression(0.5), Poisson(), NegLogLikelihood(_gaussian_nll_half)):
        assert isinstance(likelihood, Likelihood)
        assert pickle.loads(pickle.dumps(likelihood)) == likelihood
    assert not isinstance(object(), Likelihood)
    for likelihood in (Classification(), GaussianRegression(0.5), Poisson()):
        assert isinstance(likelihood, CurvatureLikelihood)
    assert not isinstance(NegLogLikelihood(_gaussian_nll_half), CurvatureLikelihood)


# --- Gaussian regression ------------------------------------------------------------------------------------------


def test_gaussian_loss_is_the_normal_nll_with_its_constant():
    g = torch.Generator().manual_seed(3)
    f, y = torch.randn(11, generator=g, dtype=torch.float64), torch.randn(11, generator=g, dtype=torch.float64)
    expected = -_normal(f, 0.7).log_prob(y).mean()
    torch.testing.assert_close(GaussianRegression(0.7).mean_nll(f, y), expected, rtol=1e-14, atol=0)
    # a Linear(·, 1) head for scalar targets: the trailing singleton is squeezed
    torch.testing.assert_close(GaussianRegression(0.7).mean_nll(f[:, None], y), expected, rtol=1e-14, atol=0)
    # D outputs: summed over the dimensions, averaged over the examples
    F2, Y2 = torch.randn(11, 2, generator=g, dtype=torch.float64), torch.randn(11, 2, generator=g, dtype=torch.float64)
    expected2 = -_normal(F2, 0.7).log_prob(Y2).sum(1).mean()
    torch.testing.assert_close(GaussianRegression(0.7).mean_nll(F2, Y2), expected2, rtol=1e-14, atol=0)


def test_gaussian_loss_is_differentiable_through_a_flat_model():
    model = FlatModel(_regressor)
    g = torch.Generator().manual_seed(4)
    theta = model.initial_params(g).double().requires_grad_()
    X, y = torch.randn(9, 3, generator=g, dtype=torch.float64), torch.randn(9, generator=g, dtype=torch.float64)
    GaussianRegression(0.3).mean_nll(model.forward(theta, X), y).backward()
    f = model.forward(theta.detach(), X).squeeze(-1)
    # d/dθ (1/N) Σ (f − y)² / (2σ²) = (1/N) Σ (f − y)/σ² ∂f/∂θ, by the chain rule through autograd's jacobian
    jac = torch.autograd.functional.jacobian(lambda t: model.forward(t, X).squeeze(-1), theta.detach())
    torch.testing.assert_close(theta.grad, ((f - y) / 0.09) @ jac / 9, rtol=1e-12, atol=1e-14)


def test_gaussian_predictive_keeps_the_draws():
    draws = torch.arange(24.0).reshape(3, 4, 2)
    assert torch.equal(GaussianRegression(1.0).predictive(draws), draws.transpose(0, 1))


def test_gaussian_metrics_of_one_draw_are_the_gaussian_ones():
    g = torch.Generator().manual_seed(5)
    f, y = torch.randn(50, generator=g, dtype=torch.float64), torch.randn(50, generator=g, dtype=torch.float64)
    likelihood = GaussianRegression(0.8)
    m = likelihood.metrics(likelihood.predictive(f[None]), y)
    assert m["nll"] == pytest.approx(-_normal(f, 0.8).log_prob(y).mean().item(), rel=1e-13)
    assert m["nll"] == pytest.approx(likelihood.mean_nll(f, y).item(), rel=1e-13)
    assert m["rmse"] == pytest.approx(math.sqrt(sum((a - b) ** 2 for a, b in zip(f.tolist(), y.tolist())) / 50))


def test_gaussian_mixture_nll_and_rmse_by_hand():
    g = torch.Generator().manual_seed(6)
    draws = torch.randn(3, 20, generator=g, dtype=torch.float64)   # (S, N)
    y = torch.randn(20, generator=g, dtype=torch.float64)
    likelihood = GaussianRegression(0.6)
    m = likelihood.metrics(likelihood.predictive(draws), y)
    density = [sum(NormalDist(draws[s, i].item(), 0.6).pdf(y[i].item()) for s in range(3)) / 3 for i in range(20)]
    assert m["nll"] == pytest.approx(-sum(math.log(p) for p in density) / 20, rel=1e-12)
    means = draws.mean(0).tolist()
    assert m["rmse"] == pytest.approx(math.sqrt(sum((a - b) ** 2 for a, b in zip(means, y.tolist())) / 20))


def test_gaussian_mixture_nll_stays_finite_far_from_every_draw():
    draws, y = torch.tensor([[0.0], [1.0]], dtype=torch.float64), torch.tensor([100.0], dtype=torch.float64)
    m = GaussianRegression(0.01).metrics(GaussianRegression(0.01).predictive(draws), y)
    # the nearer draw dominates: −log(½ N(100; 1, 0.01²)) up to the negligible term of the farther one
    assert m["nll"] == pytest.approx(99.0**2 / (2 * 0.01**2) + 0.5 * math.log(2 * math.pi * 0.01**2) + math.log(2))


def test_coverage_of_hand_placed_residuals():
    # one draw, noise 1: standardised residuals 0, 1, 2, 3 against the intervals ±z_α, z_α = Φ⁻¹((1 + α)/2)
    y = torch.tensor([0.0, 1.0, -2.0, 3.0], dtype=torch.float64)
    m = GaussianRegression(1.0).metrics(torch.zeros(4, 1, dtype=torch.float64), y)
    coverage = {a: sum(r <= NormalDist().inv_cdf((1 + a) / 2) for r in (0, 1, 2, 3)) / 4 for a in COVERAGE_LEVELS}
    assert coverage[0.5] == 0.25 and coverage[0.9] == 0.5   # z_0.5 = 0.674, z_0.7 = 1.036, z_0.95 = 1.960
    assert m["coverage90"] == 0.5
    assert m["calibration_error"] == pytest.approx(sum(abs(c - a) for a, c in coverage.items()) / len(coverage))
    assert m["calibration_error"] == pytest.approx(2.35 / 10)


def test_coverage_of_calibrated_and_overdispersed_targets():
    g = torch.Generator().manual_seed(7)
    n, s, noise = 40_000, 5, 0.5
    draws = torch.randn(s, n, generator=g, dtype=torch.float64) * torch.rand(n, generator=g, dtype=torch.float64)
    sd = (noise**2 + draws.var(0, correction=0)).sqrt()
    z = torch.randn(n, generator=g, dtype=torch.float64)
    likelihood = GaussianRegression(noise)
    # targets drawn from the moment-matched predictive itself: every level is covered at its rate (binomial sd ≤ 0.0025)
    m = likelihood.metrics(likelihood.predictive(draws), draws.mean(0) + sd * z)
    assert m["coverage90"] == pytest.approx(0.9, abs=0.01)
    assert m["calibration_error"] < 0.01
    # targets spread twice as wide: coverage_α = P(|Z| ≤ z_α / 2) = 2Φ(z_α / 2) − 1
    m = likelihood.metrics(likelihood.predictive(draws), draws.mean(0) + 2 * sd * z)
    expected = {a: 2 * NormalDist().cdf(NormalDist().inv_cdf((1 + a) / 2) / 2) - 1 for a in COVERAGE_LEVELS}
    assert m["coverage90"] == pytest.approx(expected[0.9], abs=0.01)
    error = sum(abs(c - a) for a, c in expected.items()) / len(expected)
    assert m["calibration_error"] == pytest.approx(error, abs=0.01)


def test_gaussian_with_several_outputs_and_a_singleton_head():
    g = torch.Generator().manual_seed(8)
    draws, y = torch.randn(2, 6, 3, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    likelihood = GaussianRegression(1.3)
    m = likelihood.metrics(likelihood.predictive(draws), y)
    log_p = _normal(draws, 1.3).log_prob(y).sum(-1)   # (S, N): independent output dimensions
    assert m["nll"] == pytest.approx(-(log_p.exp().mean(0).log()).mean().item(), rel=1e-12)
    # (S, N, 1) draws for (N,) targets are those of (S, N) draws
    single = likelihood.metrics(likelihood.predictive(draws[..., :1]), y[:, 0])
    assert single == likelihood.metrics(likelihood.predictive(draws[..., 0]), y[:, 0])


@pytest.mark.parametrize("noise", [0, -1.0, float("nan"), float("inf"), "1", True, None])
def test_gaussian_noise_must_be_finite_and_positive(noise):
    with pytest.raises(ValueError, match="noise must be a finite positive float"):
        GaussianRegression(noise)


def test_gaussian_shape_errors():
    likelihood = GaussianRegression(1.0)
    with pytest.raises(ValueError, match="shape"):
        likelihood.mean_nll(torch.zeros(5, 2), torch.zeros(5))
    with pytest.raises(ValueError, match="shape"):
        likelihood.mean_nll(torch.zeros(4), torch.zeros(5))
    with pytest.raises(ValueError, match="shape"):
        likelihood.metrics(torch.zeros(5, 3, 2), torch.zeros(5, 3))
    with pytest.raises(ValueError, match="S ≥ 1"):
        likelihood.predictive(torch.zeros(5))


# --- user-written likelihood --------------------------------------------------------------------------------------


def test_custom_gaussian_nll_equals_gaussian_regression():
    g = torch.Generator().manual_seed(9)
    draws, y = torch.randn(4, 25, generator=g, dtype=torch.float64), torch.randn(25, generator=g, dtype=torch.float64)
    custom, gaussian = NegLogLikelihood(_gaussian_nll_half), GaussianRegression(0.5)
    torch.testing.assert_close(custom.mean_nll(draws[0], y), gaussian.mean_nll(draws[0], y), rtol=1e-14, atol=0)
    nll = custom.metrics(custom.predictive(draws), y)
    assert set(nll) == {"nll"}
    assert nll["nll"] == pytest.approx(gaussian.metrics(gaussian.predictive(draws), y)["nll"], rel=1e-13)


def test_custom_nll_must_be_per_example():
    custom = NegLogLikelihood(lambda f, y: ((f - y) ** 2).mean())
    with pytest.raises(ValueError, match=r"shape \(N,\) = \(5,\), got \(\)"):
        custom.mean_nll(torch.zeros(5), torch.zeros(5))
    custom = NegLogLikelihood(lambda f, y: (f - y) ** 2)
    with pytest.raises(ValueError, match=r"got \(5, 2\)"):
        custom.metrics(torch.zeros(5, 3, 2), torch.zeros(5, 2))
    with pytest.raises(TypeError, match="callable"):
        NegLogLikelihood("gaussian")


# --- evaluate with other likelihoods ------------------------------------------------------------------------------


def _regression_problem():
    g = torch.Generator().manual_seed(10)
    model = FlatModel(_regressor)
    mean = model.initial_params(g).double()
    X, y = torch.randn(30, 3, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    family = DiagonalGaussian(model.dim)
    posterior = Posterior(family, family.from_moments(mean, torch.full_like(mean, 25.0)))
    return model, posterior, X, y


def test_evaluate_regression_against_hand_computed_metrics():
    model, posterior, X, y = _regression_problem()
    likelihood = GaussianRegression(0.4)
    result = evaluate(model, posterior, X, y, samples=6, generator=torch.Generator().manual_seed(0), batch_size=7,
                      likelihood=likelihood)
    keys = {"rmse", "nll", "coverage90", "calibration_error"}
    assert set(result) == keys | {f"ens_{k}" for k in keys}

    f = model.forward(posterior.mean, X).squeeze(-1)
    assert result["rmse"] == pytest.approx((f - y).square().mean().sqrt().item(), rel=1e-12)
    assert result["nll"] == pytest.approx(-_normal(f, 0.4).log_prob(y).mean().item(), rel=1e-12)
    inside = ((y - f).abs() <= NormalDist().inv_cdf(0.95) * 0.4).double().mean().item()
    assert result["coverage90"] == inside

    thetas = posterior.sample(6, torch.Generator().manual_seed(0))
    draws = torch.stack([model.forward(t, X).squeeze(-1) for t in thetas])   # (S, N)
    mixture = _normal(draws, 0.4).log_prob(y).exp().mean(0)
    assert result["ens_nll"] == pytest.approx(-mixture.log().mean().item(), rel=1e-12)
    assert result["ens_rmse"] == pytest.approx((draws.mean(0) - y).square().mean().sqrt().item(), rel=1e-12)


def test_evaluate_custom_likelihood_and_extra_metrics():
    model, posterior, X, y = _regression_problem()
    kw = {"samples": 4, "generator": torch.Generator().manual_seed(1), "batch_size": 8}
    custom = evaluate(model, posterior, X, y, likelihood=NegLogLikelihood(_gaussian_nll_half), **kw)
    kw["generator"] = torch.Generator().manual_seed(1)
    gaussian = evaluate(model, posterior, X, y, likelihood=GaussianRegression(0.5),
                        extra={"mae": lambda out, t: (out.squeeze(-1).mean(0) - t).abs().mean().item()}, **kw)
    assert set(custom) == {"nll", "ens_nll"}
    assert custom["nll"] == pytest.approx(gaussian["nll"], rel=1e-13)
    assert custom["ens_nll"] == pytest.approx(gaussian["ens_nll"], rel=1e-13)
    f = model.forward(posterior.mean, X).squeeze(-1)
    assert gaussian["mae"] == pytest.approx((f - y).abs().mean().item(), rel=1e-12)
    assert "ens_mae" in gaussian


# --- Poisson ------------------------------------------------------------------------------------------------------


def _poisson_log_pmf(y, rate):
    """log Poisson(y; rate) in numpy float64, written out."""
    return y * np.log(rate) - rate - np.vectorize(math.lgamma)(y + 1.0)


def test_poisson_loss_is_the_poisson_nll_with_its_constant():
    g = torch.Generator().manual_seed(11)
    f = torch.randn(13, generator=g, dtype=torch.float64)
    y = torch.poisson(torch.full((13,), 3.0, dtype=torch.float64), generator=g)
    expected = -_poisson_log_pmf(y.numpy(), np.exp(f.numpy())).mean()
    assert Poisson().mean_nll(f, y).item() == pytest.approx(expected, rel=1e-13)
    # integer counts, a Linear(·, 1) head, and D outputs summed over the dimensions
    assert Poisson().mean_nll(f[:, None], y.long()).item() == pytest.approx(expected, rel=1e-13)
    F2 = torch.randn(13, 2, generator=g, dtype=torch.float64)
    Y2 = torch.poisson(torch.full((13, 2), 2.0, dtype=torch.float64), generator=g)
    expected2 = -_poisson_log_pmf(Y2.numpy(), np.exp(F2.numpy())).sum(1).mean()
    assert Poisson().mean_nll(F2, Y2).item() == pytest.approx(expected2, rel=1e-13)
    with pytest.raises(ValueError, match="shape"):
        Poisson().mean_nll(torch.zeros(5, 2), torch.zeros(5))


def test_poisson_metrics_of_a_mixture_by_hand():
    g = torch.Generator().manual_seed(12)
    draws = 0.5 * torch.randn(3, 20, generator=g, dtype=torch.float64) + 1.0     # log-rates (S, N)
    y = torch.poisson(torch.full((20,), 2.5, dtype=torch.float64), generator=g)
    y[0] = 0.0                                                                       # y log y = 0 at y = 0
    m = Poisson().metrics(Poisson().predictive(draws), y)
    rates, counts = np.exp(draws.numpy()), y.numpy()
    mixture = np.exp(_poisson_log_pmf(counts[None], rates)).mean(0)
    mean_rate = rates.mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ylogy = np.where(counts > 0, counts * np.log(counts / mean_rate), 0.0)
    assert m["nll"] == pytest.approx(-np.log(mixture).mean(), rel=1e-12)
    assert m["rmse"] == pytest.approx(np.sqrt(((mean_rate - counts) ** 2).mean()), rel=1e-12)
    assert m["deviance"] == pytest.approx((2 * (ylogy - (counts - mean_rate))).mean(), rel=1e-12)
    # the mixture stays finite far from every draw (the densities underflow one by one)
    far = Poisson().metrics(Poisson().predictive(draws), torch.full((20,), 400.0, dtype=torch.float64))
    assert math.isfinite(far["nll"]) and far["nll"] > 100


# --- curvature: what FedLap-Cov, FedLap-Func and FedEP's Laplace/NGVI consume ----------------------------------------


def _curvature_cases():
    """(likelihood, outputs (N, C), targets) with float64 outputs, for every likelihood with curvature."""
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(6, 4, generator=g, dtype=torch.float64)
    return [
        (Classification(), logits, torch.randint(0, 4, (6,), generator=g)),
        (GaussianRegression(0.7), torch.randn(6, 3, generator=g, dtype=torch.float64),
         torch.randn(6, 3, generator=g, dtype=torch.float64)),
        (GaussianRegression(0.7), torch.randn(6, 1, generator=g, dtype=torch.float64),
         torch.randn(6, generator=g, dtype=torch.float64)),                          # a Linear(·, 1) head
        (Poisson(), 0.5 * torch.randn(6, 2, generator=g, dtype=torch.float64),
         torch.poisson(torch.full((6, 2), 2.0, dtype=torch.float64), generator=g)),
    ]


@pytest.mark.parametrize("case", range(4))
def test_output_hessian_is_autograds_hessian_of_each_examples_nll(case):
    """Against torch.autograd.functional.hessian of the likelihood's own mean_nll of one example, at its own target
    and at a second one: the Hessian does not depend on y (canonical links)."""
    likelihood, outputs, targets = _curvature_cases()[case]
    hessian = likelihood.output_hessian(outputs)
    n, c = outputs.shape
    assert hessian.shape == (n, c, c) and hessian.dtype == torch.float64
    other = targets.flip(0)
    for i in range(n):
        for y in (targets[i:i + 1], other[i:i + 1]):
            expected = torch.autograd.functional.hessian(lambda f, y=y: likelihood.mean_nll(f[None], y), outputs[i])
            torch.testing.assert_close(hessian[i], expected, rtol=1e-12, atol=1e-14)


def test_output_hessians_in_closed_form():
    """Written out in numpy: softmax diag(p) − ppᵀ, Gaussian I/σ², Poisson diag(exp f)."""
    (cls, logits, _), (gauss, f, _), _, (poisson, log_rates, _) = _curvature_cases()
    p = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(1, keepdims=True)
    np.testing.assert_allclose(cls.output_hessian(logits).numpy(),
                               np.stack([np.diag(q) - np.outer(q, q) for q in p]), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(gauss.output_hessian(f).numpy(), np.broadcast_to(np.eye(3) / 0.49, (6, 3, 3)),
                               rtol=1e-15)
    np.testing.assert_allclose(poisson.output_hessian(log_rates).numpy(),
                               np.stack([np.diag(np.exp(row)) for row in log_rates.numpy()]), rtol=1e-14)


@pytest.mark.parametrize("case", range(4))
def test_output_hessian_factor_multiplies_out_to_the_output_hessian(case):
    """L_i L_iᵀ = Λ_i: the closed-form factor the GGN backpropagates is one of the Hessian."""
    likelihood, outputs, _ = _curvature_cases()[case]
    factor = likelihood.output_hessian_factor(outputs)
    torch.testing.assert_close(factor @ factor.mT, likelihood.output_hessian(outputs), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("case", range(4))
def test_sampled_targets_give_the_fisher_which_is_the_output_hessian(case):
    """E_{ŷ∼p(y|f)}[∇_f nll(f, ŷ) ∇_f nll(f, ŷ)ᵀ] = output_hessian(f) (Fisher = Hessian for these likelihoods): the
    Monte-Carlo Fisher of FedLap-Cov and FedEP is unbiased. The same generator gives the same targets."""
    likelihood, outputs, _ = _curvature_cases()[case]
    draws = 40000
    repeated = outputs.repeat(draws, 1)
    targets = likelihood.sample_targets(repeated, torch.Generator().manual_seed(0))
    assert torch.equal(likelihood.sample_targets(repeated, torch.Generator().manual_seed(0)), targets)
    f = repeated.clone().requires_grad_()
    (g,) = torch.autograd.grad(likelihood.mean_nll(f, targets) * f.shape[0], f)      # per-example gradients
    fisher = (g[:, :, None] * g[:, None, :]).reshape(draws, *outputs.shape, outputs.shape[1]).mean(0)
    hessian = likelihood.output_hessian(outputs)
    scale = hessian.diagonal(dim1=1, dim2=2).amax()
    assert (fisher - hessian).abs().max() < 0.04 * scale, (fisher, hessian)


@pytest.mark.parametrize("case", range(4))
def test_soft_targets_are_where_the_nll_is_stationary(case):
    """∇_{f'} mean_nll(f', soft_targets(f)) = 0 at f' = f: FedLap-Func's function-space terms vanish at their own
    predictions, so its fixed points are FedLap's; and soft_targets is E[y | f]."""
    likelihood, outputs, _ = _curvature_cases()[case]
    soft = likelihood.soft_targets(outputs)
    f = outputs.clone().requires_grad_()
    (grad,) = torch.autograd.grad(likelihood.mean_nll(f, soft), f)
    assert grad.abs().max() < 1e-14
    draws = likelihood.sample_targets(outputs.repeat(20000, 1), torch.Generator().manual_seed(1))
    if draws.dtype == torch.long:                                                    # labels: their frequencies
        draws = F.one_hot(draws, outputs.shape[1]).double()
    mean = draws.reshape(20000, outputs.shape[0], -1).mean(0)
    assert (mean - soft.reshape(outputs.shape[0], -1)).abs().max() < 0.05 * (1 + soft.abs().max())


def _hessian_of_half(outputs):
    return torch.eye(outputs.shape[1], dtype=outputs.dtype).expand(outputs.shape[0], -1, -1) / 0.25


def test_require_names_the_method_the_likelihood_and_what_to_supply():
    for likelihood in (Classification(), GaussianRegression(1.0), Poisson()):
        require(likelihood, ("output_hessian", "sample_targets", "soft_targets"), "fedlap-cov")
    bare = NegLogLikelihood(_gaussian_nll_half)
    with pytest.raises(TypeError) as error:
        require(bare, ("output_hessian",), "fedlap-cov")
    message = str(error.value)
    assert "fedlap-cov" in message and "NegLogLikelihood" in message and "output_hessian=" in message
    # given as a callable, a member is there; the others are still missing
    given = NegLogLikelihood(_gaussian_nll_half, output_hessian=_hessian_of_half)
    require(given, ("output_hessian",), "fedlap-cov")
    with pytest.raises(TypeError, match="fedep needs the likelihood's sample_targets"):
        require(given, ("sample_targets",), "fedep")
    assert pickle.loads(pickle.dumps(given)) == given
    with pytest.raises(TypeError, match="soft_targets must be None or a callable"):
        NegLogLikelihood(_gaussian_nll_half, soft_targets="mean")
    with pytest.raises(TypeError, match="MyLikelihood"):

        class MyLikelihood:
            pass

        require(MyLikelihood(), ("soft_targets",), "fedlap-func")
