"""Local solvers for the BayesADMM client subproblem (Eq. 15) on convex losses.

The subproblem, for a Gaussian family, the client loss ℓ_k, the dual η_k and the broadcast q_g = family(λ_g), is

    q_k = argmin_q  E_q[ℓ_k] + ⟨η_k, μ⟩ + ρ KL(q ‖ q_g).                                              (Eq. 15)

Its stationarity condition (App. C.1, Eq. 32) is ∇_μ L_k(μ) + η_k + ρ(λ − λ_g) = 0, i.e. the fixed point of

    λ ← (1 − β) λ + β [λ_g − (η_k + ∇_μ L_k(μ)) / ρ],                                                (*)

which is the Bayesian learning rule / VON (Khan & Rue 2023, Eq. 12) with natural-gradient step β on the loss
(ℓ_k + ⟨η_k, T(θ)⟩)/ρ and prior q_g. With η_k = (v, −½V) and q = N(m, S⁻¹), (*) reads

    S ← (1 − β) S + β [S_g + (H − V)/ρ]
    m ← m − β S⁻¹ [(g + v − V m)/ρ + S_g (m − m_g)]                                                   (Eqs. 49–52)

where g = E_q[∇ℓ_k], H = E_q[∇²ℓ_k] (diagonals only for the diagonal family). With β = 1 and the delta method this
is Newton's method for the full family. For the diagonal family the mean step preconditions with the diagonal s only,
a Jacobi-type iteration that diverges when the loss couples coordinates strongly; by default we therefore take the
mean step with the full expected Hessian of the mean's stationarity condition,

    F(m) = (g + v − u∘m)/ρ + s_g∘(m − m_g) = 0,     m ← m − β [E_q[∇²ℓ]/ρ − diag(u)/ρ + diag(s_g)]⁻¹ F(m),

which has the same fixed point (F = 0 is the first half of (*)) and converges like Newton's method. The isotropic family has a fixed covariance, so VON there is plain gradient descent on m; we use
Newton on m instead, which solves the same subproblem (Eq. 22):

    m ← m − β (H + ρ s I)⁻¹ [g + v + ρ s (m − m_g)].

`ExactQuadratic` solves the subproblem in closed form when ℓ_k is quadratic (ℓ = ½θᵀAθ − bᵀθ + c).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from bayesadmm.families import DiagonalGaussian, FullGaussian, IsotropicGaussian
from bayesadmm.families import natural as nat
from bayesadmm.problems.expectations import check_expectation, expected_derivatives, natural_gradient
from bayesadmm.problems.losses import QuadraticLoss


class SolveResult(NamedTuple):
    natural: tuple[Tensor, ...]
    iterations: int
    converged: bool


class SubproblemError(RuntimeError):
    """The local solver could not produce a valid distribution (e.g. the precision stopped being positive)."""


def _split_dual(family, eta) -> tuple[Tensor, Tensor | None]:
    """η = (v, −½V): return (v, V) (V is None for the isotropic family)."""
    if isinstance(family, IsotropicGaussian):
        return eta[0], None
    return eta[0], -2.0 * eta[1]


@dataclass(frozen=True)
class VON:
    """Variational Online Newton for Eq. 15 (see the module docstring).

    expectation: "delta" (E_q[f] ≈ f(m), Laplace) or "mc" (mc_samples draws from q per iteration).
    step: β in (0, 1]; halved automatically when a step would leave the set of valid precisions.
    Iterates until the relative change of λ is below `tol` or `max_iters` iterations; with "mc" the iterates are
    noisy and the solver runs to max_iters unless the tolerance happens to be met.
    """

    expectation: str = "delta"
    mc_samples: int = 1
    step: float = 1.0
    max_iters: int = 100
    tol: float = 1e-12
    diagonal_mean_step: str = "newton"   # or "natural": the plain VON step m ← m − β s⁻¹(...)

    def __post_init__(self) -> None:
        check_expectation(self.expectation, self.mc_samples)
        if not 0 < self.step <= 1:
            raise ValueError(f"VON step must be in (0, 1], got {self.step}")
        if self.diagonal_mean_step not in ("newton", "natural"):
            raise ValueError(f"diagonal_mean_step must be 'newton' or 'natural', got {self.diagonal_mean_step!r}")

    def _newton_diagonal(self, family) -> bool:
        return isinstance(family, DiagonalGaussian) and self.diagonal_mean_step == "newton"

    def solve(self, family, loss, lam_g, eta, rho: float, generator: torch.Generator | None = None,
              init=None) -> SolveResult:
        lam = lam_g if init is None else init
        for it in range(1, self.max_iters + 1):
            derivs = expected_derivatives(loss, family, lam, self.expectation, self.mc_samples, generator,
                                          full_hessian=self._newton_diagonal(family))
            new = self._update(family, lam, lam_g, eta, rho, derivs)
            change = nat.norm(nat.sub(new, lam)) / max(float(nat.norm(lam)), 1.0)
            lam = new
            if change < self.tol:
                return SolveResult(lam, it, True)
        return SolveResult(lam, self.max_iters, False)

    def _update(self, family, lam, lam_g, eta, rho, derivs):
        if isinstance(family, IsotropicGaussian):
            return self._newton_mean(family, lam, lam_g, eta, rho, derivs)
        if self._newton_diagonal(family):
            return self._newton_diagonal_update(family, lam, lam_g, eta, rho, derivs)
        beta = self.step
        for _ in range(30):
            # (*) in natural parameters: a convex combination with the stationarity map.
            target = nat.sub(lam_g, nat.scale(nat.add(eta, natural_gradient(family, lam, derivs)), 1.0 / rho))
            new = nat.add(nat.scale(lam, 1.0 - beta), nat.scale(target, beta))
            if family.is_valid(new):
                return new
            beta /= 2  # the precision would stop being positive: take a shorter natural-gradient step
        raise SubproblemError("VON could not find a step that keeps the precision positive; the dual curvature "
                              "exceeds the loss curvature (try a smaller dual step or a larger rho)")

    def _newton_diagonal_update(self, family, lam, lam_g, eta, rho, derivs):
        (m, s), (m_g, s_g) = family.to_moments(lam), family.to_moments(lam_g)
        v, u = _split_dual(family, eta)
        g, H = derivs
        beta = self.step
        for _ in range(30):
            s_new = (1 - beta) * s + beta * (s_g + (torch.diagonal(H) - u) / rho)
            if bool((s_new > 0).all()):
                break
            beta /= 2
        else:
            raise SubproblemError("VON could not keep the diagonal precision positive; the dual curvature u exceeds "
                                  "the loss curvature (try a smaller dual step or a larger rho)")
        residual = (g + v - u * m) / rho + s_g * (m - m_g)
        jacobian = H / rho + torch.diag(s_g - u / rho)
        m_new = m - self.step * torch.linalg.solve(jacobian, residual)
        return (s_new * m_new, -0.5 * s_new)

    def _newton_mean(self, family, lam, lam_g, eta, rho, derivs):
        s = family.precision
        m, m_g = lam[0] / s, lam_g[0] / s
        g, H = derivs
        grad = g + eta[0] + rho * s * (m - m_g)
        hess = H + rho * s * torch.eye(m.shape[0], dtype=m.dtype, device=m.device)
        m_new = m - self.step * torch.linalg.solve(hess, grad)
        return (s * m_new,)


@dataclass(frozen=True)
class ExactQuadratic:
    """Closed-form solution of Eq. 15 for ℓ_k(θ) = ½θᵀAθ − bᵀθ + c (no expectation is approximated).

    full:      λ = λ_g + (c_k − η_k)/ρ with c_k = (b, −½A)                     (Prop. D.1 proof)
    diagonal:  s = s_g + (diag A − u)/ρ,  (diag(s) + (A − diag A)/ρ) m = s_g∘m_g + (b − v)/ρ
    isotropic: (A + ρ s I) m = b − v + ρ s m_g
    """

    def solve(self, family, loss, lam_g, eta, rho: float, generator: torch.Generator | None = None,
              init=None) -> SolveResult:
        if not isinstance(loss, QuadraticLoss):
            raise TypeError(f"ExactQuadratic needs a QuadraticLoss, got {type(loss).__name__}")
        A, b = loss.A, loss.b
        if isinstance(family, FullGaussian):
            lam = nat.add(lam_g, nat.scale(nat.sub((b, -0.5 * A), eta), 1.0 / rho))
        elif isinstance(family, DiagonalGaussian):
            v, u = _split_dual(family, eta)
            m_g, s_g = family.to_moments(lam_g)
            a = torch.diagonal(A)
            s = s_g + (a - u) / rho
            system = torch.diag(s) + (A - torch.diag(a)) / rho
            m = torch.linalg.solve(system, s_g * m_g + (b - v) / rho)
            lam = (s * m, -0.5 * s)
        elif isinstance(family, IsotropicGaussian):
            s = family.precision
            m_g = lam_g[0] / s
            eye = torch.eye(b.shape[0], dtype=b.dtype, device=b.device)
            m = torch.linalg.solve(A + rho * s * eye, b - eta[0] + rho * s * m_g)
            lam = (s * m,)
        else:
            raise TypeError(f"ExactQuadratic does not know family {family!r}")
        if not family.is_valid(lam):
            raise SubproblemError("the exact solution of the client subproblem is not a valid Gaussian "
                                  "(the dual curvature exceeds the loss curvature)")
        return SolveResult(lam, 1, True)
