r"""Likelihoods ``p(y | f(x; θ))``: the training loss of a model's outputs and the metrics of its predictions.

A ``Likelihood`` is three pure functions of tensors, so the training loop and ``bayesadmm.metrics.evaluate``
work for any observation model:

    mean_nll(F, Y)    = (1/N) Σ_i −log p(y_i | f_i)                   the training loss, differentiable in F
    predictive(F)     = a per-example summary of S draws f_{s,i}      concatenated over evaluation batches (dim 0)
    metrics(P, Y)     = the metrics of the whole evaluation set       from the concatenated summaries

with ``F`` the model outputs of ``N`` examples (``(N, ...)`` for ``mean_nll``, ``(S, N, ...)`` under ``S`` parameter
draws for ``predictive``, ``S = 1`` at the posterior mean).  A likelihood may also give the loss's gradient in closed
form, which cohort training (``solvers.cohort``) then uses instead of autograd at every local step:

    nll_grad(F, Y, W) = ∂/∂F Σ_i w_i (−log p(y_i | f_i))               optional; ``Classification`` has it

Second-order and function-space methods need more than the loss. The optional protocol ``CurvatureLikelihood`` adds,
for the outputs ``F (N, C)`` of ``N`` examples flattened to ``C`` numbers each,

    output_hessian(F)       = ∇²_f (−log p(y | f_i)), (N, C, C)   Λ_i of the GGN Σ_i J_iᵀ Λ_i J_i (FedLap-Cov's "ggn")
    sample_targets(F, gen)  = ŷ_i ∼ p(y | f_i)                    the sampled-target Fisher (FedLap-Cov's "mc-fisher";
                                                                 FedEP/FedSEP/FedPA's Laplace and NGVI inference)
    soft_targets(F)         = E[y | f_i]                          FedLap-Func's soft labels ŷ_i

``Classification`` (softmax: ``diag(p) − ppᵀ``), ``GaussianRegression`` (``I / noise²``) and ``Poisson`` (log link:
``diag(exp f)``) have all three; ``NegLogLikelihood`` those it is given. All three are canonical-link exponential
families, ``−log p(y | f) = A(f) − yᵀf + c(y)``, so the Hessian ``∇²A(f)`` does not depend on ``y`` and is also the
Fisher, and ``mean_nll(·, soft_targets(f))`` is smallest at ``f`` (its gradient ``∇A(f) − E[y | f]`` vanishes), which
is what FedLap-Func's fixed points rely on. A method that needs one of them checks for it with ``require`` when it is
built, so a likelihood without it is refused before training, never silently replaced by the softmax's.

The GGN consumes a factor ``L_i L_iᵀ = Λ_i`` of each output Hessian, which a likelihood may give in closed form,

    output_hessian_factor(F)  = L, (N, C, K)                          optional; else the symmetric square root

as the built-in three do (softmax: columns ``√p_c (p − e_c)``, accurate however small ``p_c``, where the
eigenvectors of a nearly degenerate ``Λ_i`` are not).

The implementations are frozen dataclasses of plain values, so they pickle into worker processes; names such as
``"gaussian"`` are mapped to them by the config layer.

``GaussianRegression``, ``Poisson`` and ``NegLogLikelihood`` score the posterior predictive as the exact mixture
``(1/S) Σ_s p(y | f_s)`` through ``logsumexp``, which stays finite where the individual densities underflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.nn import functional as F

from bayesadmm import rng

__all__ = [
    "COVERAGE_LEVELS",
    "CURVATURE_MEMBERS",
    "Classification",
    "CurvatureLikelihood",
    "GaussianRegression",
    "Likelihood",
    "NegLogLikelihood",
    "MissingCurvatureError",
    "Poisson",
    "require",
]

# central-interval levels whose mean |coverage − level| is GaussianRegression's calibration_error
COVERAGE_LEVELS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@runtime_checkable
class Likelihood(Protocol):
    """An observation model ``p(y | f)`` of the targets given the model's outputs ``f``. The methods that need its
    curvature read the optional members of ``CurvatureLikelihood`` (module docstring)."""

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean negative log-likelihood over the batch (a differentiable scalar): the training loss."""
        ...

    def predictive(self, outputs: Tensor) -> Tensor:
        """outputs (S, N, ...) of the model under S parameter draws (S = 1 for the posterior mean) -> a per-example
        summary (N, ...) that can be concatenated over batches along dim 0."""
        ...

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """The metrics of the whole evaluation set from the concatenated summaries."""
        ...


@runtime_checkable
class CurvatureLikelihood(Likelihood, Protocol):
    """A ``Likelihood`` that also knows the curvature of its loss in the outputs and can draw targets from itself:
    what FedLap-Cov, FedLap-Func and the Laplace and NGVI inference of FedEP, FedSEP and FedPA consume (module
    docstring). ``outputs (N, C)`` are the model's outputs of N examples flattened to C numbers each."""

    def output_hessian(self, outputs: Tensor) -> Tensor:
        """``(N, C, C)``: the Hessian ``∇²_f (−log p(y | f_i))`` of each example's negative log-likelihood in its
        outputs, positive semi-definite and independent of ``y`` (for a non-canonical link give the Fisher
        ``E_y[∇_f log p ∇_f log pᵀ]`` instead, which is what the GGN needs)."""
        ...

    def sample_targets(self, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        """One target per example drawn from ``p(y | f_i)`` with ``generator``, in a form ``mean_nll`` takes."""
        ...

    def soft_targets(self, outputs: Tensor) -> Tensor:
        """``E[y | f_i]`` in a form ``mean_nll`` takes, at which ``mean_nll(·, soft_targets(f))`` is smallest in f."""
        ...


# What each member of CurvatureLikelihood is, for the refusals of the methods that need it
CURVATURE_MEMBERS: dict[str, str] = {
    "output_hessian": "output_hessian(outputs (N, C)) -> (N, C, C), the Hessian of the per-example negative "
    "log-likelihood in the model's outputs",
    "sample_targets": "sample_targets(outputs (N, C), generator) -> targets drawn from p(y | f), for the "
    "sampled-target Fisher",
    "soft_targets": "soft_targets(outputs (N, C)) -> E[y | f], the soft labels of the function-space terms",
}


class MissingCurvatureError(TypeError):
    """A method was given a likelihood without a member of `CurvatureLikelihood` that it needs (`require`)."""


def require(likelihood: object, members: Sequence[str], method: str) -> None:
    """Raise a `MissingCurvatureError` (a TypeError) naming `method`, the likelihood and what to supply unless
    `likelihood` has every one of `members` (names of `CURVATURE_MEMBERS`) as a callable. Called where a method is
    built, so that a likelihood without the curvature it needs is refused before any training, not replaced by
    another's."""
    missing = [name for name in members if not callable(getattr(likelihood, name, None))]
    if not missing:
        return
    what = "; ".join(CURVATURE_MEMBERS[name] for name in missing)
    given = ", ".join(f"{name}=..." for name in missing)
    raise MissingCurvatureError(
        f"{method} needs the likelihood's {' and '.join(missing)}, which {type(likelihood).__name__} does not have "
        f"({what}). Use Classification(), GaussianRegression(noise) or Poisson(), give NegLogLikelihood(fn, {given}), "
        f"implement them on your likelihood (bayesadmm.likelihoods.CurvatureLikelihood), or choose a method that "
        f"needs only the loss (e.g. fedavg, fedlap, ivon-admm, or fedep/fedsep/fedpa with inference='identity' or "
        f"'mcmc')"
    )


@dataclass(frozen=True)
class Classification:
    """Categorical ``p(y | f) = softmax(f)_y`` over logits ``f (N, C)`` and integer labels ``y (N,)``.

    The predictive averages probabilities, not logits (the Monte-Carlo estimate of ``E_q[softmax(f(x; θ))]``), and
    is scored by ``bayesadmm.metrics.classification_metrics``: ``acc``, ``nll``, ``ece`` (``bins`` equal-width
    confidence bins) and ``brier``.
    """

    bins: int = 15

    def __post_init__(self) -> None:
        if isinstance(self.bins, bool) or not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"bins must be a positive integer, got {self.bins!r}")

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``(1/N) Σ_i −log softmax(f_i)_{y_i}`` by ``F.cross_entropy`` (fused log-softmax, no probabilities)."""
        return F.cross_entropy(outputs, targets)

    def nll_grad(self, outputs: Tensor, targets: Tensor, weights: Tensor | float) -> Tensor:
        """``∂/∂F Σ_i w_i (−log softmax(f_i)_{y_i}) = w_i (softmax(f_i) − onehot(y_i))`` for logits ``(..., C)``,
        labels ``(...)`` and weights broadcastable to ``(...)``: a new tensor. Computed by the operation autograd runs
        for ``mean_nll`` (aten's log-softmax backward of −w at the label), so a weight of ``1/N`` gives the bits of
        ``mean_nll``'s backward pass."""
        if isinstance(weights, float) and not targets.is_floating_point():  # one weight: scattered as a number
            outer = torch.zeros_like(outputs).scatter_(-1, targets.unsqueeze(-1), -weights)
        else:
            weights = torch.as_tensor(weights, dtype=outputs.dtype, device=outputs.device)
            weights = weights.expand(outputs.shape[:-1]).unsqueeze(-1)
            if targets.is_floating_point():  # class probabilities, as F.cross_entropy takes them
                outer = targets * weights.neg()
            else:
                outer = torch.zeros_like(outputs).scatter_(-1, targets.unsqueeze(-1), weights.neg())
        log_probs = torch.log_softmax(outputs, dim=-1)
        return torch._log_softmax_backward_data(outer, log_probs, -1, outputs.dtype)

    def output_hessian(self, outputs: Tensor) -> Tensor:
        """``diag(p_i) − p_i p_iᵀ`` with ``p_i = softmax(f_i)``, shape ``(N, C, C)`` for logits ``(N, C)``."""
        p = torch.softmax(outputs, dim=-1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)

    def sample_targets(self, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        """One label per example drawn from ``softmax(f_i)``, shape ``(N,)``."""
        return rng.multinomial(torch.softmax(outputs, dim=-1), generator)

    def output_hessian_factor(self, outputs: Tensor) -> Tensor:
        """``L_i`` with ``L_i L_iᵀ = diag(p_i) − p_i p_iᵀ``, shape ``(N, C, C)``: column c is ``√p_ic (p_i − e_c)``,
        since ``Σ_c p_c (p − e_c)(p − e_c)ᵀ = diag(p) − ppᵀ``."""
        p = torch.softmax(outputs, dim=-1)
        eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
        return (p.unsqueeze(-1) - eye) * p.sqrt().unsqueeze(-2)

    def soft_targets(self, outputs: Tensor) -> Tensor:
        """The class probabilities ``softmax(f_i)``, shape ``(N, C)`` (``mean_nll`` takes probabilities as targets)."""
        return torch.softmax(outputs, dim=-1)

    def classes(self, targets: Tensor) -> Tensor:
        """The class of each target, ``(N,)``: the label, or the most probable class of probability targets ``(N, C)``
        (what FedLap-Func draws its memory within)."""
        return targets.argmax(dim=-1) if targets.is_floating_point() else targets

    def predictive(self, outputs: Tensor) -> Tensor:
        """``(1/S) Σ_s softmax(f_s)``, shape ``(N, C)``; for ``S = 1`` the same bits as ``softmax(f_1)``."""
        _check_draws(outputs)
        return torch.softmax(outputs, dim=-1).mean(dim=0)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``acc``, ``nll``, ``ece``, ``brier`` of the predictive probabilities ``summary (N, C)``."""
        from bayesadmm.metrics import classification_metrics  # a lazy import: metrics imports this module

        return classification_metrics(summary, targets, self.bins)


@dataclass(frozen=True)
class GaussianRegression:
    r"""Homoscedastic Gaussian ``y ~ N(f(x), noise²)`` of real targets ``(N,)`` or ``(N, D)``, independent over ``D``.

    Outputs have the targets' shape; a model whose outputs carry one extra trailing dimension of size 1 (a
    ``Linear(·, 1)`` head for targets ``(N,)``) has it squeezed, so either head fits scalar targets.  Targets are
    cast to the outputs' dtype.

    ``metrics`` of the draws ``f_s`` (``s = 1, …, S``) and their mean ``f̄ = (1/S) Σ_s f_s``:

        rmse               = sqrt(mean_{i,d} (f̄_id − y_id)²)
        nll                = −(1/N) Σ_i log (1/S) Σ_s Π_d N(y_id; f_sid, noise²)
        coverage_α         = fraction of (i, d) with |y_id − f̄_id| ≤ z_α sqrt(noise² + var_s f_sid),
                             z_α = Φ⁻¹((1 + α)/2), var_s the population variance over the draws
        coverage90         = coverage_0.9
        calibration_error  = mean over α ∈ COVERAGE_LEVELS of |coverage_α − α|

    The intervals are those of the moment-matched predictive ``N(f̄, noise² + var_s f)``: exact for ``S = 1``, and
    for a Gaussian posterior of a linear model as ``S → ∞``.

    The noise is fixed, not learnt, so the output Hessian ``I / noise²`` is exact (a learnt noise would be a
    parameter outside θ, which no method here updates).
    """

    noise: float

    def __post_init__(self) -> None:
        noise = self.noise
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not math.isfinite(noise) or noise <= 0:
            raise ValueError(
                f"noise must be a finite positive float (the observation standard deviation), got {noise!r}"
            )

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``(1/N) Σ_i Σ_d [½ log(2π noise²) + (y_id − f_id)² / (2 noise²)]``."""
        outputs = _match_targets(outputs, targets, draws=False)
        half_sq = 0.5 * ((outputs - targets.to(outputs.dtype)) / self.noise).square()
        per_example = half_sq.reshape(outputs.shape[0], -1).sum(dim=1)
        return per_example.mean() + _outputs_per_example(targets) * self._log_norm()

    def output_hessian(self, outputs: Tensor) -> Tensor:
        """``I_C / noise²`` for every example, shape ``(N, C, C)``, whatever the outputs."""
        n, c = outputs.shape[0], math.prod(outputs.shape[1:])
        eye = torch.eye(c, dtype=outputs.dtype, device=outputs.device) / self.noise**2
        return eye.expand(n, c, c).clone()

    def output_hessian_factor(self, outputs: Tensor) -> Tensor:
        """``I_C / noise`` for every example, shape ``(N, C, C)``."""
        n, c = outputs.shape[0], math.prod(outputs.shape[1:])
        eye = torch.eye(c, dtype=outputs.dtype, device=outputs.device) / self.noise
        return eye.expand(n, c, c).clone()

    def sample_targets(self, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        """``f_i + noise · ε_i`` with standard normals ``ε`` from ``generator``, the outputs' shape."""
        return outputs + self.noise * rng.randn(outputs.shape, generator, outputs.dtype, outputs.device)

    def soft_targets(self, outputs: Tensor) -> Tensor:
        """``E[y | f] = f``: the outputs themselves."""
        return outputs

    def predictive(self, outputs: Tensor) -> Tensor:
        """The draws themselves, moved to shape ``(N, S, ...)``: the mixture and the intervals need all of them."""
        return _draws_per_example(outputs)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``rmse``, ``nll``, ``coverage90`` and ``calibration_error`` of the draws ``summary (N, S, ...)``."""
        draws = _match_targets(summary, targets, draws=True)
        targets = targets.to(draws.dtype)
        n, s = draws.shape[:2]
        residual = (targets.unsqueeze(1) - draws) / self.noise
        log_density = -(0.5 * residual.square() + self._log_norm()).reshape(n, s, -1).sum(dim=2)  # (N, S)
        nll = _mixture_nll(log_density)

        mean = draws.mean(dim=1)
        sd = (self.noise**2 + draws.var(dim=1, correction=0)).sqrt()
        standardised = ((targets - mean) / sd).abs().reshape(-1)
        levels = torch.tensor(COVERAGE_LEVELS, dtype=draws.dtype, device=draws.device)
        z = torch.special.ndtri((1 + levels) / 2)
        coverage = (standardised[:, None] <= z).to(draws.dtype).mean(dim=0)
        return {
            "rmse": (mean - targets).square().mean().sqrt().item(),
            "nll": nll.item(),
            "coverage90": coverage[COVERAGE_LEVELS.index(0.9)].item(),
            "calibration_error": (coverage - levels).abs().mean().item(),
        }

    def _log_norm(self) -> float:
        """``½ log(2π noise²)``, the normalising constant of one output dimension."""
        return 0.5 * math.log(2 * math.pi * self.noise**2)


@dataclass(frozen=True)
class Poisson:
    r"""Counts ``y ~ Poisson(exp(f(x)))`` (log link) of targets ``(N,)`` or ``(N, D)``, independent over ``D``.

    Targets are non-negative counts, as integers or floats (cast to the outputs' dtype); outputs are log-rates of the
    targets' shape, a trailing singleton dimension squeezed as in ``GaussianRegression``. With the draws' rates
    ``μ_s = exp(f_s)`` and the predictive mean ``μ̄ = (1/S) Σ_s μ_s`` (the mean of ``y`` under the mixture):

        nll       = −(1/N) Σ_i log (1/S) Σ_s Π_d Poisson(y_id; μ_sid)
        rmse      = sqrt(mean_{i,d} (μ̄_id − y_id)²)
        deviance  = mean_{i,d} 2 [y log(y / μ̄) − (y − μ̄)]      (y log y = 0 at y = 0), the mean Poisson deviance

    The output Hessian is ``diag(exp f)``: the variance of ``y``, as for every canonical link.
    """

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``(1/N) Σ_i Σ_d [exp(f_id) − y_id f_id + log y_id!]``."""
        outputs = _match_targets(outputs, targets, draws=False)
        counts = targets.to(outputs.dtype)
        per_output = outputs.exp() - counts * outputs + torch.lgamma(counts + 1)
        return per_output.reshape(outputs.shape[0], -1).sum(dim=1).mean()

    def output_hessian(self, outputs: Tensor) -> Tensor:
        """``diag(exp(f_i))``, shape ``(N, C, C)``."""
        return torch.diag_embed(outputs.reshape(outputs.shape[0], -1).exp())

    def output_hessian_factor(self, outputs: Tensor) -> Tensor:
        """``diag(exp(f_i / 2))``, shape ``(N, C, C)``."""
        return torch.diag_embed((0.5 * outputs.reshape(outputs.shape[0], -1)).exp())

    def sample_targets(self, outputs: Tensor, generator: torch.Generator | None) -> Tensor:
        """Counts (as floats) drawn from ``Poisson(exp(f_i))``, the outputs' shape."""
        return rng.poisson(outputs.exp(), generator)

    def soft_targets(self, outputs: Tensor) -> Tensor:
        """The rates ``E[y | f] = exp(f)``."""
        return outputs.exp()

    def predictive(self, outputs: Tensor) -> Tensor:
        """The draws themselves (log-rates), moved to shape ``(N, S, ...)``: the mixture needs all of them."""
        return _draws_per_example(outputs)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``nll``, ``rmse`` and ``deviance`` of the draws ``summary (N, S, ...)`` (class docstring)."""
        draws = _match_targets(summary, targets, draws=True)
        counts = targets.to(draws.dtype)
        n, s = draws.shape[:2]
        y = counts.unsqueeze(1)
        log_density = (y * draws - draws.exp() - torch.lgamma(y + 1)).reshape(n, s, -1).sum(dim=2)  # (N, S)
        nll = _mixture_nll(log_density)
        rate = draws.exp().mean(dim=1)
        deviance = 2 * (torch.xlogy(counts, counts) - torch.xlogy(counts, rate) - (counts - rate))
        return {
            "nll": nll.item(),
            "rmse": (rate - counts).square().mean().sqrt().item(),
            "deviance": deviance.mean().item(),
        }


@dataclass(frozen=True)
class NegLogLikelihood:
    """A user-written per-example negative log-likelihood ``fn(outputs (N, ...), targets (N, ...)) -> (N,)``.

    ``fn`` sees the targets as they are and the outputs as the model returns them, except that one extra trailing
    dimension of size 1 is squeezed as in ``GaussianRegression`` (so a ``Linear(·, 1)`` head does not
    broadcast ``(N, 1)`` against ``(N,)`` targets into ``(N, N)``).  It must be differentiable in the outputs for
    training, and picklable (a module-level function or a ``functools.partial`` of one, not a lambda) to reach
    worker processes.  The predictive keeps the draws, and the only metric is the mixture's
    ``nll = −(1/N) Σ_i log (1/S) Σ_s exp(−fn(f_s, y)_i)``.

    Without more it serves the methods that need only the loss. The curvature of ``CurvatureLikelihood`` is given as
    optional callables of the same names and signatures (``output_hessian(outputs) -> (N, C, C)``,
    ``sample_targets(outputs, generator)``, ``soft_targets(outputs)``, each with the outputs flattened to ``(N, C)``
    and returning targets that ``fn`` takes); a method that needs one that was not given refuses to start
    (``require``).
    """

    fn: Callable[[Tensor, Tensor], Tensor]
    output_hessian: Callable[[Tensor], Tensor] | None = None
    sample_targets: Callable[[Tensor, torch.Generator | None], Tensor] | None = None
    soft_targets: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"fn must be a callable (outputs, targets) -> per-example NLL (N,), got {self.fn!r}")
        for name in CURVATURE_MEMBERS:
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be None or a callable {CURVATURE_MEMBERS[name]}, got {value!r}")

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``(1/N) Σ_i fn(outputs, targets)_i``."""
        return self._per_example(outputs, targets).mean()

    def predictive(self, outputs: Tensor) -> Tensor:
        """The draws themselves, moved to shape ``(N, S, ...)``."""
        return _draws_per_example(outputs)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``nll`` of the mixture over the draws ``summary (N, S, ...)``."""
        if summary.dim() < 2 or summary.shape[0] != targets.shape[0]:
            raise ValueError(
                f"summary must have shape (N, S, ...) with N = {targets.shape[0]} targets, got {tuple(summary.shape)}"
            )
        s = summary.shape[1]
        nll = torch.stack([self._per_example(summary[:, k], targets) for k in range(s)], dim=1)  # (N, S)
        return {"nll": _mixture_nll(-nll).item()}

    def _per_example(self, outputs: Tensor, targets: Tensor) -> Tensor:
        value = self.fn(_squeeze_singleton(outputs, targets, lead=1), targets)
        n = outputs.shape[0]
        if not isinstance(value, Tensor) or tuple(value.shape) != (n,):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"fn must return the per-example negative log-likelihood, a tensor of shape (N,) = ({n},), "
                f"got {shape}; "
                "sum over the output dimensions inside fn and do not average over the examples"
            )
        return value


def _check_draws(outputs: Tensor) -> None:
    if outputs.dim() < 2 or outputs.shape[0] == 0:
        raise ValueError(f"outputs must have shape (S, N, ...) with S ≥ 1 draws, got {tuple(outputs.shape)}")


def _draws_per_example(outputs: Tensor) -> Tensor:
    """The draws (S, N, ...) as the per-example summary (N, S, ...): a mixture's metrics need every draw."""
    _check_draws(outputs)
    return outputs.movedim(0, 1)


def _mixture_nll(log_density: Tensor) -> Tensor:
    """``−(1/N) Σ_i log (1/S) Σ_s p(y_i | f_s)`` from ``log p(y_i | f_s)`` of shape (N, S), through ``logsumexp``."""
    return -(torch.logsumexp(log_density, dim=1) - math.log(log_density.shape[1])).mean()


def _outputs_per_example(targets: Tensor) -> int:
    """``D``: the number of scalar outputs per example (1 for targets ``(N,)``)."""
    return math.prod(targets.shape[1:])


def _squeeze_singleton(outputs: Tensor, targets: Tensor, lead: int) -> Tensor:
    """``outputs`` without its last dimension if that has size 1 and is one more than ``targets (N, ...)`` has after
    the ``lead`` leading dimensions (``N``, or ``N, S``)."""
    if outputs.dim() == targets.dim() + lead and outputs.shape[-1] == 1:
        return outputs.squeeze(-1)
    return outputs


def _match_targets(outputs: Tensor, targets: Tensor, draws: bool) -> Tensor:
    """``outputs`` of shape ``(N, ...)`` (or ``(N, S, ...)`` with ``draws``) checked against ``targets (N, ...)``,
    with a trailing singleton dimension the targets lack squeezed away."""
    lead = 2 if draws else 1
    expected = "(N, S, ...)" if draws else "(N, ...)"
    outputs = _squeeze_singleton(outputs, targets, lead)
    if (
        outputs.dim() != targets.dim() + lead - 1
        or outputs.shape[:1] != targets.shape[:1]
        or (outputs.shape[lead:] != targets.shape[1:])
    ):
        raise ValueError(
            f"outputs must have shape {expected} matching targets (N, ...) = {tuple(targets.shape)} (one extra "
            f"trailing dimension of size 1 is squeezed), got {tuple(outputs.shape)}"
        )
    return outputs
