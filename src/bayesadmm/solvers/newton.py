"""Newton's method for the point-estimate proximal subproblem of federated ADMM (Eq. 5):

    θ_k = argmin_θ  ℓ_k(θ) + vᵀθ + ρ/2 ‖θ − θ_g‖².

Damped (Armijo) Newton steps; on a quadratic loss the first step is exact. Newton is what the convex experiments need
(they compare algorithms, so their local solves must be converged); stochastic solvers for neural networks live
elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor


class PointResult(NamedTuple):
    theta: Tensor
    iterations: int
    converged: bool


class ProxProblem(NamedTuple):
    """One client's problem (Eq. 5) for a proximal solver (`ProxNewton`, `solvers.adam.LocalAdamProx`): dual v,
    proximal weight ρ, centre θ_g."""

    v: Tensor
    rho: float
    center: Tensor


@dataclass(frozen=True)
class ProxNewton:
    max_iters: int = 100
    tol: float = 1e-12

    def minimize(
        self,
        loss,
        v: Tensor,
        rho: float,
        center: Tensor,
        init: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> PointResult:
        """Solve Eq. 5 from `init` (default: the centre). Deterministic: `generator` is accepted and ignored, so that
        ProxNewton and the stochastic solvers (`solvers.adam.LocalAdamProx`) are interchangeable in `admm.make`."""
        theta = center if init is None else init
        eye = torch.eye(theta.shape[0], dtype=theta.dtype, device=theta.device)

        def objective(x: Tensor) -> Tensor:
            return loss.value(x) + v @ x + 0.5 * rho * (x - center).square().sum()

        for it in range(1, self.max_iters + 1):
            grad = loss.grad(theta) + v + rho * (theta - center)
            direction = -torch.linalg.solve(loss.hess(theta) + rho * eye, grad)
            size = float(direction.norm()) / max(float(theta.norm()), 1.0)
            t = 1.0
            if size > 1e-6:  # pure Newton overshoots on logistic losses far from the optimum: backtrack (Armijo)
                slope, value = float(grad @ direction), objective(theta)
                while t > 1e-10 and not bool(objective(theta + t * direction) <= value + 1e-4 * t * slope):
                    t /= 2
            theta = theta + t * direction
            if size <= self.tol:
                return PointResult(theta, it, True)
        return PointResult(theta, self.max_iters, False)

    def solve_problem(self, problem: ProxProblem, loss, generator: torch.Generator | None = None) -> PointResult:
        """`minimize` on a client's problem (its `ProxProblem`), from the centre."""
        return self.minimize(loss, problem.v, problem.rho, problem.center, generator=generator)
