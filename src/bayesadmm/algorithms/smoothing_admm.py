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

from dataclasses import dataclass

from bayesadmm.algorithms import bayes_admm
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.algorithms.spec import Context, MethodSpec
from bayesadmm.algorithms.spec import register as register_method
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
    """Isotropic BayesADMM over `dim` parameters with posterior precision `precision` fixed: `bayes_admm.make` with
    the isotropic family and a `GaussianSmoothingAdam` local solver (Adam at `lr` over `epochs` of `batch_size`,
    `mc_samples` draws per step)."""
    solver = GaussianSmoothingAdam(lr=lr, epochs=epochs, batch_size=batch_size, mc_samples=mc_samples)
    return bayes_admm.make(
        IsotropicGaussian(dim, precision), solver, rho=rho, delta=delta, gamma=gamma, server_rho=server_rho, name=name
    )


@dataclass(frozen=True)
class Hparams:
    """Isotropic BayesADMM's hyperparameters (`make`): ρ, δ, the fixed precision s (`precision`), the local Adam run
    with `mc_samples` draws, the dual step γ (None: ρ) and ρ_s (None: ρ)."""

    rho: float
    delta: float
    precision: float
    lr: float
    epochs: int = 1
    batch_size: int = 32
    mc_samples: int = 1
    gamma: float | None = None
    server_rho: float | None = None


def build(hparams: Hparams, context: Context) -> Algorithm:
    return make(
        context.dim,
        rho=hparams.rho,
        delta=hparams.delta,
        precision=hparams.precision,
        lr=hparams.lr,
        epochs=hparams.epochs,
        batch_size=hparams.batch_size,
        mc_samples=hparams.mc_samples,
        gamma=hparams.gamma,
        server_rho=hparams.server_rho,
    )


SPEC = register_method(
    MethodSpec(
        name="bayes-admm-iso",
        hparams=Hparams,
        build=build,
        summary="BayesADMM, isotropic Gaussian (Gaussian smoothing of ADMM)",
        example={
            "lr": 0.05,
            "epochs": 2,
            "batch_size": 8,
            "rho": 0.5,
            "gamma": 0.5,
            "delta": 1.0,
            "precision": 10.0,
        },
    )
)
