"""Gaussian smoothing with Adam: the BayesADMM client solver for the isotropic family N(m, I/s) on neural networks.

For the isotropic family with fixed precision s, KL(q_k ‖ q_g) = (s/2)‖m − m_g‖² and μ = m, so the client problem
(Eq. 15, Eq. 22 of the BayesADMM paper) in the summed-loss units of BayesADMM's duals is

    m_k = argmin_m  E_{N(θ|m, I/s)}[ℓ_k(θ)] + ηᵀm + (ρ s/2)‖m − m_g‖²,

the proximal ADMM step on the Gaussian-smoothed loss (with the delta method E[ℓ_k(θ)] ≈ ℓ_k(m) it is exactly ADMM's
Eq. 5 with proximal weight ρs). Divided by N_k it is `LocalAdam`'s problem in mean-loss units,

    E[ℓ̄_k(m + ε/√s)] + (η/N_k)ᵀm + ½(ρ s/N_k)‖m − m_g‖²,     ε ~ N(0, I),

which is minimised with Adam from m_g (fresh state every call). The smoothed loss's gradient is estimated by
reparameterisation, ∇_m E[ℓ̄_k(m + ε/√s)] = E[∇ℓ̄_k(m + ε/√s)], averaging `mc_samples` draws per minibatch step, all
drawn from the client's generator (interleaved with the minibatch shuffling, so a generator fixes the result).
The solver returns λ = s·m.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.families import IsotropicGaussian
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.von import SolveResult, SubproblemError, VariationalSolver


@dataclass(frozen=True)
class SmoothedData:
    """`data` seen through Gaussian noise: batch_loss(m, idx) = (1/S) Σ_s ℓ̄(m + scale·ε_s) over the batch, fresh ε."""

    data: Any
    scale: float  # 1/√s
    samples: int
    generator: torch.Generator

    @property
    def num_examples(self) -> int:
        return self.data.num_examples

    def batch_loss(self, theta: Tensor, idx: Tensor) -> Tensor:
        eps = rng.randn((self.samples, theta.shape[0]), self.generator, theta.dtype, theta.device)
        return torch.stack([self.data.batch_loss(theta + self.scale * e, idx) for e in eps]).mean()


@dataclass(frozen=True)
class GaussianSmoothingAdam(VariationalSolver):
    lr: float
    epochs: int = 1
    batch_size: int = 32
    mc_samples: int = 1
    needs_generator: ClassVar[bool] = True  # it shuffles the minibatches and draws the smoothing noise

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be > 0, got {value}"
            for name, value in (
                ("lr", self.lr),
                ("epochs", self.epochs),
                ("batch_size", self.batch_size),
                ("mc_samples", self.mc_samples),
            )
            if not value > 0  # also refuses NaN
        ]
        if problems:
            raise ValueError("GaussianSmoothingAdam: " + "; ".join(problems))

    def solve(
        self, family, data, lam_g, eta, rho: float, generator: torch.Generator, init=None, round_: int = 1
    ) -> SolveResult:
        if not isinstance(family, IsotropicGaussian):
            raise TypeError(f"Gaussian smoothing learns the isotropic family N(m, I/s), not the {family.name} family")
        if generator is None:
            raise ValueError("Gaussian smoothing needs an explicit torch.Generator")
        s = family.precision
        m_g = family.to_moments(lam_g)[0]
        start = m_g if init is None else family.to_moments(init)[0]
        n = data.num_examples
        smoothed = SmoothedData(data, 1.0 / math.sqrt(s), self.mc_samples, generator)
        adam = LocalAdam(lr=self.lr, epochs=self.epochs, batch_size=self.batch_size)
        try:
            mean, steps = adam.train(
                smoothed, start, generator, linear=eta[0] / n, prox_weight=rho * s / n, prox_center=m_g
            )
        except FloatingPointError as exc:
            raise SubproblemError(f"Gaussian smoothing diverged on this client: {exc}") from exc
        return SolveResult(family.from_moments(mean), steps, True)
