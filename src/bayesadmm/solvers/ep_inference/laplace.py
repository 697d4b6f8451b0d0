"""Method L of FedEP's client (Guo et al. 2023, Sec. 2.2.2): Laplace with the sampled-target diagonal Fisher."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from bayesadmm.families import Natural
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.curvature import DEFAULT_MAX_ELEMENTS, MonteCarloFisher, rows
from bayesadmm.solvers.ep_inference.tilted import cavity_precision, check_diagonal, tilted_mean, tilted_natural


def diagonal_fisher(
    data,
    theta: Tensor,
    generator: torch.Generator,
    samples: int = 1,
    idx: Tensor | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Tensor:
    """Σ_{i∈idx} E_{ŷ∼p(y|x_i,θ)}[(∇_θ log p(ŷ | x_i, θ))²], estimated with `samples` target draws per example
    (idx: all examples by default).

    The diagonal Fisher with model-sampled targets (Kunstner et al. 2019), summed (not averaged) over the examples
    ([CODE]; the paper's expectation omits n_k). The targets are drawn by the data's likelihood (`sample_targets`:
    labels from the softmax, Gaussian or Poisson draws) and the gradients are those of its own negative
    log-likelihood: `solvers.curvature.MonteCarloFisher`, which refuses a likelihood that cannot draw targets.
    """
    return MonteCarloFisher(max_elements, samples)(rows(data, idx), theta, generator)


@dataclass(frozen=True)
class Laplace:
    """Method L: mean as I (LocalAdam on L̄_k); Λ̂ = Λ_{−k} + H_k + α n_k with H_k = Σ_i (∇_θ log p(ŷ_i | x_i, θ̂))²,
    ŷ_i ∼ p(y | x_i, θ̂), averaged over `fisher_samples` target draws (`diagonal_fisher`). α n_k keeps Λ̂ positive
    where the Fisher vanishes. `needs`: what it reads from the clients' likelihood (`likelihoods.require`)."""

    alpha: float = 1e-4
    fisher_samples: int = 1
    solver: LocalAdam = field(default_factory=LocalAdam)
    needs: ClassVar[tuple[str, ...]] = MonteCarloFisher.needs

    def __call__(
        self, family, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None
    ) -> Natural:
        check_diagonal(family)
        mean = tilted_mean(self.solver, data, cavity, generator, start)
        fisher = diagonal_fisher(data, mean, generator, self.fisher_samples)
        return tilted_natural(mean, cavity_precision(cavity) + fisher + self.alpha * data.num_examples)
