"""The full-covariance Gaussian family N(m, S⁻¹) (see `gaussian.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from . import natural as nat
from .base import LOG_2PI, GaussianFamily, check_delta, check_symmetric, check_tensor, cholesky, sym
from .natural import Natural


@dataclass(frozen=True)
class FullGaussian(GaussianFamily):
    r"""``N(m, S⁻¹)`` with a symmetric positive-definite precision matrix ``S``.

    * ``λ = (S m, −½ S)`` with ``λ₂`` symmetric, ``T(θ) = (θ, θθᵀ)``,
      ``<λ, T(θ)> = λ₁ᵀθ + Σ_ij λ₂ᵢⱼ θᵢθⱼ``, ``μ = (m, m mᵀ + S⁻¹)``
    * ``h ≡ 1`` and, writing ``S = −2λ₂ = L Lᵀ``,
      ``A(λ) = ½ λ₁ᵀ S⁻¹ λ₁ − ½ log det S + (d/2) log 2π``

    All computations read ``λ₂`` through its symmetric part
    ``S = −(λ₂ + λ₂ᵀ)``.  ``<λ₂, θθᵀ>`` only sees that part, and doing the same
    in ``A`` makes autograd return the symmetric gradient ``∇_{λ₂} A = μ₂``.
    """

    name: ClassVar[str] = "full"

    def _shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((self.dim,), (self.dim, self.dim))

    def _precision_factor(self, lam: Natural) -> tuple[Tensor, Tensor]:
        """``(S, L)`` with ``S = −2 sym(λ₂)`` and ``S = L Lᵀ``; ValueError if not PD."""
        self._check_params(lam, "natural parameter")
        check_symmetric(lam[1], "natural parameter λ[1]")
        s = -(lam[1] + lam[1].mT)
        return s, cholesky(s, "natural parameter: −2·λ[1]")

    def validate(self, lam: Natural) -> None:
        """Raise ValueError unless ``lam`` is a valid natural parameter."""
        self._precision_factor(lam)
        if not torch.isfinite(lam[0]).all():
            raise ValueError("natural parameter must be finite")

    @staticmethod
    def _mean(lam1: Tensor, factor: Tensor) -> Tensor:
        """``m = S⁻¹ λ₁`` by two triangular solves."""
        return torch.cholesky_solve(lam1.unsqueeze(-1), factor).squeeze(-1)

    def from_moments(self, mean: Tensor, precision: Tensor | None = None) -> Natural:
        """``λ = (S m, −½ S)`` from mean ``(d,)`` and SPD precision matrix ``(d, d)``."""
        check_tensor(mean, (self.dim,), "mean")
        if precision is None:
            raise ValueError("the full family needs a precision matrix of shape (d, d)")
        check_tensor(precision, (self.dim, self.dim), "precision")
        check_symmetric(precision, "precision")
        s = sym(precision)
        cholesky(s, "precision")
        return (s @ mean, -0.5 * s)

    def to_moments(self, lam: Natural) -> tuple[Tensor, Tensor]:
        """``(m, S)`` with ``S = −2λ₂`` and ``m = S⁻¹ λ₁``."""
        s, factor = self._precision_factor(lam)
        return self._mean(lam[0], factor), s

    def to_expectation(self, lam: Natural) -> Natural:
        """``μ = (m, m mᵀ + S⁻¹)``."""
        _, factor = self._precision_factor(lam)
        m = self._mean(lam[0], factor)
        cov = torch.cholesky_inverse(factor)
        return (m, sym(torch.outer(m, m) + cov))

    def from_expectation(self, mu: Natural) -> Natural:
        """``Σ = μ₂ − μ₁μ₁ᵀ``, ``S = Σ⁻¹``, ``λ = (S μ₁, −½ S)``."""
        self._check_params(mu, "expectation parameter")
        check_symmetric(mu[1], "expectation parameter μ[1]")
        cov = sym(mu[1]) - torch.outer(mu[0], mu[0])
        factor = cholesky(cov, "expectation parameter: μ[1] − μ[0]μ[0]ᵀ")
        s = sym(torch.cholesky_inverse(factor))
        return (s @ mu[0], -0.5 * s)

    def sufficient_statistics(self, theta: Tensor) -> Natural:
        """``T(θ) = (θ, θθᵀ)``; batch dims are kept: ``(..., d)`` and ``(..., d, d)``."""
        self._check_theta(theta)
        return (theta, theta.unsqueeze(-1) * theta.unsqueeze(-2))

    def log_normalizer(self, lam: Natural) -> Tensor:
        """``A(λ) = ½ ‖L⁻¹λ₁‖² − Σ_i log Lᵢᵢ + (d/2) log 2π`` with ``−2λ₂ = L Lᵀ``."""
        _, factor = self._precision_factor(lam)
        white = torch.linalg.solve_triangular(factor, lam[0].unsqueeze(-1), upper=False)
        half_logdet = torch.log(torch.diagonal(factor)).sum()
        return 0.5 * white.square().sum() - half_logdet + 0.5 * self.dim * LOG_2PI

    def log_base_measure(self, theta: Tensor) -> Tensor:
        """``log h(θ) = 0``."""
        self._check_theta(theta)
        return theta.new_zeros(theta.shape[:-1])

    def _pairing(self, lam: Natural, theta: Tensor) -> Tensor:
        # einsum avoids materialising θθᵀ for every sample.
        return theta @ lam[0] + torch.einsum("...i,ij,...j->...", theta, lam[1], theta)

    def entropy(self, lam: Natural) -> Tensor:
        """``H = (d/2)(1 + log 2π) − ½ log det S``."""
        _, factor = self._precision_factor(lam)
        return 0.5 * self.dim * (1.0 + LOG_2PI) - torch.log(torch.diagonal(factor)).sum()

    def kl(self, lam_q: Natural, lam_p: Natural) -> Tensor:
        r"""``KL(q‖p) = ½[tr(S_p S_q⁻¹) + (m_p − m_q)ᵀ S_p (m_p − m_q) − d + log det S_q − log det S_p]``.

        With ``S = L Lᵀ``: ``tr(S_p S_q⁻¹) = ‖L_q⁻¹ L_p‖_F²`` and the quadratic
        term is ``‖L_pᵀ (m_p − m_q)‖²``, so no inverse is formed.
        """
        _, factor_q = self._precision_factor(lam_q)
        _, factor_p = self._precision_factor(lam_p)
        diff = self._mean(lam_p[0], factor_p) - self._mean(lam_q[0], factor_q)
        trace = torch.linalg.solve_triangular(factor_q, factor_p, upper=False).square().sum()
        quad = (factor_p.mT @ diff).square().sum()
        half_logdet_q = torch.log(torch.diagonal(factor_q)).sum()
        half_logdet_p = torch.log(torch.diagonal(factor_p)).sum()
        return 0.5 * (trace + quad - self.dim) + half_logdet_q - half_logdet_p

    def sample(self, lam: Natural, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws ``θ = m + L⁻ᵀ ε`` with ``S = L Lᵀ``, ``ε ~ N(0, I)``; shape ``(n, d)``.

        ``Cov(L⁻ᵀε) = L⁻ᵀL⁻¹ = S⁻¹``.  Row-wise, ``εᵀ L⁻¹`` is one triangular
        solve ``X L = E``.
        """
        _, factor = self._precision_factor(lam)
        m = self._mean(lam[0], factor)
        eps = self._noise(m, n, generator)
        return m + torch.linalg.solve_triangular(factor, eps, upper=False, left=False)

    def second_moment(self, mu: Natural) -> Tensor:
        """``E[θθᵀ] = μ₂`` (returned symmetrised, as a new tensor)."""
        self._check_params(mu, "expectation parameter")
        return sym(mu[1])

    def prior_terms(self, delta: float, dtype: torch.dtype = torch.float64, device=None) -> tuple[float, Natural]:
        r"""``(c, b)`` with ``∇_μ KL(q ‖ N(0, δ⁻¹ I)) = c λ − b``.

        The prior is in the family and ``h`` is constant, so ``c = 1`` and
        ``b = λ_p = (0, −(δ/2) I)``.
        """
        delta = check_delta(delta)
        eye = torch.eye(self.dim, dtype=dtype, device=device)
        return 1.0, (torch.zeros(self.dim, dtype=dtype, device=device), -0.5 * delta * eye)

    def initial_natural(self, mean: Tensor, delta: float) -> Natural:
        """Mean ``mean``, precision ``δ I``."""
        return self.from_moments(mean, delta * torch.eye(mean.shape[0], dtype=mean.dtype, device=mean.device))

    def split_dual(self, eta: Natural) -> tuple[Tensor, Tensor]:
        """``(v, V)`` with ``V = −2η₂``."""
        return eta[0], -2.0 * eta[1]

    def as_matrix(self, x: Tensor) -> Tensor:
        """``x`` itself."""
        return x

    def loss_hessian(self, loss, theta: Tensor) -> Tensor:
        """The full Hessian."""
        return loss.hess(theta)

    def natural_gradient(self, lam: Natural, derivs: tuple[Tensor, Tensor]) -> Natural:
        """``(g − H m, ½ H)``."""
        mean, _ = self.to_moments(lam)
        g, H = derivs
        return (g - H @ mean, 0.5 * H)

    def stationary_natural(self, loss, mean: Tensor, precision_g: Tensor, eta: Natural, rho: float) -> Natural | None:
        """``S = S_g + (∇²ℓ(m) − V)/ρ``, symmetrised."""
        _, V = self.split_dual(eta)
        precision = precision_g + (loss.hess(mean) - V) / rho
        precision = 0.5 * (precision + precision.T)  # rounding in Xᵀ(wX) is not symmetric; keep λ₂ exactly so
        lam = (precision @ mean, -0.5 * precision)
        return lam if self.is_valid(lam) else None

    def quadratic_solution(self, A: Tensor, b: Tensor, lam_g: Natural, eta: Natural, rho: float) -> Natural:
        """``λ = λ_g + (c_k − η)/ρ`` with ``c_k = (b, −½A)`` (proof of Prop. D.1)."""
        return nat.add(lam_g, nat.scale(nat.sub((b, -0.5 * A), eta), 1.0 / rho))
