"""IVON-ADMM (Alg. 1) and IVON-PVI: BayesADMM with the diagonal Gaussian family and the IVON local solver.

    1. broadcast (m_g, s_g);
    2. client k: (m_k, s_k) ← IVON on (1/ρ)(ℓ_k/τ + θᵀv_k − ½θᵀdiag(u_k)θ) with prior N(m_g, diag(s_g)⁻¹)
       (App. D.4: ess = N_k/(ρτ), v = τv_k/N_k, u = τu_k/N_k; `solvers.ivon.IVONSolver`);
    3. v_k ← v_k + γ(s_k∘m_k − s_g∘m_g),  u_k ← u_k + γ(s_k − s_g)             (Eq. 16 with the dual step γ)
    4. s_g ← (1 − α) Mean(s_k) + α[δ + Sum(u_k)],
       m_g ← [(1 − α) Mean(s_k∘m_k) + α Sum(v_k)] / s_g,  α = 1/(1 + ρK)     (Eq. 54 for the diagonal family)

Steps 3–4 are `bayes_admm`'s dual and server updates for the diagonal family, unchanged. IVON-PVI (App. G.1) is the
same with ρ = 1 and α = 1 (no server proximal term), γ acting as PVI's damping.
The server starts at mean `theta0` (a network's random initialisation; Alg. 1's m_g = 0 would make a sigmoid MLP's
hidden units identical) and precision δ.

The keywords `cosine_rounds` (the engine supplies the run's length when a config sets `cosine: true`) and
`restart_at_q_g` choose the solver's step-size schedule (`CosineLR` or `ConstantLR`) and round start (`RestartAtQg` or
`RestartAtHessInit`, Alg. 2 as written); see `solvers.ivon`.
"""

from __future__ import annotations

from bayesadmm.algorithms import bayes_admm
from bayesadmm.algorithms.base import Algorithm
from bayesadmm.families import DiagonalGaussian
from bayesadmm.solvers.ivon import ConstantLR, CosineLR, IVONSolver, RestartAtHessInit, RestartAtQg


def make_solver(
    lr: float,
    tau: float = 1.0,
    epochs: int = 1,
    batch_size: int = 32,
    hess_init: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.99999,
    mc_samples: int = 1,
    clip_radius: float = float("inf"),
    cosine_rounds: int | None = None,
    restart_at_q_g: bool = False,
) -> IVONSolver:
    """The IVON client solver `make` uses: cosine decay over `cosine_rounds` rounds (None: constant lr), and rounds
    after the first starting at q_g with `restart_at_q_g` (else at h0 every round, Alg. 2)."""
    schedule = ConstantLR() if cosine_rounds is None else CosineLR(cosine_rounds)
    start = RestartAtQg() if restart_at_q_g else RestartAtHessInit()
    return IVONSolver(
        lr=lr,
        epochs=epochs,
        batch_size=batch_size,
        tau=tau,
        hess_init=hess_init,
        beta1=beta1,
        beta2=beta2,
        mc_samples=mc_samples,
        clip_radius=clip_radius,
        schedule=schedule,
        start=start,
    )


def make(
    dim: int,
    rho: float,
    gamma: float,
    delta: float,
    lr: float,
    tau: float = 1.0,
    epochs: int = 1,
    batch_size: int = 32,
    hess_init: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.99999,
    mc_samples: int = 1,
    clip_radius: float = float("inf"),
    cosine_rounds: int | None = None,
    restart_at_q_g: bool = False,
    server_rho: float | None = None,
    name: str = "ivon-admm",
) -> Algorithm:
    """IVON-ADMM over `dim` parameters: ρ = `rho`, dual step γ = `gamma`, prior precision δ = `delta`, server
    proximal weight ρ_s = `server_rho` (default ρ); the IVON settings as `make_solver` takes them."""
    solver = make_solver(
        lr=lr,
        tau=tau,
        epochs=epochs,
        batch_size=batch_size,
        hess_init=hess_init,
        beta1=beta1,
        beta2=beta2,
        mc_samples=mc_samples,
        clip_radius=clip_radius,
        cosine_rounds=cosine_rounds,
        restart_at_q_g=restart_at_q_g,
    )
    return bayes_admm.make(
        DiagonalGaussian(dim), solver, rho=rho, delta=delta, gamma=gamma, server_rho=server_rho, name=name
    )


def make_pvi(
    dim: int,
    damping: float,
    delta: float,
    lr: float,
    tau: float = 1.0,
    epochs: int = 1,
    batch_size: int = 32,
    hess_init: float = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.99999,
    mc_samples: int = 1,
    clip_radius: float = float("inf"),
    cosine_rounds: int | None = None,
    restart_at_q_g: bool = False,
) -> Algorithm:
    """IVON-PVI: ρ = 1, α = 1 (no server proximal term), dual step γ = `damping`; IVON settings as in `make`."""
    return make(
        dim,
        rho=1.0,
        gamma=damping,
        delta=delta,
        lr=lr,
        tau=tau,
        epochs=epochs,
        batch_size=batch_size,
        hess_init=hess_init,
        beta1=beta1,
        beta2=beta2,
        mc_samples=mc_samples,
        clip_radius=clip_radius,
        cosine_rounds=cosine_rounds,
        restart_at_q_g=restart_at_q_g,
        server_rho=0.0,
        name="ivon-pvi",
    )
