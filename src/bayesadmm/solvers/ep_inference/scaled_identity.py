"""Method I of FedEP's client (Guo et al. 2023, Sec. 2.2.2): scaled identity."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from bayesadmm.families import Natural
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.ep_inference.tilted import cavity_precision, check_diagonal, tilted_mean, tilted_natural


@dataclass(frozen=True)
class ScaledIdentity:
    """Method I: mean = argmin L̄_k by LocalAdam; Λ̂ = Λ_{−k} + α n_k.

    [CODE]: the site precision is α per data point; the paper's "Σ = α_cov I" read literally would ignore the cavity.
    The site then carries no covariance information of its own (half the communication, Sec. 2.2.2).
    """

    alpha: float = 1e-2
    solver: LocalAdam = field(default_factory=LocalAdam)

    def __call__(
        self, family, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None
    ) -> Natural:
        check_diagonal(family)
        mean = tilted_mean(self.solver, data, cavity, generator, start)
        return tilted_natural(mean, cavity_precision(cavity) + self.alpha * data.num_examples)
