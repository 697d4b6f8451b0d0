"""Method V of FedEP's client (Guo et al. 2023, Sec. 2.2.2, Alg. 5): natural-gradient VI for the covariance, with the
cavity as prior."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.families import Natural
from bayesadmm.solvers.adam import LocalAdam, minibatches
from bayesadmm.solvers.curvature import MonteCarloFisher
from bayesadmm.solvers.ep_inference.laplace import diagonal_fisher
from bayesadmm.solvers.ep_inference.tilted import (
    cavity_precision,
    check_diagonal,
    number_in,
    positive_int,
    raise_problems,
    tilted_mean,
    tilted_natural,
)
from bayesadmm.solvers.von import SubproblemError

# fisher(data, θ, idx, generator) -> Σ_{i ∈ idx} F_i(θ), the summed per-example diagonal Fisher
Fisher = Callable[[object, Tensor, Tensor, torch.Generator], Tensor]


@dataclass(frozen=True)
class NGVI:
    """Method V: the tilted mean as in I, not updated by NGVI (Alg. 5); then s_t = β s_{t−1} + (1 − β) F_t with F_t
    the average over N draws θ ∼ N(mean, Σ_{t−1}) of the per-example diagonal Fisher, Σ_t = (n_k s_t + Λ_{−k} +
    α n_k)⁻¹, and Λ̂ = Σ_T⁻¹.

    s is updated per minibatch with F_t the minibatch's mean per-example Fisher ([CODE]; `batch_size=None` gives
    Alg. 5 as printed: one update per epoch with the full-data Fisher), from s_0 = 0 ([CODE]) and, by default, with
    Adam's bias correction ŝ_t = s_t / (1 − β^t) in place of s_t: the paper calls the update "algorithmically similar
    to Adam" but gives neither s_0 nor a correction, and without it s_T ≈ (1 − β^T)·F, which for β = 0.99 and T = 5
    epochs keeps the tilted precision near the cavity's (`debias=False` is the printed recursion).

    alpha: α in Λ̂ = Λ_{−k} + n_k s + α n_k (0: the paper's Σ = (|D_k| s + Σ_{−k}⁻¹)⁻¹; > 0 keeps Λ̂ positive where
    the Fisher vanishes and makes the first draws finite under a uniform cavity). beta: β_NGVI ∈ [0, 1) (paper:
    0.99). epochs: T_NGVI passes over the data (paper: 5–10). samples: N_NGVI parameter draws per update (paper:
    5–10). batch_size: examples per update of s. fisher_samples: target draws per example for the sampled-target
    Fisher. debias: Adam's bias correction of s. fisher: the summed-Fisher estimator (default: `diagonal_fisher`, the
    sampled-target Fisher of the data's likelihood, which it must be able to draw from: `needs`).
    """

    alpha: float = 1e-2
    beta: float = 0.99
    epochs: int = 5
    samples: int = 5
    batch_size: int | None = 32
    fisher_samples: int = 1
    debias: bool = True
    solver: LocalAdam = field(default_factory=LocalAdam)
    fisher: Fisher | None = None

    def __post_init__(self) -> None:
        problems = (
            number_in("alpha", self.alpha, 0.0, math.inf, high_open=True)
            + number_in("beta", self.beta, 0.0, 1.0, high_open=True)
            + positive_int("epochs", self.epochs)
            + positive_int("samples", self.samples)
            + positive_int("fisher_samples", self.fisher_samples)
        )
        if self.batch_size is not None:
            problems += positive_int("batch_size", self.batch_size)
        raise_problems("NGVI", problems)

    @property
    def needs(self) -> tuple[str, ...]:
        """What it reads from the clients' likelihood (`likelihoods.require`): nothing with its own `fisher`."""
        return () if self.fisher is not None else MonteCarloFisher.needs

    def _fisher(self, data, theta: Tensor, idx: Tensor, generator: torch.Generator) -> Tensor:
        if self.fisher is not None:
            return self.fisher(data, theta, idx, generator)
        return diagonal_fisher(data, theta, generator, self.fisher_samples, idx=idx)

    def average_fisher(self, data, mean: Tensor, cavity: Natural, generator: torch.Generator) -> Tensor:
        """s_T (bias-corrected if `debias`): the running average of the per-example Fisher at draws from the
        current q^{\\k} = N(mean, (n_k s + Λ_{−k} + α n_k)⁻¹)."""
        n = data.num_examples
        floor = cavity_precision(cavity) + self.alpha * n  # Σ_0⁻¹ (s_0 = 0)
        if not bool((floor > 0).all()):
            raise SubproblemError(
                "NGVI: Λ_{-k} + α n_k is not positive, so the first draws are undefined "
                "(use alpha > 0 with an improper cavity)"
            )
        s = torch.zeros_like(mean)
        s_hat = s
        batch = n if self.batch_size is None else self.batch_size
        for steps, idx in enumerate(minibatches(n, batch, self.epochs, generator, mean.device), start=1):
            std = (n * s_hat + floor).rsqrt()
            noise = rng.randn((self.samples, mean.shape[0]), generator, mean.dtype, mean.device)
            # a sum of tensors (samples >= 1), never sum's start value 0
            fisher = cast(Tensor, sum(self._fisher(data, mean + std * eps, idx, generator) for eps in noise))
            fisher = fisher / (self.samples * idx.shape[0])  # mean over draws and over the minibatch
            s = self.beta * s + (1.0 - self.beta) * fisher
            s_hat = s / (1.0 - self.beta**steps) if self.debias else s
        return s_hat

    def __call__(
        self, family, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None
    ) -> Natural:
        check_diagonal(family)
        mean = tilted_mean(self.solver, data, cavity, generator, start)
        s = self.average_fisher(data, mean, cavity, generator)
        n = data.num_examples
        return tilted_natural(mean, cavity_precision(cavity) + n * s + self.alpha * n)
