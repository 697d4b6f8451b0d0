"""The interface of the Gaussian families (`GaussianFamily`) and the checks they share; see `gaussian.py` for the
families themselves and their parametrisation."""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from bayesadmm import rng

from . import natural as nat
from .natural import Natural

LOG_2PI = math.log(2.0 * math.pi)


# ---------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------


def check_tensor(x: object, shape: tuple[int, ...], what: str) -> Tensor:
    if not torch.is_tensor(x):
        raise ValueError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{what} must have a floating-point dtype, got {x.dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{what} must have shape {shape}, got {tuple(x.shape)}")
    return x


def check_symmetric(m: Tensor, what: str) -> None:
    # Arithmetic on symmetric matrices may leave rounding-level asymmetry, so
    # compare with a tolerance relative to the size of the entries.
    scale = max(1.0, m.detach().abs().max().item())
    tol = math.sqrt(torch.finfo(m.dtype).eps) * scale
    if (m - m.mT).detach().abs().max().item() > tol:
        raise ValueError(f"{what} must be symmetric")


def cholesky(m: Tensor, what: str) -> Tensor:
    """Lower Cholesky factor of ``m``, or ValueError if ``m`` is not PD."""
    factor, info = torch.linalg.cholesky_ex(m)
    if info.item() != 0:
        raise ValueError(f"{what} must be positive definite")
    return factor


def sym(m: Tensor) -> Tensor:
    return 0.5 * (m + m.mT)


def check_delta(delta: float) -> float:
    delta = float(delta)
    if not (math.isfinite(delta) and delta > 0.0):
        raise ValueError(f"prior precision delta must be a positive finite number, got {delta!r}")
    return delta


@dataclass(frozen=True)
class GaussianFamily(abc.ABC):
    """The interface of a Gaussian family, and the code the families share.

    Subclasses implement the family-specific algebra (the abstract methods);
    this base class holds the dimension, layout checks, the parts that follow
    directly from the exponential-family form (``log_prob``, ``zeros``) and
    the Bayesian-learning-rule step of the families with a free precision.

    A *precision-shaped* quantity is what ``to_moments`` returns as the
    precision: a 0-dim tensor (isotropic), a ``(d,)`` vector (diagonal) or a
    ``(d, d)`` matrix (full).  A dual ``η = (v, −½V)`` has the layout of ``λ``;
    its curvature part ``V`` is precision-shaped (0 for the isotropic family,
    whose dual has no such part).
    """

    dim: int
    name: ClassVar[str]

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim must be a positive integer, got {self.dim!r}")

    # -- layout -------------------------------------------------------------

    @abc.abstractmethod
    def _shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes of the tuple components (shared by λ, μ and duals η)."""

    def _check_params(self, params: Natural, what: str) -> None:
        shapes = self._shapes()
        if not isinstance(params, (tuple, list)) or len(params) != len(shapes):
            raise ValueError(f"{what} of the {self.name} family must be a tuple of {len(shapes)} tensors")
        for k, (x, shape) in enumerate(zip(params, shapes, strict=True)):
            check_tensor(x, shape, f"{what}[{k}]")

    def _check_theta(self, theta: Tensor) -> None:
        if not isinstance(theta, Tensor) or theta.dim() < 1 or theta.shape[-1] != self.dim:
            shape = tuple(theta.shape) if isinstance(theta, Tensor) else type(theta).__name__
            raise ValueError(f"theta must have shape (..., {self.dim}), got {shape}")

    def floored(self, lam: Natural, floor: float, mean: Tensor) -> tuple[Natural, float]:
        """``λ`` with the coordinates whose precision is below ``floor`` set to N(``mean``, 1/``floor``), and the
        fraction of coordinates set (client-level DP of a running-sum server); the diagonal family has it."""
        raise NotImplementedError(f"the {self.name} family has no coordinate-wise floor of its precision")

    def kept_where_invalid(self, lam: Natural, original: Natural) -> tuple[Natural, int]:
        """``lam`` with ``original``'s value on every coordinate where ``lam`` has no positive, finite precision, and
        how many coordinates that is (`bayesadmm.unlearn(..., keep_invalid=True)`); the diagonal family has it: in
        the others the precision is one number or one matrix, and no part of it can be kept apart."""
        raise NotImplementedError(f"the {self.name} family has no coordinate-wise validity to keep")

    def is_valid(self, lam: Natural) -> bool:
        """``True`` iff ``validate`` accepts ``lam`` (e.g. to reject a step)."""
        try:
            self.validate(lam)
        except ValueError:
            return False
        return True

    def zeros(self, dtype: torch.dtype = torch.float64, device=None) -> Natural:
        """All-zero tuple with this family's layout (e.g. an initial dual variable)."""
        return tuple(torch.zeros(shape, dtype=dtype, device=device) for shape in self._shapes())

    # -- densities ------------------------------------------------------------

    @abc.abstractmethod
    def _pairing(self, lam: Natural, theta: Tensor) -> Tensor:
        """``<λ, T(θ)>`` for ``θ`` of shape ``(..., d)``, returning shape ``(...)``."""

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

    # -- the exponential-family maps (each family's own algebra) ---------------

    @abc.abstractmethod
    def validate(self, lam: Natural) -> None:
        """Raise ValueError unless ``lam`` is a valid natural parameter."""

    @abc.abstractmethod
    def from_moments(self, mean: Tensor, precision: Any = None) -> Natural:
        """``λ`` from the mean and a precision-shaped precision."""

    @abc.abstractmethod
    def to_moments(self, lam: Natural) -> tuple[Tensor, Tensor]:
        """``(m, precision)``, the precision precision-shaped."""

    @abc.abstractmethod
    def to_expectation(self, lam: Natural) -> Natural:
        """``μ = ∇A(λ) = E_q[T(θ)]``."""

    @abc.abstractmethod
    def from_expectation(self, mu: Natural) -> Natural:
        """``λ`` from ``μ`` (the inverse of ``to_expectation``)."""

    @abc.abstractmethod
    def sufficient_statistics(self, theta: Tensor) -> Natural:
        """``T(θ)``."""

    @abc.abstractmethod
    def log_normalizer(self, lam: Natural) -> Tensor:
        """``A(λ)``."""

    @abc.abstractmethod
    def log_base_measure(self, theta: Tensor) -> Tensor:
        """``log h(θ)`` for ``θ`` of shape ``(..., d)``."""

    @abc.abstractmethod
    def entropy(self, lam: Natural) -> Tensor:
        """``H[q]``."""

    @abc.abstractmethod
    def kl(self, lam_q: Natural, lam_p: Natural) -> Tensor:
        """``KL(q‖p)``."""

    @abc.abstractmethod
    def sample(self, lam: Natural, n: int, generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws from ``q``, shape ``(n, d)``."""

    @abc.abstractmethod
    def second_moment(self, mu: Natural) -> Tensor:
        """``E[θθᵀ]`` from the expectation parameter, a ``(d, d)`` matrix."""

    # -- the prior and the server (Eqs. 17, 54) --------------------------------

    @abc.abstractmethod
    def prior_terms(self, delta: float, dtype: torch.dtype = torch.float64, device=None) -> tuple[float, Natural]:
        """``(c, b)`` with ``∇_μ KL(q ‖ N(0, δ⁻¹ I)) = c λ − b``."""

    @abc.abstractmethod
    def initial_natural(self, mean: Tensor, delta: float) -> Natural:
        """The server's starting point: mean ``mean`` and the prior's precision ``δ`` where the precision is free."""

    # -- the client problem (Eq. 15) --------------------------------------------

    @abc.abstractmethod
    def split_dual(self, eta: Natural) -> tuple[Tensor, Tensor]:
        """``(v, V)`` of a dual ``η = (v, −½V)``, ``V`` precision-shaped."""

    @abc.abstractmethod
    def as_matrix(self, x: Tensor) -> Tensor:
        """The ``(d, d)`` matrix a precision-shaped ``x`` stands for."""

    @abc.abstractmethod
    def loss_hessian(self, loss, theta: Tensor) -> Tensor:
        """``∇²ℓ(θ)`` in the form the family's natural gradient reads (``loss.hess`` or ``loss.hess_diag``)."""

    @abc.abstractmethod
    def natural_gradient(self, lam: Natural, derivs: tuple[Tensor, Tensor]) -> Natural:
        """``∇_μ E_q[ℓ]`` from ``derivs = (E_q[∇ℓ], E_q[∇²ℓ])``, the Hessian as ``loss_hessian`` gives it
        (Khan & Rue 2023, Eqs. 10–11; BayesADMM Eqs. 48, 60)."""

    def natural_step(
        self, lam: Natural, lam_g: Natural, eta: Natural, rho: float, derivs: tuple[Tensor, Tensor], step: float
    ) -> Natural | None:
        """One step of the Bayesian learning rule on the client problem (Eq. 15; App. C.1, Eq. 32),

            λ ← (1 − β) λ + β [λ_g − (η + ∇_μ E_q[ℓ]) / ρ],

        with the largest β among ``step``, ``step``/2, … (30 halvings) whose result is a valid member (a longer
        step can make the precision indefinite when the dual curvature exceeds the loss's); None if none is.
        """
        target = nat.sub(lam_g, nat.scale(nat.add(eta, self.natural_gradient(lam, derivs)), 1.0 / rho))
        beta = step
        for _ in range(30):
            new = nat.add(nat.scale(lam, 1.0 - beta), nat.scale(target, beta))
            if self.is_valid(new):
                return new
            beta /= 2
        return None

    @abc.abstractmethod
    def stationary_natural(self, loss, mean: Tensor, precision_g: Tensor, eta: Natural, rho: float) -> Natural | None:
        """The member with mean ``mean`` whose precision solves the delta-method stationarity of Eq. 15,
        ``S = S_g + (∇²ℓ(m) − V)/ρ`` (Eqs. 49–52), in this family's shape; None if that is not a valid precision."""

    @abc.abstractmethod
    def quadratic_solution(self, A: Tensor, b: Tensor, lam_g: Natural, eta: Natural, rho: float) -> Natural:
        """The exact minimiser of Eq. 15 in this family for ``ℓ(θ) = ½θᵀAθ − bᵀθ + c`` (may be invalid)."""
