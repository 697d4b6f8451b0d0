"""Tests of the Gaussian families in natural parameters and the tuple helpers.

Oracles are independent of the code under test wherever possible: moments are
drawn in the test and fed to ``torch.distributions`` directly, gradients come
from autograd, and sampling is checked by Monte Carlo.
"""

import math

import pytest
import torch
from torch import distributions as D

from bayesadmm.families import (
    DiagonalGaussian,
    FullGaussian,
    GaussianFamily,
    IsotropicGaussian,
    Posterior,
    make_family,
    natural,
)

DTYPE = torch.float64
DIM = 4
ISO_PRECISION = 2.5  # deliberately != 1 so a forgotten factor s shows up

FAMILIES = [
    IsotropicGaussian(DIM, precision=ISO_PRECISION),
    DiagonalGaussian(DIM),
    FullGaussian(DIM),
]
IDS = [f.name for f in FAMILIES]
by_family = pytest.mark.parametrize("family", FAMILIES, ids=IDS)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_moments(family, g):
    """Random mean and precision in the format ``from_moments`` expects."""
    mean = torch.randn(DIM, generator=g, dtype=DTYPE)
    if isinstance(family, IsotropicGaussian):
        return mean, None
    if isinstance(family, DiagonalGaussian):
        return mean, torch.exp(torch.randn(DIM, generator=g, dtype=DTYPE))
    a = torch.randn(DIM, DIM, generator=g, dtype=DTYPE)
    return mean, a @ a.T + 0.5 * torch.eye(DIM, dtype=DTYPE)


def torch_dist(family, mean, precision):
    """The same Gaussian as a torch.distributions object, built from moments."""
    if isinstance(family, IsotropicGaussian):
        scale = torch.full_like(mean, family.precision**-0.5)
        return D.Independent(D.Normal(mean, scale), 1)
    if isinstance(family, DiagonalGaussian):
        return D.Independent(D.Normal(mean, precision.rsqrt()), 1)
    return D.MultivariateNormal(mean, precision_matrix=precision)


def covariance(family, precision):
    if isinstance(family, IsotropicGaussian):
        return torch.eye(DIM, dtype=DTYPE) / family.precision
    if isinstance(family, DiagonalGaussian):
        return torch.diag(1.0 / precision)
    return torch.linalg.inv(precision)


def leaf(params):
    return tuple(x.detach().clone().requires_grad_(True) for x in params)


# ---------------------------------------------------------------------------
# parameter maps
# ---------------------------------------------------------------------------


@by_family
def test_from_moments_has_documented_layout(family):
    mean, prec = random_moments(family, gen(0))
    lam = family.from_moments(mean, prec)
    if isinstance(family, IsotropicGaussian):
        expected = (ISO_PRECISION * mean,)
    else:
        p = prec if isinstance(family, FullGaussian) else torch.diag(prec)
        lam2 = -0.5 * prec
        expected = (p @ mean, lam2)
    assert natural.allclose(lam, expected, rtol=1e-12, atol=1e-12)


@by_family
def test_moments_round_trip(family):
    mean, prec = random_moments(family, gen(1))
    lam = family.from_moments(mean, prec)
    m, p = family.to_moments(lam)
    torch.testing.assert_close(m, mean)
    if isinstance(family, IsotropicGaussian):
        assert p.shape == () and p.dtype == DTYPE
        assert p.item() == pytest.approx(ISO_PRECISION)
    else:
        torch.testing.assert_close(p, prec)
    assert natural.allclose(family.from_moments(m, p), lam, rtol=1e-10, atol=1e-12)


@by_family
def test_expectation_matches_moments_and_round_trips(family):
    mean, prec = random_moments(family, gen(2))
    lam = family.from_moments(mean, prec)
    mu = family.to_expectation(lam)
    torch.testing.assert_close(mu[0], mean)
    # E[θθᵀ] = Σ + m mᵀ with Σ from an explicit matrix inverse.
    torch.testing.assert_close(
        family.second_moment(mu), covariance(family, prec) + torch.outer(mean, mean)
    )
    assert natural.allclose(family.from_expectation(mu), lam, rtol=1e-10, atol=1e-10)
    # ... and the other direction, starting from expectation parameters.
    mu2 = family.to_expectation(family.from_expectation(mu))
    assert natural.allclose(mu2, mu, rtol=1e-10, atol=1e-10)


@by_family
def test_expectation_is_gradient_of_log_normalizer(family):
    lam = leaf(family.from_moments(*random_moments(family, gen(3))))
    grads = torch.autograd.grad(family.log_normalizer(lam), lam)
    mu = family.to_expectation(tuple(x.detach() for x in lam))
    # For the full family A reads λ₂ through its symmetric part, so the
    # gradient w.r.t. the whole matrix is already the symmetric μ₂.
    assert natural.allclose(grads, mu, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------
# densities and divergences against torch.distributions
# ---------------------------------------------------------------------------


@by_family
def test_log_prob_entropy_match_torch(family):
    mean, prec = random_moments(family, gen(4))
    lam = family.from_moments(mean, prec)
    ref = torch_dist(family, mean, prec)
    theta = torch.randn(2, 5, DIM, generator=gen(5), dtype=DTYPE)
    lp = family.log_prob(lam, theta)
    assert lp.shape == (2, 5)
    torch.testing.assert_close(lp, ref.log_prob(theta))
    torch.testing.assert_close(family.entropy(lam), ref.entropy())


@by_family
def test_log_prob_decomposes_into_exponential_family_terms(family):
    lam = family.from_moments(*random_moments(family, gen(6)))
    theta = torch.randn(7, DIM, generator=gen(7), dtype=DTYPE)
    stats = family.sufficient_statistics(theta)
    assert stats[0].shape == (7, DIM)
    pairing = sum(
        (part * t).flatten(start_dim=1).sum(-1) for part, t in zip(lam, stats, strict=False)
    )
    expected = pairing - family.log_normalizer(lam) + family.log_base_measure(theta)
    torch.testing.assert_close(family.log_prob(lam, theta), expected)


@by_family
def test_kl_matches_torch_and_bregman(family):
    mq, pq = random_moments(family, gen(8))
    mp, pp = random_moments(family, gen(9))
    lam_q, lam_p = family.from_moments(mq, pq), family.from_moments(mp, pp)
    kl = family.kl(lam_q, lam_p)
    assert kl.shape == ()
    torch.testing.assert_close(
        kl, D.kl_divergence(torch_dist(family, mq, pq), torch_dist(family, mp, pp))
    )
    mu_q = family.to_expectation(lam_q)
    bregman = (
        family.log_normalizer(lam_p)
        - family.log_normalizer(lam_q)
        - natural.inner(mu_q, natural.sub(lam_p, lam_q))
    )
    torch.testing.assert_close(kl, bregman)
    assert family.kl(lam_q, lam_q).abs().item() < 1e-12


@by_family
def test_kl_gradient_in_expectation_is_difference_of_naturals(family):
    # Khan & Rue (2023), Eq. 21/23: ∇_μ KL(q‖p) = λ_q − λ_p.
    lam_q = family.from_moments(*random_moments(family, gen(10)))
    lam_p = family.from_moments(*random_moments(family, gen(11)))
    mu = leaf(family.to_expectation(lam_q))
    grads = torch.autograd.grad(family.kl(family.from_expectation(mu), lam_p), mu)
    assert natural.allclose(grads, natural.sub(lam_q, lam_p), rtol=1e-8, atol=1e-10)


@by_family
@pytest.mark.parametrize("delta", [0.3, 4.0])
def test_prior_terms_give_gradient_of_kl_to_isotropic_prior(family, delta):
    lam = family.from_moments(*random_moments(family, gen(12)))
    mu = leaf(family.to_expectation(lam))
    mean, prec = family.to_moments(family.from_expectation(mu))
    prior = D.Independent(
        D.Normal(torch.zeros(DIM, dtype=DTYPE), torch.full((DIM,), delta**-0.5, dtype=DTYPE)), 1
    )
    if isinstance(family, FullGaussian):
        prior = D.MultivariateNormal(
            torch.zeros(DIM, dtype=DTYPE), precision_matrix=delta * torch.eye(DIM, dtype=DTYPE)
        )
    kl = D.kl_divergence(torch_dist(family, mean, prec), prior)
    grads = torch.autograd.grad(kl, mu)
    c, b = family.prior_terms(delta)
    assert isinstance(c, float)
    expected = natural.sub(natural.scale(lam, c), b)
    assert natural.allclose(grads, expected, rtol=1e-8, atol=1e-10)


def test_prior_terms_values():
    assert IsotropicGaussian(3, precision=2.0).prior_terms(5.0)[0] == pytest.approx(2.5)
    c, b = FullGaussian(3).prior_terms(5.0)
    assert c == 1.0
    torch.testing.assert_close(b[1], -2.5 * torch.eye(3, dtype=DTYPE))
    c, b = DiagonalGaussian(3).prior_terms(5.0, dtype=torch.float32)
    assert b[1].dtype == torch.float32 and torch.all(b[1] == -2.5) and torch.all(b[0] == 0)


# ---------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------


@by_family
def test_sample_moments(family):
    n = 200_000
    mean, prec = random_moments(family, gen(13))
    lam = family.from_moments(mean, prec)
    x = family.sample(lam, n, gen(14))
    assert x.shape == (n, DIM) and x.dtype == DTYPE
    cov = covariance(family, prec)
    sd = cov.diagonal().sqrt()
    # 6 standard errors: mean se = sd/√n, covariance se ≤ sd_i sd_j √(2/n).
    assert torch.all((x.mean(0) - mean).abs() < 6 * sd / math.sqrt(n))
    emp_cov = torch.cov(x.T)
    assert torch.all((emp_cov - cov).abs() < 6 * torch.outer(sd, sd) * math.sqrt(2.0 / n))
    # Average sufficient statistics estimate μ.
    mu = family.to_expectation(lam)
    stats = family.sufficient_statistics(x)
    for est, exact in zip(stats, mu, strict=False):
        scale = exact.abs().max().item() + 1.0
        assert (est.mean(0) - exact).abs().max().item() < 0.05 * scale


@by_family
def test_sample_reproducible_with_generator(family):
    lam = family.from_moments(*random_moments(family, gen(15)))
    a = family.sample(lam, 10, gen(99))
    b = family.sample(lam, 10, gen(99))
    c = family.sample(lam, 10, gen(100))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


# ---------------------------------------------------------------------------
# purity, dtype, layout
# ---------------------------------------------------------------------------


@by_family
def test_functions_do_not_mutate_inputs(family):
    lam = family.from_moments(*random_moments(family, gen(16)))
    before = tuple(x.clone() for x in lam)
    mu = family.to_expectation(lam)
    mu_before = tuple(x.clone() for x in mu)
    family.from_expectation(mu)
    family.second_moment(mu)
    family.to_moments(lam)
    family.entropy(lam)
    family.kl(lam, lam)
    family.sample(lam, 3, gen(0))
    assert all(torch.equal(x, y) for x, y in zip(lam, before, strict=False))
    assert all(torch.equal(x, y) for x, y in zip(mu, mu_before, strict=False))


@by_family
def test_float32_stays_float32(family):
    mean, prec = random_moments(family, gen(17))
    lam = family.from_moments(mean.float(), None if prec is None else prec.float())
    assert all(x.dtype == torch.float32 for x in family.to_expectation(lam))
    assert family.log_normalizer(lam).dtype == torch.float32
    assert family.entropy(lam).dtype == torch.float32
    assert family.sample(lam, 4, gen(0)).dtype == torch.float32


@by_family
def test_zeros_has_natural_layout(family):
    lam = family.from_moments(*random_moments(family, gen(18)))
    z = family.zeros()
    assert [x.shape for x in z] == [x.shape for x in lam]
    assert all(x.dtype == DTYPE and torch.all(x == 0) for x in z)
    assert family.zeros(dtype=torch.float32)[0].dtype == torch.float32


def test_posterior_wraps_family_and_parameter():
    family = FullGaussian(DIM)
    mean, prec = random_moments(family, gen(19))
    post = Posterior(family, family.from_moments(mean, prec))
    torch.testing.assert_close(post.mean, mean)
    torch.testing.assert_close(post.precision, prec)
    assert torch.equal(post.sample(5, gen(1)), family.sample(post.natural, 5, gen(1)))
    assert post.log_prob(mean).shape == ()
    with pytest.raises(ValueError):
        Posterior(family, (mean, 0.5 * prec))


@by_family
def test_is_valid(family):
    lam = family.from_moments(*random_moments(family, gen(22)))
    assert family.is_valid(lam)
    assert not family.is_valid(lam + (lam[0],))
    if not isinstance(family, IsotropicGaussian):
        assert not family.is_valid((lam[0], -lam[1]))


def test_make_family():
    fam = make_family("isotropic", 3, precision=2.0)
    assert fam == IsotropicGaussian(3, precision=2.0)
    assert make_family("diagonal", 3) == DiagonalGaussian(3)
    assert make_family("full", 3).name == "full"
    with pytest.raises(ValueError, match="diagonal, full, isotropic"):
        make_family("gaussian", 3)


# ---------------------------------------------------------------------------
# the interface the algorithms and solvers use
# ---------------------------------------------------------------------------


def test_the_families_implement_the_whole_interface():
    abstract = GaussianFamily.__abstractmethods__
    assert {"initial_natural", "split_dual", "natural_gradient", "stationary_natural", "quadratic_solution"} <= abstract
    with pytest.raises(TypeError):
        GaussianFamily(DIM)
    for family in FAMILIES:
        assert isinstance(family, GaussianFamily) and not type(family).__abstractmethods__


@by_family
@pytest.mark.parametrize("delta", [0.5, 3.0])
def test_initial_natural_has_the_mean_and_the_priors_precision(family, delta):
    mean = torch.randn(DIM, generator=gen(30), dtype=DTYPE)
    m, prec = family.to_moments(family.initial_natural(mean, delta))
    torch.testing.assert_close(m, mean)
    if isinstance(family, IsotropicGaussian):
        assert prec.item() == pytest.approx(ISO_PRECISION)   # the family's own, fixed
    elif isinstance(family, DiagonalGaussian):
        torch.testing.assert_close(prec, torch.full((DIM,), delta, dtype=DTYPE))
    else:
        torch.testing.assert_close(prec, delta * torch.eye(DIM, dtype=DTYPE))


@by_family
def test_split_dual_and_as_matrix(family):
    """η = (v, −½V): V as the family's precision-shaped quantity, and its matrix."""
    lam = family.from_moments(*random_moments(family, gen(31)))
    v, V = family.split_dual(lam)
    _, precision = family.to_moments(lam)
    assert torch.equal(v, lam[0])
    if isinstance(family, IsotropicGaussian):
        assert V.shape == () and V.item() == 0.0
        torch.testing.assert_close(family.as_matrix(precision), ISO_PRECISION * torch.eye(DIM, dtype=DTYPE))
    else:
        torch.testing.assert_close(V, precision)
        torch.testing.assert_close(family.as_matrix(V), covariance(family, precision).inverse())


@by_family
def test_natural_gradient_is_the_gradient_of_the_expected_loss_in_mu(family):
    """∇_μ E_q[ℓ] for a quadratic ℓ = ½θᵀAθ − bᵀθ, whose E_q is exact in μ: ½⟨A, E[θθᵀ]⟩ − bᵀμ₁; the expected
    derivatives at q are (A m − b, A), the Hessian as the family reads it."""
    g = gen(32)
    a = torch.randn(DIM, DIM, generator=g, dtype=DTYPE)
    A, b = a @ a.T + torch.eye(DIM, dtype=DTYPE), torch.randn(DIM, generator=g, dtype=DTYPE)
    if isinstance(family, DiagonalGaussian):
        A = torch.diag(torch.diagonal(A))   # the diagonal family's natural gradient sees only diag(A)
    lam = family.from_moments(*random_moments(family, g))
    m, _ = family.to_moments(lam)
    hessian = torch.diagonal(A) if isinstance(family, DiagonalGaussian) else A
    ours = family.natural_gradient(lam, (A @ m - b, hessian))
    mu = leaf(family.to_expectation(lam))
    expected = torch.autograd.grad(0.5 * (A * family.second_moment(mu)).sum() - b @ mu[0], mu)
    assert natural.allclose(ours, expected, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------
# error messages
# ---------------------------------------------------------------------------


def test_invalid_family_construction():
    with pytest.raises(ValueError, match="dim"):
        DiagonalGaussian(0)
    with pytest.raises(ValueError, match="precision"):
        IsotropicGaussian(2, precision=-1.0)


@by_family
def test_wrong_shapes_raise(family):
    mean, prec = random_moments(family, gen(20))
    with pytest.raises(ValueError, match="mean must have shape"):
        family.from_moments(mean[:-1], prec)
    lam = family.from_moments(mean, prec)
    with pytest.raises(ValueError, match="theta"):
        family.log_prob(lam, torch.zeros(3, DIM + 1, dtype=DTYPE))
    with pytest.raises(ValueError, match="tuple"):
        family.to_expectation(lam + (lam[0],))
    with pytest.raises(ValueError, match=r"natural parameter\[0\] must have shape"):
        family.log_normalizer((lam[0][:-1],) + lam[1:])
    with pytest.raises(ValueError):
        family.prior_terms(0.0)


def test_isotropic_precision_mismatch():
    fam = IsotropicGaussian(DIM, precision=ISO_PRECISION)
    mean = torch.zeros(DIM, dtype=DTYPE)
    assert natural.allclose(fam.from_moments(mean, ISO_PRECISION), fam.from_moments(mean))
    with pytest.raises(ValueError, match="fixed precision"):
        fam.from_moments(mean, 1.0)


def test_diagonal_invalid_precision():
    fam = DiagonalGaussian(DIM)
    mean = torch.zeros(DIM, dtype=DTYPE)
    prec = torch.ones(DIM, dtype=DTYPE)
    with pytest.raises(ValueError, match="precision must have shape"):
        fam.from_moments(mean, torch.eye(DIM, dtype=DTYPE))
    with pytest.raises(ValueError, match="positive"):
        fam.from_moments(mean, prec.index_fill(0, torch.tensor([1]), -1.0))
    with pytest.raises(ValueError, match="needs a precision"):
        fam.from_moments(mean)
    with pytest.raises(ValueError, match="positive"):
        fam.validate((mean, 0.5 * prec))
    with pytest.raises(ValueError, match="positive"):
        fam.from_expectation((prec, 0.5 * prec))  # μ₂ < μ₁²


def test_full_invalid_precision():
    fam = FullGaussian(DIM)
    mean = torch.zeros(DIM, dtype=DTYPE)
    eye = torch.eye(DIM, dtype=DTYPE)
    indefinite = eye.clone()
    indefinite[0, 0] = -1.0
    with pytest.raises(ValueError, match="positive definite"):
        fam.from_moments(mean, indefinite)
    with pytest.raises(ValueError, match="precision must have shape"):
        fam.from_moments(mean, torch.ones(DIM, dtype=DTYPE))
    nonsym = eye.clone()
    nonsym[0, 1] = 0.5
    with pytest.raises(ValueError, match="symmetric"):
        fam.from_moments(mean, nonsym)
    with pytest.raises(ValueError, match="positive definite"):
        fam.validate((mean, 0.5 * eye))
    with pytest.raises(ValueError, match="symmetric"):
        fam.validate((mean, -0.5 * nonsym))
    with pytest.raises(ValueError, match="positive definite"):
        fam.sample((mean, -0.5 * indefinite), 2, gen(0))
    with pytest.raises(ValueError, match="positive definite"):
        fam.from_expectation((torch.ones(DIM, dtype=DTYPE), 0.5 * eye))


# ---------------------------------------------------------------------------
# natural-parameter tuple helpers
# ---------------------------------------------------------------------------


def _pair():
    g = gen(21)
    a = (torch.randn(3, generator=g, dtype=DTYPE), torch.randn(3, 3, generator=g, dtype=DTYPE))
    b = (torch.randn(3, generator=g, dtype=DTYPE), torch.randn(3, 3, generator=g, dtype=DTYPE))
    return a, b


def test_natural_arithmetic():
    a, b = _pair()
    assert natural.allclose(natural.add(a, b), (a[0] + b[0], a[1] + b[1]))
    assert natural.allclose(natural.sub(a, b), (a[0] - b[0], a[1] - b[1]))
    assert natural.allclose(natural.scale(a, 2.0), (2 * a[0], 2 * a[1]))
    assert natural.allclose(
        natural.lincomb((2.0, a), (-3.0, b)), (2 * a[0] - 3 * b[0], 2 * a[1] - 3 * b[1])
    )
    assert natural.allclose(natural.total([a, b, a]), (2 * a[0] + b[0], 2 * a[1] + b[1]))
    assert natural.allclose(natural.mean([a, b]), (0.5 * (a[0] + b[0]), 0.5 * (a[1] + b[1])))
    expected_inner = (a[0] * b[0]).sum() + (a[1] * b[1]).sum()
    torch.testing.assert_close(natural.inner(a, b), expected_inner)
    torch.testing.assert_close(natural.norm(a), torch.linalg.vector_norm(natural.flatten(a)))
    assert not natural.allclose(a, b)
    z = natural.zeros_like(a)
    assert [x.shape for x in z] == [x.shape for x in a] and float(natural.norm(z)) == 0.0


def test_natural_flatten_round_trip():
    a, _ = _pair()
    vec = natural.flatten(a)
    assert vec.shape == (12,)
    assert natural.allclose(natural.unflatten(vec, a), a, rtol=0, atol=0)
    with pytest.raises(ValueError, match="entries"):
        natural.unflatten(vec[:-1], a)


def test_natural_mismatch_raises():
    a, b = _pair()
    with pytest.raises(ValueError, match="lengths"):
        natural.add(a, b[:1])
    with pytest.raises(ValueError, match="shapes"):
        natural.inner(a, (b[0], b[1][:2]))
    with pytest.raises(ValueError):
        natural.total([])
