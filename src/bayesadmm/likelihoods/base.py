"""The ``Likelihood`` protocols, the check of a likelihood's curvature members (``require``), and the shape helpers
the built-in likelihoods share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


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


@runtime_checkable
class ConfidenceLikelihood(Likelihood, Protocol):
    """A ``Likelihood`` of class labels whose outputs are the logits of the classes and whose metrics bin the
    predictions' confidence (the top class's probability) in ``bins`` equal-width bins, as the ECE does:
    ``Classification``. A run of such a likelihood leaves its reliability diagram (reliability.json and .png,
    ``evaluation.leavings``), computed with ``Classification(bins)``'s probabilities on the ECE's bins; a likelihood
    without ``bins`` leaves none. The run asks the likelihood for this capability, not for its class."""

    bins: int


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
