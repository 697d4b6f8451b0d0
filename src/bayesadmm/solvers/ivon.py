"""IVON (Alg. 2) as the BayesADMM client solver for the diagonal family: the local step of IVON-ADMM (Alg. 1).

The client problem of tempered BayesADMM (App. D.4, Eq. 66) with q_k = N(m, diag(s)⁻¹), η_k = (v_k, −½u_k),
broadcast q_g = N(m_g, diag(s_g)⁻¹), temperature τ and N_k examples,

    argmin_q  E_q[Σ_i ℓ_k^(i)(θ)/τ + v_kᵀθ − ½ θᵀdiag(u_k)θ] + ρ KL(q ‖ q_g),

divided by ρ is Alg. 2's objective λ E_q[ℓ̄(θ) + vᵀθ − ½θᵀdiag(u)θ] + KL(q ‖ p) with the MEAN loss ℓ̄, prior p = q_g and

    λ = N_k/(ρτ),   v = τ v_k / N_k,   u = τ u_k / N_k                                          (Eq. 67)

so IVON's weight decay is the vector δ = s_g/λ. What a round's IVON state starts from is the solver's `start` object:
`RestartAtHessInit` (the default) is Alg. 2 as written, m ← m_g, g ← 0, h ← h0, so the client's first posterior is
N(m_g, diag(s_g + λh0)⁻¹), q_g with λh0 of extra precision. `RestartAtQg` starts the rounds after the first at q_g
itself (h ← 0, so λ(h + δ) = s_g), which is what the authors' public code does (it resets IVON's posterior to q_g after
each server step; only round 1, where q_g is the wide prior, uses h0). The two differ in the early rounds: λh0
(3000–6000 on average for the FashionMNIST presets) is added to every s_k each round (β2^steps of it survives the
round), so δ = s_g/λ stays ≳ h0 and caps the step lr/(h + δ) on flat coordinates. Neither carries the optimizer's
state across rounds or shares it between clients; a `RoundStart` of one's own may (it is told each solve's final state).
The step size is the solver's `schedule` object: `ConstantLR`, `CosineLR(rounds)`, or either wrapped in `RescaledLR`.
IVON returns s = λ(h + δ), which already includes the prior's precision s_g.

`data` is anything with `num_examples` and `batch_loss(theta, idx)` (the mean loss over examples `idx`): the convex
per-example losses, or `problems.neural.ClassificationData` for neural networks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple, Protocol

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.checks import all_finite, all_positive
from bayesadmm.families import DiagonalGaussian
from bayesadmm.optim import ivon
from bayesadmm.optim.compilation import Kernels, kernels_for
from bayesadmm.solvers.adam import minibatches
from bayesadmm.solvers.cohort import CohortGradients, StackedClients, batch_gradients
from bayesadmm.solvers.cohort_ivon import ivon_cohort
from bayesadmm.solvers.von import SolveResult, SubproblemError, VariationalProblem, VariationalSolver

# --- the step size of a round ---------------------------------------------------------------------------------------


class LRSchedule(Protocol):
    def step_size(self, lr: float, round_: int, hess_init: float, delta: Tensor) -> float | Tensor:
        """IVON's step size α in round `round_` (1-based) for base rate `lr`, initial Hessian h0 = `hess_init` and
        weight decay δ = `delta` (a scalar, or a per-coordinate tensor)."""


@dataclass(frozen=True)
class ConstantLR:
    """α = lr in every round (Alg. 2)."""

    def step_size(self, lr: float, round_: int, hess_init: float, delta: Tensor) -> float:
        return lr


@dataclass(frozen=True)
class CosineLR:
    """α = lr cosine-decayed to 0 over `rounds` rounds, stepped once per round (torch's CosineAnnealingLR with
    T_max = rounds, as the authors used); held at 0 after the last."""

    rounds: int

    def __post_init__(self) -> None:
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"CosineLR: rounds must be an integer >= 1, got {self.rounds!r}")

    def step_size(self, lr: float, round_: int, hess_init: float, delta: Tensor) -> float:
        t = min(max(round_ - 1, 0), self.rounds)
        return 0.5 * lr * (1.0 + math.cos(math.pi * t / self.rounds))


@dataclass(frozen=True)
class RescaledLR:
    """α = (the inner schedule's α)·(h0 + δ), per coordinate: the ivon-opt package's `rescale_lr`, which makes the
    first steps, where h + δ = h0 + δ, plain SGD steps of size lr."""

    inner: LRSchedule = field(default_factory=ConstantLR)

    def step_size(self, lr: float, round_: int, hess_init: float, delta: Tensor) -> float | Tensor:
        return self.inner.step_size(lr, round_, hess_init, delta) * (hess_init + delta)


# --- what a round's IVON state starts from --------------------------------------------------------------------------


class RoundStart(Protocol):
    def initial_state(self, m_g: Tensor, hess_init: float, round_: int, data) -> ivon.IVONState:
        """The IVON state a client's solve in round `round_` (1-based) starts from, given the broadcast mean `m_g`,
        h0 = `hess_init` and the client's `data` (the same object each round within a process). Its tensors must be
        this solve's own: the solve updates them in place."""

    def finished(self, data, state: ivon.IVONState) -> None:
        """Told the state the solve on `data` ended with (before the posterior is read off it)."""


@dataclass(frozen=True)
class RestartAtHessInit:
    """Every round starts at m = m_g, h = h0, g = 0, t = 0: Alg. 2 as written."""

    def initial_state(self, m_g: Tensor, hess_init: float, round_: int, data) -> ivon.IVONState:
        return ivon.init(m_g, hess_init)

    def finished(self, data, state: ivon.IVONState) -> None:
        pass


@dataclass(frozen=True)
class RestartAtQg:
    """Round 1 starts at h = h0 (q_g is then the wide prior), every later round at h = 0, i.e. at q_g itself
    (λ(h + δ) = s_g), as the authors' code resets IVON's posterior after each server step; m = m_g, g = 0, t = 0."""

    def initial_state(self, m_g: Tensor, hess_init: float, round_: int, data) -> ivon.IVONState:
        return ivon.init(m_g, hess_init if round_ <= 1 else 0.0)

    def finished(self, data, state: ivon.IVONState) -> None:
        pass


@dataclass(frozen=True)
class IVONSolver(VariationalSolver):
    lr: float
    epochs: int = 1
    batch_size: int = 32
    tau: float = 1.0
    hess_init: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.99999
    mc_samples: int = 1
    clip_radius: float = float("inf")
    schedule: LRSchedule = field(default_factory=ConstantLR)  # the step size of each round
    start: RoundStart = field(default_factory=RestartAtHessInit)  # what each round's IVON state starts from
    # the compiled kernels or the eager maths (equal to rounding): a run's `compile` setting decides
    # (`optim.compilation.decide`, e.g. eagerly for a small model whose run would not win back the compilation)
    compiled: bool = True
    # Poisson minibatches (`solvers.cohort.poisson_minibatches`: example-level DP's sampling, set by
    # `privacy.example_level`) in place of the epochs' shuffles
    poisson: bool = False
    # one client at a time where the engine chooses on a CPU: IVON's per-step passes over the parameters (drawing
    # the noise, the update) cost per client what they cost batched: cohorts of 5 to 32 took 1.03-1.19 of the
    # per-client round's time on one thread (`python benchmarks/cohort.py --method ivon-admm`) and 1.09 of it with
    # two workers on fmnist-heterog10 (`python benchmarks/runners.py --method ivon-admm`; docs/performance.md)
    cpu_cohort: ClassVar[int] = 1
    needs_generator: ClassVar[bool] = True  # it shuffles the minibatches and draws the weight noise
    # its only use of the data is the minibatch gradients at its weight samples (`batch_grad`; in a cohort,
    # `gradients`), so example-level DP can replace them (`privacy.example_level`, with one sample a step)
    private_gradients: ClassVar[bool] = True

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be > 0, got {value}"
            for name, value in (
                ("lr", self.lr),
                ("epochs", self.epochs),
                ("batch_size", self.batch_size),
                ("tau", self.tau),
                ("mc_samples", self.mc_samples),
            )
            if not value > 0  # also refuses NaN
        ]
        if not self.hess_init >= 0:
            problems.append(f"hess_init must be >= 0, got {self.hess_init}")
        problems += [
            f"{name} must lie in [0, 1), got {b}"
            for name, b in (("beta1", self.beta1), ("beta2", self.beta2))
            if not 0 <= b < 1
        ]
        if not self.clip_radius > 0:
            problems.append(f"clip_radius must be > 0 (inf: no clipping), got {self.clip_radius}")
        if problems:
            raise ValueError("IVONSolver: " + "; ".join(problems))

    @property
    def kernels(self) -> Kernels:
        """The fused kernels the solves call: compiled or eager, as `compiled` says."""
        return kernels_for(self.compiled)

    def setup(self, problem: VariationalProblem, data, generator: torch.Generator) -> Setup:
        """Everything a client's solve starts from (the first draw from its generator, the noise key, included)."""
        if not isinstance(problem.family, DiagonalGaussian):
            raise TypeError(f"IVON learns diagonal Gaussians, not the {problem.family.name} family")
        m_g, s_g = problem.family.to_moments(problem.lam_g)
        n = data.num_examples
        ess = n / (problem.rho * self.tau)  # Eq. 67
        # v = τ v_k / n and u = τ u_k / n with (v_k, u_k) = (η₁, −2η₂), each computed into one new tensor (the same
        # operations in the same order; a fresh model-sized tensor costs about as much as the arithmetic)
        v = torch.mul(problem.eta[0], self.tau).div_(n)
        u = torch.mul(problem.eta[1], -2.0).mul_(self.tau).div_(n)
        delta = s_g / ess
        lr = self.schedule.step_size(self.lr, problem.round_, self.hess_init, delta)

        state = self.start.initial_state(m_g, self.hess_init, problem.round_, data)
        ivon.check_noise_scale(state, ess, delta)  # h + δ > 0 (δ = s_g/ess > 0 as q_g is valid): checked once here
        # the weight noise: a counter-based stream keyed once per solve (drawn in IVON's fused sampling kernel);
        # the generator also shuffles the minibatches
        noise_key = rng.stream_key(generator)
        # the hot loop skips the per-step elementwise checks; non-finite results are caught by `result`
        terms = ivon.update_terms(
            m_g,
            lr=lr,
            ess=ess,
            delta=delta,
            beta1=self.beta1,
            beta2=self.beta2,
            prior_mean=m_g,
            v=v,
            u=u,
            clip_radius=self.clip_radius,
            check=False,
            # example-level DP's gradients carry noise of a known variance, whose share of the Hessian update the
            # kernels remove (optim.ivon, "Gradients with known noise"); other data have none
            grad_noise=getattr(data, "gradient_noise", None),
        )
        return Setup(state, terms, ess, delta, noise_key)

    def result(self, problem: VariationalProblem, data, state: ivon.IVONState, setup: Setup, steps: int) -> SolveResult:
        """The solve's posterior from its final IVON state after `steps` steps (told to the round start first)."""
        self.start.finished(data, state)
        mean, precision = ivon.posterior(state, setup.ess, setup.delta)
        if not (all_finite(mean) and all_positive(precision)):
            raise SubproblemError(
                "IVON diverged on this client (non-finite mean or non-positive precision); lower lr or the dual step"
            )
        return SolveResult(problem.family.from_moments(mean, precision), steps, True)

    def solve_cohort(
        self,
        problems: Sequence[VariationalProblem],
        data: StackedClients,
        generators: Sequence[torch.Generator],
        gradients: CohortGradients = batch_gradients,
    ) -> list[SolveResult]:
        """`solve_problem` for each client of a cohort, all clients' steps taken together (`solvers.cohort_ivon`):
        the same shuffles and noise, and the same numbers up to rounding. `gradients`: each step's minibatch
        gradients at the samples."""
        return ivon_cohort(self, problems, data, generators, gradients)

    def solve(
        self, family, data, lam_g, eta, rho: float, generator: torch.Generator, init=None, round_: int = 1
    ) -> SolveResult:
        problem = VariationalProblem(family, lam_g, eta, rho, round_)
        state, terms, ess, delta, noise_key = setup = self.setup(problem, data, generator)
        steps = 0
        try:
            kernels = self.kernels
            thetas, eps = ivon.sample(state, ess, delta, noise_key, self.mc_samples, check=False, kernels=kernels)
            batches = minibatches(
                data.num_examples, self.batch_size, self.epochs, generator, state.mean.device, self.poisson
            )
            idx = next(batches, None)
            while idx is not None:
                grads = (
                    _grad(data, thetas[0], idx).unsqueeze(0)
                    if self.mc_samples == 1  # a view, no copy
                    else torch.stack([_grad(data, theta, idx) for theta in thetas])
                )
                # (only the shuffles draw from the generator, so looking one batch ahead changes no number)
                idx = next(batches, None)
                # in place: the state is this solve's own (RoundStart's contract; ivon.init copies m_g)
                if idx is None:  # the last step: no sample after it (its noise is a third of a 2-step client's)
                    state = ivon.update_with(state, grads, eps, terms, inplace=True, kernels=kernels)
                else:  # the update and the next step's samples in one pass
                    state, thetas, eps = ivon.update_and_sample_with(
                        state, grads, eps, noise_key, self.mc_samples, terms, inplace=True, kernels=kernels
                    )
                steps += 1
        except ValueError as exc:  # IVON refuses to sample once h + δ ≤ 0: the dual curvature won
            raise SubproblemError(f"IVON's precision stopped being positive after {steps} steps: {exc}") from exc
        return self.result(problem, data, state, setup, steps)


class Setup(NamedTuple):
    """A client's IVON solve at its start (`IVONSolver.setup`)."""

    state: ivon.IVONState
    terms: ivon.UpdateTerms
    ess: float
    delta: Tensor
    noise_key: Tensor


def _grad(data, theta: Tensor, idx: Tensor) -> Tensor:
    """∇ of the mean loss over `idx` at `theta`: the data's own `batch_grad` where it has one (`SupervisedData`:
    without an autograd graph for an MLP), autograd of `batch_loss` at a fresh leaf otherwise (nothing leaks between
    samples)."""
    batch_grad = getattr(data, "batch_grad", None)
    if batch_grad is not None:
        return batch_grad(theta, idx)
    theta = theta.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(data.batch_loss(theta, idx), theta)
    return grad
