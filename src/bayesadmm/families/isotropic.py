"""The isotropic Gaussian family N(m, s⁻¹I) with a fixed, known precision s (see `gaussian.py`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .base import LOG_2PI, GaussianFamily, check_delta, check_tensor
from .natural import Natural


@dataclass(frozen=True)
class IsotropicGaussian(GaussianFamily):
    r"""``N(m, s⁻¹ I)`` with a fixed, known scalar precision ``s``.

    * ``λ = (s m,)``, ``T(θ) = (θ,)``, ``μ = (m,)``
    * ``log h(θ) = −(s/2)‖θ‖² + (d/2) log(s / 2π)``
    * ``A(λ) = ‖λ‖² / (2s)``

    With ``s = 1`` this is the family ``N(m, I)`` from which federated ADMM is
    recovered.
    """

    precision: float = 1.0
    name: ClassVar[str] = "isotropic"

    def __post_init__(self) -> None:
        super().__post_init__()
        s = float(self.precision)
        if not (math.isfinite(s) and s > 0.0):
            raise ValueError(f"precision must be a positive finite number, got {self.precision!r}")
        # Store as a plain float so the family stays hashable and device-free.
        object.__setattr__(self, "precision", s)

    def _shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((self.dim,),)

    def validate(self, lam: Natural) -> None:
        """Raise ValueError unless ``lam`` is a valid natural parameter."""
        self._check_params(lam, "natural parameter")
        if not torch.isfinite(lam[0]).all():
            raise ValueError("natural parameter must be finite")

    def from_moments(self, mean: Tensor, precision: float | Tensor | None = None) -> Natural:
        """``λ = (s m,)``; ``precision`` may only restate the family's fixed ``s``."""
        check_tensor(mean, (self.dim,), "mean")
        if precision is not None:
            if isinstance(precision, Tensor) and precision.numel() != 1:
                raise ValueError("precision of the isotropic family must be a scalar")
            if not math.isclose(float(precision), self.precision, rel_tol=1e-9):
                raise ValueError(f"the isotropic family has fixed precision {self.precision}, got {float(precision)}")
        return (self.precision * mean,)

    def to_moments(self, lam: Natural) -> tuple[Tensor, Tensor]:
        """``(m, s)`` with ``s`` a 0-dim tensor."""
        self._check_params(lam, "natural parameter")
        (lam1,) = lam
        return lam1 / self.precision, lam1.new_tensor(self.precision)

    def to_expectation(self, lam: Natural) -> Natural:
        """``μ = ∇A(λ) = λ / s``."""
        self._check_params(lam, "natural parameter")
        return (lam[0] / self.precision,)

    def from_expectation(self, mu: Natural) -> Natural:
        """``λ = s μ``."""
        self._check_params(mu, "expectation parameter")
        return (self.precision * mu[0],)

    def sufficient_statistics(self, theta: Tensor) -> Natural:
        """``T(θ) = (θ,)``."""
        self._check_theta(theta)
        return (theta,)

    def log_normalizer(self, lam: Natural) -> Tensor:
        """``A(λ) = ‖λ‖² / (2s)``."""
        self._check_params(lam, "natural parameter")
        return lam[0].square().sum() / (2.0 * self.precision)

    def log_base_measure(self, theta: Tensor) -> Tensor:
        """``log h(θ) = −(s/2)‖θ‖² + (d/2) log(s / 2π)``."""
        self._check_theta(theta)
        const = 0.5 * self.dim * (math.log(self.precision) - LOG_2PI)
        return -0.5 * self.precision * theta.square().sum(-1) + const

    def _pairing(self, lam: Natural, theta: Tensor) -> Tensor:
        return theta @ lam[0]

    def entropy(self, lam: Natural) -> Tensor:
        """``H = (d/2)(1 + log 2π − log s)`` (independent of the mean)."""
        self._check_params(lam, "natural parameter")
        return lam[0].new_tensor(0.5 * self.dim * (1.0 + LOG_2PI - math.log(self.precision)))

    def kl(self, lam_q: Natural, lam_p: Natural) -> Tensor:
        """``KL(q‖p) = (s/2)‖m_q − m_p‖² = ‖λ_q − λ_p‖² / (2s)``."""
        self._check_params(lam_q, "natural parameter")
        self._check_params(lam_p, "natural parameter")
        return (lam_q[0] - lam_p[0]).square().sum() / (2.0 * self.precision)

    def sample(self, lam: Natural, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws ``θ = m + ε / √s``, ``ε ~ N(0, I)``; shape ``(n, d)``."""
        mean, _ = self.to_moments(lam)
        return mean + self._noise(mean, n, generator) / math.sqrt(self.precision)

    def second_moment(self, mu: Natural) -> Tensor:
        """``E[θθᵀ] = m mᵀ + I / s``."""
        self._check_params(mu, "expectation parameter")
        (m,) = mu
        eye = torch.eye(self.dim, dtype=m.dtype, device=m.device)
        return torch.outer(m, m) + eye / self.precision

    def prior_terms(self, delta: float, dtype: torch.dtype = torch.float64, device=None) -> tuple[float, Natural]:
        r"""``(c, b)`` with ``∇_μ KL(q ‖ N(0, δ⁻¹ I)) = c λ − b``.

        ``KL(N(m, s⁻¹I) ‖ N(0, δ⁻¹I)) = (δ/2)‖m‖² + const``, whose gradient in
        ``μ = m`` is ``δ m = (δ/s) λ``; hence ``c = δ/s`` and ``b = 0``.
        """
        delta = check_delta(delta)
        return delta / self.precision, self.zeros(dtype=dtype, device=device)

    def initial_natural(self, mean: Tensor, delta: float) -> Natural:
        """``λ = (s m,)``: the precision is the family's own ``s``, whatever ``δ``."""
        return self.from_moments(mean)

    def split_dual(self, eta: Natural) -> tuple[Tensor, Tensor]:
        """``(v, 0)``: the isotropic dual ``η = (v,)`` has no curvature part."""
        return eta[0], eta[0].new_zeros(())

    def as_matrix(self, x: Tensor) -> Tensor:
        """``x I`` for a scalar ``x``."""
        return float(x) * torch.eye(self.dim, dtype=x.dtype, device=x.device)

    def loss_hessian(self, loss, theta: Tensor) -> Tensor:
        """The full Hessian (the Newton step on the mean, ``natural_step``, uses it)."""
        return loss.hess(theta)

    def natural_gradient(self, lam: Natural, derivs: tuple[Tensor, Tensor]) -> Natural:
        """``(g,)``: with a fixed covariance ``μ = m`` and Bonnet's theorem gives ``∇_μ E_q[ℓ] = E_q[∇ℓ]``."""
        self._check_params(lam, "natural parameter")
        return (derivs[0],)

    def natural_step(
        self, lam: Natural, lam_g: Natural, eta: Natural, rho: float, derivs: tuple[Tensor, Tensor], step: float
    ) -> Natural:
        """A damped Newton step of size ``step`` on the mean of the client problem (Eq. 22 in expectation):
        with the covariance fixed the learning-rule step would be plain gradient descent on ``m``.
        ``derivs[1]`` is the full expected Hessian. Always a valid member (for finite inputs)."""
        s = self.precision
        m, m_g = lam[0] / s, lam_g[0] / s
        g, H = derivs
        grad = g + eta[0] + rho * s * (m - m_g)
        hess = H + rho * s * torch.eye(m.shape[0], dtype=m.dtype, device=m.device)
        return (s * (m - step * torch.linalg.solve(hess, grad)),)

    def stationary_natural(self, loss, mean: Tensor, precision_g: Tensor, eta: Natural, rho: float) -> Natural:
        """``(s m,)``: the precision is fixed, only the mean solves the problem."""
        return self.from_moments(mean)

    def quadratic_solution(self, A: Tensor, b: Tensor, lam_g: Natural, eta: Natural, rho: float) -> Natural:
        """``(A + ρ s I) m = b − v + ρ s m_g``."""
        s = self.precision
        m_g = lam_g[0] / s
        eye = torch.eye(b.shape[0], dtype=b.dtype, device=b.device)
        m = torch.linalg.solve(A + rho * s * eye, b - eta[0] + rho * s * m_g)
        return (s * m,)
