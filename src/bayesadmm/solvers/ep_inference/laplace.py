"""Method L of FedEP's client (Guo et al. 2023, Sec. 2.2.2): Laplace with the sampled-label diagonal Fisher."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.families import Natural
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.ep_inference.tilted import cavity_precision, check_diagonal, tilted_mean, tilted_natural


def diagonal_fisher(
    data, theta: Tensor, generator: torch.Generator, samples: int = 1, batch_size: int = 256, idx: Tensor | None = None
) -> Tensor:
    """Σ_{i∈idx} E_{ŷ∼p(y|x_i,θ)}[(∇_θ log p(ŷ | x_i, θ))²], estimated with `samples` label draws per example
    (idx: all examples by default).

    The diagonal Fisher with model-sampled labels (Kunstner et al. 2019), summed (not averaged) over the examples
    ([CODE]; the paper's expectation omits n_k).
    """
    from torch.func import grad, vmap

    model = data.model

    def log_lik(t, x, onehot):
        logits = model.forward(t, x.unsqueeze(0))[0]
        return (torch.log_softmax(logits, -1) * onehot).sum()

    per_example = vmap(grad(log_lik), in_dims=(None, 0, 0))
    total = torch.zeros_like(theta)
    theta = theta.detach()
    count = data.num_examples if idx is None else idx.shape[0]
    for start in range(0, count, batch_size):
        X = data.X[start : start + batch_size] if idx is None else data.X[idx[start : start + batch_size]]
        with torch.no_grad():
            probs = torch.softmax(model.forward(theta, X), -1)
        for _ in range(samples):
            y = rng.multinomial(probs, generator)
            onehot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(theta.dtype)
            total = total + per_example(theta, X, onehot).square().sum(0)
    return total / samples


@dataclass(frozen=True)
class Laplace:
    """Method L: mean as I (LocalAdam on L̄_k); Λ̂ = Λ_{−k} + H_k + α n_k with H_k = Σ_i (∇_θ log p(ŷ_i | x_i, θ̂))²,
    ŷ_i ∼ p(y | x_i, θ̂), averaged over `fisher_samples` label draws (`diagonal_fisher`). α n_k keeps Λ̂ positive
    where the Fisher vanishes."""

    alpha: float = 1e-4
    fisher_samples: int = 1
    solver: LocalAdam = field(default_factory=LocalAdam)

    def __call__(
        self, family, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None
    ) -> Natural:
        check_diagonal(family)
        mean = tilted_mean(self.solver, data, cavity, generator, start)
        fisher = diagonal_fisher(data, mean, generator, self.fisher_samples)
        return tilted_natural(mean, cavity_precision(cavity) + fisher + self.alpha * data.num_examples)
