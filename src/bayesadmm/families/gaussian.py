r"""Gaussian exponential families stored in natural parameters.

A member of a family is the density

    q(θ) = h(θ) exp(<λ, T(θ)> − A(λ)),        θ ∈ R^d,

represented only by its natural parameter ``λ`` (a tuple of tensors, see
``bayesadmm.families.natural``).  The expectation parameter is
``μ = E_q[T(θ)] = ∇A(λ)``, and the maps ``λ ↦ μ`` (``to_expectation``) and
``μ ↦ λ`` (``from_expectation``) are mutual inverses.  Because
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

``GaussianFamily`` (``base.py``) is the interface the algorithms and
solvers program against; the families are in ``isotropic.py``,
``diagonal.py`` and ``full.py``, and this module gathers them with
``Posterior`` and ``make_family``.  Besides the exponential-family maps it holds what differs between
the families in BayesADMM's client and server problems (Eq. 15 and Eq. 54):
the server's starting point, the split of a dual into ``(v, V)``, the natural
gradient of an expected loss, one step of the Bayesian learning rule, the
delta-method precision from stationarity and the conjugate solution for a
quadratic loss.  A solver asks the family instead of testing its type.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .base import GaussianFamily
from .diagonal import DiagonalGaussian
from .full import FullGaussian
from .isotropic import IsotropicGaussian
from .natural import Natural

__all__ = [
    "DiagonalGaussian",
    "FullGaussian",
    "GaussianFamily",
    "IsotropicGaussian",
    "Posterior",
    "make_family",
]


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
        raise ValueError(f"unknown family {name!r}; valid names: {', '.join(sorted(_FAMILIES))}") from None
    return cls(dim, **kw)
