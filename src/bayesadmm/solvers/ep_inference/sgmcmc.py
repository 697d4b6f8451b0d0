"""Method M of FedEP's client (Guo et al. 2023, Sec. 2.2.2, Alg. 2): moments of an SG-MCMC chain, with shrinkage."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from bayesadmm.families import Natural
from bayesadmm.solvers.adam import minibatches
from bayesadmm.solvers.ep_inference.tilted import (
    cavity_precision,
    cavity_terms,
    check_diagonal,
    number_in,
    positive_int,
    raise_problems,
    search_start,
    tilted_natural,
)
from bayesadmm.solvers.von import SubproblemError


def sgd_chain(
    data,
    start: Tensor,
    generator: torch.Generator,
    lr: float,
    momentum: float,
    epochs: int,
    batch_size: int,
    linear: Tensor | None = None,
    prox_weight: Tensor | float = 0.0,
) -> Tensor:
    """The SG-MCMC samples of Alg. 2: run SGD with heavy-ball momentum (torch.optim.SGD: v ← m v + g, θ ← θ − lr v)
    on ℓ̄_k(θ) + aᵀθ + ½ Σ_j b_j θ_j² from `start`, and keep the iterate at the end of every epoch: (epochs, d).

    One chain, so the momentum buffer carries over between epochs; minibatches are reshuffled every epoch by the
    generator (the same draws as `minibatches(n, batch_size, epochs, generator)`).
    """
    theta = torch.nn.Parameter(start.detach().clone())
    optimizer = torch.optim.SGD([theta], lr=lr, momentum=momentum)
    has_prox = torch.is_tensor(prox_weight) or prox_weight != 0.0
    samples = []
    for _ in range(epochs):
        for idx in minibatches(data.num_examples, batch_size, 1, generator, start.device):
            optimizer.zero_grad(set_to_none=True)
            data.batch_loss(theta, idx).backward()
            grad = cast(Tensor, theta.grad)  # backward() of a loss of θ has just set it
            with torch.no_grad():
                if linear is not None:
                    grad.add_(linear)
                if has_prox:
                    grad.add_(prox_weight * theta)
            optimizer.step()
        samples.append(theta.detach().clone())
    stacked = torch.stack(samples)
    if not bool(torch.isfinite(stacked).all()):
        raise FloatingPointError("the SG-MCMC chain diverged (non-finite parameters); lower the learning rate")
    return stacked


def shrunk_moments(samples: Tensor, shrinkage: float) -> tuple[Tensor, Tensor]:
    """(mean, variance) of samples (N, d) with shrinkage ρ towards 1: mean = (1/N) Σ θ^(i),
    variance = ρ + (1 − ρ) · (1/N) Σ (θ^(i) − mean)²  (the moments of the empirical distribution, which is what
    the KL(p‖q) projection of the sample set onto the diagonal family matches)."""
    if samples.ndim != 2 or samples.shape[0] < 1:
        raise ValueError(f"samples must be (N >= 1, d), got shape {tuple(samples.shape)}")
    raise_problems("shrunk_moments", number_in("shrinkage", shrinkage, 0.0, 1.0))
    mean = samples.mean(0)
    variance = shrinkage + (1.0 - shrinkage) * samples.var(0, correction=0)
    return mean, variance


def clip_and_rescale(precision: Tensor, target_norm: Tensor | float, clip_std: float | None = 2.0) -> Tensor:
    """Clip a precision vector to [m − c·sd, m + c·sd] (m, sd: its mean and population std over the coordinates,
    c = clip_std; None = no clipping), then scale it so that its Euclidean norm is `target_norm`."""
    if clip_std is not None:
        centre, spread = precision.mean(), precision.std(correction=0)
        precision = precision.clamp(min=centre - clip_std * spread, max=centre + clip_std * spread)
    return precision * (target_norm / precision.norm())


@dataclass(frozen=True)
class SGMCMC:
    """Method M: N samples θ^(1..N) of SGD(momentum) on L̄_k, one at the end of each epoch (Alg. 2; no Polyak
    averaging, footnote 4); mean = their average; Σ = ρ + (1 − ρ) Var_emp (`shrunk_moments`); Λ̂ = 1/Σ clipped to
    mean ± 2 std over the coordinates and rescaled so that ‖Λ̂‖₂ equals ‖Λ_{−k} + α n_k‖₂, the scaled-identity
    precision ([CODE]; the paper only names the "MCMC shrinkage" hyperparameter).

    alpha: α of that scaled-identity precision. shrinkage: ρ ∈ [0, 1] (paper: 1e-4 CIFAR/EMNIST, 1e-6
    StackOverflow). lr, momentum, batch_size: the SGD of the chain (paper: momentum 0.9). epochs: N, the number of
    samples, one per epoch (the paper's "client epochs"). clip_std: the clipping width in standard deviations (None:
    no clipping).
    """

    alpha: float = 1e-2
    shrinkage: float = 1e-4
    lr: float = 1e-2
    momentum: float = 0.9
    epochs: int = 5
    batch_size: int = 32
    clip_std: float | None = 2.0

    def __post_init__(self) -> None:
        problems = (
            number_in("alpha", self.alpha, 0.0, math.inf, low_open=True, high_open=True)
            + number_in("shrinkage", self.shrinkage, 0.0, 1.0)
            + number_in("lr", self.lr, 0.0, math.inf, low_open=True, high_open=True)
            + number_in("momentum", self.momentum, 0.0, 1.0, high_open=True)
            + positive_int("epochs", self.epochs)
            + positive_int("batch_size", self.batch_size)
        )
        if self.clip_std is not None:
            problems += number_in("clip_std", self.clip_std, 0.0, math.inf, high_open=True)
        raise_problems("SGMCMC", problems)

    def samples(self, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None) -> Tensor:
        """The chain's N samples (N, d) on the tilted objective."""
        linear, weight = cavity_terms(data, cavity)
        return sgd_chain(
            data,
            search_start(cavity, start),
            generator,
            self.lr,
            self.momentum,
            self.epochs,
            self.batch_size,
            linear=linear,
            prox_weight=weight,
        )

    def __call__(
        self, family, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None
    ) -> Natural:
        check_diagonal(family)
        mean, variance = shrunk_moments(self.samples(data, cavity, generator, start), self.shrinkage)
        if not bool((variance > 0).all()):
            raise SubproblemError("SG-MCMC: a coordinate has zero sample variance; use shrinkage > 0")
        target = (cavity_precision(cavity) + self.alpha * data.num_examples).norm()
        return tilted_natural(mean, clip_and_rescale(1.0 / variance, target, self.clip_std))
