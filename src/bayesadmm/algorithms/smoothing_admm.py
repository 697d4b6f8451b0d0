"""Isotropic BayesADMM for neural networks: BayesADMM with q = N(m, I/s), s fixed, and the Gaussian-smoothing solver.

    client (22):  m_k ← argmin_m E_{N(θ|m, I/s)}[ℓ_k(θ)] + η_kᵀm + (ρs/2)‖m − m_g‖²      (`GaussianSmoothingAdam`)
    dual   (16):  η_k ← η_k + γ s (m_k − m_g)
    server (54):  m_g ← (Σ_k η_k + ρ_s s Σ_k m_k) / (δ + ρ_s s K)         (c = δ/s, b = 0 for the isotropic family)

i.e. federated ADMM (Eqs. 5–7) with proximal weight ρs on the Gaussian-smoothed losses; as s → ∞ the smoothing
vanishes and the fixed point tends to ADMM's, the MAP with prior precision δ (tested). The duals, server and the
isotropic family's prior terms are `bayes_admm`'s, unchanged. The server starts at mean `theta0`.
Note that ρ multiplies s: keep ρs, ADMM's proximal weight in summed-loss units, in a sensible range.
"""

from __future__ import annotations

from bayesadmm.algorithms import bayes_admm
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.families import IsotropicGaussian
from bayesadmm.solvers.smoothing import GaussianSmoothingAdam


def make(
    dim: int,
    rho: float,
    delta: float,
    precision: float,
    lr: float,
    epochs: int = 1,
    batch_size: int = 32,
    mc_samples: int = 1,
    gamma: float | None = None,
    server_rho: float | None = None,
    name: str = "bayes-admm-iso",
) -> Algorithm:
    solver = GaussianSmoothingAdam(lr=lr, epochs=epochs, batch_size=batch_size, mc_samples=mc_samples)
    return bayes_admm.make(
        IsotropicGaussian(dim, precision), solver, rho=rho, delta=delta, gamma=gamma, server_rho=server_rho, name=name
    )
