"""BregmanADMM (Wang & Banerjee 2014) applied to the VB problem, as in App. E.2–E.3 of the BayesADMM paper.

Identical to BayesADMM (client Eq. 15, server Eq. 17, since KL between exponential-family members is a Bregman
divergence) except that the dual is updated with expectation parameters, the usual primal-residual step:

    η_k ← η_k + γ (μ_k − μ_g)

instead of Eq. 16's natural parameters. The paper's point (App. C.2) is that this loses η_k = −∇_μ L_k(μ_k) and the
one-round convergence of Prop. D.1; the convex experiments show the difference. For the same reason its duals are
no client's term of the posterior, and it has no `unlearn` hook (`bayesadmm.unlearn` refuses it).
"""

from __future__ import annotations

from bayesadmm.algorithms import bayes_admm
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.families import natural as nat


def expectation_dual_step(family, dual, lam_k, lam_g, gamma: float):
    """η_k ← η_k + γ (μ_k − μ_g)."""
    return nat.add_scaled(dual, gamma, nat.sub(family.to_expectation(lam_k), family.to_expectation(lam_g)))


def make(
    family,
    solver,
    rho: float,
    delta: float,
    gamma: float | None = None,
    server_rho: float | None = None,
    name: str = "bregman-admm",
) -> Algorithm:
    """BregmanADMM over `family` with local `solver`: `bayes_admm.make` with `expectation_dual_step` as its dual
    step (the convex experiments' comparison; no registered method)."""
    return bayes_admm.make(
        family, solver, rho, delta, gamma=gamma, server_rho=server_rho, dual_step=expectation_dual_step, name=name
    )
