"""The diagonal Gaussian family N(m, diag(s)⁻¹) (see `gaussian.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from bayesadmm.checks import all_positive

from .base import LOG_2PI, GaussianFamily, check_delta, check_tensor
from .natural import Natural


@dataclass(frozen=True)
class DiagonalGaussian(GaussianFamily):
    r"""``N(m, diag(s)⁻¹)`` with a precision vector ``s > 0``.

    * ``λ = (s∘m, −½ s)``, ``T(θ) = (θ, θ²)``, ``μ = (m, m² + 1/s)``
    * ``h ≡ 1`` and, writing ``s = −2λ₂``,
      ``A(λ) = Σ_i [λ₁ᵢ² / (2 sᵢ) − ½ log sᵢ] + (d/2) log 2π``
    """

    name: ClassVar[str] = "diagonal"

    def _shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((self.dim,), (self.dim,))

    def _precision(self, lam: Natural) -> Tensor:
        """``s = −2λ₂`` after checking that it is positive."""
        self._check_params(lam, "natural parameter")
        s = -2.0 * lam[1]
        if not all_positive(s):
            raise ValueError("natural parameter is invalid: −2·λ[1] must be positive")
        return s

    def validate(self, lam: Natural) -> None:
        """Raise ValueError unless ``lam`` is a valid natural parameter."""
        self._precision(lam)
        if not (torch.isfinite(lam[0]).all() and torch.isfinite(lam[1]).all()):
            raise ValueError("natural parameter must be finite")

    def from_moments(self, mean: Tensor, precision: Tensor | None = None) -> Natural:
        """``λ = (s∘m, −½ s)`` from mean ``(d,)`` and precision vector ``(d,)``."""
        check_tensor(mean, (self.dim,), "mean")
        if precision is None:
            raise ValueError("the diagonal family needs a precision vector of shape (d,)")
        check_tensor(precision, (self.dim,), "precision")
        if not all_positive(precision):
            raise ValueError("precision must be positive")
        return (precision * mean, -0.5 * precision)

    def floored(self, lam: Natural, floor: float, mean: Tensor) -> tuple[Natural, float]:
        """``λ`` with every coordinate whose precision ``sᵢ`` is below ``floor`` (non-positive ones included) set to
        ``N(meanᵢ, 1/floor)``, and the fraction of coordinates set. Keeping ``λ₁ᵢ`` there instead would put the mean
        at ``λ₁ᵢ / floor``, far from anything the data said where ``sᵢ`` was small only by noise."""
        low = -2.0 * lam[1] < floor
        return (
            torch.where(low, floor * mean, lam[0]),
            torch.where(low, torch.full_like(lam[1], -0.5 * floor), lam[1]),
        ), float(low.double().mean())

    def kept_where_invalid(self, lam: Natural, original: Natural) -> tuple[Natural, int]:
        """``lam`` with ``original``'s ``(λ₁ᵢ, λ₂ᵢ)`` on every coordinate whose precision ``−2λ₂ᵢ`` is not positive or
        either half not finite, and how many coordinates were kept."""
        self._check_params(lam, "natural parameter")
        bad = ~((-2.0 * lam[1] > 0) & torch.isfinite(lam[0]) & torch.isfinite(lam[1]))
        kept = tuple(torch.where(bad, old, new) for old, new in zip(original, lam, strict=True))
        return (kept[0], kept[1]), int(bad.sum())

    def to_moments(self, lam: Natural) -> tuple[Tensor, Tensor]:
        """``(m, s)`` with ``s = −2λ₂`` and ``m = λ₁ / s``."""
        s = self._precision(lam)
        return lam[0] / s, s

    def to_expectation(self, lam: Natural) -> Natural:
        """``μ = (m, m² + 1/s)``."""
        m, s = self.to_moments(lam)
        return (m, m.square() + 1.0 / s)

    def from_expectation(self, mu: Natural) -> Natural:
        """``s = 1 / (μ₂ − μ₁²)``, ``λ = (s μ₁, −½ s)``."""
        self._check_params(mu, "expectation parameter")
        var = mu[1] - mu[0].square()
        if not bool((var > 0).all()):
            raise ValueError("expectation parameter is invalid: μ[1] − μ[0]² must be positive")
        s = 1.0 / var
        return (s * mu[0], -0.5 * s)

    def sufficient_statistics(self, theta: Tensor) -> Natural:
        """``T(θ) = (θ, θ²)`` (elementwise square)."""
        self._check_theta(theta)
        return (theta, theta.square())

    def log_normalizer(self, lam: Natural) -> Tensor:
        """``A(λ) = Σ_i [λ₁ᵢ² / (2 sᵢ) − ½ log sᵢ] + (d/2) log 2π`` with ``s = −2λ₂``."""
        s = self._precision(lam)
        return 0.5 * (lam[0].square() / s - torch.log(s)).sum() + 0.5 * self.dim * LOG_2PI

    def log_base_measure(self, theta: Tensor) -> Tensor:
        """``log h(θ) = 0``."""
        self._check_theta(theta)
        return theta.new_zeros(theta.shape[:-1])

    def _pairing(self, lam: Natural, theta: Tensor) -> Tensor:
        return theta @ lam[0] + theta.square() @ lam[1]

    def entropy(self, lam: Natural) -> Tensor:
        """``H = ½ Σ_i (1 + log 2π − log sᵢ)``."""
        s = self._precision(lam)
        return 0.5 * (1.0 + LOG_2PI - torch.log(s)).sum()

    def kl(self, lam_q: Natural, lam_p: Natural) -> Tensor:
        """``KL(q‖p) = ½ Σ_i [s_pᵢ/s_qᵢ + s_pᵢ (m_pᵢ − m_qᵢ)² − 1 + log s_qᵢ − log s_pᵢ]``."""
        m_q, s_q = self.to_moments(lam_q)
        m_p, s_p = self.to_moments(lam_p)
        ratio = s_p / s_q
        return 0.5 * (ratio + s_p * (m_p - m_q).square() - 1.0 - torch.log(ratio)).sum()

    def sample(self, lam: Natural, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws ``θ = m + ε / √s``, ``ε ~ N(0, I)``; shape ``(n, d)``."""
        m, s = self.to_moments(lam)
        return m + self._noise(m, n, generator) / torch.sqrt(s)

    def second_moment(self, mu: Natural) -> Tensor:
        """``E[θθᵀ]``: ``m mᵀ`` off the diagonal, ``μ₂`` on it."""
        self._check_params(mu, "expectation parameter")
        return torch.diagonal_scatter(torch.outer(mu[0], mu[0]), mu[1])

    def prior_terms(self, delta: float, dtype: torch.dtype = torch.float64, device=None) -> tuple[float, Natural]:
        r"""``(c, b)`` with ``∇_μ KL(q ‖ N(0, δ⁻¹ I)) = c λ − b``.

        The prior is in the family and ``h`` is constant, so the Bregman
        identity gives ``∇_μ KL(q‖p) = λ − λ_p``: ``c = 1``,
        ``b = λ_p = (0, −(δ/2) 1)``.
        """
        delta = check_delta(delta)
        zero = torch.zeros(self.dim, dtype=dtype, device=device)
        return 1.0, (zero, torch.full_like(zero, -0.5 * delta))

    def initial_natural(self, mean: Tensor, delta: float) -> Natural:
        """Mean ``mean``, precision ``δ 1``."""
        return self.from_moments(mean, torch.full_like(mean, delta))

    def split_dual(self, eta: Natural) -> tuple[Tensor, Tensor]:
        """``(v, u)`` with ``u = −2η₂`` the diagonal dual curvature."""
        return eta[0], -2.0 * eta[1]

    def as_matrix(self, x: Tensor) -> Tensor:
        """``diag(x)``."""
        return torch.diag(x)

    def loss_hessian(self, loss, theta: Tensor) -> Tensor:
        """The Hessian's diagonal (``loss.hess_diag``)."""
        return loss.hess_diag(theta)

    def natural_gradient(self, lam: Natural, derivs: tuple[Tensor, Tensor]) -> Natural:
        """``(g − h∘m, ½ h)`` with ``h`` the expected Hessian's diagonal."""
        mean, _ = self.to_moments(lam)
        g, H = derivs
        return (g - H * mean, 0.5 * H)

    def stationary_natural(self, loss, mean: Tensor, precision_g: Tensor, eta: Natural, rho: float) -> Natural | None:
        """``s = s_g + (diag ∇²ℓ(m) − u)/ρ``."""
        _, u = self.split_dual(eta)
        precision = precision_g + (loss.hess_diag(mean) - u) / rho
        lam = (precision * mean, -0.5 * precision)
        return lam if self.is_valid(lam) else None

    def quadratic_solution(self, A: Tensor, b: Tensor, lam_g: Natural, eta: Natural, rho: float) -> Natural:
        """``s = s_g + (diag A − u)/ρ``, ``(diag(s) + (A − diag A)/ρ) m = s_g∘m_g + (b − v)/ρ``."""
        v, u = self.split_dual(eta)
        m_g, s_g = self.to_moments(lam_g)
        a = torch.diagonal(A)
        s = s_g + (a - u) / rho
        system = torch.diag(s) + (A - torch.diag(a)) / rho
        m = torch.linalg.solve(system, s_g * m_g + (b - v) / rho)
        return (s * m, -0.5 * s)
