"""Regression likelihoods: ``GaussianRegression`` (fixed noise) and ``Poisson`` (log link), scored as mixtures."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.likelihoods.base import _draws_per_example, _match_targets, _mixture_nll, _outputs_per_example

# central-interval levels whose mean |coverage − level| is GaussianRegression's calibration_error
COVERAGE_LEVELS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


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
