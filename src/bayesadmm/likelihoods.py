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

The implementations are frozen dataclasses of plain values, so they pickle into worker processes; names such as
``"gaussian"`` are mapped to them by the config layer.

``GaussianRegression`` and ``NegLogLikelihood`` score the posterior predictive as the exact mixture
``(1/S) Σ_s p(y | f_s)`` through ``logsumexp``, which stays finite where the individual densities underflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.nn import functional as F

__all__ = ["COVERAGE_LEVELS", "Classification", "GaussianRegression", "Likelihood", "NegLogLikelihood"]

# central-interval levels whose mean |coverage − level| is GaussianRegression's calibration_error
COVERAGE_LEVELS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@runtime_checkable
class Likelihood(Protocol):
    """An observation model ``p(y | f)`` of the targets given the model's outputs ``f``."""

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

    def predictive(self, outputs: Tensor) -> Tensor:
        """The draws themselves, moved to shape ``(N, S, ...)``: the mixture and the intervals need all of them."""
        _check_draws(outputs)
        return outputs.movedim(0, 1)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``rmse``, ``nll``, ``coverage90`` and ``calibration_error`` of the draws ``summary (N, S, ...)``."""
        draws = _match_targets(summary, targets, draws=True)
        targets = targets.to(draws.dtype)
        n, s = draws.shape[:2]
        residual = (targets.unsqueeze(1) - draws) / self.noise
        log_density = -(0.5 * residual.square() + self._log_norm()).reshape(n, s, -1).sum(dim=2)  # (N, S)
        nll = -(torch.logsumexp(log_density, dim=1) - math.log(s)).mean()

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
class NegLogLikelihood:
    """A user-written per-example negative log-likelihood ``fn(outputs (N, ...), targets (N, ...)) -> (N,)``.

    ``fn`` sees the targets as they are and the outputs as the model returns them, except that one extra trailing
    dimension of size 1 is squeezed as in ``GaussianRegression`` (so a ``Linear(·, 1)`` head does not
    broadcast ``(N, 1)`` against ``(N,)`` targets into ``(N, N)``).  It must be differentiable in the outputs for
    training, and picklable (a module-level function or a ``functools.partial`` of one, not a lambda) to reach
    worker processes.  The predictive keeps the draws, and the only metric is the mixture's
    ``nll = −(1/N) Σ_i log (1/S) Σ_s exp(−fn(f_s, y)_i)``.
    """

    fn: Callable[[Tensor, Tensor], Tensor]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"fn must be a callable (outputs, targets) -> per-example NLL (N,), got {self.fn!r}")

    def mean_nll(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """``(1/N) Σ_i fn(outputs, targets)_i``."""
        return self._per_example(outputs, targets).mean()

    def predictive(self, outputs: Tensor) -> Tensor:
        """The draws themselves, moved to shape ``(N, S, ...)``."""
        _check_draws(outputs)
        return outputs.movedim(0, 1)

    def metrics(self, summary: Tensor, targets: Tensor) -> dict[str, float]:
        """``nll`` of the mixture over the draws ``summary (N, S, ...)``."""
        if summary.dim() < 2 or summary.shape[0] != targets.shape[0]:
            raise ValueError(
                f"summary must have shape (N, S, ...) with N = {targets.shape[0]} targets, got {tuple(summary.shape)}"
            )
        s = summary.shape[1]
        nll = torch.stack([self._per_example(summary[:, k], targets) for k in range(s)])  # (S, N)
        return {"nll": -(torch.logsumexp(-nll, dim=0) - math.log(s)).mean().item()}

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
