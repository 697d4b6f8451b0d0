"""Exact tilted inference for Gaussian likelihoods: the clients of FedEP's toy (Guo et al. 2023, Sec. 3.1). p_k Gaussian
makes p_k q_{−k} Gaussian in closed form, which is then projected onto the family (KL(p‖q)
projection: keep the mean and the diagonal of Σ for the diagonal family)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bayesadmm.families import DiagonalGaussian, FullGaussian, Natural
from bayesadmm.solvers.von import SubproblemError


def precision_matrix(family, lam: Natural) -> Tensor:
    """Λ = −2λ₂ as a (d, d) matrix (diagonal family: diag(−2λ₂)); λ need not be valid."""
    if isinstance(family, DiagonalGaussian):
        return torch.diag(-2.0 * lam[1])
    return -(lam[1] + lam[1].mT)


@dataclass(frozen=True, eq=False)
class GaussianLikelihood:
    """A client whose likelihood is the Gaussian site p_k(θ) = N(θ; mean, covariance) (unnormalised in θ)."""

    mean: Tensor
    covariance: Tensor

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    @property
    def precision(self) -> Tensor:
        return torch.linalg.inv(self.covariance)

    @property
    def natural(self) -> tuple[Tensor, Tensor]:
        """(η_k, Λ_k) = (Σ_k⁻¹ μ_k, Σ_k⁻¹)."""
        precision = self.precision
        return precision @ self.mean, precision


@dataclass(frozen=True)
class ExactGaussian:
    """Tilted inference in closed form: p_k q_{−k} = N(η_k + η_{−k}, Λ_k + Λ_{−k}), projected onto the family.

    Full family: the tilted distribution itself. Diagonal family: KL(p‖q) projection, i.e. keep the mean and diag Σ.
    `scaled_identity=α` replaces the projected precision by Λ_{−k} + α I, keeping the exact tilted mean: the
    "scaled identity" client of Sec. 2.2.2 in its [CODE] form (site precision α per data point; the toy uses α = 1,
    Λ̂ = diag(Λ_{−k}) + I), which sends no covariance information of its own. Nothing is searched, so `start` and
    the generator are not used.
    """

    scaled_identity: float | None = None

    def __call__(
        self, family, data: GaussianLikelihood, cavity: Natural, generator=None, start: Tensor | None = None
    ) -> Natural:
        eta_k, lam_k = data.natural
        cav_prec = precision_matrix(family, cavity)
        precision = lam_k + cav_prec
        precision = 0.5 * (precision + precision.mT)
        factor, info = torch.linalg.cholesky_ex(precision)
        if int(info) != 0:
            raise SubproblemError(
                "the tilted distribution p_k q_{-k} is not normalisable (Λ_k + Λ_{-k} is not positive definite)"
            )
        h = eta_k + cavity[0]
        mean = torch.cholesky_solve(h.unsqueeze(-1), factor).squeeze(-1)
        if self.scaled_identity is not None:
            if isinstance(family, DiagonalGaussian):
                s = torch.diagonal(cav_prec) + self.scaled_identity
                if not bool((s > 0).all()):
                    raise SubproblemError("scaled-identity tilted precision is not positive")
                return (s * mean, -0.5 * s)
            s = cav_prec + self.scaled_identity * torch.eye(family.dim, dtype=mean.dtype, device=mean.device)
            return (s @ mean, -0.5 * s)
        if isinstance(family, FullGaussian):
            return (h, -0.5 * precision)
        variance = torch.diagonal(torch.cholesky_inverse(factor))
        return (mean / variance, -0.5 / variance)
