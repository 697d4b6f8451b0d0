"""Tilted inference for FedEP clients with a neural network (Guo et al. 2023, Sec. 2.2.2): methods I and L.

An `inference(family, data, cavity, generator) -> tilted natural` for `bayesadmm.algorithms.fedep.make`, with the
diagonal family and `problems.neural.ClassificationData`. The tilted mean is the minimiser of the tilted objective
(digest §1.6) in mean-loss units,

    L̄_k(θ) = ℓ̄_k(θ) + (1/n_k)(½ θᵀΛ_{−k}θ − η_{−k}ᵀθ),

trained by `LocalAdam` with linear term a = −η_{−k}/n_k and per-coordinate proximal weight b = Λ_{−k}/n_k around 0,
starting from the cavity mean (0 where the cavity precision is not positive). This is the SGD mode, not SG-MCMC
moments (method M is not implemented). The tilted precision is then

    I (ScaledIdentity):  Λ̂ = Λ_{−k} + α n_k                         ([CODE]: site precision α per data point)
    L (Laplace):         Λ̂ = Λ_{−k} + H_k + α n_k,  H_k = Σ_i (∇_θ log p(ŷ_i | x_i, θ̂))², ŷ_i ∼ p(y | x_i, θ̂)

H_k is the diagonal Fisher with model-sampled labels (Kunstner et al. 2019), averaged over `fisher_samples` label draws
and summed (not averaged) over the client's examples ([CODE]; the paper's expectation omits n_k). α n_k keeps the
precision positive where the Fisher vanishes. A cavity with a negative precision can make L̄_k unbounded below; EP
offers no guarantee there, and a non-positive tilted precision raises SubproblemError.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from bayesadmm.families import DiagonalGaussian
from bayesadmm.solvers.adam import LocalAdam


def _check(family) -> None:
    if not isinstance(family, DiagonalGaussian):
        raise TypeError(f"neural tilted inference uses the diagonal family, got {family!r}")


def tilted_mean(solver: LocalAdam, data, cavity, generator: torch.Generator) -> Tensor:
    """argmin_θ ℓ̄_k(θ) + (½θᵀΛ_{−k}θ − η_{−k}ᵀθ)/n_k, by LocalAdam from the cavity mean."""
    eta, lam2 = cavity
    precision = -2.0 * lam2
    n = data.num_examples
    start = torch.where(precision > 0, eta / torch.where(precision > 0, precision, torch.ones_like(precision)),
                        torch.zeros_like(eta))
    theta, _ = solver.train(data, start, generator, linear=-eta / n, prox_weight=precision / n,
                            prox_center=torch.zeros_like(eta))
    return theta


def _tilted(mean: Tensor, precision: Tensor):
    from bayesadmm.solvers.von import SubproblemError

    if not bool((precision > 0).all()) or not bool(torch.isfinite(mean).all()):
        raise SubproblemError("the tilted precision is not positive (or the mean is not finite)")
    return (precision * mean, -0.5 * precision)


def diagonal_fisher(data, theta: Tensor, generator: torch.Generator, samples: int = 1,
                    batch_size: int = 256) -> Tensor:
    """Σ_i E_{ŷ∼p(y|x_i,θ)}[(∇_θ log p(ŷ | x_i, θ))²], estimated with `samples` label draws per example."""
    from torch.func import grad, vmap

    model = data.model

    def log_lik(t, x, onehot):
        logits = model.forward(t, x.unsqueeze(0))[0]
        return (torch.log_softmax(logits, -1) * onehot).sum()

    per_example = vmap(grad(log_lik), in_dims=(None, 0, 0))
    total = torch.zeros_like(theta)
    theta = theta.detach()
    for start in range(0, data.num_examples, batch_size):
        X = data.X[start:start + batch_size]
        with torch.no_grad():
            probs = torch.softmax(model.forward(theta, X), -1)
        for _ in range(samples):
            y = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            onehot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(theta.dtype)
            total = total + per_example(theta, X, onehot).square().sum(0)
    return total / samples


@dataclass(frozen=True)
class ScaledIdentity:
    """Method I: tilted mean by LocalAdam, tilted precision Λ_{−k} + α n_k."""

    alpha: float = 1e-2
    solver: LocalAdam = field(default_factory=LocalAdam)

    def __call__(self, family, data, cavity, generator: torch.Generator):
        _check(family)
        mean = tilted_mean(self.solver, data, cavity, generator)
        return _tilted(mean, -2.0 * cavity[1] + self.alpha * data.num_examples)


@dataclass(frozen=True)
class Laplace:
    """Method L: tilted mean by LocalAdam, tilted precision Λ_{−k} + H_k (diagonal sampled-label Fisher) + α n_k."""

    alpha: float = 1e-4
    fisher_samples: int = 1
    solver: LocalAdam = field(default_factory=LocalAdam)

    def __call__(self, family, data, cavity, generator: torch.Generator):
        _check(family)
        mean = tilted_mean(self.solver, data, cavity, generator)
        fisher = diagonal_fisher(data, mean, generator, self.fisher_samples)
        return _tilted(mean, -2.0 * cavity[1] + fisher + self.alpha * data.num_examples)
