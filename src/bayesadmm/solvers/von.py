"""Local solvers for the BayesADMM client subproblem (Eq. 15) on convex losses.

The subproblem, for a Gaussian family, the client loss ℓ_k, the dual η_k and the broadcast q_g = family(λ_g), is

    q_k = argmin_q  E_q[ℓ_k] + ⟨η_k, μ⟩ + ρ KL(q ‖ q_g).                                              (Eq. 15)

Its stationarity condition (App. C.1, Eq. 32) is ∇_μ L_k(μ) + η_k + ρ(λ − λ_g) = 0, i.e. the fixed point of

    λ ← (1 − β) λ + β [λ_g − (η_k + ∇_μ L_k(μ)) / ρ],                                                (*)

which is the Bayesian learning rule / VON (Khan & Rue 2023, Eq. 12) with natural-gradient step β on the loss
(ℓ_k + ⟨η_k, T(θ)⟩)/ρ and prior q_g. With η_k = (v, −½V) and q = N(m, S⁻¹), (*) reads

    S ← (1 − β) S + β [S_g + (H − V)/ρ]
    m ← m − β S⁻¹ [(g + v − V m)/ρ + S_g (m − m_g)]                                                   (Eqs. 49–52)

where g = E_q[∇ℓ_k], H = E_q[∇²ℓ_k] (diagonals only for the diagonal family). The Monte-Carlo solver takes exactly
these steps.

With the delta method (g = ∇ℓ_k(m), H = ∇²ℓ_k(m)) the mean half of (*) is the stationarity of

    Φ(m) = ℓ_k(m) + vᵀm − ½ mᵀVm + ρ/2 (m − m_g)ᵀ S_g (m − m_g),

and the precision half is S = S_g + (H(m) − V)/ρ (diagonals for the diagonal family, S = s I fixed for the
isotropic one, where V = 0). The duals make Φ non-convex (−½mᵀVm): where the loss flattens out (saturated logistic
regression) Φ can be unbounded below, and plain VON/Newton steps from m_g can jump out of the basin of the local
minimum into that region; this happens in the paper's own logistic-regression experiment with ρ = 1. So the delta
solver is a damped Newton method on Φ whose steps must both decrease Φ (Armijo) and stay where Φ is locally convex,
i.e. where ρ·S = ρS_g + H − V is positive definite (a valid precision); then the precision comes from the
stationarity condition. Its fixed points are those of (*); for the isotropic family this is
Newton's method on the ADMM proximal problem (Eq. 22 with the delta method).

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


def _as_matrix(x: Tensor | float, d: int, like: Tensor) -> Tensor:
    """A precision or dual curvature as a (d, d) matrix: scalars and diagonals are expanded."""
    if not torch.is_tensor(x) or x.dim() == 0:
        return float(x) * torch.eye(d, dtype=like.dtype, device=like.device)
    return torch.diag(x) if x.dim() == 1 else x


@dataclass(frozen=True)
class VON:
    """Variational Online Newton for Eq. 15 (see the module docstring).

    expectation: "delta" (E_q[f] ≈ f(m), Laplace; solved by globalised Newton) or "mc" (mc_samples draws from q per
    iteration; natural-gradient steps of size `step`, halved when a step would leave the valid precisions).
    Iterates until the relative change is below `tol` or `max_iters` iterations; with "mc" the iterates are noisy
    and the solver runs to max_iters unless the tolerance happens to be met.
    """

    expectation: str = "delta"
    mc_samples: int = 1
    step: float = 1.0
    max_iters: int = 100
    tol: float = 1e-12

    def __post_init__(self) -> None:
        check_expectation(self.expectation, self.mc_samples)
        if not 0 < self.step <= 1:
            raise ValueError(f"VON step must be in (0, 1], got {self.step}")

    def solve(self, family, loss, lam_g, eta, rho: float, generator: torch.Generator | None = None,
              init=None, round_: int = 1) -> SolveResult:
        if self.expectation == "delta":
            return self._solve_delta(family, loss, lam_g, eta, rho, init)
        lam = lam_g if init is None else init
        for it in range(1, self.max_iters + 1):
            derivs = expected_derivatives(loss, family, lam, self.expectation, self.mc_samples, generator)
            new = self._natural_step(family, lam, lam_g, eta, rho, derivs)
            change = nat.norm(nat.sub(new, lam)) / max(float(nat.norm(lam)), 1.0)
            lam = new
            if change < self.tol:
                return SolveResult(lam, it, True)
        return SolveResult(lam, self.max_iters, False)

    # -- delta method: globalised Newton on Φ, then the precision from stationarity ----------------------------------

    def _solve_delta(self, family, loss, lam_g, eta, rho, init) -> SolveResult:
        m_g, s_g = family.to_moments(lam_g)
        m = m_g if init is None else family.to_moments(init)[0]
        d = m.shape[0]
        v, V = _split_dual(family, eta)
        V = torch.zeros(d, d, dtype=m.dtype, device=m.device) if V is None else _as_matrix(V, d, m)
        prox = rho * _as_matrix(s_g, d, m)

        def phi(x: Tensor) -> Tensor:
            r = x - m_g
            return loss.value(x) + v @ x - 0.5 * x @ V @ x + 0.5 * r @ prox @ r

        converged, it = False, 0
        for it in range(1, self.max_iters + 1):
            grad = loss.grad(m) + v - V @ m + prox @ (m - m_g)
            direction = -_solve_shifted(loss.hess(m) - V + prox, grad)
            size = float(direction.norm()) / max(float(m.norm()), 1.0)
            t = 1.0
            if size > 1e-6:  # far from a solution: backtrack (near one, Φ's rounding error would stall the search)
                slope, value = float(grad @ direction), phi(m)
                while not (bool(phi(m + t * direction) <= value + 1e-4 * t * slope)
                           and _is_positive_definite(loss.hess(m + t * direction) - V + prox)):
                    t /= 2
                    if t < 1e-10:
                        raise SubproblemError("the client subproblem has no local minimum with a valid precision "
                                              "near q_g (try a larger rho or a smaller dual step)")
            m = m + t * direction
            if size <= self.tol:
                converged = True
                break
        lam = self._precision_from_stationarity(family, loss, m, s_g, eta, rho)
        return SolveResult(lam, it, converged)

    @staticmethod
    def _precision_from_stationarity(family, loss, m, s_g, eta, rho):
        if isinstance(family, IsotropicGaussian):
            return family.from_moments(m)
        v, V = _split_dual(family, eta)
        if isinstance(family, DiagonalGaussian):
            precision = s_g + (loss.hess_diag(m) - V) / rho
        else:
            precision = s_g + (loss.hess(m) - V) / rho
            precision = 0.5 * (precision + precision.T)  # rounding in Xᵀ(wX) is not symmetric; keep λ₂ exactly so
        lam = (precision * m if precision.dim() == 1 else precision @ m, -0.5 * precision)
        if not family.is_valid(lam):
            raise SubproblemError("the client subproblem's solution has no valid precision: the dual curvature "
                                  "exceeds the loss curvature at the local optimum (try a larger rho or a smaller "
                                  "dual step)")
        return lam

    # -- Monte Carlo: the natural-gradient (BLR) step (*) ----------------------------------------------------------------

    def _natural_step(self, family, lam, lam_g, eta, rho, derivs):
        if isinstance(family, IsotropicGaussian):
            return self._newton_mean(family, lam, lam_g, eta, rho, derivs)
        beta = self.step
        for _ in range(30):
            target = nat.sub(lam_g, nat.scale(nat.add(eta, natural_gradient(family, lam, derivs)), 1.0 / rho))
            new = nat.add(nat.scale(lam, 1.0 - beta), nat.scale(target, beta))
            if family.is_valid(new):
                return new
            beta /= 2  # the precision would stop being positive: take a shorter natural-gradient step
        raise SubproblemError("VON could not find a step that keeps the precision positive; the dual curvature "
                              "exceeds the loss curvature (try a smaller dual step or a larger rho)")

    def _newton_mean(self, family, lam, lam_g, eta, rho, derivs):
        """The isotropic family's covariance is fixed, so VON would be plain gradient descent on m: use Newton."""
        s = family.precision
        m, m_g = lam[0] / s, lam_g[0] / s
        g, H = derivs
        grad = g + eta[0] + rho * s * (m - m_g)
        hess = H + rho * s * torch.eye(m.shape[0], dtype=m.dtype, device=m.device)
        return (s * (m - self.step * torch.linalg.solve(hess, grad)),)


def _is_positive_definite(matrix: Tensor) -> bool:
    return int(torch.linalg.cholesky_ex(matrix)[1]) == 0


def _solve_shifted(matrix: Tensor, rhs: Tensor) -> Tensor:
    """Solve (M + τI) x = rhs with the smallest τ ∈ {0, 1e-8, 1e-7, …}·scale that makes M + τI positive definite."""
    eye = torch.eye(matrix.shape[0], dtype=matrix.dtype, device=matrix.device)
    scale = float(matrix.diagonal().abs().max()) or 1.0
    for shift in [0.0] + [scale * 10.0 ** k for k in range(-8, 4)]:
        chol, info = torch.linalg.cholesky_ex(matrix + shift * eye)
        if int(info) == 0:
            return torch.cholesky_solve(rhs[:, None], chol)[:, 0]
    raise SubproblemError("Newton matrix of the client subproblem could not be made positive definite")


@dataclass(frozen=True)
class ExactQuadratic:
    """Closed-form solution of Eq. 15 for ℓ_k(θ) = ½θᵀAθ − bᵀθ + c (no expectation is approximated).

    full:      λ = λ_g + (c_k − η_k)/ρ with c_k = (b, −½A)                     (Prop. D.1 proof)
    diagonal:  s = s_g + (diag A − u)/ρ,  (diag(s) + (A − diag A)/ρ) m = s_g∘m_g + (b − v)/ρ
    isotropic: (A + ρ s I) m = b − v + ρ s m_g
    """

    def solve(self, family, loss, lam_g, eta, rho: float, generator: torch.Generator | None = None,
              init=None, round_: int = 1) -> SolveResult:
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
