"""The interface of FedEP's tilted inference and what its neural-network methods share (Guo et al. 2023, Sec. 2.2.2).

A `TiltedInference` is step 3 of Alg. 4: given the cavity λ_{−k} (the family's natural tuple, not necessarily a
valid distribution) it returns λ̂_k ≈ proj[p_k q_{−k}], a valid member of the family. The neural methods work in
MEAN-loss units, like the other local solvers: the tilted objective (the paper's L_k divided by n_k) is

    L̄_k(θ) = ℓ̄_k(θ) + (1/n_k)(½ θᵀΛ_{−k}θ − η_{−k}ᵀθ),

so a training run adds the linear term a = −η_{−k}/n_k and the per-coordinate weight b = Λ_{−k}/n_k (around 0) to the
minibatch gradient of ℓ̄_k. Their data offers `num_examples` and `batch_loss(θ, idx)` (mean loss over the examples
idx; `clients.SupervisedData`), and all randomness (minibatch order, target draws, parameter draws) comes
from the client's generator.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from bayesadmm.families import DiagonalGaussian, Natural
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.von import SubproblemError


class TiltedInference(Protocol):
    """λ̂_k = inference(family, data_k, λ_{−k}, generator, start): the projection of p_k q_{−k} onto `family`.

    start: where a search (an optimizer, an SG-MCMC chain) begins; None = the cavity mean. FedPA passes the global
    mean, because its uniform cavity has no mean to train from. Inference that does not search ignores it.

    An inference that reads more of the clients' likelihood than its loss lists the members in an optional `needs`
    (Laplace and NGVI: its `sample_targets`), which the registry checks when it builds the method (`likelihood_needs`).
    """

    def __call__(
        self, family, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None
    ) -> Natural: ...


class TiltedProblem(NamedTuple):
    """One client's tilted inference for `TiltedSolver`: the family, the cavity λ_{−k} and where a search starts
    (None: the cavity mean; see `TiltedInference`)."""

    family: Any
    cavity: Natural
    start: Tensor | None = None


@dataclass(frozen=True)
class TiltedSolver:
    """A `TiltedInference` as the local solver of an EP client step (`algorithms.base.LocalSolver`):
    `solve_problem(TiltedProblem, data, generator)` is `inference(family, data, cavity, generator[, start=])`, the
    tilted natural tuple λ̂_k. It does not batch (no `solve_cohort`)."""

    inference: TiltedInference

    def solve_problem(self, problem: TiltedProblem, data, generator: torch.Generator) -> Natural:
        if problem.start is None:
            return self.inference(problem.family, data, problem.cavity, generator)
        return self.inference(problem.family, data, problem.cavity, generator, start=problem.start)


def likelihood_needs(inference: TiltedInference) -> tuple[str, ...]:
    """The members of `likelihoods.CurvatureLikelihood` that `inference` reads (its `needs`; none if it has none)."""
    return tuple(getattr(inference, "needs", ()))


def check_diagonal(family) -> None:
    if not isinstance(family, DiagonalGaussian):
        raise TypeError(f"neural tilted inference uses the diagonal family, got {family!r}")


def positive_int(key: str, value) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        return [f"{key} must be a positive integer, got {value!r}"]
    return []


def number_in(key: str, value, low: float, high: float, low_open: bool = False, high_open: bool = False) -> list[str]:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        return [f"{key} must be a number in {interval}, got {value!r}"]
    return []


def raise_problems(owner: str, problems: list[str]) -> None:
    if problems:
        raise ValueError(f"{owner}: " + "; ".join(problems))


def cavity_precision(cavity: Natural) -> Tensor:
    """Λ_{−k} = −2λ₂ of the (diagonal) cavity tuple."""
    return -2.0 * cavity[1]


def search_start(cavity: Natural, start: Tensor | None) -> Tensor:
    """Where local training starts: `start` if given, else the cavity mean (0 where Λ_{−k} ≤ 0)."""
    if start is not None:
        return start
    eta, precision = cavity[0], cavity_precision(cavity)
    safe = torch.where(precision > 0, precision, torch.ones_like(precision))
    return torch.where(precision > 0, eta / safe, torch.zeros_like(eta))


def cavity_terms(data, cavity: Natural) -> tuple[Tensor, Tensor]:
    """(a, b) of the tilted objective in mean-loss units: a = −η_{−k}/n_k, b = Λ_{−k}/n_k."""
    n = data.num_examples
    return -cavity[0] / n, cavity_precision(cavity) / n


def tilted_mean(
    solver: LocalAdam, data, cavity: Natural, generator: torch.Generator, start: Tensor | None = None
) -> Tensor:
    """argmin_θ ℓ̄_k(θ) + (½θᵀΛ_{−k}θ − η_{−k}ᵀθ)/n_k, by LocalAdam from `start` (default: the cavity mean)."""
    linear, weight = cavity_terms(data, cavity)
    theta, _ = solver.train(
        data,
        search_start(cavity, start),
        generator,
        linear=linear,
        prox_weight=weight,
        prox_center=torch.zeros_like(linear),
    )
    return theta


def tilted_natural(mean: Tensor, precision: Tensor) -> Natural:
    """The diagonal natural tuple (Λ̂ μ̂, −½Λ̂); a non-positive precision means EP left the region where the tilted
    distribution is normalisable (a negative cavity precision can make L̄_k unbounded below)."""
    if not bool((precision > 0).all()) or not bool(torch.isfinite(mean).all()):
        raise SubproblemError("the tilted precision is not positive (or the mean is not finite)")
    return (precision * mean, -0.5 * precision)
