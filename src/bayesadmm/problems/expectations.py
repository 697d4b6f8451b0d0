"""Expected gradients and Hessians of a loss under a Gaussian q, and the natural gradients they give.

Khan & Rue (2023, Eqs. 10–11): for a Gaussian q = N(m, S⁻¹) and L(μ) = E_q[ℓ(θ)], the gradient with respect to the
expectation parameters (= the natural gradient, Eq. 11 of the BayesADMM paper) is

    full:      ∇_μ L = (g − H m, ½ H)        g = E_q[∇ℓ], H = E_q[∇²ℓ]
    diagonal:  ∇_μ L = (g − h∘m, ½ h)        h = E_q[diag ∇²ℓ]
    isotropic: ∇_μ L = (g,)                  (fixed covariance: μ = m, Bonnet's theorem)

Each family supplies its own part (`GaussianFamily.loss_hessian`: the Hessian in the form its natural gradient reads;
`GaussianFamily.natural_gradient`: the formula above); this module takes the expectations, either with the delta method
(E_q[f(θ)] ≈ f(m), "Laplace") or by Monte Carlo with samples drawn from q through an explicit generator.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

EXPECTATIONS = ("delta", "mc")


class Derivatives(NamedTuple):
    """E_q[∇ℓ] and E_q[∇²ℓ]; `hess` in the form `family.loss_hessian` gives it ((d,) diagonal for the diagonal
    family, (d, d) otherwise)."""

    grad: Tensor
    hess: Tensor


def check_expectation(expectation: str, mc_samples: int) -> None:
    if expectation not in EXPECTATIONS:
        raise ValueError(f"unknown expectation {expectation!r}; valid: {', '.join(EXPECTATIONS)}")
    if expectation == "mc" and mc_samples < 1:
        raise ValueError(f"mc_samples must be >= 1, got {mc_samples}")


def expected_derivatives(
    loss,
    family,
    lam,
    expectation: str = "delta",
    mc_samples: int = 1,
    generator: torch.Generator | None = None,
    full_hessian: bool = False,
) -> Derivatives:
    """E_q[∇ℓ] and E_q[∇²ℓ] under q = family(lam), the Hessian as `family.loss_hessian` gives it (for the diagonal
    family only its diagonal), or the full (d, d) Hessian whatever the family if `full_hessian` is set."""
    check_expectation(expectation, mc_samples)
    hess_fn = loss.hess if full_hessian else functools.partial(family.loss_hessian, loss)
    if expectation == "delta":
        mean, _ = family.to_moments(lam)
        return Derivatives(loss.grad(mean), hess_fn(mean))
    if generator is None:
        raise ValueError("Monte-Carlo expectations need an explicit torch.Generator")
    thetas = family.sample(lam, mc_samples, generator)
    grad = torch.stack([loss.grad(t) for t in thetas]).mean(0)
    hess = torch.stack([hess_fn(t) for t in thetas]).mean(0)
    return Derivatives(grad, hess)


def natural_gradient(family, lam, derivs: Derivatives) -> tuple[Tensor, ...]:
    """∇_μ E_q[ℓ] from the expected derivatives (Khan & Rue 2023, Eqs. 10–11; BayesADMM paper Eqs. 48, 60): the
    family's own formula (`GaussianFamily.natural_gradient`), `derivs` as `expected_derivatives` gives them without
    `full_hessian`."""
    return family.natural_gradient(lam, derivs)
