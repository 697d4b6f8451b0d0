r"""Gaussian exponential families stored in natural parameters.

A member of a family is the density

    q(θ) = h(θ) exp(<λ, T(θ)> − A(λ)),        θ ∈ R^d,

represented only by its natural parameter ``λ`` (a tuple of tensors, see
:mod:`bayesadmm.families.natural`).  The expectation parameter is
``μ = E_q[T(θ)] = ∇A(λ)``, and the maps ``λ ↦ μ`` (:meth:`to_expectation`) and
``μ ↦ λ`` (:meth:`from_expectation`) are mutual inverses.  Because
``KL(q‖p)`` is the Bregman divergence of ``A``,

    KL(q‖p) = A(λ_p) − A(λ_q) − <μ_q, λ_p − λ_q>,
    ∇_{μ_q} KL(q‖p) = λ_q − λ_p,

which is the identity that turns natural-gradient / ADMM updates on ``μ`` into
additive updates on ``λ``.

Three families are provided, all with identical method names and signatures:

==================  ==================  ============  ==========================
family              λ                   T(θ)          μ
==================  ==================  ============  ==========================
IsotropicGaussian   (s m,)              (θ,)          (m,)
DiagonalGaussian    (s∘m, −½ s)         (θ, θ²)       (m, m² + 1/s)
FullGaussian        (S m, −½ S)         (θ, θθᵀ)      (m, m mᵀ + S⁻¹)
==================  ==================  ============  ==========================

``IsotropicGaussian`` has a *fixed*, known scalar precision ``s`` that is part
of the family (its base measure), not a parameter.  For the other two the base
measure is constant, ``h ≡ 1``, and the ``(2π)^{-d/2}`` factor lives in ``A``.

Families are frozen dataclasses holding only the dimension (and, for the
isotropic family, ``s``); every method is a pure function of its tensor
arguments and works in the dtype/device of those arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.checks import all_positive

from .natural import Natural

__all__ = [
    "GaussianFamily",
    "IsotropicGaussian",
    "DiagonalGaussian",
    "FullGaussian",
    "Posterior",
    "make_family",
]

_LOG_2PI = math.log(2.0 * math.pi)


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------


def _check_tensor(x: object, shape: tuple[int, ...], what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{what} must have a floating-point dtype, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{what} must have shape {shape}, got {tuple(x.shape)}")
    return x


def _check_symmetric(m: Tensor, what: str) -> None:
    # Arithmetic on symmetric matrices may leave rounding-level asymmetry, so
    # compare with a tolerance relative to the size of the entries.
    scale = max(1.0, m.detach().abs().max().item())
    tol = math.sqrt(torch.finfo(m.dtype).eps) * scale
    if (m - m.mT).detach().abs().max().item() > tol:
        raise ValueError(f"{what} must be symmetric")


def _cholesky(m: Tensor, what: str) -> Tensor:
    """Lower Cholesky factor of ``m``, or ValueError if ``m`` is not PD."""
    factor, info = torch.linalg.cholesky_ex(m)
    if info.item() != 0:
        raise ValueError(f"{what} must be positive definite")
    return factor


def _sym(m: Tensor) -> Tensor:
    return 0.5 * (m + m.mT)


# ---------------------------------------------------------------------------
# families
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GaussianFamily:
    """Common interface and shared code of the Gaussian families.

    Subclasses implement the family-specific algebra; this base class holds
    the dimension, layout checks and the parts that follow directly from the
    exponential-family form (``log_prob``, ``zeros``).
    """

    dim: int
    name: ClassVar[str]

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim must be a positive integer, got {self.dim!r}")

    # -- layout -------------------------------------------------------------

    def _shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes of the tuple components (shared by λ, μ and duals η)."""
        raise NotImplementedError

    def _check_params(self, params: Natural, what: str) -> None:
        shapes = self._shapes()
        if not isinstance(params, (tuple, list)) or len(params) != len(shapes):
            raise ValueError(
                f"{what} of the {self.name} family must be a tuple of {len(shapes)} tensors"
            )
        for k, (x, shape) in enumerate(zip(params, shapes)):
            _check_tensor(x, shape, f"{what}[{k}]")

    def _check_theta(self, theta: Tensor) -> None:
        if not isinstance(theta, Tensor) or theta.dim() < 1 or theta.shape[-1] != self.dim:
            shape = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"theta must have shape (..., {self.dim}), got {shape}")

    def is_valid(self, lam: Natural) -> bool:
        """``True`` iff :meth:`validate` accepts ``lam`` (e.g. to reject a step)."""
        try:
            self.validate(lam)
        except ValueError:
            return False
        return True

    def zeros(self, dtype: torch.dtype = torch.float64, device=None) -> Natural:
        """All-zero tuple with this family's layout (e.g. an initial dual variable)."""
        return tuple(torch.zeros(shape, dtype=dtype, device=device) for shape in self._shapes())

    # -- densities ------------------------------------------------------------

    def _pairing(self, lam: Natural, theta: Tensor) -> Tensor:
        """``<λ, T(θ)>`` for ``θ`` of shape ``(..., d)``, returning shape ``(...)``."""
        raise NotImplementedError

    def log_prob(self, lam: Natural, theta: Tensor) -> Tensor:
        """``log q(θ) = <λ, T(θ)> − A(λ) + log h(θ)`` for ``θ`` of shape ``(..., d)``."""
        self._check_theta(theta)
        log_norm = self.log_normalizer(lam)  # validates lam before it is used
        return self._pairing(lam, theta) - log_norm + self.log_base_measure(theta)

    # -- randomness -----------------------------------------------------------

    def _noise(self, like: Tensor, n: int, generator: torch.Generator | None) -> Tensor:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"number of samples must be a non-negative integer, got {n!r}")
        return rng.randn((n, self.dim), generator, like.dtype, like.device)


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
        _check_tensor(mean, (self.dim,), "mean")
        if precision is not None:
            if isinstance(precision, Tensor) and precision.numel() != 1:
                raise ValueError("precision of the isotropic family must be a scalar")
            if not math.isclose(float(precision), self.precision, rel_tol=1e-9):
                raise ValueError(
                    f"the isotropic family has fixed precision {self.precision}, got {float(precision)}"
                )
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
        const = 0.5 * self.dim * (math.log(self.precision) - _LOG_2PI)
        return -0.5 * self.precision * theta.square().sum(-1) + const

    def _pairing(self, lam: Natural, theta: Tensor) -> Tensor:
        return theta @ lam[0]

    def entropy(self, lam: Natural) -> Tensor:
        """``H = (d/2)(1 + log 2π − log s)`` (independent of the mean)."""
        self._check_params(lam, "natural parameter")
        return lam[0].new_tensor(0.5 * self.dim * (1.0 + _LOG_2PI - math.log(self.precision)))

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

    def prior_terms(
        self, delta: float, dtype: torch.dtype = torch.float64, device=None
    ) -> tuple[float, Natural]:
        r"""``(c, b)`` with ``∇_μ KL(q ‖ N(0, δ⁻¹ I)) = c λ − b``.

        ``KL(N(m, s⁻¹I) ‖ N(0, δ⁻¹I)) = (δ/2)‖m‖² + const``, whose gradient in
        ``μ = m`` is ``δ m = (δ/s) λ``; hence ``c = δ/s`` and ``b = 0``.
        """
        delta = _check_delta(delta)
        return delta / self.precision, self.zeros(dtype=dtype, device=device)


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
        _check_tensor(mean, (self.dim,), "mean")
        if precision is None:
            raise ValueError("the diagonal family needs a precision vector of shape (d,)")
        _check_tensor(precision, (self.dim,), "precision")
        if not all_positive(precision):
            raise ValueError("precision must be positive")
        return (precision * mean, -0.5 * precision)

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
        return 0.5 * (lam[0].square() / s - torch.log(s)).sum() + 0.5 * self.dim * _LOG_2PI

    def log_base_measure(self, theta: Tensor) -> Tensor:
        """``log h(θ) = 0``."""
        self._check_theta(theta)
        return theta.new_zeros(theta.shape[:-1])

    def _pairing(self, lam: Natural, theta: Tensor) -> Tensor:
        return theta @ lam[0] + theta.square() @ lam[1]

    def entropy(self, lam: Natural) -> Tensor:
        """``H = ½ Σ_i (1 + log 2π − log sᵢ)``."""
        s = self._precision(lam)
        return 0.5 * (1.0 + _LOG_2PI - torch.log(s)).sum()

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

    def prior_terms(
        self, delta: float, dtype: torch.dtype = torch.float64, device=None
    ) -> tuple[float, Natural]:
        r"""``(c, b)`` with ``∇_μ KL(q ‖ N(0, δ⁻¹ I)) = c λ − b``.

        The prior is in the family and ``h`` is constant, so the Bregman
        identity gives ``∇_μ KL(q‖p) = λ − λ_p``: ``c = 1``,
        ``b = λ_p = (0, −(δ/2) 1)``.
        """
        delta = _check_delta(delta)
        zero = torch.zeros(self.dim, dtype=dtype, device=device)
        return 1.0, (zero, torch.full_like(zero, -0.5 * delta))


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
        _check_symmetric(lam[1], "natural parameter λ[1]")
        s = -(lam[1] + lam[1].mT)
        return s, _cholesky(s, "natural parameter: −2·λ[1]")

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
        _check_tensor(mean, (self.dim,), "mean")
        if precision is None:
            raise ValueError("the full family needs a precision matrix of shape (d, d)")
        _check_tensor(precision, (self.dim, self.dim), "precision")
        _check_symmetric(precision, "precision")
        s = _sym(precision)
        _cholesky(s, "precision")
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
        return (m, _sym(torch.outer(m, m) + cov))

    def from_expectation(self, mu: Natural) -> Natural:
        """``Σ = μ₂ − μ₁μ₁ᵀ``, ``S = Σ⁻¹``, ``λ = (S μ₁, −½ S)``."""
        self._check_params(mu, "expectation parameter")
        _check_symmetric(mu[1], "expectation parameter μ[1]")
        cov = _sym(mu[1]) - torch.outer(mu[0], mu[0])
        factor = _cholesky(cov, "expectation parameter: μ[1] − μ[0]μ[0]ᵀ")
        s = _sym(torch.cholesky_inverse(factor))
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
        return 0.5 * white.square().sum() - half_logdet + 0.5 * self.dim * _LOG_2PI

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
        return 0.5 * self.dim * (1.0 + _LOG_2PI) - torch.log(torch.diagonal(factor)).sum()

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
        return _sym(mu[1])

    def prior_terms(
        self, delta: float, dtype: torch.dtype = torch.float64, device=None
    ) -> tuple[float, Natural]:
        r"""``(c, b)`` with ``∇_μ KL(q ‖ N(0, δ⁻¹ I)) = c λ − b``.

        The prior is in the family and ``h`` is constant, so ``c = 1`` and
        ``b = λ_p = (0, −(δ/2) I)``.
        """
        delta = _check_delta(delta)
        eye = torch.eye(self.dim, dtype=dtype, device=device)
        return 1.0, (torch.zeros(self.dim, dtype=dtype, device=device), -0.5 * delta * eye)


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not (math.isfinite(delta) and delta > 0.0):
        raise ValueError(f"prior precision delta must be a positive finite number, got {delta!r}")
    return delta


# ---------------------------------------------------------------------------
# convenience
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Posterior:
    """A family together with one valid natural parameter (e.g. a trained posterior)."""

    family: GaussianFamily
    natural: Natural

    def __post_init__(self) -> None:
        self.family.validate(self.natural)

    @property
    def mean(self) -> Tensor:
        return self.family.to_moments(self.natural)[0]

    @property
    def precision(self) -> Tensor:
        """0-dim (isotropic), ``(d,)`` (diagonal) or ``(d, d)`` (full)."""
        return self.family.to_moments(self.natural)[1]

    @property
    def expectation(self) -> Natural:
        return self.family.to_expectation(self.natural)

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        return self.family.sample(self.natural, n, generator)

    def log_prob(self, theta: Tensor) -> Tensor:
        return self.family.log_prob(self.natural, theta)


_FAMILIES: dict[str, type[GaussianFamily]] = {
    cls.name: cls for cls in (IsotropicGaussian, DiagonalGaussian, FullGaussian)
}


def make_family(name: str, dim: int, **kw) -> GaussianFamily:
    """Family by name (``"isotropic"``, ``"diagonal"`` or ``"full"``); ``kw`` go to its constructor."""
    try:
        cls = _FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"unknown family {name!r}; valid names: {', '.join(sorted(_FAMILIES))}"
        ) from None
    return cls(dim, **kw)
