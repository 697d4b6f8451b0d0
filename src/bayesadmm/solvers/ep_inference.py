"""Tilted inference for FedEP clients with a neural network (Guo et al. 2023, Sec. 2.2.2): methods I, M, L and V.

Each method is an `inference(family, data, cavity, generator, start=None) -> tilted natural` for
`bayesadmm.algorithms.fedep.make` / `make_fedpa`, with the diagonal family and data that offers `num_examples` and
`batch_loss(θ, idx)` (mean loss over the examples idx; `problems.neural.ClassificationData`). Everything is in
MEAN-loss units, like the other local solvers: the tilted objective (digest §1.6, the paper's L_k divided by n_k) is

    L̄_k(θ) = ℓ̄_k(θ) + (1/n_k)(½ θᵀΛ_{−k}θ − η_{−k}ᵀθ),

so a training run adds the linear term a = −η_{−k}/n_k and the per-coordinate weight b = Λ_{−k}/n_k (around 0) to the
minibatch gradient of ℓ̄_k. Local training starts at `start` (FedPA passes the global mean) or else at the cavity
mean (0 where the cavity precision is not positive). All randomness (minibatch order, label draws, parameter draws)
comes from the client's generator. The tilted precision Λ̂ of each method:

    I (ScaledIdentity):  mean = argmin L̄_k by LocalAdam;   Λ̂ = Λ_{−k} + α n_k
                         ([CODE]: site precision α per data point; the paper's "Σ = α_cov I" literally would ignore
                         the cavity)
    L (Laplace):         mean as I;                         Λ̂ = Λ_{−k} + H_k + α n_k,
                         H_k = Σ_i (∇_θ log p(ŷ_i | x_i, θ̂))², ŷ_i ∼ p(y | x_i, θ̂)
    M (SGMCMC):          N samples θ^(1..N) of SGD(momentum) on L̄_k, one at the end of each epoch (Alg. 2; no
                         Polyak averaging, footnote 4); mean = their average; Σ = ρ + (1 − ρ) Var_emp (shrinkage ρ);
                         Λ̂ = 1/Σ clipped to mean ± 2 std over the coordinates and rescaled so that ‖Λ̂‖₂ equals
                         ‖Λ_{−k} + α n_k‖₂, the scaled-identity precision ([CODE]; the paper only names the
                         "MCMC shrinkage" hyperparameter)
    V (NGVI):            mean as I, not updated by NGVI (Alg. 5); s_t = β s_{t−1} + (1 − β) F_t with F_t the average
                         over N draws θ ∼ N(mean, Σ_{t−1}) of the per-example diagonal Fisher, and
                         Σ_t = (n_k s_t + Λ_{−k} + α n_k)⁻¹;  Λ̂ = Σ_T⁻¹

H_k is the diagonal Fisher with model-sampled labels (Kunstner et al. 2019), averaged over `fisher_samples` label draws
and summed (not averaged) over the client's examples ([CODE]; the paper's expectation omits n_k). α n_k keeps the
precision positive where the Fisher vanishes (L, V; with α = 0, V is the paper's Σ = (|D_k| s + Σ_{−k}⁻¹)⁻¹). For V
the update of s runs per minibatch with F_t the minibatch's mean per-example Fisher ([CODE]; `batch_size=None` gives
Alg. 5 as printed: one update per epoch with the full-data Fisher), s_0 = 0 ([CODE]) and, by default, Adam's bias
correction ŝ_t = s_t / (1 − β^t) in place of s_t (the paper says the update is "algorithmically similar to Adam" but
gives neither s_0 nor a correction; without it s_T ≈ (1 − β^T)·F, which for β = 0.99 and T = 5 epochs keeps the
tilted precision near the cavity's; `debias=False` is the printed recursion).

A cavity with a negative precision can make L̄_k unbounded below; EP offers no guarantee there, and a non-positive
tilted precision raises SubproblemError.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.families import DiagonalGaussian
from bayesadmm.solvers.adam import LocalAdam, minibatches


def _check(family) -> None:
    if not isinstance(family, DiagonalGaussian):
        raise TypeError(f"neural tilted inference uses the diagonal family, got {family!r}")


def _subproblem_error(message: str):
    from bayesadmm.solvers.von import SubproblemError

    return SubproblemError(message)


def _positive_int(key: str, value) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        return [f"{key} must be a positive integer, got {value!r}"]
    return []


def _number_in(key: str, value, low: float, high: float, low_open: bool = False,
               high_open: bool = False) -> list[str]:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        return [f"{key} must be a number in {interval}, got {value!r}"]
    return []


def _raise(owner: str, problems: list[str]) -> None:
    if problems:
        raise ValueError(f"{owner}: " + "; ".join(problems))


def cavity_precision(cavity) -> Tensor:
    """Λ_{−k} = −2λ₂ of the (diagonal) cavity tuple."""
    return -2.0 * cavity[1]


def _start(cavity, start: Tensor | None) -> Tensor:
    """Where local training starts: `start` if given, else the cavity mean (0 where Λ_{−k} ≤ 0)."""
    if start is not None:
        return start
    eta, precision = cavity[0], cavity_precision(cavity)
    safe = torch.where(precision > 0, precision, torch.ones_like(precision))
    return torch.where(precision > 0, eta / safe, torch.zeros_like(eta))


def _cavity_terms(data, cavity) -> tuple[Tensor, Tensor]:
    """(a, b) of the tilted objective in mean-loss units: a = −η_{−k}/n_k, b = Λ_{−k}/n_k."""
    n = data.num_examples
    return -cavity[0] / n, cavity_precision(cavity) / n


def tilted_mean(solver: LocalAdam, data, cavity, generator: torch.Generator, start: Tensor | None = None) -> Tensor:
    """argmin_θ ℓ̄_k(θ) + (½θᵀΛ_{−k}θ − η_{−k}ᵀθ)/n_k, by LocalAdam from `start` (default: the cavity mean)."""
    linear, weight = _cavity_terms(data, cavity)
    theta, _ = solver.train(data, _start(cavity, start), generator, linear=linear, prox_weight=weight,
                            prox_center=torch.zeros_like(linear))
    return theta


def _tilted(mean: Tensor, precision: Tensor):
    if not bool((precision > 0).all()) or not bool(torch.isfinite(mean).all()):
        raise _subproblem_error("the tilted precision is not positive (or the mean is not finite)")
    return (precision * mean, -0.5 * precision)


def diagonal_fisher(data, theta: Tensor, generator: torch.Generator, samples: int = 1,
                    batch_size: int = 256, idx: Tensor | None = None) -> Tensor:
    """Σ_{i∈idx} E_{ŷ∼p(y|x_i,θ)}[(∇_θ log p(ŷ | x_i, θ))²], estimated with `samples` label draws per example
    (idx: all examples by default)."""
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
        X = data.X[start:start + batch_size] if idx is None else data.X[idx[start:start + batch_size]]
        with torch.no_grad():
            probs = torch.softmax(model.forward(theta, X), -1)
        for _ in range(samples):
            y = rng.multinomial(probs, generator)
            onehot = torch.nn.functional.one_hot(y, probs.shape[-1]).to(theta.dtype)
            total = total + per_example(theta, X, onehot).square().sum(0)
    return total / samples


# ---------------------------------------------------------------------------
# I and L
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaledIdentity:
    """Method I: tilted mean by LocalAdam, tilted precision Λ_{−k} + α n_k."""

    alpha: float = 1e-2
    solver: LocalAdam = field(default_factory=LocalAdam)

    def __call__(self, family, data, cavity, generator: torch.Generator, start: Tensor | None = None):
        _check(family)
        mean = tilted_mean(self.solver, data, cavity, generator, start)
        return _tilted(mean, cavity_precision(cavity) + self.alpha * data.num_examples)


@dataclass(frozen=True)
class Laplace:
    """Method L: tilted mean by LocalAdam, tilted precision Λ_{−k} + H_k (diagonal sampled-label Fisher) + α n_k."""

    alpha: float = 1e-4
    fisher_samples: int = 1
    solver: LocalAdam = field(default_factory=LocalAdam)

    def __call__(self, family, data, cavity, generator: torch.Generator, start: Tensor | None = None):
        _check(family)
        mean = tilted_mean(self.solver, data, cavity, generator, start)
        fisher = diagonal_fisher(data, mean, generator, self.fisher_samples)
        return _tilted(mean, cavity_precision(cavity) + fisher + self.alpha * data.num_examples)


# ---------------------------------------------------------------------------
# M: SG-MCMC moments with shrinkage
# ---------------------------------------------------------------------------


def sgd_chain(data, start: Tensor, generator: torch.Generator, lr: float, momentum: float, epochs: int,
              batch_size: int, linear: Tensor | None = None, prox_weight: Tensor | float = 0.0) -> Tensor:
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
            with torch.no_grad():
                if linear is not None:
                    theta.grad.add_(linear)
                if has_prox:
                    theta.grad.add_(prox_weight * theta)
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
    _raise("shrunk_moments", _number_in("shrinkage", shrinkage, 0.0, 1.0))
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
    """Method M: moments of an SG-MCMC chain on the tilted objective, with shrinkage (see the module docstring).

    alpha: α of the scaled-identity precision Λ_{−k} + α n_k whose norm the estimate takes. shrinkage: ρ ∈ [0, 1]
    (paper: 1e-4 CIFAR/EMNIST, 1e-6 StackOverflow). lr, momentum, batch_size: the SGD of the chain (paper: momentum
    0.9). epochs: N, the number of samples, one per epoch (the paper's "client epochs"). clip_std: the clipping
    width in standard deviations (None: no clipping).
    """

    alpha: float = 1e-2
    shrinkage: float = 1e-4
    lr: float = 1e-2
    momentum: float = 0.9
    epochs: int = 5
    batch_size: int = 32
    clip_std: float | None = 2.0

    def __post_init__(self) -> None:
        problems = (_number_in("alpha", self.alpha, 0.0, math.inf, low_open=True, high_open=True)
                    + _number_in("shrinkage", self.shrinkage, 0.0, 1.0)
                    + _number_in("lr", self.lr, 0.0, math.inf, low_open=True, high_open=True)
                    + _number_in("momentum", self.momentum, 0.0, 1.0, high_open=True)
                    + _positive_int("epochs", self.epochs)
                    + _positive_int("batch_size", self.batch_size))
        if self.clip_std is not None:
            problems += _number_in("clip_std", self.clip_std, 0.0, math.inf, high_open=True)
        _raise("SGMCMC", problems)

    def samples(self, data, cavity, generator: torch.Generator, start: Tensor | None = None) -> Tensor:
        """The chain's N samples (N, d) on the tilted objective."""
        linear, weight = _cavity_terms(data, cavity)
        return sgd_chain(data, _start(cavity, start), generator, self.lr, self.momentum, self.epochs,
                         self.batch_size, linear=linear, prox_weight=weight)

    def __call__(self, family, data, cavity, generator: torch.Generator, start: Tensor | None = None):
        _check(family)
        mean, variance = shrunk_moments(self.samples(data, cavity, generator, start), self.shrinkage)
        if not bool((variance > 0).all()):
            raise _subproblem_error("SG-MCMC: a coordinate has zero sample variance; use shrinkage > 0")
        target = (cavity_precision(cavity) + self.alpha * data.num_examples).norm()
        return _tilted(mean, clip_and_rescale(1.0 / variance, target, self.clip_std))


# ---------------------------------------------------------------------------
# V: natural-gradient VI for the covariance, with the cavity as prior
# ---------------------------------------------------------------------------

# fisher(data, θ, idx, generator) -> Σ_{i ∈ idx} F_i(θ), the summed per-example diagonal Fisher
Fisher = Callable[[object, Tensor, Tensor, torch.Generator], Tensor]


@dataclass(frozen=True)
class NGVI:
    """Method V (Alg. 5): the tilted mean as in I, then T_NGVI epochs of the NGVI precision update.

    alpha: α in Λ̂ = Λ_{−k} + n_k s + α n_k (0: the paper's formula; > 0 keeps Λ̂ positive where the Fisher
    vanishes and makes the first draws finite under a uniform cavity). beta: β_NGVI ∈ [0, 1) (paper: 0.99).
    epochs: T_NGVI passes over the data (paper: 5–10). samples: N_NGVI parameter draws per update (paper: 5–10).
    batch_size: examples per update of s (None: one update per epoch with the full-data Fisher, Alg. 5 as printed).
    fisher_samples: label draws per example for the sampled-label Fisher. debias: Adam's bias correction of s.
    fisher: the summed-Fisher estimator (default: `diagonal_fisher` for softmax classifiers).
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
        problems = (_number_in("alpha", self.alpha, 0.0, math.inf, high_open=True)
                    + _number_in("beta", self.beta, 0.0, 1.0, high_open=True)
                    + _positive_int("epochs", self.epochs)
                    + _positive_int("samples", self.samples)
                    + _positive_int("fisher_samples", self.fisher_samples))
        if self.batch_size is not None:
            problems += _positive_int("batch_size", self.batch_size)
        _raise("NGVI", problems)

    def _fisher(self, data, theta: Tensor, idx: Tensor, generator: torch.Generator) -> Tensor:
        if self.fisher is not None:
            return self.fisher(data, theta, idx, generator)
        return diagonal_fisher(data, theta, generator, self.fisher_samples, idx=idx)

    def average_fisher(self, data, mean: Tensor, cavity, generator: torch.Generator) -> Tensor:
        """s_T (bias-corrected if `debias`): the running average of the per-example Fisher at draws from the
        current q^{\\k} = N(mean, (n_k s + Λ_{−k} + α n_k)⁻¹)."""
        n = data.num_examples
        floor = cavity_precision(cavity) + self.alpha * n       # Σ_0⁻¹ (s_0 = 0)
        if not bool((floor > 0).all()):
            raise _subproblem_error("NGVI: Λ_{-k} + α n_k is not positive, so the first draws are undefined "
                                    "(use alpha > 0 with an improper cavity)")
        s = torch.zeros_like(mean)
        s_hat = s
        batch = n if self.batch_size is None else self.batch_size
        steps = 0
        for idx in minibatches(n, batch, self.epochs, generator, mean.device):
            std = (n * s_hat + floor).rsqrt()
            noise = rng.randn((self.samples, mean.shape[0]), generator, mean.dtype, mean.device)
            fisher = sum(self._fisher(data, mean + std * eps, idx, generator) for eps in noise)
            fisher = fisher / (self.samples * idx.shape[0])      # mean over draws and over the minibatch
            s = self.beta * s + (1.0 - self.beta) * fisher
            steps += 1
            s_hat = s / (1.0 - self.beta ** steps) if self.debias else s
        return s_hat

    def __call__(self, family, data, cavity, generator: torch.Generator, start: Tensor | None = None):
        _check(family)
        mean = tilted_mean(self.solver, data, cavity, generator, start)
        s = self.average_fisher(data, mean, cavity, generator)
        n = data.num_examples
        return _tilted(mean, cavity_precision(cavity) + n * s + self.alpha * n)
