"""Local training of a point estimate with Adam: the client step of FedAvg, FedProx, FedDyn, ADMM and FedLap.

Every point-estimate method's client problem has the same shape, in MEAN-loss units:

    θ_k = argmin_θ  ℓ̄_k(θ) + aᵀθ + ½ Σ_j b_j (θ_j − c_j)² + wd/2 ‖θ‖²

with ℓ̄_k the mean per-example loss, a linear term a (ADMM's v, FedDyn's −g, FedLap's ṽ), a (possibly per-coordinate)
proximal weight b around a centre c (usually θ_g) and a plain weight decay wd. Each method only says what a, b, c
and wd are; the gradient of the extra terms is added analytically to the minibatch gradient of ℓ̄_k.

The optimizer starts fresh every call (no Adam state leaks across rounds or clients — a defect of the authors' code
the spec lists), training runs `epochs` passes over the client's data in minibatches shuffled by the generator, and
the model starts from `theta0` (the broadcast server parameters).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, cast

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.checks import all_finite
from bayesadmm.solvers.cohort import CohortGradients, StackedClients, batch_gradients, poisson_minibatches
from bayesadmm.solvers.cohort_adam import adam_cohort
from bayesadmm.solvers.newton import PointResult, ProxProblem


def minibatches(
    num_examples: int,
    batch_size: int,
    epochs: int,
    generator: torch.Generator,
    device: torch.device | str = "cpu",
    poisson: bool = False,
) -> Iterator[Tensor]:
    """Example indices for `epochs` passes over the data in minibatches, reshuffled each epoch by the generator (the
    last minibatch of an epoch may be smaller). Drawn lazily, so randomness used between batches (IVON's noise)
    interleaves with the shuffles in a fixed order. `poisson`: `poisson_minibatches` instead."""
    if poisson:
        yield from poisson_minibatches(num_examples, batch_size, epochs, generator, device)
        return
    for _ in range(epochs):
        order = rng.randperm(num_examples, generator, device)
        for start in range(0, num_examples, batch_size):
            yield order[start : start + batch_size]


class AdamProblem(NamedTuple):
    """One client's problem for `LocalAdam` (the module docstring's a = linear, b = prox_weight, c = prox_center,
    None: θ0), started from theta0."""

    theta0: Tensor
    linear: Tensor | None = None
    prox_weight: Tensor | float = 0.0
    prox_center: Tensor | None = None


@dataclass(frozen=True)
class LocalAdam:
    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    weight_decay: float = 0.0
    # Poisson minibatches (`solvers.cohort.poisson_minibatches`: example-level DP's sampling, set by
    # `privacy.example_level`) in place of the epochs' shuffles
    poisson: bool = False
    # clients per cohort where the engine chooses on a CPU: cohorts of 16 and 32 took 0.61-0.64 of the per-client
    # round's time for FedAvg on 10 to 1000 clients (`python benchmarks/cohort.py`, docs/performance.md)
    cpu_cohort: ClassVar[int] = 16
    needs_generator: ClassVar[bool] = True  # it shuffles the minibatches
    # its only use of the data is one minibatch gradient per step (`batch_grad`; in a cohort, `gradients`), so
    # example-level DP can replace that gradient (`privacy.example_level`)
    private_gradients: ClassVar[bool] = True

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be > 0, got {value}"
            for name, value in (("lr", self.lr), ("epochs", self.epochs), ("batch_size", self.batch_size))
            if not value > 0  # also refuses NaN
        ]
        if not self.weight_decay >= 0:
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if problems:
            raise ValueError("LocalAdam: " + "; ".join(problems))

    def train(
        self,
        data,
        theta0: Tensor,
        generator: torch.Generator,
        linear: Tensor | None = None,
        prox_weight: Tensor | float = 0.0,
        prox_center: Tensor | None = None,
    ) -> tuple[Tensor, int]:
        """Minimise the objective in the module docstring from theta0; return (θ_k, number of steps)."""
        theta = torch.nn.Parameter(theta0.detach().clone())
        optimizer = torch.optim.Adam([theta], lr=self.lr)
        center = theta0.detach() if prox_center is None else prox_center
        has_prox = torch.is_tensor(prox_weight) or prox_weight != 0.0
        batch_grad = getattr(data, "batch_grad", None)  # the data's own gradient (no autograd graph), where it has one
        steps = 0
        batches = minibatches(data.num_examples, self.batch_size, self.epochs, generator, theta0.device, self.poisson)
        for idx in batches:
            optimizer.zero_grad(set_to_none=True)
            if batch_grad is not None:
                theta.grad = batch_grad(theta, idx)
            else:
                data.batch_loss(theta, idx).backward()
            with torch.no_grad():
                # the extra terms' gradient, without a zero vector to start from where there is none (FedAvg). This
                # changes only the sign of some zero gradient entries, which Adam's moments do not see (its first
                # moment, a lerp from +0, never becomes −0; its second squares), so the steps are the same bits.
                extra = self.weight_decay * theta if self.weight_decay else None
                if linear is not None:
                    extra = linear if extra is None else extra + linear
                if has_prox:
                    pull = prox_weight * (theta - center)
                    extra = pull if extra is None else extra + pull
                if extra is not None:
                    cast(Tensor, theta.grad).add_(extra)
            optimizer.step()
            steps += 1
        if not all_finite(theta):
            raise FloatingPointError("local training diverged (non-finite parameters); lower the learning rate")
        return theta.detach(), steps

    def solve_problem(self, problem: AdamProblem, data, generator: torch.Generator) -> tuple[Tensor, int]:
        """`train` on a client's problem (its `AdamProblem`): (θ_k, number of steps)."""
        return self.train(data, problem.theta0, generator, problem.linear, problem.prox_weight, problem.prox_center)

    def solve_cohort(
        self,
        problems: Sequence[AdamProblem],
        data: StackedClients,
        generators: Sequence[torch.Generator],
        gradients: CohortGradients = batch_gradients,
    ) -> list[tuple[Tensor, int]]:
        """`solve_problem` for each client of a cohort, all clients' steps taken together (`solvers.cohort`): the same
        shuffles, and the same numbers up to rounding. `gradients`: each step's minibatch gradients."""
        return adam_cohort(self, problems, data, generators, gradients)

    def objective(
        self,
        data,
        theta: Tensor,
        linear: Tensor | None = None,
        prox_weight: Tensor | float = 0.0,
        prox_center: Tensor | None = None,
    ) -> Tensor:
        """The full-data objective the training minimises (for tests and diagnostics)."""
        value = data.batch_loss(theta, torch.arange(data.num_examples)) + 0.5 * self.weight_decay * theta.square().sum()
        if linear is not None:
            value = value + linear @ theta
        if torch.is_tensor(prox_weight) or prox_weight != 0.0:
            if prox_center is None:
                raise ValueError("a proximal weight needs its centre (prox_center)")
            value = value + 0.5 * (prox_weight * (theta - prox_center).square()).sum()
        return value


def local_adam(owner: str, lr: float, epochs: int, batch_size: int, weight_decay: float = 0.0) -> LocalAdam:
    """A LocalAdam built from an algorithm's keyword hyperparameters, with errors that name the algorithm.

    Stricter than LocalAdam's own check: epochs and batch_size must be integers and lr, weight_decay finite numbers,
    so that a value mistyped on the command line ("1e-3" for epochs, a bool) fails here rather than deep in training.
    """
    problems = []
    for key, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            problems.append(f"{key} must be a positive integer, got {value!r}")
    for key, number, low in (("lr", lr, "> 0"), ("weight_decay", weight_decay, ">= 0")):
        ok = isinstance(number, numbers.Real) and not isinstance(number, bool) and math.isfinite(number)
        if not ok or (number <= 0 if low == "> 0" else number < 0):
            problems.append(f"{key} must be a finite number {low}, got {number!r}")
    if problems:
        raise ValueError(f"{owner}: " + "; ".join(problems))
    return LocalAdam(lr=float(lr), epochs=int(epochs), batch_size=int(batch_size), weight_decay=float(weight_decay))


@dataclass(frozen=True)
class LocalAdamProx:
    """Federated ADMM's client problem (Eq. 5) in MEAN-loss units, solved by LocalAdam: a `solver` for `admm.make`.

        θ_k = argmin_θ  ℓ̄_k(θ) + vᵀθ + ρ/2 ‖θ − θ_g‖²        (a = v, b = ρ, c = θ_g, wd = 0 above)

    Training starts at the centre θ_g with fresh Adam state (nothing carries over between rounds or clients) and runs
    the fixed budget of `epochs` passes; `converged` is therefore always True (the budget ran out), as for IVON.
    The minibatch order comes from the generator the engine passes, which is required.
    """

    lr: float = 1e-3
    epochs: int = 1
    batch_size: int = 32
    poisson: bool = False  # (LocalAdam's)
    cpu_cohort: ClassVar[int] = LocalAdam.cpu_cohort  # (its steps are LocalAdam's)
    needs_generator: ClassVar[bool] = True
    private_gradients: ClassVar[bool] = True  # (its steps are LocalAdam's)

    def __post_init__(self) -> None:
        local_adam("LocalAdamProx", self.lr, self.epochs, self.batch_size)

    @property
    def adam(self) -> LocalAdam:
        return LocalAdam(lr=self.lr, epochs=self.epochs, batch_size=self.batch_size, poisson=self.poisson)

    def minimize(self, data, v: Tensor, rho: float, center: Tensor, generator: torch.Generator | None = None):
        if generator is None:
            raise ValueError(
                "LocalAdamProx shuffles minibatches and needs the client's torch.Generator "
                "(all randomness comes from the engine's generators)"
            )
        theta, steps = self.adam.train(data, center, generator, linear=v, prox_weight=rho, prox_center=center)
        return PointResult(theta, steps, True)

    def solve_problem(self, problem: ProxProblem, data, generator: torch.Generator) -> PointResult:
        """`minimize` on a client's problem (its `ProxProblem`)."""
        return self.minimize(data, problem.v, problem.rho, problem.center, generator)

    def solve_cohort(
        self,
        problems: Sequence[ProxProblem],
        data: StackedClients,
        generators: Sequence[torch.Generator],
        gradients: CohortGradients = batch_gradients,
    ) -> list[PointResult]:
        """`solve_problem` for each client of a cohort, their steps taken together (`LocalAdam.solve_cohort`)."""
        adam_problems = [AdamProblem(p.center, p.v, p.rho, p.center) for p in problems]
        solved = adam_cohort(self.adam, adam_problems, data, generators, gradients)
        return [PointResult(theta, steps, True) for theta, steps in solved]
