"""Local solvers for the BayesADMM client subproblem (Eq. 15) on convex losses.

The subproblem, for a Gaussian family, the client loss ℓ_k, the dual η_k and the broadcast q_g = family(λ_g), is

    q_k = argmin_q  E_q[ℓ_k] + ⟨η_k, μ⟩ + ρ KL(q ‖ q_g).                                              (Eq. 15)

Its stationarity condition (App. C.1, Eq. 32) is ∇_μ L_k(μ) + η_k + ρ(λ − λ_g) = 0, i.e. the fixed point of

    λ ← (1 − β) λ + β [λ_g − (η_k + ∇_μ L_k(μ)) / ρ],                                                (*)

which is the Bayesian learning rule / VON (Khan & Rue 2023, Eq. 12) with natural-gradient step β on the loss
(ℓ_k + ⟨η_k, T(θ)⟩)/ρ and prior q_g. With η_k = (v, −½V) and q = N(m, S⁻¹), (*) reads

    S ← (1 − β) S + β [S_g + (H − V)/ρ]
    m ← m − β S⁻¹ [(g + v − V m)/ρ + S_g (m − m_g)]                                                   (Eqs. 49–52)

where g = E_q[∇ℓ_k], H = E_q[∇²ℓ_k] (diagonals only for the diagonal family). The Monte-Carlo solver
(`MonteCarloVON`) takes exactly these steps (`family.natural_step`).

With the delta method (g = ∇ℓ_k(m), H = ∇²ℓ_k(m)) the mean half of (*) is the stationarity of

    Φ(m) = ℓ_k(m) + vᵀm − ½ mᵀVm + ρ/2 (m − m_g)ᵀ S_g (m − m_g),

and the precision half is S = S_g + (H(m) − V)/ρ (diagonals for the diagonal family, S = s I fixed for the
isotropic one, where V = 0). The duals make Φ non-convex (−½mᵀVm): where the loss flattens out (saturated logistic
regression) Φ can be unbounded below, and plain VON/Newton steps from m_g can jump out of the basin of the local
minimum into that region; this happens in the paper's own logistic-regression experiment with ρ = 1. So the delta
solver (`DeltaVON`) is a damped Newton method on Φ whose steps must both decrease Φ (Armijo) and stay where Φ is
locally convex, i.e. where ρ·S = ρS_g + H − V is positive definite (a valid precision); then the precision comes from
the stationarity condition (`family.stationary_natural`). Its fixed points are those of (*); for the isotropic family
this is Newton's method on the ADMM proximal problem (Eq. 22 with the delta method).

`ExactQuadratic` solves the subproblem in closed form when ℓ_k is quadratic (ℓ = ½θᵀAθ − bᵀθ + c).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from bayesadmm.families import natural as nat
from bayesadmm.problems.expectations import check_expectation, expected_derivatives
from bayesadmm.problems.losses import QuadraticLoss


class SolveResult(NamedTuple):
    natural: tuple[Tensor, ...]
    iterations: int
    converged: bool


class SubproblemError(RuntimeError):
    """The local solver could not produce a valid distribution (e.g. the precision stopped being positive)."""


class VariationalProblem(NamedTuple):
    """One client's problem (Eq. 15) for a BayesADMM solver: family, broadcast λ_g, dual η_k, ρ and the round
    (1-based; solvers may schedule on it, e.g. IVON's cosine step size)."""

    family: Any
    lam_g: tuple[Tensor, ...]
    eta: tuple[Tensor, ...]
    rho: float
    round_: int = 1


class VariationalSolver:
    """The local-solver interface (`algorithms.base.LocalSolver`) of a BayesADMM solver: `solve_problem` on a client's
    `VariationalProblem` is the solver's `solve(family, data, λ_g, η_k, ρ, generator, round_=)`."""

    def solve_problem(self, problem: VariationalProblem, data, generator: torch.Generator | None) -> SolveResult:
        solve = self.solve  # type: ignore[attr-defined]  # each solver's own
        return solve(problem.family, data, problem.lam_g, problem.eta, problem.rho, generator, round_=problem.round_)


@dataclass(frozen=True)
class DeltaVON(VariationalSolver):
    """VON for Eq. 15 with the delta method (E_q[f] ≈ f(m), Laplace): globalised Newton on Φ for the mean, then the
    precision from stationarity (see the module docstring). Iterates until the relative Newton step is below `tol`
    or `max_iters` iterations."""

    max_iters: int = 100
    tol: float = 1e-12

    def solve(
        self, family, loss, lam_g, eta, rho: float, generator: torch.Generator | None = None, init=None, round_: int = 1
    ) -> SolveResult:
        m_g, s_g = family.to_moments(lam_g)
        m = m_g if init is None else family.to_moments(init)[0]
        v, V = family.split_dual(eta)
        V = family.as_matrix(V)
        prox = rho * family.as_matrix(s_g)

        def phi(x: Tensor) -> Tensor:
            r = x - m_g
            return loss.value(x) + v @ x - 0.5 * x @ V @ x + 0.5 * r @ prox @ r

        converged, iterations = False, 0
        while not converged and iterations < self.max_iters:
            iterations += 1
            grad = loss.grad(m) + v - V @ m + prox @ (m - m_g)
            direction = -_solve_shifted(loss.hess(m) - V + prox, grad)
            size = float(direction.norm()) / max(float(m.norm()), 1.0)
            t = 1.0
            if size > 1e-6:  # far from a solution: backtrack (near one, Φ's rounding error would stall the search)
                slope, value = float(grad @ direction), phi(m)
                while not (
                    bool(phi(m + t * direction) <= value + 1e-4 * t * slope)
                    and _is_positive_definite(loss.hess(m + t * direction) - V + prox)
                ):
                    t /= 2
                    if t < 1e-10:
                        raise SubproblemError(
                            "the client subproblem has no local minimum with a valid precision "
                            "near q_g (try a larger rho or a smaller dual step)"
                        )
            m = m + t * direction
            converged = size <= self.tol
        lam = family.stationary_natural(loss, m, s_g, eta, rho)
        if lam is None:
            raise SubproblemError(
                "the client subproblem's solution has no valid precision: the dual curvature "
                "exceeds the loss curvature at the local optimum (try a larger rho or a smaller "
                "dual step)"
            )
        return SolveResult(lam, iterations, converged)


@dataclass(frozen=True)
class MonteCarloVON(VariationalSolver):
    """VON for Eq. 15 with Monte-Carlo expectations: `mc_samples` draws from q per iteration and the natural-gradient
    (BLR) step (*) of size `step`, halved when a step would leave the valid precisions (`family.natural_step`).
    The iterates are noisy: the solver runs to `max_iters` unless the relative change happens to fall below `tol`."""

    mc_samples: int = 1
    step: float = 1.0
    max_iters: int = 100
    tol: float = 1e-12

    def __post_init__(self) -> None:
        check_expectation("mc", self.mc_samples)
        if not 0 < self.step <= 1:
            raise ValueError(f"VON step must be in (0, 1], got {self.step}")

    def solve(
        self, family, loss, lam_g, eta, rho: float, generator: torch.Generator | None = None, init=None, round_: int = 1
    ) -> SolveResult:
        lam = lam_g if init is None else init
        for it in range(1, self.max_iters + 1):
            derivs = expected_derivatives(loss, family, lam, "mc", self.mc_samples, generator)
            new = family.natural_step(lam, lam_g, eta, rho, derivs, self.step)
            if new is None:
                raise SubproblemError(
                    "VON could not find a step that keeps the precision positive; the dual "
                    "curvature exceeds the loss curvature (try a smaller dual step or a larger rho)"
                )
            change = nat.norm(nat.sub(new, lam)) / max(float(nat.norm(lam)), 1.0)
            lam = new
            if change < self.tol:
                return SolveResult(lam, it, True)
        return SolveResult(lam, self.max_iters, False)


def VON(
    expectation: str = "delta", mc_samples: int = 1, step: float = 1.0, max_iters: int = 100, tol: float = 1e-12
) -> DeltaVON | MonteCarloVON:
    """Variational Online Newton for Eq. 15 (see the module docstring), by how it takes expectations:
    "delta" (`DeltaVON`; `mc_samples` and `step` are not used) or "mc" (`MonteCarloVON`)."""
    check_expectation(expectation, mc_samples)
    if not 0 < step <= 1:
        raise ValueError(f"VON step must be in (0, 1], got {step}")
    if expectation == "delta":
        return DeltaVON(max_iters=max_iters, tol=tol)
    return MonteCarloVON(mc_samples=mc_samples, step=step, max_iters=max_iters, tol=tol)


def _is_positive_definite(matrix: Tensor) -> bool:
    return int(torch.linalg.cholesky_ex(matrix)[1]) == 0


def _solve_shifted(matrix: Tensor, rhs: Tensor) -> Tensor:
    """Solve (M + τI) x = rhs with the smallest τ ∈ {0, 1e-8, 1e-7, …}·scale that makes M + τI positive definite."""
    eye = torch.eye(matrix.shape[0], dtype=matrix.dtype, device=matrix.device)
    scale = float(matrix.diagonal().abs().max()) or 1.0
    for shift in [0.0] + [scale * 10.0**k for k in range(-8, 4)]:
        chol, info = torch.linalg.cholesky_ex(matrix + shift * eye)
        if int(info) == 0:
            return torch.cholesky_solve(rhs[:, None], chol)[:, 0]
    raise SubproblemError("Newton matrix of the client subproblem could not be made positive definite")


@dataclass(frozen=True)
class ExactQuadratic(VariationalSolver):
    """Closed-form solution of Eq. 15 for ℓ_k(θ) = ½θᵀAθ − bᵀθ + c (no expectation is approximated), by the family
    (`quadratic_solution`):

    full:      λ = λ_g + (c_k − η_k)/ρ with c_k = (b, −½A)                     (Prop. D.1 proof)
    diagonal:  s = s_g + (diag A − u)/ρ,  (diag(s) + (A − diag A)/ρ) m = s_g∘m_g + (b − v)/ρ
    isotropic: (A + ρ s I) m = b − v + ρ s m_g
    """

    def solve(
        self, family, loss, lam_g, eta, rho: float, generator: torch.Generator | None = None, init=None, round_: int = 1
    ) -> SolveResult:
        if not isinstance(loss, QuadraticLoss):
            raise TypeError(f"ExactQuadratic needs a QuadraticLoss, got {type(loss).__name__}")
        lam = family.quadratic_solution(loss.A, loss.b, lam_g, eta, rho)
        if not family.is_valid(lam):
            raise SubproblemError(
                "the exact solution of the client subproblem is not a valid Gaussian "
                "(the dual curvature exceeds the loss curvature)"
            )
        return SolveResult(lam, 1, True)
